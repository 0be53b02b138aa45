// One opened GPU (CUDA or HIP through vendor.hpp): memory, streams, events, kernels.
#pragma once

#include "gpu_library.hpp"

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace backplane::gpu {

/// A profiler range (bpv::rangePush / rangePop: NVTX on CUDA) around one submission, named by
/// what it submits: the kernel's entry point, "copy host to device", ...
class ProfilerRange {
public:
    explicit ProfilerRange(const char *name) noexcept { bpv::rangePush(name); }
    ~ProfilerRange() { bpv::rangePop(); }
    ProfilerRange(const ProfilerRange &) = delete;
    ProfilerRange &operator=(const ProfilerRange &) = delete;
};

class GpuDevice;
class NcclLoader;
struct CommState;

/// The collectives recorded on a stream up to some point: per communicator, the sequence number
/// of the last one (gpu_collectives.cpp). A stream keeps its marks; an event copies its stream's
/// marks when it is recorded, so that its wait can tell whether one of those collectives was cut
/// short by an abort: the kernel NCCL then leaves behind completes, but its data is not valid.
/// So every event recorded after such a collective fails, until its communicator is destroyed.
/// Empty for streams that never saw a collective, so copying it costs nothing there.
class CollectiveMarks {
public:
    /// Remembers that `sequence` of `comm` was recorded (replaces an older mark of `comm`).
    void add(const std::shared_ptr<CommState> &comm, uint64_t sequence);
    /// Takes over the marks of an event this stream waits for (the dependent work saw its data).
    void merge(const CollectiveMarks &other);
    /// Forgets the communicators that were destroyed: work recorded after comm_destroy does not
    /// depend on them (a failure is reported by the events recorded before the destroy).
    void forgetDestroyed();
    /// Throws BP_ERROR_REMOTE when a marked collective did not complete before its communicator
    /// failed or was aborted.
    void check() const;
    bool empty() const noexcept { return marks_.empty(); }

private:
    std::vector<std::pair<std::shared_ptr<CommState>, uint64_t>> marks_;
};

/// One page: device memory (cuMemAlloc), pinned, mapped host memory (cuMemHostAlloc), or the
/// application's host memory registered with the device (cuMemHostRegister, ABI 1.3).
class GpuMemory : public sdk::Memory {
public:
    GpuMemory(GpuDevice &device, bp_memory_kind kind, uint64_t size);
    /// Registers [host, host + size) as a pinned page; the destructor unregisters it and never
    /// frees it. A range the driver refuses (overlapping a registered one) is
    /// BP_ERROR_INVALID_ARGUMENT.
    GpuMemory(GpuDevice &device, void *host, uint64_t size);
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
    bool registered_ = false;
};

/// A non-blocking vendor stream.
class GpuStream : public sdk::Stream {
public:
    explicit GpuStream(GpuDevice &device);
    ~GpuStream() override;
    GpuStream(const GpuStream &) = delete;
    GpuStream &operator=(const GpuStream &) = delete;
    bpv::Stream get() const noexcept { return stream_; }
    /// The collectives recorded on this stream (the ABI never calls one stream concurrently).
    CollectiveMarks &marks() noexcept { return marks_; }

private:
    GpuDevice &device_;
    bpv::Stream stream_{};
    CollectiveMarks marks_;
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
    /// The stream's collectives when the event was recorded; checked once the event completed.
    CollectiveMarks &marks() noexcept { return marks_; }

private:
    GpuDevice &device_;
    bool timing_;
    bpv::Event event_{};
    CollectiveMarks marks_;
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
    const std::string &name() const noexcept { return name_; }
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

/// Owns a captured, not instantiated vendor graph (the template of an instantiation or update).
class CapturedGraph {
public:
    explicit CapturedGraph(const bpv::Driver &driver) noexcept : driver_(driver) {}
    ~CapturedGraph();
    CapturedGraph(CapturedGraph &&other) noexcept
        : driver_(other.driver_), graph_(std::exchange(other.graph_, nullptr)) {}
    CapturedGraph &operator=(CapturedGraph &&) = delete;
    CapturedGraph(const CapturedGraph &) = delete;
    CapturedGraph &operator=(const CapturedGraph &) = delete;
    bpv::Graph get() const noexcept { return graph_; }
    /// Where endCapture writes the graph; empty before.
    bpv::Graph *out() noexcept { return &graph_; }

private:
    const bpv::Driver &driver_;
    bpv::Graph graph_{};
};

/// A recorded sequence (ABI 1.3, gpu_graph.cpp): the ops as the core handed them over, and the
/// executable vendor graph captured from them. The ops are kept so that graph_update can capture
/// the whole sequence again with one op replaced; the core keeps every page and kernel they name
/// alive while the graph exists.
class GpuGraph : public sdk::Graph {
public:
    GpuGraph(GpuDevice &device, std::vector<sdk::GraphOp> ops) noexcept
        : device_(device), ops_(std::move(ops)) {}
    ~GpuGraph() override;
    GpuGraph(const GpuGraph &) = delete;
    GpuGraph &operator=(const GpuGraph &) = delete;

private:
    friend class GpuDevice;
    GpuDevice &device_;
    /// The driver's executable graphs are not thread-safe: a launch and an update of the same
    /// graph on two threads take turns.
    std::mutex mutex_;
    std::vector<sdk::GraphOp> ops_;
    bpv::GraphExec exec_{};
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

    /// `nccl` is the plugin instance's collective library, opened on first use (shared with the
    /// plugin and its other devices).
    GpuDevice(GpuDeviceDescription description, std::shared_ptr<NcclLoader> nccl);
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

    // Recorded sequences through stream capture: gpu_graph.cpp.
    std::unique_ptr<sdk::Graph> createGraph(std::vector<sdk::GraphOp> &ops) override;
    void launchGraph(sdk::Stream &stream, sdk::Graph &graph) override;
    void updateGraph(sdk::Graph &graph, uint32_t index, sdk::GraphOp &op) override;

    /// Whether this device's context can read `src`'s memory directly (cuDeviceCanAccessPeer);
    /// the first positive answer also enables that access (cuCtxEnablePeerAccess), once per pair.
    bool peerAccess(sdk::Device &src) override;
    // Collectives through NCCL / RCCL: gpu_collectives.cpp.
    std::unique_ptr<sdk::Comm> createComm(const bp_comm_create_args &args) override;
    void collective(sdk::Stream &stream, sdk::Comm &comm, const bp_collective_args &args) override;
    /// ABI 1.3 host registration (cuMemHostRegister): a GpuMemory over the application's range.
    std::unique_ptr<sdk::Memory> registerHost(const bp_memory_register_args &args) override;

    /// Fails fast with BP_ERROR_DEVICE_LOST once lost; else makes the context current here.
    void enter() const;
    /// Throws the translated error of a failed call; a sticky one marks the device lost first.
    void check(const bpv::Call &call, bp_status fallback = BP_ERROR_INTERNAL) const;
    /// For destructors: makes the context current and ignores what fails (nothing to report).
    void enterForRelease() const noexcept;

    const bpv::Driver &driver() const noexcept { return driver_; }
    bpv::Event acquireEvent(bool timing);
    void recycleEvent(bpv::Event event, bool timing) noexcept;
    /// "CUDA device 1", for messages.
    std::string name() const;

private:
    /// Peer access of this device to one other device's memory, decided once.
    struct PeerAccess {
        bool access = false;
        std::string why; ///< when !access: the reason, for copy_peer's message
    };
    PeerAccess peerAccessTo(GpuDevice &source);
    /// `fault`: a kernel's fault (bpv::isFault), which also refuses later opens of the device in
    /// this process.
    void markLost(const std::string &why, bool fault = false) const;

    // The checks and the vendor call of each recorded operation, on a vendor stream: the ABI
    // entry points call them on the caller's stream, graph capture on captureStream_, so that a
    // graph holds exactly what the ordinary calls would have recorded. The context is current.
    void recordCopyHostToDevice(bpv::Stream stream, const bp_copy_host_to_device_args &args);
    void recordCopyDeviceToHost(bpv::Stream stream, const bp_copy_device_to_host_args &args);
    void recordCopyDeviceToDevice(bpv::Stream stream, const bp_copy_device_to_device_args &args);
    void recordFill(bpv::Stream stream, const bp_fill_args &args);
    void recordLaunch(bpv::Stream stream, const bp_launch_args &args);
    void recordOp(bpv::Stream stream, const sdk::GraphOp &op);
    /// Captures `ops` in order into a vendor graph. Throws an op's argument error as the ordinary
    /// call would, BP_ERROR_UNSUPPORTED when the driver cannot capture an op.
    CapturedGraph captureGraph(const std::vector<sdk::GraphOp> &ops);
    /// Throws when a graph call failed: device lost and out of memory as such, anything else as
    /// BP_ERROR_UNSUPPORTED (`what`: the ABI call), so that the core replays the ops instead.
    void checkGraphCall(const bpv::Call &call, const std::string &what) const;
    GpuGraph &ownGraph(sdk::Graph &graph, const char *what);

    const bpv::Driver &driver_;
    GpuDeviceDescription description_;
    std::shared_ptr<NcclLoader> nccl_;
    bpv::Context context_{};

    std::mutex peerMutex_;
    std::map<uint32_t, PeerAccess> peers_; // by the source's ordinal

    mutable std::atomic<bool> lost_{false};
    mutable std::mutex lostMutex_;
    mutable std::string lostReason_;

    std::mutex eventMutex_;
    std::vector<bpv::Event> freeEvents_[2]; // [timing]

    std::mutex captureMutex_;     // one capture at a time on captureStream_
    bpv::Stream captureStream_{}; // created on the first capture
};

} // namespace backplane::gpu
