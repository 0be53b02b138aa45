// Streams and events of the host plugin: a worker thread per stream, counters as events.
#pragma once

#include "fault_injection.hpp"

#include <backplane/abi/plugin_sdk.hpp>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

namespace backplane::host {

/// The completion counter of one stream. Task n (counted from 1 in submission order) is done when
/// completed() >= n. Shared by the stream and every event flushed from it, so events outlive their
/// stream. A task that fails (throws sdk::Error) is still counted as done; its failure is recorded
/// and reported by every event at or after it. Thread-safe; advancing takes no lock unless a task
/// failed or a thread waits.
class Timeline {
public:
    /// Number of tasks completed so far; never blocks.
    uint64_t completed() const noexcept { return completed_.load(std::memory_order_acquire); }
    /// Marks the next task done, recording `failure` first when it is not BP_SUCCESS.
    void advance(bp_status failure = BP_SUCCESS, const std::string &message = {});
    /// Blocks until completed() >= value or timeoutNs ran out (UINT64_MAX: forever). Returns
    /// whether the value was reached.
    bool waitFor(uint64_t value, uint64_t timeoutNs) const;
    /// Throws the first recorded failure if it happened at or before task `value`.
    void throwIfFailed(uint64_t value) const;

private:
    std::atomic<uint64_t> completed_{0};
    mutable std::atomic<uint32_t> waiters_{0}; ///< threads in waitFor(): advance() wakes them
    mutable std::mutex mutex_;
    mutable std::condition_variable changed_;
    uint64_t failedTask_ = 0; ///< 0: no failure
    bp_status failure_ = BP_SUCCESS;
    std::string failureMessage_;
};

/// A completion point of a stream: complete when the stream's timeline reached `value`. Timing
/// events also carry the steady_clock time at which the work before them completed.
class HostEvent final : public sdk::Event {
public:
    HostEvent(std::shared_ptr<const Timeline> timeline, uint64_t value,
              std::shared_ptr<const std::atomic<int64_t>> timestampNs);

    /// True when complete; throws the stream's failure if the work before the event failed.
    bool query() const;
    /// Host wait; false when timeoutNs ran out. Throws like query().
    bool wait(uint64_t timeoutNs) const;
    /// Completion time in steady_clock nanoseconds; -1 while pending or for non-timing events.
    int64_t timestampNs() const noexcept;
    bool isTiming() const noexcept { return timestampNs_ != nullptr; }

    const std::shared_ptr<const Timeline> &timeline() const noexcept { return timeline_; }
    uint64_t value() const noexcept { return value_; }

private:
    std::shared_ptr<const Timeline> timeline_;
    uint64_t value_;
    std::shared_ptr<const std::atomic<int64_t>> timestampNs_;
};

/// An in-order queue of work. Asynchronous mode: a worker thread runs the tasks in submission
/// order while the caller goes on recording. Synchronous mode: submit() runs the task inline.
/// Recording functions (submit, flush, waitEvent) are called by one thread at a time (the ABI's
/// per-stream rule); the worker and any event waiter run concurrently with them.
class HostStream final : public sdk::Stream {
public:
    /// `owner` identifies the device the stream belongs to (compared, never dereferenced);
    /// once `lost` (the device's, shared) is set, every task fails with BP_ERROR_DEVICE_LOST
    /// instead of running.
    HostStream(const void *owner, bool async, std::shared_ptr<const LostState> lost);
    /// Waits until every submitted task ran, then joins the worker.
    ~HostStream() override;
    HostStream(const HostStream &) = delete;
    HostStream &operator=(const HostStream &) = delete;

    /// Appends a task. A task reports failure by throwing sdk::Error; asynchronously the failure
    /// goes to the timeline (events report it), synchronously it propagates to the caller.
    void submit(std::function<void()> task);
    /// An event that completes when everything submitted so far completed. A timing event also
    /// records the completion time (asynchronously: through a marker task).
    std::unique_ptr<HostEvent> flush(bool timing);
    /// Later tasks start only after `event` completed (a task that blocks the worker).
    void waitEvent(const HostEvent &event);

    const void *owner() const noexcept { return owner_; }
    /// False in synchronous mode: submit() runs the task before it returns.
    bool async() const noexcept { return async_; }

private:
    void runWorker();

    const void *owner_;
    const bool async_;
    const std::shared_ptr<const LostState> lost_;
    std::shared_ptr<Timeline> timeline_ = std::make_shared<Timeline>();
    uint64_t submitted_ = 0; ///< touched by the recording thread only

    std::mutex queueMutex_;
    std::condition_variable queueChanged_;
    std::deque<std::function<void()>> queue_;
    bool stopping_ = false;
    std::thread worker_; ///< last: starts after everything above is initialised
};

} // namespace backplane::host
