// MultiStream: per-stream cursors and lazy cross-stream alignment with events, plus the GC thread.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <thread>
#include <unordered_map>
#include <vector>

namespace backplane::detail {

/// The stream/event contract MultiStream drives (the plugin's, or a fake in tests). Handles are
/// opaque pointers. Events are released exactly once with releaseEvent.
class EventBackend {
public:
    virtual ~EventBackend() = default;
    virtual void *createStream() = 0;
    virtual void destroyStream(void *stream) = 0;
    /// Submits the stream's work and returns an event completing after all of it.
    virtual void *flush(void *stream) = 0;
    /// Later work of `stream` starts after `event`; the event stays the caller's.
    virtual void waitEvent(void *stream, void *event) = 0;
    /// Blocks the host until `event` completed. May throw.
    virtual void waitEventSync(void *event) = 0;
    virtual void releaseEvent(void *event) = 0;
};

/// An event shared between its users (the waiting host, the GC thread); released when the last
/// reference goes.
class SharedEvent {
public:
    SharedEvent(EventBackend &backend, void *event) : backend_(backend), event_(event) {}
    ~SharedEvent() { backend_.releaseEvent(event_); }
    SharedEvent(const SharedEvent &) = delete;
    SharedEvent &operator=(const SharedEvent &) = delete;
    void *get() const noexcept { return event_; }
    void wait() { backend_.waitEventSync(event_); }

private:
    EventBackend &backend_;
    void *event_;
};
using EventPtr = std::shared_ptr<SharedEvent>;

/// Something to keep alive until an event completed (a Slice, a pinned staging block...).
using Hold = std::shared_ptr<void>;

/// One buffer used by an operation: the slot and cursor of its last use, and what to hold.
struct BindingUse {
    uint32_t slot = 0;
    uint64_t cursor = 0;
    Hold hold;
};

/// Which origin slots an operation must wait for, and the buffers involved per origin.
struct SharedBindingAnalysis {
    std::map<uint32_t, std::vector<Hold>> slices;
    bool empty() const { return slices.empty(); }
    bool operator==(const SharedBindingAnalysis &other) const;
};

/// Releases holds once their event completed, on its own thread (seed 002's GcThread).
class GcThread {
public:
    GcThread();
    ~GcThread();
    GcThread(const GcThread &) = delete;
    GcThread &operator=(const GcThread &) = delete;
    void registerTask(EventPtr event, std::vector<Hold> holds);
    /// Blocks until every task registered so far has been released.
    void drain();
    uint64_t released() const;

private:
    void run();
    mutable std::mutex mutex_;
    std::condition_variable wake_;
    std::condition_variable idle_;
    std::deque<std::pair<EventPtr, std::vector<Hold>>> tasks_;
    bool busy_ = false;
    bool stop_ = false;
    uint64_t released_ = 0;
    std::thread thread_;
};

/// The state of one backend stream slot.
struct StreamSlot {
    void *stream = nullptr;
    uint64_t cursor = 0;
    std::unordered_map<uint32_t, uint64_t> lastSynced; ///< origin slot -> its cursor at the sync
    std::vector<Hold> pendingHolds; ///< foreign buffers used here, held until this slot's next event
};

/// Streams of one device with the alignment of seed 002. Not thread-safe: the server calls it
/// under its lock. Stream slots are created lazily; slot = stream id % maxStreams.
class MultiStream {
public:
    MultiStream(EventBackend &backend, uint32_t maxStreams);
    ~MultiStream();
    MultiStream(const MultiStream &) = delete;
    MultiStream &operator=(const MultiStream &) = delete;

    uint32_t maxStreams() const noexcept { return maxStreams_; }
    uint32_t slotOf(uint64_t streamId) const noexcept {
        return static_cast<uint32_t>(streamId % maxStreams_);
    }
    StreamSlot &slot(uint32_t index);
    bool hasSlot(uint32_t index) const { return slots_.count(index) != 0; }
    std::vector<uint32_t> activeSlots() const;

    /// The origins `bindings` need on `slot` that it has not synced with (no side effects).
    SharedBindingAnalysis updateSharedBindings(uint32_t slot, std::span<const BindingUse> bindings);
    /// Aligns `slot` with the analysis: flushes each origin (one event each) and makes `slot`
    /// wait on it; records last_synced.
    void applyAnalysis(uint32_t slot, const SharedBindingAnalysis &analysis);

    /// What resolve() returns: the stream to enqueue on and the cursor of this operation.
    struct Resolved {
        uint32_t slot = 0;
        void *stream = nullptr;
        uint64_t cursor = 0;
        SharedBindingAnalysis analysis;
    };
    /// Aligns and advances the cursor of `slot`; enqueue the operation on `stream` next, then
    /// call finish().
    Resolved resolve(uint32_t slot, std::span<const BindingUse> bindings);
    /// After the operation: the analysis's cross-stream buffers join `slot`'s pending holds, so
    /// their memory is reused only after an event of `slot` flushed after this use completed.
    void finish(Resolved &resolved);
    /// Flushes `slot` with an event only to hand its pending holds to the GC (counted as an
    /// alignment event); used when too many holds accumulated.
    void releasePendingHolds(uint32_t slot);

    /// Flushes `slot` with an event; hands the slot's pending holds to the GC with it.
    EventPtr flushWithEvent(uint32_t slot);
    /// Waits on the host for all work of `slot`; releases its pending holds.
    void sync(uint32_t slot);

    GcThread &gc() noexcept { return gc_; }
    uint64_t eventsCreated() const noexcept { return eventsCreated_; }
    uint64_t alignmentEvents() const noexcept { return alignmentEvents_; }
    uint64_t streamWaits() const noexcept { return streamWaits_; }

private:
    EventPtr makeEvent(void *stream);

    EventBackend &backend_;
    uint32_t maxStreams_;
    std::map<uint32_t, StreamSlot> slots_;
    uint64_t eventsCreated_ = 0;
    uint64_t alignmentEvents_ = 0;
    uint64_t streamWaits_ = 0;
    GcThread gc_; // last: joined first, before the slots' streams are destroyed
};

} // namespace backplane::detail
