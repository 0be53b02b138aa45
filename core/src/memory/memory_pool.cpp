// Pools of one device: first-fit sliced pages, exclusive pages, persistent pages, with hazards.
#include "memory/memory_pool.hpp"

#include <backplane/log.hpp>

#include <algorithm>

namespace backplane::detail {
namespace {

constexpr uint64_t kMiB = 1ull << 20;
constexpr uint64_t kMinLadderPage = 32 * kMiB;

uint64_t alignUp(uint64_t value, uint64_t alignment) {
    return (value + alignment - 1) / alignment * alignment;
}

uint64_t floorPow2(uint64_t v) {
    uint64_t p = 1;
    while (p * 2 <= v) p *= 2;
    return p;
}

std::string mib(uint64_t bytes) {
    if (bytes >= kMiB && bytes % kMiB == 0) return std::to_string(bytes / kMiB) + " MiB";
    return std::to_string(bytes / 1024) + " KiB";
}

} // namespace

PoolLayout computePoolLayout(const DeviceInfo &info, const Config &config) {
    PoolLayout layout;
    layout.alignment = std::max<uint64_t>(info.bindingAlignment, 256);
    const uint64_t memory = info.memoryBytes != 0 ? info.memoryBytes : 1ull << 30;
    uint64_t cap = info.maxAllocationBytes != 0 ? info.maxAllocationBytes : memory;
    if (config.maxPageBytes != 0) cap = std::min(cap, config.maxPageBytes);
    layout.maxAllocationBytes = info.maxAllocationBytes != 0 ? info.maxAllocationBytes : memory;

    uint64_t top = std::min(floorPow2(std::max<uint64_t>(memory / 4, kMiB)), floorPow2(cap));
    std::vector<uint64_t> pages;
    if (top <= kMinLadderPage) {
        pages.push_back(std::max<uint64_t>(top, kMiB));
    } else {
        for (uint64_t p = top; p >= kMinLadderPage; p /= 4) pages.push_back(p);
    }
    std::sort(pages.begin(), pages.end());
    for (uint64_t p : pages) {
        layout.slicedPageBytes.push_back(p);
        layout.slicedMaxSlice.push_back(std::max(p / 8, layout.alignment));
    }
    layout.releaseIdleAfter = std::chrono::milliseconds(config.releaseIdleAfterMs);
    return layout;
}

MemoryPool::MemoryPool(std::shared_ptr<Driver> driver, const PoolLayout &layout,
                       std::shared_ptr<FreeQueue> queue, const CompletionTracker &tracker)
    : driver_(std::move(driver)), layout_(layout), queue_(std::move(queue)), tracker_(tracker) {
    for (size_t i = 0; i < layout_.slicedPageBytes.size(); ++i) {
        Pool pool;
        pool.name = "sliced " + mib(layout_.slicedPageBytes[i]);
        pool.kind = PoolKind::Sliced;
        pool.pageBytes = layout_.slicedPageBytes[i];
        pool.maxSlice = layout_.slicedMaxSlice[i];
        pools_.push_back(std::move(pool));
    }
    Pool exclusive;
    exclusive.name = "exclusive";
    exclusive.kind = PoolKind::Exclusive;
    exclusive.maxSlice = layout_.maxAllocationBytes;
    exclusiveIndex_ = static_cast<uint32_t>(pools_.size());
    pools_.push_back(std::move(exclusive));
    Pool persistent;
    persistent.name = "persistent";
    persistent.kind = PoolKind::Persistent;
    persistent.maxSlice = layout_.maxAllocationBytes;
    persistentIndex_ = static_cast<uint32_t>(pools_.size());
    pools_.push_back(std::move(persistent));
}

MemoryPool::~MemoryPool() = default;

MemoryPool::Page &MemoryPool::newPage(Pool &pool, uint64_t bytes) {
    auto page = std::make_unique<Page>();
    const TraceSpan span;
    page->memory = driver_->allocate(BP_MEMORY_DEVICE, bytes);
    if (span)
        traceComplete(tracePid_, kTraceMemoryLane, "memory", "new page (" + pool.name + ")",
                      span.start, {{"bytes", bytes}});
    page->freeRanges.emplace(0, FreeRange{bytes, {}});
    ++pageAllocations_;
    if (log::enabled(log::Subsystem::Memory, log::Level::Debug))
        log::write(log::Subsystem::Memory, log::Level::Debug,
                   "new page of " + mib(bytes) + " for " + pool.name);
    pool.pages.push_back(std::move(page));
    return *pool.pages.back();
}

bool MemoryPool::cleanFor(const FreeRange &range, uint32_t slot) const {
    for (const StreamUse &u : range.hazards.uses())
        if (u.slot != slot && !tracker_.isComplete(u)) return false;
    return true;
}

std::shared_ptr<Slice> MemoryPool::carve(uint32_t poolIndex, Page &page, uint64_t offset,
                                         uint64_t reserved, uint64_t size, uint32_t slot) {
    auto it = page.freeRanges.find(offset);
    FreeRange range = std::move(it->second);
    page.freeRanges.erase(it);
    range.hazards.prune(tracker_);
    if (range.size > reserved)
        page.freeRanges.emplace(offset + reserved, FreeRange{range.size - reserved, range.hazards});
    ++page.live;
    page.idleChecks = 0;
    page.idleSeen = false;
    Pool &pool = pools_[poolIndex];
    pool.bytesInUse += size;
    pool.bytesPadding += reserved - size;
    ++pool.allocations;

    auto *slice = new Slice;
    slice->memory = page.memory.memory.get();
    slice->offset = offset;
    slice->size = size;
    slice->record = {poolIndex, &page, offset, reserved, size, {}, pool.kind == PoolKind::Sliced};
    slice->queue = queue_;
    slice->homeSlot = slot;
    slice->uses = std::move(range.hazards); // the new buffer is ordered after the old uses
    // The recycler may keep it in the SliceCache when it dies (a failed control-block
    // allocation calls it too: the slice then goes back like any freed one).
    return std::shared_ptr<Slice>(slice, SliceRecycler{});
}

std::shared_ptr<Slice> MemoryPool::reserve(uint64_t size, AllocationMode mode, uint32_t slot,
                                           bool mayGrow) {
    if (size == 0) size = 1;
    // The server refuses sizes over the device's largest allocation first; this keeps the
    // rounding below from wrapping whoever calls.
    if (size > layout_.maxAllocationBytes || size > UINT64_MAX - layout_.alignment)
        throw Error(ErrorCode::OutOfMemory,
                    "cannot allocate " + std::to_string(size) + " bytes on " +
                        driver_->info().id() + ": larger than the device's largest allocation (" +
                        std::to_string(layout_.maxAllocationBytes) + " bytes); split the buffer",
                    driver_->info().backend);
    ++reservesSinceCheck_;
    const uint64_t reserved = alignUp(size, layout_.alignment);

    if (mode == AllocationMode::Persistent) {
        Pool &pool = pools_[persistentIndex_];
        for (auto &page : pool.pages)
            if (page->live == 0 && page->memory.size == reserved)
                return carve(persistentIndex_, *page, 0, reserved, size, slot);
        if (!mayGrow) return nullptr;
        Page &page = newPage(pool, reserved);
        return carve(persistentIndex_, page, 0, reserved, size, slot);
    }

    for (uint32_t i = 0; i < exclusiveIndex_; ++i) {
        Pool &pool = pools_[i];
        if (reserved > pool.maxSlice) continue;
        // First fit, preferring a range no other stream still uses (no cross-stream wait).
        Page *firstPage = nullptr;
        uint64_t firstOffset = 0;
        for (auto &page : pool.pages)
            for (const auto &[offset, range] : page->freeRanges) {
                if (range.size < reserved) continue;
                if (cleanFor(range, slot)) return carve(i, *page, offset, reserved, size, slot);
                if (firstPage == nullptr) {
                    firstPage = page.get();
                    firstOffset = offset;
                }
            }
        if (firstPage != nullptr) return carve(i, *firstPage, firstOffset, reserved, size, slot);
        // Ranges kept apart while their uses were pending may have completed since: merge them
        // and look again before asking the plugin for a new page.
        bool merged = false;
        for (auto &page : pool.pages) merged = coalesce(*page) || merged;
        if (merged)
            for (auto &page : pool.pages)
                for (const auto &[offset, range] : page->freeRanges)
                    if (range.size >= reserved) return carve(i, *page, offset, reserved, size, slot);
        if (!mayGrow) return nullptr;
        Page &page = newPage(pool, pool.pageBytes);
        return carve(i, page, 0, reserved, size, slot);
    }

    // Exclusive: one allocation per page; reuse an idle page that is not much larger.
    Pool &pool = pools_[exclusiveIndex_];
    if (reserved > layout_.maxAllocationBytes)
        throw Error(ErrorCode::OutOfMemory,
                    "cannot allocate " + std::to_string(size) + " bytes on " +
                        driver_->info().id() + ": larger than the device's largest allocation (" +
                        std::to_string(layout_.maxAllocationBytes) + " bytes); split the buffer",
                    driver_->info().backend);
    // The smallest idle page that fits, preferring one no other stream still uses.
    Page *best = nullptr;
    bool bestClean = false;
    for (auto &page : pool.pages) {
        if (page->live != 0 || page->memory.size < reserved || page->memory.size > 2 * reserved)
            continue;
        const bool clean = cleanFor(page->freeRanges.begin()->second, slot);
        if (best == nullptr || (clean && !bestClean) ||
            (clean == bestClean && page->memory.size < best->memory.size)) {
            best = page.get();
            bestClean = clean;
        }
    }
    const uint64_t pageBytes = std::min(alignUp(reserved, layout_.exclusiveRounding),
                                        std::max(reserved, layout_.maxAllocationBytes));
    if (best == nullptr) {
        if (!mayGrow) return nullptr;
        best = &newPage(pool, pageBytes);
    } else if (!bestClean) {
        // The only idle page that fits is still used by another stream: a new page avoids
        // waiting for that work, when the device has the memory.
        if (!mayGrow) return nullptr;
        try {
            best = &newPage(pool, pageBytes);
        } catch (const Error &e) {
            if (e.code() != ErrorCode::OutOfMemory) throw;
        }
    }
    return carve(exclusiveIndex_, *best, 0, reserved, size, slot);
}

void MemoryPool::release(FreeRecord &&record) {
    Pool &pool = pools_[record.pool];
    auto *page = static_cast<Page *>(record.page);
    pool.bytesInUse -= record.requested;
    pool.bytesPadding -= record.reserved - record.requested;
    --pool.allocations;
    --page->live;
    record.hazards.prune(tracker_);
    if (pool.kind != PoolKind::Sliced) {
        // One allocation per page: the page becomes one range with every hazard it had.
        FreeRange whole{page->memory.size, std::move(record.hazards)};
        for (const auto &[offset, range] : page->freeRanges) whole.hazards.merge(range.hazards);
        page->freeRanges.clear();
        page->freeRanges.emplace(0, std::move(whole));
        return;
    }
    // Neighbours merge only when they carry the same pending uses: a range still used by one
    // stream must not taint clean memory next to it (a new buffer placed there would wait for
    // unrelated work). coalesce() merges them later, once their uses completed.
    FreeRange freed{record.reserved, std::move(record.hazards)};
    uint64_t offset = record.offset;
    auto next = page->freeRanges.lower_bound(offset);
    if (next != page->freeRanges.end() && offset + freed.size == next->first &&
        sameUses(next->second.hazards, freed.hazards)) {
        freed.size += next->second.size;
        next = page->freeRanges.erase(next);
    }
    if (next != page->freeRanges.begin()) {
        auto prev = std::prev(next);
        if (prev->first + prev->second.size == offset &&
            sameUses(prev->second.hazards, freed.hazards)) {
            prev->second.size += freed.size;
            return;
        }
    }
    page->freeRanges.emplace(offset, std::move(freed));
}

bool MemoryPool::sameUses(Hazards &a, Hazards &b) const {
    a.prune(tracker_);
    b.prune(tracker_);
    if (a.uses().size() != b.uses().size()) return false;
    for (const StreamUse &u : a.uses()) {
        bool found = false;
        for (const StreamUse &v : b.uses())
            if (u.slot == v.slot && u.cursor == v.cursor) found = true;
        if (!found) return false;
    }
    return true;
}

bool MemoryPool::coalesce(Page &page) {
    bool merged = false;
    auto &ranges = page.freeRanges;
    for (auto it = ranges.begin(); it != ranges.end();) {
        auto next = std::next(it);
        if (next != ranges.end() && it->first + it->second.size == next->first &&
            sameUses(it->second.hazards, next->second.hazards)) {
            it->second.size += next->second.size;
            ranges.erase(next);
            merged = true;
        } else {
            it = next;
        }
    }
    return merged;
}

void MemoryPool::countCachedReserves(uint32_t count) {
    reservesSinceCheck_ += count;
    callsSinceClock_ += count;
}

void MemoryPool::adjustInUse(uint32_t poolIndex, int64_t delta) {
    if (delta == 0 || poolIndex >= pools_.size()) return;
    Pool &pool = pools_[poolIndex];
    pool.bytesInUse += static_cast<uint64_t>(delta);
    pool.bytesPadding -= static_cast<uint64_t>(delta);
}

bool MemoryPool::releaseDue() {
    if (reservesSinceCheck_ >= layout_.deallocPeriod || layout_.releaseIdleAfter.count() == 0)
        return true;
    if (++callsSinceClock_ < 64) return false;
    callsSinceClock_ = 0;
    return Clock::now() - lastCheck_ >= layout_.releaseIdleAfter / 2;
}

void MemoryPool::releaseIdle(bool everything, Clock::time_point now,
                             std::vector<MemoryPage> &freed, const SettledFn &settled) {
    if (!everything) {
        reservesSinceCheck_ = 0;
        lastCheck_ = now;
    }
    for (Pool &pool : pools_) {
        if (pool.kind == PoolKind::Persistent && !everything) continue;
        auto &pages = pool.pages;
        // stable_partition keeps every element (remove_if would destroy the released pages in
        // place, under the caller's lock) and applies the predicate exactly once per page.
        const auto released = std::stable_partition(pages.begin(), pages.end(), [&](const auto &page) {
            return !releasable(*page, everything, now, settled);
        });
        pageReleases_ += static_cast<uint64_t>(pages.end() - released);
        if (tracing() && released != pages.end()) {
            // Taken from the pool here; the plugin frees them when the caller drops `freed`.
            uint64_t bytes = 0;
            for (auto it = released; it != pages.end(); ++it) bytes += (*it)->memory.size;
            traceComplete(tracePid_, kTraceMemoryLane, "memory", "release pages (" + pool.name + ")",
                          TraceClock::now(),
                          {{"pages", static_cast<uint64_t>(pages.end() - released)}, {"bytes", bytes}});
        }
        for (auto it = released; it != pages.end(); ++it) freed.push_back(std::move((*it)->memory));
        pages.erase(released, pages.end());
    }
}

bool MemoryPool::releasable(Page &page, bool everything, Clock::time_point now,
                            const SettledFn &settled) {
    if (page.live != 0) {
        page.idleChecks = 0;
        page.idleSeen = false;
        return false;
    }
    if (!page.idleSeen) {
        page.idleSeen = true;
        page.idleSince = now;
    }
    if (!everything) ++page.idleChecks;
    const bool due = everything || page.idleChecks > layout_.idleChecksBeforeRelease ||
                     now - page.idleSince >= layout_.releaseIdleAfter;
    if (!due) return false;
    // Every use of the page's memory must have completed before the plugin gets it back.
    Hazards uses;
    for (const auto &[offset, range] : page.freeRanges) uses.merge(range.hazards);
    uses.prune(tracker_);
    return uses.empty() || settled(uses);
}

void MemoryPool::appendUsage(MemoryUsage &usage) const {
    for (const Pool &pool : pools_) {
        if (pool.pages.empty()) continue;
        PoolUsage p;
        p.name = pool.name;
        p.pageBytes = pool.pageBytes;
        p.maxSliceBytes = pool.maxSlice;
        p.pages = static_cast<uint32_t>(pool.pages.size());
        for (const auto &page : pool.pages) p.bytesReserved += page->memory.size;
        p.bytesInUse = pool.bytesInUse;
        p.bytesPadding = pool.bytesPadding;
        p.allocations = pool.allocations;
        usage.bytesInUse += p.bytesInUse;
        usage.bytesReserved += p.bytesReserved;
        usage.bytesPadding += p.bytesPadding;
        usage.allocationCount += p.allocations;
        usage.pageCount += p.pages;
        usage.pools.push_back(std::move(p));
    }
}

} // namespace backplane::detail
