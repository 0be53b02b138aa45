// Poison: the byte ranges of an allocation that a failed operation was to write.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

namespace backplane::detail {

/// The failure a poisoned range carries: what failed and why, as the message of the error that
/// reading the range throws ("kernel 'saxpy' on host:0 (stream slot 0) failed at 20:31:02 UTC:
/// ..."). Shared by every range one failure marked.
using PoisonReason = std::shared_ptr<const std::string>;

/// The ranges of one allocation (a Slice) that hold no valid data because the operation that was
/// to write them failed (docs/streams.md, "What failed work leaves behind"). Ranges are bytes
/// from the allocation's start; marking and clearing happen when an operation is issued, in the
/// order the engine orders the operations themselves.
///
/// Poisoned allocations are rare: `any()` is one atomic load. The ranges are an ordered map
/// behind the allocation's own lock, taken under no other lock and under which none is taken;
/// marking, clearing and finding cost O(log n) in the ranges (a buffer cleared piece by piece
/// stays cheap).
class Poison {
public:
    Poison() = default;
    Poison(const Poison &) = delete;
    Poison &operator=(const Poison &) = delete;

    /// Whether some range is poisoned (then find() looks).
    bool any() const noexcept { return any_.load(std::memory_order_acquire); }
    /// Poisons [begin, end) with `why` (a later failure over the same bytes replaces the older).
    void mark(uint64_t begin, uint64_t end, PoisonReason why);
    /// Valid data again in [begin, end): the bytes were written.
    void clear(uint64_t begin, uint64_t end);
    /// The whole allocation is new (a reused slice's next owner).
    void reset();
    /// The reason of the first poisoned range overlapping [begin, end), with that range; null
    /// when none does.
    struct Hit {
        PoisonReason why;
        uint64_t begin = 0;
        uint64_t end = 0;
    };
    Hit find(uint64_t begin, uint64_t end) const;

private:
    struct Range {
        uint64_t end = 0;
        PoisonReason why;
    };
    /// Removes [begin, end) from ranges_ (mutex_ is held).
    void cut(uint64_t begin, uint64_t end);

    std::atomic<bool> any_{false};
    mutable std::mutex mutex_;
    std::map<uint64_t, Range> ranges_; ///< by start, disjoint; guarded by mutex_
};

} // namespace backplane::detail
