// SchedulerMultiStream: logical streams as task queues over a backend without async events.
#pragma once

#include "stream/multi_stream.hpp"

#include <backplane/config.hpp>

#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <vector>

namespace backplane::detail {

/// What the scheduler drives: streams that only need create, destroy and submit.
class SchedulerBackend {
public:
    virtual ~SchedulerBackend() = default;
    virtual void *createStream() = 0;
    virtual void destroyStream(void *stream) = 0;
    /// Submits everything enqueued on `stream`.
    virtual void submit(void *stream) = 0;
};

/// One queued operation: enqueues itself on a backend stream; holds what it uses until then.
struct SchedulerTask {
    std::function<void(void *stream)> run;
    std::vector<Hold> holds;
};

/// Seed 004: each logical stream slot queues tasks; a task whose buffers were last used on
/// another slot first executes that slot's queue (so the device sees the producer first);
/// a queue reaching maxTasks executes. Interleave: the queues being executed are merged round
/// robin onto the first one's backend stream; Sequential: each runs on its own stream in turn.
/// Not thread-safe: the server calls it under its lock.
class SchedulerMultiStream {
public:
    SchedulerMultiStream(SchedulerBackend &backend, uint32_t maxStreams, uint32_t maxTasks,
                         SchedulerMode mode);
    ~SchedulerMultiStream();
    SchedulerMultiStream(const SchedulerMultiStream &) = delete;
    SchedulerMultiStream &operator=(const SchedulerMultiStream &) = delete;

    uint32_t slotOf(uint64_t streamId) const noexcept {
        return static_cast<uint32_t>(streamId % maxStreams_);
    }
    /// Queues `task` on `slot`; `bindingSlots` are the last-use slots of its buffers.
    void registerTask(uint32_t slot, SchedulerTask task, std::span<const uint32_t> bindingSlots);
    /// Executes the queues of `slots` (deduplicated) per the mode.
    void executeStreams(std::vector<uint32_t> slots);
    /// Executes every queue.
    void executeAll();
    /// The backend stream of `slot` (created on first use).
    void *stream(uint32_t slot);
    /// Every backend stream created so far.
    std::vector<void *> streams() const {
        std::vector<void *> out;
        for (const auto &[index, s] : slots_) out.push_back(s.stream);
        return out;
    }
    /// Tasks waiting in `slot`'s queue.
    size_t queued(uint32_t slot) const;
    uint64_t batches() const noexcept { return batches_; }

private:
    struct Slot {
        void *stream = nullptr;
        std::vector<SchedulerTask> tasks;
    };
    Slot &slotState(uint32_t index);

    SchedulerBackend &backend_;
    uint32_t maxStreams_;
    uint32_t maxTasks_;
    SchedulerMode mode_;
    std::map<uint32_t, Slot> slots_;
    uint64_t batches_ = 0;
};

} // namespace backplane::detail
