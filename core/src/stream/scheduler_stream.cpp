// SchedulerMultiStream (seed 004): per-slot task queues, flush on cross-stream use, batching.
#include "stream/scheduler_stream.hpp"

#include <backplane/log.hpp>

#include <algorithm>

namespace backplane::detail {

SchedulerMultiStream::SchedulerMultiStream(SchedulerBackend &backend, uint32_t maxStreams,
                                           uint32_t maxTasks, SchedulerMode mode)
    : backend_(backend), maxStreams_(maxStreams == 0 ? 1 : maxStreams),
      maxTasks_(maxTasks == 0 ? 1 : maxTasks), mode_(mode) {}

SchedulerMultiStream::~SchedulerMultiStream() {
    for (auto &[index, s] : slots_) {
        s.tasks.clear(); // never executed: drop the holds
        backend_.destroyStream(s.stream);
    }
}

SchedulerMultiStream::Slot &SchedulerMultiStream::slotState(uint32_t index) {
    auto it = slots_.find(index);
    if (it != slots_.end()) return it->second;
    Slot s;
    s.stream = backend_.createStream();
    return slots_.emplace(index, std::move(s)).first->second;
}

void *SchedulerMultiStream::stream(uint32_t slot) { return slotState(slot).stream; }

size_t SchedulerMultiStream::queued(uint32_t slot) const {
    auto it = slots_.find(slot);
    return it == slots_.end() ? 0 : it->second.tasks.size();
}

void SchedulerMultiStream::registerTask(uint32_t slot, SchedulerTask task,
                                        std::span<const uint32_t> bindingSlots) {
    std::vector<uint32_t> toFlush;
    for (uint32_t origin : bindingSlots)
        if (origin != slot && queued(origin) != 0) toFlush.push_back(origin);
    if (!toFlush.empty()) {
        if (log::enabled(log::Subsystem::Streams, log::Level::Debug))
            log::write(log::Subsystem::Streams, log::Level::Debug,
                       "executing " + std::to_string(toFlush.size()) +
                           " queue(s) before a task on slot " + std::to_string(slot));
        executeStreams(std::move(toFlush));
    }
    Slot &current = slotState(slot);
    current.tasks.push_back(std::move(task));
    if (current.tasks.size() >= maxTasks_) executeStreams({slot});
}

void SchedulerMultiStream::executeAll() {
    std::vector<uint32_t> all;
    for (const auto &[index, s] : slots_)
        if (!s.tasks.empty()) all.push_back(index);
    executeStreams(std::move(all));
}

void SchedulerMultiStream::executeStreams(std::vector<uint32_t> slots) {
    std::vector<uint32_t> unique;
    for (uint32_t s : slots)
        if (std::find(unique.begin(), unique.end(), s) == unique.end()) unique.push_back(s);
    std::vector<std::pair<uint32_t, std::vector<SchedulerTask>>> schedules;
    for (uint32_t s : unique) {
        Slot &state = slotState(s);
        if (state.tasks.empty()) continue;
        schedules.emplace_back(s, std::move(state.tasks));
        state.tasks.clear();
    }
    if (schedules.empty()) return;
    ++batches_;
    if (mode_ == SchedulerMode::Sequential) {
        for (auto &[s, tasks] : schedules) {
            void *stream = slotState(s).stream;
            for (SchedulerTask &t : tasks) t.run(stream);
            backend_.submit(stream);
        }
        return;
    }
    // Interleave: submit the other streams first (their earlier work), then merge the queues
    // round robin onto the first schedule's stream.
    for (size_t i = 1; i < schedules.size(); ++i) backend_.submit(slotState(schedules[i].first).stream);
    void *stream = slotState(schedules.front().first).stream;
    size_t longest = 0;
    for (auto &entry : schedules) longest = std::max(longest, entry.second.size());
    for (size_t i = 0; i < longest; ++i)
        for (auto &entry : schedules)
            if (i < entry.second.size()) entry.second[i].run(stream);
    backend_.submit(stream);
}

} // namespace backplane::detail
