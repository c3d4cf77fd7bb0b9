// BUSY datagrams (docs/FORMATS.md section 10): a builder tells the trigger it will
// soon have to refuse data, so that the trigger holds back instead. Encode and parse
// (exactly 48 bytes), and the receiver's rule a trigger applies to them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace evb::wire {

inline constexpr std::uint8_t kTypeBusy = 4;
inline constexpr std::size_t kBusyBytes = 48;

// What is full, while busy (the datagram's reasons field).
namespace busy_reasons {
inline constexpr std::uint32_t events_in_flight = 1u << 0;
inline constexpr std::uint32_t receive_slots = 1u << 1;
inline constexpr std::uint32_t output = 1u << 2;
inline constexpr std::uint32_t socket_buffer = 1u << 3;
inline constexpr std::uint32_t not_running = 1u << 4;
inline constexpr std::uint32_t defined = 0x1F;
inline constexpr std::size_t kCount = 5;
// The name of reason bit `bit` (metrics, status page): "events_in_flight", ...
inline constexpr const char* name(std::size_t bit) noexcept {
    constexpr const char* names[kCount] = {"events_in_flight", "receive_slots", "output", "socket_buffer", "not_running"};
    return bit < kCount ? names[bit] : "?";
}
}  // namespace busy_reasons

struct BusyMessage {
    bool busy = false;
    std::uint32_t builder_id = 0;
    std::uint32_t run_number = 0;
    std::uint64_t sequence = 0;
    std::uint32_t reasons = 0;
    std::uint16_t fill_permille = 0;  // 0..1000
    std::uint16_t interval_ms = 0;    // 10..1000
    std::uint64_t busy_ns = 0;
    std::uint64_t lost_events = 0;
};

// Writes the 48 bytes into `out` (at least kBusyBytes).
void encode_busy(const BusyMessage& m, std::byte* out) noexcept;
// Whether `d` is a well-formed BUSY datagram (magic, version 1, type 4, exactly 48
// bytes, no undefined flag or reason bit, fill <= 1000); fills `out` if so.
bool parse_busy(std::span<const std::byte> d, BusyMessage& out) noexcept;

// The receiver's rule of section 10, for a trigger that waits for some builders:
// a datagram is taken if its sequence is above the last taken from its builder, or
// if none was taken from that builder for three of its intervals (a restarted
// builder whose clock is behind). A builder waited for is busy until heard from,
// and again once not heard from for three intervals.
class BusyReceiver {
public:
    // Waits for builders 0..count-1.
    explicit BusyReceiver(std::uint32_t count);
    // Waits for these builder ids.
    explicit BusyReceiver(std::vector<std::uint32_t> ids);

    // Offers a datagram received at `now_ns` (any monotonic clock); returns whether
    // it was taken. Datagrams of builders not waited for are ignored.
    bool offer(const BusyMessage& m, std::uint64_t now_ns) noexcept;
    // Whether any builder waited for is busy at `now_ns`.
    bool any_busy(std::uint64_t now_ns) const noexcept;
    std::uint64_t taken() const noexcept { return taken_; }
    std::uint64_t refused() const noexcept { return refused_; }

private:
    struct Builder {
        std::uint32_t id = 0;
        bool heard = false;
        bool busy = true;
        std::uint64_t sequence = 0;
        std::uint64_t taken_ns = 0;
        std::uint64_t interval_ns = 0;
    };
    bool silent(const Builder& b, std::uint64_t now_ns) const noexcept {
        return !b.heard || now_ns - b.taken_ns >= 3 * b.interval_ns;
    }
    std::vector<Builder> builders_;
    std::uint64_t taken_ = 0, refused_ = 0;
};

}  // namespace evb::wire
