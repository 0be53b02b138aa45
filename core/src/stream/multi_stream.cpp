// MultiStream alignment (seed 002) and the GC thread that frees cross-stream buffers after events.
#include "stream/multi_stream.hpp"

#include <backplane/log.hpp>

namespace backplane::detail {

bool SharedBindingAnalysis::operator==(const SharedBindingAnalysis &other) const {
    if (slices.size() != other.slices.size()) return false;
    for (const auto &[slot, holds] : slices) {
        auto it = other.slices.find(slot);
        if (it == other.slices.end() || it->second != holds) return false;
    }
    return true;
}

GcThread::GcThread() : thread_([this] { run(); }) {}

GcThread::~GcThread() {
    {
        std::lock_guard lock(mutex_);
        stop_ = true;
    }
    wake_.notify_all();
    thread_.join();
}

void GcThread::registerTask(EventPtr event, std::vector<Hold> holds) {
    {
        std::lock_guard lock(mutex_);
        tasks_.emplace_back(std::move(event), std::move(holds));
    }
    wake_.notify_one();
}

void GcThread::drain() {
    std::unique_lock lock(mutex_);
    idle_.wait(lock, [&] { return tasks_.empty() && !busy_; });
}

uint64_t GcThread::released() const {
    std::lock_guard lock(mutex_);
    return released_;
}

void GcThread::run() {
    std::unique_lock lock(mutex_);
    for (;;) {
        wake_.wait(lock, [&] { return stop_ || !tasks_.empty(); });
        if (tasks_.empty()) break; // stop_ and nothing left: every hold was honoured
        auto task = std::move(tasks_.front());
        tasks_.pop_front();
        busy_ = true;
        lock.unlock();
        try {
            task.first->wait();
        } catch (const std::exception &e) {
            // A failed device leaves nothing to protect; the memory may be reused.
            log::write(log::Subsystem::Streams, log::Level::Warn,
                       std::string("GC wait failed: ") + e.what());
        }
        const size_t count = task.second.size();
        task = {}; // drops holds and the event outside the lock
        lock.lock();
        released_ += count;
        busy_ = false;
        if (tasks_.empty()) idle_.notify_all();
    }
    busy_ = false;
    idle_.notify_all();
}

MultiStream::MultiStream(EventBackend &backend, uint32_t maxStreams)
    : backend_(backend), maxStreams_(maxStreams == 0 ? 1 : maxStreams) {}

MultiStream::~MultiStream() {
    // Streams wait for their work when destroyed; holds go before the streams.
    for (auto &[index, s] : slots_) s.pendingHolds.clear();
    gc_.drain();
    for (auto &[index, s] : slots_) backend_.destroyStream(s.stream);
}

StreamSlot &MultiStream::slot(uint32_t index) {
    auto it = slots_.find(index);
    if (it != slots_.end()) return it->second;
    StreamSlot s;
    s.stream = backend_.createStream();
    return slots_.emplace(index, std::move(s)).first->second;
}

std::vector<uint32_t> MultiStream::activeSlots() const {
    std::vector<uint32_t> out;
    for (const auto &[index, s] : slots_) out.push_back(index);
    return out;
}

SharedBindingAnalysis MultiStream::updateSharedBindings(uint32_t slotIndex,
                                                        std::span<const BindingUse> bindings) {
    SharedBindingAnalysis analysis;
    StreamSlot &current = slot(slotIndex);
    for (const BindingUse &b : bindings) {
        if (b.slot == slotIndex) continue;
        auto it = current.lastSynced.find(b.slot);
        if (it != current.lastSynced.end() && it->second >= b.cursor) continue;
        if (log::enabled(log::Subsystem::Streams, log::Level::Trace))
            log::write(log::Subsystem::Streams, log::Level::Trace,
                       "binding of slot " + std::to_string(b.slot) + " (cursor " +
                           std::to_string(b.cursor) + ") is shared on slot " +
                           std::to_string(slotIndex));
        analysis.slices[b.slot].push_back(b.hold);
    }
    return analysis;
}

EventPtr MultiStream::makeEvent(void *stream) {
    ++eventsCreated_;
    return std::make_shared<SharedEvent>(backend_, backend_.flush(stream));
}

void MultiStream::applyAnalysis(uint32_t slotIndex, const SharedBindingAnalysis &analysis) {
    if (analysis.empty()) return;
    std::vector<std::pair<uint32_t, std::pair<uint64_t, EventPtr>>> events;
    for (const auto &entry : analysis.slices) {
        StreamSlot &origin = slot(entry.first);
        ++alignmentEvents_;
        events.push_back({entry.first, {origin.cursor, makeEvent(origin.stream)}});
    }
    StreamSlot &current = slot(slotIndex);
    for (auto &[origin, cursorEvent] : events) {
        current.lastSynced[origin] = cursorEvent.first;
        if (log::enabled(log::Subsystem::Streams, log::Level::Debug))
            log::write(log::Subsystem::Streams, log::Level::Debug,
                       "slot " + std::to_string(slotIndex) + " waits on slot " +
                           std::to_string(origin));
        backend_.waitEvent(current.stream, cursorEvent.second->get());
        ++streamWaits_;
    }
}

MultiStream::Resolved MultiStream::resolve(uint32_t slotIndex,
                                           std::span<const BindingUse> bindings) {
    Resolved r;
    r.slot = slotIndex;
    r.analysis = updateSharedBindings(slotIndex, bindings);
    applyAnalysis(slotIndex, r.analysis);
    StreamSlot &s = slot(slotIndex);
    ++s.cursor;
    r.stream = s.stream;
    r.cursor = s.cursor;
    return r;
}

void MultiStream::finish(Resolved &resolved) {
    if (resolved.analysis.empty()) return;
    // The shared buffers stay held by this slot until its next event (a read, a sync, a staging
    // chunk, or the bound on pending holds), which the GC thread then waits for. Flushing an
    // event here after every cross-stream operation, as seed 002 does, doubles the events of a
    // dependency for no extra safety.
    StreamSlot &s = slot(resolved.slot);
    for (auto &[origin, list] : resolved.analysis.slices)
        for (Hold &h : list) s.pendingHolds.push_back(std::move(h));
    resolved.analysis.slices.clear();
}

void MultiStream::releasePendingHolds(uint32_t slotIndex) {
    ++alignmentEvents_;
    flushWithEvent(slotIndex);
}

EventPtr MultiStream::flushWithEvent(uint32_t slotIndex) {
    StreamSlot &s = slot(slotIndex);
    EventPtr event = makeEvent(s.stream);
    if (!s.pendingHolds.empty()) {
        gc_.registerTask(event, std::move(s.pendingHolds));
        s.pendingHolds.clear();
    }
    return event;
}

void MultiStream::sync(uint32_t slotIndex) {
    StreamSlot &s = slot(slotIndex);
    EventPtr event = makeEvent(s.stream);
    event->wait();
    s.pendingHolds.clear();
}

} // namespace backplane::detail
