// MultiStream alignment (seed 002) and the GC thread that frees cross-stream holds after fences.
#include "stream/multi_stream.hpp"

#include <backplane/log.hpp>

#include <algorithm>

namespace backplane::detail {

namespace {
// While some fence is pending, the GC waits on the oldest for at most this long, then checks
// the others by query, so a slow stream does not hold back releases of the others.
constexpr uint64_t kGcSliceNs = 1'000'000;
// Fibonacci hashing of an address into a table of 2^bits slots: the product's high bits, which
// depend on all of the address (objects of one size lie at a fixed stride).
size_t addressHash(const void *object, unsigned bits) {
    return static_cast<size_t>((reinterpret_cast<uintptr_t>(object) * 0x9E3779B97F4A7C15ull) >>
                               (64 - bits));
}

} // namespace

GcThread::GcThread(uint32_t slots, CompletionTracker &tracker,
                   std::function<void(const std::string &)> onFailure)
    : slots_(slots == 0 ? 1 : slots), tracker_(tracker), onFailure_(std::move(onFailure)),
      perSlot_(new std::atomic<uint32_t>[slots_]) {
    for (uint32_t i = 0; i < slots_; ++i) perSlot_[i].store(0, std::memory_order_relaxed);
    thread_ = std::thread([this] { run(); });
}

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
        perSlot_[fence.slot % slots_].fetch_add(1, std::memory_order_relaxed);
        tasks_.push_back({nextTicket_++, std::move(fence), std::move(holds),
                          tracing() ? TraceClock::now() : TraceClock::time_point{}});
    }
    wake_.notify_one();
}

void GcThread::throttle(uint32_t slot) {
    std::atomic<uint32_t> &queued = perSlot_[slot % slots_];
    if (queued.load(std::memory_order_relaxed) <= kMaxQueued) return; // the launch path
    std::unique_lock lock(mutex_);
    progress_.wait(lock, [&] {
        return queued.load(std::memory_order_relaxed) <= kMaxQueued / 2 || stop_;
    });
}

bool GcThread::handledBefore(uint64_t ticket) const {
    if (workingMin_ != 0 && workingMin_ < ticket) return false;
    for (const Task &t : tasks_)
        if (t.ticket < ticket) return false;
    return true;
}

void GcThread::drain() {
    std::unique_lock lock(mutex_);
    const uint64_t ticket = nextTicket_;
    progress_.wait(lock, [&] { return handledBefore(ticket); });
}

uint64_t GcThread::released() const {
    std::lock_guard lock(mutex_);
    return released_;
}

size_t GcThread::queued() const {
    std::lock_guard lock(mutex_);
    return tasks_.size() + working_;
}

