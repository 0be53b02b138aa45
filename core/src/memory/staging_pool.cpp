// StagingPool: bounded pinned blocks shared by every stream of a device.
#include "memory/staging_pool.hpp"

#include <backplane/log.hpp>

#include <algorithm>
#include <utility>

namespace backplane::detail {

StagingLease::~StagingLease() { giveBack(); }

StagingLease &StagingLease::operator=(StagingLease &&other) noexcept {
    if (this != &other) {
        giveBack();
        block_ = std::move(other.block_);
        pool_ = std::move(other.pool_);
    }
    return *this;
}

void StagingLease::giveBack() noexcept {
    if (!block_) return;
    std::shared_ptr<StagingBlock> block = std::move(block_);
    if (auto pool = pool_.lock()) {
        std::lock_guard lock(pool->mutex);
        pool->idle.push_back(std::move(block));
        return;
    }
    // The pool is gone: the engine waited for every stream, so the block's use completed.
}

StagingPool::StagingPool(std::shared_ptr<Driver> driver, uint64_t blockBytes, uint64_t limitBytes)
    : driver_(std::move(driver)), blockBytes_(blockBytes), limitBytes_(limitBytes) {}

StagingPool::~StagingPool() = default;

std::vector<StagingLease> StagingPool::acquire(size_t count, uint32_t slot,
                                               const SettledFn &settled, bool beyondLimit) {
    const uint64_t limitBlocks = std::max<uint64_t>(1, limitBytes_ / blockBytes_);
    std::vector<StagingLease> leases;
    std::vector<std::shared_ptr<StagingBlock>> surplus; // freed below, outside the lock
    uint64_t fresh = 0;
    {
        std::lock_guard lock(state_->mutex);
        auto &idle = state_->idle;
        for (auto it = idle.begin(); it != idle.end();) {
            const Fence &fence = (*it)->ready;
            const bool ready = !fence || settled(fence);
            if ((ready || fence.slot == slot) && leases.size() < count) {
                if (ready) (*it)->ready = {};
                leases.emplace_back(std::move(*it), state_);
                it = idle.erase(it);
            } else if (ready && state_->blocks > limitBlocks) {
                // A block taken beyond the limit earlier, idle again: give it back.
                surplus.push_back(std::move(*it));
                it = idle.erase(it);
                --state_->blocks;
            } else {
                ++it;
            }
        }
        if (leases.size() == count) return leases;
        // Count the new blocks first, so concurrent callers cannot overshoot the limit.
        const uint64_t room = limitBlocks > state_->blocks ? limitBlocks - state_->blocks : 0;
        fresh = std::min<uint64_t>(room, count - leases.size());
        if (leases.empty() && fresh == 0 && beyondLimit) fresh = 1; // see acquire()'s comment
        state_->blocks += fresh;
    }
    for (uint64_t made = 0; made < fresh; ++made) {
        try {
            leases.emplace_back(std::make_shared<StagingBlock>(
                                    driver_->allocate(BP_MEMORY_PINNED_HOST, blockBytes_)),
                                state_);
        } catch (const Error &e) {
            {
                std::lock_guard lock(state_->mutex);
                state_->blocks -= fresh - made;
            }
            if (e.code() != ErrorCode::OutOfMemory) throw;
            log::write(log::Subsystem::Memory, log::Level::Info,
                       "no pinned memory for another staging block: " + std::string(e.what()));
            break;
        }
    }
    return leases;
}

uint64_t StagingPool::bytesReserved() const {
    std::lock_guard lock(state_->mutex);
    return state_->blocks * blockBytes_;
}

std::vector<std::shared_ptr<StagingBlock>> StagingPool::takeIdle(const SettledFn &settled) {
    std::vector<std::shared_ptr<StagingBlock>> taken;
    std::lock_guard lock(state_->mutex);
    auto &idle = state_->idle;
    for (auto it = idle.begin(); it != idle.end();) {
        if (!(*it)->ready || settled((*it)->ready)) {
            taken.push_back(std::move(*it));
            it = idle.erase(it);
        } else {
            ++it;
        }
    }
    state_->blocks -= taken.size();
    return taken;
}

} // namespace backplane::detail
