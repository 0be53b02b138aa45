// MemoryPool: the pools of one device (sliced ladder, exclusive, persistent), shared by its streams.
#pragma once

#include "memory/slice.hpp"
#include "device/driver.hpp"
#include "trace/trace_recorder.hpp"

#include <backplane/client.hpp>
#include <backplane/config.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace backplane::detail {

/// Sizes of the pools, derived once per device (docs/memory.md explains them).
struct PoolLayout {
    uint64_t alignment = 256;              ///< max(binding_alignment, 256)
    std::vector<uint64_t> slicedPageBytes; ///< ascending page sizes of the sliced ladder
    std::vector<uint64_t> slicedMaxSlice;  ///< largest request each sliced pool serves
    uint64_t maxAllocationBytes = 0;       ///< device limit for one page
    uint64_t exclusiveRounding = 1 << 20;  ///< exclusive pages are rounded to this
    uint32_t deallocPeriod = 1000;         ///< reserves between checks for idle pages
    uint32_t idleChecksBeforeRelease = 2;  ///< checks a page must be seen idle at
    std::chrono::milliseconds releaseIdleAfter{1000}; ///< or idle at least this long
};

/// The ladder: pages of memory/4, then /4 per step down to 32 MiB (one smaller page when the
/// device is tiny), capped by config.maxPageBytes and the device's max_allocation_bytes; each
/// pool serves requests up to page/8. Larger requests use exclusive pages.
PoolLayout computePoolLayout(const DeviceInfo &info, const Config &config);

/// The pools of one device. One set of pools serves every stream slot, so the footprint does not
/// grow with the number of streams; safety comes from hazards instead of per-stream pools: a freed
/// range keeps the uses of what was freed into it, a slice carved from it inherits them (the
/// engine orders the slice's first use after them, on whichever stream), and a page goes back to
/// the plugin only when every use of it completed. Not thread-safe: the server calls it under its
/// engine lock. Slices it hands out return through the FreeQueue and are applied with release();
/// those of sliced pools may wait in the FreeQueue's SliceCache first, still counted as allocated
/// here (their pages stay), until the server flushes the cache.
class MemoryPool {
public:
    using Clock = std::chrono::steady_clock;
    /// Answers whether every use in a set completed (it may start a fence so a later call can).
    using SettledFn = std::function<bool(const Hazards &)>;

    MemoryPool(std::shared_ptr<Driver> driver, const PoolLayout &layout,
               std::shared_ptr<FreeQueue> queue, const CompletionTracker &tracker);
    ~MemoryPool();
    MemoryPool(const MemoryPool &) = delete;
    MemoryPool &operator=(const MemoryPool &) = delete;
    /// The device (process id) its page allocations and releases are traced under.
    void setTracePid(uint32_t pid) noexcept { tracePid_ = pid; }

    /// A slice of at least `size` bytes for stream slot `slot`, with the hazards of the memory it
    /// reuses. Prefers memory with no pending use on another slot. Null when it would need a new
    /// page and `mayGrow` is false (the server then flushes the slice caches and asks again).
    /// Throws Error(OutOfMemory) when the plugin refuses a new page (the server then cleans up
    /// and retries once). Sliced-pool slices it hands out die through SliceRecycler.
    std::shared_ptr<Slice> reserve(uint64_t size, AllocationMode mode, uint32_t slot,
                                   bool mayGrow = true);
    /// Takes a slice back (its page stays cached).
    void release(FreeRecord &&record);
    /// True when the periodic release of idle pages is due: every deallocPeriod reserves, and
    /// at least twice per releaseIdleAfter (the clock is read on every 64th call only: it costs
    /// more than the rest of an allocation).
    bool releaseDue();
    /// Counts `count` allocations served by a SliceCache towards releaseDue() (reservations and
    /// calls; the next releaseDue() reads the clock).
    void countCachedReserves(uint32_t count);
    /// Slices handed out again by a SliceCache for another requested size: `delta` requested
    /// bytes more in use in pool `poolIndex` (and as many fewer bytes of padding).
    void adjustInUse(uint32_t poolIndex, int64_t delta);
    /// Returns idle pages (no live slice) whose uses all completed per `settled`: all of them when
    /// `everything` (persistent pages included), else those seen idle at more than
    /// idleChecksBeforeRelease checks or idle for releaseIdleAfter. The pages move to `freed`:
    /// the caller drops them (the plugin's free) after releasing its lock.
    void releaseIdle(bool everything, Clock::time_point now, std::vector<MemoryPage> &freed,
                     const SettledFn &settled);
    /// Appends the pools that hold pages.
    void appendUsage(MemoryUsage &usage) const;

    uint64_t pageAllocations() const noexcept { return pageAllocations_; }
    uint64_t pageReleases() const noexcept { return pageReleases_; }

private:
    enum class PoolKind { Sliced, Exclusive, Persistent };
    struct FreeRange {
        uint64_t size = 0;
        Hazards hazards; ///< uses of the memory freed into this range, not known complete
    };
    struct Page {
        MemoryPage memory;
        std::map<uint64_t, FreeRange> freeRanges; ///< offset -> range, coalesced
        uint32_t live = 0;
        uint32_t idleChecks = 0;
        bool idleSeen = false;       ///< a check saw it idle (frees do not read the clock)
        Clock::time_point idleSince; ///< when a check first saw it idle
    };
    struct Pool {
        std::string name;
        PoolKind kind = PoolKind::Sliced;
        uint64_t pageBytes = 0;
        uint64_t maxSlice = 0;
        std::vector<std::unique_ptr<Page>> pages;
        uint64_t bytesInUse = 0;
        uint64_t bytesPadding = 0;
        uint64_t allocations = 0;
    };

    std::shared_ptr<Slice> carve(uint32_t poolIndex, Page &page, uint64_t offset,
                                 uint64_t reserved, uint64_t size, uint32_t slot);
    Page &newPage(Pool &pool, uint64_t bytes);
    /// Whether an idle page may go back now (counts the check; see releaseIdle).
    bool releasable(Page &page, bool everything, Clock::time_point now, const SettledFn &settled);
    /// True when the range has no pending use on a slot other than `slot`.
    bool cleanFor(const FreeRange &range, uint32_t slot) const;
    /// True when both sets hold the same uses once completed ones are dropped (prunes both).
    bool sameUses(Hazards &a, Hazards &b) const;
    /// Merges neighbouring free ranges whose pending uses are the same; true if any merged.
    bool coalesce(Page &page);

    std::shared_ptr<Driver> driver_;
    PoolLayout layout_;
    std::shared_ptr<FreeQueue> queue_;
    const CompletionTracker &tracker_;
    std::vector<Pool> pools_; ///< sliced ladder..., exclusive, persistent
    uint32_t exclusiveIndex_ = 0;
    uint32_t persistentIndex_ = 0;
    uint64_t reservesSinceCheck_ = 0;
    uint32_t callsSinceClock_ = 0;
    Clock::time_point lastCheck_ = Clock::now();
    uint64_t pageAllocations_ = 0;
    uint64_t pageReleases_ = 0;
    uint32_t tracePid_ = 0;
};

} // namespace backplane::detail
