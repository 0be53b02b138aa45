// DeviceInfo: what backplane knows about one device of one plugin, in C++ terms.
#pragma once

#include <array>
#include <cstdint>
#include <string>

namespace backplane {

enum class DeviceType { Other, DiscreteGpu, IntegratedGpu, VirtualGpu, Cpu };

/// Stable lower-case name: "discrete_gpu", "cpu"...
const char *toString(DeviceType type) noexcept;

/// Kernel source dialects (mirrors bp_dialect).
enum class Dialect { Cuda = 0, Hip = 1, Glsl = 2, Spirv = 3, Host = 4 };
const char *toString(Dialect dialect) noexcept;

/// One device as one plugin reports it. Plain value; copy freely.
struct DeviceInfo {
    std::string backend;  ///< plugin name: "cuda", "vulkan", "hip", "host"
    uint32_t index = 0;   ///< the plugin's device index
    std::string name;
    std::string vendor;
    std::string arch;
    std::string driverVersion;
    std::string pciBusId; ///< "" when none
    std::array<uint8_t, 16> uuid{};
    bool hasUuid = false;
    DeviceType type = DeviceType::Other;
    uint64_t memoryBytes = 0;
    uint64_t maxAllocationBytes = 0;
    std::array<uint32_t, 3> maxBlockSize{};
    uint32_t maxBlockThreads = 0;
    std::array<uint32_t, 3> maxGridSize{};
    uint32_t maxSharedMemoryBytes = 0;
    uint32_t subgroupSize = 0;
    uint32_t bindingAlignment = 1;
    uint32_t maxBindings = 0;
    uint32_t maxScalarBytes = 0;
    uint32_t maxStreams = 1;
    uint32_t dialects = 0;     ///< mask of 1u << Dialect
    uint32_t capabilities = 0; ///< mask of BP_CAPABILITY_* (see backplane/abi/plugin.h)
    /// The collective engine when BP_CAPABILITY_COLLECTIVES is set ("nccl 2.28.9", "gloo
    /// 0.5.0"), otherwise why there is none; "" from plugins older than ABI 1.1.
    std::string collectives;

    /// "backend:index", e.g. "cuda:0": the id selectors and reports use.
    std::string id() const { return backend + ":" + std::to_string(index); }
    /// Canonical UUID text "xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"; "" when hasUuid is false.
    std::string uuidString() const;
    bool accepts(Dialect d) const noexcept { return (dialects >> static_cast<int>(d)) & 1u; }
};

} // namespace backplane
