// MultiStream: per-stream cursors and lazy cross-stream alignment with events, plus the GC thread.
#pragma once

#include "stream/hazards.hpp"
#include "trace/trace_recorder.hpp"

#include <boost/container/flat_map.hpp>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

namespace backplane::detail {

/// The stream/event contract MultiStream drives (the plugin's, or a fake in tests). Handles are
/// opaque pointers. Events are released exactly once with releaseEvent, possibly after the
/// stream they came from was destroyed and from any thread.
class EventBackend {
public:
    virtual ~EventBackend() = default;
    virtual void *createStream() = 0;
    virtual void destroyStream(void *stream) = 0;
    /// Submits the stream's work and returns an event completing after all of it.
    virtual void *flush(void *stream) = 0;
    /// Later work of `stream` starts after `event`; the event stays the caller's.
    virtual void waitEvent(void *stream, void *event) = 0;
    /// Blocks the host until `event` completed. Throws when the work before it failed.
    virtual void waitEventSync(void *event) = 0;
    /// Waits at most `timeoutNs`; false when it ran out. Throws like waitEventSync.
    virtual bool waitEventFor(void *event, uint64_t timeoutNs) = 0;
    /// True when `event` completed; never blocks. Throws like waitEventSync.
    virtual bool queryEvent(void *event) = 0;
    virtual void releaseEvent(void *event) = 0;
};

/// An event shared between its users (waiting hosts, the GC thread, a ReadFuture); released when
/// the last reference goes. Keeps its backend alive, so it may outlive the engine that made it.
class SharedEvent {
public:
    SharedEvent(std::shared_ptr<EventBackend> backend, void *event)
        : backend_(std::move(backend)), event_(event) {}
    ~SharedEvent() { backend_->releaseEvent(event_); }
    SharedEvent(const SharedEvent &) = delete;
    SharedEvent &operator=(const SharedEvent &) = delete;
    void *get() const noexcept { return event_; }
    void wait() { backend_->waitEventSync(event_); }
    bool waitFor(uint64_t timeoutNs) { return backend_->waitEventFor(event_, timeoutNs); }
    bool query() { return backend_->queryEvent(event_); }

private:
    std::shared_ptr<EventBackend> backend_;
    void *event_;
};
using EventPtr = std::shared_ptr<SharedEvent>;

/// A completion point of one stream slot: `event` completes once the slot's operations up to
/// `cursor` completed. Empty (no event) means "nothing to wait for".
struct Fence {
    EventPtr event;
    uint32_t slot = 0;
    uint64_t cursor = 0;
    explicit operator bool() const noexcept { return event != nullptr; }
};

/// Something to keep alive until a fence completed (a Slice, a pinned block, a read's buffer).
using Hold = std::shared_ptr<void>;

/// Which origin slots an operation must wait for, with the newest cursor needed from each.
struct SharedBindingAnalysis {
    /// Ordered by slot; a few inline (an operation rarely waits for more than a few streams).
    boost::container::small_flat_map<uint32_t, uint64_t, 4> origins;
    bool empty() const { return origins.empty(); }
    bool operator==(const SharedBindingAnalysis &other) const = default;
};

/// Releases holds once their fence completed, on its own thread (seed 002's GcThread), and
/// records the completion. Tasks are released as their fences complete, in any order (one slow
/// stream does not hold back the others). A failed fence does not release: it reports the failure
/// (the engine marks the device lost) and keeps the holds until the thread stops.
class GcThread {
public:
    /// Tasks of one slot queued beyond this make throttle() on that slot wait (the seed's bounded
    /// channel, per stream: a stream waits for its own backlog, never for another's).
    static constexpr size_t kMaxQueued = 64;

    GcThread(uint32_t slots, CompletionTracker &tracker,
             std::function<void(const std::string &)> onFailure);
    /// Waits for every queued task, then joins.
    ~GcThread();
    GcThread(const GcThread &) = delete;
    GcThread &operator=(const GcThread &) = delete;

