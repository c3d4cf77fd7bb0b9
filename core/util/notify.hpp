// The systemd notify protocol (sd_notify), without libsystemd: one datagram with
// "KEY=VALUE" lines to the unix socket named by $NOTIFY_SOCKET. A no-op when the
// variable is unset (not started by systemd).
#pragma once

#include <string_view>

namespace evb {

// Sends `state` (e.g. "READY=1", "RELOADING=1\nMONOTONIC_USEC=...", "STOPPING=1").
// Returns false when NOTIFY_SOCKET is set but the send failed.
bool sd_notify_state(std::string_view state) noexcept;

// "RELOADING=1" with the MONOTONIC_USEC field systemd expects alongside it.
bool sd_notify_reloading() noexcept;

}  // namespace evb
