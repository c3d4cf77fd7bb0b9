// Online sampling of built events (GET /sample on the monitor address): the sampler
// drains the sample feed (monitor/sample_feed.hpp: records the disk writer copied
// while clients listen) and hands each record to every client listening; the HTTP
// thread sends them on. A client gets a file header, then whole records, as a file
// still being written (no index or footer), so evb-dump and the Python reader read
// it as they read a .part file.
//
// Everything here runs on the HTTP thread. Building never waits for a client: at
// most kClients at once, each with at most kClientBytes waiting to be sent; a record
// is skipped for a client with no room for it (a slow client). Counted.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/format/file_format.hpp"
#include "core/model/counters.hpp"
#include "monitor/sample_feed.hpp"

namespace evb::monitor {

struct SampleCounters {
    stats::Counter records;       // records handed to a client
    stats::Counter bytes;         // their bytes
    stats::Counter dropped_full;  // skipped for a client: it had no room for it (a slow client)
    stats::Counter clients;       // gauge: clients listening now
};

class Sampler {
public:
    static constexpr std::size_t kClients = 4;
    static constexpr std::size_t kClientBytes = 8u << 20;

    explicit Sampler(SampleFeed& feed) : feed_(feed) {}
    Sampler(const Sampler&) = delete;
    Sampler& operator=(const Sampler&) = delete;

    // A client slot wanting up to `records` records (0: until it leaves), or -1 when
    // every slot is taken. It gets the records the writer copies from now on.
    int open(std::uint64_t records);
    // Appends to `out` what is waiting for the slot, at most `max` bytes (at least one
    // record) and whole records only. False once the slot is finished (its records
    // all sent, or its stream ended) and nothing is left.
    bool take(int slot, std::string& out, std::size_t max);
    void close(int slot) noexcept;

    const SampleCounters& counters() const noexcept { return counters_; }
    // Records not sampled: the writer's copy budget of the second was spent (once per
    // record), or a client had no room (per client; the feed full counts here too).
    std::uint64_t dropped_budget() const noexcept { return feed_.dropped_budget().get(); }
    std::uint64_t dropped_slow() const noexcept { return counters_.dropped_full.get() + feed_.dropped_full().get(); }

private:
    struct Slot {
        bool active = false;
        bool ended = false;        // nothing more is added
        std::uint64_t wanted = 0;  // records (0: no limit)
        std::uint64_t given = 0;
        bool header_sent = false;
        file::FileHeader opened_with;  // the header the stream began with
        // Entries waiting to be sent, each a u32 length, then that many bytes, in a
        // ring of kClientBytes allocated at the slot's first use (its pages taken as
        // written). An entry is copied in once and out once: nothing is moved up or
        // regrown, which under load held the HTTP thread for seconds (session 33).
        std::unique_ptr<std::byte[]> ring;
        std::uint64_t head = 0;  // running byte counts: the next to send,
        std::uint64_t tail = 0;  // and past the last put
        std::size_t held() const noexcept { return static_cast<std::size_t>(tail - head); }
        void put(const void* p, std::size_t n) noexcept;  // the caller has checked the room
        void peek(void* p, std::size_t n) const noexcept;
        void take_into(std::string& out, std::size_t n);  // appends n bytes and drops them here
        template <typename F>
        void pieces(std::uint64_t pos, std::size_t n, F&& f) const;
    };
    // Takes what the feed holds and hands each whole record to the clients.
    void drain_feed();
    void hand_out(const file::FileHeader& h, const std::byte* record, std::uint32_t length);

    SampleFeed& feed_;
    std::array<Slot, kClients> slots_;
    std::uint32_t active_ = 0;
    std::vector<std::byte> pending_;  // bytes from the feed; the last entry may not be whole yet
    SampleCounters counters_;
};

}  // namespace evb::monitor
