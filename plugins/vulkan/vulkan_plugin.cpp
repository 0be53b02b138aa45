// The Vulkan plugin's entry point, instance creation, validation messenger and device discovery.
#include "vulkan_device.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace backplane::vulkan {
namespace {

constexpr const char *kValidationLayer = "VK_LAYER_KHRONOS_validation";

bool hasExtension(const std::vector<VkExtensionProperties> &extensions, const char *name) {
    return std::any_of(extensions.begin(), extensions.end(), [&](const VkExtensionProperties &e) {
        return std::strcmp(e.extensionName, name) == 0;
    });
}

std::string vendorName(uint32_t vendorId) {
    switch (vendorId) {
    case 0x10DE: return "NVIDIA";
    case 0x1002: return "AMD";
    case 0x8086: return "Intel";
    case 0x13B5: return "ARM";
    case 0x5143: return "Qualcomm";
    case VK_VENDOR_ID_MESA: return "Mesa";
    default: {
        char text[16];
        std::snprintf(text, sizeof text, "0x%04x", vendorId);
        return text;
    }
    }
}

// NVIDIA packs its driver version as 10.8.8.6 bits; everyone else (Mesa included) uses
// VK_MAKE_API_VERSION's layout.
std::string driverVersionText(const VkPhysicalDeviceProperties &p,
                              const VkPhysicalDeviceDriverProperties &driver) {
    char text[64];
    const uint32_t v = p.driverVersion;
    if (p.vendorID == 0x10DE)
        std::snprintf(text, sizeof text, "%u.%u.%u", v >> 22, (v >> 14) & 0xff, (v >> 6) & 0xff);
    else
        std::snprintf(text, sizeof text, "%u.%u.%u", VK_API_VERSION_MAJOR(v),
                      VK_API_VERSION_MINOR(v), VK_API_VERSION_PATCH(v));
    // driverInfo carries the release users know ("580.159.04", "Mesa 22.3.6 (LLVM 15.0.6)").
    std::string result = driver.driverInfo[0] != '\0' ? driver.driverInfo : text;
    if (driver.driverName[0] != '\0') result = std::string(driver.driverName) + " " + result;
    return result;
}

// A short, stable id of the driver family: part of the device fingerprint that keys caches.
std::string archName(const VkPhysicalDeviceDriverProperties &driver) {
    switch (driver.driverID) {
    case VK_DRIVER_ID_MESA_LLVMPIPE: return "lavapipe";
    case VK_DRIVER_ID_NVIDIA_PROPRIETARY: return "nvidia";
    case VK_DRIVER_ID_MESA_RADV: return "radv";
    case VK_DRIVER_ID_AMD_PROPRIETARY:
    case VK_DRIVER_ID_AMD_OPEN_SOURCE: return "amdvlk";
    case VK_DRIVER_ID_INTEL_OPEN_SOURCE_MESA: return "anv";
    default: break;
    }
    std::string name = driver.driverName;
    std::transform(name.begin(), name.end(), name.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    return name.empty() ? "vulkan" : name;
}

bp_device_type deviceType(VkPhysicalDeviceType type) {
    switch (type) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: return BP_DEVICE_TYPE_DISCRETE_GPU;
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: return BP_DEVICE_TYPE_INTEGRATED_GPU;
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: return BP_DEVICE_TYPE_VIRTUAL_GPU;
    case VK_PHYSICAL_DEVICE_TYPE_CPU: return BP_DEVICE_TYPE_CPU;
    default: return BP_DEVICE_TYPE_OTHER;
    }
}

bool envFlag(const char *name) {
    const char *value = std::getenv(name);
    return value != nullptr && value[0] != '\0' && std::strcmp(value, "0") != 0;
}

} // namespace

