// The file a disk writer holds open now, for whoever shows it (the status page,
// evb-ctl status, the service loop's stop): set by the writer at each open and
// close, read per scrape or command. A mutex suffices: a file opens a few times
// an hour, and a reader holds it for one string copy.
#pragma once

#include <mutex>
#include <string>
#include <vector>

namespace evb::file {

class OpenFiles {
public:
    void set(std::string path) {
        std::lock_guard lock(mutex_);
        path_ = std::move(path);
    }
    void clear() { set({}); }
    std::string current() const {
        std::lock_guard lock(mutex_);
        return path_;
    }
    std::vector<std::string> list() const {
        std::lock_guard lock(mutex_);
        return path_.empty() ? std::vector<std::string>{} : std::vector<std::string>{path_};
    }

private:
    mutable std::mutex mutex_;
    std::string path_;
};

}  // namespace evb::file