    /// Queues `holds` until `fence` completed. Never blocks (it is called under the engine lock).
    void registerTask(Fence fence, std::vector<Hold> holds);
    /// Backpressure: blocks while more than kMaxQueued tasks of `slot` wait. Call it without
    /// locks held.
    void throttle(uint32_t slot);
    /// Blocks until every task registered before the call has been handled (later ones do not
    /// delay it).
    void drain();
    /// Holds released after their fence completed (each hold counted once).
    uint64_t released() const;
    /// Tasks waiting (for tests).
    size_t queued() const;
    /// The device (process id) its releases are traced under.
    void setTracePid(uint32_t pid) noexcept { tracePid_.store(pid, std::memory_order_relaxed); }

private:
    struct Task {
        uint64_t ticket = 0;
        Fence fence;
        std::vector<Hold> holds;
        TraceClock::time_point registered{}; ///< set only while a trace records
    };
    void run();
    bool handledBefore(uint64_t ticket) const;

    uint32_t slots_;
    CompletionTracker &tracker_;
    std::function<void(const std::string &)> onFailure_;
    mutable std::mutex mutex_;
    std::condition_variable wake_;
    std::condition_variable progress_;
    std::deque<Task> tasks_;
    std::unique_ptr<std::atomic<uint32_t>[]> perSlot_; ///< queued tasks per slot (throttle)
    uint64_t nextTicket_ = 1;
    size_t working_ = 0;      ///< tasks the thread took into its own list
    uint64_t workingMin_ = 0; ///< the oldest ticket among them (0: none)
    std::vector<Hold> quarantined_; ///< holds of failed fences: kept until the thread stops
    bool stop_ = false;
    uint64_t released_ = 0;
    std::atomic<uint32_t> tracePid_{0};
    std::thread thread_;
};

/// A set of object addresses: open addressing at most half full, so that inserting allocates
/// only while the set grows past its largest size so far (clear() keeps the table). Not
/// thread-safe.
class HeldSet {
public:
    /// False when `object` is in the set already (or null: nothing to hold).
    bool insert(const void *object);
    void clear();

private:
    void grow();

    std::unique_ptr<const void *[]> table_; ///< capacity_ = 2^bits_ entries, null = free
    size_t capacity_ = 0;
    unsigned bits_ = 0;
    size_t size_ = 0;
};

/// The state of one backend stream slot.
struct StreamSlot {
    void *stream = nullptr;
    uint64_t cursor = 0;
    /// Origin slot -> its cursor at this slot's newest wait on it; 0 (or past the end): never.
    std::vector<uint64_t> lastSynced;
    std::vector<Hold> pendingHolds; ///< held until this slot's next fence completed
    HeldSet pendingSet;             ///< the same objects, to hold each once
    Fence lastFence;                ///< newest fence flushed on this slot

    uint64_t syncedWith(uint32_t origin) const noexcept {
        return origin < lastSynced.size() ? lastSynced[origin] : 0;
    }
};

/// Streams of one device with the alignment of seed 002. Not thread-safe: the server calls it
/// under its engine lock; it never blocks (waits happen in the callers, outside the lock).
/// Stream slots are created lazily; slot = stream id % maxStreams.
class MultiStream {
public:
    /// Pending holds of one slot beyond this are flushed with their own fence.
    static constexpr size_t kMaxPendingHolds = 256;

    MultiStream(std::shared_ptr<EventBackend> backend, uint32_t maxStreams,
                CompletionTracker &tracker, std::function<void(const std::string &)> onFailure);
    /// Hands pending holds to the GC, waits for it, destroys the streams (which wait for their
    /// work), and only then drops what was still held.
    ~MultiStream();
    MultiStream(const MultiStream &) = delete;
    MultiStream &operator=(const MultiStream &) = delete;

    uint32_t maxStreams() const noexcept { return maxStreams_; }
    /// The slot `index`, its backend stream created on first use.
    StreamSlot &slot(uint32_t index) {
        if (index < slots_.size() && slots_[index]) return *slots_[index];
        return createSlot(index);
    }
    std::vector<uint32_t> activeSlots() const;

