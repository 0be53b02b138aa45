// The Vulkan plugin's classes: instance and physical-device discovery, the opened device, and
// its memory pages, streams (batched command buffers on timeline semaphores), events and kernels.
#pragma once

#include "vulkan_api.hpp"
#include "vulkan_features.hpp"

#include <array>
#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

namespace backplane::vulkan {

class VulkanPlugin;

/// Everything the probe learned about one usable physical device.
struct PhysicalDevice {
    VkPhysicalDevice handle = VK_NULL_HANDLE;
    VkPhysicalDeviceProperties properties{};
    VkPhysicalDeviceMemoryProperties memory{};
    bp_device_info info{};
    uint32_t queueFamily = 0;
    uint32_t queueCount = 1;
    uint32_t timestampValidBits = 0; ///< of the chosen queue family; 0 = no timestamps
    uint32_t maxStorageBufferRange = 0;
    bool pushDescriptor = false; ///< VK_KHR_push_descriptor is there (and not disabled)
    uint32_t batchCommands = 64;  ///< commands per submit (plugin option "batch_commands")
    bool shaderCopy = false;      ///< device->device copies through a compute shader
    /// shaderSignedZeroInfNanPreserveFloat32: generated GLSL may ask the compiler to keep
    /// signed zeros, infinities and NaNs (0 * inf stays NaN instead of folding to 0).
    bool preserveFloatSpecials = false;
    /// The extensions that add kernel features (enabled at open when their features are).
    FeatureExtensions featureExtensions;
};

/// The plugin's VkInstance and what it found. Created on the first probe.
class Instance {
public:
    /// Loads the loader and creates the instance; throws NO_DRIVER / NO_DEVICE with the reason.
    Instance(const VulkanPlugin &plugin, bool validation, bool pushDescriptors);
    ~Instance();
    Instance(const Instance &) = delete;
    Instance &operator=(const Instance &) = delete;

    const VulkanLibrary &library() const noexcept { return library_; }
    VkInstance handle() const noexcept { return instance_; }
    const std::vector<PhysicalDevice> &devices() const noexcept { return devices_; }
    std::string loaderVersion() const;

    /// Validation errors reported through VK_EXT_debug_utils since the instance was created.
    uint64_t validationErrors() const noexcept { return validationErrors_.load(); }
    std::string firstValidationError() const;

private:
    static VKAPI_ATTR VkBool32 VKAPI_CALL onDebugMessage(
        VkDebugUtilsMessageSeverityFlagBitsEXT severity, VkDebugUtilsMessageTypeFlagsEXT types,
        const VkDebugUtilsMessengerCallbackDataEXT *data, void *user);
    void enumerate(bool pushDescriptors);

    const VulkanPlugin &plugin_;
    VulkanLibrary library_;
    uint32_t apiVersion_ = 0;
    VkInstance instance_ = VK_NULL_HANDLE;
    VkDebugUtilsMessengerEXT messenger_ = VK_NULL_HANDLE;
    std::vector<PhysicalDevice> devices_;
    std::atomic<uint64_t> validationErrors_{0};
    mutable std::mutex messageMutex_;
    std::string firstValidationError_;
};

/// The plugin instance: options, lazily created Instance.
class VulkanPlugin : public sdk::Plugin {
public:
    static constexpr const char *kName = "vulkan";
    static constexpr const char *kVersion = "0.1.0";
    /// The options schema (ABI 1.5; docs/vulkan.md lists the same options).
    static constexpr const char *kOptionsSchema = R"schema({"type": "object", "additionalProperties": false, "properties": {"validation": {"type": "boolean", "default": false, "description": "enable VK_LAYER_KHRONOS_validation and a debug messenger (also BACKPLANE_VULKAN_VALIDATION=1)"}, "push_descriptors": {"type": "boolean", "default": true, "description": "use VK_KHR_push_descriptor where the device has it"}, "batch_commands": {"type": "integer", "minimum": 1, "maximum": 4096, "default": 64, "description": "commands recorded per submit at most"}, "shader_copy": {"type": "string", "enum": ["auto", "on", "off"], "default": "auto", "description": "device-to-device copies through a compute shader; auto: on discrete GPUs"}}})schema";