Instance::Instance(const VulkanPlugin &plugin, bool validation, bool pushDescriptors)
    : plugin_(plugin) {
    apiVersion_ = VK_API_VERSION_1_0;
    if (library_.vkEnumerateInstanceVersion != nullptr)
        check(library_.vkEnumerateInstanceVersion(&apiVersion_), "vkEnumerateInstanceVersion");
    if (apiVersion_ < VK_API_VERSION_1_2)
        throw sdk::Error(BP_ERROR_NO_DRIVER,
                         "the Vulkan loader is version " + loaderVersion() +
                             "; the plugin needs Vulkan 1.2 (update libvulkan1)");

    uint32_t count = 0;
    check(library_.vkEnumerateInstanceExtensionProperties(nullptr, &count, nullptr),
          "vkEnumerateInstanceExtensionProperties");
    std::vector<VkExtensionProperties> extensions(count);
    check(library_.vkEnumerateInstanceExtensionProperties(nullptr, &count, extensions.data()),
          "vkEnumerateInstanceExtensionProperties");

    std::vector<const char *> enabledExtensions;
    std::vector<const char *> layers;
    const bool debugUtils = validation && hasExtension(extensions, "VK_EXT_debug_utils");
    if (debugUtils) enabledExtensions.push_back("VK_EXT_debug_utils");
    if (validation) {
        uint32_t layerCount = 0;
        library_.vkEnumerateInstanceLayerProperties(&layerCount, nullptr);
        std::vector<VkLayerProperties> available(layerCount);
        library_.vkEnumerateInstanceLayerProperties(&layerCount, available.data());
        const bool haveLayer = std::any_of(available.begin(), available.end(), [](auto &l) {
            return std::strcmp(l.layerName, kValidationLayer) == 0;
        });
        if (haveLayer)
            layers.push_back(kValidationLayer);
        else
            plugin_.log(BP_LOG_WARN, std::string("validation requested but ") + kValidationLayer +
                                         " is not installed (Debian: vulkan-validationlayers)");
    }

    auto app = vkStruct<VkApplicationInfo>(VK_STRUCTURE_TYPE_APPLICATION_INFO);
    app.pApplicationName = "backplane";
    app.pEngineName = "backplane";
    app.apiVersion = apiVersion_ >= VK_API_VERSION_1_3 ? VK_API_VERSION_1_3 : VK_API_VERSION_1_2;

    const VkValidationFeatureEnableEXT syncValidation =
        VK_VALIDATION_FEATURE_ENABLE_SYNCHRONIZATION_VALIDATION_EXT;
    auto features = vkStruct<VkValidationFeaturesEXT>(VK_STRUCTURE_TYPE_VALIDATION_FEATURES_EXT);
    features.enabledValidationFeatureCount = 1;
    features.pEnabledValidationFeatures = &syncValidation;

    auto create = vkStruct<VkInstanceCreateInfo>(VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO);
    create.pApplicationInfo = &app;
    create.enabledExtensionCount = static_cast<uint32_t>(enabledExtensions.size());
    create.ppEnabledExtensionNames = enabledExtensions.data();
    create.enabledLayerCount = static_cast<uint32_t>(layers.size());
    create.ppEnabledLayerNames = layers.data();
    if (!layers.empty()) create.pNext = &features;
    const VkResult result = library_.vkCreateInstance(&create, nullptr, &instance_);
    if (result == VK_ERROR_INCOMPATIBLE_DRIVER)
        throw sdk::Error(BP_ERROR_NO_DEVICE,
                         "the Vulkan loader found no driver (vkCreateInstance: "
                         "VK_ERROR_INCOMPATIBLE_DRIVER); install a Vulkan driver (ICD) or point "
                         "VK_DRIVER_FILES at its JSON file",
                         result);
    check(result, "vkCreateInstance");
    try {
        library_.loadInstanceFunctions(instance_);
        if (debugUtils && library_.vkCreateDebugUtilsMessengerEXT != nullptr) {
            auto info = vkStruct<VkDebugUtilsMessengerCreateInfoEXT>(VK_STRUCTURE_TYPE_DEBUG_UTILS_MESSENGER_CREATE_INFO_EXT);
            info.messageSeverity = VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT |
                                   VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT;
            info.messageType = VK_DEBUG_UTILS_MESSAGE_TYPE_GENERAL_BIT_EXT |
                               VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT |
                               VK_DEBUG_UTILS_MESSAGE_TYPE_PERFORMANCE_BIT_EXT;
            info.pfnUserCallback = &Instance::onDebugMessage;
            info.pUserData = this;
            check(library_.vkCreateDebugUtilsMessengerEXT(instance_, &info, nullptr, &messenger_),
                  "vkCreateDebugUtilsMessengerEXT");
        }
        enumerate(pushDescriptors);
    } catch (...) {
        if (messenger_ != VK_NULL_HANDLE)
            library_.vkDestroyDebugUtilsMessengerEXT(instance_, messenger_, nullptr);
        if (library_.vkDestroyInstance != nullptr) library_.vkDestroyInstance(instance_, nullptr);
        throw;
    }
}

