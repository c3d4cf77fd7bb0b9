// Test helper: closes a descriptor at scope exit, so a failed REQUIRE does not leak it
// into the next test case.
#pragma once

#include <unistd.h>

namespace evb::test {

struct Fd {
    int fd = -1;
    explicit Fd(int f) : fd(f) {}
    Fd(const Fd&) = delete;
    Fd& operator=(const Fd&) = delete;
    ~Fd() {
        if (fd >= 0) ::close(fd);
    }
};

}  // namespace evb::test