    explicit VulkanPlugin(const bp_plugin_init_args &args);
    ~VulkanPlugin() override;

    bp_probe_result probe() override;
    bp_device_info deviceInfo(uint32_t index) override;
    std::unique_ptr<sdk::Device> open(uint32_t index, const bp_device_open_args &args) override;

private:
    /// The instance, created once; rethrows the creation failure on every later call.
    Instance &instance();

    bool validation_ = false;
    bool pushDescriptors_ = true;
    uint32_t batchCommands_ = 64; ///< VulkanStream::kBatchBound
    std::string shaderCopy_ = "auto"; ///< "auto" (discrete GPUs), "on", "off"
    std::mutex mutex_;
    std::unique_ptr<Instance> instance_;
    std::optional<sdk::Error> failure_;
};

class VulkanDevice;

/// One page: a VkBuffer over its own VkDeviceMemory, persistently mapped when host-visible.
class VulkanMemory : public sdk::Memory {
public:
    VulkanMemory(VulkanDevice &device, bp_memory_kind kind, uint64_t size);
    ~VulkanMemory() override;
    VulkanMemory(const VulkanMemory &) = delete;
    VulkanMemory &operator=(const VulkanMemory &) = delete;

    VkBuffer buffer() const noexcept { return buffer_; }
    uint64_t size() const noexcept { return size_; }
    void *mapped() const noexcept { return mapped_; }
    bp_memory_kind kind() const noexcept { return kind_; }

private:
    VulkanDevice &device_;
    bp_memory_kind kind_;
    uint64_t size_;
    VkBuffer buffer_ = VK_NULL_HANDLE;
    VkDeviceMemory memory_ = VK_NULL_HANDLE;
    void *mapped_ = nullptr;
};

/// A stream's timeline semaphore. Shared by the stream and its events, which may outlive it.
struct Timeline {
    Timeline(VulkanDevice &device);
    ~Timeline();
    Timeline(const Timeline &) = delete;
    Timeline &operator=(const Timeline &) = delete;
    uint64_t completed() const; ///< vkGetSemaphoreCounterValue

    VulkanDevice &device;
    VkSemaphore semaphore = VK_NULL_HANDLE;
};

/// A completion point: (timeline semaphore, value), optionally with a timestamp query slot.
class VulkanEvent : public sdk::Event {
public:
    VulkanEvent(std::shared_ptr<Timeline> timeline, uint64_t value, int32_t querySlot)
        : timeline_(std::move(timeline)), value_(value), querySlot_(querySlot) {}
    ~VulkanEvent() override;

    const std::shared_ptr<Timeline> &timeline() const noexcept { return timeline_; }
    uint64_t value() const noexcept { return value_; }
    int32_t querySlot() const noexcept { return querySlot_; }

private:
    std::shared_ptr<Timeline> timeline_;
    uint64_t value_;
    int32_t querySlot_;
};

/// One compute pipeline of a kernel with the layouts it was created with. Immutable once made.
struct KernelPipeline {
    std::array<uint32_t, 5> key{}; ///< block x, y, z, binding count, shared bytes
    VkPipeline pipeline = VK_NULL_HANDLE;
    VkDescriptorSetLayout setLayout = VK_NULL_HANDLE; ///< owned by the device (layout cache)
    VkPipelineLayout layout = VK_NULL_HANDLE;         ///< owned by the device (layout cache)
};

/// The Vulkan objects of one kernel: its module and its pipelines. Shared by the kernel and by
/// every batch that recorded a launch of it, so that kernel_release while launches are recorded
/// or pending destroys them only once the last such batch completed.
struct KernelObjects {
    explicit KernelObjects(VulkanDevice &owner) : device(owner) {}
    ~KernelObjects();
    KernelObjects(const KernelObjects &) = delete;
    KernelObjects &operator=(const KernelObjects &) = delete;

