// evb-sink: a bare receiver, the limit that evbd's input is measured against
// (perf/tcp_ingest.py, issue 44): what the kernel's loopback and one reading thread
// allow, with the same sender (evb-source) as evbd gets, doing nothing with the bytes.
//   --tcp N: accepts connections on the address and reads them with epoll into one
//            buffer; ends once N connections have come and all have closed.
//   --udp:   reads datagrams with recvmmsg (64 at a time); ends once nothing came for
//            --idle-ms (default 1000) after the first.
//   --write DIR: also writes every byte it reads into one file in DIR: the reader
//            hands its buffers to a writer thread, which appends them through evbd's
//            own file writer (file::OutputFile: copied into O_DIRECT stages written
//            with AIO), as evbd's writer thread does its records; nothing is built.
//            Receiving and writing, in evbd's two threads, with nothing else. The file
//            (the stream as read, no run file) is left for the caller to remove.
// Prints one JSON line: bytes, messages (UDP datagrams; 0 for TCP), connections,
// seconds (first byte to the last close or datagram, and with --write until the file
// is closed), tail_s (from that end to the printing: the UDP idle wait) and the CPU
// seconds it used from when it listened.
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "core/io/output_file.hpp"
#include "net/udp.hpp"

namespace {

// --write: a writer thread appends what the reader hands it to one file through
// evbd's file::OutputFile, as evbd's writer thread does with its records. The reader
// reads into buffers of a pool of kBuffers x kBufferBytes (64 MiB, evbd's TCP receive
// pool) and hands each over when it cannot take another read (UDP: also when the
// socket is empty; its datagrams take 64 KiB each); with every buffer handed over and
// not yet written, the reader waits (as evbd's stops reading).
class Output {
public:
    static constexpr std::size_t kBuffers = 16;
    static constexpr std::size_t kBufferBytes = 4u << 20;

    ~Output() {
        if (thread_.joinable()) (void)close();
    }
    // Returns false (having said why) when the file cannot be created.
    bool open(const std::string& dir) {
        if (dir.empty()) return true;
        evb::file::FileHeader h;
        h.run_number = 1;
        h.file_sequence = evb::file::next_file_sequence(dir, 1, 0);
        h.version = 2;
        if (const int e = file_.open(dir, h, /*direct=*/true); e != 0) {
            std::fprintf(stderr, "evb-sink: --write %s: %s\n", dir.c_str(), std::strerror(e));
            return false;
        }
        memory_.resize(kBuffers * kBufferBytes);
        for (std::size_t i = 0; i < kBuffers; ++i) {
            buffers_[i].data = memory_.data() + i * kBufferBytes;
            free_.push_back(&buffers_[i]);
        }
        thread_ = std::thread([this] { write_loop(); });
        writing_ = true;
        return true;
    }
    bool writing() const noexcept { return writing_; }
    // After close(): when the writer finished its last append, and how long the close took.
    std::chrono::steady_clock::time_point last_append() const noexcept { return last_append_; }
    std::chrono::steady_clock::duration closing() const noexcept { return closing_; }
    // At least `want` bytes to read into (all the current buffer has left).
    std::span<std::byte> room(std::size_t want) {
        if (current_ != nullptr && kBufferBytes - current_->used < want) hand_over();
        if (current_ == nullptr) {
            std::unique_lock lock(mutex_);
            freed_.wait(lock, [this] { return !free_.empty(); });
            current_ = free_.front();
            free_.pop_front();
        }
        return {current_->data + current_->used, kBufferBytes - current_->used};
    }
    // `len` bytes were read at `p`, inside the last room().
    void add(std::byte* p, std::size_t len) {
        std::vector<iovec>& pieces = current_->pieces;
        if (!pieces.empty() && static_cast<std::byte*>(pieces.back().iov_base) + pieces.back().iov_len == p)
            pieces.back().iov_len += len;
        else
            pieces.push_back({p, len});
        current_->used = static_cast<std::size_t>(p + len - current_->data);
    }
    // Hands the buffer being filled over now (the reader expects to wait).
    void flush() { hand_over(); }
    // Hands everything over, waits for it to be written and closes the file (its last
    // stage written, not synced: evbd counts an event written once the kernel has it).
    // The file, the stream as read and no run file, stays for the caller to remove.
    // Returns false on a failed write.
    bool close() {
        if (!thread_.joinable()) return error_ == 0;
        hand_over();
        {
            std::lock_guard lock(mutex_);
            done_ = true;
        }
        filled_.notify_one();
        thread_.join();
        const auto t0 = std::chrono::steady_clock::now();
        if (error_ == 0) error_ = file_.close_clean(/*sync=*/false);
        closing_ = std::chrono::steady_clock::now() - t0;
        if (error_ != 0) std::fprintf(stderr, "evb-sink: writing %s: %s\n", file_.part_path().c_str(), std::strerror(error_));
        return error_ == 0;
    }

private:
    struct Buffer {
        std::byte* data = nullptr;
        std::size_t used = 0;
        std::vector<iovec> pieces;
    };

