#include "monitor/run_record_posts.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "core/model/sender_pins.hpp"
#include "core/util/clock.hpp"
#include "core/util/json_depth.hpp"
#include "core/util/json_text.hpp"

namespace evb::monitor {

namespace {

constexpr const char* kText = "text/plain; charset=utf-8";
// Nesting a record body may have: readers parse it (Python's json recurses), and
// nothing a run record is for needs more.
constexpr std::size_t kMaxTypeBytes = 64;

// Where `s` stops being UTF-8 (RFC 3629: no overlong forms, no surrogates, at most
// U+10FFFF), or npos.
std::size_t utf8_error(std::string_view s) noexcept {
    std::size_t i = 0;
    while (i < s.size()) {
        const auto c = static_cast<unsigned char>(s[i]);
        std::size_t n = 0;
        std::uint32_t cp = 0, min = 0;
        if (c < 0x80) {
            ++i;
            continue;
        } else if ((c & 0xE0) == 0xC0) {
            n = 1, cp = c & 0x1F, min = 0x80;
        } else if ((c & 0xF0) == 0xE0) {
            n = 2, cp = c & 0x0F, min = 0x800;
        } else if ((c & 0xF8) == 0xF0) {
            n = 3, cp = c & 0x07, min = 0x10000;
        } else {
            return i;
        }
        for (std::size_t k = 1; k <= n; ++k) {
            if (i + k >= s.size()) return i;
            const auto d = static_cast<unsigned char>(s[i + k]);
            if ((d & 0xC0) != 0x80) return i;
            cp = (cp << 6) | (d & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
        i += n + 1;
    }
    return std::string_view::npos;
}

}  // namespace

const char* post_refusal_name(PostRefusal r) noexcept {
    switch (r) {
        case PostRefusal::not_allowed: return "not_allowed";
        case PostRefusal::too_large: return "too_large";
        case PostRefusal::too_fast: return "too_fast";
        case PostRefusal::bad_request: return "bad_request";
        case PostRefusal::no_run: return "no_run";
        case PostRefusal::busy: return "busy";
        case PostRefusal::count: break;
    }
    return "?";
}

void PostAnswer::set(int status, std::string content_type, std::string body) {
    std::lock_guard lock(m_);
    answer_ = HttpResponse{status, std::move(content_type), std::move(body), nullptr};
}

bool PostAnswer::ready(HttpResponse& out) {
    std::lock_guard lock(m_);
    if (!answer_) return false;
    out = std::move(*answer_);
    answer_.reset();
    return true;
}

bool PostAnswer::claim() {
    std::lock_guard lock(m_);
    claimed_ = !given_up_;
    return claimed_;
}

bool PostAnswer::give_up() {
    std::lock_guard lock(m_);
    given_up_ = !claimed_;
    return given_up_;
}

bool RunRecordPosts::try_push(RunRecordPost p) {
    std::lock_guard lock(m_);
    if (posts_.size() >= kCapacity) return false;
    posts_.push_back(std::move(p));
    return true;
}

bool RunRecordPosts::try_pop(RunRecordPost& out) {
    std::lock_guard lock(m_);
    if (posts_.empty()) return false;
    out = std::move(posts_.front());
    posts_.pop_front();
    return true;
}

void RunRecordPosts::accept(RunRecordPost& p, std::uint32_t run) {
    accepted_.fetch_add(1, std::memory_order_relaxed);
    p.answer->set(200, "application/json; charset=utf-8", json_text(nlohmann::ordered_json{{"ok", true},
                                                        {"run", run},
                                                        {"record", p.comment ? "COMMENT" : "USER"}}) + "\n");
}

void RunRecordPosts::refuse(RunRecordPost& p, PostRefusal why, int status, const std::string& text) {
    count_refusal(why);
    p.answer->set(status, kText, text + "\n");
}

RunRecordRoute::RunRecordRoute(PostSettings settings, RunRecordPosts& posts)
    : s_(std::move(settings)), posts_(posts), tokens_(std::max<std::uint32_t>(s_.per_second, 1)) {}

HttpResponse RunRecordRoute::refused(PostRefusal why, int status, std::string text) {
    posts_.count_refusal(why);
    return {status, kText, std::move(text), nullptr};
}

std::optional<HttpResponse> RunRecordRoute::admit(std::string_view path, const sockaddr_storage& peer,
                                                  std::optional<std::size_t> content_length) {
    if (path != "/runrecord") return HttpResponse{404, kText, "not found: evbd takes POST /runrecord only\n", nullptr};
    const std::uint64_t key = sender_key(peer);
    if (std::find(s_.allowed_keys.begin(), s_.allowed_keys.end(), key) == s_.allowed_keys.end())
        return refused(PostRefusal::not_allowed, 403,
                       s_.allowed_keys.empty()
                           ? "POST /runrecord is refused: monitor.allow_post lists no address (none by default)\n"
                           : fmt::format("POST /runrecord is refused: {} is not in monitor.allow_post\n",
                                         sender_key_text(key)));
    if (!content_length)
        return refused(PostRefusal::bad_request, 411, "a POST needs a Content-Length (chunked bodies are not taken)\n");
    if (*content_length > s_.max_bytes)
        return refused(PostRefusal::too_large, 413,
                       fmt::format("the body is {} bytes; monitor.post_max_bytes is {}\n", *content_length, s_.max_bytes));
    // A bucket of per_second posts, refilled at per_second a second.
    const double rate = std::max<std::uint32_t>(s_.per_second, 1);
    const std::uint64_t now = monotonic_ns();
    if (refilled_ns_ != 0) tokens_ = std::min(rate, tokens_ + rate * static_cast<double>(now - refilled_ns_) / 1e9);
    refilled_ns_ = now;
    if (tokens_ < 1.0)
        return refused(PostRefusal::too_fast, 429,
                       fmt::format("more than monitor.posts_per_s ({}) posts a second; try again shortly\n", s_.per_second));
    tokens_ -= 1.0;
    return std::nullopt;
}

RunRecordRoute::Checked RunRecordRoute::check(std::string_view body) {
    auto bad = [](std::string why) { return Checked{std::nullopt, std::move(why)}; };
    if (const std::size_t at = utf8_error(body); at != std::string_view::npos)
        return bad(fmt::format("the body is not UTF-8 (byte {})", at));
    if (find_too_deep(body)) return bad(fmt::format("the body nests arrays and objects deeper than {} levels", kMaxJsonDepth));
    nlohmann::ordered_json j;
    try {
        j = nlohmann::ordered_json::parse(body);
    } catch (const nlohmann::json::parse_error& e) {
        return bad(fmt::format("the body is not JSON ({})", e.what()));
    }
    if (!j.is_object()) return bad("the body is not a JSON object");
    const auto type = j.find("type");
    if (type == j.end()) return bad("the object has no \"type\" (\"COMMENT\", or the name of a USER record)");
    if (!type->is_string() || type->get_ref<const std::string&>().empty())
        return bad("\"type\" is not a non-empty string");
    const std::string& t = type->get_ref<const std::string&>();
    if (t.size() > kMaxTypeBytes) return bad(fmt::format("\"type\" is longer than {} bytes", kMaxTypeBytes));
    if (t == "BEGIN_OF_RUN" || t == "END_OF_RUN") return bad(fmt::format("\"type\" {} is evbd's own record", t));
    if (t != "COMMENT") return Checked{RunRecordPost{false, json_text(j), nullptr}, {}};
    const auto text = j.find("text");
    if (text == j.end() || !text->is_string()) return bad("a COMMENT needs \"text\", a string");
    for (const auto& [k, v] : j.items())
        if (k != "type" && k != "text") return bad(fmt::format("a COMMENT holds \"type\" and \"text\" only, not \"{}\"", k));
    return Checked{RunRecordPost{true, json_text(nlohmann::ordered_json{{"text", *text}}), nullptr}, {}};
}

HttpResponse RunRecordRoute::take(std::string_view path, std::string_view body) {
    (void)path;  // admit() let /runrecord only through
    Checked c = check(body);
    if (!c.post) return refused(PostRefusal::bad_request, 400, c.why + "\n");
    c.post->answer = std::make_shared<PostAnswer>();
    std::shared_ptr<PostAnswer> answer = c.post->answer;
    if (!posts_.try_push(std::move(*c.post)))
        return refused(PostRefusal::busy, 503,
                       fmt::format("{} posts wait for evbd already; try again shortly\n", RunRecordPosts::kCapacity));
    HttpResponse r;
    r.pending = std::move(answer);
    return r;
}

}  // namespace evb::monitor