    VulkanDevice &device;
    VkShaderModule module = VK_NULL_HANDLE;
    std::mutex mutex;
    std::map<std::array<uint32_t, 5>, KernelPipeline> pipelines; ///< nodes never move
    std::atomic<const KernelPipeline *> last{nullptr};          ///< the latest one used
};

/// A loaded SPIR-V module, its reflected launch interface and its pipelines, one per (block size,
/// binding count, shared bytes). kernel_load refuses a module SPIRV-Cross cannot reflect.
class VulkanKernel : public sdk::Kernel {
public:
    VulkanKernel(VulkanDevice &device, const bp_kernel_load_args &args);
    VulkanKernel(const VulkanKernel &) = delete;
    VulkanKernel &operator=(const VulkanKernel &) = delete;

    /// The pipeline for this launch shape, created (through the device's VkPipelineCache) on
    /// first use. Thread-safe; a launch with the same shape as the previous one takes no lock.
    /// The reference stays valid for the kernel's life.
    const KernelPipeline &pipeline(const uint32_t block[3], uint32_t bindingCount,
                                   uint32_t sharedBytes);
    const std::string &entryPoint() const noexcept { return entryPoint_; }
    /// Bindings a launch must give at least: the highest set-0 storage-buffer binding the entry
    /// point uses, plus one (reflected at load).
    uint32_t bindingCount() const noexcept { return bindingCount_; }
    /// Scalar bytes a launch must give at least: the declared size of the push-constant block
    /// the entry point uses; 0 when it uses none.
    uint32_t pushConstantBytes() const noexcept { return pushConstantBytes_; }
    /// What a batch recording a launch keeps alive (VulkanStream::retain).
    const std::shared_ptr<KernelObjects> &objects() const noexcept { return objects_; }

private:
    VulkanDevice &device_;
    std::string entryPoint_;      ///< the kernel's name, as the core knows it
    std::string spirvEntryPoint_; ///< the OpEntryPoint the pipeline uses
    uint32_t bindingCount_ = 0;
    uint32_t pushConstantBytes_ = 0;
    std::shared_ptr<KernelObjects> objects_;
};

/// A byte range of one buffer, for the barrier rule.
struct BufferRange {
    VkBuffer buffer;
    uint64_t begin;
    uint64_t end;
};

/// The groups of pipeline stages the barrier rule orders separately, so that a barrier names
/// only the stages of the commands it separates (a dispatch after a dispatch: compute shader to
/// compute shader, as hand-written Vulkan does).
enum class StageClass : uint8_t {
    Compute,  ///< shader reads and writes of dispatches
    Indirect, ///< the grid read of an indirect dispatch
    Transfer, ///< copies and fills
};
inline constexpr size_t kStageClassCount = 3;

/// One access of a command for the barrier rule: a byte range, its stage class, read or write.
struct Access {
    StageClass stage;
    BufferRange range;
    bool write;
};

/// A global memory barrier the barrier rule asks for; none when dstStages is 0.
struct Barrier {
    VkPipelineStageFlags srcStages = 0;
    VkPipelineStageFlags dstStages = 0;
    VkAccessFlags srcAccess = 0;
    VkAccessFlags dstAccess = 0;

