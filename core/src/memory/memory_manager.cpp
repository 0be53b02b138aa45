// Pools of one stream slot: first-fit sliced pages, exclusive pages, persistent pages.
#include "memory/memory_manager.hpp"

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
    return layout;
}

MemoryManager::MemoryManager(std::shared_ptr<Driver> driver, const PoolLayout &layout,
                             uint32_t slot, std::shared_ptr<FreeQueue> queue,
                             MemoryCounters &counters)
    : driver_(std::move(driver)), layout_(layout), slot_(slot), queue_(std::move(queue)),
      counters_(counters) {
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

MemoryManager::~MemoryManager() = default;

MemoryManager::Page &MemoryManager::newPage(Pool &pool, uint64_t bytes) {
    auto page = std::make_unique<Page>();
    page->memory = driver_->allocate(BP_MEMORY_DEVICE, bytes);
    page->freeRanges.emplace(0, bytes);
    ++counters_.pageAllocations;
    if (log::enabled(log::Subsystem::Memory, log::Level::Debug))
        log::write(log::Subsystem::Memory, log::Level::Debug,
                   "slot " + std::to_string(slot_) + ": new page of " + mib(bytes) + " for " +
                       pool.name);
    pool.pages.push_back(std::move(page));
    return *pool.pages.back();
}

std::shared_ptr<Slice> MemoryManager::carve(uint32_t poolIndex, Page &page, uint64_t offset,
                                            uint64_t reserved, uint64_t size) {
    auto it = page.freeRanges.find(offset);
    const uint64_t rangeSize = it->second;
    page.freeRanges.erase(it);
    if (rangeSize > reserved) page.freeRanges.emplace(offset + reserved, rangeSize - reserved);
    ++page.live;
    page.idleChecks = 0;
    Pool &pool = pools_[poolIndex];
    pool.bytesInUse += size;
    pool.bytesPadding += reserved - size;
    ++pool.allocations;

    auto slice = std::make_shared<Slice>();
    slice->memory = page.memory.memory.get();
    slice->offset = offset;
    slice->size = size;
    slice->record = {slot_, poolIndex, &page, offset, reserved, size};
    slice->queue = queue_;
    slice->lastSlot = slot_;
    slice->lastCursor = 0;
    return slice;
}

std::shared_ptr<Slice> MemoryManager::reserve(uint64_t size, AllocationMode mode) {
    if (size == 0) size = 1;
    if (++reservesSinceCheck_ >= layout_.deallocPeriod) periodicCheck();
    const uint64_t reserved = alignUp(size, layout_.alignment);

    if (mode == AllocationMode::Persistent) {
        Pool &pool = pools_[persistentIndex_];
        for (auto &page : pool.pages)
            if (page->live == 0 && page->memory.size == reserved)
                return carve(persistentIndex_, *page, 0, reserved, size);
        Page &page = newPage(pool, reserved);
        return carve(persistentIndex_, page, 0, reserved, size);
    }

    for (uint32_t i = 0; i < exclusiveIndex_; ++i) {
        Pool &pool = pools_[i];
        if (reserved > pool.maxSlice) continue;
        for (auto &page : pool.pages)
            for (const auto &[offset, bytes] : page->freeRanges)
                if (bytes >= reserved) return carve(i, *page, offset, reserved, size);
        Page &page = newPage(pool, pool.pageBytes);
        return carve(i, page, 0, reserved, size);
    }

    // Exclusive: one allocation per page; reuse an idle page that is not much larger.
    Pool &pool = pools_[exclusiveIndex_];
    if (reserved > layout_.maxAllocationBytes)
        throw Error(ErrorCode::OutOfMemory,
                    "cannot allocate " + std::to_string(size) + " bytes on " +
                        driver_->info().id() + ": larger than the device's largest allocation (" +
                        std::to_string(layout_.maxAllocationBytes) + " bytes); split the buffer",
                    driver_->info().backend);
    Page *best = nullptr;
    for (auto &page : pool.pages)
        if (page->live == 0 && page->memory.size >= reserved && page->memory.size <= 2 * reserved &&
            (best == nullptr || page->memory.size < best->memory.size))
            best = page.get();
    if (best == nullptr)
        best = &newPage(pool, std::min(alignUp(reserved, layout_.exclusiveRounding),
                                       std::max(reserved, layout_.maxAllocationBytes)));
    return carve(exclusiveIndex_, *best, 0, reserved, size);
}

void MemoryManager::release(const FreeRecord &record) {
    Pool &pool = pools_[record.pool];
    auto *page = static_cast<Page *>(record.page);
    pool.bytesInUse -= record.requested;
    pool.bytesPadding -= record.reserved - record.requested;
    --pool.allocations;
    --page->live;
    if (pool.kind != PoolKind::Sliced) {
        page->freeRanges.clear();
        page->freeRanges.emplace(0, page->memory.size);
        return;
    }
    uint64_t offset = record.offset;
    uint64_t bytes = record.reserved;
    auto next = page->freeRanges.lower_bound(offset);
    if (next != page->freeRanges.end() && offset + bytes == next->first) {
        bytes += next->second;
        next = page->freeRanges.erase(next);
    }
    if (next != page->freeRanges.begin()) {
        auto prev = std::prev(next);
        if (prev->first + prev->second == offset) {
            prev->second += bytes;
            return;
        }
    }
    page->freeRanges.emplace(offset, bytes);
}

void MemoryManager::periodicCheck() {
    reservesSinceCheck_ = 0;
    for (Pool &pool : pools_) {
        if (pool.kind == PoolKind::Persistent) continue;
        auto &pages = pool.pages;
        for (auto &page : pages) page->idleChecks = page->live == 0 ? page->idleChecks + 1 : 0;
        const auto removed = std::remove_if(pages.begin(), pages.end(), [&](const auto &page) {
            return page->live == 0 && page->idleChecks > layout_.idleChecksBeforeRelease;
        });
        counters_.pageReleases += static_cast<uint64_t>(pages.end() - removed);
        pages.erase(removed, pages.end());
    }
}

void MemoryManager::cleanup(bool everything) {
    if (!everything) {
        periodicCheck();
        return;
    }
    for (Pool &pool : pools_) {
        auto &pages = pool.pages;
        const auto removed = std::remove_if(pages.begin(), pages.end(),
                                            [](const auto &page) { return page->live == 0; });
        counters_.pageReleases += static_cast<uint64_t>(pages.end() - removed);
        pages.erase(removed, pages.end());
    }
}

void MemoryManager::appendUsage(MemoryUsage &usage) const {
    for (const Pool &pool : pools_) {
        if (pool.pages.empty()) continue;
        PoolUsage p;
        p.name = pool.name;
        p.streamSlot = slot_;
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
