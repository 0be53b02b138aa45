// ParallelCopy: memcpy spread over a few threads, for the pinned staging pipeline.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace backplane::detail {

/// How a staging copy runs: how many threads share it (the caller included) and whether large
/// parts use non-temporal stores.
struct CopyPlan {
    unsigned threads = 1;
    bool streaming = false;
};

/// One thread copying pageable memory reaches ~10 GB/s; pinned transfers run at 50+ GB/s, so the
/// staging copies are split across a small pool to keep up with the device. Thread-safe: copies
/// from several threads queue up. The pool is process-wide (see shared()).
class ParallelCopy {
public:
    explicit ParallelCopy(unsigned threads);
    ~ParallelCopy();
    ParallelCopy(const ParallelCopy &) = delete;
    ParallelCopy &operator=(const ParallelCopy &) = delete;

    /// Copies `size` bytes with up to `plan.threads` threads, the caller included (the pool
    /// grows to that many on first use, at most kMaxThreads); returns when done. Copies below
    /// 1 MiB run on the calling thread alone; parts are at least 256 KiB.
    void copy(void *dst, const void *src, size_t size, const CopyPlan &plan);

    /// The process-wide pool. Leaked on purpose: staging may still run while static destructors do.
    static ParallelCopy &shared();
    /// 3/4 of the hardware threads, 1 to 16: the default thread count of a staging copy.
    static unsigned defaultThreads() noexcept;
    /// The most threads a copy may use (the caller included).
    static constexpr unsigned kMaxThreads = 64;

    /// One copy on the calling thread: memcpy, or (with `streaming`, when the copy is large
    /// enough and the CPU has them) non-temporal stores fenced before returning.
    static void copyPart(void *dst, const void *src, size_t size, bool streaming) noexcept;

private:
    struct Job {
        std::byte *dst;
        const std::byte *src;
        size_t size;
        bool streaming;
        size_t *remaining;
    };
    void work();
    /// Starts workers until there are `workers` (under mutex_).
    void growLocked(unsigned workers);

    std::mutex mutex_;
    std::condition_variable wake_;
    std::condition_variable done_;
    std::vector<Job> jobs_;
    /// jobs_.size(), readable without the lock: workers spin on it briefly before sleeping,
    /// because in a pipeline the next chunk's parts usually arrive within microseconds.
    std::atomic<size_t> queued_{0};
    bool stopping_ = false;
    std::vector<std::thread> threads_;
};

} // namespace backplane::detail
