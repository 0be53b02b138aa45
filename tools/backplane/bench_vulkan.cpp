// `backplane bench vulkan`: the Vulkan plugin against raw Vulkan, same device, same process.
//
// Two "runtime" sides: the Vulkan plugin's C ABI (RawPlugin, RawDevice), and ComputeClient (a
// Runtime that loads the same module) for the dispatch rows; each row's `what` says which. The
// raw side dlopens libvulkan.so.1 itself and records the same work by hand (push descriptors,
// one timeline semaphore). SPIR-V for the raw side comes from the plugin's kernel_compile, so the
// tool needs no shaderc.
#include "bench.hpp"
#include "raw_device.hpp"

#include <backplane/abi/caller.hpp>
#include <backplane/client.hpp>
#include <backplane/config.hpp>
#include <backplane/error.hpp>
#include <backplane/kernel.hpp>
#include <backplane/raw_plugin.hpp>
#include <backplane/runtime.hpp>

#include <vulkan/vulkan.h>

#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <unistd.h>
#include <vector>

namespace backplane::tool {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// The plugin submits a stream's batch every this many commands (VulkanStream::kBatchBound).
constexpr uint32_t kPluginBatchBound = 64;

double secondsSince(Clock::time_point start) {
    return std::chrono::duration<double>(Clock::now() - start).count();
}

/// Best of `repeats` runs of `body` (seconds); the minimum is the least noisy on a busy CPU.
double best(int repeats, const std::function<void()> &body) {
    double result = 1e30;
    for (int i = 0; i < repeats; ++i) {
        const auto start = Clock::now();
        body();
        result = std::min(result, secondsSince(start));
    }
    return result;
}

const char *const kIncrement = R"(#version 450
layout(local_size_x_id = 0) in;
layout(set = 0, binding = 0) buffer X { uint x[]; };
layout(push_constant) uniform P { uint n; };
void main() { uint i = gl_GlobalInvocationID.x; if (i < n) x[i] += 1u; }
)";

// Grid-stride copy of uvec4s: the compute-shader alternative to vkCmdCopyBuffer.
const char *const kCopy = R"(#version 450
layout(local_size_x_id = 0) in;
layout(set = 0, binding = 0) readonly buffer S { uvec4 s[]; };
layout(set = 0, binding = 1) writeonly buffer D { uvec4 d[]; };
layout(push_constant) uniform P { uint n; };
void main() {
    uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint i = gl_GlobalInvocationID.x; i < n; i += stride) d[i] = s[i];
}
)";

/// The Vulkan plugin's manifest, as the runtime finds it; BACKPLANE_VULKAN_PLUGIN (a module path,
/// as for the Vulkan tests) loads that module instead, with the manifest beside it if any.
PluginManifestInfo vulkanManifest() {
    const char *env = std::getenv("BACKPLANE_VULKAN_PLUGIN");
    if (env == nullptr) return findPluginManifest(loadConfig(), "vulkan");
    const fs::path module = env;
    PluginManifestInfo manifest;
    if (const fs::path beside = module.parent_path() / "vulkan.json"; fs::exists(beside))
        manifest = readPluginManifest(beside);
    manifest.name = manifest.backend = "vulkan";
    manifest.library = module;
    return manifest;
}

/// GLSL to SPIR-V through the plugin's compiler; `name` names the kernel in its messages.
std::vector<unsigned char> compileGlsl(const RawDevice &plugin, const char *source,
                                       const char *name) {
    return plugin.compile(BP_DIALECT_GLSL, name, source, std::strlen(source));
}

abi::Owned<bp_kernel> loadSpirv(const RawDevice &plugin, const std::vector<unsigned char> &spirv) {
    return plugin.load(BP_DIALECT_SPIRV, "main", spirv);
}

/// One launch of a kernel whose push constant is `n`, on a 1-D grid.
void launch(const RawDevice &plugin, bp_stream *s, bp_kernel *kernel, const bp_binding *bindings,
            uint32_t count, uint32_t n, uint32_t grid, uint32_t block) {
    auto args = abi::make<bp_launch_args>();
    args.kernel = kernel;
    args.grid[0] = grid;
    args.grid[1] = args.grid[2] = 1;
    args.block[0] = block;
    args.block[1] = args.block[2] = 1;
    args.bindings = bindings;
    args.binding_count = count;
    args.scalars = &n;
    args.scalar_size = 4;
    plugin.launch(s, args);
}

