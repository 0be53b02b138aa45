// ParallelCopy: memcpy split into parts run by a small thread pool and the caller.
#include "parallel_copy.hpp"

#include <algorithm>
#include <cstring>

namespace backplane::detail {
namespace {
// Below this a single memcpy is faster than waking threads.
constexpr size_t kParallelThreshold = 2u << 20;
constexpr size_t kMinPart = 512u << 10;
} // namespace

ParallelCopy::ParallelCopy(unsigned threads) {
    for (unsigned i = 0; i < threads; ++i) threads_.emplace_back([this] { work(); });
}

ParallelCopy::~ParallelCopy() {
    {
        std::lock_guard lock(mutex_);
        stopping_ = true;
    }
    wake_.notify_all();
    for (auto &t : threads_) t.join();
}

ParallelCopy &ParallelCopy::shared() {
    // Leaked on purpose: staging may still run while static destructors do.
    static auto *pool = new ParallelCopy(
        std::clamp(std::thread::hardware_concurrency() * 3 / 4, 1u, 16u) - 1);
    return *pool;
}

void ParallelCopy::copy(void *dst, const void *src, size_t size) {
    const size_t parts = std::min<size_t>(threads_.size() + 1, size / kMinPart);
    if (size < kParallelThreshold || parts <= 1) {
        std::memcpy(dst, src, size);
        return;
    }
    auto *d = static_cast<std::byte *>(dst);
    const auto *s = static_cast<const std::byte *>(src);
    // Parts are multiples of 4 KiB so that no two threads touch the same page.
    const size_t part = (size / parts + 4095) & ~size_t{4095};
    size_t remaining = 0;
    size_t first = std::min(part, size);
    {
        std::lock_guard lock(mutex_);
        for (size_t at = first; at < size; at += part) {
            jobs_.push_back({d + at, s + at, std::min(part, size - at), &remaining});
            ++remaining;
        }
    }
    wake_.notify_all();
    std::memcpy(d, s, first);
    std::unique_lock lock(mutex_);
    // Help with what the pool has not started yet, then wait for the rest.
    while (remaining > 0) {
        auto it = std::find_if(jobs_.begin(), jobs_.end(),
                               [&](const Job &j) { return j.remaining == &remaining; });
        if (it == jobs_.end()) {
            done_.wait(lock, [&] { return remaining == 0; });
            break;
        }
        const Job job = *it;
        jobs_.erase(it);
        lock.unlock();
        std::memcpy(job.dst, job.src, job.size);
        lock.lock();
        --remaining;
    }
}

void ParallelCopy::work() {
    std::unique_lock lock(mutex_);
    for (;;) {
        wake_.wait(lock, [this] { return stopping_ || !jobs_.empty(); });
        if (stopping_) return;
        const Job job = jobs_.back();
        jobs_.pop_back();
        lock.unlock();
        std::memcpy(job.dst, job.src, job.size);
        lock.lock();
        if (--*job.remaining == 0) done_.notify_all();
    }
}

} // namespace backplane::detail
