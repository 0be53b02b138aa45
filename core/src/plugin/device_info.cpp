// DeviceInfo helpers and the conversion from the ABI's bp_device_info.
#include "device_info.hpp"

#include "plugin/plugin_library.hpp"

#include <backplane/error.hpp>

#include <cstdio>
#include <cstring>

namespace backplane {

const char *toString(DeviceType type) noexcept {
    switch (type) {
    case DeviceType::DiscreteGpu: return "discrete_gpu";
    case DeviceType::IntegratedGpu: return "integrated_gpu";
    case DeviceType::VirtualGpu: return "virtual_gpu";
    case DeviceType::Cpu: return "cpu";
    case DeviceType::Other: break;
    }
    return "other";
}

const char *toString(Dialect dialect) noexcept {
    switch (dialect) {
    case Dialect::Cuda: return "cuda";
    case Dialect::Hip: return "hip";
    case Dialect::Glsl: return "glsl";
    case Dialect::Spirv: return "spirv";
    case Dialect::Host: return "host";
    }
    return "unknown";
}

std::string DeviceInfo::uuidString() const {
    if (!hasUuid) return {};
    char text[37];
    char *p = text;
    for (size_t i = 0; i < uuid.size(); ++i) {
        if (i == 4 || i == 6 || i == 8 || i == 10) *p++ = '-';
        std::snprintf(p, 3, "%02x", uuid[i]);
        p += 2;
    }
    *p = '\0';
    return text;
}

namespace detail {

namespace {
/// A field the plugin filled: cut at its size when it has no NUL, made safe to print and JSON.
std::string fixedString(const char *text, size_t capacity) { return fieldText(text, capacity); }
} // namespace

DeviceInfo toDeviceInfo(const std::string &backend, uint32_t index, const bp_device_info &in) {
    constexpr uint64_t kMaxBindingAlignment = 1u << 20;
    DeviceInfo out;
    out.backend = backend;
    out.index = index;
    out.name = fixedString(in.name, sizeof(in.name));
    out.vendor = fixedString(in.vendor, sizeof(in.vendor));
    out.arch = fixedString(in.arch, sizeof(in.arch));
    out.driverVersion = fixedString(in.driver_version, sizeof(in.driver_version));
    out.pciBusId = fixedString(in.pci_bus_id, sizeof(in.pci_bus_id));
    std::memcpy(out.uuid.data(), in.uuid, out.uuid.size());
    out.hasUuid = in.has_uuid != 0;
    out.type = in.type <= BP_DEVICE_TYPE_CPU ? static_cast<DeviceType>(in.type) : DeviceType::Other;
    out.memoryBytes = in.memory_bytes;
    out.maxAllocationBytes = in.max_allocation_bytes;
    for (int i = 0; i < 3; ++i) {
        out.maxBlockSize[i] = in.max_block_size[i];
        out.maxGridSize[i] = in.max_grid_size[i];
    }
    out.maxBlockThreads = in.max_block_threads;
    out.maxSharedMemoryBytes = in.max_shared_memory_bytes;
    out.subgroupSize = in.subgroup_size;
    // The pools align with it: a value that is not a power of two, or absurdly large, would
    // break their arithmetic, so such a device is refused (the loader skips it, with this text).
    if (in.binding_alignment != 0 &&
        ((in.binding_alignment & (in.binding_alignment - 1)) != 0 ||
         in.binding_alignment > kMaxBindingAlignment))
        throw Error(ErrorCode::Internal,
                    backend + " device_info(" + std::to_string(index) + ") reports a binding "
                    "alignment of " + std::to_string(in.binding_alignment) +
                    " bytes; it must be a power of two of at most " +
                    std::to_string(kMaxBindingAlignment),
                    backend);
    out.bindingAlignment = in.binding_alignment == 0 ? 1 : in.binding_alignment;
    out.maxBindings = in.max_bindings;
    out.maxScalarBytes = in.max_scalar_bytes;
    out.maxStreams = in.max_streams == 0 ? 1 : in.max_streams;
    out.dialects = in.dialects;
    out.capabilities = in.capabilities;
    out.collectives = fixedString(in.collectives, sizeof(in.collectives));
    return out;
}

} // namespace detail
} // namespace backplane