// ------------------------------------------------------------------------------------------------
// The raw side

#define BENCH_VK_FUNCTIONS(X)                                                                      \
    X(vkDestroyInstance) X(vkEnumeratePhysicalDevices) X(vkGetPhysicalDeviceProperties2)          \
    X(vkGetPhysicalDeviceQueueFamilyProperties) X(vkGetPhysicalDeviceMemoryProperties)             \
    X(vkCreateDevice) X(vkGetDeviceProcAddr) X(vkDestroyDevice) X(vkGetDeviceQueue)                \
    X(vkDeviceWaitIdle) X(vkCreateBuffer) X(vkDestroyBuffer) X(vkGetBufferMemoryRequirements)      \
    X(vkAllocateMemory) X(vkFreeMemory) X(vkBindBufferMemory) X(vkCreateSemaphore)                 \
    X(vkDestroySemaphore) X(vkWaitSemaphores) X(vkCreateCommandPool) X(vkDestroyCommandPool)       \
    X(vkAllocateCommandBuffers) X(vkBeginCommandBuffer) X(vkEndCommandBuffer) X(vkQueueSubmit)    \
    X(vkCmdPipelineBarrier) X(vkCmdCopyBuffer) X(vkCmdBindPipeline) X(vkCmdPushConstants)          \
    X(vkCmdDispatch) X(vkCreateShaderModule) X(vkDestroyShaderModule)                              \
    X(vkCreateDescriptorSetLayout) X(vkDestroyDescriptorSetLayout) X(vkCreatePipelineLayout)       \
    X(vkDestroyPipelineLayout) X(vkCreateComputePipelines) X(vkDestroyPipeline)                    \
    X(vkCreatePipelineCache) X(vkDestroyPipelineCache) X(vkGetPipelineCacheData)                   \
    X(vkCmdPushDescriptorSetKHR)

void vkOk(VkResult result, const char *what) {
    if (result != VK_SUCCESS)
        throw std::runtime_error(std::string(what) + " failed: VkResult " + std::to_string(result));
}

/// A hand-written Vulkan compute context on the same physical device as the plugin's.
struct RawSide {
    void *library = nullptr;
    PFN_vkGetInstanceProcAddr vkGetInstanceProcAddr = nullptr;
#define BENCH_DECLARE(name) PFN_##name name = nullptr;
    BENCH_VK_FUNCTIONS(BENCH_DECLARE)
#undef BENCH_DECLARE
    VkInstance instance = VK_NULL_HANDLE;
    VkPhysicalDevice physical = VK_NULL_HANDLE;
    VkPhysicalDeviceMemoryProperties memory{};
    VkDevice device = VK_NULL_HANDLE;
    VkQueue queue = VK_NULL_HANDLE;
    uint32_t family = 0;
    VkCommandPool pool = VK_NULL_HANDLE;
    VkCommandBuffer commands = VK_NULL_HANDLE;
    VkSemaphore timeline = VK_NULL_HANDLE;
    uint64_t value = 0;
    VkDescriptorSetLayout setLayout[3] = {};
    VkPipelineLayout layout[3] = {};

