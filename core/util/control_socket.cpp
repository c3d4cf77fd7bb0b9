// The "auto" control socket's rule and its directory check (control_socket.hpp).
#include "core/util/control_socket.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fmt/format.h>

namespace evb {
namespace {

std::string directory_of(const std::string& path) { return path.substr(0, path.rfind('/')); }

// $XDG_RUNTIME_DIR/evbd.sock if that directory is this user's own and private, else "".
std::string xdg_control_socket() {
    const char* xdg = std::getenv("XDG_RUNTIME_DIR");
    if (xdg == nullptr || xdg[0] != '/' || !private_directory_problem(xdg, ::geteuid()).empty()) return "";
    return std::string(xdg) + "/evbd.sock";
}

std::string fallback_control_socket() {
    if (::geteuid() == 0) return std::string(kRootManualControlDirectory) + "/evbd.sock";
    return "/tmp/evbd-" + std::to_string(::geteuid()) + "/evbd.sock";
}

}  // namespace

std::string private_directory_problem(const std::string& dir, uid_t uid) {
    struct stat st {};
    if (::lstat(dir.c_str(), &st) != 0) return "cannot read " + dir + ": " + std::strerror(errno);
    if (S_ISLNK(st.st_mode)) return dir + " is a symbolic link";
    if (!S_ISDIR(st.st_mode)) return dir + " is not a directory";
    if (st.st_uid != uid) return dir + " belongs to another user (uid " + std::to_string(st.st_uid) + ")";
    if ((st.st_mode & 0077) != 0) return dir + fmt::format(" may be entered or written by others (mode {:o})", st.st_mode & 0777);
    return "";
}

std::string default_control_socket() {
    const std::string xdg = xdg_control_socket();
    return xdg.empty() ? fallback_control_socket() : xdg;
}

std::vector<std::string> control_socket_candidates() {
    std::vector<std::string> out;
    for (const std::string& p : {xdg_control_socket(), fallback_control_socket()})
        if (!p.empty() && private_directory_problem(directory_of(p), ::geteuid()).empty()) out.push_back(p);
    out.push_back(kPackagedControlSocket);
    return out;
}

std::string prepare_control_socket_directory(const std::string& socket_path) {
    const std::string dir = directory_of(socket_path);
    if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) return "cannot make " + dir + ": " + std::strerror(errno);
    return private_directory_problem(dir, ::geteuid());
}

}  // namespace evb
