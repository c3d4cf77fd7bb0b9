// POST /runrecord (docs/FORMATS.md section 12, docs/OPERATIONS.md 4.2): a client
// (a slow-control script, the shift's logbook) adds a COMMENT or a USER run record
// to the running run. The HTTP thread checks the request (who sent it, its size, the
// rate, its JSON) and hands it on through RunRecordPosts; the service loop, which
// knows the run, passes it to the writer through the same channel evb-ctl comment
// uses (RunNotes) and answers. Every refusal is counted by reason.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "monitor/http_server.hpp"

namespace evb::monitor {

// Why a post was refused: the label of evb_runrecord_posts_refused_total{reason}.
enum class PostRefusal : std::uint8_t {
    not_allowed,  // 403: the address is not in monitor.allow_post
    too_large,    // 413: over monitor.post_max_bytes
    too_fast,     // 429: over monitor.posts_per_s
    bad_request,  // 400/411: not UTF-8, not a JSON object, no "type", ...
    no_run,       // 409: no run is running, or run records are off
    busy,         // 503: the writer's queue of run records is full
    count
};
const char* post_refusal_name(PostRefusal r) noexcept;

// The service loop's answer to one post; the HTTP thread polls it (PendingResponse).
class PostAnswer final : public PendingResponse {
public:
    void set(int status, std::string content_type, std::string body);
    bool ready(HttpResponse& out) override;
    // The service loop, before it hands the post on: false when the HTTP thread has
    // given up on it already (answered 503): then it is not written.
    bool claim();
    // The HTTP thread's timeout: true (answer 503: not written) unless the service
    // loop has claimed it (its answer follows).
    bool give_up() override;

private:
    std::mutex m_;
    std::optional<HttpResponse> answer_;
    bool claimed_ = false, given_up_ = false;
};

// A checked post: a COMMENT's text as its record body ({"text": ...}) or a USER
// record's whole object; JSON text either way.
struct RunRecordPost {
    bool comment = false;
    std::string body;
    std::shared_ptr<PostAnswer> answer;
};

// HTTP thread -> service loop. Control plane, a few posts a second at most (the
// HTTP thread limits the rate): a mutex and a bounded queue. Counts for /metrics.
class RunRecordPosts {
public:
    static constexpr std::size_t kCapacity = 16;
    [[nodiscard]] bool try_push(RunRecordPost p);
    [[nodiscard]] bool try_pop(RunRecordPost& out);

    // Any thread: a post answered as accepted, or refused (answered with `status`).
    void accept(RunRecordPost& p, std::uint32_t run);
    void refuse(RunRecordPost& p, PostRefusal why, int status, const std::string& text);
    void count_refusal(PostRefusal why) noexcept {
        refused_[static_cast<std::size_t>(why)].fetch_add(1, std::memory_order_relaxed);
    }
    std::uint64_t accepted() const noexcept { return accepted_.load(std::memory_order_relaxed); }
    std::uint64_t refused(PostRefusal why) const noexcept {
        return refused_[static_cast<std::size_t>(why)].load(std::memory_order_relaxed);
    }

private:
    std::mutex m_;
    std::deque<RunRecordPost> posts_;
    std::atomic<std::uint64_t> accepted_{0};
    std::array<std::atomic<std::uint64_t>, static_cast<std::size_t>(PostRefusal::count)> refused_{};
};

// monitor.allow_post, monitor.post_max_bytes, monitor.posts_per_s.
struct PostSettings {
    std::vector<std::uint64_t> allowed_keys;  // sender_key() of each allowed address
    std::size_t max_bytes = 65536;
    std::uint32_t per_second = 10;
};

// The HTTP server's POST route: POST /runrecord only. Runs on the HTTP thread.
class RunRecordRoute final : public PostRoute {
public:
    RunRecordRoute(PostSettings settings, RunRecordPosts& posts);
    std::optional<HttpResponse> admit(std::string_view path, const sockaddr_storage& peer,
                                      std::optional<std::size_t> content_length) override;
    HttpResponse take(std::string_view path, std::string_view body) override;

    // The checks of take(), apart (tests): the record to post, or the 400's text.
    struct Checked {
        std::optional<RunRecordPost> post;
        std::string why;
    };
    static Checked check(std::string_view body);

private:
    HttpResponse refused(PostRefusal why, int status, std::string text);
    PostSettings s_;
    RunRecordPosts& posts_;
    double tokens_;                         // rate: a bucket of posts_per_s, refilled continuously
    std::uint64_t refilled_ns_ = 0;
};

}  // namespace evb::monitor
