// Device times in traces (docs/trace.md, "Device times"): operations that ran between two timing
// events are drawn on their slot's device lane once their work completed.
#include "server/compute_server.hpp"

#include <chrono>

namespace backplane::detail {

void ComputeServer::registerDeviceFlusher() {
    if (deviceFlusherSet_) return;
    deviceFlusherSet_ = true;
    traceAddFlusher([server = weak_from_this()] {
        const auto alive = server.lock();
        if (alive) alive->drawDeviceSpans();
        return alive != nullptr;
    });
}

void ComputeServer::drawDeviceSpans(bool whenOldestDone) noexcept {
    try {
        std::vector<DeviceSpan> spans;
        {
            std::lock_guard lock(mutex_);
            if (deviceSpans_.empty()) return;
            // The issuing path's check: one event query while the oldest span still runs.
            if (whenOldestDone && !driver_->eventQuery(deviceSpans_.front().end.get())) return;
            spans.swap(deviceSpans_);
            pendingDeviceSpans_.store(0, std::memory_order_relaxed);
        }
        // Which spans completed is asked before the anchor is recorded: the anchor then comes
        // after all of them on the device, so every elapsed time below is positive.
        std::vector<DeviceSpan> done, later;
        for (DeviceSpan &span : spans)
            (driver_->eventQuery(span.end.get()) ? done : later).push_back(std::move(span));
        if (!done.empty() && tracingDevice()) {
            // The anchor: a timing event on a stream of its own (idle, so waiting for it waits
            // for nothing else), waited for; the host clock right after is its device time,
            // give or take the wait's wake-up.
            EventOwner anchor;
            {
                std::lock_guard lock(mutex_);
                if (!anchorStream_) anchorStream_ = driver_->createStream();
                anchor = driver_->flush(anchorStream_.get(), true, true);
                ++counters_.eventsCreated;
            }
            driver_->eventWait(anchor.get());
            const TraceClock::time_point anchorHost = TraceClock::now();
            const auto before = [&](bp_event *event) {
                return anchorHost -
                       std::chrono::nanoseconds(driver_->elapsedNs(event, anchor.get()));
            };
            for (const DeviceSpan &span : done)
                traceComplete(tracePid(), kTraceDeviceLane + span.slot, span.category, span.name,
                              before(span.start.get()), before(span.end.get()), {});
        }
        if (!later.empty() && tracingDevice()) {
            // Still running: back in front of the ones issued meanwhile (oldest first).
            std::lock_guard lock(mutex_);
            deviceSpans_.insert(deviceSpans_.begin(), std::make_move_iterator(later.begin()),
                                std::make_move_iterator(later.end()));
            pendingDeviceSpans_.store(deviceSpans_.size(), std::memory_order_relaxed);
        }
    } catch (const std::exception &) {
        // A trace never fails the program: spans whose events failed (a lost device) are
        // dropped.
    }
}

} // namespace backplane::detail
