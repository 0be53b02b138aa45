// One opened GPU (CUDA or HIP through vendor.hpp): memory, streams, events, kernels.
#pragma once

#include "gpu_library.hpp"

#include <atomic>
#include <mutex>
#include <string>
#include <vector>

namespace backplane::gpu {

class GpuDevice;

/// One page: device memory (cuMemAlloc) or pinned, mapped host memory (cuMemHostAlloc).
class GpuMemory : public sdk::Memory {
public:
    GpuMemory(GpuDevice &device, bp_memory_kind kind, uint64_t size);
    ~GpuMemory() override;
    GpuMemory(const GpuMemory &) = delete;
    GpuMemory &operator=(const GpuMemory &) = delete;

    /// Device address of byte `offset`; throws BP_ERROR_INVALID_ARGUMENT when [offset,
    /// offset + size) leaves the page.
    bpv::DevicePtr at(uint64_t offset, uint64_t size) const;
    void *host() const noexcept { return host_; }
    GpuDevice &device() const noexcept { return device_; }

private:
    GpuDevice &device_;
    bp_memory_kind kind_;
    uint64_t size_;
    bpv::DevicePtr ptr_{};
    void *host_ = nullptr;
};

/// A non-blocking vendor stream.
class GpuStream : public sdk::Stream {
public:
    explicit GpuStream(GpuDevice &device);
    ~GpuStream() override;
    GpuStream(const GpuStream &) = delete;
    GpuStream &operator=(const GpuStream &) = delete;
    bpv::Stream get() const noexcept { return stream_; }

private:
    GpuDevice &device_;
    bpv::Stream stream_{};
};

/// A recorded vendor event, taken from and returned to the device's pool.
class GpuEvent : public sdk::Event {
public:
    GpuEvent(GpuDevice &device, bool timing);
    ~GpuEvent() override;
    GpuEvent(const GpuEvent &) = delete;
    GpuEvent &operator=(const GpuEvent &) = delete;
    bpv::Event get() const noexcept { return event_; }
    bool timing() const noexcept { return timing_; }

private:
    GpuDevice &device_;
    bool timing_;
    bpv::Event event_{};
};

/// A loaded module and its entry point, with the entry point's parameter sizes where the driver
/// can tell them (CUDA 12.4+ drivers: cuFuncGetParamInfo; never on HIP).
class GpuKernel : public sdk::Kernel {
public:
    GpuKernel(GpuDevice &device, const void *image, const std::string &entryPoint);
    ~GpuKernel() override;
    GpuKernel(const GpuKernel &) = delete;
    GpuKernel &operator=(const GpuKernel &) = delete;
    bpv::Function function() const noexcept { return function_; }
    /// Raises the kernel's dynamic shared memory limit once to at least `bytes`.
    void allowSharedMemory(uint32_t bytes);
    /// Throws BP_ERROR_LAUNCH naming the kernel, its parameter sizes and the launch's bindings
    /// and scalar bytes when the launch does not match the parameters (one pointer per binding,
    /// then one struct of exactly scalar_size bytes when scalar_size > 0). Does nothing when the
    /// driver could not tell the parameters.
    void checkLaunch(const bp_launch_args &args) const;

private:
    GpuDevice &device_;
    std::string name_;
    bpv::Module module_{};
    bpv::Function function_{};
    std::atomic<uint32_t> sharedAllowed_{48 * 1024};
    bool parametersKnown_ = false;
    std::vector<size_t> parameterSizes_; ///< in the device-side parameter layout
};

/// Static description of one device, read without a context (see gpu_plugin.cpp).
struct GpuDeviceDescription {
    bpv::DeviceId id{};
    uint32_t ordinal = 0;
    std::string arch;
    bp_device_info info{};
};

/// One opened device on its primary context. Every entry point first fails fast when the device
/// was lost, then makes the context current on the calling thread.
class GpuDevice : public sdk::Device {
public:
    /// Largest binding count of a launch (kernel parameters: 64 pointers + 4 KiB of scalars).
    static constexpr uint32_t kMaxBindings = 64;
    static constexpr uint32_t kMaxScalarBytes = 4096;

    explicit GpuDevice(GpuDeviceDescription description);
    ~GpuDevice() override;

    std::unique_ptr<sdk::Memory> allocate(const bp_memory_allocate_args &args,
                                          void **mapped) override;
    std::unique_ptr<sdk::Stream> createStream(const bp_stream_create_args &args) override;
    std::unique_ptr<sdk::Event> flush(sdk::Stream &stream, const bp_flush_args &args,
                                      bool wantEvent) override;
    void waitEvent(sdk::Stream &stream, sdk::Event &event) override;
    bool eventWait(sdk::Event &event, uint64_t timeoutNs) override;
    bool eventQuery(sdk::Event &event) override;
    uint64_t elapsedNs(sdk::Event &start, sdk::Event &end) override;

    void copyHostToDevice(sdk::Stream &stream, const bp_copy_host_to_device_args &args) override;
    void copyDeviceToHost(sdk::Stream &stream, const bp_copy_device_to_host_args &args) override;
    void copyDeviceToDevice(sdk::Stream &stream,
                            const bp_copy_device_to_device_args &args) override;
    void fill(sdk::Stream &stream, const bp_fill_args &args) override;
    void copyPeer(sdk::Stream &stream, sdk::Device &source,
                  const bp_copy_device_to_device_args &args) override;

    void compile(const bp_kernel_compile_args &args, sdk::CompileOutput &out) override;
    std::unique_ptr<sdk::Kernel> load(const bp_kernel_load_args &args) override;
    void launch(sdk::Stream &stream, const bp_launch_args &args) override;

    uint64_t nativeHandle(bp_native_kind kind, const void *object) override;

    /// Fails fast with BP_ERROR_DEVICE_LOST once lost; else makes the context current here.
    void enter() const;
    /// Throws the translated error of a failed call; a sticky one marks the device lost first.
    void check(const bpv::Call &call, bp_status fallback = BP_ERROR_INTERNAL) const;
    /// For destructors: makes the context current and ignores what fails (nothing to report).
    void enterForRelease() const noexcept;

    const bpv::Driver &driver() const noexcept { return driver_; }
    bpv::Event acquireEvent(bool timing);
    void recycleEvent(bpv::Event event, bool timing) noexcept;

private:
    void markLost(const std::string &why) const;

    const bpv::Driver &driver_;
    GpuDeviceDescription description_;
    bpv::Context context_{};

    mutable std::atomic<bool> lost_{false};
    mutable std::mutex lostMutex_;
    mutable std::string lostReason_;

    std::mutex eventMutex_;
    std::vector<bpv::Event> freeEvents_[2]; // [timing]
};

} // namespace backplane::gpu
