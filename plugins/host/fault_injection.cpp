// Injected faults of the host plugin.
#include "fault_injection.hpp"

namespace backplane::host {

const char *toString(FaultOperation operation) noexcept {
    switch (operation) {
    case FaultOperation::Launch: return "launch";
    case FaultOperation::Copy: return "copy";
    case FaultOperation::Fill: return "fill";
    case FaultOperation::Collective: return "collective";
    case FaultOperation::Replay: return "replay";
    }
    return "?";
}

const char *toString(FaultClass faultClass) noexcept {
    return faultClass == FaultClass::Sticky ? "sticky" : "refused";
}

FaultPlan::FaultPlan(uint32_t device, const std::vector<InjectedFault> &all) : device_(device) {
    for (const InjectedFault &fault : all)
        if (fault.device == device) faults_.push_back(fault);
}

std::optional<FaultClass> FaultPlan::next(FaultOperation operation) noexcept {
    if (faults_.empty()) return std::nullopt;
    const uint64_t n =
        counts_[static_cast<size_t>(operation)].fetch_add(1, std::memory_order_relaxed) + 1;
    for (const InjectedFault &fault : faults_)
        if (fault.operation == operation && fault.nth == n) return fault.faultClass;
    return std::nullopt;
}

void LostState::mark(const std::string &why) {
    std::lock_guard lock(mutex_);
    if (lost_.load(std::memory_order_relaxed)) return;
    reason_ = why;
    lost_.store(true, std::memory_order_release);
}

std::string LostState::reason() const {
    std::lock_guard lock(mutex_);
    return reason_;
}

} // namespace backplane::host
