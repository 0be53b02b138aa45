// DeviceInfo helpers and the conversion from the ABI's bp_device_info.
#include "device_info.hpp"

#include "plugin/plugin_library.hpp"

#include <backplane/error.hpp>

#include <algorithm>
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
    case Dialect::Cpp: return "cpp";
    }
    return "unknown";
}

const char *toString(ElementType type) noexcept {
    switch (type) {
    case ElementType::Bool: return "bool";
    case ElementType::I8: return "i8";
    case ElementType::U8: return "u8";
    case ElementType::I16: return "i16";
    case ElementType::U16: return "u16";
    case ElementType::I32: return "i32";
    case ElementType::U32: return "u32";
    case ElementType::I64: return "i64";
    case ElementType::U64: return "u64";
    case ElementType::F16: return "f16";
    case ElementType::BF16: return "bf16";
    case ElementType::F32: return "f32";
    case ElementType::F64: return "f64";
    }
    return "unknown";
}

namespace {

/// The types of `mask` by name; a run of three or more integer types in enumeration order is
/// shortened to "first..last" ("i8..u64"). "none" for an empty mask.
std::string typeList(uint32_t mask) {
    constexpr int kFirstInteger = static_cast<int>(ElementType::I8);
    constexpr int kLastInteger = static_cast<int>(ElementType::U64);
    const auto has = [&](int t) { return ((mask >> t) & 1u) != 0; };
    std::string out;
    const auto add = [&](const std::string &word) { out += (out.empty() ? "" : " ") + word; };
    for (int t = 0; t < kElementTypeCount; ++t) {
        if (!has(t)) continue;
        int last = t;
        if (t >= kFirstInteger && t <= kLastInteger)
            while (last + 1 <= kLastInteger && has(last + 1)) ++last;
        if (last - t >= 2) {
            add(std::string(toString(static_cast<ElementType>(t))) + ".." +
                toString(static_cast<ElementType>(last)));
            t = last;
        } else {
            add(toString(static_cast<ElementType>(t)));
        }
    }
    return out.empty() ? "none" : out;
}

} // namespace

std::string KernelFeatures::describe() const {
    std::string vectors;
    for (const uint32_t n : {2u, 4u, 8u})
        if (loadsVectorsOf(n)) vectors += (vectors.empty() ? "" : " ") + std::to_string(n);
    // Shapes grouped by their types, in the order the plugin listed them:
    // "16x16x16 32x8x16 f16*f16+f32, 16x16x16 bf16*bf16+f32".
    std::string matrix;
    std::vector<bool> done(matrixShapes.size(), false);
    for (size_t i = 0; i < matrixShapes.size(); ++i) {
        if (done[i]) continue;
        const MatrixShape &first = matrixShapes[i];
        std::string group;
        for (size_t j = i; j < matrixShapes.size(); ++j) {
            const MatrixShape &s = matrixShapes[j];
            if (done[j] || s.a != first.a || s.b != first.b || s.c != first.c) continue;
            done[j] = true;
            group += std::to_string(s.m) + "x" + std::to_string(s.n) + "x" +
                     std::to_string(s.k) + " ";
        }
        matrix += (matrix.empty() ? "" : ", ") + group + toString(first.a) + "*" +
                  toString(first.b) + "+" + toString(first.c);
    }
    return "types " + typeList(storage) + "; native " + typeList(arithmetic) + "; atomic add " +
           typeList(atomicAdd) + "; atomic bits " + typeList(atomicBits) + "; vectors " +
           (vectors.empty() ? "none" : vectors) + "; matrix " +
           (matrix.empty() ? "none" : matrix);
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

constexpr uint32_t typeBit(ElementType t) { return 1u << static_cast<unsigned>(t); }
constexpr uint32_t kKnownTypes = (1u << kElementTypeCount) - 1;
constexpr uint32_t kKnownVectorWidths = (1u << 2) | (1u << 4) | (1u << 8);

/// The 1.4 fields of `in`, which the plugin filled (struct_size covers them): bits of types the
/// core does not know are dropped, and so are matrix shapes it could not use.
KernelFeatures kernelFeaturesOf(const bp_device_info &in) {
    KernelFeatures out;
    out.storage = in.element_storage & kKnownTypes;
    out.arithmetic = in.element_arithmetic & kKnownTypes;
    out.atomicAdd = in.element_atomic_add & kKnownTypes;
    out.atomicBits = in.element_atomic_bits & kKnownTypes;
    out.vectorWidths = in.vector_widths & kKnownVectorWidths;
    const uint32_t count = std::min<uint32_t>(in.matrix_shape_count, BP_MAX_MATRIX_SHAPES);
    for (uint32_t i = 0; i < count; ++i) {
        const bp_matrix_shape &s = in.matrix_shapes[i];
        if (s.m == 0 || s.n == 0 || s.k == 0 || s.a >= kElementTypeCount ||
            s.b >= kElementTypeCount || s.c >= kElementTypeCount)
            continue;
        out.matrixShapes.push_back({s.m, s.n, s.k, static_cast<ElementType>(s.a),
                                    static_cast<ElementType>(s.b),
                                    static_cast<ElementType>(s.c)});
    }
    return out;
}
} // namespace

KernelFeatures kernelFeaturesBeforeAbi14() {
    KernelFeatures out;
    out.storage = typeBit(ElementType::Bool) | typeBit(ElementType::I32) |
                  typeBit(ElementType::U32) | typeBit(ElementType::F32);
    out.arithmetic = out.storage;
    out.atomicAdd = typeBit(ElementType::I32) | typeBit(ElementType::U32);
    out.atomicBits = out.atomicAdd;
    return out;
}

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
    // The core runs a plugin's collectives only on asynchronous streams (a collective blocks its
    // stream until the peers arrive; the scheduler streams of a synchronous device would hold
    // the engine up meanwhile), so a Communicator over such a device uses the staged engine.
    // Report that, not the engine the plugin would run through its C ABI.
    if ((out.capabilities & BP_CAPABILITY_COLLECTIVES) != 0 &&
        (out.capabilities & BP_CAPABILITY_ASYNC_STREAMS) == 0) {
        out.capabilities &= ~static_cast<uint32_t>(BP_CAPABILITY_COLLECTIVES);
        out.collectives = "the plugin's " + out.collectives +
                          " needs asynchronous streams and this device's are synchronous; a "
                          "Communicator over it uses the staged engine";
    }
    // ABI 1.4 appended the kernel features: a plugin whose struct ends before them gets what
    // ABI 1.3 kernels had (PluginLibrary::deviceInfo also cuts struct_size for tables < 1.4).
    out.features = in.struct_size >= kDeviceInfoSize14 ? kernelFeaturesOf(in)
                                                       : kernelFeaturesBeforeAbi14();
    if (in.struct_size >= kDeviceInfoSize15)
        out.kernelCompiler = fixedString(in.kernel_compiler, sizeof(in.kernel_compiler));
    return out;
}

} // namespace detail
} // namespace backplane
