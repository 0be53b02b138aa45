// MemoryManager: the pools of one stream slot (sliced ladder, exclusive, persistent).
#pragma once

#include "memory/slice.hpp"
#include "server/driver.hpp"

#include <backplane/client.hpp>
#include <backplane/config.hpp>

#include <cstdint>
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
};

/// The ladder: pages of memory/4, then /4 per step down to 32 MiB (one smaller page when the
/// device is tiny), capped by config.maxPageBytes and the device's max_allocation_bytes; each
/// pool serves requests up to page/8. Larger requests use exclusive pages.
PoolLayout computePoolLayout(const DeviceInfo &info, const Config &config);

/// Counters shared by the managers of one server (guarded by the server lock).
struct MemoryCounters {
    uint64_t pageAllocations = 0;
    uint64_t pageReleases = 0;
};

/// The pools of one stream slot. Not thread-safe: the server calls it under its lock. Slices it
/// hands out return through the FreeQueue and are applied with release().
class MemoryManager {
public:
    MemoryManager(std::shared_ptr<Driver> driver, const PoolLayout &layout, uint32_t slot,
                  std::shared_ptr<FreeQueue> queue, MemoryCounters &counters);
    ~MemoryManager();
    MemoryManager(const MemoryManager &) = delete;
    MemoryManager &operator=(const MemoryManager &) = delete;

    /// A slice of at least `size` bytes. Throws Error(OutOfMemory) when the plugin refuses a new
    /// page (the server then cleans up and retries once).
    std::shared_ptr<Slice> reserve(uint64_t size, AllocationMode mode);
    /// Takes a slice back (its page stays cached).
    void release(const FreeRecord &record);
    /// Releases idle pages: all of them when `everything`, else those seen idle at enough
    /// periodic checks. Persistent pages are only released when `everything`.
    void cleanup(bool everything);
    /// Appends this slot's pools that hold pages.
    void appendUsage(MemoryUsage &usage) const;

private:
    enum class PoolKind { Sliced, Exclusive, Persistent };
    struct Page {
        MemoryPage memory;
        std::map<uint64_t, uint64_t> freeRanges; ///< offset -> size, coalesced
        uint32_t live = 0;
        uint32_t idleChecks = 0;
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
                                 uint64_t reserved, uint64_t size);
    Page &newPage(Pool &pool, uint64_t bytes);
    void periodicCheck();

    std::shared_ptr<Driver> driver_;
    PoolLayout layout_;
    uint32_t slot_;
    std::shared_ptr<FreeQueue> queue_;
    MemoryCounters &counters_;
    std::vector<Pool> pools_; ///< sliced ladder..., exclusive, persistent
    uint32_t exclusiveIndex_ = 0;
    uint32_t persistentIndex_ = 0;
    uint64_t reservesSinceCheck_ = 0;
};

} // namespace backplane::detail