Instance::~Instance() {
    if (messenger_ != VK_NULL_HANDLE)
        library_.vkDestroyDebugUtilsMessengerEXT(instance_, messenger_, nullptr);
    library_.vkDestroyInstance(instance_, nullptr);
}

std::string Instance::loaderVersion() const {
    return std::to_string(VK_API_VERSION_MAJOR(apiVersion_)) + "." +
           std::to_string(VK_API_VERSION_MINOR(apiVersion_)) + "." +
           std::to_string(VK_API_VERSION_PATCH(apiVersion_));
}

std::string Instance::firstValidationError() const {
    std::lock_guard lock(messageMutex_);
    return firstValidationError_;
}

VKAPI_ATTR VkBool32 VKAPI_CALL Instance::onDebugMessage(
    VkDebugUtilsMessageSeverityFlagBitsEXT severity, VkDebugUtilsMessageTypeFlagsEXT,
    const VkDebugUtilsMessengerCallbackDataEXT *data, void *user) {
    auto *self = static_cast<Instance *>(user);
    const std::string text = std::string("validation: ") +
                             (data && data->pMessage ? data->pMessage : "(no message)");
    if (severity & VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT) {
        if (self->validationErrors_.fetch_add(1) == 0) {
            std::lock_guard lock(self->messageMutex_);
            self->firstValidationError_ = text;
        }
        self->plugin_.log(BP_LOG_ERROR, text);
    } else {
        self->plugin_.log(BP_LOG_WARN, text);
    }
    return VK_FALSE; // never abort the call: the plugin reports the error itself
}

