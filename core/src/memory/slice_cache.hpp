// SliceCache: per stream slot, a few recently freed slices, handed out again without the engine lock.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace backplane::detail {

struct Slice;

/// A lock held for a few loads and stores: one atomic exchange when nobody else holds it.
class SpinLock {
public:
    void lock() noexcept {
        uint32_t spins = 0;
        while (locked_.exchange(true, std::memory_order_acquire))
            while (locked_.load(std::memory_order_relaxed))
                if (++spins > 64) std::this_thread::yield(); // the holder may be descheduled
    }
    void unlock() noexcept { locked_.store(false, std::memory_order_release); }

private:
    std::atomic<bool> locked_{false};
};

/// Recently freed slices of the sliced pools, kept whole per stream slot so that the next
/// allocation of the same aligned size on that slot takes one back without the engine lock, the
/// FreeQueue or the pool's range map. A cached slice keeps everything it had: its page range and
/// its `uses` (the hazards the next owner inherits, unchanged), and the pool still counts it as
/// allocated: the server flushes every cache into the pool (deleting the slices, whose
/// destructors queue their records with their hazards) before it reports usage, releases idle
/// pages, asks the plugin for a new page, retries after out of memory, and when it closes.
///
/// Bounded: at most kEntriesPerSlot slices per slot, kEntriesPerSize of one size. Thread-safe:
/// one spin lock per slot (a Buffer may die on any thread, the GC thread included). Once close()
/// was called it keeps nothing more, so a closed client's memory is never cached; the owner's
/// flush after close() must empty it (a cached slice references the FreeQueue that holds this
/// cache).
class SliceCache {
public:
    static constexpr uint32_t kEntriesPerSlot = 8;
    static constexpr uint32_t kEntriesPerSize = 4;
    /// Every this many slices a slot handed out, take() asks for the pool's periodic check.
    static constexpr uint32_t kMaintenancePeriod = 64;

    /// `slots` stream slots; `pools`: the number of sliced pools (FreeRecord::pool below it).
    SliceCache(uint32_t slots, uint32_t pools)
        : slotCount_(slots == 0 ? 1 : slots), slots_(new Slot[slotCount_]),
          poolCount_(pools), inUseDelta_(new std::atomic<int64_t>[pools == 0 ? 1 : pools]) {
        for (uint32_t p = 0; p < (pools == 0 ? 1 : pools); ++p)
            inUseDelta_[p].store(0, std::memory_order_relaxed);
    }
    SliceCache(const SliceCache &) = delete;
    SliceCache &operator=(const SliceCache &) = delete;

    struct Taken {
        Slice *slice = nullptr;      ///< owned by the caller; null when nothing of that size
        bool maintenanceDue = false; ///< the pool's periodic check is due (see kMaintenancePeriod)
    };
    /// The slice of `reserved` bytes `slot` freed last, if any.
    Taken take(uint32_t slot, uint64_t reserved) noexcept {
        Slot &s = slotAt(slot);
        std::lock_guard lock(s.lock);
        for (uint32_t i = s.count; i-- > 0;) {
            if (s.entries[i].reserved != reserved) continue;
            Slice *slice = s.entries[i].slice;
            for (uint32_t j = i + 1; j < s.count; ++j) s.entries[j - 1] = s.entries[j];
            --s.count;
            return {slice, ++s.handedOut % kMaintenancePeriod == 0};
        }
        return {};
    }
    /// Keeps `slice` (`reserved` bytes) for `slot`. Returns what the caller must free instead:
    /// null when kept, `slice` itself when the slot has enough of that size or the cache is
    /// closed, or the slot's oldest slice when it was full.
    Slice *put(uint32_t slot, uint64_t reserved, Slice *slice) noexcept {
        Slot &s = slotAt(slot);
        std::lock_guard lock(s.lock);
        // Read under the slot's lock: a flush after close() takes the lock too, so nothing put
        // after that flush is kept.
        if (closed_.load(std::memory_order_acquire)) return slice;
        uint32_t same = 0;
        for (uint32_t i = 0; i < s.count; ++i) same += s.entries[i].reserved == reserved ? 1 : 0;
        if (same >= kEntriesPerSize) return slice;
        Slice *evicted = nullptr;
        if (s.count == kEntriesPerSlot) {
            evicted = s.entries[0].slice;
            for (uint32_t j = 1; j < s.count; ++j) s.entries[j - 1] = s.entries[j];
            --s.count;
        }
        s.entries[s.count++] = {reserved, slice};
        return evicted;
    }
    /// Moves every cached slice to `out` (the caller frees them).
    void takeAll(std::vector<Slice *> &out) {
        for (uint32_t i = 0; i < slotCount_; ++i) {
            Slot &s = slots_[i];
            std::lock_guard lock(s.lock);
            for (uint32_t j = 0; j < s.count; ++j) out.push_back(s.entries[j].slice);
            s.count = 0;
        }
    }
    /// From now on put() keeps nothing (the owner closes; it flushes the cache after this).
    void close() noexcept { closed_.store(true, std::memory_order_release); }

    /// A slice handed out again for another requested size: the pool's count of bytes in use
    /// changes by `delta` (requested bytes; padding by -delta). The server folds these into the
    /// pool before it reports usage.
    void addInUse(uint32_t pool, int64_t delta) noexcept {
        if (pool < poolCount_) inUseDelta_[pool].fetch_add(delta, std::memory_order_relaxed);
    }
    /// The change of `pool`'s bytes in use since the last call.
    int64_t takeInUse(uint32_t pool) noexcept {
        return pool < poolCount_ ? inUseDelta_[pool].exchange(0, std::memory_order_relaxed) : 0;
    }
    uint32_t pools() const noexcept { return poolCount_; }

    /// Slices handed out again since the cache was made (tests, benchmarks).
    uint64_t hits() {
        uint64_t total = 0;
        for (uint32_t i = 0; i < slotCount_; ++i) {
            std::lock_guard lock(slots_[i].lock);
            total += slots_[i].handedOut;
        }
        return total;
    }

private:
    struct Entry {
        uint64_t reserved = 0;
        Slice *slice = nullptr;
    };
    // One cache line or more per slot: threads on different slots do not share lines.
    struct alignas(64) Slot {
        SpinLock lock;
        uint32_t count = 0;
        uint64_t handedOut = 0;
        std::array<Entry, kEntriesPerSlot> entries{}; ///< oldest first
    };

    Slot &slotAt(uint32_t slot) noexcept { return slots_[slot < slotCount_ ? slot : 0]; }

    uint32_t slotCount_;
    std::unique_ptr<Slot[]> slots_;
    uint32_t poolCount_;
    std::unique_ptr<std::atomic<int64_t>[]> inUseDelta_;
    std::atomic<bool> closed_{false};
};

} // namespace backplane::detail
