// DeviceInfo: what backplane knows about one device of one plugin, in C++ terms.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace backplane {

enum class DeviceType { Other, DiscreteGpu, IntegratedGpu, VirtualGpu, Cpu };

/// Stable lower-case name: "discrete_gpu", "cpu"...
const char *toString(DeviceType type) noexcept;

/// Kernel source dialects (mirrors bp_dialect).
enum class Dialect { Cuda = 0, Hip = 1, Glsl = 2, Spirv = 3, Host = 4, Cpp = 5 };
const char *toString(Dialect dialect) noexcept;

/// Element types of the kernel language; the values are bp_element_type's (ABI 1.4), so bit
/// (1u << t) of a KernelFeatures mask stands for type t.
enum class ElementType : uint8_t {
    Bool, I8, U8, I16, U16, I32, U32, I64, U64, F16, BF16, F32, F64
};

/// The number of ElementType values.
inline constexpr int kElementTypeCount = 13;

/// Stable lower-case name: "bool", "i8", "u8", ..., "f16", "bf16", "f32", "f64" ("unknown" for a
/// value outside the enumeration).
const char *toString(ElementType type) noexcept;

/// One shape of a device's matrix units: D (m x n, type c) = A (m x k, type a) * B (k x n,
/// type b) + C (m x n, type c).
struct MatrixShape {
    uint16_t m = 0, n = 0, k = 0;
    ElementType a{}, b{}, c{};

    friend bool operator==(const MatrixShape &, const MatrixShape &) = default;
};

/// What kernels may use on a device (ABI 1.4; docs/plugin-abi.md "Kernel features"), as its
/// plugin reports it. Masks hold bit (1u << ElementType); the core keeps only bits of known
/// types. A plugin older than ABI 1.4 gets what ABI 1.3 kernels had: storage and arithmetic of
/// bool, i32, u32, f32; atomic add and atomic bits on i32 and u32; no vectors, no matrix units.
/// Plain value; copy freely.
struct KernelFeatures {
    uint32_t storage = 0;      ///< types kernels may keep in buffers (loads and stores)
    uint32_t arithmetic = 0;   ///< types computed natively (or exactly as if: see plugin.h)
    uint32_t atomicAdd = 0;    ///< types with atomicAdd on buffers and shared memory
    uint32_t atomicBits = 0;   ///< types with atomic min, max, and, or, xor, exchange
    uint32_t vectorWidths = 0; ///< bit n: vector loads and stores of n elements (n = 2, 4, 8)
    std::vector<MatrixShape> matrixShapes; ///< the matrix units' shapes; empty: none

    /// Kernels may keep `t` in buffers.
    bool stores(ElementType t) const noexcept { return has(storage, t); }
    /// The device computes in `t` natively (or exactly as if it did); otherwise kernels compute
    /// in a wider type and round.
    bool computes(ElementType t) const noexcept { return has(arithmetic, t); }
    /// atomicAdd works on `t`.
    bool addsAtomically(ElementType t) const noexcept { return has(atomicAdd, t); }
    /// Atomic min, max, and, or, xor and exchange work on `t`.
    bool atomicBitsOn(ElementType t) const noexcept { return has(atomicBits, t); }
    /// Vector loads and stores of `n` elements work (n = 2, 4 or 8).
    bool loadsVectorsOf(uint32_t n) const noexcept {
        return (n == 2 || n == 4 || n == 8) && ((vectorWidths >> n) & 1u) != 0;
    }
    /// One line for `backplane devices`, e.g. "types bool i8..u64 f16 bf16 f32 f64; native bool
    /// i32 u32 f32; atomic add i32 u32 f32; atomic bits i32 u32; vectors 2 4 8; matrix
    /// 16x16x16 f16*f16+f32".
    std::string describe() const;

    friend bool operator==(const KernelFeatures &, const KernelFeatures &) = default;

private:
    static bool has(uint32_t mask, ElementType t) noexcept {
        return static_cast<unsigned>(t) < 32 && ((mask >> static_cast<unsigned>(t)) & 1u) != 0;
    }
};

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
    /// What kernels may use on the device (ABI 1.4; defaults of ABI 1.3 for older plugins).
    KernelFeatures features;
    /// The compiler of Dialect::Cpp kernels when the device accepts them, otherwise why not
    /// (ABI 1.5; "" from older plugins and from plugins that compile no host code).
    std::string kernelCompiler;

    /// "backend:index", e.g. "cuda:0": the id selectors and reports use.
    std::string id() const { return backend + ":" + std::to_string(index); }
    /// Canonical UUID text "xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"; "" when hasUuid is false.
    std::string uuidString() const;
    bool accepts(Dialect d) const noexcept { return (dialects >> static_cast<int>(d)) & 1u; }
};

} // namespace backplane
