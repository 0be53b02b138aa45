// Run-time loading of the Vulkan loader and the VkResult → bp_status translation.
#include "vulkan_api.hpp"

#include <dlfcn.h>

namespace backplane::vulkan {

VulkanLibrary::VulkanLibrary() {
    // RTLD_LOCAL: the loader's symbols must not leak into other plugins (e.g. a second copy).
    handle_ = ::dlopen("libvulkan.so.1", RTLD_NOW | RTLD_LOCAL);
    if (handle_ == nullptr) {
        const char *reason = ::dlerror();
        throw sdk::Error(BP_ERROR_NO_DRIVER,
                         std::string("no Vulkan loader (libvulkan.so.1 not found: ") +
                             (reason ? reason : "unknown reason") +
                             "); install the Vulkan loader (Debian/Ubuntu: libvulkan1) and a "
                             "driver");
    }
    vkGetInstanceProcAddr =
        reinterpret_cast<PFN_vkGetInstanceProcAddr>(::dlsym(handle_, "vkGetInstanceProcAddr"));
    if (vkGetInstanceProcAddr == nullptr) {
        ::dlclose(handle_);
        handle_ = nullptr;
        throw sdk::Error(BP_ERROR_NO_DRIVER,
                         "libvulkan.so.1 has no vkGetInstanceProcAddr: it is not a Vulkan loader");
    }
#define BACKPLANE_VK_LOAD_GLOBAL(name)                                                             \
    name = reinterpret_cast<PFN_##name>(vkGetInstanceProcAddr(VK_NULL_HANDLE, #name));
    BACKPLANE_VK_GLOBAL_FUNCTIONS(BACKPLANE_VK_LOAD_GLOBAL)
#undef BACKPLANE_VK_LOAD_GLOBAL
    if (vkCreateInstance == nullptr || vkEnumerateInstanceExtensionProperties == nullptr) {
        ::dlclose(handle_);
        handle_ = nullptr;
        throw sdk::Error(BP_ERROR_NO_DRIVER, "the Vulkan loader lacks vkCreateInstance");
    }
}

VulkanLibrary::~VulkanLibrary() {
    if (handle_ != nullptr) ::dlclose(handle_);
}

void VulkanLibrary::loadInstanceFunctions(VkInstance instance) {
#define BACKPLANE_VK_LOAD_INSTANCE(name)                                                           \
    name = reinterpret_cast<PFN_##name>(vkGetInstanceProcAddr(instance, #name));                  \
    if (name == nullptr)                                                                           \
        throw sdk::Error(BP_ERROR_NO_DRIVER, "the Vulkan loader lacks " #name                      \
                                             "; a Vulkan 1.2 loader is needed");
    BACKPLANE_VK_INSTANCE_FUNCTIONS(BACKPLANE_VK_LOAD_INSTANCE)
#undef BACKPLANE_VK_LOAD_INSTANCE
    vkCreateDebugUtilsMessengerEXT = reinterpret_cast<PFN_vkCreateDebugUtilsMessengerEXT>(
        vkGetInstanceProcAddr(instance, "vkCreateDebugUtilsMessengerEXT"));
    vkDestroyDebugUtilsMessengerEXT = reinterpret_cast<PFN_vkDestroyDebugUtilsMessengerEXT>(
        vkGetInstanceProcAddr(instance, "vkDestroyDebugUtilsMessengerEXT"));
}

void DeviceFunctions::load(const VulkanLibrary &library, VkDevice device, bool pushDescriptors) {
#define BACKPLANE_VK_LOAD_DEVICE(name)                                                             \
    name = reinterpret_cast<PFN_##name>(library.vkGetDeviceProcAddr(device, #name));              \
    if (name == nullptr)                                                                           \
        throw sdk::Error(BP_ERROR_INTERNAL, "the Vulkan driver lacks " #name);
    BACKPLANE_VK_DEVICE_FUNCTIONS(BACKPLANE_VK_LOAD_DEVICE)
#undef BACKPLANE_VK_LOAD_DEVICE
    if (pushDescriptors)
        vkCmdPushDescriptorSetKHR = reinterpret_cast<PFN_vkCmdPushDescriptorSetKHR>(
            library.vkGetDeviceProcAddr(device, "vkCmdPushDescriptorSetKHR"));
}

const char *resultName(VkResult result) noexcept {
    switch (result) {
#define BACKPLANE_VK_RESULT(name)                                                                  \
    case name: return #name;
        BACKPLANE_VK_RESULT(VK_SUCCESS)
        BACKPLANE_VK_RESULT(VK_NOT_READY)
        BACKPLANE_VK_RESULT(VK_TIMEOUT)
        BACKPLANE_VK_RESULT(VK_INCOMPLETE)
        BACKPLANE_VK_RESULT(VK_ERROR_OUT_OF_HOST_MEMORY)
        BACKPLANE_VK_RESULT(VK_ERROR_OUT_OF_DEVICE_MEMORY)
        BACKPLANE_VK_RESULT(VK_ERROR_INITIALIZATION_FAILED)
        BACKPLANE_VK_RESULT(VK_ERROR_DEVICE_LOST)
        BACKPLANE_VK_RESULT(VK_ERROR_MEMORY_MAP_FAILED)
        BACKPLANE_VK_RESULT(VK_ERROR_LAYER_NOT_PRESENT)
        BACKPLANE_VK_RESULT(VK_ERROR_EXTENSION_NOT_PRESENT)
        BACKPLANE_VK_RESULT(VK_ERROR_FEATURE_NOT_PRESENT)
        BACKPLANE_VK_RESULT(VK_ERROR_INCOMPATIBLE_DRIVER)
        BACKPLANE_VK_RESULT(VK_ERROR_TOO_MANY_OBJECTS)
        BACKPLANE_VK_RESULT(VK_ERROR_FORMAT_NOT_SUPPORTED)
        BACKPLANE_VK_RESULT(VK_ERROR_FRAGMENTED_POOL)
        BACKPLANE_VK_RESULT(VK_ERROR_OUT_OF_POOL_MEMORY)
        BACKPLANE_VK_RESULT(VK_ERROR_INVALID_EXTERNAL_HANDLE)
        BACKPLANE_VK_RESULT(VK_ERROR_FRAGMENTATION)
        BACKPLANE_VK_RESULT(VK_ERROR_INVALID_SHADER_NV)
        BACKPLANE_VK_RESULT(VK_ERROR_UNKNOWN)
#undef BACKPLANE_VK_RESULT
    default: return "VkResult(unknown)";
    }
}

bp_status toStatus(VkResult result) noexcept {
    switch (result) {
    case VK_SUCCESS:
    case VK_INCOMPLETE: return BP_SUCCESS;
    case VK_NOT_READY: return BP_ERROR_NOT_READY;
    case VK_TIMEOUT: return BP_ERROR_TIMEOUT;
    case VK_ERROR_OUT_OF_HOST_MEMORY:
    case VK_ERROR_OUT_OF_DEVICE_MEMORY:
    case VK_ERROR_OUT_OF_POOL_MEMORY:
    case VK_ERROR_FRAGMENTED_POOL:
    case VK_ERROR_FRAGMENTATION:
    case VK_ERROR_TOO_MANY_OBJECTS: return BP_ERROR_OUT_OF_MEMORY;
    case VK_ERROR_DEVICE_LOST: return BP_ERROR_DEVICE_LOST;
    case VK_ERROR_INCOMPATIBLE_DRIVER:
    case VK_ERROR_INITIALIZATION_FAILED: return BP_ERROR_NO_DRIVER;
    case VK_ERROR_EXTENSION_NOT_PRESENT:
    case VK_ERROR_FEATURE_NOT_PRESENT:
    case VK_ERROR_LAYER_NOT_PRESENT: return BP_ERROR_UNSUPPORTED;
    case VK_ERROR_INVALID_SHADER_NV: return BP_ERROR_COMPILE;
    default: return BP_ERROR_INTERNAL;
    }
}

void check(VkResult result, const char *what) {
    const bp_status status = toStatus(result);
    if (status == BP_SUCCESS) return;
    std::string message = std::string(what) + " failed: " + resultName(result);
    if (status == BP_ERROR_OUT_OF_MEMORY)
        message += " (free memory or use smaller pages)";
    else if (status == BP_ERROR_DEVICE_LOST)
        message += " (the device is lost; close it and open it again, or use another device)";
    throw sdk::Error(status, message, static_cast<int64_t>(result));
}

} // namespace backplane::vulkan
