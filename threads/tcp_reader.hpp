// The TCP reader thread (docs/FORMATS.md section 11): serves many readout-PC
// connections with one epoll set, cuts each stream into its length-prefixed
// datagrams, puts each into a receive slot of the reader's pool (read straight into
// the slot: a long one once its header is seen, any by guessing its length from
// the two before it; otherwise copied from the connection's buffer)
// and admits it exactly as a socket reader admits a UDP datagram (admit_datagram),
// handing the chunks on per shard, one list per shard per round.
//
// Back-pressure (docs/ARCHITECTURE.md, "Input over TCP"): a message is taken only
// when the connection has room (a free slot, the connection under its part of the
// pool and, for a message that can open an event, the reader under its limit of such
// openers in flight and the connection under its share of it: the shares add up to at
// most the limit, and each round serves another connection first); otherwise the connection
// is held: its EPOLLIN interest is dropped, its buffer stays as it is, the kernel's
// window closes and the sender waits. Nothing read is refused for want of room.
#pragma once

#include <sys/types.h>

#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "allocators/arena.hpp"
#include "allocators/buffer_pool.hpp"
#include "core/model/counters.hpp"
#include "net/wake_fd.hpp"
#include "threads/channels.hpp"
#include "threads/runner.hpp"
#include "threads/socket_reader.hpp"
#include "threads/tcp_room.hpp"
#include "threads/tcp_source_owners.hpp"

namespace evb {

struct TcpReaderSettings {
    std::vector<int> listen_fds;        // this reader's listening sockets (it closes none)
    std::uint32_t max_connections = 64;
    std::size_t buffer_bytes = 256u << 10;  // per connection
    std::uint32_t max_datagram_bytes = 9000;
    std::uint64_t timeout_ns = 10'000'000'000ull;  // idle and stalled connections
    // Openers this reader may have in flight (slots handed on and not yet back whose
    // message has another event key than the message before it on its connection:
    // only such a message can open an event or slice), and at most one connection's
    // part of them: chosen so that the events they can open never fill a shard's event
    // pool, nor one source's share of it (run_daemon, tcp_reader_settings).
    std::size_t take_limit = 1024;
    std::size_t connection_limit = 256;
    // The sources the configuration expects: they size the table that learns which
    // connection carries which source (a connection's share, docs/ARCHITECTURE.md),
    // and, with set_aside_expected, each has slots set aside until a connection sends it.
    std::vector<std::uint32_t> sources;
    bool set_aside_expected = true;
    FrameInputSettings frames;
};

class TcpReader final : public Agent {
public:
    TcpReader(const TcpReaderSettings& s, alloc::Arena& arena, alloc::BufferPool& pool, ShardSink& sink,
              stats::ReaderCounters& counters, stats::TcpCounters& tcp);
    ~TcpReader() override;
    TcpReader(const TcpReader&) = delete;
    TcpReader& operator=(const TcpReader&) = delete;

    std::size_t do_work() override;
    void on_idle() override;
    void on_close() override;
    void wake() noexcept override;  // a stop: on_idle's park ends now

