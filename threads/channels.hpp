// The named channels between evbd's threads. daemon.cpp creates them and hands
// each to the threads at its two ends; nothing else carries data between threads
// except the rings the pipeline and the buffer pools own (shard inboxes, writer
// rings, done rings, return rings: see docs/ARCHITECTURE.md, "Threads").
#pragma once

#include <atomic>
#include <bit>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "allocators/handoff/spsc_ring.hpp"
#include "allocators/handoff/wait.hpp"
#include "core/config/snapshot.hpp"
#include "core/io/run_summary.hpp"
#include "core/model/event.hpp"
#include "net/wake_fd.hpp"

namespace evb {

// Into the flow graph: a shard's inbox, put to by the readers or the replay
// feeder (chunks), the service loop (ticks, run ends) and the request sender
// (give-ups). Implemented by Pipeline.
class ShardSink {
public:
    virtual ~ShardSink() = default;
    virtual std::uint32_t shard_count() const noexcept = 0;
    // A batch of `count` chunks for `shard`, linked through ChunkMeta::next.
    virtual void submit(std::uint32_t shard, ChunkMeta* head, std::uint32_t count, std::uint64_t now_ns) noexcept = 0;
    // Time has reached now_ns: every shard times out what is due.
    virtual void tick(std::uint64_t now_ns) noexcept = 0;
    // Pull mode: write this event INCOMPLETE now (out of retries).
    virtual void give_up(std::uint64_t /*event_id*/, std::uint32_t /*run_number*/, std::uint32_t /*builders*/,
                         std::uint64_t /*now_ns*/) noexcept {}
    // Offline input (replay) only: how many more events shard `shard` can start
    // (free), and how many of its events are built and still with the writer (they
    // come back as free), counted once everything submitted so far has been matched
    // (waits for that). An input that has nobody to lose data to waits for room
    // instead of sending what the shard would have to refuse.
    struct Room {
        std::size_t free = SIZE_MAX;
        std::size_t writing = 0;
        std::size_t ahead = 0;  // room_now: chunks submitted that the matcher has not taken yet (settled_room: 0)
    };
    virtual Room settled_room(std::uint32_t /*shard*/) { return {}; }
    // The same without waiting, for an input that has submitted `fed` chunks to the
    // shard in all: a lower bound on `free` (each chunk not yet matched is counted
    // as an event it may start), and how many of the `fed` chunks the matcher has
    // not taken yet (`ahead`). When this is room enough, settled_room would say so
    // too. The caller must be the shard's only source of chunks (replay: no socket
    // reader runs), else chunks it did not count take room it does not see.
    virtual Room room_now(std::uint32_t /*shard*/, std::uint64_t /*fed*/) { return {}; }
    // Waits until the matcher has taken all but at most `most` of the `fed` chunks
    // submitted to shard `shard` (room_now's `ahead`), without waiting for the rest.
    virtual void wait_ahead(std::uint32_t /*shard*/, std::uint64_t /*fed*/, std::size_t /*most*/) {}
};

// Writer -> service loop: each file the writer closed (or had to leave as
// `.part`), and each run transition it finished, in order; the service loop writes
// the run summaries from them. A file closes once per output.max_file_bytes at
// most, far from every event: one push per file, never per record. The ring is
// large; if it ever is full, the entry is dropped and counted, and the summary
// says its file list is not complete.
struct FileClosed {
    std::uint32_t run_number = 0;
    std::uint32_t file_sequence = 0;
    std::uint64_t events = 0;
    file::StatusCounts status;
    bool clean = false;                   // closed with index and footer (else left .part)
    std::uint64_t epoch_passed = 0;       // not 0: no file; every epoch up to this has passed the writer (Epoch::number)
};
class ClosedFiles {
public:
    explicit ClosedFiles(std::size_t capacity = 4096) : ring_(capacity) {}
    void push(const FileClosed& f) noexcept {
        if (!ring_.try_push(f)) dropped_.fetch_add(1, std::memory_order_relaxed);  // one writer, any reader
    }
    std::size_t pop(FileClosed* out, std::size_t max) noexcept { return ring_.try_pop_n(out, max); }
    std::uint64_t dropped() const noexcept { return dropped_.load(std::memory_order_relaxed); }

private:
    SpscRing<FileClosed> ring_;
    std::atomic<std::uint64_t> dropped_{0};
};

// Service loop -> disk writer: run records for the running run (FORMATS.md 12): a
// COMMENT from evb-ctl. The writer takes them between batches and writes each into
// the open file of its run (after the file's BEGIN_OF_RUN when it opens). Control
// plane, a few per second at most: a bounded ring; a note it cannot take is
// refused to the asker, never waited for.
struct RunNote {
    std::uint32_t run_number = 0;
    std::uint32_t kind = 0;  // file::RunRecordKind; 0: the run's metadata (for its BEGIN_OF_RUN)
    std::string body;        // JSON object text
};
class RunNotes {
public:
    static constexpr std::size_t kCapacity = 64;
    // False when kCapacity notes wait already (the writer is behind, or stalled).
    [[nodiscard]] bool try_push(RunNote n) {
        std::lock_guard lock(mutex_);
        if (notes_.size() >= kCapacity) return false;
        notes_.push_back(std::move(n));
        return true;
    }
    [[nodiscard]] bool try_pop(RunNote& out) {
        std::lock_guard lock(mutex_);
        if (notes_.empty()) return false;
        out = std::move(notes_.front());
        notes_.pop_front();
        return true;
    }

private:
    std::mutex mutex_;
    std::deque<RunNote> notes_;
};

// Service loop -> an input (a socket reader or the replay feeder): admission rule
// sets, newest last; and back, which set is in force. The input takes them between
// batches; the poster keeps each set alive until no input has it in force.
class RulesInbox {
public:
    bool post(const AdmissionRules* rules) noexcept { return ring_.try_push(rules); }
    // The service loop waits on `bell` for a new set to be in force.
    void ring_when_applied(Doorbell& bell) noexcept { bell_ = &bell; }
    // Any thread: the set in force.
    const AdmissionRules* applied() const noexcept { return applied_.load(std::memory_order_acquire); }