    explicit RawSide(const uint8_t uuid[16]) {
        library = ::dlopen("libvulkan.so.1", RTLD_NOW | RTLD_LOCAL);
        if (!library) throw std::runtime_error(std::string("libvulkan.so.1: ") + ::dlerror());
        vkGetInstanceProcAddr =
            reinterpret_cast<PFN_vkGetInstanceProcAddr>(::dlsym(library, "vkGetInstanceProcAddr"));
        auto create = reinterpret_cast<PFN_vkCreateInstance>(
            vkGetInstanceProcAddr(VK_NULL_HANDLE, "vkCreateInstance"));
        VkApplicationInfo app{};
        app.sType = VK_STRUCTURE_TYPE_APPLICATION_INFO;
        app.apiVersion = VK_API_VERSION_1_2;
        VkInstanceCreateInfo info{};
        info.sType = VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO;
        info.pApplicationInfo = &app;
        vkOk(create(&info, nullptr, &instance), "vkCreateInstance");
#define BENCH_LOAD(name) name = reinterpret_cast<PFN_##name>(vkGetInstanceProcAddr(instance, #name));
        BENCH_VK_FUNCTIONS(BENCH_LOAD)
#undef BENCH_LOAD
        uint32_t count = 0;
        vkEnumeratePhysicalDevices(instance, &count, nullptr);
        std::vector<VkPhysicalDevice> devices(count);
        vkEnumeratePhysicalDevices(instance, &count, devices.data());
        for (VkPhysicalDevice d : devices) {
            VkPhysicalDeviceIDProperties ids{};
            ids.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_ID_PROPERTIES;
            VkPhysicalDeviceProperties2 props{};
            props.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2;
            props.pNext = &ids;
            vkGetPhysicalDeviceProperties2(d, &props);
            if (std::memcmp(ids.deviceUUID, uuid, 16) == 0) physical = d;
        }
        if (physical == VK_NULL_HANDLE)
            throw std::runtime_error("raw Vulkan does not see the plugin's device (UUID)");
        vkGetPhysicalDeviceMemoryProperties(physical, &memory);
        uint32_t familyCount = 0;
        vkGetPhysicalDeviceQueueFamilyProperties(physical, &familyCount, nullptr);
        std::vector<VkQueueFamilyProperties> families(familyCount);
        vkGetPhysicalDeviceQueueFamilyProperties(physical, &familyCount, families.data());
        int chosen = -1; // same rule as the plugin: compute-only family first
        for (uint32_t i = 0; i < familyCount; ++i) {
            if (!(families[i].queueFlags & VK_QUEUE_COMPUTE_BIT)) continue;
            if (chosen < 0 || (!(families[i].queueFlags & VK_QUEUE_GRAPHICS_BIT) &&
                               (families[chosen].queueFlags & VK_QUEUE_GRAPHICS_BIT)))
                chosen = static_cast<int>(i);
        }
        family = static_cast<uint32_t>(chosen);
        const float priority = 1.0f;
        VkDeviceQueueCreateInfo queueInfo{};
        queueInfo.sType = VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO;
        queueInfo.queueFamilyIndex = family;
        queueInfo.queueCount = 1;
        queueInfo.pQueuePriorities = &priority;
        VkPhysicalDeviceVulkan12Features features12{};
        features12.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES;
        features12.timelineSemaphore = VK_TRUE;
        const char *extension = VK_KHR_PUSH_DESCRIPTOR_EXTENSION_NAME;
        VkDeviceCreateInfo deviceInfo{};
        deviceInfo.sType = VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO;
        deviceInfo.pNext = &features12;
        deviceInfo.queueCreateInfoCount = 1;
        deviceInfo.pQueueCreateInfos = &queueInfo;
        deviceInfo.enabledExtensionCount = 1;
        deviceInfo.ppEnabledExtensionNames = &extension;
        vkOk(vkCreateDevice(physical, &deviceInfo, nullptr, &device), "vkCreateDevice");
        vkCmdPushDescriptorSetKHR = reinterpret_cast<PFN_vkCmdPushDescriptorSetKHR>(
            vkGetDeviceProcAddr(device, "vkCmdPushDescriptorSetKHR"));
        vkGetDeviceQueue(device, family, 0, &queue);
        VkCommandPoolCreateInfo poolInfo{};
        poolInfo.sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO;
        poolInfo.flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT;
        poolInfo.queueFamilyIndex = family;
        vkOk(vkCreateCommandPool(device, &poolInfo, nullptr, &pool), "vkCreateCommandPool");
        VkCommandBufferAllocateInfo allocate{};
        allocate.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO;
        allocate.commandPool = pool;
        allocate.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
        allocate.commandBufferCount = 1;
        vkOk(vkAllocateCommandBuffers(device, &allocate, &commands), "vkAllocateCommandBuffers");
        VkSemaphoreTypeCreateInfo type{};
        type.sType = VK_STRUCTURE_TYPE_SEMAPHORE_TYPE_CREATE_INFO;
        type.semaphoreType = VK_SEMAPHORE_TYPE_TIMELINE;
        VkSemaphoreCreateInfo semaphore{};
        semaphore.sType = VK_STRUCTURE_TYPE_SEMAPHORE_CREATE_INFO;
        semaphore.pNext = &type;
        vkOk(vkCreateSemaphore(device, &semaphore, nullptr, &timeline), "vkCreateSemaphore");
        for (uint32_t n = 1; n <= 2; ++n) {
            VkDescriptorSetLayoutBinding bindings[2]{};
            for (uint32_t i = 0; i < n; ++i) {
                bindings[i].binding = i;
                bindings[i].descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
                bindings[i].descriptorCount = 1;
                bindings[i].stageFlags = VK_SHADER_STAGE_COMPUTE_BIT;
            }
            VkDescriptorSetLayoutCreateInfo setInfo{};
            setInfo.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO;
            setInfo.flags = VK_DESCRIPTOR_SET_LAYOUT_CREATE_PUSH_DESCRIPTOR_BIT_KHR;
            setInfo.bindingCount = n;
            setInfo.pBindings = bindings;
            vkOk(vkCreateDescriptorSetLayout(device, &setInfo, nullptr, &setLayout[n]),
                 "vkCreateDescriptorSetLayout");
            const VkPushConstantRange range{VK_SHADER_STAGE_COMPUTE_BIT, 0, 16};
            VkPipelineLayoutCreateInfo layoutInfo{};
            layoutInfo.sType = VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO;
            layoutInfo.setLayoutCount = 1;
            layoutInfo.pSetLayouts = &setLayout[n];
            layoutInfo.pushConstantRangeCount = 1;
            layoutInfo.pPushConstantRanges = &range;
            vkOk(vkCreatePipelineLayout(device, &layoutInfo, nullptr, &layout[n]),
                 "vkCreatePipelineLayout");
        }
    }
    ~RawSide() {
        if (device) {
            vkDeviceWaitIdle(device);
            for (int n = 1; n <= 2; ++n) {
                vkDestroyPipelineLayout(device, layout[n], nullptr);
                vkDestroyDescriptorSetLayout(device, setLayout[n], nullptr);
            }
            vkDestroySemaphore(device, timeline, nullptr);
            vkDestroyCommandPool(device, pool, nullptr);
            vkDestroyDevice(device, nullptr);
        }
        if (instance) vkDestroyInstance(instance, nullptr);
        if (library) ::dlclose(library);
    }