    /// The origins the uses need on `slot` that it is not yet ordered after (no side effects):
    /// uses of `slot` itself, uses known complete and uses covered by an earlier wait are skipped.
    SharedBindingAnalysis updateSharedBindings(uint32_t slot, std::span<const StreamUse> uses);
    /// Aligns `slot` with the analysis: flushes each origin (one fence each) and makes `slot`
    /// wait on it on the device; records lastSynced.
    void applyAnalysis(uint32_t slot, const SharedBindingAnalysis &analysis);

    /// What resolve() returns: the stream to enqueue on and the cursor of this operation.
    struct Resolved {
        uint32_t slot = 0;
        void *stream = nullptr;
        uint64_t cursor = 0;
    };
    /// Aligns `slot` after `uses` and advances its cursor; enqueue the operation on `stream` next.
    Resolved resolve(uint32_t slot, std::span<const StreamUse> uses);

    /// Keeps `object` alive until a fence of `slot` flushed later completed (each object once:
    /// an object already held there is not copied again).
    template <class T> void hold(uint32_t slotIndex, const std::shared_ptr<T> &object) {
        StreamSlot &s = slot(slotIndex);
        if (s.pendingSet.insert(object.get())) keep(slotIndex, s, object);
    }
    /// The same, taking the caller's reference (dropped at once when already held).
    template <class T> void hold(uint32_t slotIndex, std::shared_ptr<T> &&object) {
        StreamSlot &s = slot(slotIndex);
        if (s.pendingSet.insert(object.get()))
            keep(slotIndex, s, std::move(object));
        else
            object.reset();
    }
    /// Flushes `slot` with a fence; its pending holds go to the GC with it.
    Fence flush(uint32_t slot);
    /// Flushes `slot` with a fence and moves its pending holds to `holds` (the caller drops them
    /// after waiting on the fence: sync).
    Fence flushTakingHolds(uint32_t slot, std::vector<Hold> &holds);
    /// The newest fence of `slot` covering `cursor`: the last one flushed if it does, else a new
    /// one. For the memory pool, to learn later (by query) whether that work completed.
    Fence fenceCovering(uint32_t slot, uint64_t cursor);
    /// Queries the newest fence of every slot (never blocks) and records completions.
    void pollCompletion();
    /// Flushes every slot that holds something with a fence, so the GC can release it even if
    /// that stream never fences again (a finished request thread). Returns how many it flushed.
    size_t flushHolds();

    GcThread &gc() noexcept { return gc_; }
    /// The device (process id) its waits and the GC's releases are traced under.
    void setTracePid(uint32_t pid) noexcept {
        tracePid_ = pid;
        gc_.setTracePid(pid);
    }
    uint64_t eventsCreated() const noexcept { return eventsCreated_; }
    uint64_t alignmentEvents() const noexcept { return alignmentEvents_; }
    uint64_t streamWaits() const noexcept { return streamWaits_; }

private:
    Fence makeFence(uint32_t slot);
    StreamSlot &createSlot(uint32_t index);
    /// Whether an operation on `current` (slot `index`) must wait for `use` on the device.
    bool mustWait(const StreamSlot &current, uint32_t index, const StreamUse &use) const {
        return use.slot != index && !tracker_.isComplete(use) &&
               current.syncedWith(use.slot) < use.cursor;
    }
    /// hold()'s second half: `hold` is new on `s`.
    void keep(uint32_t slotIndex, StreamSlot &s, Hold hold);

    std::shared_ptr<EventBackend> backend_;
    uint32_t maxStreams_;
    CompletionTracker &tracker_;
    std::function<void(const std::string &)> onFailure_;
    /// By slot index; null until the slot is first used (its stream is created then).
    std::vector<std::unique_ptr<StreamSlot>> slots_;
    uint64_t eventsCreated_ = 0;
    uint64_t alignmentEvents_ = 0;
    uint64_t streamWaits_ = 0;
    uint32_t tracePid_ = 0;
    GcThread gc_; // last: stopped first, before the slots' streams are destroyed
};

} // namespace backplane::detail
