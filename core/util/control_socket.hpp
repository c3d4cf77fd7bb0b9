// Where evbd's control socket is when control.socket is "auto" (the default), and
// where evb-ctl looks with no --socket: one rule for both, so that an evbd started by
// hand and evb-ctl meet without options, and neither trusts a directory another
// user could have made or may write.
//   $XDG_RUNTIME_DIR/evbd.sock, if that directory is the user's own with mode 0700;
//   else /run/evbd-manual/evbd.sock for root (never the package's /run/evbd: a
//     `sudo evbd` by hand must not take, or own, the packaged daemon's socket);
//   else /tmp/evbd-<uid>/evbd.sock, in a 0700 directory of the user's own.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <string>
#include <vector>

namespace evb {

// The longest command line evbd reads (with its '\n'): room for a run's metadata
// (start --meta) or a comment of a page, and for 64 waiting clients, 4 MiB at most.
inline constexpr std::size_t kControlLineBytes = 65536;

// The packaged evbd.service's control.socket (its RuntimeDirectory=evbd).
inline constexpr const char* kPackagedControlSocket = "/run/evbd/evbd.sock";
// Root's "auto" directory: beside the package's, never in it.
inline constexpr const char* kRootManualControlDirectory = "/run/evbd-manual";

// "" if `dir` is a real directory (not a symlink) owned by `uid` that nobody else
// may enter or write (no group or other bits), else why it is not.
std::string private_directory_problem(const std::string& dir, uid_t uid);

// The path "auto" stands for, for the effective user.
std::string default_control_socket();

// evb-ctl's candidates with no --socket, in the order it tries them: the user's own
// ("auto"'s, and the /tmp one when XDG_RUNTIME_DIR is also usable), each only if its
// directory passes private_directory_problem; then the package's.
std::vector<std::string> control_socket_candidates();

// evbd: makes the directory of an "auto" socket path where it is missing (mode
// 0700) and checks it (private_directory_problem). Returns "" or why it cannot be used.
std::string prepare_control_socket_directory(const std::string& socket_path);

}  // namespace evb