    struct Buffer {
        VkBuffer buffer = VK_NULL_HANDLE;
        VkDeviceMemory memory = VK_NULL_HANDLE;
    };
    Buffer buffer(uint64_t size) {
        Buffer b;
        VkBufferCreateInfo info{};
        info.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO;
        info.size = size;
        info.usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT |
                     VK_BUFFER_USAGE_TRANSFER_DST_BIT;
        vkOk(vkCreateBuffer(device, &info, nullptr, &b.buffer), "vkCreateBuffer");
        VkMemoryRequirements requirements;
        vkGetBufferMemoryRequirements(device, b.buffer, &requirements);
        uint32_t type = 0;
        for (uint32_t t = 0; t < memory.memoryTypeCount; ++t)
            if ((requirements.memoryTypeBits & (1u << t)) &&
                (memory.memoryTypes[t].propertyFlags & VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT)) {
                type = t;
                break;
            }
        VkMemoryAllocateInfo allocate{};
        allocate.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO;
        allocate.allocationSize = requirements.size;
        allocate.memoryTypeIndex = type;
        vkOk(vkAllocateMemory(device, &allocate, nullptr, &b.memory), "vkAllocateMemory");
        vkOk(vkBindBufferMemory(device, b.buffer, b.memory, 0), "vkBindBufferMemory");
        return b;
    }
    void release(Buffer &b) {
        vkDestroyBuffer(device, b.buffer, nullptr);
        vkFreeMemory(device, b.memory, nullptr);
    }
    /// Creates a pipeline (block size through spec constant 0); `cache` may be null.
    VkPipeline pipeline(const std::vector<unsigned char> &spirv, uint32_t bindings, uint32_t block,
                        VkPipelineCache cache = VK_NULL_HANDLE) {
        VkShaderModuleCreateInfo moduleInfo{};
        moduleInfo.sType = VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO;
        moduleInfo.codeSize = spirv.size();
        moduleInfo.pCode = reinterpret_cast<const uint32_t *>(spirv.data());
        VkShaderModule module = VK_NULL_HANDLE;
        vkOk(vkCreateShaderModule(device, &moduleInfo, nullptr, &module), "vkCreateShaderModule");
        const VkSpecializationMapEntry entry{0, 0, 4};
        VkSpecializationInfo specialization{1, &entry, 4, &block};
        VkComputePipelineCreateInfo info{};
        info.sType = VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO;
        info.stage.sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO;
        info.stage.stage = VK_SHADER_STAGE_COMPUTE_BIT;
        info.stage.module = module;
        info.stage.pName = "main";
        info.stage.pSpecializationInfo = &specialization;
        info.layout = layout[bindings];
        VkPipeline pipeline = VK_NULL_HANDLE;
        vkOk(vkCreateComputePipelines(device, cache, 1, &info, nullptr, &pipeline),
             "vkCreateComputePipelines");
        vkDestroyShaderModule(device, module, nullptr);
        return pipeline;
    }
    VkCommandBuffer begin() {
        VkCommandBufferBeginInfo info{};
        info.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO;
        info.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
        vkOk(vkBeginCommandBuffer(commands, &info), "vkBeginCommandBuffer");
        return commands;
    }
    void submitAndWait() {
        vkOk(vkEndCommandBuffer(commands), "vkEndCommandBuffer");
        const uint64_t signal = ++value;
        VkTimelineSemaphoreSubmitInfo values{};
        values.sType = VK_STRUCTURE_TYPE_TIMELINE_SEMAPHORE_SUBMIT_INFO;
        values.signalSemaphoreValueCount = 1;
        values.pSignalSemaphoreValues = &signal;
        VkSubmitInfo info{};
        info.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO;
        info.pNext = &values;
        info.commandBufferCount = 1;
        info.pCommandBuffers = &commands;
        info.signalSemaphoreCount = 1;
        info.pSignalSemaphores = &timeline;
        vkOk(vkQueueSubmit(queue, 1, &info, VK_NULL_HANDLE), "vkQueueSubmit");
        VkSemaphoreWaitInfo wait{};
        wait.sType = VK_STRUCTURE_TYPE_SEMAPHORE_WAIT_INFO;
        wait.semaphoreCount = 1;
        wait.pSemaphores = &timeline;
        wait.pValues = &signal;
        vkOk(vkWaitSemaphores(device, &wait, UINT64_MAX), "vkWaitSemaphores");
    }
    void dispatch(VkCommandBuffer cmd, VkPipeline pipeline, uint32_t bindings,
                  const VkDescriptorBufferInfo *buffers, uint32_t n, uint32_t grid) {
        VkWriteDescriptorSet writes[2]{};
        for (uint32_t i = 0; i < bindings; ++i) {
            writes[i].sType = VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET;
            writes[i].dstBinding = i;
            writes[i].descriptorCount = 1;
            writes[i].descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
            writes[i].pBufferInfo = &buffers[i];
        }
        vkCmdBindPipeline(cmd, VK_PIPELINE_BIND_POINT_COMPUTE, pipeline);
        vkCmdPushDescriptorSetKHR(cmd, VK_PIPELINE_BIND_POINT_COMPUTE, layout[bindings], 0,
                                  bindings, writes);
        vkCmdPushConstants(cmd, layout[bindings], VK_SHADER_STAGE_COMPUTE_BIT, 0, 4, &n);
        vkCmdDispatch(cmd, grid, 1, 1);
    }
    void barrier(VkCommandBuffer cmd) {
        VkMemoryBarrier b{};
        b.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER;
        b.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT;
        b.dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT;
        vkCmdPipelineBarrier(cmd, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
                             VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, 0, 1, &b, 0, nullptr, 0,
                             nullptr);
    }
};

