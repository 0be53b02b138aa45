// What failed work leaves behind: the byte ranges a failed operation was to write are poisoned,
// and reading them throws Error(Poisoned) naming the failure until they are written again
// (docs/streams.md, "What failed work leaves behind").
#include "server/compute_server.hpp"

#include <backplane/error.hpp>

#include <chrono>
#include <ctime>

namespace backplane::detail {

std::string utcTimeOfDay() {
    const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
    std::tm utc{};
    ::gmtime_r(&now, &utc);
    char when[32];
    std::strftime(when, sizeof when, "%H:%M:%S UTC", &utc);
    return when;
}

void refuseDependent(const Poison::Hit &hit, std::span<const SliceRange> written,
                     const std::string &what) {
    for (const SliceRange &w : written) w.slice->poison.mark(w.begin, w.end, hit.why);
    throw Error(ErrorCode::Poisoned,
                what + ": bytes " + std::to_string(hit.begin) + " to " + std::to_string(hit.end) +
                    " of a Buffer's allocation hold no valid data: " + *hit.why +
                    ". Write them again (write, fill, copy, or a launch that writes them) before "
                    "reading them");
}

void ComputeServer::poisonWritten(std::span<const SliceRange> written, uint32_t slot,
                                  const std::string &operation, const std::exception &e) const {
    // A lost device's memory is unreadable as a whole (DeviceLost); poisoning adds nothing.
    // (The failure may be another device's: a copy from a lost device poisons this one's.)
    if (lost_.load(std::memory_order_acquire) || driver_->lost()) return;
    const auto why = std::make_shared<const std::string>(
        operation + " on " + info().id() + " (open #" + std::to_string(openNumber_) +
        ", stream slot " + std::to_string(slot) + ") failed at " + utcTimeOfDay() +
        " before writing them: " + e.what());
    for (const SliceRange &w : written) w.slice->poison.mark(w.begin, w.end, why);
}

Poison::Hit ComputeServer::poisonedIn(const Buffer &buffer, uint64_t size) {
    if (!buffer.slice_) return {};
    const SliceRange read[] = {{buffer.slice_.get(), buffer.offset(), buffer.offset() + size}};
    return firstPoisoned(read);
}

void ComputeServer::poisonLike(const Buffer &buffer, uint64_t size, const PoisonReason &why) {
    if (buffer.slice_ && size != 0)
        buffer.slice_->poison.mark(buffer.offset(), buffer.offset() + size, why);
}

void ComputeServer::poisonAfter(const Buffer &buffer, uint64_t size, StreamId stream,
                                const std::string &operation, const std::exception &e) {
    if (!buffer.slice_ || size == 0) return;
    const SliceRange written[] = {{buffer.slice_.get(), buffer.offset(), buffer.offset() + size}};
    poisonWritten(written, slotOf(stream), operation, e);
}

} // namespace backplane::detail