    /// Records it into `commands`; nothing when none is needed.
    void record(const DeviceFunctions &fn, VkCommandBuffer commands) const;
};

/// The barrier rule's state of one command sequence (a stream's batches, or a graph's command
/// buffer): per stage class, the accesses since the last barrier towards that class.
class BarrierTracker {
public:
    /// The barrier a command must follow, whose accesses are in `stage` (plus an optional
    /// indirect-argument read): needed when it touches a range that an earlier, still unordered
    /// command wrote, or writes one it read; its source is the stages of those earlier accesses,
    /// its destination the stage classes of this command. Then notes the command's ranges, and
    /// its writes for takeWrites().
    Barrier order(StageClass stage, const BufferRange *reads, size_t readCount,
                  const BufferRange *writes, size_t writeCount,
                  const BufferRange *indirectRead = nullptr);
    /// The same for accesses of several stage classes that run as one unit after everything
    /// noted before and before everything noted later (a graph launch): one barrier towards each
    /// class with a hazard. Not counted for takeWrites(): a graph ends with its own host barrier.
    Barrier order(const std::vector<Access> &accesses);
    /// The stages that wrote and their write accesses since the last call (the host-read barrier
    /// at the end of a submission).
    std::pair<VkPipelineStageFlags, VkAccessFlags> takeWrites() noexcept;

private:
    /// An access not yet ordered before later commands of one stage class.
    struct PendingAccess {
        BufferRange range;
        VkPipelineStageFlags stages; ///< the stages that accessed it
        VkAccessFlags writes;        ///< their write accesses (0: read only)
    };
    bool conflicts(StageClass stage, const BufferRange &range, bool write) const;
    /// The barrier towards the classes of `hazards` (a bit per class); clears their lists.
    Barrier barrierTowards(uint32_t hazards);
    /// Notes an access in every class's list.
    void note(StageClass stage, const BufferRange &range, bool write);

    /// Per stage class: the accesses since the last barrier whose destination covered it.
    std::array<std::vector<PendingAccess>, kStageClassCount> pending_;
    VkPipelineStageFlags writeStages_ = 0;
    VkAccessFlags writeAccess_ = 0;
};

/// Compute state recorded into the open command buffer. Vulkan keeps it for the command
/// buffer's life, so a launch re-records only what differs from the previous one.
struct BoundComputeState {
    VkPipeline pipeline = VK_NULL_HANDLE;
    VkPipelineLayout descriptorLayout = VK_NULL_HANDLE; ///< layout the descriptors went with
    uint32_t bindingCount = 0;
    std::array<VkDescriptorBufferInfo, 32> buffers{};
    VkPipelineLayout scalarLayout = VK_NULL_HANDLE; ///< layout the push constants went with
    uint32_t scalarBytes = 0;                       ///< pushed bytes (a multiple of 4)
    std::array<unsigned char, 4096> scalars{};      ///< max_scalar_bytes is at most 4096

    /// Forgets everything (a new command buffer starts with nothing bound).
    void clear() noexcept {
        pipeline = VK_NULL_HANDLE;
        descriptorLayout = scalarLayout = VK_NULL_HANDLE;
        bindingCount = scalarBytes = 0;
    }
};

class VulkanGraph;

/// A stream: records into a command buffer, submits in batches, signals its timeline.
class VulkanStream : public sdk::Stream {
public:
    VulkanStream(VulkanDevice &device, uint32_t queueIndex);
    ~VulkanStream() override;
    VulkanStream(const VulkanStream &) = delete;
    VulkanStream &operator=(const VulkanStream &) = delete;

    /// Commands recorded per submit at most, by default (plugin option "batch_commands").
    static constexpr uint32_t kBatchBound = 64;