    // Input thread, between batches: the rules to admit by now (nullptr: none yet).
    const AdmissionRules* take() noexcept {
        const AdmissionRules* next = nullptr;
        for (int i = 0; i < 4 && ring_.try_pop(next); ++i) current_ = next;  // bounded
        // Release: datagrams handed on before this store were admitted under the old
        // rules; a reload that sees the new pointer knows later ones use the new rules.
        if (current_ != nullptr && applied_.load(std::memory_order_relaxed) != current_) {
            applied_.store(current_, std::memory_order_release);
            if (bell_ != nullptr) bell_->ring();
        }
        return current_;
    }

private:
    SpscRing<const AdmissionRules*> ring_{16};
    const AdmissionRules* current_ = nullptr;  // input thread only
    std::atomic<const AdmissionRules*> applied_{nullptr};
    Doorbell* bell_ = nullptr;
};

// Run control (on the service loop) -> a thread's live settings (the disk writer's
// WriterSettings, the request sender's PullSettings); and back, how many it has
// taken, so that the poster frees each once its reader is done with it.
template <typename T>
class SettingsChannel {
public:
    bool post(const T* settings) noexcept { return ring_.try_push(settings); }
    // Posts, waiting up to `timeout` for room: the consumer rings as it takes each
    // (done_with_one). False: still no room by then.
    bool post_within(const T* settings, std::chrono::nanoseconds timeout) noexcept {
        const auto deadline = std::chrono::steady_clock::now() + timeout;
        while (!post(settings)) {
            const auto left = deadline - std::chrono::steady_clock::now();
            if (left <= std::chrono::nanoseconds::zero()) return false;
            room_.park(left, [this] { return ring_.size_approx() < ring_.capacity(); });
        }
        return true;
    }
    // The consuming thread: the next settings posted, if any.
    bool take(const T*& next) noexcept { return ring_.try_pop(next); }
    // The consuming thread, after its last read of what `take` gave.
    void done_with_one() noexcept {
        applied_.fetch_add(1, std::memory_order_release);
        room_.ring();  // a poster waiting for room (post_within)
    }
    // Settings taken and applied so far: the poster may free every one before that.
    std::uint64_t applied() const noexcept { return applied_.load(std::memory_order_acquire); }

private:
    SpscRing<const T*> ring_{16};
    std::atomic<std::uint64_t> applied_{0};
    Doorbell room_;
};

// Disk writer -> request sender (pull mode): ids of events whose records the
// kernel has, in file order. One producer (the writer), one consumer.
class WrittenIds {
public:
    // At most `outstanding` ids are ever unread (the credits): the ring holds twice that.
    explicit WrittenIds(std::size_t outstanding) : ring_(outstanding * 2) {}
    void push(const std::uint64_t* ids, std::size_t n) noexcept {
        (void)ring_.try_push_n(ids, n);  // cannot overflow, see the constructor
        bell_.ring();
    }
    std::size_t pop(std::uint64_t* out, std::size_t max) noexcept { return ring_.try_pop_n(out, max); }
    bool empty() const noexcept { return ring_.size_approx() == 0; }
    // The consumer parks here until ids arrive or `timeout` passes.
    void park(std::chrono::nanoseconds timeout) noexcept {
        bell_.park(timeout, [this] { return !empty(); });
    }

private:
    SpscRing<std::uint64_t> ring_;
    Doorbell bell_;
};

// Matcher shards -> request sender (pull mode): which requested events have been
// handed on to be written, so a due re-request of one is skipped. Slot
// (id / builders) mod a power of two of at least twice the credits: this builder's
// ids are every builders-th, so the outstanding ones have slots of their own while
// they span fewer than that many of its ids (one event held back long enough can
// share a slot with a new one). A slot is reset when its id is requested and says
// "built" only while it holds that very id, so sharing only ever makes an event
// look not built: asked again, as without this table.
class BuiltIds {
public:
    BuiltIds(std::size_t max_credits, std::uint32_t builders)
        : builders_(std::max<std::uint32_t>(builders, 1)),
          mask_(std::bit_ceil(max_credits * 2) - 1),
          slots_(new std::atomic<std::uint64_t>[mask_ + 1]) {
        for (std::size_t i = 0; i <= mask_; ++i) slots_[i].store(kNotBuilt, std::memory_order_relaxed);
    }
    // Any driver thread. Relaxed: the slot is the whole message.
    void mark(std::uint64_t event_id) noexcept { slot(event_id).store(event_id, std::memory_order_relaxed); }
    // Request sender: the id is (re)requested now; an older mark in its slot is void.
    void forget(std::uint64_t event_id) noexcept { slot(event_id).store(kNotBuilt, std::memory_order_relaxed); }
    bool built(std::uint64_t event_id) const noexcept {
        return slot(event_id).load(std::memory_order_relaxed) == event_id;
    }

private:
    // An id no event carries in practice (the sources count up from pull.first_event).
    static constexpr std::uint64_t kNotBuilt = ~std::uint64_t{0};
    std::atomic<std::uint64_t>& slot(std::uint64_t event_id) const noexcept {
        return slots_[(event_id / builders_) & mask_];
    }
    std::uint64_t builders_;
    std::size_t mask_;
    std::unique_ptr<std::atomic<std::uint64_t>[]> slots_;
};

// Control socket thread <-> service loop (run control, evb-ctl): one command at a
// time goes to the loop, which answers when the command is done (a stop: once the
// run's file is closed). Control plane only: a mutex is fine here.
struct ControlCommand {
    enum class Op : std::uint8_t { start, stop, reload, comment } op = Op::start;
    std::string text;      // comment: the text
    bool has_run = false;  // start --run N
    std::uint32_t run = 0;
    std::uint64_t id = 0;  // the asker's, returned with the reply
};
struct ControlReply {
    std::uint64_t id = 0;
    bool ok = false;
    std::string json;  // one JSON object: "ok", "error" or the figures
};

class ControlMailbox {
public:
    ControlMailbox() = default;
    ControlMailbox(const ControlMailbox&) = delete;
    ControlMailbox& operator=(const ControlMailbox&) = delete;

