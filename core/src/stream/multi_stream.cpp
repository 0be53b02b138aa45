// MultiStream alignment (seed 002) and the GC thread that frees cross-stream holds after fences.
#include "stream/multi_stream.hpp"

#include <backplane/log.hpp>

namespace backplane::detail {

GcThread::GcThread(CompletionTracker &tracker, std::function<void(const std::string &)> onFailure)
    : tracker_(tracker), onFailure_(std::move(onFailure)), thread_([this] { run(); }) {}

GcThread::~GcThread() {
    {
        std::lock_guard lock(mutex_);
        stop_ = true;
    }
    wake_.notify_all();
    thread_.join();
    quarantined_.clear();
}

void GcThread::registerTask(Fence fence, std::vector<Hold> holds) {
    {
        std::lock_guard lock(mutex_);
        tasks_.emplace_back(std::move(fence), std::move(holds));
        queued_.store(tasks_.size(), std::memory_order_relaxed);
    }
    wake_.notify_one();
}

void GcThread::throttle() {
    if (queued_.load(std::memory_order_relaxed) <= kMaxQueued) return; // the launch path
    std::unique_lock lock(mutex_);
    if (tasks_.size() <= kMaxQueued) return;
    idle_.wait(lock, [&] { return tasks_.size() <= kMaxQueued / 2 || stop_; });
}

void GcThread::drain() {
    std::unique_lock lock(mutex_);
    idle_.wait(lock, [&] { return tasks_.empty() && !busy_; });
}

uint64_t GcThread::released() const {
    std::lock_guard lock(mutex_);
    return released_;
}

size_t GcThread::queued() const {
    std::lock_guard lock(mutex_);
    return tasks_.size();
}

void GcThread::run() {
    std::unique_lock lock(mutex_);
    for (;;) {
        wake_.wait(lock, [&] { return stop_ || !tasks_.empty(); });
        if (tasks_.empty()) break; // stop_ and nothing left: every hold was honoured
        auto task = std::move(tasks_.front());
        tasks_.pop_front();
        queued_.store(tasks_.size(), std::memory_order_relaxed);
        busy_ = true;
        lock.unlock();
        bool completed = true;
        try {
            task.first.event->wait();
            tracker_.complete(task.first.slot, task.first.cursor);
        } catch (const std::exception &e) {
            // The work may still be running or in an unknown state: the memory it used must not
            // be reused. Report it (the device is marked lost) and keep the holds.
            completed = false;
            log::write(log::Subsystem::Streams, log::Level::Error,
                       std::string("a stream's work failed; its memory is kept: ") + e.what());
            if (onFailure_) onFailure_(e.what());
        }
        const size_t count = task.second.size();
        if (completed) {
            task = {}; // drops the holds and the event outside the lock
        }
        lock.lock();
        if (completed) {
            released_ += count;
        } else {
            for (Hold &h : task.second) quarantined_.push_back(std::move(h));
        }
        busy_ = false;
        idle_.notify_all();
    }
    busy_ = false;
    idle_.notify_all();
}

MultiStream::MultiStream(std::shared_ptr<EventBackend> backend, uint32_t maxStreams,
                         CompletionTracker &tracker,
                         std::function<void(const std::string &)> onFailure)
    : backend_(std::move(backend)), maxStreams_(maxStreams == 0 ? 1 : maxStreams),
      tracker_(tracker), onFailure_(onFailure), gc_(tracker, std::move(onFailure)) {}

MultiStream::~MultiStream() {
    // Holds go to the GC with one last fence per slot; what a failed device keeps is dropped
    // only after the streams are destroyed (destroying a stream waits for its work).
    std::vector<Hold> late;
    for (auto &[index, s] : slots_) {
        if (s.pendingHolds.empty()) continue;
        try {
            flush(index);
        } catch (const std::exception &) {
            for (Hold &h : s.pendingHolds) late.push_back(std::move(h));
            s.pendingHolds.clear();
        }
    }
    gc_.drain();
    for (auto &[index, s] : slots_) {
        s.lastFence = {};
        backend_->destroyStream(s.stream);
    }
}

StreamSlot &MultiStream::slot(uint32_t index) {
    auto it = slots_.find(index);
    if (it != slots_.end()) return it->second;
    StreamSlot s;
    s.stream = backend_->createStream();
    return slots_.emplace(index, std::move(s)).first->second;
}

std::vector<uint32_t> MultiStream::activeSlots() const {
    std::vector<uint32_t> out;
    for (const auto &[index, s] : slots_) out.push_back(index);
    return out;
}

SharedBindingAnalysis MultiStream::updateSharedBindings(uint32_t slotIndex,
                                                        std::span<const StreamUse> uses) {
    SharedBindingAnalysis analysis;
    StreamSlot &current = slot(slotIndex);
    for (const StreamUse &u : uses) {
        if (u.slot == slotIndex || tracker_.isComplete(u)) continue;
        auto it = current.lastSynced.find(u.slot);
        if (it != current.lastSynced.end() && it->second >= u.cursor) continue;
        if (log::enabled(log::Subsystem::Streams, log::Level::Trace))
            log::write(log::Subsystem::Streams, log::Level::Trace,
                       "a use on slot " + std::to_string(u.slot) + " (cursor " +
                           std::to_string(u.cursor) + ") is pending for slot " +
                           std::to_string(slotIndex));
        uint64_t &needed = analysis.origins[u.slot];
        if (u.cursor > needed) needed = u.cursor;
    }
    return analysis;
}

Fence MultiStream::makeFence(uint32_t slotIndex) {
    StreamSlot &s = slot(slotIndex);
    Fence fence{std::make_shared<SharedEvent>(backend_, backend_->flush(s.stream)), slotIndex,
                s.cursor};
    ++eventsCreated_;
    s.lastFence = fence;
    return fence;
}

void MultiStream::applyAnalysis(uint32_t slotIndex, const SharedBindingAnalysis &analysis) {
    if (analysis.empty()) return;
    std::vector<Fence> fences;
    for (const auto &[origin, cursor] : analysis.origins) {
        ++alignmentEvents_;
        fences.push_back(flush(origin));
    }
    StreamSlot &current = slot(slotIndex);
    for (const Fence &fence : fences) {
        current.lastSynced[fence.slot] = fence.cursor;
        if (log::enabled(log::Subsystem::Streams, log::Level::Debug))
            log::write(log::Subsystem::Streams, log::Level::Debug,
                       "slot " + std::to_string(slotIndex) + " waits on slot " +
                           std::to_string(fence.slot));
        backend_->waitEvent(current.stream, fence.event->get());
        ++streamWaits_;
    }
}

MultiStream::Resolved MultiStream::resolve(uint32_t slotIndex, std::span<const StreamUse> uses) {
    applyAnalysis(slotIndex, updateSharedBindings(slotIndex, uses));
    StreamSlot &s = slot(slotIndex);
    ++s.cursor;
    return {slotIndex, s.stream, s.cursor};
}

void MultiStream::hold(uint32_t slotIndex, Hold hold) {
    StreamSlot &s = slot(slotIndex);
    if (!s.pendingSet.insert(hold.get()).second) return;
    s.pendingHolds.push_back(std::move(hold));
    if (s.pendingHolds.size() > kMaxPendingHolds) {
        ++alignmentEvents_;
        flush(slotIndex);
    }
}

Fence MultiStream::flush(uint32_t slotIndex) {
    Fence fence = makeFence(slotIndex);
    StreamSlot &s = slot(slotIndex);
    if (!s.pendingHolds.empty()) {
        gc_.registerTask(fence, std::move(s.pendingHolds));
        s.pendingHolds.clear();
        s.pendingSet.clear();
    }
    return fence;
}

Fence MultiStream::flushTakingHolds(uint32_t slotIndex, std::vector<Hold> &holds) {
    Fence fence = makeFence(slotIndex);
    StreamSlot &s = slot(slotIndex);
    for (Hold &h : s.pendingHolds) holds.push_back(std::move(h));
    s.pendingHolds.clear();
    s.pendingSet.clear();
    return fence;
}

Fence MultiStream::fenceCovering(uint32_t slotIndex, uint64_t cursor) {
    StreamSlot &s = slot(slotIndex);
    if (s.lastFence && s.lastFence.cursor >= cursor) return s.lastFence;
    return flush(slotIndex);
}

void MultiStream::pollCompletion() {
    for (auto &[index, s] : slots_) {
        if (!s.lastFence || tracker_.completed(index) >= s.lastFence.cursor) continue;
        try {
            if (s.lastFence.event->query()) tracker_.complete(index, s.lastFence.cursor);
        } catch (const std::exception &e) {
            if (onFailure_) onFailure_(e.what());
        }
    }
}

} // namespace backplane::detail
