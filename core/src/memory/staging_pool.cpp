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
    std::vector<std::shared_ptr<StagingBlock>> surplus; // freed on return, outside the lock
    uint64_t fresh = 0;
    {
        std::lock_guard lock(state_->mutex);
        auto &idle = state_->idle;
        // Takes idle blocks matching `pick`, oldest first, until `count` are found or promised.
        const auto take = [&](auto pick) {
            for (auto it = idle.begin(); it != idle.end() && leases.size() + fresh < count;) {
                if (pick(**it)) {
                    leases.emplace_back(std::move(*it), state_);
                    it = idle.erase(it);
                } else {
                    ++it;
                }
            }
        };
        const auto settledNow = [&](StagingBlock &b, bool query) {
            if (b.ready && !settled(b.ready, query)) return false;
            b.ready = {};
            return true;
        };
        // 1. Blocks whose last use is known complete. 2. New blocks while under the limit.
        // 3. Blocks this stream used last: the caller's copy is ordered after that use anyway.
        // 4. Other streams' blocks that a query finds complete. 5. One block beyond the limit.
        take([&](StagingBlock &b) { return settledNow(b, false); });
        const uint64_t room = limitBlocks > state_->blocks ? limitBlocks - state_->blocks : 0;
        fresh = std::min<uint64_t>(room, count - leases.size());
        take([&](StagingBlock &b) { return b.ready.slot == slot; });
        take([&](StagingBlock &b) { return settledNow(b, true); });
        if (leases.empty() && fresh == 0 && beyondLimit) fresh = 1;
        state_->blocks += fresh;
        // Blocks taken beyond the limit earlier go back once idle and complete.
        for (auto it = idle.begin(); it != idle.end() && state_->blocks > limitBlocks;) {
            if (settledNow(**it, false)) {
                surplus.push_back(std::move(*it));
                it = idle.erase(it);
                --state_->blocks;
            } else {
                ++it;
            }
        }
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
        if (!(*it)->ready || settled((*it)->ready, true)) {
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
