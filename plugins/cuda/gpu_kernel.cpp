// Kernels on one GPU: compile (NVRTC / hiprtc to CUBIN / code object), load, launch.
#include "gpu_compile.hpp"
#include "gpu_device.hpp"

namespace backplane::gpu {
namespace {

bool acceptsDialect(bp_dialect dialect) {
    return static_cast<uint32_t>(dialect) < 32 && (bpv::kDialects & (1u << dialect)) != 0;
}

void requireDialect(bp_dialect dialect, const char *operation) {
    if (!acceptsDialect(dialect))
        throw sdk::Error(BP_ERROR_UNSUPPORTED,
                         std::string(operation) + ": the " + bpv::kPluginName +
                             " plugin does not accept dialect " + std::to_string(dialect) +
                             (bpv::kDialects == 1u ? " (only 'cuda')" : " (only 'cuda' and 'hip')"));
}

} // namespace

GpuKernel::GpuKernel(GpuDevice &device, const void *image, const std::string &entryPoint)
    : device_(device) {
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
    return std::make_unique<GpuKernel>(*this, args.binary, args.entry_point);
}

void GpuDevice::launch(sdk::Stream &stream, const bp_launch_args &args) {
    enter();
    if (args.grid_memory != nullptr)
        sdk::unsupported("kernel_launch with a grid read from memory (indirect dispatch: "
                         "the vendor API has no indirect launch)");
    if (args.binding_count > kMaxBindings || args.scalar_size > kMaxScalarBytes)
        throw sdk::Error(BP_ERROR_INVALID_ARGUMENT,
                         "kernel_launch: at most " + std::to_string(kMaxBindings) +
                             " bindings and " + std::to_string(kMaxScalarBytes) +
                             " scalar bytes");
    auto &kernel = sdk::as<GpuKernel>(args.kernel);
    // Parameters: one device pointer per binding (offset applied), then the scalar bytes by
    // value as one struct parameter. The driver copies them during the call.
    bpv::DevicePtr pointers[kMaxBindings];
    void *params[kMaxBindings + 1];
    uint32_t count = 0;
    for (; count < args.binding_count; ++count) {
        const bp_binding &b = args.bindings[count];
        pointers[count] = sdk::as<GpuMemory>(b.memory).at(b.offset, b.size);
        params[count] = &pointers[count];
    }
    if (args.scalar_size > 0) params[count++] = const_cast<void *>(args.scalars);
    if (args.shared_memory_bytes > 0) kernel.allowSharedMemory(args.shared_memory_bytes);
    check(bpv::launch(driver_, kernel.function(), args.grid, args.block, args.shared_memory_bytes,
                      sdk::as<GpuStream>(stream).get(), count > 0 ? params : nullptr),
          BP_ERROR_LAUNCH);
}

} // namespace backplane::gpu
