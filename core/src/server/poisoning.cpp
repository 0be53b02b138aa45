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

} // namespace backplane::detail
