// The "auto" control socket's directory check (core/util/control_socket.cpp): evbd
// listens, and evb-ctl connects, only in a directory nobody else could have made or
// may write.
#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "core/util/control_socket.hpp"

namespace {
std::string fresh_dir(const char* name) {
    const auto base = std::filesystem::temp_directory_path() / ("evb-test-ctlsock-" + std::to_string(::getpid()));
    std::filesystem::create_directories(base);
    const auto d = base / name;
    std::filesystem::remove_all(d);
    REQUIRE(::mkdir(d.c_str(), 0700) == 0);
    return d.string();
}
}  // namespace

TEST_CASE("A control socket directory is used only if it is the user's own, private and not a link", "[control_socket]") {
    const std::string own = fresh_dir("own");
    CHECK(evb::private_directory_problem(own, ::geteuid()).empty());

    const std::string open = fresh_dir("open");
    REQUIRE(::chmod(open.c_str(), 0777) == 0);
    CHECK(evb::private_directory_problem(open, ::geteuid()).find("others") != std::string::npos);

    const std::string link = own + "-link";
    std::filesystem::remove(link);
    std::filesystem::create_directory_symlink(own, link);
    CHECK(evb::private_directory_problem(link, ::geteuid()).find("symbolic link") != std::string::npos);

    const std::string missing = own + "/missing";
    CHECK(!evb::private_directory_problem(missing, ::geteuid()).empty());

    if (::geteuid() == 0) {  // another user's directory (only root can make one)
        const std::string theirs = fresh_dir("theirs");
        REQUIRE(::chown(theirs.c_str(), 12345, 12345) == 0);
        CHECK(evb::private_directory_problem(theirs, 0).find("another user") != std::string::npos);
        // The same directory, as evbd would prepare it, is refused too.
        CHECK(!evb::prepare_control_socket_directory(theirs + "/evbd.sock").empty());
    } else {
        WARN("not root: the check of a directory another uid owns is skipped");
    }
    std::filesystem::remove_all(std::filesystem::path(own).parent_path());
}

TEST_CASE("XDG_RUNTIME_DIR is used for the control socket only if it is the user's own with mode 0700", "[control_socket]") {
    const char* saved = std::getenv("XDG_RUNTIME_DIR");
    const std::string saved_value = saved ? saved : "";
    const std::string xdg = fresh_dir("xdg");
    ::setenv("XDG_RUNTIME_DIR", xdg.c_str(), 1);
    CHECK(evb::default_control_socket() == xdg + "/evbd.sock");
    REQUIRE(::chmod(xdg.c_str(), 0777) == 0);
    CHECK(evb::default_control_socket() != xdg + "/evbd.sock");
    for (const auto& c : evb::control_socket_candidates()) CHECK(c != xdg + "/evbd.sock");
    // Root's default is never the package's socket.
    if (::geteuid() == 0) CHECK(evb::default_control_socket() == std::string(evb::kRootManualControlDirectory) + "/evbd.sock");
    CHECK(evb::control_socket_candidates().back() == evb::kPackagedControlSocket);
    if (saved) ::setenv("XDG_RUNTIME_DIR", saved_value.c_str(), 1); else ::unsetenv("XDG_RUNTIME_DIR");
    std::filesystem::remove_all(std::filesystem::path(xdg).parent_path());
}
