// ParallelCopy: memcpy spread over a few threads, for the pinned staging pipeline.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace backplane::detail {

/// One thread copying pageable memory reaches ~10 GB/s; pinned transfers run at 50+ GB/s, so the
/// staging copies are split across a small pool to keep up with the device. Thread-safe: copies
/// from several threads queue up. The pool is process-wide (see shared()).
class ParallelCopy {
public:
    explicit ParallelCopy(unsigned threads);
    ~ParallelCopy();
    ParallelCopy(const ParallelCopy &) = delete;
    ParallelCopy &operator=(const ParallelCopy &) = delete;

    /// Copies `size` bytes; returns when done. Small copies run on the calling thread.
    void copy(void *dst, const void *src, size_t size);

    /// The process-wide pool: 3/4 of the hardware threads (at most 16), the caller included.
    static ParallelCopy &shared();

private:
    struct Job {
        std::byte *dst;
        const std::byte *src;
        size_t size;
        size_t *remaining;
    };
    void work();

    std::mutex mutex_;
    std::condition_variable wake_;
    std::condition_variable done_;
    std::vector<Job> jobs_;
    bool stopping_ = false;
    std::vector<std::thread> threads_;
};

} // namespace backplane::detail
