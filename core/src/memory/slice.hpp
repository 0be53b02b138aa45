// Slice: one allocation carved from a pool page; what a public Buffer owns.
#pragma once

#include <backplane/abi/plugin.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

namespace backplane::detail {

/// Everything a pool needs to take a slice back.
struct FreeRecord {
    uint32_t slot = 0;      ///< stream slot whose MemoryManager owns the page
    uint32_t pool = 0;      ///< pool index inside that manager
    void *page = nullptr;   ///< the pool's page record
    uint64_t offset = 0;
    uint64_t reserved = 0;  ///< bytes taken from the page (aligned)
    uint64_t requested = 0; ///< bytes the caller asked for
};

/// Frees arrive from any thread (the last Buffer copy may die anywhere, the GC thread drops
/// holds); they are queued here and applied by the server under its lock. This keeps the pools
/// single-threaded and makes a Buffer destructor never wait for the server.
class FreeQueue {
public:
    void push(const FreeRecord &record) {
        std::lock_guard lock(mutex_);
        records_.push_back(record);
    }
    /// Moves every queued record into `out` (appends).
    void drain(std::vector<FreeRecord> &out) {
        std::lock_guard lock(mutex_);
        out.insert(out.end(), records_.begin(), records_.end());
        records_.clear();
    }
    bool empty() {
        std::lock_guard lock(mutex_);
        return records_.empty();
    }

private:
    std::mutex mutex_;
    std::vector<FreeRecord> records_;
};

/// One live allocation. Refcounted through shared_ptr: Buffer copies, cross-stream GC holds and
/// queued scheduler tasks each hold a reference; the destructor hands the memory back.
struct Slice {
    bp_memory *memory = nullptr;
    uint64_t offset = 0;
    uint64_t size = 0;
    FreeRecord record;
    std::shared_ptr<FreeQueue> queue;

    // Stream tracking: the stream slot and cursor of the last operation that used this slice.
    // Guarded by the server's lock. A use on another slot aligns with it first.
    uint32_t lastSlot = 0;
    uint64_t lastCursor = 0;

    Slice() = default;
    Slice(const Slice &) = delete;
    Slice &operator=(const Slice &) = delete;
    ~Slice() {
        if (queue) queue->push(record);
    }
};

} // namespace backplane::detail