    void hand_over() {
        if (current_ == nullptr || current_->pieces.empty()) return;
        {
            std::lock_guard lock(mutex_);
            full_.push_back(current_);
        }
        filled_.notify_one();
        current_ = nullptr;
    }

    void write_loop() {
        for (;;) {
            Buffer* b = nullptr;
            {
                std::unique_lock lock(mutex_);
                filled_.wait(lock, [this] { return !full_.empty() || done_; });
                if (full_.empty()) return;
                b = full_.front();
                full_.pop_front();
            }
            if (error_ == 0) error_ = file_.append(b->pieces.data(), b->pieces.size());
            last_append_ = std::chrono::steady_clock::now();
            b->pieces.clear();
            b->used = 0;
            {
                std::lock_guard lock(mutex_);
                free_.push_back(b);
            }
            freed_.notify_one();
        }
    }

    evb::file::OutputFile file_;
    bool writing_ = false;
    int error_ = 0;  // the writer thread's until it is joined, as last_append_
    std::chrono::steady_clock::time_point last_append_{};
    std::chrono::steady_clock::duration closing_{};
    std::vector<std::byte> memory_;
    std::array<Buffer, kBuffers> buffers_{};
    Buffer* current_ = nullptr;  // the reader's
    std::mutex mutex_;
    std::condition_variable filled_, freed_;
    std::deque<Buffer*> free_, full_;
    bool done_ = false;
    std::thread thread_;
};

double cpu_seconds() {
    rusage u{};
    ::getrusage(RUSAGE_SELF, &u);
    return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
           static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

int usage(const char* why) {
    std::fprintf(stderr,
                 "evb-sink: %s\nusage: evb-sink --listen HOST:PORT (--tcp N | --udp [--idle-ms MS]) [--rcvbuf BYTES] "
                 "[--write DIR]\n  --write DIR  also write what is read into a file in DIR through evbd's O_DIRECT "
                 "file writer, in a writer thread (the file is left there)\n",
                 why);
    return 2;
}

// What a receiver prints at the end: `end` is when it had everything (and with
// --write, had written it); cpu0 the CPU seconds used before it listened.
void report(unsigned long long bytes, unsigned long long messages, long connections,
            std::chrono::steady_clock::time_point first, std::chrono::steady_clock::time_point end, double cpu0) {
    const double seconds = bytes == 0 ? 0.0 : std::chrono::duration<double>(end - first).count();
    const double tail = std::chrono::duration<double>(std::chrono::steady_clock::now() - end).count();
    std::printf("{\"bytes\":%llu,\"messages\":%llu,\"connections\":%ld,\"seconds\":%.6f,\"tail_s\":%.6f,"
                "\"cpu_s\":%.6f}\n",
                bytes, messages, connections, seconds, tail, cpu_seconds() - cpu0);
}

int udp_sink(const evb::net::Endpoint& at, const std::string& listen, long rcvbuf, long idle_ms, Output& out) {
    const int fd = ::socket(at.addr.ss_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (rcvbuf > 0 && ::setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &rcvbuf, sizeof rcvbuf) != 0)
        ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);  // without CAP_NET_ADMIN: up to rmem_max
    if (fd < 0 || ::bind(fd, reinterpret_cast<const sockaddr*>(&at.addr), at.len) != 0) {
        std::fprintf(stderr, "evb-sink: %s: %s\n", listen.c_str(), std::strerror(errno));
        return 1;
    }
    const double cpu0 = cpu_seconds();
    std::printf("evb-sink: listening\n");
    std::fflush(stdout);
    constexpr unsigned kBatch = 64;
    constexpr std::size_t kSlot = 65536;
    std::vector<std::byte> buf(kBatch * kSlot);
    std::vector<iovec> iov(kBatch);
    std::vector<mmsghdr> msgs(kBatch);
    // With --write each batch is read into what is left of a buffer of the writer's
    // pool instead (a slot at least), one after the other.
    const auto aim = [&](std::span<std::byte> room) {
        const unsigned n = static_cast<unsigned>(std::min<std::size_t>(kBatch, room.size() / kSlot));
        for (unsigned i = 0; i < n; ++i) {
            iov[i] = {room.data() + i * kSlot, kSlot};
            msgs[i] = {};
            msgs[i].msg_hdr.msg_iov = &iov[i];
            msgs[i].msg_hdr.msg_iovlen = 1;
        }
        return n;
    };
    static_assert(kBatch * kSlot <= Output::kBufferBytes);
    unsigned aimed = aim(buf);
    unsigned long long bytes = 0, messages = 0;
    std::chrono::steady_clock::time_point first{}, last{};
    for (;;) {
        timeval tv{};
        if (messages > 0) {
            tv.tv_sec = idle_ms / 1000;
            tv.tv_usec = (idle_ms % 1000) * 1000;
        }
        ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        if (out.writing()) aimed = aim(out.room(kSlot));
        int n = -1;
        bool wait = !out.writing();
        // With --write, an empty socket first has what came written (the wait below
        // may be the last, up to --idle-ms).
        if (out.writing()) {
            n = ::recvmmsg(fd, msgs.data(), aimed, MSG_DONTWAIT, nullptr);
            if (n < 0 && errno == EAGAIN) {
                out.flush();
                aimed = aim(out.room(kSlot));
                wait = true;
            }
        }
        if (wait) n = ::recvmmsg(fd, msgs.data(), aimed, MSG_WAITFORONE, nullptr);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;  // idle for idle_ms: the sender is done
        if (messages == 0) first = std::chrono::steady_clock::now();
        last = std::chrono::steady_clock::now();
        messages += static_cast<unsigned long long>(n);
        for (int i = 0; i < n; ++i) {
            const std::size_t len = msgs[static_cast<std::size_t>(i)].msg_len;
            bytes += len;
            if (out.writing()) out.add(static_cast<std::byte*>(iov[static_cast<std::size_t>(i)].iov_base), len);
        }
    }
    if (!out.close()) return 1;
    // With --write the end is the last datagram's write and the file's close, which
    // happened during and after the idle wait.
    if (out.writing()) last = std::max(last, out.last_append()) + out.closing();
    report(bytes, messages, 0, first, last, cpu0);
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    std::string listen;
    long connections = 0, rcvbuf = 0, idle_ms = 1000;
    bool udp = false;
    std::string write_dir;
    for (int i = 1; i < argc; ++i) {
        const std::string_view a = argv[i];
        if (a == "--udp") {
            udp = true;
            continue;
        }
        if (i + 1 >= argc) return usage(fmt::format("{} needs a value", a).c_str());
        if (a == "--listen") listen = argv[++i];
        else if (a == "--tcp") connections = std::strtol(argv[++i], nullptr, 10);
        else if (a == "--rcvbuf") rcvbuf = std::strtol(argv[++i], nullptr, 10);
        else if (a == "--idle-ms") idle_ms = std::strtol(argv[++i], nullptr, 10);
        else if (a == "--write") write_dir = argv[++i];
        else return usage(fmt::format("unknown option '{}'", a).c_str());
    }
    if (listen.empty() || (connections <= 0) == !udp) return usage("--listen and one of --tcp N or --udp are needed");
    evb::net::Endpoint at;
    try {
        at = evb::net::parse_endpoint(listen);
    } catch (const std::exception& e) {
        return usage(e.what());
    }
    Output out;
    if (!out.open(write_dir)) return 1;
    if (udp) return udp_sink(at, listen, rcvbuf, idle_ms, out);
    const int lfd = ::socket(at.addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const int one = 1;
    ::setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (lfd < 0 || ::bind(lfd, reinterpret_cast<const sockaddr*>(&at.addr), at.len) != 0 || ::listen(lfd, 1024) != 0) {
        std::fprintf(stderr, "evb-sink: %s: %s\n", listen.c_str(), std::strerror(errno));
        return 1;
    }
    const double cpu0 = cpu_seconds();
    std::printf("evb-sink: listening\n");
    std::fflush(stdout);
    const int ep = ::epoll_create1(EPOLL_CLOEXEC);
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = lfd;
    ::epoll_ctl(ep, EPOLL_CTL_ADD, lfd, &ev);
    std::vector<std::byte> buf(1u << 20);
    std::vector<epoll_event> ready(256);
    long accepted = 0, open = 0;
    unsigned long long bytes = 0;
    std::chrono::steady_clock::time_point first{}, last{};
    while (accepted < connections || open > 0) {
        const int n = ::epoll_wait(ep, ready.data(), static_cast<int>(ready.size()), -1);
        if (n < 0 && errno == EINTR) continue;
        for (int i = 0; i < n; ++i) {
            const int fd = ready[static_cast<std::size_t>(i)].data.fd;
            if (fd == lfd) {
                const int c = ::accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
                if (c < 0) continue;
                if (rcvbuf > 0) ::setsockopt(c, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
                epoll_event cev{};
                cev.events = EPOLLIN;
                cev.data.fd = c;
                ::epoll_ctl(ep, EPOLL_CTL_ADD, c, &cev);
                ++accepted;
                ++open;
                continue;
            }
            for (;;) {  // read until the socket is empty, as evbd's reader does
                // With --write into the writer's buffers, at least 64 KiB a read.
                const std::span<std::byte> into = out.writing() ? out.room(64u << 10) : std::span<std::byte>(buf);
                const ssize_t got = ::read(fd, into.data(), into.size());
                if (got > 0) {
                    if (bytes == 0) first = std::chrono::steady_clock::now();
                    bytes += static_cast<unsigned long long>(got);
                    if (out.writing()) out.add(into.data(), static_cast<std::size_t>(got));
                    continue;
                }
                if (got < 0 && (errno == EAGAIN || errno == EINTR)) break;
                ::epoll_ctl(ep, EPOLL_CTL_DEL, fd, nullptr);
                ::close(fd);
                --open;
                last = std::chrono::steady_clock::now();
                break;
            }
        }
    }
    if (!out.close()) return 1;
    if (out.writing()) last = std::chrono::steady_clock::now();
    report(bytes, 0, accepted, first, last, cpu0);
    return 0;
}
