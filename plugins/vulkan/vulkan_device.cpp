// The opened Vulkan device: memory pages, streams (batches on timeline semaphores), events,
// transfers and launches.
#include "vulkan_device.hpp"

#include <algorithm>
#include <cstring>
#include <type_traits>

namespace backplane::vulkan {
namespace {

// Staging chunks for copies from/to host memory that is not one of our pinned pages.
constexpr uint64_t kStagingChunk = 8ull << 20;
constexpr size_t kMaxFreeStaging = 4;
// Above this many tracked ranges a barrier is cheaper than the bookkeeping.
constexpr size_t kMaxTrackedRanges = 256;

bool overlaps(const BufferRange &a, const BufferRange &b) {
    return a.buffer == b.buffer && a.begin < b.end && b.begin < a.end;
}

// What each stage class stands for in a barrier: its stages, the accesses a later command of
// the class makes (destination), and the write access an earlier one made (source).
struct StageClassFlags {
    VkPipelineStageFlags stages;
    VkAccessFlags dstAccess;
    VkAccessFlags writeAccess;
};
constexpr std::array<StageClassFlags, kStageClassCount> kStageClassFlags{{
    {VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT,
     VK_ACCESS_SHADER_WRITE_BIT},
    {VK_PIPELINE_STAGE_DRAW_INDIRECT_BIT, VK_ACCESS_INDIRECT_COMMAND_READ_BIT, 0},
    {VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_READ_BIT | VK_ACCESS_TRANSFER_WRITE_BIT,
     VK_ACCESS_TRANSFER_WRITE_BIT},
}};

VulkanMemory &memoryOf(bp_memory *memory) { return sdk::as<VulkanMemory>(memory); }

void checkRange(const VulkanMemory &memory, uint64_t offset, uint64_t size, const char *what) {
    if (offset > memory.size() || size > memory.size() - offset)
        throw sdk::Error(BP_ERROR_INVALID_ARGUMENT,
                         std::string(what) + ": range [" + std::to_string(offset) + ", +" +
                             std::to_string(size) + ") exceeds the page of " +
                             std::to_string(memory.size()) + " bytes");
}

} // namespace

// ------------------------------------------------------------------------------------------------
// VulkanMemory

VulkanMemory::VulkanMemory(VulkanDevice &device, bp_memory_kind kind, uint64_t size)
    : device_(device), kind_(kind), size_(size) {
    const auto &fn = device.fn();
    auto info = vkStruct<VkBufferCreateInfo>(VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO);
    info.size = size;
    info.usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT |
                 VK_BUFFER_USAGE_TRANSFER_DST_BIT | VK_BUFFER_USAGE_INDIRECT_BUFFER_BIT;
    info.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
    device.check(fn.vkCreateBuffer(device.handle(), &info, nullptr, &buffer_), "vkCreateBuffer");
    try {
        VkMemoryRequirements requirements;
        fn.vkGetBufferMemoryRequirements(device.handle(), buffer_, &requirements);
        const uint32_t type = device.memoryType(kind);
        if (!(requirements.memoryTypeBits & (1u << type)))
            throw sdk::Error(BP_ERROR_UNSUPPORTED,
                             "the Vulkan driver cannot place a storage buffer in memory type " +
                                 std::to_string(type));
        auto allocate = vkStruct<VkMemoryAllocateInfo>(VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO);
        allocate.allocationSize = requirements.size;
        allocate.memoryTypeIndex = type;
        device.check(fn.vkAllocateMemory(device.handle(), &allocate, nullptr, &memory_),
                     "vkAllocateMemory");
        device.check(fn.vkBindBufferMemory(device.handle(), buffer_, memory_, 0),
                     "vkBindBufferMemory");
        const VkMemoryPropertyFlags flags =
            device.physical().memory.memoryTypes[type].propertyFlags;
        if (flags & VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT)
            device.check(fn.vkMapMemory(device.handle(), memory_, 0, VK_WHOLE_SIZE, 0, &mapped_),
                         "vkMapMemory");
    } catch (...) {
        if (memory_ != VK_NULL_HANDLE) fn.vkFreeMemory(device.handle(), memory_, nullptr);
        fn.vkDestroyBuffer(device.handle(), buffer_, nullptr);
        throw;
    }
    if (kind == BP_MEMORY_PINNED_HOST || kind == BP_MEMORY_HOST_VISIBLE)
        device.registerPinned(*this);
}

VulkanMemory::~VulkanMemory() {
    if (kind_ == BP_MEMORY_PINNED_HOST || kind_ == BP_MEMORY_HOST_VISIBLE)
        device_.unregisterPinned(*this);
    const auto &fn = device_.fn();
    // Freeing mapped memory unmaps it implicitly.
    fn.vkDestroyBuffer(device_.handle(), buffer_, nullptr);
    fn.vkFreeMemory(device_.handle(), memory_, nullptr);
}

// ------------------------------------------------------------------------------------------------
// Timeline and events

Timeline::Timeline(VulkanDevice &owner) : device(owner) {
    auto type = vkStruct<VkSemaphoreTypeCreateInfo>(VK_STRUCTURE_TYPE_SEMAPHORE_TYPE_CREATE_INFO);
    type.semaphoreType = VK_SEMAPHORE_TYPE_TIMELINE;
    type.initialValue = 0;
    auto info = vkStruct<VkSemaphoreCreateInfo>(VK_STRUCTURE_TYPE_SEMAPHORE_CREATE_INFO);
    info.pNext = &type;
    device.check(device.fn().vkCreateSemaphore(device.handle(), &info, nullptr, &semaphore),
                 "vkCreateSemaphore");
}

Timeline::~Timeline() { device.fn().vkDestroySemaphore(device.handle(), semaphore, nullptr); }

uint64_t Timeline::completed() const {
    uint64_t value = 0;
    device.check(device.fn().vkGetSemaphoreCounterValue(device.handle(), semaphore, &value),
                 "vkGetSemaphoreCounterValue");
    return value;
}

VulkanEvent::~VulkanEvent() {
    if (querySlot_ >= 0) timeline_->device.releaseQuerySlot(querySlot_, timeline_, value_);
}

// ------------------------------------------------------------------------------------------------
// The barrier rule

void Barrier::record(const DeviceFunctions &fn, VkCommandBuffer commands) const {
    if (dstStages == 0) return;
    auto barrier = vkStruct<VkMemoryBarrier>(VK_STRUCTURE_TYPE_MEMORY_BARRIER);
    barrier.srcAccessMask = srcAccess;
    barrier.dstAccessMask = dstAccess;
    fn.vkCmdPipelineBarrier(commands, srcStages, dstStages, 0, 1, &barrier, 0, nullptr, 0,
                            nullptr);
}

bool BarrierTracker::conflicts(StageClass stage, const BufferRange &range, bool write) const {
    for (const PendingAccess &p : pending_[static_cast<size_t>(stage)])
        if ((write || p.writes != 0) && overlaps(range, p.range)) return true;
    return false;
}

Barrier BarrierTracker::barrierTowards(uint32_t hazards) {
    // Above this many tracked ranges a barrier is cheaper than the bookkeeping.
    for (size_t c = 0; c < kStageClassCount; ++c)
        if (pending_[c].size() > kMaxTrackedRanges) hazards |= 1u << c;
    Barrier barrier;
    for (size_t c = 0; c < kStageClassCount; ++c) {
        if (!(hazards & (1u << c))) continue;
        for (const PendingAccess &p : pending_[c]) {
            barrier.srcStages |= p.stages;
            barrier.srcAccess |= p.writes;
        }
        barrier.dstStages |= kStageClassFlags[c].stages;
        barrier.dstAccess |= kStageClassFlags[c].dstAccess;
        pending_[c].clear();
    }
    return barrier;
}

void BarrierTracker::note(StageClass stage, const BufferRange &range, bool write) {
    // Every access stays pending for each stage class until a barrier towards that class. The
    // same range used again (the common case: a kernel over the same buffers) widens its entry
    // instead of growing the list.
    const StageClassFlags &flags = kStageClassFlags[static_cast<size_t>(stage)];
    const VkAccessFlags writes = write ? flags.writeAccess : 0;
    for (auto &pending : pending_) {
        bool found = false;
        for (PendingAccess &p : pending)
            if (p.range.buffer == range.buffer && p.range.begin == range.begin &&
                p.range.end == range.end) {
                p.stages |= flags.stages;
                p.writes |= writes;
                found = true;
                break;
            }
        if (!found) pending.push_back({range, flags.stages, writes});
    }
}

Barrier BarrierTracker::order(StageClass stage, const BufferRange *reads, size_t readCount,
                              const BufferRange *writes, size_t writeCount,
                              const BufferRange *indirectRead) {
    uint32_t hazards = 0; // bit per stage class whose pending accesses must be ordered first
    const uint32_t bit = 1u << static_cast<uint32_t>(stage);
    for (size_t i = 0; i < readCount && !(hazards & bit); ++i)
        if (conflicts(stage, reads[i], false)) hazards |= bit;
    for (size_t i = 0; i < writeCount && !(hazards & bit); ++i)
        if (conflicts(stage, writes[i], true)) hazards |= bit;
    if (indirectRead != nullptr && conflicts(StageClass::Indirect, *indirectRead, false))
        hazards |= 1u << static_cast<uint32_t>(StageClass::Indirect);
    const Barrier barrier = barrierTowards(hazards);
    for (size_t i = 0; i < readCount; ++i) note(stage, reads[i], false);
    for (size_t i = 0; i < writeCount; ++i) note(stage, writes[i], true);
    if (indirectRead != nullptr) note(StageClass::Indirect, *indirectRead, false);
    if (writeCount > 0) {
        const StageClassFlags &flags = kStageClassFlags[static_cast<size_t>(stage)];
        writeStages_ |= flags.stages;
        writeAccess_ |= flags.writeAccess;
    }
    return barrier;
}

Barrier BarrierTracker::order(const std::vector<Access> &accesses) {
    uint32_t hazards = 0;
    for (const Access &a : accesses)
        if (conflicts(a.stage, a.range, a.write)) hazards |= 1u << static_cast<uint32_t>(a.stage);
    const Barrier barrier = barrierTowards(hazards);
    for (const Access &a : accesses) note(a.stage, a.range, a.write);
    return barrier;
}

std::pair<VkPipelineStageFlags, VkAccessFlags> BarrierTracker::takeWrites() noexcept {
    const std::pair<VkPipelineStageFlags, VkAccessFlags> writes{writeStages_, writeAccess_};
    writeStages_ = 0;
    writeAccess_ = 0;
    return writes;
}

// ------------------------------------------------------------------------------------------------
// VulkanStream

VulkanStream::VulkanStream(VulkanDevice &device, uint32_t queueIndex)
    : device_(device), queueIndex_(queueIndex), timeline_(std::make_shared<Timeline>(device)) {
    auto info = vkStruct<VkCommandPoolCreateInfo>(VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO);
    info.flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT;
    info.queueFamilyIndex = device.physical().queueFamily;
    device.check(device.fn().vkCreateCommandPool(device.handle(), &info, nullptr, &pool_),
                 "vkCreateCommandPool");
}

VulkanStream::~VulkanStream() {
    // The SDK's contract: destroying a stream waits for its work. Unsubmitted commands are
    // submitted first so that nothing recorded is silently dropped.
    try {
        if (hasPendingWork()) submit(false);
        waitIdle();
    } catch (...) { // NOLINT(bugprone-empty-catch): a lost device has nothing left to wait for
    }
    const auto &fn = device_.fn();
    auto destroySlot = [&](Slot &slot) {
        if (slot.descriptors != VK_NULL_HANDLE)
            fn.vkDestroyDescriptorPool(device_.handle(), slot.descriptors, nullptr);
    };
    for (Slot &slot : free_) destroySlot(slot);
    for (Slot &slot : inFlight_) destroySlot(slot);
    if (slot_) destroySlot(*slot_);
    fn.vkDestroyCommandPool(device_.handle(), pool_, nullptr);
}

void VulkanStream::recycle(Slot &slot) {
    slot.value = 0;
    slot.stagingUsed = 0;
    for (auto &staging : slot.staging)
        if (staging->size() == kStagingChunk && freeStaging_.size() < kMaxFreeStaging)
            freeStaging_.push_back(std::move(staging));
    slot.staging.clear();
    slot.retained.clear();
    if (slot.descriptors != VK_NULL_HANDLE)
        device_.check(device_.fn().vkResetDescriptorPool(device_.handle(), slot.descriptors, 0),
                      "vkResetDescriptorPool");
}

void VulkanStream::retain(std::shared_ptr<const void> object) {
    record(); // a batch is open
    auto &retained = slot_->retained;
    // Launches of one kernel in a row keep one reference.
    if (retained.empty() || retained.back() != object) retained.push_back(std::move(object));
}

VulkanStream::Slot VulkanStream::acquireSlot() {
    // Recycle the batches the device finished; one counter query covers them all.
    if (!inFlight_.empty() && (free_.empty() || inFlight_.front().value <= timeline_->completed())) {
        const uint64_t done = timeline_->completed();
        while (!inFlight_.empty() && inFlight_.front().value <= done) {
            recycle(inFlight_.front());
            free_.push_back(std::move(inFlight_.front()));
            inFlight_.pop_front();
        }
    }
    if (!free_.empty()) {
        Slot slot = std::move(free_.back());
        free_.pop_back();
        return slot;
    }
    Slot slot;
    auto info = vkStruct<VkCommandBufferAllocateInfo>(VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO);
    info.commandPool = pool_;
    info.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
    info.commandBufferCount = 1;
    device_.check(device_.fn().vkAllocateCommandBuffers(device_.handle(), &info, &slot.commands),
                  "vkAllocateCommandBuffers");
    if (!device_.physical().pushDescriptor) {
        const uint32_t sets = device_.physical().batchCommands;
        const VkDescriptorPoolSize size{VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                        sets * device_.physical().info.max_bindings};
        auto pool = vkStruct<VkDescriptorPoolCreateInfo>(VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO);
        pool.maxSets = sets;
        pool.poolSizeCount = 1;
        pool.pPoolSizes = &size;
        device_.check(
            device_.fn().vkCreateDescriptorPool(device_.handle(), &pool, nullptr, &slot.descriptors),
            "vkCreateDescriptorPool");
    }
    return slot;
}

VkCommandBuffer VulkanStream::record() {
    if (!slot_) {
        slot_ = acquireSlot();
        auto begin = vkStruct<VkCommandBufferBeginInfo>(VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO);
        begin.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
        device_.check(device_.fn().vkBeginCommandBuffer(slot_->commands, &begin),
                      "vkBeginCommandBuffer");
        bound_.clear();
    }
    return slot_->commands;
}

void VulkanStream::orderAccess(StageClass stage, const BufferRange *reads, size_t readCount,
                               const BufferRange *writes, size_t writeCount,
                               const BufferRange *indirectRead) {
    const Barrier barrier =
        barriers_.order(stage, reads, readCount, writes, writeCount, indirectRead);
    VkCommandBuffer commands = record();
    barrier.record(device_.fn(), commands);
}

void VulkanStream::commandRecorded() {
    if (++commandCount_ >= device_.physical().batchCommands) submit(false);
}

int32_t VulkanStream::submit(bool timing, VkCommandBuffer graph) {
    const auto &fn = device_.fn();
    int32_t querySlot = -1;
    if (timing) {
        querySlot = device_.acquireQuerySlot();
        VkCommandBuffer commands = record();
        fn.vkCmdResetQueryPool(commands, device_.queryPool(), static_cast<uint32_t>(querySlot), 1);
        fn.vkCmdWriteTimestamp(commands, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, device_.queryPool(),
                               static_cast<uint32_t>(querySlot));
    }
    const auto [writeStages, writeAccess] = barriers_.takeWrites();
    if (slot_) {
        if (writeStages != 0) {
            // Device writes become visible to host reads after the semaphore wait.
            auto barrier = vkStruct<VkMemoryBarrier>(VK_STRUCTURE_TYPE_MEMORY_BARRIER);
            barrier.srcAccessMask = writeAccess;
            barrier.dstAccessMask = VK_ACCESS_HOST_READ_BIT;
            fn.vkCmdPipelineBarrier(slot_->commands, writeStages, VK_PIPELINE_STAGE_HOST_BIT, 0, 1,
                                    &barrier, 0, nullptr, 0, nullptr);
        }
        device_.check(fn.vkEndCommandBuffer(slot_->commands), "vkEndCommandBuffer");
    }
    VkCommandBuffer commandBuffers[2];
    uint32_t commandBufferCount = 0;
    if (slot_) commandBuffers[commandBufferCount++] = slot_->commands;
    if (graph != VK_NULL_HANDLE) commandBuffers[commandBufferCount++] = graph;
    std::vector<VkSemaphore> waitSemaphores;
    std::vector<uint64_t> waitValues;
    std::vector<VkPipelineStageFlags> waitStages;
    for (const auto &[timeline, value] : waits_) {
        waitSemaphores.push_back(timeline->semaphore);
        waitValues.push_back(value);
        waitStages.push_back(VK_PIPELINE_STAGE_ALL_COMMANDS_BIT);
    }
    const uint64_t signalValue = submitted_ + 1;
    auto values = vkStruct<VkTimelineSemaphoreSubmitInfo>(VK_STRUCTURE_TYPE_TIMELINE_SEMAPHORE_SUBMIT_INFO);
    values.waitSemaphoreValueCount = static_cast<uint32_t>(waitValues.size());
    values.pWaitSemaphoreValues = waitValues.data();
    values.signalSemaphoreValueCount = 1;
    values.pSignalSemaphoreValues = &signalValue;
    auto info = vkStruct<VkSubmitInfo>(VK_STRUCTURE_TYPE_SUBMIT_INFO);
    info.pNext = &values;
    info.waitSemaphoreCount = static_cast<uint32_t>(waitSemaphores.size());
    info.pWaitSemaphores = waitSemaphores.data();
    info.pWaitDstStageMask = waitStages.data();
    info.commandBufferCount = commandBufferCount;
    info.pCommandBuffers = commandBufferCount > 0 ? commandBuffers : nullptr;
    info.signalSemaphoreCount = 1;
    info.pSignalSemaphores = &timeline_->semaphore;
    try {
        device_.submit(queueIndex_, info);
    } catch (...) {
        if (querySlot >= 0) device_.releaseQuerySlot(querySlot, nullptr, 0);
        throw;
    }
    submitted_ = signalValue;
    if (slot_) {
        slot_->value = signalValue;
        inFlight_.push_back(std::move(*slot_));
        slot_.reset();
    }
    waits_.clear();
    commandCount_ = 0;
    return querySlot;
}

void VulkanStream::submitGraph(const VulkanGraph &graph) {
    // The barrier goes at the end of the open batch (opened for it if need be): its second
    // scope covers the graph's commands, which come later in submission order.
    const Barrier barrier = barriers_.order(graph.accesses());
    if (barrier.dstStages != 0) barrier.record(device_.fn(), record());
    submit(false, graph.record());
}

void VulkanStream::waitOn(std::shared_ptr<Timeline> timeline, uint64_t value) {
    if (value == 0 || timeline == timeline_) return; // complete, or ordered already
    for (auto &[t, v] : waits_)
        if (t == timeline) {
            v = std::max(v, value);
            return;
        }
    waits_.emplace_back(std::move(timeline), value);
}

void VulkanStream::waitIdle() {
    if (submitted_ == 0) return;
    auto info = vkStruct<VkSemaphoreWaitInfo>(VK_STRUCTURE_TYPE_SEMAPHORE_WAIT_INFO);
    info.semaphoreCount = 1;
    info.pSemaphores = &timeline_->semaphore;
    info.pValues = &submitted_;
    device_.check(device_.fn().vkWaitSemaphores(device_.handle(), &info, UINT64_MAX),
                  "vkWaitSemaphores");
}

VulkanStream::Staging VulkanStream::staging(uint64_t size) {
    record();
    Slot &slot = *slot_;
    const uint64_t aligned = (size + 15) & ~uint64_t{15};
    if (slot.staging.empty() || slot.staging.back()->size() - slot.stagingUsed < aligned) {
        if (aligned <= kStagingChunk && !freeStaging_.empty()) {
            slot.staging.push_back(std::move(freeStaging_.back()));
            freeStaging_.pop_back();
        } else {
            slot.staging.push_back(std::make_unique<VulkanMemory>(
                device_, BP_MEMORY_PINNED_HOST, std::max(aligned, kStagingChunk)));
        }
        slot.stagingUsed = 0;
    }
    VulkanMemory *memory = slot.staging.back().get();
    Staging result{memory, slot.stagingUsed,
                   static_cast<unsigned char *>(memory->mapped()) + slot.stagingUsed};
    slot.stagingUsed += aligned;
    return result;
}

VkDescriptorSet VulkanStream::allocateDescriptorSet(VkDescriptorSetLayout layout) {
    record();
    auto info = vkStruct<VkDescriptorSetAllocateInfo>(VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO);
    info.descriptorPool = slot_->descriptors;
    info.descriptorSetCount = 1;
    info.pSetLayouts = &layout;
    VkDescriptorSet set = VK_NULL_HANDLE;
    device_.check(device_.fn().vkAllocateDescriptorSets(device_.handle(), &info, &set),
                  "vkAllocateDescriptorSets");
    return set;
}

// ------------------------------------------------------------------------------------------------
// VulkanDevice

VulkanDevice::VulkanDevice(VulkanPlugin &plugin, Instance &instance,
                           const PhysicalDevice &physical, bool validation)
    : plugin_(plugin), instance_(instance), physical_(physical), validation_(validation) {
    const VulkanLibrary &lib = instance.library();
    validationSeen_ = instance.validationErrors();

    // Enable what the device offers that compute shaders may use: at least every feature its
    // description (the kernel features) counts on, only ever what the device supports.
    DeviceFeatures features(lib, physical.handle, physical.featureExtensions);
    std::vector<const char *> extensions;
    const void *featureChain = features.enableForOpen(extensions);

    std::vector<float> priorities(physical.queueCount, 1.0f);
    auto queueInfo = vkStruct<VkDeviceQueueCreateInfo>(VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO);
    queueInfo.queueFamilyIndex = physical.queueFamily;
    queueInfo.queueCount = physical.queueCount;
    queueInfo.pQueuePriorities = priorities.data();

    if (physical.pushDescriptor) extensions.push_back(VK_KHR_PUSH_DESCRIPTOR_EXTENSION_NAME);

    auto info = vkStruct<VkDeviceCreateInfo>(VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO);
    info.pNext = featureChain;
    info.queueCreateInfoCount = 1;
    info.pQueueCreateInfos = &queueInfo;
    info.enabledExtensionCount = static_cast<uint32_t>(extensions.size());
    info.ppEnabledExtensionNames = extensions.data();
    check(lib.vkCreateDevice(physical.handle, &info, nullptr, &device_), "vkCreateDevice");
    try {
        fn_.load(lib, device_, physical.pushDescriptor);
        if (physical.pushDescriptor && fn_.vkCmdPushDescriptorSetKHR == nullptr)
            physical_.pushDescriptor = false;
        for (uint32_t i = 0; i < physical.queueCount; ++i) {
            auto queue = std::make_unique<Queue>();
            fn_.vkGetDeviceQueue(device_, physical.queueFamily, i, &queue->queue);
            queues_.push_back(std::move(queue));
        }
        chooseMemoryTypes();
        if (physical.timestampValidBits > 0) {
            auto query = vkStruct<VkQueryPoolCreateInfo>(VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO);
            query.queryType = VK_QUERY_TYPE_TIMESTAMP;
            query.queryCount = kQuerySlots;
            check(fn_.vkCreateQueryPool(device_, &query, nullptr, &queryPool_),
                  "vkCreateQueryPool");
            for (int32_t i = kQuerySlots - 1; i >= 0; --i) freeQueries_.push_back(i);
        }
        loadPipelineCache();
    } catch (...) {
        if (queryPool_ != VK_NULL_HANDLE) fn_.vkDestroyQueryPool(device_, queryPool_, nullptr);
        if (fn_.vkDestroyDevice != nullptr) fn_.vkDestroyDevice(device_, nullptr);
        throw;
    }
    std::string enabled;
    for (const char *name : extensions) enabled += std::string(", ") + name;
    plugin_.log(BP_LOG_INFO, "opened " + std::string(physical.info.name) + " (" +
                                 std::to_string(physical.queueCount) + " compute queues, " +
                                 (physical_.pushDescriptor ? "push descriptors" : "descriptor pools") +
                                 enabled + ")");
}

VulkanDevice::~VulkanDevice() {
    if (!lost_) fn_.vkDeviceWaitIdle(device_);
    copyKernel_.reset();
    savePipelineCache();
    retiredQueries_.clear(); // they hold timelines (semaphores) of destroyed streams
    for (auto &[count, layout] : layouts_) {
        fn_.vkDestroyPipelineLayout(device_, layout.second, nullptr);
        fn_.vkDestroyDescriptorSetLayout(device_, layout.first, nullptr);
    }
    if (pipelineCache_ != VK_NULL_HANDLE) fn_.vkDestroyPipelineCache(device_, pipelineCache_, nullptr);
    if (queryPool_ != VK_NULL_HANDLE) fn_.vkDestroyQueryPool(device_, queryPool_, nullptr);
    fn_.vkDestroyDevice(device_, nullptr);
}

void VulkanDevice::check(VkResult result, const char *what) {
    if (result == VK_ERROR_DEVICE_LOST && !lost_.exchange(true))
        plugin_.log(BP_LOG_ERROR, std::string("device ") + physical_.info.name + " lost in " + what);
    vulkan::check(result, what);
}

void VulkanDevice::failIfUnusable() {
    if (lost_)
        throw sdk::Error(BP_ERROR_DEVICE_LOST,
                         std::string("Vulkan device ") + physical_.info.name +
                             " was lost earlier; close it and open it again",
                         VK_ERROR_DEVICE_LOST);
    if (validation_) {
        const uint64_t errors = instance_.validationErrors();
        if (errors != validationSeen_) {
            const uint64_t fresh = errors - validationSeen_;
            validationSeen_ = errors;
            throw sdk::Error(BP_ERROR_INTERNAL,
                             "the Vulkan validation layer reported " + std::to_string(fresh) +
                                 " error(s); first: " + instance_.firstValidationError());
        }
    }
}

void VulkanDevice::chooseMemoryTypes() {
    const VkPhysicalDeviceMemoryProperties &memory = physical_.memory;
    auto find = [&](VkMemoryPropertyFlags required, VkMemoryPropertyFlags avoid) -> int {
        for (uint32_t t = 0; t < memory.memoryTypeCount; ++t) {
            const VkMemoryPropertyFlags flags = memory.memoryTypes[t].propertyFlags;
            if ((flags & required) == required && !(flags & avoid)) return static_cast<int>(t);
        }
        return -1;
    };
    constexpr VkMemoryPropertyFlags kLocal = VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT;
    constexpr VkMemoryPropertyFlags kHost =
        VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
    // DEVICE pages: device-local without host visibility (the big VRAM heap on a discrete GPU);
    // on lavapipe / integrated GPUs every device-local type is host-visible.
    int device = find(kLocal, VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT);
    if (device < 0) device = find(kLocal, 0);
    if (device < 0) device = 0;
    // PINNED_HOST: host memory, cached when possible (reads back fast), not device-local.
    int pinned = find(kHost | VK_MEMORY_PROPERTY_HOST_CACHED_BIT, kLocal);
    if (pinned < 0) pinned = find(kHost, kLocal);
    if (pinned < 0) pinned = find(kHost, 0);
    int visible = find(kLocal | kHost, 0);
    if (visible < 0) visible = find(kHost, 0);
    if (pinned < 0 || visible < 0)
        throw sdk::Error(BP_ERROR_UNSUPPORTED, std::string(physical_.info.name) +
                                                   " has no host-visible coherent memory type");
    deviceType_ = static_cast<uint32_t>(device);
    pinnedType_ = static_cast<uint32_t>(pinned);
    hostVisibleType_ = static_cast<uint32_t>(visible);
    deviceMappable_ = (physical_.info.capabilities & BP_CAPABILITY_MAPPABLE_DEVICE_MEMORY) != 0;
}

uint32_t VulkanDevice::memoryType(bp_memory_kind kind) const noexcept {
    switch (kind) {
    case BP_MEMORY_PINNED_HOST: return pinnedType_;
    case BP_MEMORY_HOST_VISIBLE: return hostVisibleType_;
    default: return deviceType_;
    }
}

void VulkanDevice::registerPinned(VulkanMemory &memory) {
    std::lock_guard lock(pinnedMutex_);
    pinned_[reinterpret_cast<uintptr_t>(memory.mapped())] = &memory;
}

void VulkanDevice::unregisterPinned(VulkanMemory &memory) {
    std::lock_guard lock(pinnedMutex_);
    pinned_.erase(reinterpret_cast<uintptr_t>(memory.mapped()));
}

VulkanMemory *VulkanDevice::findPinned(const void *ptr, uint64_t size, uint64_t &offset) {
    const auto address = reinterpret_cast<uintptr_t>(ptr);
    std::lock_guard lock(pinnedMutex_);
    auto it = pinned_.upper_bound(address);
    if (it == pinned_.begin()) return nullptr;
    --it;
    VulkanMemory *memory = it->second;
    const uint64_t at = address - it->first;
    if (at >= memory->size() || size > memory->size() - at) return nullptr;
    offset = at;
    return memory;
}

int32_t VulkanDevice::acquireQuerySlot() {
    if (queryPool_ == VK_NULL_HANDLE)
        throw sdk::Error(BP_ERROR_UNSUPPORTED, std::string(physical_.info.name) +
                                                   " has no compute timestamps (timing events)");
    std::lock_guard lock(queryMutex_);
    // A released slot is reused only after the batch that writes it finished on the device.
    for (auto it = retiredQueries_.begin(); it != retiredQueries_.end();) {
        if (!it->timeline || it->timeline->completed() >= it->value) {
            freeQueries_.push_back(it->slot);
            it = retiredQueries_.erase(it);
        } else {
            ++it;
        }
    }
    if (freeQueries_.empty())
        throw sdk::Error(BP_ERROR_OUT_OF_MEMORY,
                         "all " + std::to_string(kQuerySlots) +
                             " timestamp slots are held by live timing events; release some");
    const int32_t slot = freeQueries_.back();
    freeQueries_.pop_back();
    return slot;
}

void VulkanDevice::releaseQuerySlot(int32_t slot, std::shared_ptr<Timeline> timeline,
                                    uint64_t value) {
    std::lock_guard lock(queryMutex_);
    retiredQueries_.push_back({slot, std::move(timeline), value});
}

void VulkanDevice::submit(uint32_t index, const VkSubmitInfo &info) {
    Queue &queue = *queues_[index];
    std::lock_guard lock(queue.mutex);
    check(fn_.vkQueueSubmit(queue.queue, 1, &info, VK_NULL_HANDLE), "vkQueueSubmit");
}

std::pair<VkDescriptorSetLayout, VkPipelineLayout> VulkanDevice::layout(uint32_t bindingCount) {
    std::lock_guard lock(layoutMutex_);
    if (auto it = layouts_.find(bindingCount); it != layouts_.end()) return it->second;
    std::vector<VkDescriptorSetLayoutBinding> bindings(bindingCount);
    for (uint32_t i = 0; i < bindingCount; ++i) {
        bindings[i].binding = i;
        bindings[i].descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
        bindings[i].descriptorCount = 1;
        bindings[i].stageFlags = VK_SHADER_STAGE_COMPUTE_BIT;
    }
    auto setInfo = vkStruct<VkDescriptorSetLayoutCreateInfo>(VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO);
    if (physical_.pushDescriptor)
        setInfo.flags = VK_DESCRIPTOR_SET_LAYOUT_CREATE_PUSH_DESCRIPTOR_BIT_KHR;
    setInfo.bindingCount = bindingCount;
    setInfo.pBindings = bindings.data();
    VkDescriptorSetLayout setLayout = VK_NULL_HANDLE;
    check(fn_.vkCreateDescriptorSetLayout(device_, &setInfo, nullptr, &setLayout),
          "vkCreateDescriptorSetLayout");
    // One push-constant range of the device's full size: a shader may use any prefix of it.
    const VkPushConstantRange range{VK_SHADER_STAGE_COMPUTE_BIT, 0,
                                    physical_.info.max_scalar_bytes};
    auto layoutInfo = vkStruct<VkPipelineLayoutCreateInfo>(VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO);
    layoutInfo.setLayoutCount = 1;
    layoutInfo.pSetLayouts = &setLayout;
    layoutInfo.pushConstantRangeCount = range.size > 0 ? 1 : 0;
    layoutInfo.pPushConstantRanges = &range;
    VkPipelineLayout pipelineLayout = VK_NULL_HANDLE;
    const VkResult result =
        fn_.vkCreatePipelineLayout(device_, &layoutInfo, nullptr, &pipelineLayout);
    if (result != VK_SUCCESS) fn_.vkDestroyDescriptorSetLayout(device_, setLayout, nullptr);
    check(result, "vkCreatePipelineLayout");
    layouts_[bindingCount] = {setLayout, pipelineLayout};
    return {setLayout, pipelineLayout};
}

std::unique_ptr<sdk::Memory> VulkanDevice::allocate(const bp_memory_allocate_args &args,
                                                    void **mapped) {
    failIfUnusable();
    if (args.size == 0)
        throw sdk::Error(BP_ERROR_INVALID_ARGUMENT, "memory_allocate: size must be > 0");
    if (args.kind != BP_MEMORY_DEVICE && args.kind != BP_MEMORY_PINNED_HOST &&
        args.kind != BP_MEMORY_HOST_VISIBLE)
        throw sdk::Error(BP_ERROR_INVALID_ARGUMENT, "memory_allocate: unknown memory kind");
    // The declared limit is kept, so that what device_info promises is what allocation does.
    if (args.size > physical_.info.max_allocation_bytes)
        throw sdk::Error(BP_ERROR_OUT_OF_MEMORY,
                         "memory_allocate: " + std::to_string(args.size) +
                             " bytes exceed max_allocation_bytes " +
                             std::to_string(physical_.info.max_allocation_bytes) +
                             " of this device; allocate smaller pages");
    auto memory = std::make_unique<VulkanMemory>(*this, args.kind, args.size);
    *mapped = args.kind == BP_MEMORY_DEVICE ? nullptr : memory->mapped();
    return memory;
}

void *VulkanDevice::map(sdk::Memory &memory) {
    auto &page = sdk::as<VulkanMemory>(memory);
    if (page.mapped() == nullptr || (page.kind() == BP_MEMORY_DEVICE && !deviceMappable_))
        sdk::unsupported("memory_map of a device page on this Vulkan device");
    return page.mapped();
}

std::unique_ptr<sdk::Stream> VulkanDevice::createStream(const bp_stream_create_args &) {
    failIfUnusable();
    const uint32_t queue = nextQueue_.fetch_add(1) % static_cast<uint32_t>(queues_.size());
    return std::make_unique<VulkanStream>(*this, queue);
}

std::unique_ptr<sdk::Event> VulkanDevice::flush(sdk::Stream &stream, const bp_flush_args &args,
                                                bool wantEvent) {
    failIfUnusable();
    auto &s = sdk::as<VulkanStream>(stream);
    const bool timing = wantEvent && (args.flags & BP_FLUSH_TIMING_EVENT);
    int32_t querySlot = -1;
    // Nothing recorded and no timestamp wanted: the last submit's value is the event.
    if (s.hasPendingWork() || timing) querySlot = s.submit(timing);
    failIfUnusable();
    if (!wantEvent) return nullptr;
    return std::make_unique<VulkanEvent>(s.timeline(), s.submitted(), querySlot);
}

void VulkanDevice::waitEvent(sdk::Stream &stream, sdk::Event &event) {
    failIfUnusable();
    auto &e = sdk::as<VulkanEvent>(event);
    sdk::as<VulkanStream>(stream).waitOn(e.timeline(), e.value());
}

bool VulkanDevice::eventWait(sdk::Event &event, uint64_t timeoutNs) {
    failIfUnusable();
    auto &e = sdk::as<VulkanEvent>(event);
    if (e.value() == 0) return true;
    auto info = vkStruct<VkSemaphoreWaitInfo>(VK_STRUCTURE_TYPE_SEMAPHORE_WAIT_INFO);
    info.semaphoreCount = 1;
    const uint64_t value = e.value();
    info.pSemaphores = &e.timeline()->semaphore;
    info.pValues = &value;
    const VkResult result = fn_.vkWaitSemaphores(device_, &info, timeoutNs);
    if (result == VK_TIMEOUT) return false;
    check(result, "vkWaitSemaphores");
    failIfUnusable();
    return true;
}

bool VulkanDevice::eventQuery(sdk::Event &event) {
    failIfUnusable();
    auto &e = sdk::as<VulkanEvent>(event);
    return e.value() == 0 || e.timeline()->completed() >= e.value();
}

uint64_t VulkanDevice::elapsedNs(sdk::Event &start, sdk::Event &end) {
    failIfUnusable();
    auto &a = sdk::as<VulkanEvent>(start);
    auto &b = sdk::as<VulkanEvent>(end);
    if (a.querySlot() < 0 || b.querySlot() < 0)
        throw sdk::Error(BP_ERROR_INVALID_ARGUMENT,
                         "event_elapsed_ns needs two events flushed with BP_FLUSH_TIMING_EVENT");
    if (!eventQuery(a) || !eventQuery(b))
        throw sdk::Error(BP_ERROR_NOT_READY, "event_elapsed_ns: an event has not completed yet");
    uint64_t ticks[2];
    for (int i = 0; i < 2; ++i) {
        const auto slot = static_cast<uint32_t>((i == 0 ? a : b).querySlot());
        check(fn_.vkGetQueryPoolResults(device_, queryPool_, slot, 1, sizeof(uint64_t), &ticks[i],
                                        sizeof(uint64_t), VK_QUERY_RESULT_64_BIT),
              "vkGetQueryPoolResults");
    }
    const uint32_t bits = physical_.timestampValidBits;
    const uint64_t mask = bits >= 64 ? ~uint64_t{0} : ((uint64_t{1} << bits) - 1);
    const uint64_t delta = ((ticks[1] & mask) - (ticks[0] & mask)) & mask;
    if ((ticks[1] & mask) < (ticks[0] & mask)) return 0; // end before start: not a duration
    return static_cast<uint64_t>(static_cast<double>(delta) *
                                 physical_.properties.limits.timestampPeriod);
}

void VulkanDevice::copyHostToDevice(sdk::Stream &stream, const bp_copy_host_to_device_args &args) {
    failIfUnusable();
    recordHostToDevice(sdk::as<VulkanStream>(stream), args);
}

void VulkanDevice::copyDeviceToHost(sdk::Stream &stream, const bp_copy_device_to_host_args &args) {
    failIfUnusable();
    recordDeviceToHost(sdk::as<VulkanStream>(stream), args);
}

void VulkanDevice::copyDeviceToDevice(sdk::Stream &stream,
                                      const bp_copy_device_to_device_args &args) {
    failIfUnusable();
    recordDeviceToDevice(sdk::as<VulkanStream>(stream), args);
}

void VulkanDevice::fill(sdk::Stream &stream, const bp_fill_args &args) {
    failIfUnusable();
    recordFill(sdk::as<VulkanStream>(stream), args);
}

void VulkanDevice::launch(sdk::Stream &stream, const bp_launch_args &args) {
    failIfUnusable();
    recordLaunch(sdk::as<VulkanStream>(stream), args);
}

template <class Recorder>
void VulkanDevice::recordBufferCopy(Recorder &r, const VulkanMemory &src, uint64_t srcOffset,
                                    const VulkanMemory &dst, uint64_t dstOffset, uint64_t size) {
    const BufferRange read{src.buffer(), srcOffset, srcOffset + size};
    const BufferRange write{dst.buffer(), dstOffset, dstOffset + size};
    r.orderAccess(StageClass::Transfer, &read, 1, &write, 1);
    const VkBufferCopy region{srcOffset, dstOffset, size};
    fn_.vkCmdCopyBuffer(r.record(), src.buffer(), dst.buffer(), 1, &region);
    r.commandRecorded();
}

template <class Recorder>
void VulkanDevice::recordHostToDevice(Recorder &r, const bp_copy_host_to_device_args &args) {
    VulkanMemory &dst = memoryOf(args.dst);
    checkRange(dst, args.dst_offset, args.size, "copy_host_to_device");
    if (args.size == 0) return;
    if (args.src == nullptr)
        throw sdk::Error(BP_ERROR_INVALID_ARGUMENT, "copy_host_to_device: src is NULL");
    uint64_t srcOffset = 0;
    VulkanMemory *src = findPinned(args.src, args.size, srcOffset);
    if (src == nullptr) {
        if constexpr (std::is_same_v<Recorder, VulkanGraph>) {
            // A graph reads its source at every replay: only a page of ours can be named.
            throw sdk::Error(BP_ERROR_INVALID_ARGUMENT,
                             "copy_host_to_device in a graph: the source is not inside a "
                             "PINNED_HOST or HOST_VISIBLE page of this device");
        } else {
            // Not our memory: copy it into staging now (the caller's buffer is free at return).
            const auto staging = r.staging(args.size);
            std::memcpy(staging.host, args.src, args.size);
            src = staging.memory;
            srcOffset = staging.offset;
        }
    }
    recordBufferCopy(r, *src, srcOffset, dst, args.dst_offset, args.size);
}

template <class Recorder>
void VulkanDevice::recordDeviceToHost(Recorder &r, const bp_copy_device_to_host_args &args) {
    VulkanMemory &src = memoryOf(args.src);
    checkRange(src, args.src_offset, args.size, "copy_device_to_host");
    if (args.size == 0) return;
    if (args.dst == nullptr)
        throw sdk::Error(BP_ERROR_INVALID_ARGUMENT, "copy_device_to_host: dst is NULL");
    uint64_t dstOffset = 0;
    if (VulkanMemory *dst = findPinned(args.dst, args.size, dstOffset)) {
        recordBufferCopy(r, src, args.src_offset, *dst, dstOffset, args.size);
        return;
    }
    if constexpr (std::is_same_v<Recorder, VulkanGraph>) {
        throw sdk::Error(BP_ERROR_INVALID_ARGUMENT,
                         "copy_device_to_host in a graph: the destination is not inside a "
                         "PINNED_HOST or HOST_VISIBLE page of this device");
    } else {
        // Not our memory: nothing on the device can write there, so the copy completes at the
        // call (through staging, chunk by chunk). The core stages pageable reads through pinned
        // pages itself, so this path is for direct ABI users.
        for (uint64_t done = 0; done < args.size;) {
            const uint64_t chunk = std::min(args.size - done, kStagingChunk);
            const auto staging = r.staging(chunk);
            recordBufferCopy(r, src, args.src_offset + done, *staging.memory, staging.offset,
                             chunk);
            r.submit(false);
            r.waitIdle();
            std::memcpy(static_cast<unsigned char *>(args.dst) + done, staging.host, chunk);
            done += chunk;
        }
        failIfUnusable();
    }
}

template <class Recorder>
void VulkanDevice::recordDeviceToDevice(Recorder &r, const bp_copy_device_to_device_args &args) {
    VulkanMemory &src = memoryOf(args.src);
    VulkanMemory &dst = memoryOf(args.dst);
    checkRange(src, args.src_offset, args.size, "copy_device_to_device (source)");
    checkRange(dst, args.dst_offset, args.size, "copy_device_to_device (destination)");
    if (args.size == 0) return;
    if (&src == &dst && args.src_offset < args.dst_offset + args.size &&
        args.dst_offset < args.src_offset + args.size)
        throw sdk::Error(BP_ERROR_INVALID_ARGUMENT,
                         "copy_device_to_device: source and destination overlap");
    const uint64_t align = physical_.info.binding_alignment;
    if (physical_.shaderCopy && args.size >= (1u << 20) && args.size % 16 == 0 &&
        args.src_offset % align == 0 && args.dst_offset % align == 0) {
        // One dispatch per binding-range-sized chunk (maxStorageBufferRange, 128 MiB on lavapipe).
        const uint64_t lcm = std::max<uint64_t>(align, 16);
        const uint64_t chunk = std::min<uint64_t>(physical_.maxStorageBufferRange, 1ull << 32) /
                               lcm * lcm;
        for (uint64_t done = 0; done < args.size; done += chunk) {
            auto part = args;
            part.src_offset += done;
            part.dst_offset += done;
            part.size = std::min(chunk, args.size - done);
            copyWithShader(r, part);
        }
        return;
    }
    recordBufferCopy(r, src, args.src_offset, dst, args.dst_offset, args.size);
}

template <class Recorder>
void VulkanDevice::copyWithShader(Recorder &r, const bp_copy_device_to_device_args &args) {
    static const char *const kCopySource = R"(#version 450
layout(local_size_x_id = 0) in;
layout(set = 0, binding = 0) readonly buffer Src { uvec4 src[]; };
layout(set = 0, binding = 1) writeonly buffer Dst { uvec4 dst[]; };
layout(push_constant) uniform Count { uint count; };
void main() {
    uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint i = gl_GlobalInvocationID.x; i < count; i += stride) dst[i] = src[i];
}
)";
    {
        std::lock_guard lock(copyKernelMutex_);
        if (!copyKernel_) {
            auto compileArgs = sdk::makeStruct<bp_kernel_compile_args>();
            compileArgs.dialect = BP_DIALECT_GLSL;
            compileArgs.entry_point = "backplane_copy";
            compileArgs.source = kCopySource;
            compileArgs.source_size = std::strlen(kCopySource);
            sdk::CompileOutput output;
            compile(compileArgs, output);
            auto loadArgs = sdk::makeStruct<bp_kernel_load_args>();
            loadArgs.dialect = BP_DIALECT_GLSL;
            loadArgs.entry_point = "backplane_copy";
            loadArgs.binary = output.binary.data();
            loadArgs.binary_size = output.binary.size();
            copyKernel_ = std::make_unique<VulkanKernel>(*this, loadArgs);
        }
    }
    const uint32_t count = static_cast<uint32_t>(args.size / 16);
    const bp_binding bindings[2] = {{args.src, args.src_offset, args.size},
                                    {args.dst, args.dst_offset, args.size}};
    auto launchArgs = sdk::makeStruct<bp_launch_args>();
    launchArgs.kernel = reinterpret_cast<bp_kernel *>(static_cast<sdk::Kernel *>(copyKernel_.get()));
    // Enough workgroups to fill a large GPU; each thread then strides over the rest.
    launchArgs.grid[0] = std::min<uint32_t>((count + 255) / 256, 4096);
    launchArgs.grid[1] = launchArgs.grid[2] = 1;
    launchArgs.block[0] = 256;
    launchArgs.block[1] = launchArgs.block[2] = 1;
    launchArgs.bindings = bindings;
    launchArgs.binding_count = 2;
    launchArgs.scalars = &count;
    launchArgs.scalar_size = sizeof count;
    recordLaunch(r, launchArgs);
}

