// The Vulkan entry points the plugin uses, loaded at run time from libvulkan.so.1, and the one
// place that turns a VkResult into an sdk::Error.
#pragma once

#include <backplane/abi/plugin_sdk.hpp>

#include <vulkan/vulkan.h>

#include <string>

namespace backplane::vulkan {

// Function lists: X(name) for every entry point, fetched through vkGetInstanceProcAddr
// (global and instance level) or vkGetDeviceProcAddr (device level).
#define BACKPLANE_VK_GLOBAL_FUNCTIONS(X)                                                          \
    X(vkCreateInstance)                                                                            \
    X(vkEnumerateInstanceVersion)                                                                  \
    X(vkEnumerateInstanceExtensionProperties)                                                      \
    X(vkEnumerateInstanceLayerProperties)

#define BACKPLANE_VK_INSTANCE_FUNCTIONS(X)                                                        \
    X(vkDestroyInstance)                                                                           \
    X(vkEnumeratePhysicalDevices)                                                                  \
    X(vkGetPhysicalDeviceProperties)                                                               \
    X(vkGetPhysicalDeviceProperties2)                                                              \
    X(vkGetPhysicalDeviceFeatures2)                                                                \
    X(vkGetPhysicalDeviceMemoryProperties)                                                         \
    X(vkGetPhysicalDeviceQueueFamilyProperties)                                                    \
    X(vkEnumerateDeviceExtensionProperties)                                                        \
    X(vkCreateDevice)                                                                              \
    X(vkGetDeviceProcAddr)

#define BACKPLANE_VK_DEVICE_FUNCTIONS(X)                                                          \
    X(vkDestroyDevice)                                                                             \
    X(vkGetDeviceQueue)                                                                            \
    X(vkDeviceWaitIdle)                                                                            \
    X(vkCreateBuffer)                                                                              \
    X(vkDestroyBuffer)                                                                             \
    X(vkGetBufferMemoryRequirements)                                                               \
    X(vkAllocateMemory)                                                                            \
    X(vkFreeMemory)                                                                                \
    X(vkBindBufferMemory)                                                                          \
    X(vkMapMemory)                                                                                 \
    X(vkUnmapMemory)                                                                               \
    X(vkCreateSemaphore)                                                                           \
    X(vkDestroySemaphore)                                                                          \
    X(vkWaitSemaphores)                                                                            \
    X(vkGetSemaphoreCounterValue)                                                                  \
    X(vkCreateCommandPool)                                                                         \
    X(vkDestroyCommandPool)                                                                        \
    X(vkAllocateCommandBuffers)                                                                    \
    X(vkResetCommandBuffer)                                                                        \
    X(vkBeginCommandBuffer)                                                                        \
    X(vkEndCommandBuffer)                                                                          \
    X(vkQueueSubmit)                                                                               \
    X(vkCmdPipelineBarrier)                                                                        \
    X(vkCmdCopyBuffer)                                                                             \
    X(vkCmdFillBuffer)                                                                             \
    X(vkCmdBindPipeline)                                                                           \
    X(vkCmdPushConstants)                                                                          \
    X(vkCmdBindDescriptorSets)                                                                     \
    X(vkCmdDispatch)                                                                               \
    X(vkCmdDispatchIndirect)                                                                       \
    X(vkCmdWriteTimestamp)                                                                         \
    X(vkCmdResetQueryPool)                                                                         \
    X(vkCreateQueryPool)                                                                           \
    X(vkDestroyQueryPool)                                                                          \
    X(vkGetQueryPoolResults)                                                                       \
    X(vkCreateShaderModule)                                                                        \
    X(vkDestroyShaderModule)                                                                       \
    X(vkCreateDescriptorSetLayout)                                                                 \
    X(vkDestroyDescriptorSetLayout)                                                                \
    X(vkCreatePipelineLayout)                                                                      \
    X(vkDestroyPipelineLayout)                                                                     \
    X(vkCreateComputePipelines)                                                                    \
    X(vkDestroyPipeline)                                                                           \
    X(vkCreatePipelineCache)                                                                       \
    X(vkDestroyPipelineCache)                                                                      \
    X(vkGetPipelineCacheData)                                                                      \
    X(vkCreateDescriptorPool)                                                                      \
    X(vkDestroyDescriptorPool)                                                                     \
    X(vkResetDescriptorPool)                                                                       \
    X(vkAllocateDescriptorSets)                                                                    \
    X(vkUpdateDescriptorSets)

#define BACKPLANE_VK_DECLARE(name) PFN_##name name = nullptr;

/// The loader library (dlopen'ed) and its global + instance-level entry points. One per plugin
/// instance; the library stays loaded until this object dies.
class VulkanLibrary {
public:
    /// Loads libvulkan.so.1. Throws sdk::Error(BP_ERROR_NO_DRIVER) with dlerror's text.
    VulkanLibrary();
    ~VulkanLibrary();
    VulkanLibrary(const VulkanLibrary &) = delete;
    VulkanLibrary &operator=(const VulkanLibrary &) = delete;

    /// Fetches the instance-level functions once the instance exists.
    void loadInstanceFunctions(VkInstance instance);

    PFN_vkGetInstanceProcAddr vkGetInstanceProcAddr = nullptr;
    BACKPLANE_VK_GLOBAL_FUNCTIONS(BACKPLANE_VK_DECLARE)
    BACKPLANE_VK_INSTANCE_FUNCTIONS(BACKPLANE_VK_DECLARE)
    // Optional (VK_EXT_debug_utils): NULL when the extension is not enabled.
    PFN_vkCreateDebugUtilsMessengerEXT vkCreateDebugUtilsMessengerEXT = nullptr;
    PFN_vkDestroyDebugUtilsMessengerEXT vkDestroyDebugUtilsMessengerEXT = nullptr;

private:
    void *handle_ = nullptr;
};

/// Device-level entry points of one VkDevice (fetched with vkGetDeviceProcAddr, which skips the
/// loader's dispatch trampoline).
struct DeviceFunctions {
    /// Fetches every function; throws BP_ERROR_INTERNAL naming the first one the driver lacks.
    void load(const VulkanLibrary &library, VkDevice device, bool pushDescriptors);

    BACKPLANE_VK_DEVICE_FUNCTIONS(BACKPLANE_VK_DECLARE)
    /// VK_KHR_push_descriptor; NULL when the device lacks it.
    PFN_vkCmdPushDescriptorSetKHR vkCmdPushDescriptorSetKHR = nullptr;
};

#undef BACKPLANE_VK_DECLARE

/// A zeroed Vulkan struct with its sType set: `auto info = vkStruct<VkBufferCreateInfo>(...)`.
template <class T> T vkStruct(VkStructureType type) noexcept {
    T value{};
    value.sType = type;
    return value;
}

/// "VK_ERROR_OUT_OF_DEVICE_MEMORY" for a VkResult.
const char *resultName(VkResult result) noexcept;

/// The status a VkResult maps to (out of memory, device lost, ...).
bp_status toStatus(VkResult result) noexcept;

/// Throws sdk::Error for a failed VkResult, naming the call (`what`); returns for success codes.
/// The one place that translates Vulkan errors; Device::check adds the device-lost bookkeeping.
void check(VkResult result, const char *what);

} // namespace backplane::vulkan
