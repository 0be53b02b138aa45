// ParallelCopy: memcpy split into parts run by a small thread pool and the caller.
#include "parallel_copy.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

namespace backplane::detail {
namespace {
// Below this a single copy is faster than waking threads (a wake-up costs 10-20 us; one thread
// copies 1 MiB in 50-100 us). Transfers of 1 MiB to a few blocks go in four chunks of this size
// or more (transfers.cpp), so that they are still split.
constexpr size_t kParallelThreshold = 1u << 20;
constexpr size_t kMinPart = 256u << 10;
// Non-temporal stores pay off once the destination does not fit the cache anyway; smaller
// copies stay in the cache, where the DMA engine (or the caller) reads them next.
constexpr size_t kStreamingMin = 256u << 10;
// How long an idle worker spins for the next job before it sleeps.
constexpr auto kSpin = std::chrono::microseconds(50);

void relax() noexcept {
#if defined(__x86_64__)
    _mm_pause();
#else
    std::this_thread::yield();
#endif
}

} // namespace

void ParallelCopy::copyPart(void *dst, const void *src, size_t size, bool streaming) noexcept {
#if defined(__x86_64__)
    if (streaming && size >= kStreamingMin) {
        // A plain store first reads the destination's cache line (read for ownership) and then
        // evicts something; streaming stores write whole lines to memory directly. About 1.7x
        // the memcpy rate into a staging block on the development machine (one thread).
        auto *d = static_cast<std::byte *>(dst);
        const auto *s = static_cast<const std::byte *>(src);
        const size_t head = (64 - (reinterpret_cast<uintptr_t>(d) & 63)) & 63;
        std::memcpy(d, s, head);
        d += head;
        s += head;
        size -= head;
        const size_t lines = size / 64;
        for (size_t i = 0; i < lines; ++i, d += 64, s += 64) {
            const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i *>(s));
            const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i *>(s + 16));
            const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i *>(s + 32));
            const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i *>(s + 48));
            _mm_stream_si128(reinterpret_cast<__m128i *>(d), a);
            _mm_stream_si128(reinterpret_cast<__m128i *>(d + 16), b);
            _mm_stream_si128(reinterpret_cast<__m128i *>(d + 32), c);
            _mm_stream_si128(reinterpret_cast<__m128i *>(d + 48), e);
        }
        // Streaming stores are weakly ordered: they must be visible before the copy is reported
        // done (to another thread, or to the device through the DMA submitted next).
        _mm_sfence();
        std::memcpy(d, s, size - lines * 64);
        return;
    }
#else
    (void)streaming;
#endif
    std::memcpy(dst, src, size);
}

ParallelCopy::ParallelCopy(unsigned threads) {
    std::lock_guard lock(mutex_);
    growLocked(threads);
}

ParallelCopy::~ParallelCopy() {
    {
        std::lock_guard lock(mutex_);
        stopping_ = true;
    }
    wake_.notify_all();
    for (auto &t : threads_)
        t.join();
}

unsigned ParallelCopy::defaultThreads() noexcept {
    // hardware_concurrency() reads sysfs each time (about 2 us): once is enough.
    static const unsigned threads =
        std::clamp(std::thread::hardware_concurrency() * 3 / 4, 1u, 16u);
    return threads;
}

ParallelCopy &ParallelCopy::shared() {
    static auto *pool = new ParallelCopy(defaultThreads() - 1);
    return *pool;
}

void ParallelCopy::growLocked(unsigned workers) {
    workers = std::min(workers, kMaxThreads - 1);
    while (threads_.size() < workers)
        threads_.emplace_back([this] { work(); });
}

void ParallelCopy::copy(void *dst, const void *src, size_t size, const CopyPlan &plan) {
    const unsigned threads = std::clamp(plan.threads, 1u, kMaxThreads);
    const size_t parts = std::min<size_t>(threads, size / kMinPart);
    if (size < kParallelThreshold || parts <= 1) {
        copyPart(dst, src, size, plan.streaming);
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
        growLocked(static_cast<unsigned>(parts - 1));
        for (size_t at = first; at < size; at += part) {
            jobs_.push_back(
                {d + at, s + at, std::min(part, size - at), plan.streaming, &remaining});
            ++remaining;
        }
        queued_.store(jobs_.size(), std::memory_order_release);
    }
    wake_.notify_all();
    copyPart(d, s, first, plan.streaming);
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
        queued_.store(jobs_.size(), std::memory_order_release);
        lock.unlock();
        copyPart(job.dst, job.src, job.size, job.streaming);
        lock.lock();
        --remaining;
    }
}

void ParallelCopy::work() {
    std::unique_lock lock(mutex_);
    for (;;) {
        if (jobs_.empty() && !stopping_) {
            // Spin a little (unlocked) before sleeping: the next part usually comes soon.
            lock.unlock();
            const auto until = std::chrono::steady_clock::now() + kSpin;
            for (unsigned i = 0; queued_.load(std::memory_order_acquire) == 0; ++i) {
                relax();
                if (i % 64 == 63 && std::chrono::steady_clock::now() > until) break;
            }
            lock.lock();
            wake_.wait(lock, [this] { return stopping_ || !jobs_.empty(); });
        }
        if (stopping_) return;
        const Job job = jobs_.back();
        jobs_.pop_back();
        queued_.store(jobs_.size(), std::memory_order_release);
        lock.unlock();
        copyPart(job.dst, job.src, job.size, job.streaming);
        lock.lock();
        if (--*job.remaining == 0) done_.notify_all();
    }
}

} // namespace backplane::detail
