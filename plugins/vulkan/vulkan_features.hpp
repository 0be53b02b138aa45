// What a Vulkan device offers kernels: its feature structs, read once to describe the device
// (bp_device_info's kernel features, ABI 1.4) and again to enable the same features at open.
#pragma once

#include "vulkan_api.hpp"

#include <vector>

namespace backplane::vulkan {

/// The device extensions that add kernel features, as the physical device lists them.
struct FeatureExtensions {
    bool atomicFloat = false;          ///< VK_EXT_shader_atomic_float
    bool cooperativeMatrixKhr = false; ///< VK_KHR_cooperative_matrix
    bool cooperativeMatrixNv = false;  ///< VK_NV_cooperative_matrix

    /// Reads them from the physical device's extension list.
    static FeatureExtensions of(const std::vector<VkExtensionProperties> &extensions);
};

/// The feature structs of one physical device (core, 1.1, 1.2 and the extensions above),
/// chained for vkGetPhysicalDeviceFeatures2. Neither copyable nor movable: the chain points into
/// the object itself.
class DeviceFeatures {
public:
    /// Queries every struct the device has (an extension's only when it is listed).
    DeviceFeatures(const VulkanLibrary &library, VkPhysicalDevice device,
                   const FeatureExtensions &extensions);
    DeviceFeatures(const DeviceFeatures &) = delete;
    DeviceFeatures &operator=(const DeviceFeatures &) = delete;

    bool timelineSemaphore() const noexcept { return features12_.timelineSemaphore == VK_TRUE; }

    /// Fills the kernel features of `info` (ABI 1.4): element masks and vector widths from the
    /// features; matrix shapes from the cooperative-matrix extensions the device has and that
    /// enableForOpen keeps on (NV's list first, then KHR's shapes not listed yet): subgroup
    /// scope, usable in compute shaders, component types that bp_element_type names, C and
    /// result of one type, no saturating accumulation; at most BP_MAX_MATRIX_SHAPES.
    void describe(const VulkanLibrary &library, VkInstance instance, VkPhysicalDevice device,
                  bp_device_info &info) const;

    /// Prepares the chain for VkDeviceCreateInfo::pNext and returns its head: everything the
    /// device offers that kernels may use stays on (so a kernel the description allows compiles
    /// and runs), what costs speed or is never used goes off (robustBufferAccess, sparse and
    /// protected memory, image atomics), and timelineSemaphore is on. Appends the extensions
    /// that the kept features need to `extensionNames`. Only supported features are ever on, so
    /// device creation never fails for a feature the device lacks.
    const void *enableForOpen(std::vector<const char *> &extensionNames);

private:
    void describeMatrixShapes(const VulkanLibrary &library, VkInstance instance,
                              VkPhysicalDevice device, bp_device_info &info) const;

    FeatureExtensions extensions_;
    VkPhysicalDeviceFeatures2 features_{};
    VkPhysicalDeviceVulkan11Features features11_{};
    VkPhysicalDeviceVulkan12Features features12_{};
    VkPhysicalDeviceShaderAtomicFloatFeaturesEXT atomicFloat_{};
    VkPhysicalDeviceCooperativeMatrixFeaturesNV cooperativeMatrixNv_{};
    /// VkPhysicalDeviceCooperativeMatrixFeaturesKHR (its layout; Debian 12's headers lack it).
    struct CooperativeMatrixFeaturesKhr {
        VkStructureType sType;
        void *pNext;
        VkBool32 cooperativeMatrix;
        VkBool32 cooperativeMatrixRobustBufferAccess;
    } cooperativeMatrixKhr_{};
};

} // namespace backplane::vulkan
