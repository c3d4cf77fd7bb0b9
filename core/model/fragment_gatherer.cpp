#include "core/model/fragment_gatherer.hpp"

namespace evb {

namespace {
bool same_fragment(const ChunkMeta* a, const ChunkMeta* b) noexcept {
    return a->run_number == b->run_number && a->event_id == b->event_id;
}
bool before(const ChunkMeta* a, const ChunkMeta* b) noexcept {
    if (a->run_number != b->run_number) return a->run_number < b->run_number;
    if (a->event_id != b->event_id) return a->event_id < b->event_id;
    return a->chunk_index < b->chunk_index;
}
bool says_last(const ChunkMeta* c) noexcept { return (c->flags & chunk_flags::last_chunk) != 0; }
void mark_whole(ChunkMeta* first) noexcept {
    for (ChunkMeta* k = first; k != nullptr; k = k->next) k->flags = static_cast<std::uint16_t>(k->flags | chunk_flags::whole);
}
}  // namespace

FragmentGatherer::FragmentGatherer(std::size_t sources, std::uint32_t max_slots, bool waiting, bool described,
                                   alloc::ReturnBatcher& returns, stats::MatcherCounters& counters)
    : max_slots_(max_slots), held_(sources, 0), returns_(returns), counters_(counters) {
    if (waiting) waiting_.assign(sources, nullptr);
    if (described) {
        ungathered_.assign(sources, nullptr);
        gathered_.assign(sources, RecentlyGathered{});
    }
}

void FragmentGatherer::count_share_refusal(std::size_t i) noexcept {
    counters_.source_slot_limit_drops.add();
    counters_.source_slot_limit[i].add();
}

bool FragmentGatherer::tiles(const ChunkMeta* first, std::uint64_t length) noexcept {
    std::uint64_t end = 0;
    for (const ChunkMeta* k = first; k != nullptr; k = k->next) {
        if (k->chunk_offset != end) return false;
        end += k->payload_length;
    }
    return end == length;
}

void FragmentGatherer::drop_chain(ChunkMeta* c) noexcept {
    while (c != nullptr) {
        ChunkMeta* next = c->next;
        drop(c);
        c = next;
    }
}

// When the chunk completes the fragment, the fragment's chunks leave the list as
// first..last, checked to tile it.
FragmentGatherer::Gather FragmentGatherer::gather(ChunkMeta*& list, ChunkMeta* c, std::size_t i, ChunkMeta*& first,
                                                  ChunkMeta*& last) noexcept {
    const std::uint64_t seq = c->event_id;
    ChunkMeta* after = nullptr;
    ChunkMeta* run_first = nullptr;  // first chunk of this fragment, and the one before it
    ChunkMeta* before_run = nullptr;
    std::uint32_t have = 0;  // this fragment's chunks in the list before c's place
    ChunkMeta* p = list;
    for (; p != nullptr && p->event_id <= seq; p = p->next) {
        if (p->event_id == seq) {
            if (p->chunk_index == c->chunk_index) {
                counters_.duplicate_chunks.add();
                drop(c);
                return Gather::duplicate;
            }
            if (p->fragment_length != c->fragment_length || p->chunk_count != c->chunk_count ||
                p->timestamp != c->timestamp || p->run_number != c->run_number) {
                counters_.inconsistent_chunks.add();
                drop(c);
                return Gather::refused;
            }
            if (p->chunk_index > c->chunk_index) break;  // c goes before it
            if (run_first == nullptr) {
                run_first = p;
                before_run = after;
            }
            ++have;
        }
        after = p;
    }
    // Its chunks after c's place count too: a chunk that completes the fragment
    // is taken over the share, wherever it falls among the waiting ones.
    std::uint32_t behind = 0;
    for (; p != nullptr && p->event_id == seq; p = p->next) ++behind;
    if (refused_for_share(i, have + behind + 1u >= c->chunk_count, c)) {
        drop(c);
        return Gather::refused;
    }
    if (after != nullptr) {
        c->next = after->next;
        after->next = c;
    } else {
        c->next = list;
        list = c;
    }
    hold(i);
    if (have + behind + 1u < c->chunk_count) return Gather::held;
    // Complete: its chunks are a run of the list; take them out and check that
    // they tile the fragment.
    if (run_first == nullptr || run_first->chunk_index > c->chunk_index) {
        run_first = c;
        before_run = after;
    }
    last = run_first;
    while (last->next != nullptr && last->next->event_id == seq) last = last->next;
    if (before_run != nullptr) before_run->next = last->next; else list = last->next;
    last->next = nullptr;
    first = run_first;
    release(i, c->chunk_count);
    if (!tiles(first, c->fragment_length)) {
        counters_.inconsistent_chunks.add();
        drop_chain(first);
        return Gather::broken;
    }
    return Gather::complete;
}

// Timestamp mode: a complete fragment joins an event (section 5), so the chunks of a
// fragment of several wait in their source's list until it is whole, then find
// their event once, by its timestamp. A chunk that waits longer than
// building.timeout_ms for the others is dropped (expire).
FragmentGatherer::Gather FragmentGatherer::add_waiting(ChunkMeta* c, std::size_t i, std::uint64_t now_ns,
                                                       ChunkMeta*& first) noexcept {
    if ((c->flags & wire::fragment_flags::has_crc) && c->received_crc32c != c->payload_crc32c) {
        counters_.crc_failures.add();  // no event holds it yet to be marked CORRUPT_DROPPED
        drop(c);
        return Gather::refused;
    }
    wire::store_u64(c->spare(), now_ns);  // when it began to wait
    ChunkMeta* last = nullptr;
    const Gather g = gather(waiting_[i], c, i, first, last);
    if (g == Gather::held) ++waiting_chunks_;
    // Whole or broken, the fragment's other chunks have stopped waiting.
    if (g == Gather::complete || g == Gather::broken) waiting_chunks_ -= c->chunk_count - 1u;
    if (g == Gather::complete) mark_whole(first);
    return g;
}

int FragmentGatherer::RecentlyGathered::chunks_of(std::uint64_t e, std::uint32_t r) const noexcept {
    for (std::size_t k = 0; k < count; ++k)
        if (event[k] == e && run[k] == r) return static_cast<int>(chunks[k]);
    return -1;
}

void FragmentGatherer::RecentlyGathered::insert(std::uint64_t e, std::uint32_t r, std::uint32_t n) noexcept {
    for (std::size_t k = 0; k < count; ++k)
        if (event[k] == e && run[k] == r) {
            chunks[k] = n;
            return;
        }
    event[next] = e;
    run[next] = r;
    chunks[next] = n;
    next = static_cast<std::uint8_t>((next + 1) % kDepth);
    if (count < kDepth) ++count;
}

// A chunk of a described fragment (docs/FORMATS.md 8.3 `chunk`) carries its
// (source, event) and index, but neither the fragment's length, its own offset in
// it, the chunk count, nor (first_chunk_only) the timestamp. Its chunks wait here,
// per source, by (run, event, index), until chunk 0, the one with the last-packet
// bit and every one between are in; then those fields are filled in from them and
// the fragment goes on as a whole EVB fragment would. Nothing is guessed: a later
// chunk whose first has not come waits for it, and a fragment not whole within
// building.timeout_ms is dropped (stale_chunks). A copy of a waiting chunk is
// counted a duplicate and dropped (the first is kept, marked copy_seen so that its
// event gets DUPLICATES). A chunk past the one with the last-packet bit (a second
// last bit, or a false one) is inconsistent: the fragment is dropped.
FragmentGatherer::Described FragmentGatherer::add_described(ChunkMeta* c, std::size_t i, std::uint64_t now_ns,
                                                            ChunkMeta*& first, std::uint32_t& n) noexcept {
    ChunkMeta* after = nullptr;  // insert after this chunk (nullptr: at the head)
    ChunkMeta* p = ungathered_[i];
    while (p != nullptr && before(p, c)) {
        after = p;
        p = p->next;
    }
    if (p != nullptr && same_fragment(p, c) && p->chunk_index == c->chunk_index) {
        counters_.duplicate_chunks.add();
        p->flags = static_cast<std::uint16_t>(p->flags | chunk_flags::copy_seen);  // its event gets DUPLICATES
        drop(c);
        return Described::dropped;
    }
    c->next = p;
    if (after != nullptr) after->next = c; else ungathered_[i] = c;
    wire::store_u64(c->spare(), now_ns);  // when it began to wait (expire)

    // The fragment's chunks are a run of the list: whole when they are 0..n-1 and
    // chunk n-1 is the last.
    ChunkMeta* before_run = nullptr;
    first = ungathered_[i];
    while (!same_fragment(first, c)) {
        before_run = first;
        first = first->next;
    }
    n = 0;
    ChunkMeta* last = nullptr;
    for (ChunkMeta* k = first; k != nullptr && same_fragment(k, c) && k->chunk_index == n; k = k->next) {
        ++n;
        if (says_last(k)) {
            last = k;
            break;
        }
    }
    if (last == nullptr) {
        if (refused_for_share(i, false, c)) {
            if (after != nullptr) after->next = c->next; else ungathered_[i] = c->next;
            drop(c);
            return Described::dropped;
        }
        hold(i);
        ++ungathered_chunks_;
        return Described::held;
    }
    hold(i);
    ++ungathered_chunks_;
    if (last->next != nullptr && same_fragment(last->next, c)) {
        // Chunks past the last one wait already: a second last bit, or a false one.
        // Every chunk of the fragment goes; those past the last are inconsistent.
        const std::uint64_t event = c->event_id;
        const std::uint32_t run = c->run_number;
        ChunkMeta* k = first;
        while (k != nullptr && same_fragment(k, c)) {
            ChunkMeta* next = k->next;
            if (k->chunk_index >= n) counters_.inconsistent_chunks.add();
            release(i);
            --ungathered_chunks_;
            drop(k);
            k = next;
        }
        if (before_run != nullptr) before_run->next = k; else ungathered_[i] = k;
        remember_gathered(i, event, run, 0);  // none of its chunks is taken again
        return Described::dropped;
    }
    if (before_run != nullptr) before_run->next = last->next; else ungathered_[i] = last->next;
    last->next = nullptr;
    release(i, n);
    ungathered_chunks_ -= n;
    fill_in_described(first, n);
    mark_whole(first);
    return Described::whole;
}

void FragmentGatherer::fill_in_described(ChunkMeta* first, std::uint32_t n) noexcept {
    // What an EVB chunk says of its fragment, now known; the first chunk's timestamp
    // is every chunk's (first_chunk_only), as each EVB chunk carries it.
    std::uint32_t offset = 0;
    for (ChunkMeta* k = first; k != nullptr; k = k->next) {
        k->chunk_offset = offset;
        offset += k->payload_length;  // at most 65535 chunks of at most 65535 bytes: no overflow
        k->chunk_count = static_cast<std::uint16_t>(n);
        k->timestamp = first->timestamp;
        k->flags = static_cast<std::uint16_t>(k->flags & ~(chunk_flags::ungathered | chunk_flags::last_chunk));
    }
    for (ChunkMeta* k = first; k != nullptr; k = k->next) k->fragment_length = offset;
    // A heartbeat (its first datagram says EMPTY; docs/FORMATS.md 8.3 `empty`) is one
    // EMPTY fragment whatever it was sent in, as an EVB one is: length 0, one chunk.
    // Its other datagrams carry nothing to keep but their `error` bit. A fragment that is not one keeps
    // no EMPTY on a later datagram either (its chunks would each count as a heartbeat).
    if (first->flags & wire::fragment_flags::empty) {
        // An `error` bit on any of its datagrams still flags it (unless first_chunk_only),
        // and a copy of any of them its event.
        for (const ChunkMeta* k = first->next; k != nullptr; k = k->next)
            first->flags = static_cast<std::uint16_t>(
                first->flags | (k->flags & (wire::fragment_flags::source_error | chunk_flags::copy_seen)));
        drop_chain(first->next);
        first->next = nullptr;
        first->chunk_count = 1;
        first->fragment_length = first->payload_length = 0;
    } else {
        for (ChunkMeta* k = first->next; k != nullptr; k = k->next)
            k->flags = static_cast<std::uint16_t>(k->flags & ~wire::fragment_flags::empty);
    }
}

void FragmentGatherer::expire_lists(std::vector<ChunkMeta*>& lists, std::size_t& chunks, std::uint64_t now_ns,
                                    std::uint64_t timeout_ns, bool all) noexcept {
    if (chunks == 0) return;
    for (std::size_t i = 0; i < lists.size(); ++i) {
        ChunkMeta** link = &lists[i];
        while (*link != nullptr) {
            ChunkMeta* k = *link;
            if (all || wire::load_u64(k->spare()) + timeout_ns <= now_ns) {  // when it began to wait
                *link = k->next;
                release(i);
                --chunks;
                counters_.stale_chunks.add();
                drop(k);
            } else {
                link = &k->next;
            }
        }
    }
}

void FragmentGatherer::expire(std::uint64_t now_ns, std::uint64_t timeout_ns, bool all) noexcept {
    expire_lists(waiting_, waiting_chunks_, now_ns, timeout_ns, all);
    expire_lists(ungathered_, ungathered_chunks_, now_ns, timeout_ns, all);
}

}  // namespace evb
