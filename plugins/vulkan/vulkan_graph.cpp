// Recorded sequences (ABI 1.3) on the Vulkan plugin: a graph is one reusable command buffer,
// recorded once by the device's recording code and submitted on each launch.
#include "vulkan_device.hpp"

#include <algorithm>
#include <string>

namespace backplane::vulkan {
namespace {

// Descriptor sets per pool of a graph (only without VK_KHR_push_descriptor).
constexpr uint32_t kGraphSetsPerPool = 64;

} // namespace

VulkanGraph::VulkanGraph(VulkanDevice &device) : device_(device) {
    const auto &fn = device.fn();
    // A pool of its own: command pools are externally synchronized, and graphs are created on
    // any thread while streams record into theirs.
    auto poolInfo = vkStruct<VkCommandPoolCreateInfo>(VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO);
    poolInfo.queueFamilyIndex = device.physical().queueFamily;
    device.check(fn.vkCreateCommandPool(device.handle(), &poolInfo, nullptr, &pool_),
                 "vkCreateCommandPool");
    try {
        auto info =
            vkStruct<VkCommandBufferAllocateInfo>(VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO);
        info.commandPool = pool_;
        info.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
        info.commandBufferCount = 1;
        device.check(fn.vkAllocateCommandBuffers(device.handle(), &info, &commands_),
                     "vkAllocateCommandBuffers");
        // Not ONE_TIME_SUBMIT: it is submitted once per launch. SIMULTANEOUS_USE: the core may
        // launch it on another stream (another queue) while an earlier launch is pending.
        auto begin =
            vkStruct<VkCommandBufferBeginInfo>(VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO);
        begin.flags = VK_COMMAND_BUFFER_USAGE_SIMULTANEOUS_USE_BIT;
        device.check(fn.vkBeginCommandBuffer(commands_, &begin), "vkBeginCommandBuffer");
    } catch (...) {
        fn.vkDestroyCommandPool(device.handle(), pool_, nullptr);
        throw;
    }
}

VulkanGraph::~VulkanGraph() {
    const auto &fn = device_.fn();
    // The core releases a graph only after its launches completed; should one still be pending,
    // freeing its command buffer and descriptor sets would be undefined, so wait. Errors (a
    // lost device) leave nothing to wait for.
    for (const auto &[timeline, value] : launches_) {
        auto info = vkStruct<VkSemaphoreWaitInfo>(VK_STRUCTURE_TYPE_SEMAPHORE_WAIT_INFO);
        info.semaphoreCount = 1;
        info.pSemaphores = &timeline->semaphore;
        info.pValues = &value;
        fn.vkWaitSemaphores(device_.handle(), &info, UINT64_MAX);
    }
    for (VkDescriptorPool pool : descriptorPools_)
        fn.vkDestroyDescriptorPool(device_.handle(), pool, nullptr);
    // Frees the command buffer too.
    fn.vkDestroyCommandPool(device_.handle(), pool_, nullptr);
}

void VulkanGraph::orderAccess(StageClass stage, const BufferRange *reads, size_t readCount,
                              const BufferRange *writes, size_t writeCount,
                              const BufferRange *indirectRead) {
    barriers_.order(stage, reads, readCount, writes, writeCount, indirectRead)
        .record(device_.fn(), commands_);
    const auto add = [this](StageClass c, const BufferRange &range, bool write) {
        const auto [it, added] =
            accessIndex_.try_emplace({c, range.buffer, range.begin, range.end}, accesses_.size());
        if (added)
            accesses_.push_back({c, range, write});
        else
            accesses_[it->second].write |= write;
    };
    for (size_t i = 0; i < readCount; ++i) add(stage, reads[i], false);
    for (size_t i = 0; i < writeCount; ++i) add(stage, writes[i], true);
    if (indirectRead != nullptr) add(StageClass::Indirect, *indirectRead, false);
}

void VulkanGraph::retain(std::shared_ptr<const void> object) {
    if (retained_.empty() || retained_.back() != object) retained_.push_back(std::move(object));
}

VkDescriptorSet VulkanGraph::allocateDescriptorSet(VkDescriptorSetLayout layout) {
    const auto &fn = device_.fn();
    if (setsLeft_ == 0) {
        // The graph's own pools: a stream's per-batch pools are reset once the batch completed.
        const VkDescriptorPoolSize size{VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                        kGraphSetsPerPool * device_.physical().info.max_bindings};
        auto info =
            vkStruct<VkDescriptorPoolCreateInfo>(VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO);
        info.maxSets = kGraphSetsPerPool;
        info.poolSizeCount = 1;
        info.pPoolSizes = &size;
        VkDescriptorPool pool = VK_NULL_HANDLE;
        device_.check(fn.vkCreateDescriptorPool(device_.handle(), &info, nullptr, &pool),
                      "vkCreateDescriptorPool");
        descriptorPools_.push_back(pool);
        setsLeft_ = kGraphSetsPerPool;
    }
    auto info =
        vkStruct<VkDescriptorSetAllocateInfo>(VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO);
    info.descriptorPool = descriptorPools_.back();
    info.descriptorSetCount = 1;
    info.pSetLayouts = &layout;
    VkDescriptorSet set = VK_NULL_HANDLE;
    device_.check(fn.vkAllocateDescriptorSets(device_.handle(), &info, &set),
                  "vkAllocateDescriptorSets");
    --setsLeft_;
    return set;
}

void VulkanGraph::finish() {
    const auto &fn = device_.fn();
    const auto [writeStages, writeAccess] = barriers_.takeWrites();
    if (writeStages != 0) {
        // As at the end of a stream's batch: device writes become visible to host reads after
        // the semaphore wait (a copy into a pinned page read by the host).
        auto barrier = vkStruct<VkMemoryBarrier>(VK_STRUCTURE_TYPE_MEMORY_BARRIER);
        barrier.srcAccessMask = writeAccess;
        barrier.dstAccessMask = VK_ACCESS_HOST_READ_BIT;
        fn.vkCmdPipelineBarrier(commands_, writeStages, VK_PIPELINE_STAGE_HOST_BIT, 0, 1, &barrier,
                                0, nullptr, 0, nullptr);
    }
    device_.check(fn.vkEndCommandBuffer(commands_), "vkEndCommandBuffer");
    accessIndex_.clear();
    bound_.reset();
}

void VulkanGraph::launched(const std::shared_ptr<Timeline> &timeline, uint64_t value) {
    std::lock_guard lock(launchMutex_);
    for (auto &[t, v] : launches_)
        if (t == timeline) {
            v = std::max(v, value);
            return;
        }
    launches_.emplace_back(timeline, value);
}

std::unique_ptr<sdk::Graph> VulkanDevice::createGraph(std::vector<sdk::GraphOp> &ops) {
    failIfUnusable();
    auto graph = std::make_unique<VulkanGraph>(*this);
    for (size_t i = 0; i < ops.size(); ++i) {
        const sdk::GraphOp &op = ops[i];
        try {
            switch (op.kind) {
            case BP_GRAPH_OP_LAUNCH: recordLaunch(*graph, op.launch); break;
            case BP_GRAPH_OP_COPY_HOST_TO_DEVICE: recordHostToDevice(*graph, op.toDevice); break;
            case BP_GRAPH_OP_COPY_DEVICE_TO_HOST: recordDeviceToHost(*graph, op.toHost); break;
            case BP_GRAPH_OP_COPY_DEVICE_TO_DEVICE: recordDeviceToDevice(*graph, op.copy); break;
            case BP_GRAPH_OP_FILL: recordFill(*graph, op.fill); break;
            default:
                throw sdk::Error(BP_ERROR_UNSUPPORTED,
                                 "kind " + std::to_string(sdk::rawValue(op.kind)) +
                                     " cannot be part of a Vulkan graph");
            }
        } catch (const sdk::Error &e) {
            throw sdk::Error(e.code(), "graph_create: op " + std::to_string(i) + ": " + e.what(),
                             e.vendorCode());
        }
    }
    graph->finish();
    return graph;
}

void VulkanDevice::launchGraph(sdk::Stream &stream, sdk::Graph &graph) {
    failIfUnusable();
    auto &s = sdk::as<VulkanStream>(stream);
    auto &g = sdk::as<VulkanGraph>(graph);
    if (&g.device() != this)
        throw sdk::Error(BP_ERROR_INVALID_ARGUMENT,
                         "graph_launch: the graph was created on another device");
    s.submitGraph(g);
    g.launched(s.timeline(), s.submitted());
}

} // namespace backplane::vulkan