void GcThread::run() {
    // The thread's own list: tasks move here under the lock and are queried, waited for and
    // released without it, so registering (under the engine lock) never waits for a query.
    std::deque<Task> mine;
    std::unique_lock lock(mutex_);
    for (;;) {
        if (mine.empty()) wake_.wait(lock, [&] { return stop_ || !tasks_.empty(); });
        for (Task &t : tasks_) mine.push_back(std::move(t));
        tasks_.clear();
        if (mine.empty()) break; // stop_ and nothing left: every hold was honoured
        working_ = mine.size();
        workingMin_ = mine.front().ticket;
        lock.unlock();

        std::vector<Task> done;
        std::vector<std::pair<Task, std::string>> failed;
        for (auto it = mine.begin(); it != mine.end();) {
            try {
                if (!it->fence.event->query()) {
                    ++it;
                    continue;
                }
                tracker_.complete(it->fence.slot, it->fence.cursor);
                done.push_back(std::move(*it));
            } catch (const std::exception &e) {
                failed.emplace_back(std::move(*it), e.what());
            }
            it = mine.erase(it);
        }
        for (auto &[task, why] : failed) {
            // The work may still be running or in an unknown state: the memory it used must not
            // be reused. Report it (the device is marked lost) and keep the holds.
            log::write(log::Subsystem::Streams, log::Level::Error,
                       "a stream's work failed; its memory is kept: " + why);
            if (onFailure_) onFailure_(why);
        }
        size_t releasedHolds = 0;
        const TraceSpan span;
        TraceClock::time_point oldest = span.start;
        for (Task &task : done) {
            releasedHolds += task.holds.size();
            perSlot_[task.fence.slot % slots_].fetch_sub(1, std::memory_order_relaxed);
            if (task.registered != TraceClock::time_point{}) oldest = std::min(oldest, task.registered);
        }
        const size_t fences = done.size();
        done.clear(); // drops the holds and the events outside the lock
        if (span && fences != 0)
            traceComplete(tracePid_.load(std::memory_order_relaxed), kTraceGcLane, "gc",
                          "release holds", span.start,
                          {{"holds", releasedHolds},
                           {"fences", fences},
                           {"held_us", static_cast<uint64_t>(
                                           std::chrono::duration_cast<std::chrono::microseconds>(
                                               span.start - oldest)
                                               .count())}});
        if (releasedHolds == 0 && failed.empty() && !mine.empty()) {
            // Nothing complete: wait a little on the oldest, then look at all of them again.
            try {
                mine.front().fence.event->waitFor(kGcSliceNs);
            } catch (const std::exception &) {
                // reported by the next query
            }
        }

        lock.lock();
        released_ += releasedHolds;
        for (auto &[task, why] : failed) {
            perSlot_[task.fence.slot % slots_].fetch_sub(1, std::memory_order_relaxed);
            for (Hold &h : task.holds) quarantined_.push_back(std::move(h));
        }
        working_ = mine.size();
        workingMin_ = mine.empty() ? 0 : mine.front().ticket;
        progress_.notify_all();
    }
    working_ = 0;
    workingMin_ = 0;
    progress_.notify_all();
}

bool HeldSet::insert(const void *object) {
    if (object == nullptr) return false;
    if ((size_ + 1) * 2 > capacity_) grow();
    for (size_t i = addressHash(object, bits_);; i = (i + 1) & (capacity_ - 1)) {
        if (table_[i] == object) return false;
        if (table_[i] == nullptr) {
            table_[i] = object;
            ++size_;
            return true;
        }
    }
}

void HeldSet::grow() {
    const unsigned bits = capacity_ == 0 ? 6 : bits_ + 1;
    const size_t capacity = size_t{1} << bits;
    auto table = std::make_unique<const void *[]>(capacity); // zeroed: all free
    for (size_t j = 0; j < capacity_; ++j) {
        if (table_[j] == nullptr) continue;
        size_t i = addressHash(table_[j], bits);
        while (table[i] != nullptr) i = (i + 1) & (capacity - 1);
        table[i] = table_[j];
    }
    table_ = std::move(table);
    capacity_ = capacity;
    bits_ = bits;
}

void HeldSet::clear() {
    if (size_ == 0) return;
    std::fill_n(table_.get(), capacity_, nullptr);
    size_ = 0;
}

MultiStream::MultiStream(std::shared_ptr<EventBackend> backend, uint32_t maxStreams,
                         CompletionTracker &tracker,
                         std::function<void(const std::string &)> onFailure)
    : backend_(std::move(backend)), maxStreams_(maxStreams == 0 ? 1 : maxStreams),
      tracker_(tracker), onFailure_(onFailure), gc_(maxStreams_, tracker, std::move(onFailure)) {}

MultiStream::~MultiStream() {
    // Holds go to the GC with one last fence per slot; what a failed device keeps is dropped
    // only after the streams are destroyed (destroying a stream waits for its work).
    std::vector<Hold> late;
    for (uint32_t index = 0; index < slots_.size(); ++index) {
        if (!slots_[index] || slots_[index]->pendingHolds.empty()) continue;
        StreamSlot &s = *slots_[index];
        try {
            flush(index);
        } catch (const std::exception &) {
            for (Hold &h : s.pendingHolds) late.push_back(std::move(h));
            s.pendingHolds.clear();
        }
    }
    gc_.drain();
    for (auto &s : slots_) {
        if (!s) continue;
        s->lastFence = {};
        backend_->destroyStream(s->stream);
    }
}

