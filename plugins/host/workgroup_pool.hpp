// A small thread pool per host device that runs the workgroups of one launch in parallel.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace backplane::host {

/// Runs index ranges in parallel: `workers - 1` pool threads plus the calling thread. Several
/// callers (stream workers of one device) may run jobs at once; they share the pool threads.
class WorkgroupPool {
public:
    explicit WorkgroupPool(uint32_t workers);
    /// Joins the pool threads; no run() may be in progress.
    ~WorkgroupPool();
    WorkgroupPool(const WorkgroupPool &) = delete;
    WorkgroupPool &operator=(const WorkgroupPool &) = delete;

    /// Calls body(i) once for every i in [0, count), concurrently for different i, and returns
    /// when all calls returned. `body` must not throw.
    void run(uint64_t count, const std::function<void(uint64_t)> &body);

    uint32_t workers() const noexcept { return static_cast<uint32_t>(threads_.size()) + 1; }

private:
    struct Job;
    void runThread();

    std::mutex mutex_;
    std::condition_variable changed_;
    std::deque<std::shared_ptr<Job>> jobs_;
    bool stopping_ = false;
    std::vector<std::thread> threads_; ///< last: started after the members above
};

} // namespace backplane::host