    /// The command buffer to record into (begins a batch if none is open).
    VkCommandBuffer record();
    /// Records the barrier (BarrierTracker::order) the command about to be recorded needs
    /// after this stream's earlier commands, and notes the command's ranges.
    void orderAccess(StageClass stage, const BufferRange *reads, size_t readCount,
                     const BufferRange *writes, size_t writeCount,
                     const BufferRange *indirectRead = nullptr);
    /// What the open command buffer has bound (valid until the next submit).
    BoundComputeState &bound() noexcept { return bound_; }
    /// Counts one recorded command; submits when the batch bound is reached.
    void commandRecorded();
    /// Submits the open batch (and pending waits); writes a timestamp first when `timing`.
    /// `graph`, when given, is a graph's command buffer submitted after the batch in the same
    /// submission (one timeline signal covers both). Returns the query slot used (-1 if none).
    int32_t submit(bool timing, VkCommandBuffer graph = VK_NULL_HANDLE);
    /// Records one replay of `graph`: after this stream's earlier work (a barrier in the open
    /// batch where the graph's accesses need one), before its later work (the graph's accesses
    /// stay tracked), submitted right away behind the open batch.
    void submitGraph(const VulkanGraph &graph);
    /// The next submit waits on (timeline, value).
    void waitOn(std::shared_ptr<Timeline> timeline, uint64_t value);
    /// Host wait until everything submitted so far completed.
    void waitIdle();

    /// Staging bytes valid until the current batch completes (device-visible, host-mapped).
    struct Staging {
        VulkanMemory *memory;
        uint64_t offset;
        unsigned char *host;
    };
    Staging staging(uint64_t size);

    /// Keeps `object` alive until the open batch completed (a kernel a recorded launch uses).
    void retain(std::shared_ptr<const void> object);

    /// A descriptor set for this batch (only without VK_KHR_push_descriptor).
    VkDescriptorSet allocateDescriptorSet(VkDescriptorSetLayout layout);

    const std::shared_ptr<Timeline> &timeline() const noexcept { return timeline_; }
    uint64_t submitted() const noexcept { return submitted_; }
    bool hasPendingWork() const noexcept { return slot_.has_value() || !waits_.empty(); }
    uint32_t queueIndex() const noexcept { return queueIndex_; }

private:
    struct Slot {
        VkCommandBuffer commands = VK_NULL_HANDLE;
        VkDescriptorPool descriptors = VK_NULL_HANDLE;
        uint64_t value = 0;
        std::vector<std::unique_ptr<VulkanMemory>> staging;
        uint64_t stagingUsed = 0; ///< bytes used in staging.back()
        std::vector<std::shared_ptr<const void>> retained; ///< kept alive until it completed
    };
    Slot acquireSlot();
    void recycle(Slot &slot);

    VulkanDevice &device_;
    uint32_t queueIndex_;
    std::shared_ptr<Timeline> timeline_;
    uint64_t submitted_ = 0;
    VkCommandPool pool_ = VK_NULL_HANDLE;
    std::vector<Slot> free_;
    std::deque<Slot> inFlight_;
    std::optional<Slot> slot_;
    uint32_t commandCount_ = 0;
    /// Kept across submits: the stream's batches go to one queue, and a barrier in a later
    /// batch orders against earlier batches in submission order.
    BarrierTracker barriers_;
    BoundComputeState bound_;
    std::vector<std::pair<std::shared_ptr<Timeline>, uint64_t>> waits_;
    std::vector<std::unique_ptr<VulkanMemory>> freeStaging_;
};

/// A recorded sequence (ABI 1.3): one primary command buffer recorded once by the same code as
/// a stream's commands, with the same barriers between its ops, and submitted on every launch.
/// It owns its command pool, its descriptor pools (without VK_KHR_push_descriptor) and the
/// kernels its launches use. Begun with SIMULTANEOUS_USE (a launch on a second stream may come
/// while an earlier one is pending), never re-recorded. Built by VulkanDevice::createGraph.
class VulkanGraph : public sdk::Graph {
public:
    explicit VulkanGraph(VulkanDevice &device);
    /// Waits for the launches still pending (the core releases a graph only after they
    /// completed), then frees the command buffer and what it owns.
    ~VulkanGraph() override;
    VulkanGraph(const VulkanGraph &) = delete;
    VulkanGraph &operator=(const VulkanGraph &) = delete;

