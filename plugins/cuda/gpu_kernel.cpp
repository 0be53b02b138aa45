// Kernels on one GPU: compile (NVRTC / hiprtc to CUBIN / code object), load, launch.
#include "gpu_compile.hpp"
#include "gpu_device.hpp"

#include <cstring>

namespace backplane::gpu {
namespace {

bool acceptsDialect(const bp_dialect &dialect) {
    const uint32_t value = sdk::rawValue(dialect);
    return value < 32 && (bpv::kDialects & (1u << value)) != 0;
}

void requireDialect(const bp_dialect &dialect, const char *operation) {
    if (!acceptsDialect(dialect))
        throw sdk::Error(sdk::refusedDialectStatus(dialect),
                         std::string(operation) + ": the " + bpv::kPluginName +
                             " plugin does not accept dialect " +
                             std::to_string(sdk::rawValue(dialect)) +
                             (bpv::kDialects == 1u ? " (only 'cuda')" : " (only 'cuda' and 'hip')"));
}

/// "no parameters", "1 parameter of 8 bytes", "3 parameters of 8, 8 and 12 bytes".
std::string describeParameters(const std::vector<size_t> &sizes) {
    if (sizes.empty()) return "no parameters";
    constexpr size_t kListed = 16;
    std::string text =
        std::to_string(sizes.size()) + (sizes.size() == 1 ? " parameter of " : " parameters of ");
    for (size_t i = 0; i < sizes.size() && i < kListed; ++i) {
        if (i > 0) text += i + 1 == sizes.size() ? " and " : ", ";
        text += std::to_string(sizes[i]);
    }
    if (sizes.size() > kListed) text += ", ...";
    return text + " bytes";
}

/// Little-endian integer of `bytes` bytes at `offset` of `image` (the caller checked the range).
uint64_t readLe(const unsigned char *image, size_t offset, size_t bytes) {
    uint64_t value = 0;
    for (size_t i = 0; i < bytes; ++i) value |= uint64_t{image[offset + i]} << (8 * i);
    return value;
}

/// Why `image` of `size` bytes is not a module the driver may read. The driver call takes no
/// size: a CUBIN (ELF) or fatbin whose headers reach past `size`, or PTX text without its NUL,
/// would be read past the caller's buffer. "" when the image is whole.
std::string moduleImageProblem(const unsigned char *image, size_t size) {
    const auto within = [size](uint64_t offset, uint64_t length) {
        return offset <= size && length <= size - offset;
    };
    if (size >= 4 && std::memcmp(image, "\x7f" "ELF", 4) == 0) {
        if (size < 64 || image[4] != 2) return "an ELF image shorter than its 64-bit header";
        const uint64_t phoff = readLe(image, 0x20, 8), shoff = readLe(image, 0x28, 8);
        const uint64_t phentsize = readLe(image, 0x36, 2), phnum = readLe(image, 0x38, 2);
        const uint64_t shentsize = readLe(image, 0x3a, 2), shnum = readLe(image, 0x3c, 2);
        if (!within(phoff, phentsize * phnum)) return "an ELF image cut inside its program headers";
        if (!within(shoff, shentsize * shnum)) return "an ELF image cut inside its section headers";
        for (uint64_t i = 0; i < shnum && shentsize >= 0x28; ++i) {
            const size_t header = static_cast<size_t>(shoff + i * shentsize);
            constexpr uint64_t kNoBits = 8; // SHT_NOBITS: no bytes in the file
            if (readLe(image, header + 4, 4) == kNoBits) continue;
            if (!within(readLe(image, header + 0x18, 8), readLe(image, header + 0x20, 8)))
                return "an ELF image cut inside section " + std::to_string(i);
        }
        return {};
    }
    constexpr uint64_t kFatbinMagic = 0xBA55ED50;
    if (size >= 4 && readLe(image, 0, 4) == kFatbinMagic) {
        if (size < 16) return "a fatbin shorter than its header";
        if (!within(readLe(image, 6, 2), readLe(image, 8, 8))) return "a fatbin cut short";
        return {};
    }
    if (std::memchr(image, '\0', size) == nullptr)
        return "neither a CUBIN, a fatbin nor NUL-terminated PTX text";
    return {};
}

} // namespace

GpuKernel::GpuKernel(GpuDevice &device, const void *image, const std::string &entryPoint)
    : device_(device), name_(entryPoint) {
    device.check(bpv::moduleLoad(device.driver(), &module_, image), BP_ERROR_INVALID_ARGUMENT);
    const bpv::Call found = bpv::moduleFunction(device.driver(), &function_, module_,
                                                entryPoint.c_str());
    if (!found.ok()) {
        bpv::moduleUnload(device.driver(), module_);
        if (found.result == bpv::kNotFound)
            throw sdk::Error(BP_ERROR_NOT_FOUND,
                             "kernel entry point '" + entryPoint +
                                 "' is not in the module; declare it extern \"C\" __global__ so "
                                 "its name is not mangled",
                             found.result);
        device.check(found);
    }
    // Kernel parameters take at most 32 KiB, so a driver that answers never runs past the end.
    constexpr size_t kMaxParameters = 32 * 1024;
    for (size_t index = 0; index < kMaxParameters; ++index) {
        size_t size = 0;
        const bpv::ParamQuery query = bpv::paramInfo(device.driver(), function_, index, &size);
        if (query == bpv::ParamQuery::Unknown) break;
        if (query == bpv::ParamQuery::PastEnd) {
            parametersKnown_ = true;
            break;
        }
        parameterSizes_.push_back(size);
    }
    if (!parametersKnown_) parameterSizes_.clear();
}

void GpuKernel::checkLaunch(const bp_launch_args &args) const {
    if (!parametersKnown_) return;
    // The launch convention: one device pointer per binding, then the scalar bytes as one
    // struct by value. The driver copies each parameter's size from the pointer it is given:
    // a parameter the launch does not supply, or a struct larger than the scalars, is read
    // from past the caller's arguments.
    const size_t given = args.binding_count + (args.scalar_size > 0 ? 1 : 0);
    bool matches = parameterSizes_.size() == given;
    for (size_t i = 0; matches && i < args.binding_count; ++i)
        matches = parameterSizes_[i] == sizeof(bpv::DevicePtr);
    if (matches && args.scalar_size > 0) matches = parameterSizes_.back() == args.scalar_size;
    if (matches) return;
    std::vector<size_t> launched(args.binding_count, sizeof(bpv::DevicePtr));
    if (args.scalar_size > 0) launched.push_back(args.scalar_size);
    // The caller's arguments, not the binary: INVALID_ARGUMENT keeps the core from evicting a
    // cached binary over it (only LAUNCH and COMPILE are the binary's).
    throw sdk::Error(
        BP_ERROR_INVALID_ARGUMENT,
        "kernel_launch of '" + name_ + "': the kernel takes " +
            describeParameters(parameterSizes_) + "; the launch gives " +
            std::to_string(args.binding_count) +
            (args.binding_count == 1 ? " binding and " : " bindings and ") +
            std::to_string(args.scalar_size) + " scalar bytes, i.e. " +
            describeParameters(launched) + " (one " + std::to_string(sizeof(bpv::DevicePtr)) +
            "-byte pointer per binding, then one struct of all scalar bytes; a C struct's size "
            "includes its tail padding)");
}

GpuKernel::~GpuKernel() {
    device_.enterForRelease();
    bpv::moduleUnload(device_.driver(), module_);
}

void GpuKernel::allowSharedMemory(uint32_t bytes) {
    if (bytes <= sharedAllowed_.load(std::memory_order_relaxed)) return;
    device_.check(bpv::allowDynamicShared(device_.driver(), function_, bytes), BP_ERROR_LAUNCH);
    sharedAllowed_.store(bytes, std::memory_order_relaxed);
}

void GpuDevice::compile(const bp_kernel_compile_args &args, sdk::CompileOutput &out) {
    requireDialect(args.dialect, "kernel_compile");
    if (args.source == nullptr || args.entry_point == nullptr)
        throw sdk::Error(BP_ERROR_INVALID_ARGUMENT, "kernel_compile: source and entry point needed");
    CompileRequest request;
    request.source = std::string_view(static_cast<const char *>(args.source), args.source_size);
    request.entryPoint = args.entry_point;
    request.arch = description_.arch;
    for (uint32_t i = 0; i < args.option_count; ++i)
        if (args.options != nullptr && args.options[i] != nullptr)
            request.options.emplace_back(args.options[i]);
    // Compilation needs no context and works on a lost device too: the blob is still valid.
    compileSource(gpu::rtc(), request, out);
}

std::unique_ptr<sdk::Kernel> GpuDevice::load(const bp_kernel_load_args &args) {
    enter();
    requireDialect(args.dialect, "kernel_load");
    if (args.binary == nullptr || args.binary_size == 0 || args.entry_point == nullptr)
        throw sdk::Error(BP_ERROR_INVALID_ARGUMENT, "kernel_load: binary and entry point needed");
    if (const std::string problem =
            moduleImageProblem(static_cast<const unsigned char *>(args.binary), args.binary_size);
        !problem.empty())
        throw sdk::Error(BP_ERROR_INVALID_ARGUMENT,
                         "kernel_load of '" + std::string(args.entry_point) + "': the " +
                             std::to_string(args.binary_size) + "-byte blob is " + problem +
                             "; pass a blob kernel_compile produced, whole");
    return std::make_unique<GpuKernel>(*this, args.binary, args.entry_point);
}

void GpuDevice::launch(sdk::Stream &stream, const bp_launch_args &args) {
    enter();
    recordLaunch(sdk::as<GpuStream>(stream).get(), args);
}

void GpuDevice::recordLaunch(bpv::Stream stream, const bp_launch_args &args) {
    if (args.grid_memory != nullptr)
        sdk::unsupported("kernel_launch with a grid read from memory (indirect dispatch: "
                         "the vendor API has no indirect launch)");
    if (args.binding_count > kMaxBindings || args.scalar_size > kMaxScalarBytes)
        throw sdk::Error(BP_ERROR_INVALID_ARGUMENT,
                         "kernel_launch: at most " + std::to_string(kMaxBindings) +
                             " bindings and " + std::to_string(kMaxScalarBytes) +
                             " scalar bytes");
    if (args.binding_count > 0 && args.bindings == nullptr)
        throw sdk::Error(BP_ERROR_INVALID_ARGUMENT, "kernel_launch: binding_count is " +
                                                        std::to_string(args.binding_count) +
                                                        " but bindings is NULL");
    if (args.scalar_size > 0 && args.scalars == nullptr)
        throw sdk::Error(BP_ERROR_INVALID_ARGUMENT, "kernel_launch: scalar_size is " +
                                                        std::to_string(args.scalar_size) +
                                                        " but scalars is NULL");
    auto &kernel = sdk::as<GpuKernel>(args.kernel);
    kernel.checkLaunch(args);
    // Parameters: one device pointer per binding (offset applied), then the scalar bytes by
    // value as one struct parameter. The driver copies them during the call.
    bpv::DevicePtr pointers[kMaxBindings];
    void *params[kMaxBindings + 1];
    uint32_t count = 0;
    for (; count < args.binding_count; ++count) {
        const bp_binding &b = args.bindings[count];
        if (b.offset % description_.info.binding_alignment != 0)
            throw sdk::Error(BP_ERROR_INVALID_ARGUMENT,
                             "kernel_launch: binding " + std::to_string(count) + " offset " +
                                 std::to_string(b.offset) + " is not a multiple of " +
                                 std::to_string(description_.info.binding_alignment));
        pointers[count] = sdk::as<GpuMemory>(b.memory).at(b.offset, b.size);
        params[count] = &pointers[count];
    }
    if (args.scalar_size > 0) params[count++] = const_cast<void *>(args.scalars);
    // An empty grid is a launch of nothing (as on the other plugins); the driver would refuse it.
    if (args.grid[0] == 0 || args.grid[1] == 0 || args.grid[2] == 0) return;
    if (args.shared_memory_bytes > 0) kernel.allowSharedMemory(args.shared_memory_bytes);
    const ProfilerRange range(kernel.name().c_str());
    check(bpv::launch(driver_, kernel.function(), args.grid, args.block, args.shared_memory_bytes,
                      stream, count > 0 ? params : nullptr),
          BP_ERROR_LAUNCH);
}

} // namespace backplane::gpu
