// Hazards: the stream uses of some memory that later work must be ordered after, and what the
// engine knows has completed.
#pragma once

#include <boost/container/small_vector.hpp>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <span>

namespace backplane::detail {

/// One use of memory: operation number `cursor` of stream slot `slot` (cursors count from 1).
struct StreamUse {
    uint32_t slot = 0;
    uint64_t cursor = 0;
};

/// Per stream slot, the cursor up to which all of the slot's work is known to have completed
/// (a host wait on an event flushed at that cursor returned). Monotonic. Thread-safe: written by
/// waiting threads and the GC thread, read under the engine lock.
class CompletionTracker {
public:
    explicit CompletionTracker(uint32_t slots)
        : slots_(slots == 0 ? 1 : slots), completed_(new std::atomic<uint64_t>[slots_]) {
        for (uint32_t i = 0; i < slots_; ++i) completed_[i].store(0, std::memory_order_relaxed);
    }
    /// Records that `slot`'s work up to `cursor` completed.
    void complete(uint32_t slot, uint64_t cursor) noexcept {
        std::atomic<uint64_t> &value = completed_[slot % slots_];
        uint64_t seen = value.load(std::memory_order_relaxed);
        while (seen < cursor &&
               !value.compare_exchange_weak(seen, cursor, std::memory_order_release,
                                            std::memory_order_relaxed)) {
        }
    }
    uint64_t completed(uint32_t slot) const noexcept {
        return completed_[slot % slots_].load(std::memory_order_acquire);
    }
    bool isComplete(const StreamUse &use) const noexcept {
        return completed(use.slot) >= use.cursor;
    }

private:
    uint32_t slots_;
    std::unique_ptr<std::atomic<uint64_t>[]> completed_;
};

/// The uses later work on some memory must wait for: at most one per slot (the newest). A live
/// buffer's uses form a chain (each use is ordered after the previous one), so after a use the
/// set collapses to that use; a freed range merges the sets of what was freed into it, and a new
/// allocation carved from it inherits the set. Not thread-safe: guarded by the engine lock.
class Hazards {
public:
    Hazards() = default;
    explicit Hazards(StreamUse use) { uses_.push_back(use); }

    std::span<const StreamUse> uses() const noexcept { return {uses_.data(), uses_.size()}; }
    bool empty() const noexcept { return uses_.empty(); }

    /// Adds `use`, keeping the newest cursor per slot.
    void add(StreamUse use) {
        for (StreamUse &u : uses_)
            if (u.slot == use.slot) {
                if (use.cursor > u.cursor) u.cursor = use.cursor;
                return;
            }
        uses_.push_back(use);
    }
    void merge(const Hazards &other) {
        for (const StreamUse &u : other.uses_) add(u);
    }
    /// After an operation ordered after every use in the set: it is the only hazard left.
    void reset(StreamUse use) {
        uses_.clear();
        uses_.push_back(use);
    }
    /// Drops the uses known to have completed.
    void prune(const CompletionTracker &tracker) {
        uses_.erase(std::remove_if(uses_.begin(), uses_.end(),
                                   [&](const StreamUse &u) { return tracker.isComplete(u); }),
                    uses_.end());
    }
    bool allComplete(const CompletionTracker &tracker) const {
        for (const StreamUse &u : uses_)
            if (!tracker.isComplete(u)) return false;
        return true;
    }

private:
    boost::container::small_vector<StreamUse, 2> uses_;
};

} // namespace backplane::detail