    // Control thread: false while an earlier command is not yet answered.
    bool submit(const ControlCommand& c) {
        std::lock_guard lock(m_);
        if (busy_) return false;
        busy_ = true;
        command_ = c;
        return true;
    }
    // Service loop: the command to carry out, if one came.
    std::optional<ControlCommand> take() {
        std::lock_guard lock(m_);
        std::optional<ControlCommand> c;
        c.swap(command_);
        return c;
    }
    // Service loop: the command is done; wakes the control thread.
    void answer(ControlReply r) {
        {
            std::lock_guard lock(m_);
            replies_.push_back(std::move(r));
            busy_ = false;
        }
        wake();
    }
    // Control thread: answers ready to send.
    std::deque<ControlReply> take_replies() {
        bell_.drain();
        std::lock_guard lock(m_);
        std::deque<ControlReply> out;
        out.swap(replies_);
        return out;
    }
    int wake_fd() const noexcept { return bell_.fd(); }  // readable when answers are ready
    // The control thread's poll ends now (an answer is ready, or its runner is stopping).
    void wake() const noexcept { bell_.ring(); }

private:
    std::mutex m_;
    bool busy_ = false;
    std::optional<ControlCommand> command_;
    std::deque<ControlReply> replies_;
    net::WakeFd bell_;
};

}  // namespace evb
