#include "threads/request_sender.hpp"

#include <time.h>

#include <algorithm>
#include <bit>

#include "core/util/clock.hpp"
#include "core/util/log.hpp"
#include "core/format/wire.hpp"

namespace evb {

namespace {
// CLEARs carry many ids; keep each datagram within a standard 1500-byte MTU.
constexpr std::size_t kClearIdsPerDatagram = (1472 - wire::kRequestHeaderBytes) / 8;
}  // namespace

RequestSender::RequestSender(const PullSettings& s, int socket_fd, std::vector<net::Endpoint> sources,
                             WrittenIds& written, BuiltIds& built, ShardSink& give_up_to,
                             SettingsChannel<PullSettings>& settings, stats::PullCounters& counters,
                             std::size_t max_credits, file::HeldIds held)
    : s_(s),
      fd_(socket_fd),
      sources_(std::move(sources)),
      written_(written),
      built_(built),
      give_up_to_(give_up_to),
      counters_(counters),
      max_credits_(max_credits),
      commands_(settings),
      outstanding_(max_credits),
      entries_(max_credits),
      retry_queue_(max_credits * 4),
      send_(sources_.size()),
      cursor_(s.first_event),
      held_(std::move(held)),
      clear_next_(held_.empty() ? 0 : held_.spans().front().first) {
    free_entries_.reserve(max_credits);
    for (auto& e : entries_) free_entries_.push_back(&e);
    owed_clears_.reserve(max_credits * 2);
    scratch_.resize(max_credits * 2);
    dgram_.resize(wire::request_bytes(std::max<std::size_t>(8000, kClearIdsPerDatagram)));
    apply(s);
}

void RequestSender::apply(const PullSettings& s) {
    s_.credits = s.credits;
    s_.request_batch = s.request_batch;
    s_.retry_ms = s.retry_ms;
    s_.max_retries = s.max_retries;
    s_.timeout_ms = s.timeout_ms;
    if (s.run_number != s_.run_number && !held_.empty()) {
        // The held ids are the files' of the run evbd started in; another run holds none yet.
        held_ = file::HeldIds{};
        held_span_ = clear_span_ = 0;
    }
    s_.run_number = s.run_number;
    s_.requesting = s.requesting;
    retry_timer_.set_bounds(std::uint64_t{s_.retry_ms} * 1'000'000ull,
                            std::uint64_t{s_.timeout_ms} * 1'000'000ull / (s_.max_retries + 1ull));
    counters_.credits_configured.set(std::min<std::size_t>(s_.credits, max_credits_));
    publish_timer();
}

void RequestSender::publish_timer() noexcept {
    counters_.retry_period_ns.set(retry_timer_.period_ns());
    counters_.round_trip_ns.set(retry_timer_.smoothed_ns());
}

// Moves cursor_ to this builder's next id (e % builders == builder_id) that the
// run's files do not hold. Each held id passed counts as requested (it was, before
// the restart), never beyond pull.events: then cursor_ stops on a held id, and
// nothing more is requested anyway.
void RequestSender::skip_held() noexcept {
    while (cursor_ % s_.builders != s_.builder_id) ++cursor_;
    const auto& spans = held_.spans();
    while (held_span_ < spans.size()) {
        const file::HeldIds::Span& sp = spans[held_span_];
        if (cursor_ > sp.last) {
            ++held_span_;
            continue;
        }
        if (cursor_ < sp.first) return;
        // cursor_ and the span's ids are all of this builder's share, so cursor_ is held.
        std::uint64_t n = (sp.last - cursor_) / s_.builders + 1;
        if (s_.events > 0) n = std::min(n, s_.events - requested_);
        if (n == 0) return;
        cursor_ += n * s_.builders;
        requested_ += n;
    }
}

// The start-up CLEARs of every held id, at most 64 datagrams a round so that a long
// run's list does not hold up credits coming back meanwhile.
std::size_t RequestSender::send_held_clears() {
    constexpr std::size_t kDatagramsPerRound = 64;
    const auto& spans = held_.spans();
    std::size_t ids_sent = 0;
    for (std::size_t d = 0; d < kDatagramsPerRound && clear_span_ < spans.size(); ++d) {
        std::size_t n = 0;
        while (n < kClearIdsPerDatagram && clear_span_ < spans.size()) {
            scratch_[n++] = clear_next_;
            if (clear_next_ < spans[clear_span_].last)
                clear_next_ += held_.step();
            else if (++clear_span_ < spans.size())
                clear_next_ = spans[clear_span_].first;
        }
        send_ids(wire::Type::clear, scratch_.data(), n);
        counters_.clears_sent.add(1);
        ids_sent += n;
    }
    if (ids_sent > 0 && clear_span_ == spans.size())
        log_info("pull: CLEAR sent to the sources for the {} events of run {} this builder's files already held",
                 held_.count(), s_.run_number);
    return ids_sent;
}

void RequestSender::send_ids(wire::Type type, const std::uint64_t* ids, std::size_t n) {
    const std::size_t len = wire::encode_request(type, s_.builder_id, s_.run_number, {ids, n}, dgram_);
    for (std::size_t i = 0; i < sources_.size(); ++i) send_.set(i, dgram_.data(), len, &sources_[i]);
    if (send_.send(fd_, sources_.size()) < 0) counters_.send_errors.add(1);
}

std::size_t RequestSender::take_written(std::uint64_t now) {
    const std::size_t n = written_.pop(scratch_.data(), scratch_.size());
    for (std::size_t i = 0; i < n; ++i) {
        Entry* e = outstanding_.find(scratch_[i]);
        if (e == nullptr) continue;  // not ours (an unrequested event) or already returned
        if (e->retries == 0 && !e->given_up && !e->waited_for_writer) {
            retry_timer_.sample(now - e->requested_ns);
        }
        outstanding_.erase(scratch_[i]);
        free_entries_.push_back(e);
        owed_clears_.push_back(scratch_[i]);  // the credit is back; a CLEAR is owed first
    }
    return n;
}

std::size_t RequestSender::send_clears() {
    const std::size_t owed = owed_clears_.size();
    for (std::size_t i = 0; i < owed; i += kClearIdsPerDatagram) {
        const std::size_t n = std::min(kClearIdsPerDatagram, owed - i);
        send_ids(wire::Type::clear, owed_clears_.data() + i, n);
        counters_.clears_sent.add(1);
    }
    counters_.events_cleared.add(owed);
    owed_clears_.clear();
    return owed;
}

std::size_t RequestSender::send_requests(std::uint64_t now) {
    if (!s_.requesting) return 0;  // stopped: the events asked for finish, no new ones
    if (clear_span_ < held_.spans().size()) return 0;  // the start-up CLEARs go first
    const std::size_t credits = std::min<std::size_t>(s_.credits, max_credits_);
    std::size_t sent = 0;
    while (true) {
        skip_held();
        const std::size_t in_use = outstanding_.size();
        if (in_use >= credits) break;
        std::size_t want = std::min<std::size_t>(credits - in_use, s_.request_batch);
        if (s_.events > 0) want = static_cast<std::size_t>(std::min<std::uint64_t>(want, s_.events - requested_));
        if (want == 0) break;
        // Hold back a partial batch (fewer, larger requests and wake-ups) only while
        // more than half the credits are in flight, i.e. while want < ceil(credits/2):
        // waiting for all of them would idle the sources while the last event is
        // written. credits >= 1 here, so hold >= 1.
        const std::size_t hold = std::min<std::size_t>(s_.request_batch, (credits + 1) / 2);
        const bool last = s_.events > 0 && s_.events - requested_ == want;
        if (want < hold && !last && in_use > 0) break;
        std::uint64_t ids[8000];
        std::size_t n = 0;
        while (n < want) {
            if (n > 0) skip_held();
            if (s_.events > 0 && requested_ == s_.events) break;  // the rest of pull.events is held
            ids[n] = cursor_;
            cursor_ += s_.builders;
            ++requested_;
            Entry* e = free_entries_.back();
            free_entries_.pop_back();
            *e = Entry{ids[n], now, now, 0, false, false};
            built_.forget(ids[n]);
            outstanding_.insert(ids[n], e);
            retry_queue_.push_back(ids[n]);
            ++n;
        }
        if (n == 0) break;
        send_ids(wire::Type::request, ids, n);
        sent += n;
        counters_.requests_sent.add(1);
        counters_.events_requested.add(n);
    }
    return sent;
}

std::size_t RequestSender::retry_due(std::uint64_t now) {
    std::uint64_t ids[8000];
    std::size_t n = 0, total = 0;
    auto flush = [&] {
        if (n == 0) return;
        send_ids(wire::Type::request, ids, n);
        counters_.rerequests_sent.add(n);
        total += n;
        n = 0;
    };
    while (!retry_queue_.empty()) {
        const std::uint64_t id = retry_queue_.front();
        Entry* e = outstanding_.find(id);
        if (e == nullptr || e->given_up) {
            retry_queue_.pop_front();  // written, or waiting for its INCOMPLETE record
            continue;
        }
        if (e->sent_ns + retry_timer_.period_ns() > now) break;
        if (built_.built(id)) {
            // Built and waiting for the writer: nothing to ask for, and not a
            // timeout of the round trip either.
            retry_queue_.pop_front();
            e->waited_for_writer = true;
            counters_.rerequests_avoided.add(1);
            continue;
        }
        retry_queue_.pop_front();
        if (e->retries == 0 && e->requested_ns >= backoff_epoch_ns_) {
            // Asked once and not written within the period: the period may be too
            // short for every event (none would ever be measured), so double it.
            retry_timer_.on_timeout();
            backoff_epoch_ns_ = now;
        }
        if (e->retries >= s_.max_retries) {
            // Out of retries: the matcher writes it INCOMPLETE; its credit returns
            // when that record is written.
            e->given_up = true;
            counters_.events_given_up.add(1);
            give_up_to_.give_up(id, s_.run_number, s_.builders, builder_ns());
            continue;
        }
        ++e->retries;
        e->sent_ns = now;
        retry_queue_.push_back(id);
        ids[n++] = id;
        if (n == std::min<std::size_t>(s_.request_batch, 8000)) flush();
    }
    flush();
    return total;
}

std::size_t RequestSender::do_work() {
    const PullSettings* next = nullptr;
    for (int i = 0; i < 4 && commands_.take(next); ++i) {
        apply(*next);
        if (s_.credits > max_credits_)
            log_warn("pull.credits {} is above the {} this builder was started with; using {} until a restart",
                     s_.credits, max_credits_, max_credits_);
        commands_.done_with_one();  // *next is no longer read
    }
    const std::uint64_t now = monotonic_ns();
    std::size_t work = take_written(now);
    // Order matters: every CLEAR owed goes out before a REQUEST spends the credit.
    work += send_clears();
    work += send_held_clears();
    work += retry_due(now);
    work += send_requests(now);
    counters_.credits_in_use.set(outstanding_.size());
    publish_timer();  // after this round's samples, back-offs and reloads
    if (s_.events > 0 && requested_ == s_.events && outstanding_.size() == 0 && !done()) {
        done_.store(true, std::memory_order_release);
        log_info("pull: all {} events of pull.events are written (run {})", s_.events, s_.run_number);
    }
    return work;
}

void RequestSender::on_idle() {
    // Sleep until a credit comes back (the writer rings) or the next retry is due;
    // never spin while out of credits.
    std::uint64_t wait_ns = retry_timer_.period_ns();
    if (!retry_queue_.empty()) {
        if (const Entry* e = outstanding_.find(retry_queue_.front()); e != nullptr && !e->given_up) {
            const std::uint64_t now = monotonic_ns();
            const std::uint64_t due = e->sent_ns + retry_timer_.period_ns();
            wait_ns = due > now ? due - now : 0;
        }
    }
    if (wait_ns == 0) return;
    written_.park(std::chrono::nanoseconds(std::min<std::uint64_t>(wait_ns, 100'000'000ull)));
}

}  // namespace evb