StreamSlot &MultiStream::createSlot(uint32_t index) {
    auto created = std::make_unique<StreamSlot>();
    created->stream = backend_->createStream();
    if (index >= slots_.size()) slots_.resize(index + 1);
    slots_[index] = std::move(created);
    return *slots_[index];
}

std::vector<uint32_t> MultiStream::activeSlots() const {
    std::vector<uint32_t> out;
    for (uint32_t index = 0; index < slots_.size(); ++index)
        if (slots_[index]) out.push_back(index);
    return out;
}

SharedBindingAnalysis MultiStream::updateSharedBindings(uint32_t slotIndex,
                                                        std::span<const StreamUse> uses) {
    SharedBindingAnalysis analysis;
    StreamSlot &current = slot(slotIndex);
    for (const StreamUse &u : uses) {
        if (!mustWait(current, slotIndex, u)) continue;
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
    const TraceSpan span; // the origins' flushes and the device-side waits on them
    boost::container::small_vector<Fence, 4> fences;
    for (const auto &[origin, cursor] : analysis.origins) {
        ++alignmentEvents_;
        fences.push_back(flush(origin));
    }
    StreamSlot &current = slot(slotIndex);
    for (const Fence &fence : fences) {
        if (fence.slot >= current.lastSynced.size()) current.lastSynced.resize(fence.slot + 1, 0);
        current.lastSynced[fence.slot] = fence.cursor;
        if (log::enabled(log::Subsystem::Streams, log::Level::Debug))
            log::write(log::Subsystem::Streams, log::Level::Debug,
                       "slot " + std::to_string(slotIndex) + " waits on slot " +
                           std::to_string(fence.slot));
        backend_->waitEvent(current.stream, fence.event->get());
        ++streamWaits_;
        if (span)
            traceComplete(tracePid_, slotIndex, "wait",
                          "wait for slot " + std::to_string(fence.slot), span.start,
                          {{"origin_slot", fence.slot}, {"origin_cursor", fence.cursor}});
    }
}

MultiStream::Resolved MultiStream::resolve(uint32_t slotIndex, std::span<const StreamUse> uses) {
    StreamSlot &s = slot(slotIndex);
    // Most operations need no wait: the analysis (and its map) only when one does.
    for (const StreamUse &u : uses)
        if (mustWait(s, slotIndex, u)) {
            applyAnalysis(slotIndex, updateSharedBindings(slotIndex, uses));
            break;
        }
    ++s.cursor;
    return {slotIndex, s.stream, s.cursor};
}

void MultiStream::keep(uint32_t slotIndex, StreamSlot &s, Hold hold) {
    // One allocation per fence's worth of holds (the vector goes to the GC with the fence).
    if (s.pendingHolds.capacity() == 0) s.pendingHolds.reserve(kMaxPendingHolds + 1);
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

size_t MultiStream::flushHolds() {
    size_t flushed = 0;
    for (uint32_t index = 0; index < slots_.size(); ++index) {
        if (!slots_[index] || slots_[index]->pendingHolds.empty()) continue;
        flush(index);
        ++flushed;
    }
    return flushed;
}

void MultiStream::pollCompletion() {
    for (uint32_t index = 0; index < slots_.size(); ++index) {
        if (!slots_[index]) continue;
        StreamSlot &s = *slots_[index];
        if (!s.lastFence || tracker_.completed(index) >= s.lastFence.cursor) continue;
        try {
            if (s.lastFence.event->query()) tracker_.complete(index, s.lastFence.cursor);
        } catch (const std::exception &e) {
            if (onFailure_) onFailure_(e.what());
        }
    }
}

} // namespace backplane::detail