    RulesInbox& rules() noexcept { return inbox_; }

private:
    struct Connection;
    static constexpr std::uint32_t kNoSlot = ~0u;
    // Messages at least this long are read into their slot from their header on, the
    // rest of them straight from the socket (readv), not copied from the connection's
    // buffer; the buffer then takes only this much after such a message. Shorter ones
    // are copied, many to a read. Both are read into their slots by guess
    // (scatter_read) when the two before them had one length.
    // (At 8 KiB a copy costs less than the system call each would need on its own.)
    static constexpr std::uint32_t kDirectMinBytes = 16384;
    static constexpr std::size_t kDirectTailBytes = 512;
    // With the buffer empty, the next few messages are read straight into their slots
    // at once (scatter_read), guessing each is as long as the one before: at most this
    // many per read (and as many as the buffer could hold).
    static constexpr std::size_t kScatterMessages = 32;
    // How a message reached its slot (counted by net::TcpDirect in stats::TcpCounters::direct).
    enum class Via : std::uint8_t { copied, long_direct, by_guess };
    // The message a connection is taking (claim): its slot and what decided its room.
    struct Message {
        std::uint32_t slot = kNoSlot;  // kNoSlot: none
        std::uint32_t len = 0, got = 0;  // its length, and the bytes of it in the slot
        bool opener = false, known = false;
        std::uint64_t key = 0;
        // by_guess: claimed before its header was seen, as an opener; whether it
        // is one, and its key, are settled from its slot when it is whole (settle).
        Via via = Via::copied;
        // A guessed message (scatter_read), `got` of its `len` bytes in `slot`.
        static Message guessed(std::uint32_t slot, std::uint32_t len, std::size_t got) noexcept {
            return Message{slot, len, static_cast<std::uint32_t>(got), true, false, 0, Via::by_guess};
        }
    };
    void accept_from(std::size_t l, std::uint64_t now) noexcept;
    void watch_listener(std::size_t l, bool watch) noexcept;
    // A held connection the peer reset or hung up: out of the epoll set until released
    // (epoll reports EPOLLERR and EPOLLHUP whatever the interest, at every turn).
    void unwatch(Connection& c) noexcept;
    std::size_t serve(Connection& c, std::uint64_t now) noexcept;
    enum class Taken { need_bytes, no_room, framing_lost };
    // Takes the whole messages of c's buffer while there is room.
    // `allowed`: whether c's peer may send (the rules in force).
    Taken take_messages(Connection& c, bool allowed) noexcept;
    // Takes a slot for the message at c.begin (length `len`) if c has room for it, and
    // holds it against c's share: c.message. False: no room, nothing taken.
    bool claim(Connection& c, std::uint32_t len) noexcept;
    // Takes a free slot and holds it against c's share, as an opener or not, if c has
    // room for it (TcpRoom::room_for). False: no room, nothing taken.
    bool take_slot(Connection& c, bool opener, std::uint32_t& idx) noexcept;
    // With c's buffer empty and its last two messages of one length: reads the rest
    // of c.message (if any, of that length too) and c's next messages straight into
    // slots, guessing that each is as long, with the rest of the read into the buffer
    // (after long ones, kDirectTailBytes of it); what the guess got wrong is put into
    // the buffer as it came. The whole messages are handed on; one cut short
    // stays c.message. `got`: readv's result. False: nothing to read into (no message
    // being read and no room for a slot), nothing read.
    bool scatter_read(Connection& c, std::size_t budget, ssize_t& got) noexcept;
    // c.message guessed (Via::by_guess) and now whole: its key from its slot, and its
    // opener count given back if it opens nothing.
    void settle(Connection& c) noexcept;
    // A claimed slot back: out of its connection's holdings (if still open) and the sums.
    void unclaim(std::uint32_t idx) noexcept;
    // A claimed slot that carries nothing on: unclaimed and back on the pool's stack.
    void give_back(std::uint32_t idx) noexcept;
    // n bytes read from c now: counted, and c is not idle.
    void note_read(Connection& c, std::size_t n, std::uint64_t now) noexcept;
    // A read found the end of c's stream (0) or failed (-1): c takes what is whole, then closes.
    void end_stream(Connection& c, ssize_t got) noexcept;
    // c.message is whole in its slot: admitted and handed on (or refused and given back).
    void hand_on(Connection& c) noexcept;
    static bool inside_message(const Connection& c) noexcept;
    // Whether the message `datagram` (length `len`), c's next, may open an event: its
    // key (event id, timestamp or slice) differs from the last message taken from c,
    // or is not known.
    bool opens(const Connection& c, const std::byte* datagram, std::uint32_t len, std::uint64_t& key,
               bool& known) const noexcept;
    void hold(Connection& c, std::uint64_t now) noexcept;
    void release(Connection& c, std::uint64_t now) noexcept;
    void close_connection(Connection& c, net::TcpClose why) noexcept;
    void reclaim_slots() noexcept;
    void check_timeouts(std::uint64_t now) noexcept;
    // Learns from chunk `m`, just taken from c, what c carries: its source, its chunks
    // per fragment, whether it had an event key (`keyless`: it had none); c's reserve
    // follows it (TcpRoom::reserve).
    void learn(Connection& c, const ChunkMeta& m, bool keyless) noexcept;
    // Fragments of `chunks` chunks seen: what is set aside for each expected source
    // not sent yet grows to as many slots.
    void expect_chunks(std::size_t chunks) noexcept;

    TcpReaderSettings s_;
    alloc::BufferPool& pool_;
    ShardSink& sink_;
    stats::ReaderCounters& counters_;
    stats::TcpCounters& tcp_;
    int epoll_fd_ = -1;
    net::WakeFd stop_bell_;  // polled beside epoll_fd_
    std::vector<Connection> conns_;
    alloc::ArenaArray<std::byte> buffers_;    // every connection's read buffer, made at start
    std::vector<std::uint32_t> free_conns_;   // indices of closed connections
    std::vector<std::uint32_t> listen_ports_;  // local port per listening socket
    // Per listening socket: 0, or when (monotonic) it is watched again after accept
    // failed for want of descriptors (the connection stays queued; a level-triggered
    // epoll would report it at every turn).
    std::vector<std::uint64_t> listen_rests_until_ns_;
    std::size_t resting_listeners_ = 0;
    // Which connection (index, generation) each slot in flight came from, so a
    // returned slot counts against the right connection's share.
    std::vector<std::uint32_t> slot_conn_, slot_gen_;
    std::vector<std::uint8_t> slot_opener_;  // 1: the slot's message counted as an opener
    std::uint64_t taken_ = 0, taken_bytes_ = 0;  // messages taken this round (counters_ once a round)
    // Of them, read straight into their slots, by net::TcpDirect (tcp_ once a round).
    std::array<std::uint64_t, net::kTcpDirectCount> taken_direct_{};
    std::size_t held_ = 0;       // connections held for want of room
    TcpRoom room_;               // what each connection may hold: reserves, shares, spare
    TcpSourceOwners owners_;     // which connection carries each source seen
    // Expected sources no connection has sent yet, and the slots set aside for each:
    // the most chunks per fragment seen on any connection, up to most_expected_chunks_.
    std::size_t expected_left_ = 0, expected_chunks_ = 1, most_expected_chunks_ = 1;
    std::size_t first_served_ = 0;  // rotates: which connection a round serves first
    ShardBatches batches_;
    const AdmissionRules* rules_ = nullptr;
    RulesInbox inbox_;
    FrameDecoding frames_;
    std::uint64_t timeouts_checked_ns_ = 0;
    bool timeouts_saw_running_ = false;  // check_timeouts: the rules said running last time
    std::uint32_t logged_ = 0;  // bit per net::TcpClose: its first closing was logged
    bool logged_accept_error_ = false;
};

}  // namespace evb