    // What the device's recording code uses (the same names as VulkanStream's).
    VkCommandBuffer record() const noexcept { return commands_; }
    /// Records the barrier the command needs after the graph's earlier ops; notes its ranges.
    void orderAccess(StageClass stage, const BufferRange *reads, size_t readCount,
                     const BufferRange *writes, size_t writeCount,
                     const BufferRange *indirectRead = nullptr);
    BoundComputeState &bound() noexcept { return *bound_; }
    void commandRecorded() noexcept {}
    /// Keeps `object` (a kernel's Vulkan objects) alive for the graph's life.
    void retain(std::shared_ptr<const void> object);
    /// A descriptor set of the graph's own pools (only without VK_KHR_push_descriptor).
    VkDescriptorSet allocateDescriptorSet(VkDescriptorSetLayout layout);

    /// Ends the recording: the host-read barrier after the graph's writes, vkEndCommandBuffer.
    void finish();
    /// Notes a launch on `timeline` up to `value`, which the destructor waits for.
    void launched(const std::shared_ptr<Timeline> &timeline, uint64_t value);

    VulkanDevice &device() const noexcept { return device_; }
    /// Every range the graph accesses, once per (stage class, range): how a launch orders it
    /// against the stream's work before and after it.
    const std::vector<Access> &accesses() const noexcept { return accesses_; }

private:
    VulkanDevice &device_;
    VkCommandPool pool_ = VK_NULL_HANDLE;
    VkCommandBuffer commands_ = VK_NULL_HANDLE;
    std::vector<VkDescriptorPool> descriptorPools_;
    uint32_t setsLeft_ = 0; ///< in descriptorPools_.back()
    BarrierTracker barriers_;
    std::unique_ptr<BoundComputeState> bound_ = std::make_unique<BoundComputeState>();
    /// (class, buffer, begin, end) -> index in accesses_, while recording.
    std::map<std::tuple<StageClass, VkBuffer, uint64_t, uint64_t>, size_t> accessIndex_;
    std::vector<Access> accesses_;
    std::vector<std::shared_ptr<const void>> retained_;
    std::mutex launchMutex_;
    std::vector<std::pair<std::shared_ptr<Timeline>, uint64_t>> launches_;
};

/// An opened device: VkDevice, compute queues, memory types, layouts, pipeline cache.
class VulkanDevice : public sdk::Device {
public:
    VulkanDevice(VulkanPlugin &plugin, Instance &instance, const PhysicalDevice &physical,
                 bool validation);
    ~VulkanDevice() override;

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
    void compile(const bp_kernel_compile_args &args, sdk::CompileOutput &out) override;
    std::unique_ptr<sdk::Kernel> load(const bp_kernel_load_args &args) override;
    void launch(sdk::Stream &stream, const bp_launch_args &args) override;
    uint64_t nativeHandle(bp_native_kind kind, const void *object) override;
    /// Records every op into a VulkanGraph (vulkan_graph.cpp); updateGraph stays unsupported.
    std::unique_ptr<sdk::Graph> createGraph(std::vector<sdk::GraphOp> &ops) override;
    void launchGraph(sdk::Stream &stream, sdk::Graph &graph) override;

    /// check() plus device-lost bookkeeping: after VK_ERROR_DEVICE_LOST every call fails fast.
    void check(VkResult result, const char *what);
    /// Throws BP_ERROR_DEVICE_LOST once the device was lost; throws when validation reported
    /// errors since the last call (validation mode only).
    void failIfUnusable();

    const DeviceFunctions &fn() const noexcept { return fn_; }
    VkDevice handle() const noexcept { return device_; }
    const PhysicalDevice &physical() const noexcept { return physical_; }
    VulkanPlugin &plugin() const noexcept { return plugin_; }
    VkPipelineCache pipelineCache() const noexcept { return pipelineCache_; }

    /// Memory type index for a page kind.
    uint32_t memoryType(bp_memory_kind kind) const noexcept;
    /// Descriptor set layout + pipeline layout for `bindingCount` storage buffers (cached).
    std::pair<VkDescriptorSetLayout, VkPipelineLayout> layout(uint32_t bindingCount);
    /// Submits to queue `index` under its mutex (streams may share a queue).
    void submit(uint32_t index, const VkSubmitInfo &info);
    VkQueue queue(uint32_t index) const noexcept { return queues_[index]->queue; }