// The batched dispatch loops are named functions so that a profiler can isolate them, e.g.
//   valgrind --tool=callgrind --toggle-collect='*recordPluginDispatches*' bench_vulkan --quick
// (the plugin's submits every kPluginBatchBound commands happen inside its loop; the raw side
// submits once, outside).
[[gnu::noinline]] void recordRawDispatches(RawSide &raw, VkCommandBuffer cmd, VkPipeline pipeline,
                                           const VkDescriptorBufferInfo &info, uint32_t n,
                                           uint32_t count) {
    for (uint32_t i = 0; i < count; ++i) {
        if (i > 0) raw.barrier(cmd);
        raw.dispatch(cmd, pipeline, 1, &info, n, n / 64);
    }
}

[[gnu::noinline]] void recordPluginDispatches(const RawDevice &plugin, bp_stream *s, bp_kernel *k,
                                              const bp_binding &binding, uint32_t n,
                                              uint32_t count) {
    for (uint32_t i = 0; i < count; ++i) launch(plugin, s, k, &binding, 1, n, n / 64, 64);
}

[[gnu::noinline]] void executeClientDispatches(ComputeClient &client, const KernelSource &kernel,
                                               const Dispatch &dispatch, uint32_t count) {
    for (uint32_t i = 0; i < count; ++i) client.execute(kernel, dispatch);
}