template <class Recorder> void VulkanDevice::recordFill(Recorder &r, const bp_fill_args &args) {
    VulkanMemory &dst = memoryOf(args.dst);
    checkRange(dst, args.offset, args.size, "fill");
    if (args.offset % 4 != 0 || args.size % 4 != 0)
        throw sdk::Error(BP_ERROR_INVALID_ARGUMENT,
                         "fill: offset and size must be multiples of 4 (vkCmdFillBuffer)");
    if (args.size == 0) return;
    const BufferRange write{dst.buffer(), args.offset, args.offset + args.size};
    r.orderAccess(StageClass::Transfer, nullptr, 0, &write, 1);
    fn_.vkCmdFillBuffer(r.record(), dst.buffer(), args.offset, args.size, args.pattern);
    r.commandRecorded();
}

template <class Recorder>
void VulkanDevice::recordLaunch(Recorder &r, const bp_launch_args &args) {
    if (args.kernel == nullptr)
        throw sdk::Error(BP_ERROR_INVALID_ARGUMENT, "kernel_launch: kernel is NULL");
    auto &kernel = sdk::as<VulkanKernel>(args.kernel);
    const bp_device_info &info = physical_.info;
    // Messages are built only on failure: this is the per-dispatch path.
    const auto fail = [&](bp_status status, const std::string &detail) {
        throw sdk::Error(status, "kernel_launch of '" + kernel.entryPoint() + "': " + detail);
    };
    if (args.binding_count > info.max_bindings)
        fail(BP_ERROR_LAUNCH, std::to_string(args.binding_count) +
                                  " bindings, the device allows " +
                                  std::to_string(info.max_bindings));
    if (args.scalar_size > info.max_scalar_bytes)
        fail(BP_ERROR_LAUNCH, std::to_string(args.scalar_size) +
                                  " scalar bytes exceed the push-constant limit of " +
                                  std::to_string(info.max_scalar_bytes));
    if (args.scalar_size > 0 && args.scalars == nullptr)
        fail(BP_ERROR_INVALID_ARGUMENT,
             "scalar_size is " + std::to_string(args.scalar_size) + " but scalars is NULL");
    if (args.binding_count > 0 && args.bindings == nullptr)
        fail(BP_ERROR_INVALID_ARGUMENT,
             "binding_count is " + std::to_string(args.binding_count) + " but bindings is NULL");
    // The interface reflected at load: a binding missing from the descriptor set, or push
    // constants the shader reads but the launch never pushed, crash drivers (lavapipe: SIGSEGV,
    // under the validation layer too). More bindings or bytes than used are harmless: the
    // optimizer drops unused buffers and blocks, and a C struct's tail padding may be passed.
    if (args.binding_count < kernel.bindingCount() ||
        args.scalar_size < kernel.pushConstantBytes()) {
        const auto plural = [](uint64_t n, const char *one, const char *many) {
            return std::to_string(n) + " " + (n == 1 ? one : many);
        };
        const uint32_t needed = kernel.bindingCount();
        // The caller's arguments, not the binary: INVALID_ARGUMENT keeps the core from taking
        // it for a bad cached binary (only LAUNCH and COMPILE are the binary's).
        fail(BP_ERROR_INVALID_ARGUMENT,
             "the shader needs " +
                 plural(needed, "storage-buffer binding", "storage-buffer bindings") +
                 (needed == 1  ? std::string(" (set 0, binding 0)")
                  : needed > 1 ? " (set 0, bindings 0.." + std::to_string(needed - 1) + ")"
                               : std::string()) +
                 " and " + plural(kernel.pushConstantBytes(), "byte", "bytes") +
                 " of push constants; the launch gives " +
                 plural(args.binding_count, "binding", "bindings") + " and " +
                 plural(args.scalar_size, "scalar byte", "scalar bytes"));
    }
    uint64_t threads = 1;
    for (int i = 0; i < 3; ++i) {
        if (args.block[i] == 0 || args.block[i] > info.max_block_size[i])
            fail(BP_ERROR_LAUNCH, "block dimension " + std::to_string(i) + " is " +
                                      std::to_string(args.block[i]) + " (allowed 1.." +
                                      std::to_string(info.max_block_size[i]) + ")");
        threads *= args.block[i];
        if (args.grid_memory == nullptr && args.grid[i] > info.max_grid_size[i])
            fail(BP_ERROR_LAUNCH, "grid dimension " + std::to_string(i) + " exceeds " +
                                      std::to_string(info.max_grid_size[i]));
    }
    if (threads > info.max_block_threads)
        fail(BP_ERROR_LAUNCH, std::to_string(threads) + " threads per block exceed " +
                                  std::to_string(info.max_block_threads));
    if (args.shared_memory_bytes > info.max_shared_memory_bytes)
        fail(BP_ERROR_LAUNCH, std::to_string(args.shared_memory_bytes) +
                                  " bytes of shared memory exceed the device's " +
                                  std::to_string(info.max_shared_memory_bytes));

    std::array<BufferRange, 32> writes;
    std::array<VkDescriptorBufferInfo, 32> buffers;
    for (uint32_t i = 0; i < args.binding_count; ++i) {
        const bp_binding &b = args.bindings[i];
        if (b.memory == nullptr)
            fail(BP_ERROR_INVALID_ARGUMENT, "binding " + std::to_string(i) + " has no memory");
        VulkanMemory &memory = memoryOf(b.memory);
        const uint64_t size = b.size == 0 ? memory.size() - std::min(b.offset, memory.size())
                                          : b.size;
        checkRange(memory, b.offset, size, "kernel_launch binding");
        if (b.offset % info.binding_alignment != 0)
            fail(BP_ERROR_INVALID_ARGUMENT,
                 "binding " + std::to_string(i) + " offset " + std::to_string(b.offset) +
                     " is not a multiple of " + std::to_string(info.binding_alignment));
        if (size > physical_.maxStorageBufferRange) // the caller's binding, not the binary's
            fail(BP_ERROR_INVALID_ARGUMENT, "binding " + std::to_string(i) + " of " +
                                      std::to_string(size) +
                                      " bytes exceeds maxStorageBufferRange " +
                                      std::to_string(physical_.maxStorageBufferRange));
        // Kernels may write any binding: each counts as a write for the barrier rule.
        writes[i] = {memory.buffer(), b.offset, b.offset + size};
        buffers[i] = {memory.buffer(), b.offset, size};
    }
    BufferRange gridRead{};
    VulkanMemory *grid = nullptr;
    if (args.grid_memory != nullptr) {
        grid = &memoryOf(args.grid_memory);
        checkRange(*grid, args.grid_offset, 12, "kernel_launch grid_memory");
        if (args.grid_offset % 4 != 0)
            fail(BP_ERROR_INVALID_ARGUMENT, "grid_offset must be a multiple of 4");
        gridRead = {grid->buffer(), args.grid_offset, args.grid_offset + 12};
    }

    const KernelPipeline &pipeline =
        kernel.pipeline(args.block, args.binding_count, args.shared_memory_bytes);
    r.orderAccess(StageClass::Compute, nullptr, 0, writes.data(), args.binding_count,
                  grid ? &gridRead : nullptr);
    VkCommandBuffer commands = r.record();
    r.retain(kernel.objects()); // kernel_release may come before this batch completed
    // Record only the state that differs from what this command buffer has bound already:
    // pipeline, descriptors (same layout and buffers) and push constants (same layout and bytes)
    // all persist across dispatches of one command buffer.
    BoundComputeState &bound = r.bound();
    if (bound.pipeline != pipeline.pipeline) {
        fn_.vkCmdBindPipeline(commands, VK_PIPELINE_BIND_POINT_COMPUTE, pipeline.pipeline);
        bound.pipeline = pipeline.pipeline;
    }
    const size_t bufferBytes = args.binding_count * sizeof(VkDescriptorBufferInfo);
    if (args.binding_count > 0 &&
        (bound.descriptorLayout != pipeline.layout || bound.bindingCount != args.binding_count ||
         std::memcmp(bound.buffers.data(), buffers.data(), bufferBytes) != 0)) {
        std::array<VkWriteDescriptorSet, 32> descriptorWrites;
        for (uint32_t i = 0; i < args.binding_count; ++i) {
            VkWriteDescriptorSet &w = descriptorWrites[i];
            w = vkStruct<VkWriteDescriptorSet>(VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET);
            w.dstBinding = i;
            w.descriptorCount = 1;
            w.descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
            w.pBufferInfo = &buffers[i];
        }
        if (physical_.pushDescriptor) {
            fn_.vkCmdPushDescriptorSetKHR(commands, VK_PIPELINE_BIND_POINT_COMPUTE,
                                          pipeline.layout, 0, args.binding_count,
                                          descriptorWrites.data());
        } else {
            const VkDescriptorSet set = r.allocateDescriptorSet(pipeline.setLayout);
            for (uint32_t i = 0; i < args.binding_count; ++i) descriptorWrites[i].dstSet = set;
            fn_.vkUpdateDescriptorSets(device_, args.binding_count, descriptorWrites.data(), 0,
                                       nullptr);
            fn_.vkCmdBindDescriptorSets(commands, VK_PIPELINE_BIND_POINT_COMPUTE, pipeline.layout,
                                        0, 1, &set, 0, nullptr);
        }
        bound.descriptorLayout = pipeline.layout;
        bound.bindingCount = args.binding_count;
        std::memcpy(bound.buffers.data(), buffers.data(), bufferBytes);
    }
    if (args.scalar_size > 0 && args.scalars != nullptr) {
        // vkCmdPushConstants takes multiples of 4 bytes; the padding stays zero.
        const auto padded = static_cast<uint32_t>(
            std::min<size_t>((args.scalar_size + 3) & ~size_t{3}, info.max_scalar_bytes));
        const auto paddingIsZero = [&] {
            for (size_t i = args.scalar_size; i < padded; ++i)
                if (bound.scalars[i] != 0) return false;
            return true;
        };
        if (bound.scalarLayout != pipeline.layout || bound.scalarBytes != padded ||
            std::memcmp(bound.scalars.data(), args.scalars, args.scalar_size) != 0 ||
            !paddingIsZero()) {
            std::memcpy(bound.scalars.data(), args.scalars, args.scalar_size);
            if (padded > args.scalar_size)
                std::memset(bound.scalars.data() + args.scalar_size, 0, padded - args.scalar_size);
            fn_.vkCmdPushConstants(commands, pipeline.layout, VK_SHADER_STAGE_COMPUTE_BIT, 0,
                                   padded, bound.scalars.data());
            bound.scalarLayout = pipeline.layout;
            bound.scalarBytes = padded;
        }
    }
    if (grid != nullptr)
        fn_.vkCmdDispatchIndirect(commands, grid->buffer(), args.grid_offset);
    else
        fn_.vkCmdDispatch(commands, args.grid[0], args.grid[1], args.grid[2]);
    r.commandRecorded();
}

