// Where evbd's control socket is when control.socket is "auto" (the default), and
// where evb-ctl looks first: one rule for both, so that an evbd started by hand and
// evb-ctl meet without options.
//   $XDG_RUNTIME_DIR/evbd.sock (a login session's own directory), else
//   /run/evbd/evbd.sock for root (the package's path), else /tmp/evbd-<uid>/evbd.sock
#pragma once

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>

namespace evb {

inline constexpr const char* kPackagedControlSocket = "/run/evbd/evbd.sock";

inline std::string default_control_socket() {
    const char* xdg = std::getenv("XDG_RUNTIME_DIR");
    struct stat st {};
    if (xdg != nullptr && xdg[0] == '/' && ::stat(xdg, &st) == 0 && S_ISDIR(st.st_mode)) return std::string(xdg) + "/evbd.sock";
    if (::geteuid() == 0) return kPackagedControlSocket;
    return "/tmp/evbd-" + std::to_string(::geteuid()) + "/evbd.sock";
}

// evbd: makes the directory of default_control_socket() where it may be missing
// (/run/evbd, /tmp/evbd-<uid>), and checks that a /tmp one is this user's own and
// nobody else's to write (another user could have made it first). Returns "" or
// why the directory cannot be used.
inline std::string prepare_control_socket_directory(const std::string& socket_path) {
    const std::string dir = socket_path.substr(0, socket_path.rfind('/'));
    const bool in_tmp = dir.rfind("/tmp/", 0) == 0;
    if (::mkdir(dir.c_str(), in_tmp ? 0700 : 0750) != 0 && errno != EEXIST)
        return "cannot make " + dir + ": " + std::strerror(errno);
    struct stat st {};
    if (::lstat(dir.c_str(), &st) != 0) return "cannot read " + dir + ": " + std::strerror(errno);
    if (!S_ISDIR(st.st_mode)) return dir + " is not a directory";
    if (in_tmp && (st.st_uid != ::geteuid() || (st.st_mode & 0077) != 0))
        return dir + " belongs to another user or others may write it";
    return "";
}

}  // namespace evb
