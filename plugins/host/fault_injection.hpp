// Injected faults: the host plugin's "inject_faults" option makes chosen operations fail, so that
// every failure path of the core (sticky device loss, refused calls) runs in CI without a GPU.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace backplane::host {

/// The operations a fault can hit, counted per device index from the plugin's start.
enum class FaultOperation : uint8_t { Launch, Copy, Fill, Collective, Replay };
inline constexpr size_t kFaultOperationCount = 5;

/// Sticky: the operation is accepted and fails when it runs, and the open device is lost with
/// it (every later call and every later task on every stream fails with BP_ERROR_DEVICE_LOST),
/// as after a kernel's illegal address on a GPU. Refused: the call fails with BP_ERROR_LAUNCH
/// (a launch) or BP_ERROR_INTERNAL, nothing is queued and the device goes on, as after a
/// rejected launch.
enum class FaultClass : uint8_t { Sticky, Refused };

/// One entry of "inject_faults": {"device": 0, "operation": "launch", "nth": 3,
/// "class": "sticky"}: the nth operation of that kind on that device index (counted over every
/// open of it) fails once.
struct InjectedFault {
    uint32_t device = 0;
    FaultOperation operation = FaultOperation::Launch;
    uint64_t nth = 1;
    FaultClass faultClass = FaultClass::Sticky;
};

const char *toString(FaultOperation operation) noexcept;
const char *toString(FaultClass faultClass) noexcept;

/// The faults of one device index and its operation counters, shared by every open of it.
class FaultPlan {
public:
    FaultPlan(uint32_t device, const std::vector<InjectedFault> &all);
    /// Counts one operation; the class of the fault it must suffer, if any.
    std::optional<FaultClass> next(FaultOperation operation) noexcept;
    /// Whether any fault is planned here (a device without one never counts).
    bool empty() const noexcept { return faults_.empty(); }
    uint32_t device() const noexcept { return device_; }

private:
    uint32_t device_;
    std::vector<InjectedFault> faults_;
    std::array<std::atomic<uint64_t>, kFaultOperationCount> counts_{};
};

/// The lost state of one opened host device: set by a sticky fault, read by every call and by
/// the stream workers before each task. Shared with the streams, which may outlive the device.
class LostState {
public:
    bool lost() const noexcept { return lost_.load(std::memory_order_acquire); }
    /// Records the first reason; later ones are ignored.
    void mark(const std::string &why);
    /// "host:0 is lost since: ..." (empty while not lost).
    std::string reason() const;

private:
    std::atomic<bool> lost_{false};
    mutable std::mutex mutex_;
    std::string reason_;
};

} // namespace backplane::host
