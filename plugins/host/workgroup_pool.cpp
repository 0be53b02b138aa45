// The workgroup thread pool of a host device.
#include "workgroup_pool.hpp"

#include <algorithm>

namespace backplane::host {

// One run() call. Threads claim indices with `next` until it passes `count`; `done` counts the
// finished calls, and the caller sleeps on `finished` until it reaches `count`.
struct WorkgroupPool::Job {
    Job(uint64_t n, const std::function<void(uint64_t)> &f) : count(n), body(&f) {}

    void work() {
        for (uint64_t i = next.fetch_add(1, std::memory_order_relaxed); i < count;
             i = next.fetch_add(1, std::memory_order_relaxed)) {
            (*body)(i);
            if (done.fetch_add(1, std::memory_order_acq_rel) + 1 == count) {
                std::lock_guard lock(mutex); // no lost wake-up between the caller's check and wait
                finished.notify_all();
            }
        }
    }

    void waitFinished() {
        std::unique_lock lock(mutex);
        finished.wait(lock, [&] { return done.load(std::memory_order_acquire) == count; });
    }

    const uint64_t count;
    const std::function<void(uint64_t)> *body; ///< valid until waitFinished() returned
    std::atomic<uint64_t> next{0};
    std::atomic<uint64_t> done{0};
    std::mutex mutex;
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
    auto job = std::make_shared<Job>(count, body);
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