/// A Runtime that finds only the manifest the C-ABI side was opened from (when there is one), so
/// that the ComputeClient rows run the same plugin build.
Runtime clientRuntime(const PluginManifestInfo &manifest) {
    Config config = loadConfig();
    if (!manifest.file.empty()) config.pluginPathOverride = {manifest.file};
    return Runtime(std::move(config));
}

void run(const BenchOptions &options, BenchRows &rows) {
    // Driver-side shader disk caches would turn "cold" pipeline creation warm.
    ::setenv("MESA_SHADER_CACHE_DISABLE", "true", 0);
    ::setenv("__GL_SHADER_DISK_CACHE", "0", 0);
    const int repeats = options.quick ? 3 : 10;
    const int roundTrips = options.quick ? 200 : 2000;
    const uint32_t batched = options.quick ? 256 : 2048;

    // The plugin side: device 0 of the Vulkan plugin, through its C table.
    const PluginManifestInfo manifest = vulkanManifest();
    const RawDevice plugin(RawPlugin::open(manifest), 0);
    RawSide raw(plugin.info().uuid);
    const std::string device =
        "vulkan:0 " + fieldText(plugin.info().name, sizeof(plugin.info().name));
    auto row = [&](const std::string &what, double runtime, double rawValue, const char *unit,
                   const char *target) {
        rows.push_back({"vulkan", device, what, runtime, rawValue, unit, target});
    };
    const auto incrementSpirv = compileGlsl(plugin, kIncrement, "increment");
    const auto copySpirv = compileGlsl(plugin, kCopy, "copy");

    // Dispatch: one round trip, and batches where each dispatch depends on the previous one
    // (each increments the same buffer), raw first, then the plugin's C ABI, then ComputeClient.
    {
        const uint32_t n = 1024;
        auto buffer = raw.buffer(n * 4);
        VkPipeline pipeline = raw.pipeline(incrementSpirv, 1, 64);
        const VkDescriptorBufferInfo info{buffer.buffer, 0, n * 4};
        const double rawTrip = best(repeats, [&] {
            for (int i = 0; i < roundTrips / repeats; ++i) {
                raw.dispatch(raw.begin(), pipeline, 1, &info, n, n / 64);
                raw.submitAndWait();
            }
        }) / (roundTrips / repeats);
        const double rawBatch = best(repeats, [&] {
            recordRawDispatches(raw, raw.begin(), pipeline, info, n, batched);
            raw.submitAndWait();
        }) / batched;
        raw.vkDestroyPipeline(raw.device, pipeline, nullptr);
        raw.release(buffer);

        double runtimeTrip = 0, runtimeBatch = 0;
        {
            const abi::Owned<bp_stream> stream = plugin.createStream();
            const abi::Owned<bp_kernel> kernel = loadSpirv(plugin, incrementSpirv);
            const RawMemory x = plugin.allocate(BP_MEMORY_DEVICE, n * 4);
            bp_stream *s = stream.get();
            bp_kernel *k = kernel.get();
            const bp_binding binding{x.memory.get(), 0, n * 4};
            launch(plugin, s, k, &binding, 1, n, n / 64, 64); // creates the pipeline
            plugin.sync(s);
            runtimeTrip = best(repeats, [&] {
                for (int i = 0; i < roundTrips / repeats; ++i) {
                    launch(plugin, s, k, &binding, 1, n, n / 64, 64);
                    plugin.sync(s);
                }
            }) / (roundTrips / repeats);
            runtimeBatch = best(repeats, [&] {
                recordPluginDispatches(plugin, s, k, binding, n, batched);
                plugin.sync(s);
            }) / batched;
        }
        row("dispatch round trip: launch+flush+wait (plugin C ABI) vs record+submit+wait (raw)",
            runtimeTrip * 1e6, rawTrip * 1e6, "us", "");
        row("batched dependent dispatches, per dispatch (plugin C ABI, " +
                std::to_string(kPluginBatchBound) + "/submit) vs one command buffer (raw)",
            runtimeBatch * 1e6, rawBatch * 1e6, "us", "<= 1.10x");

        try {
            Runtime runtime = clientRuntime(manifest);
            const Selection selection = runtime.select("vulkan:0");
            if (!selection.device.hasUuid ||
                std::memcmp(selection.device.uuid.data(), plugin.info().uuid, 16) != 0)
                throw std::runtime_error("the Runtime's vulkan:0 (" + selection.device.name +
                                         ") is not the device measured above");
            ComputeClient client = runtime.open(selection);
            const KernelSource increment{
                "increment", {KernelVariant::text(Dialect::Glsl, "main", kIncrement)}};
            Dispatch dispatch;
            dispatch.grid = {n / 64, 1, 1};
            dispatch.block = {64, 1, 1};
            dispatch.bindings = {client.empty(n * 4)};
            dispatch.scalar(n);
            client.execute(increment, dispatch); // compiles, creates the pipeline
            client.sync();
            const double clientTrip = best(repeats, [&] {
                for (int i = 0; i < roundTrips / repeats; ++i) {
                    client.execute(increment, dispatch);
                    client.sync();
                }
            }) / (roundTrips / repeats);
            const double clientBatch = best(repeats, [&] {
                executeClientDispatches(client, increment, dispatch, batched);
                client.sync();
            }) / batched;
            row("dispatch round trip: execute+sync (ComputeClient) vs record+submit+wait (raw)",
                clientTrip * 1e6, rawTrip * 1e6, "us", "");
            row("batched dependent dispatches, per dispatch (ComputeClient) vs one command buffer "
                "(raw)",
                clientBatch * 1e6, rawBatch * 1e6, "us", "<= 1.10x");
        } catch (const std::exception &e) {
            std::fprintf(stderr, "vulkan: ComputeClient rows skipped: %s\n", e.what());
        }
    }

    // Device-to-device copy of 256 MiB, bytes read + written.
    {
        const uint64_t size = 256ull << 20;
        if (plugin.info().max_allocation_bytes >= size) {
            const int copies = options.quick ? 2 : 5;
            double runtimeCopy = 0;
            {
                const abi::Owned<bp_stream> s = plugin.createStream();
                const RawMemory a = plugin.allocate(BP_MEMORY_DEVICE, size);
                const RawMemory b = plugin.allocate(BP_MEMORY_DEVICE, size);
                runtimeCopy = best(copies, [&] {
                    plugin.copyDeviceToDevice(s.get(), a.memory.get(), 0, b.memory.get(), 0, size);
                    plugin.sync(s.get());
                });
            }

            auto src = raw.buffer(size);
            auto dst = raw.buffer(size);
            const double rawCopy = best(copies, [&] {
                const VkBufferCopy region{0, 0, size};
                raw.vkCmdCopyBuffer(raw.begin(), src.buffer, dst.buffer, 1, &region);
                raw.submitAndWait();
            });
            const uint32_t n = static_cast<uint32_t>(size / 16);
            VkPipeline pipeline = raw.pipeline(copySpirv, 2, 256);
            const VkDescriptorBufferInfo infos[2] = {{src.buffer, 0, size}, {dst.buffer, 0, size}};
            const double shaderCopy = best(copies, [&] {
                raw.dispatch(raw.begin(), pipeline, 2, infos, n, 4096);
                raw.submitAndWait();
            });
            raw.vkDestroyPipeline(raw.device, pipeline, nullptr);
            raw.release(dst);
            raw.release(src);
            const double bytes = 2.0 * static_cast<double>(size) / 1e9;
            row("device->device copy 256 MiB, read+written (plugin C ABI vs raw vkCmdCopyBuffer)",
                bytes / runtimeCopy, bytes / rawCopy, "GB/s", ">= 0.97x");
            row("device->device copy 256 MiB: compute-shader copy (raw) vs vkCmdCopyBuffer (raw)",
                bytes / shaderCopy, bytes / rawCopy, "GB/s", "");
        } else {
            std::fprintf(stderr, "vulkan: device cannot allocate 256 MiB; copy rows skipped\n");
        }
    }

    // Pipeline creation: cold vs from the cache persisted by an earlier device of the plugin.
    {
        const fs::path dir = fs::temp_directory_path() /
                             ("backplane-bench-vulkan-" + std::to_string(::getpid()));
        fs::remove_all(dir);
        fs::create_directories(dir);
        // A different one-binding kernel runs first, so that the timed span holds module and
        // pipeline creation only (the descriptor/pipeline layouts and command buffers exist).
        std::string warmupSource = kIncrement;
        warmupSource.replace(warmupSource.find("+= 1u"), 5, "+= 2u");
        const auto warmupSpirv = compileGlsl(plugin, warmupSource.c_str(), "warmup");
        auto createThroughPlugin = [&] {
            const RawDevice side(RawPlugin::open(manifest, {.cacheDir = dir}), 0);
            const abi::Owned<bp_stream> s = side.createStream();
            const RawMemory x = side.allocate(BP_MEMORY_DEVICE, 256);
            const bp_binding binding{x.memory.get(), 0, 256};
            const abi::Owned<bp_kernel> warmup = loadSpirv(side, warmupSpirv);
            launch(side, s.get(), warmup.get(), &binding, 1, 64, 1, 64);
            // kernel_load + the first launch, which creates the pipeline (nothing executes yet).
            const auto start = Clock::now();
            const abi::Owned<bp_kernel> k = loadSpirv(side, incrementSpirv);
            launch(side, s.get(), k.get(), &binding, 1, 64, 1, 64);
            const double seconds = secondsSince(start);
            side.sync(s.get());
            return seconds; // closing the device persists the cache
        };
        const double pluginCold = createThroughPlugin();
        double pluginWarm = 1e30;
        for (int i = 0; i < 3; ++i) pluginWarm = std::min(pluginWarm, createThroughPlugin());
        fs::remove_all(dir);

        double rawCold = 1e30;
        for (int i = 0; i < 3; ++i) {
            VkPipelineCacheCreateInfo info{};
            info.sType = VK_STRUCTURE_TYPE_PIPELINE_CACHE_CREATE_INFO;
            VkPipelineCache cache = VK_NULL_HANDLE;
            raw.vkCreatePipelineCache(raw.device, &info, nullptr, &cache);
            const auto start = Clock::now();
            VkPipeline pipeline = raw.pipeline(incrementSpirv, 1, 64 + 32 * i, cache);
            rawCold = std::min(rawCold, secondsSince(start));
            raw.vkDestroyPipeline(raw.device, pipeline, nullptr);
            raw.vkDestroyPipelineCache(raw.device, cache, nullptr);
        }
        row("pipeline creation from the persisted cache (plugin C ABI, new device) vs cold (raw)",
            pluginWarm * 1e3, rawCold * 1e3, "ms", "");
        row("pipeline creation cold: kernel_load + first launch (plugin C ABI) vs raw",
            pluginCold * 1e3, rawCold * 1e3, "ms", "");
    }
}

} // namespace

void benchVulkan(const BenchOptions &options, BenchRows &rows) {
    try {
        run(options, rows);
    } catch (const std::exception &e) {
        std::fprintf(stderr, "vulkan: suite skipped: %s\n", e.what());
    }
}

} // namespace backplane::tool
