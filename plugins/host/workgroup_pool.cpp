// The workgroup thread pool of a host device.
#include "workgroup_pool.hpp"

#include <algorithm>

namespace backplane::host {

// One run() call. Threads claim runs of indices with `next` until it passes `count` (guided
// scheduling: a claim takes the unclaimed count over 4 x workers, at least one, so a launch of
// many small workgroups costs a few claims per thread instead of one atomic round trip per
// workgroup, and the last claims are small enough to balance); `done` counts the finished
// indices, and the caller sleeps on `finished` until it reaches `count`. The two counters sit on
// their own cache lines: every claim would otherwise also move the line the finishers write.
struct WorkgroupPool::Job {
    Job(uint64_t n, uint32_t workers, const std::function<void(uint64_t)> &f)
        : count(n), divisor(uint64_t{workers} * 4), body(&f) {}

    void work() {
        uint64_t first = next.load(std::memory_order_relaxed);
        while (first < count) {
            const uint64_t take = std::max<uint64_t>(1, (count - first) / divisor);
            if (!next.compare_exchange_weak(first, first + take, std::memory_order_relaxed))
                continue; // `first` now holds the current value
            const uint64_t end = std::min(count, first + take);
            for (uint64_t i = first; i < end; ++i)
                (*body)(i);
            if (done.fetch_add(end - first, std::memory_order_acq_rel) + (end - first) == count) {
                std::lock_guard lock(mutex); // no lost wake-up between the caller's check and wait
                finished.notify_all();
            }
            first = next.load(std::memory_order_relaxed);
        }
    }

    void waitFinished() {
        std::unique_lock lock(mutex);
        finished.wait(lock, [&] { return done.load(std::memory_order_acquire) == count; });
    }

    const uint64_t count;
    const uint64_t divisor;
    const std::function<void(uint64_t)> *body; ///< valid until waitFinished() returned
    alignas(64) std::atomic<uint64_t> next{0};
    alignas(64) std::atomic<uint64_t> done{0};
    alignas(64) std::mutex mutex;
    std::condition_variable finished;
};

WorkgroupPool::WorkgroupPool(uint32_t workers) {
    for (uint32_t i = 1; i < workers; ++i)
        threads_.emplace_back([this] { runThread(); });
}

WorkgroupPool::~WorkgroupPool() {
    {
        std::lock_guard lock(mutex_);
        stopping_ = true;
    }
    changed_.notify_all();
    for (auto &thread : threads_)
        thread.join();
}

void WorkgroupPool::run(uint64_t count, const std::function<void(uint64_t)> &body) {
    if (count == 0) return;
    if (threads_.empty() || count == 1) {
        for (uint64_t i = 0; i < count; ++i)
            body(i);
        return;
    }
    auto job = std::make_shared<Job>(count, workers(), body);
    {
        std::lock_guard lock(mutex_);
        jobs_.push_back(job);
    }
    changed_.notify_all();
    job->work();
    {
        // Every index is claimed now: take the job off the queue so no thread picks it up again.
        std::lock_guard lock(mutex_);
        jobs_.erase(std::remove(jobs_.begin(), jobs_.end(), job), jobs_.end());
    }
    job->waitFinished();
}

void WorkgroupPool::runThread() {
    for (;;) {
        std::shared_ptr<Job> job;
        {
            std::unique_lock lock(mutex_);
            changed_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
            if (jobs_.empty()) return; // stopping
            job = jobs_.front();
        }
        job->work();
        std::lock_guard lock(mutex_);
        if (!jobs_.empty() && jobs_.front() == job) jobs_.pop_front(); // exhausted
    }
}

} // namespace backplane::host
