// Streams and events of the host plugin.
#include "host_stream.hpp"

#include <chrono>
#include <limits>

namespace backplane::host {
namespace {

int64_t nowNs() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

// Timeouts longer than this are treated as "forever": steady_clock::now() + timeout would
// overflow its 64-bit nanosecond count otherwise.
constexpr uint64_t kForeverNs = uint64_t{1} << 62;

} // namespace

void Timeline::advance(bp_status failure, const std::string &message) {
    if (failure != BP_SUCCESS) {
        std::lock_guard lock(mutex_);
        if (failedTask_ == 0) {
            failedTask_ = completed_.load(std::memory_order_relaxed) + 1;
            failure_ = failure;
            failureMessage_ = message;
        }
        completed_.fetch_add(1, std::memory_order_seq_cst);
    } else {
        completed_.fetch_add(1, std::memory_order_seq_cst); // the common case takes no lock
    }
    // A waiter counts itself in before it checks completed_ under the mutex (both sequentially
    // consistent): either its check sees the new count, or this load sees the waiter. Taking the
    // mutex before notifying means the waiter is not between its check and its wait.
    if (waiters_.load(std::memory_order_seq_cst) != 0) {
        { std::lock_guard lock(mutex_); }
        changed_.notify_all();
    }
}

bool Timeline::waitFor(uint64_t value, uint64_t timeoutNs) const {
    if (completed() >= value) return true;
    struct Counted {
        std::atomic<uint32_t> &waiters;
        explicit Counted(std::atomic<uint32_t> &w) : waiters(w) {
            waiters.fetch_add(1, std::memory_order_seq_cst);
        }
        ~Counted() { waiters.fetch_sub(1, std::memory_order_relaxed); }
    } counted(waiters_);
    std::unique_lock lock(mutex_);
    const auto reached = [&] { return completed_.load(std::memory_order_seq_cst) >= value; };
    if (timeoutNs >= kForeverNs) {
        changed_.wait(lock, reached);
        return true;
    }
    return changed_.wait_for(lock, std::chrono::nanoseconds(timeoutNs), reached);
}

void Timeline::throwIfFailed(uint64_t value) const {
    std::lock_guard lock(mutex_);
    if (failedTask_ != 0 && failedTask_ <= value) throw sdk::Error(failure_, failureMessage_);
}

HostEvent::HostEvent(std::shared_ptr<const Timeline> timeline, uint64_t value,
                     std::shared_ptr<const std::atomic<int64_t>> timestampNs)
    : timeline_(std::move(timeline)), value_(value), timestampNs_(std::move(timestampNs)) {}

bool HostEvent::query() const {
    if (timeline_->completed() < value_) return false;
    timeline_->throwIfFailed(value_);
    return true;
}

bool HostEvent::wait(uint64_t timeoutNs) const {
    if (!timeline_->waitFor(value_, timeoutNs)) return false;
    timeline_->throwIfFailed(value_);
    return true;
}

int64_t HostEvent::timestampNs() const noexcept {
    return timestampNs_ ? timestampNs_->load(std::memory_order_acquire) : -1;
}

HostStream::HostStream(const void *owner, bool async, std::shared_ptr<const LostState> lost)
    : owner_(owner), async_(async), lost_(std::move(lost)) {
    if (async_) worker_ = std::thread([this] { runWorker(); });
}

HostStream::~HostStream() {
    if (!async_) return;
    {
        std::lock_guard lock(queueMutex_);
        stopping_ = true;
    }
    queueChanged_.notify_all();
    worker_.join(); // the worker drains the queue before it sees stopping_
}

void HostStream::submit(std::function<void()> task) {
    ++submitted_;
    if (!async_) {
        try {
            if (lost_ && lost_->lost()) throw sdk::Error(BP_ERROR_DEVICE_LOST, lost_->reason());
            task();
        } catch (...) {
            timeline_->advance(); // the caller gets the error; later events stay clean
            throw;
        }
        timeline_->advance();
        return;
    }
    {
        std::lock_guard lock(queueMutex_);
        queue_.push_back(std::move(task));
    }
    queueChanged_.notify_one();
}

std::unique_ptr<HostEvent> HostStream::flush(bool timing) {
    std::shared_ptr<std::atomic<int64_t>> timestamp;
    if (timing) {
        timestamp = std::make_shared<std::atomic<int64_t>>(-1);
        // In order after everything before it, so the marker runs when that work completed.
        submit([timestamp] { timestamp->store(nowNs(), std::memory_order_release); });
    }
    return std::make_unique<HostEvent>(timeline_, submitted_, std::move(timestamp));
}

void HostStream::waitEvent(const HostEvent &event) {
    // Capture the timeline, not the event: the caller may release the event before the wait runs.
    submit([timeline = event.timeline(), value = event.value()] {
        timeline->waitFor(value, std::numeric_limits<uint64_t>::max());
        timeline->throwIfFailed(value); // work that depends on failed work fails too
    });
}

void HostStream::runWorker() {
    // Everything queued is taken at once: one lock per batch, not per task, on the side the
    // recording thread contends with.
    std::deque<std::function<void()>> batch;
    for (;;) {
        {
            std::unique_lock lock(queueMutex_);
            queueChanged_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
            if (queue_.empty()) return; // stopping and drained
            batch.swap(queue_);
        }
        for (std::function<void()> &task : batch) {
            try {
                // After a sticky fault nothing runs: later work fails, as on a GPU.
                if (lost_ && lost_->lost()) throw sdk::Error(BP_ERROR_DEVICE_LOST, lost_->reason());
                task();
                timeline_->advance();
            } catch (const sdk::Error &e) {
                timeline_->advance(e.code(), e.what());
            } catch (const std::exception &e) {
                timeline_->advance(BP_ERROR_INTERNAL,
                                   std::string("host stream task failed: ") + e.what());
            } catch (...) {
                timeline_->advance(BP_ERROR_INTERNAL,
                                   "host stream task failed with a non-standard exception");
            }
            task = nullptr; // what it captured goes now, as it would one task at a time
        }
        batch.clear();
    }
}

} // namespace backplane::host