    /// Pinned pages register their mapping so that copies from/to them skip staging.
    void registerPinned(VulkanMemory &memory);
    void unregisterPinned(VulkanMemory &memory);
    /// The pinned page holding [ptr, ptr+size), with the offset of ptr in it; nullptr if none.
    VulkanMemory *findPinned(const void *ptr, uint64_t size, uint64_t &offset);

    /// A timestamp query slot (-1 when the device has none free); released with its event.
    int32_t acquireQuerySlot();
    void releaseQuerySlot(int32_t slot, std::shared_ptr<Timeline> timeline, uint64_t value);
    VkQueryPool queryPool() const noexcept { return queryPool_; }

private:
    struct Queue {
        VkQueue queue = VK_NULL_HANDLE;
        std::mutex mutex;
    };
    struct RetiredSlot {
        int32_t slot;
        std::shared_ptr<Timeline> timeline;
        uint64_t value;
    };
    // Recording, shared by streams (Recorder = VulkanStream) and graphs (VulkanGraph): the same
    // checks, commands and barriers. Instantiated for both in vulkan_device.cpp.
    template <class Recorder>
    void recordHostToDevice(Recorder &r, const bp_copy_host_to_device_args &args);
    template <class Recorder>
    void recordDeviceToHost(Recorder &r, const bp_copy_device_to_host_args &args);
    template <class Recorder>
    void recordDeviceToDevice(Recorder &r, const bp_copy_device_to_device_args &args);
    template <class Recorder> void recordFill(Recorder &r, const bp_fill_args &args);
    template <class Recorder> void recordLaunch(Recorder &r, const bp_launch_args &args);
    template <class Recorder>
    void recordBufferCopy(Recorder &r, const VulkanMemory &src, uint64_t srcOffset,
                          const VulkanMemory &dst, uint64_t dstOffset, uint64_t size);
    template <class Recorder>
    void copyWithShader(Recorder &r, const bp_copy_device_to_device_args &args);
    void chooseMemoryTypes();
    void loadPipelineCache();
    void savePipelineCache() noexcept;
    std::string pipelineCachePath() const;

    VulkanPlugin &plugin_;
    Instance &instance_;
    PhysicalDevice physical_;
    bool validation_;
    VkDevice device_ = VK_NULL_HANDLE;
    DeviceFunctions fn_;
    std::vector<std::unique_ptr<Queue>> queues_;
    std::atomic<uint32_t> nextQueue_{0};
    uint32_t deviceType_ = 0, pinnedType_ = 0, hostVisibleType_ = 0;
    bool deviceMappable_ = false;
    std::atomic<bool> lost_{false};
    uint64_t validationSeen_ = 0;

    std::mutex pinnedMutex_;
    std::map<uintptr_t, VulkanMemory *> pinned_;

    std::mutex layoutMutex_;
    std::unordered_map<uint32_t, std::pair<VkDescriptorSetLayout, VkPipelineLayout>> layouts_;

    VkPipelineCache pipelineCache_ = VK_NULL_HANDLE;

    /// The grid-stride uvec4 copy kernel used for large aligned device->device copies where it
    /// beats vkCmdCopyBuffer (NVIDIA H100: ~2.2 TB/s against ~0.78 TB/s). Built on first use.
    std::mutex copyKernelMutex_;
    std::unique_ptr<VulkanKernel> copyKernel_;

    static constexpr uint32_t kQuerySlots = 1024;
    VkQueryPool queryPool_ = VK_NULL_HANDLE;
    std::mutex queryMutex_;
    std::vector<int32_t> freeQueries_;
    std::vector<RetiredSlot> retiredQueries_;
};

} // namespace backplane::vulkan
