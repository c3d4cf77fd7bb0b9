// libFuzzer target: the configuration parser and validator on arbitrary text.
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/config/config.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const std::string text(reinterpret_cast<const char*>(data), size);
    try {
        auto c = evb::load_config(text, "fuzz.json", {});
        // A config that validates must survive a round trip through its effective form.
        auto again = evb::load_config(c->effective.dump(), "effective.json", {});
        if (again->effective != c->effective) __builtin_trap();
    } catch (const evb::ConfigError& e) {
        if (e.problems.empty()) __builtin_trap();  // a rejection always says why
    }
    return 0;
}
