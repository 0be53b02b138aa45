// One opened host device: memory pages, streams, host-dialect kernels, in host memory and threads.
#pragma once

#include "gloo/gloo_loader.hpp"
#include "host_compiler.hpp"
#include "host_options.hpp"
#include "host_stream.hpp"
#include "workgroup_pool.hpp"

#include <backplane/abi/plugin_sdk.hpp>

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace backplane::host {

class HostDevice;

/// A page of host memory (every bp_memory_kind is the same aligned host allocation), or the
/// application's memory registered as a pinned page (`owned` false: never freed, not counted).
class HostMemory final : public sdk::Memory {
public:
    HostMemory(HostDevice &owner, void *data, uint64_t size, bool owned = true);
    /// Frees an owned allocation and returns its bytes to the device's budget.
    ~HostMemory() override;
    HostMemory(const HostMemory &) = delete;
    HostMemory &operator=(const HostMemory &) = delete;

    unsigned char *data() const noexcept { return data_; }
    uint64_t size() const noexcept { return size_; }
    const HostDevice &owner() const noexcept { return owner_; }
    /// Registered memory: called once the device recorded the range (the destructor then
    /// forgets it there; a registration refused before that leaves the device's list alone).
    void markRegistered() noexcept { registered_ = true; }

private:
    HostDevice &owner_;
    unsigned char *data_;
    uint64_t size_;
    bool owned_;
    bool registered_ = false;
};

/// A loaded host-dialect kernel: a function pointer of this process and the caller's user_data
/// (ABI 1.2; borrowed, never dereferenced: passed to every call of the function); or a compiled
/// C++ kernel (ABI 1.5), whose object `code` keeps loaded, and every launch with it too.
class HostKernel final : public sdk::Kernel {
public:
    HostKernel(bp_host_kernel_fn fn, const void *userData, std::string entryPoint,
               std::shared_ptr<const LoadedObject> code = nullptr)
        : function_(fn), userData_(userData), entryPoint_(std::move(entryPoint)),
          code_(std::move(code)) {}

    bp_host_kernel_fn function() const noexcept { return function_; }
    const void *userData() const noexcept { return userData_; }
    const std::string &entryPoint() const noexcept { return entryPoint_; }
    const std::shared_ptr<const LoadedObject> &code() const noexcept { return code_; }

private:
    bp_host_kernel_fn function_;
    const void *userData_;
    std::string entryPoint_;
    std::shared_ptr<const LoadedObject> code_;
};

/// A replay list (ABI 1.3 graph): the ops, checked once and turned into the tasks a stream runs.
/// A replay is one task that runs them in order. An update replaces the list (copy on write), so
/// a replay already queued keeps the list it was issued with.
class HostGraph final : public sdk::Graph {
public:
    struct Step {
        bp_graph_op_kind kind = BP_GRAPH_OP_LAUNCH;
        bp_kernel *kernel = nullptr; ///< launches: what an update must keep
        uint32_t block[3] = {1, 1, 1};
        uint32_t bindingCount = 0;
        std::function<void()> run;   ///< empty for an op of 0 bytes
    };
    explicit HostGraph(std::vector<Step> steps)
        : steps_(std::make_shared<const std::vector<Step>>(std::move(steps))) {}
    const std::shared_ptr<const std::vector<Step>> &steps() const noexcept { return steps_; }
    void replace(std::shared_ptr<const std::vector<Step>> steps) { steps_ = std::move(steps); }

private:
    std::shared_ptr<const std::vector<Step>> steps_;
};

/// One opened host device. Thread-safe per the ABI rules: allocation accounting is atomic, the
/// workgroup pool is shared by all streams, everything else is immutable after construction.
class HostDevice final : public sdk::Device {
public:
    /// `info` is what device_info reported; `plugin` identifies the plugin instance (compared,
    /// never dereferenced: devices of one instance are peers); `options` are the plugin's (the
    /// collectives' addresses); `gloo` runs the collectives (shared with the plugin, which
    /// loads it when first needed); `allocated` counts the bytes allocated on this device index,
    /// shared by every open of it, so that each open is an independent client while the
    /// "memory_bytes" budget holds for the device as a whole.
    /// `compiler` compiles the C++ kernels (shared with the plugin).
    /// `faults` are the injected faults of this device index (shared by its opens).
    HostDevice(const bp_device_info &info, const void *plugin, const HostOptions &options,
               std::shared_ptr<GlooLoader> gloo, std::shared_ptr<std::atomic<uint64_t>> allocated,
               std::shared_ptr<const HostCompiler> compiler, std::shared_ptr<FaultPlan> faults);
    ~HostDevice() override;
    HostDevice(const HostDevice &) = delete;
    HostDevice &operator=(const HostDevice &) = delete;

    std::unique_ptr<sdk::Memory> allocate(const bp_memory_allocate_args &args,
                                          void **mapped) override;
    void *map(sdk::Memory &memory) override;

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

    std::unique_ptr<sdk::Graph> createGraph(std::vector<sdk::GraphOp> &ops) override;
    void launchGraph(sdk::Stream &stream, sdk::Graph &graph) override;
    void updateGraph(sdk::Graph &graph, uint32_t index, sdk::GraphOp &op) override;

    /// ABI 1.3 host registration: host memory is what this device copies from anyway, so the
    /// page only wraps the application's range (a copy from it is one memcpy, as from a pinned
    /// page); it is never freed and not counted against memory_bytes.
    std::unique_ptr<sdk::Memory> registerHost(const bp_memory_register_args &args) override;

    /// True for every host device of the same plugin instance (also this one): copy_peer works
    /// between them and their events are plain counters that any host stream can wait for.
    bool peerAccess(sdk::Device &src) override;
    /// Collectives run by the Gloo module; BP_ERROR_UNSUPPORTED, saying why, without it.
    std::unique_ptr<sdk::Comm> createComm(const bp_comm_create_args &args) override;
    void collective(sdk::Stream &stream, sdk::Comm &comm, const bp_collective_args &args) override;

    /// Returns `bytes` to the allocation budget; called by ~HostMemory.
    void releaseBytes(uint64_t bytes) noexcept;
    /// Forgets a registered range; called by ~HostMemory of registered memory.
    void unregisterRange(const void *data) noexcept;

private:
    /// Throws BP_ERROR_DEVICE_LOST once a sticky fault hit this open of the device.
    void enter() const;
    /// Counts `operation` against the injected faults: a refused one throws here; for a sticky
    /// one, returns the task to queue instead of the operation's (it loses the device when it
    /// runs); else an empty task. `what` names the operation (called only for a fault).
    std::function<void()> injectedFault(FaultOperation operation,
                                        const std::function<std::string()> &what);
    HostStream &ownStream(sdk::Stream &stream) const;
    HostMemory &ownMemory(bp_memory *memory, const char *what) const;
    /// What a stream runs for each operation, checked like the call (empty for 0 bytes): the
    /// ordinary calls submit it, graphs keep it.
    using Task = std::function<void()>;
    Task hostToDeviceTask(const bp_copy_host_to_device_args &args) const;
    Task deviceToHostTask(const bp_copy_device_to_host_args &args) const;
    Task copyTask(const HostMemory &source, const bp_copy_device_to_device_args &args,
                  const char *operation) const;
    Task fillTask(const bp_fill_args &args) const;
    Task launchTask(const bp_launch_args &args);
    HostGraph::Step graphStep(const sdk::GraphOp &op);

    const bp_device_info info_;
    const void *plugin_;
    const HostOptions options_;
    const std::shared_ptr<GlooLoader> gloo_;
    const std::shared_ptr<const HostCompiler> compiler_;
    const bool async_;
    std::shared_ptr<std::atomic<uint64_t>> allocated_;
    std::atomic<uint64_t> &allocatedBytes_; ///< *allocated_
    WorkgroupPool pool_;
    std::shared_ptr<FaultPlan> faults_;
    /// Set by a sticky fault; shared with this open's streams.
    std::shared_ptr<LostState> lost_ = std::make_shared<LostState>();
    /// Registered application ranges (start -> size): a range may be registered once.
    std::mutex registeredMutex_;
    std::map<uintptr_t, uint64_t> registered_;
};

} // namespace backplane::host