uint64_t VulkanDevice::nativeHandle(bp_native_kind kind, const void *object) {
    switch (kind) {
    case BP_NATIVE_DEVICE: return reinterpret_cast<uint64_t>(device_);
    case BP_NATIVE_MEMORY:
        return reinterpret_cast<uint64_t>(
            memoryOf(const_cast<bp_memory *>(static_cast<const bp_memory *>(object))).buffer());
    case BP_NATIVE_STREAM:
        return reinterpret_cast<uint64_t>(
            queue(sdk::as<VulkanStream>(const_cast<bp_stream *>(static_cast<const bp_stream *>(object)))
                      .queueIndex()));
    }
    sdk::unsupported("native_handle of this kind");
}

// The graph's instantiations of the recording code (VulkanDevice::createGraph, vulkan_graph.cpp).
template void VulkanDevice::recordHostToDevice(VulkanGraph &, const bp_copy_host_to_device_args &);
template void VulkanDevice::recordDeviceToHost(VulkanGraph &, const bp_copy_device_to_host_args &);
template void VulkanDevice::recordDeviceToDevice(VulkanGraph &,
                                                 const bp_copy_device_to_device_args &);
template void VulkanDevice::recordFill(VulkanGraph &, const bp_fill_args &);
template void VulkanDevice::recordLaunch(VulkanGraph &, const bp_launch_args &);

} // namespace backplane::vulkan