void Instance::enumerate(bool pushDescriptors) {
    uint32_t count = 0;
    check(library_.vkEnumeratePhysicalDevices(instance_, &count, nullptr),
          "vkEnumeratePhysicalDevices");
    std::vector<VkPhysicalDevice> handles(count);
    check(library_.vkEnumeratePhysicalDevices(instance_, &count, handles.data()),
          "vkEnumeratePhysicalDevices");
    std::string skipped;
    for (VkPhysicalDevice handle : handles) {
        PhysicalDevice d;
        d.handle = handle;
        library_.vkGetPhysicalDeviceProperties(handle, &d.properties);
        const std::string name = d.properties.deviceName;
        auto skip = [&](const std::string &why) {
            plugin_.log(BP_LOG_INFO, "skipping Vulkan device '" + name + "': " + why);
            skipped += (skipped.empty() ? "" : "; ") + name + ": " + why;
        };
        if (d.properties.apiVersion < VK_API_VERSION_1_2) {
            skip("it supports Vulkan " + std::to_string(VK_API_VERSION_MAJOR(d.properties.apiVersion)) +
                 "." + std::to_string(VK_API_VERSION_MINOR(d.properties.apiVersion)) +
                 ", the plugin needs 1.2");
            continue;
        }
        uint32_t extensionCount = 0;
        library_.vkEnumerateDeviceExtensionProperties(handle, nullptr, &extensionCount, nullptr);
        std::vector<VkExtensionProperties> extensions(extensionCount);
        library_.vkEnumerateDeviceExtensionProperties(handle, nullptr, &extensionCount,
                                                      extensions.data());
        d.featureExtensions = FeatureExtensions::of(extensions);
        const DeviceFeatures features(library_, handle, d.featureExtensions);
        if (!features.timelineSemaphore()) {
            skip("it lacks the timelineSemaphore feature");
            continue;
        }

        uint32_t familyCount = 0;
        library_.vkGetPhysicalDeviceQueueFamilyProperties(handle, &familyCount, nullptr);
        std::vector<VkQueueFamilyProperties> families(familyCount);
        library_.vkGetPhysicalDeviceQueueFamilyProperties(handle, &familyCount, families.data());
        // A compute family without graphics is the "async compute" one on discrete GPUs; take
        // it when there is one, else the first family that computes.
        int chosen = -1;
        for (uint32_t i = 0; i < familyCount; ++i) {
            const VkQueueFlags flags = families[i].queueFlags;
            if (!(flags & VK_QUEUE_COMPUTE_BIT)) continue;
            if (chosen < 0 || (!(flags & VK_QUEUE_GRAPHICS_BIT) &&
                               (families[chosen].queueFlags & VK_QUEUE_GRAPHICS_BIT)))
                chosen = static_cast<int>(i);
        }
        if (chosen < 0) {
            skip("it has no compute queue");
            continue;
        }
        d.queueFamily = static_cast<uint32_t>(chosen);
        d.queueCount = std::min<uint32_t>(families[chosen].queueCount, 16);
        d.timestampValidBits = families[chosen].timestampValidBits;

        const bool pciInfo = hasExtension(extensions, VK_EXT_PCI_BUS_INFO_EXTENSION_NAME);
        d.pushDescriptor =
            pushDescriptors && hasExtension(extensions, VK_KHR_PUSH_DESCRIPTOR_EXTENSION_NAME);

        auto pci = vkStruct<VkPhysicalDevicePCIBusInfoPropertiesEXT>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PCI_BUS_INFO_PROPERTIES_EXT);
        auto push = vkStruct<VkPhysicalDevicePushDescriptorPropertiesKHR>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PUSH_DESCRIPTOR_PROPERTIES_KHR);
        auto driver = vkStruct<VkPhysicalDeviceDriverProperties>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_DRIVER_PROPERTIES);
        auto props11 = vkStruct<VkPhysicalDeviceVulkan11Properties>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_PROPERTIES);
        auto props12 = vkStruct<VkPhysicalDeviceVulkan12Properties>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_PROPERTIES);
        auto ids = vkStruct<VkPhysicalDeviceIDProperties>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_ID_PROPERTIES);
        auto props2 = vkStruct<VkPhysicalDeviceProperties2>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2);
        props2.pNext = &ids;
        ids.pNext = &props11;
        props11.pNext = &props12;
        props12.pNext = &driver;
        void **tail = &driver.pNext;
        if (pciInfo) {
            *tail = &pci;
            tail = &pci.pNext;
        }
        if (d.pushDescriptor) *tail = &push;
        library_.vkGetPhysicalDeviceProperties2(handle, &props2);
        library_.vkGetPhysicalDeviceMemoryProperties(handle, &d.memory);
        const VkPhysicalDeviceLimits &limits = d.properties.limits;
        d.maxStorageBufferRange = limits.maxStorageBufferRange;
        d.preserveFloatSpecials = props12.shaderSignedZeroInfNanPreserveFloat32 == VK_TRUE;

        bp_device_info &info = d.info;
        info = sdk::makeStruct<bp_device_info>();
        sdk::copyString(info.name, name);
        sdk::copyString(info.vendor, vendorName(d.properties.vendorID));
        sdk::copyString(info.arch, archName(driver));
        sdk::copyString(info.driver_version, driverVersionText(d.properties, driver));
        if (pciInfo) {
            char bus[32];
            std::snprintf(bus, sizeof bus, "%04x:%02x:%02x.%x", pci.pciDomain, pci.pciBus,
                          pci.pciDevice, pci.pciFunction);
            sdk::copyString(info.pci_bus_id, bus);
        }
        std::memcpy(info.uuid, ids.deviceUUID, sizeof info.uuid);
        info.has_uuid = 1;
        info.type = deviceType(d.properties.deviceType);
        uint64_t deviceLocal = 0;
        for (uint32_t h = 0; h < d.memory.memoryHeapCount; ++h)
            if (d.memory.memoryHeaps[h].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT)
                deviceLocal = std::max<uint64_t>(deviceLocal, d.memory.memoryHeaps[h].size);
        info.memory_bytes = deviceLocal;
        info.max_allocation_bytes = std::min<uint64_t>(props11.maxMemoryAllocationSize, deviceLocal);
        for (int i = 0; i < 3; ++i) {
            info.max_block_size[i] = limits.maxComputeWorkGroupSize[i];
            info.max_grid_size[i] = limits.maxComputeWorkGroupCount[i];
        }
        info.max_block_threads = limits.maxComputeWorkGroupInvocations;
        info.max_shared_memory_bytes = limits.maxComputeSharedMemorySize;
        info.subgroup_size = std::max<uint32_t>(props11.subgroupSize, 1);
        info.binding_alignment =
            static_cast<uint32_t>(std::max<VkDeviceSize>(limits.minStorageBufferOffsetAlignment, 4));
        uint32_t maxBindings = std::min<uint32_t>(limits.maxPerStageDescriptorStorageBuffers, 32);
        if (d.pushDescriptor) maxBindings = std::min(maxBindings, push.maxPushDescriptors);
        info.max_bindings = maxBindings;
        info.max_scalar_bytes = std::min<uint32_t>(limits.maxPushConstantsSize, 4096);
        info.max_streams = d.queueCount;
        info.dialects = (1u << BP_DIALECT_GLSL) | (1u << BP_DIALECT_SPIRV);
        info.capabilities = BP_CAPABILITY_ASYNC_STREAMS | BP_CAPABILITY_PORTABLE_BINARIES |
                            BP_CAPABILITY_INDIRECT_DISPATCH;
        if (limits.timestampComputeAndGraphics && d.timestampValidBits > 0)
            info.capabilities |= BP_CAPABILITY_TIMESTAMPS;
        else
            d.timestampValidBits = 0;
        // DEVICE pages are mappable when the memory type they get is host-visible (lavapipe,
        // integrated GPUs); VulkanDevice picks the same type by the same rule.
        for (uint32_t t = 0; t < d.memory.memoryTypeCount; ++t) {
            const VkMemoryPropertyFlags flags = d.memory.memoryTypes[t].propertyFlags;
            if (!(flags & VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT)) continue;
            if ((flags & VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT) &&
                (flags & VK_MEMORY_PROPERTY_HOST_COHERENT_BIT)) {
                bool pureDeviceLocal = false;
                for (uint32_t u = 0; u < d.memory.memoryTypeCount; ++u)
                    if (d.memory.memoryTypes[u].propertyFlags ==
                        VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT)
                        pureDeviceLocal = true;
                if (!pureDeviceLocal) info.capabilities |= BP_CAPABILITY_MAPPABLE_DEVICE_MEMORY;
            }
            break;
        }
        features.describe(library_, instance_, handle, info);
        devices_.push_back(d);
    }
    if (devices_.empty())
        throw sdk::Error(BP_ERROR_NO_DEVICE,
                         handles.empty()
                             ? "the Vulkan loader reports no physical device"
                             : "no usable Vulkan device (" + skipped + ")");
}

