// KernelSource: a kernel described by name and one or more dialect variants; Dispatch: one launch.
#pragma once

#include <backplane/abi/plugin.h>
#include <backplane/buffer.hpp>
#include <backplane/device.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace backplane {

/// One way of writing a kernel, for one dialect. The core hands each device the first variant
/// whose dialect the device accepts (DeviceInfo::dialects), so list variants in preference order.
/// The descriptor stays open: a future portable dialect is one more variant kind.
struct KernelVariant {
    Dialect dialect = Dialect::Host;
    /// Function name in the source ("main" for GLSL, the extern "C" name for CUDA/HIP).
    std::string entryPoint;
    /// Source text (CUDA, HIP, GLSL) or binary bytes (SPIR-V). For Host: empty, or the key of
    /// hostData (what the data means), which the kernel cache compares in its place.
    std::string source;
    /// The native function of a Host variant (called once per workgroup); null otherwise.
    bp_host_kernel_fn hostFunction = nullptr;
    /// Host variants only: passed to the function as bp_host_kernel_context::user_data; kept
    /// alive by the core as long as it may call the function; needs a plugin of ABI 1.2. The
    /// kernel cache does not compare the pointer but `source` (the key): a variant rebuilt with
    /// equal key and other data reuses the kernel compiled first, and with it the first data.
    std::shared_ptr<const void> hostData;
    /// Compiler options ("-DTILE=16"); part of the cache key.
    std::vector<std::string> options;

    /// A text variant (CUDA, HIP, GLSL).
    static KernelVariant text(Dialect dialect, std::string entryPoint, std::string source,
                              std::vector<std::string> options = {}) {
        KernelVariant v;
        v.dialect = dialect;
        v.entryPoint = std::move(entryPoint);
        v.source = std::move(source);
        v.options = std::move(options);
        return v;
    }
    /// A binary variant (SPIR-V words as bytes).
    static KernelVariant binary(Dialect dialect, std::string entryPoint, const void *data,
                                size_t size) {
        KernelVariant v;
        v.dialect = dialect;
        v.entryPoint = std::move(entryPoint);
        v.source.assign(static_cast<const char *>(data), size);
        return v;
    }
    /// A Host variant: `function` is called once per workgroup, maybe concurrently.
    static KernelVariant host(bp_host_kernel_fn function, std::string entryPoint = "host") {
        KernelVariant v;
        v.dialect = Dialect::Host;
        v.entryPoint = std::move(entryPoint);
        v.hostFunction = function;
        return v;
    }
    /// A Host variant with data: `function` is called once per workgroup with `data.get()` as
    /// bp_host_kernel_context::user_data (an interpreter and its program, say). `key` names what
    /// the data means and goes into `source`: equal keys must mean equal data, since the cache
    /// compiles a (name, function, entry point, key) once. Needs a plugin of ABI 1.2; on an older
    /// one the variant is skipped.
    static KernelVariant host(bp_host_kernel_fn function, std::string entryPoint,
                              std::shared_ptr<const void> data, std::string key) {
        KernelVariant v = host(function, std::move(entryPoint));
        v.hostData = std::move(data);
        v.source = std::move(key);
        return v;
    }
};

/// What a kernel does with the buffer of one binding.
enum class BindingAccess : uint8_t { ReadWrite, Read, Write };

/// A kernel: a name (used in errors, logs and cache keys) and its variants. Plain value; the
/// server caches compiled kernels by a hash of the chosen variant, so a KernelSource may be
/// rebuilt per call at no compile cost.
struct KernelSource {
    std::string name;
    std::vector<KernelVariant> variants;
    /// What each binding does with its buffer, in binding order; bindings past the end of the
    /// list (all of them when it is empty) count as ReadWrite. It decides what a launch that
    /// fails leaves poisoned and what a launch that runs makes valid again (docs/streams.md,
    /// "What failed work leaves behind"): a Read binding must hold valid data, a Write binding
    /// is poisoned when the launch fails and valid again when it runs, a ReadWrite binding is
    /// both. lang::Kernel fills it from its input/output/inout declarations; declare it for a
    /// hand-written kernel so that its inputs stay readable after a failed launch and its outputs
    /// may be rewritten by it.
    std::vector<BindingAccess> access{};
};

/// Three launch dimensions (x, y, z) where a dimension not given is 1: `grid = {4}` is
/// {4, 1, 1} and `block = {16, 16}` is {16, 16, 1}, in every initializer and constructor form (a
/// plain std::array would make the missing ones 0, and a launch with a zero dimension runs
/// nothing). A 0 given on purpose stays 0: a launch with no workgroups is a documented no-op.
/// Indexes, iterates and compares like the std::array it is.
struct Dims3 : std::array<uint32_t, 3> {
    constexpr Dims3(uint32_t x = 1, uint32_t y = 1, uint32_t z = 1) noexcept
        : std::array<uint32_t, 3>{x, y, z} {}
    constexpr Dims3(const std::array<uint32_t, 3> &xyz) noexcept : std::array<uint32_t, 3>(xyz) {}
};

/// One launch. Bindings are passed in order; scalars are packed like a C struct with natural
/// alignment (see docs/streams.md ("Kernels") for how each dialect receives them).
struct Dispatch {
    /// Workgroups per dimension (ignored when gridBuffer is set); missing dimensions are 1.
    Dims3 grid;
    /// Optional indirect grid: three uint32 read at execution time from gridBuffer + gridOffset
    /// (needs BP_CAPABILITY_INDIRECT_DISPATCH; gridOffset a multiple of 4 with the 12 bytes
    /// inside gridBuffer, else Error(InvalidArgument)).
    Buffer gridBuffer;
    uint64_t gridOffset = 0;
    /// Threads per workgroup; missing dimensions are 1.
    Dims3 block;
    /// Buffers in binding order; each binds its whole slice.
    std::vector<Buffer> bindings;
    /// Packed scalar bytes; use scalar() to append.
    std::vector<std::byte> scalars;
    /// Dynamic shared memory per workgroup.
    uint32_t sharedMemoryBytes = 0;

    /// Appends one trivially copyable scalar at its natural alignment; returns *this.
    template <class T> Dispatch &scalar(const T &value) {
        static_assert(std::is_trivially_copyable_v<T>);
        size_t at = (scalars.size() + alignof(T) - 1) / alignof(T) * alignof(T);
        scalars.resize(at + sizeof(T));
        std::memcpy(scalars.data() + at, &value, sizeof(T));
        return *this;
    }
};

} // namespace backplane
