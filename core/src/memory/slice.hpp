// Slice: one allocation carved from a pool page; what a public Buffer owns.
#pragma once

#include "memory/poison.hpp"
#include "memory/slice_cache.hpp"
#include "stream/hazards.hpp"

#include <backplane/abi/plugin.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace backplane::detail {

/// Everything the pool needs to take a slice back, with the uses its memory must stay ordered
/// after (they pass to whatever reuses the range).
struct FreeRecord {
    uint32_t pool = 0;      ///< pool index
    void *page = nullptr;   ///< the pool's page record
    uint64_t offset = 0;
    uint64_t reserved = 0;  ///< bytes taken from the page (aligned)
    uint64_t requested = 0; ///< bytes the caller asked for
    Hazards hazards;        ///< uses of the slice not known complete when it died
    bool cacheable = false; ///< from a sliced pool: may wait in a SliceCache for its next owner
};

/// Frees arrive from any thread (the last Buffer copy may die anywhere, the GC thread drops
/// holds); they are queued here and applied by the server under its engine lock. This keeps the
/// pools single-threaded and makes a Buffer destructor never wait for the server.
///
/// Every slice points at its server's queue, which outlives the server: it is also what tells
/// whose a Buffer is, so the queue carries its owner's description for the messages about a
/// Buffer used with another client. It also holds the server's SliceCache: slices of the sliced
/// pools go there first (SliceRecycler), and only what the cache does not keep is queued.
class FreeQueue {
public:
    FreeQueue() : cache_(1, 0) {}
    /// `slots` stream slots and `slicedPools` sliced pools size the cache.
    FreeQueue(std::string deviceId, uint64_t openNumber, uint32_t slots = 1,
              uint32_t slicedPools = 0)
        : deviceId_(std::move(deviceId)), openNumber_(openNumber), cache_(slots, slicedPools) {}
    FreeQueue(const FreeQueue &) = delete;
    FreeQueue &operator=(const FreeQueue &) = delete;

    /// The device of the server that owns the queue ("host:0").
    const std::string &deviceId() const noexcept { return deviceId_; }
    /// Which open() of the process created that server (1, 2...).
    uint64_t openNumber() const noexcept { return openNumber_; }
    /// True once that server was destroyed (its client closed).
    bool closed() const noexcept { return closed_.load(std::memory_order_acquire); }
    /// The server is closing: nothing is cached from now on (it then flushes the cache).
    void markClosed() noexcept {
        closed_.store(true, std::memory_order_release);
        cache_.close();
    }
    SliceCache &cache() noexcept { return cache_; }
    /// The server's device was lost (a sticky fault): `reason` names the failure, for the
    /// messages about its Buffers. The first call wins.
    void markLost(const std::string &reason) {
        std::lock_guard lock(mutex_);
        if (lostReason_.empty()) lostReason_ = reason;
    }
    /// Why the server's device was lost; "" while it was not.
    std::string lostReason() const {
        std::lock_guard lock(mutex_);
        return lostReason_;
    }

    void push(FreeRecord record) {
        std::lock_guard lock(mutex_);
        records_.push_back(std::move(record));
    }
    /// Moves every queued record into `out` (appends).
    void drain(std::vector<FreeRecord> &out) {
        std::lock_guard lock(mutex_);
        for (FreeRecord &r : records_) out.push_back(std::move(r));
        records_.clear();
    }
    bool empty() {
        std::lock_guard lock(mutex_);
        return records_.empty();
    }

private:
    mutable std::mutex mutex_;
    std::vector<FreeRecord> records_;
    std::string lostReason_;
    std::string deviceId_;
    uint64_t openNumber_ = 0;
    std::atomic<bool> closed_{false};
    SliceCache cache_;
};

/// One live allocation. Refcounted through shared_ptr: Buffer copies, cross-stream GC holds and
/// queued scheduler tasks each hold a reference; the destructor hands the memory back together
/// with its hazards, so memory is never reused ahead of work still using it. Slices of the pools
/// are owned through SliceRecycler, which may keep a dead slice whole in the SliceCache instead
/// (the next owner gets it with its `uses`), and deletes it otherwise.
struct Slice {
    bp_memory *memory = nullptr;
    uint64_t offset = 0;
    uint64_t size = 0;
    FreeRecord record;
    std::shared_ptr<FreeQueue> queue;

    /// The stream slot that allocated it: a use on another slot holds the slice until that use
    /// completed (the GC), so its memory usually comes back with no pending work.
    uint32_t homeSlot = 0;
    /// Uses later work must be ordered after: inherited from the reused range at allocation (or
    /// kept from the previous owner by the SliceCache), then the last use (uses of one slice form
    /// a chain). Guarded by the engine lock while the slice is referenced; a slice nobody
    /// references (dying, or in a cache) is touched only by the thread that holds it.
    Hazards uses;
    /// Ranges a failed operation was to write: reading them throws Error(Poisoned) until they
    /// are written again. Reset for a reused slice's next owner.
    Poison poison;

    Slice() = default;
    Slice(const Slice &) = delete;
    Slice &operator=(const Slice &) = delete;
    ~Slice() {
        // A zero-byte slice holds no pool memory (record.page is null): nothing to give back.
        if (!queue || record.page == nullptr) return;
        // The last reference is gone, so no other thread touches `uses` any more.
        record.hazards = std::move(uses);
        queue->push(std::move(record));
    }
};

/// Bytes an operation reads or writes: [begin, end) of a slice, counted from its start. The
/// operation holds the slice.
struct SliceRange {
    Slice *slice = nullptr;
    uint64_t begin = 0;
    uint64_t end = 0;
};

/// The deleter of pool slices (`std::shared_ptr<Slice>(slice, SliceRecycler{})`): runs when the
/// last reference is gone, on whichever thread drops it. A slice of a sliced pool goes to its
/// home slot's SliceCache whole; what the cache does not keep (full, closed, or another pool's
/// slice) is deleted, and its destructor queues the record with its hazards.
struct SliceRecycler {
    void operator()(Slice *slice) const noexcept {
        // Nothing touches the queue after the delete: the slice may hold its last reference.
        if (slice->queue && slice->record.cacheable)
            slice = slice->queue->cache().put(slice->homeSlot, slice->record.reserved, slice);
        delete slice;
    }
};

} // namespace backplane::detail