VulkanPlugin::VulkanPlugin(const bp_plugin_init_args &args) : Plugin(args) {
    // Options are few and optional; a malformed options text is reported, not fatal.
    try {
        const auto options = nlohmann::json::parse(optionsJson());
        validation_ = options.value("validation", false);
        pushDescriptors_ = options.value("push_descriptors", true);
        shaderCopy_ = options.value("shader_copy", shaderCopy_);
        batchCommands_ = std::clamp<uint32_t>(options.value("batch_commands", batchCommands_), 1,
                                              4096);
    } catch (const std::exception &e) {
        log(BP_LOG_WARN, std::string("ignoring malformed vulkan plugin options: ") + e.what());
    }
    if (envFlag("BACKPLANE_VULKAN_VALIDATION")) validation_ = true;
}

VulkanPlugin::~VulkanPlugin() = default;

Instance &VulkanPlugin::instance() {
    std::lock_guard lock(mutex_);
    if (failure_) throw *failure_;
    if (!instance_) {
        try {
            instance_ = std::make_unique<Instance>(*this, validation_, pushDescriptors_);
        } catch (const sdk::Error &e) {
            failure_ = e;
            throw;
        }
    }
    return *instance_;
}

bp_probe_result VulkanPlugin::probe() {
    Instance &inst = instance();
    auto result = sdk::makeStruct<bp_probe_result>();
    result.device_count = static_cast<uint32_t>(inst.devices().size());
    sdk::copyString(result.driver_version, "Vulkan loader " + inst.loaderVersion());
    return result;
}

bp_device_info VulkanPlugin::deviceInfo(uint32_t index) {
    const auto &devices = instance().devices();
    if (index >= devices.size())
        throw sdk::Error(BP_ERROR_NOT_FOUND, "Vulkan device index " + std::to_string(index) +
                                                 " is out of range (" +
                                                 std::to_string(devices.size()) + " devices)");
    return devices[index].info;
}

std::unique_ptr<sdk::Device> VulkanPlugin::open(uint32_t index, const bp_device_open_args &) {
    Instance &inst = instance();
    if (index >= inst.devices().size())
        throw sdk::Error(BP_ERROR_NOT_FOUND,
                         "Vulkan device index " + std::to_string(index) + " is out of range");
    PhysicalDevice physical = inst.devices()[index];
    physical.batchCommands = batchCommands_;
    physical.shaderCopy = shaderCopy_ == "on" ||
                          (shaderCopy_ == "auto" && physical.info.type == BP_DEVICE_TYPE_DISCRETE_GPU);
    return std::make_unique<VulkanDevice>(*this, inst, physical, validation_);
}

} // namespace backplane::vulkan

BACKPLANE_PLUGIN(backplane::vulkan::VulkanPlugin)
