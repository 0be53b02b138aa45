// StagingPool: the pinned host blocks of one device that pageable transfers and reads stage through.
#pragma once

#include "device/driver.hpp"
#include "stream/multi_stream.hpp"

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

namespace backplane::detail {

/// A page of pinned host memory (PinnedBuffer, staging blocks).
class PinnedBlock {
public:
    explicit PinnedBlock(MemoryPage page) : page_(std::move(page)) {}
    void *data() const noexcept { return page_.mapped; }
    size_t size() const noexcept { return static_cast<size_t>(page_.size); }
    bp_memory *memory() const noexcept { return page_.memory.get(); }

private:
    MemoryPage page_;
};

/// One staging block and the fence of its last device use: whoever takes the block next waits
/// for that fence before the host touches the memory, and the pool never frees it before then.
struct StagingBlock {
    explicit StagingBlock(MemoryPage page) : memory(std::move(page)) {}
    PinnedBlock memory;
    Fence ready;
};

/// Exclusive use of one staging block. Move-only; when it goes (transfer done, ReadFuture waited
/// or dropped), the block returns to its pool with its `ready` fence, or is freed when the pool
/// is gone (the engine synced everything before that).
class StagingLease {
public:
    StagingLease() = default;
    StagingLease(std::shared_ptr<StagingBlock> block, std::weak_ptr<struct StagingState> pool)
        : block_(std::move(block)), pool_(std::move(pool)) {}
    ~StagingLease();
    StagingLease(StagingLease &&) noexcept = default;
    StagingLease &operator=(StagingLease &&other) noexcept;
    StagingLease(const StagingLease &) = delete;
    StagingLease &operator=(const StagingLease &) = delete;

    StagingBlock &block() const noexcept { return *block_; }
    std::byte *data() const noexcept { return static_cast<std::byte *>(block_->memory.data()); }
    size_t size() const noexcept { return block_->memory.size(); }
    explicit operator bool() const noexcept { return block_ != nullptr; }

private:
    void giveBack() noexcept;
    std::shared_ptr<StagingBlock> block_;
    std::weak_ptr<struct StagingState> pool_;
};

/// What leases return to; outlives the pool while leases exist.
struct StagingState {
    std::mutex mutex;
    std::vector<std::shared_ptr<StagingBlock>> idle;
    uint64_t blocks = 0; ///< blocks allocated and not freed (idle or leased)
};

/// The device's staging blocks, all of one size, bounded in total for the device (not per
/// stream). Thread-safe. Acquiring never blocks: when the bound is reached or pinned memory runs
/// out, fewer blocks (possibly none) come back and the caller takes its unstaged path.
class StagingPool {
public:
    StagingPool(std::shared_ptr<Driver> driver, uint64_t blockBytes, uint64_t limitBytes);
    /// Frees the idle blocks: the engine has waited for every stream first.
    ~StagingPool();
    StagingPool(const StagingPool &) = delete;
    StagingPool &operator=(const StagingPool &) = delete;

    uint64_t blockBytes() const noexcept { return blockBytes_; }
    uint64_t limitBytes() const noexcept { return limitBytes_; }
    /// Answers, without blocking, whether a fence completed: from what is known only, or also
    /// by asking the plugin (`query`).
    using SettledFn = std::function<bool(const Fence &, bool query)>;
    /// Up to `count` blocks, in this order: idle ones whose last use is known complete, new ones
    /// while under the limit, idle ones last used by `slot` itself (the caller waits for their
    /// fence before the host touches them: that work precedes its own on the stream anyway),
    /// other idle ones a query finds complete. Blocks still in use by another stream's work are
    /// never taken, so a caller never waits for someone else's stream. When that gives none and
    /// `beyondLimit`, one block beyond the limit (so a transfer never has to copy unstaged while
    /// blocks are held by unwaited reads); such blocks are freed once idle again.
    std::vector<StagingLease> acquire(size_t count, uint32_t slot, const SettledFn &settled,
                                      bool beyondLimit);
    /// Pinned bytes held (idle and leased).
    uint64_t bytesReserved() const;
    /// Takes the idle blocks whose last use completed (per `settled`); the caller frees them by
    /// dropping the result outside its locks. Returns them with their byte count.
    std::vector<std::shared_ptr<StagingBlock>> takeIdle(const SettledFn &settled);

private:
    std::shared_ptr<Driver> driver_;
    uint64_t blockBytes_;
    uint64_t limitBytes_;
    std::shared_ptr<StagingState> state_ = std::make_shared<StagingState>();
};

} // namespace backplane::detail
