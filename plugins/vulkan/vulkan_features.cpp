// Kernel features of a Vulkan device: which feature structs say what, and what is enabled.
#include "vulkan_features.hpp"

#include <algorithm>
#include <cstring>

namespace backplane::vulkan {
namespace {

// VK_KHR_cooperative_matrix came with Vulkan headers 1.3.255; Debian 12 has 1.3.239. Its values
// (registry: extension 507) and layouts are spelled out here; NV's extension has the same
// component-type and scope values.
constexpr const char *kCooperativeMatrixKhrName = "VK_KHR_cooperative_matrix";
constexpr auto kCooperativeMatrixFeaturesKhr = static_cast<VkStructureType>(1000506000);
constexpr auto kCooperativeMatrixPropertiesKhr = static_cast<VkStructureType>(1000506001);
constexpr auto kCooperativeMatrixDevicePropertiesKhr = static_cast<VkStructureType>(1000506002);

/// VkCooperativeMatrixPropertiesKHR.
struct CooperativeMatrixPropertiesKhr {
    VkStructureType sType;
    void *pNext;
    uint32_t MSize, NSize, KSize;
    VkComponentTypeNV AType, BType, CType, ResultType;
    VkBool32 saturatingAccumulation;
    VkScopeNV scope;
};
/// VkPhysicalDeviceCooperativeMatrixPropertiesKHR (the same layout as NV's).
using CooperativeMatrixDevicePropertiesKhr = VkPhysicalDeviceCooperativeMatrixPropertiesNV;
using ListKhr = VkResult(VKAPI_PTR *)(VkPhysicalDevice, uint32_t *,
                                      CooperativeMatrixPropertiesKhr *);

constexpr uint32_t bit(bp_element_type t) { return 1u << t; }

bool has(const std::vector<VkExtensionProperties> &extensions, const char *name) {
    return std::any_of(extensions.begin(), extensions.end(), [&](const VkExtensionProperties &e) {
        return std::strcmp(e.extensionName, name) == 0;
    });
}

/// The element type of a cooperative-matrix component type; -1 for the others (BFLOAT16 and
/// the 8-bit floats of later extensions need extensions this plugin does not enable).
int elementOf(VkComponentTypeNV type) {
    switch (type) {
    case VK_COMPONENT_TYPE_FLOAT16_NV: return BP_ELEMENT_F16;
    case VK_COMPONENT_TYPE_FLOAT32_NV: return BP_ELEMENT_F32;
    case VK_COMPONENT_TYPE_FLOAT64_NV: return BP_ELEMENT_F64;
    case VK_COMPONENT_TYPE_SINT8_NV: return BP_ELEMENT_I8;
    case VK_COMPONENT_TYPE_SINT16_NV: return BP_ELEMENT_I16;
    case VK_COMPONENT_TYPE_SINT32_NV: return BP_ELEMENT_I32;
    case VK_COMPONENT_TYPE_SINT64_NV: return BP_ELEMENT_I64;
    case VK_COMPONENT_TYPE_UINT8_NV: return BP_ELEMENT_U8;
    case VK_COMPONENT_TYPE_UINT16_NV: return BP_ELEMENT_U16;
    case VK_COMPONENT_TYPE_UINT32_NV: return BP_ELEMENT_U32;
    case VK_COMPONENT_TYPE_UINT64_NV: return BP_ELEMENT_U64;
    default: return -1;
    }
}

/// Appends one shape unless it is unusable or already listed; false when the list is full.
bool addShape(bp_device_info &info, uint32_t m, uint32_t n, uint32_t k, VkComponentTypeNV a,
              VkComponentTypeNV b, VkComponentTypeNV c, VkComponentTypeNV result,
              VkScopeNV scope) {
    const int ea = elementOf(a), eb = elementOf(b), ec = elementOf(c);
    if (scope != VK_SCOPE_SUBGROUP_NV || c != result || ea < 0 || eb < 0 || ec < 0 || m == 0 ||
        n == 0 || k == 0 || m > UINT16_MAX || n > UINT16_MAX || k > UINT16_MAX)
        return true;
    bp_matrix_shape shape{};
    shape.m = static_cast<uint16_t>(m);
    shape.n = static_cast<uint16_t>(n);
    shape.k = static_cast<uint16_t>(k);
    shape.a = static_cast<uint8_t>(ea);
    shape.b = static_cast<uint8_t>(eb);
    shape.c = static_cast<uint8_t>(ec);
    const auto end = info.matrix_shapes + info.matrix_shape_count;
    if (std::any_of(info.matrix_shapes, end, [&](const bp_matrix_shape &s) {
            return std::memcmp(&s, &shape, sizeof shape) == 0;
        }))
        return true;
    if (info.matrix_shape_count == BP_MAX_MATRIX_SHAPES) return false;
    info.matrix_shapes[info.matrix_shape_count++] = shape;
    return true;
}

} // namespace

FeatureExtensions FeatureExtensions::of(const std::vector<VkExtensionProperties> &extensions) {
    FeatureExtensions out;
    out.atomicFloat = has(extensions, VK_EXT_SHADER_ATOMIC_FLOAT_EXTENSION_NAME);
    out.cooperativeMatrixKhr = has(extensions, kCooperativeMatrixKhrName);
    out.cooperativeMatrixNv = has(extensions, VK_NV_COOPERATIVE_MATRIX_EXTENSION_NAME);
    return out;
}

DeviceFeatures::DeviceFeatures(const VulkanLibrary &library, VkPhysicalDevice device,
                               const FeatureExtensions &extensions)
    : extensions_(extensions) {
    features_ = vkStruct<VkPhysicalDeviceFeatures2>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2);
    features11_ = vkStruct<VkPhysicalDeviceVulkan11Features>(
        VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES);
    features12_ = vkStruct<VkPhysicalDeviceVulkan12Features>(
        VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES);
    atomicFloat_ = vkStruct<VkPhysicalDeviceShaderAtomicFloatFeaturesEXT>(
        VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_ATOMIC_FLOAT_FEATURES_EXT);
    cooperativeMatrixNv_ = vkStruct<VkPhysicalDeviceCooperativeMatrixFeaturesNV>(
        VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_NV);
    cooperativeMatrixKhr_.sType = kCooperativeMatrixFeaturesKhr;
    // An extension's struct goes in the chain only when the device lists the extension.
    features_.pNext = &features11_;
    features11_.pNext = &features12_;
    void **tail = &features12_.pNext;
    if (extensions_.atomicFloat) {
        *tail = &atomicFloat_;
        tail = &atomicFloat_.pNext;
    }
    if (extensions_.cooperativeMatrixNv) {
        *tail = &cooperativeMatrixNv_;
        tail = &cooperativeMatrixNv_.pNext;
    }
    if (extensions_.cooperativeMatrixKhr) *tail = &cooperativeMatrixKhr_;
    library.vkGetPhysicalDeviceFeatures2(device, &features_);
}

void DeviceFeatures::describe(const VulkanLibrary &library, VkInstance instance,
                              VkPhysicalDevice device, bp_device_info &info) const {
    const VkPhysicalDeviceFeatures &core = features_.features;
    const auto on = [](VkBool32 value) { return value == VK_TRUE; };
    const uint32_t base =
        bit(BP_ELEMENT_BOOL) | bit(BP_ELEMENT_I32) | bit(BP_ELEMENT_U32) | bit(BP_ELEMENT_F32);
    const uint32_t int8 = bit(BP_ELEMENT_I8) | bit(BP_ELEMENT_U8);
    const uint32_t int16 = bit(BP_ELEMENT_I16) | bit(BP_ELEMENT_U16);
    const uint32_t int64 = bit(BP_ELEMENT_I64) | bit(BP_ELEMENT_U64);
    const uint32_t int32 = bit(BP_ELEMENT_I32) | bit(BP_ELEMENT_U32);

    uint32_t storage = base;
    if (on(features12_.storageBuffer8BitAccess)) storage |= int8;
    // bf16 lives in buffers as 16-bit words: 16-bit storage is all it needs.
    if (on(features11_.storageBuffer16BitAccess))
        storage |= int16 | bit(BP_ELEMENT_F16) | bit(BP_ELEMENT_BF16);
    if (on(core.shaderInt64)) storage |= int64;
    if (on(core.shaderFloat64)) storage |= bit(BP_ELEMENT_F64);

    // No BF16: core Vulkan has no bf16 arithmetic (VK_KHR_shader_bfloat16 only converts and
    // feeds matrix units), so the language computes it in f32.
    uint32_t arithmetic = base;
    if (on(features12_.shaderInt8)) arithmetic |= int8;
    if (on(core.shaderInt16)) arithmetic |= int16;
    if (on(features12_.shaderFloat16)) arithmetic |= bit(BP_ELEMENT_F16);
    if (on(core.shaderInt64)) arithmetic |= int64;
    if (on(core.shaderFloat64)) arithmetic |= bit(BP_ELEMENT_F64);

    // atomicAdd and the bit atomics must work on buffers and on shared memory alike.
    const bool int64Atomics =
        on(features12_.shaderBufferInt64Atomics) && on(features12_.shaderSharedInt64Atomics);
    uint32_t atomicAdd = int32;
    uint32_t atomicBits = int32;
    if (int64Atomics) {
        atomicAdd |= int64;
        atomicBits |= int64;
    }
    if (extensions_.atomicFloat) {
        if (on(atomicFloat_.shaderBufferFloat32AtomicAdd) &&
            on(atomicFloat_.shaderSharedFloat32AtomicAdd))
            atomicAdd |= bit(BP_ELEMENT_F32);
        if (on(atomicFloat_.shaderBufferFloat64AtomicAdd) &&
            on(atomicFloat_.shaderSharedFloat64AtomicAdd))
            atomicAdd |= bit(BP_ELEMENT_F64);
    }
    // Arithmetic or atomics on a type kernels cannot keep in buffers are not offered (plugin.h).
    info.element_storage = storage;
    info.element_arithmetic = arithmetic & storage;
    info.element_atomic_add = atomicAdd & storage;
    info.element_atomic_bits = atomicBits & storage;
    // The kernel language moves a GLSL vector as its elements (the driver's compiler merges
    // them), so every width works.
    info.vector_widths = (1u << 2) | (1u << 4) | (1u << 8);
    describeMatrixShapes(library, instance, device, info);
}

void DeviceFeatures::describeMatrixShapes(const VulkanLibrary &library, VkInstance instance,
                                          VkPhysicalDevice device, bp_device_info &info) const {
    info.matrix_shape_count = 0;
    const bool nv = extensions_.cooperativeMatrixNv && cooperativeMatrixNv_.cooperativeMatrix;
    const bool khr = extensions_.cooperativeMatrixKhr && cooperativeMatrixKhr_.cooperativeMatrix;
    if (!nv && !khr) return;
    // Only shapes that compute shaders may use.
    auto nvStages = vkStruct<VkPhysicalDeviceCooperativeMatrixPropertiesNV>(
        VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_PROPERTIES_NV);
    auto khrStages =
        vkStruct<CooperativeMatrixDevicePropertiesKhr>(kCooperativeMatrixDevicePropertiesKhr);
    auto properties =
        vkStruct<VkPhysicalDeviceProperties2>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2);
    void **tail = &properties.pNext;
    if (nv) {
        *tail = &nvStages;
        tail = &nvStages.pNext;
    }
    if (khr) *tail = &khrStages;
    library.vkGetPhysicalDeviceProperties2(device, &properties);

    if (nv && (nvStages.cooperativeMatrixSupportedStages & VK_SHADER_STAGE_COMPUTE_BIT)) {
        const auto list = reinterpret_cast<PFN_vkGetPhysicalDeviceCooperativeMatrixPropertiesNV>(
            library.vkGetInstanceProcAddr(instance,
                                          "vkGetPhysicalDeviceCooperativeMatrixPropertiesNV"));
        uint32_t count = 0;
        if (list != nullptr && list(device, &count, nullptr) == VK_SUCCESS) {
            std::vector<VkCooperativeMatrixPropertiesNV> shapes(
                count, vkStruct<VkCooperativeMatrixPropertiesNV>(
                           VK_STRUCTURE_TYPE_COOPERATIVE_MATRIX_PROPERTIES_NV));
            if (list(device, &count, shapes.data()) >= VK_SUCCESS) // VK_INCOMPLETE: a prefix
                for (uint32_t i = 0; i < std::min<size_t>(count, shapes.size()); ++i) {
                    const auto &s = shapes[i];
                    if (!addShape(info, s.MSize, s.NSize, s.KSize, s.AType, s.BType, s.CType,
                                  s.DType, s.scope))
                        break;
                }
        }
    }
    // The kernel language prints GL_NV_cooperative_matrix (Debian 12's glslang has no
    // GL_KHR_cooperative_matrix): a device with only the KHR extension reports no shapes, so
    // kernels with matrix units are refused there instead of failing to compile.
    if (nv && khr && (khrStages.cooperativeMatrixSupportedStages & VK_SHADER_STAGE_COMPUTE_BIT)) {
        const auto list = reinterpret_cast<ListKhr>(library.vkGetInstanceProcAddr(
            instance, "vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR"));
        uint32_t count = 0;
        if (list != nullptr && list(device, &count, nullptr) == VK_SUCCESS) {
            CooperativeMatrixPropertiesKhr blank{};
            blank.sType = kCooperativeMatrixPropertiesKhr;
            std::vector<CooperativeMatrixPropertiesKhr> shapes(count, blank);
            if (list(device, &count, shapes.data()) >= VK_SUCCESS)
                for (uint32_t i = 0; i < std::min<size_t>(count, shapes.size()); ++i) {
                    const auto &s = shapes[i];
                    if (s.saturatingAccumulation) continue;
                    if (!addShape(info, s.MSize, s.NSize, s.KSize, s.AType, s.BType, s.CType,
                                  s.ResultType, s.scope))
                        break;
                }
        }
    }
}

const void *DeviceFeatures::enableForOpen(std::vector<const char *> &extensionNames) {
    // Everything of core, 1.1 and 1.2 that the device has stays on (int64, float16, 8/16-bit
    // storage, int64 atomics, ...), except what costs speed or is never used.
    features_.features.robustBufferAccess = VK_FALSE;
    features_.features.sparseBinding = VK_FALSE;
    features_.features.sparseResidencyBuffer = VK_FALSE;
    features11_.protectedMemory = VK_FALSE;
    features12_.timelineSemaphore = VK_TRUE;
    features_.pNext = &features11_;
    features11_.pNext = &features12_;
    features12_.pNext = nullptr;
    void **tail = &features12_.pNext;
    // Extension structs: only the buffer and shared-memory atomics and the compute-shader
    // matrix feature; each struct and its extension only when something in it stays on.
    if (extensions_.atomicFloat) {
        auto kept = vkStruct<VkPhysicalDeviceShaderAtomicFloatFeaturesEXT>(
            VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_ATOMIC_FLOAT_FEATURES_EXT);
        kept.shaderBufferFloat32Atomics = atomicFloat_.shaderBufferFloat32Atomics;
        kept.shaderBufferFloat32AtomicAdd = atomicFloat_.shaderBufferFloat32AtomicAdd;
        kept.shaderBufferFloat64Atomics = atomicFloat_.shaderBufferFloat64Atomics;
        kept.shaderBufferFloat64AtomicAdd = atomicFloat_.shaderBufferFloat64AtomicAdd;
        kept.shaderSharedFloat32Atomics = atomicFloat_.shaderSharedFloat32Atomics;
        kept.shaderSharedFloat32AtomicAdd = atomicFloat_.shaderSharedFloat32AtomicAdd;
        kept.shaderSharedFloat64Atomics = atomicFloat_.shaderSharedFloat64Atomics;
        kept.shaderSharedFloat64AtomicAdd = atomicFloat_.shaderSharedFloat64AtomicAdd;
        atomicFloat_ = kept;
        if (atomicFloat_.shaderBufferFloat32Atomics || atomicFloat_.shaderBufferFloat32AtomicAdd ||
            atomicFloat_.shaderBufferFloat64Atomics || atomicFloat_.shaderBufferFloat64AtomicAdd ||
            atomicFloat_.shaderSharedFloat32Atomics || atomicFloat_.shaderSharedFloat32AtomicAdd ||
            atomicFloat_.shaderSharedFloat64Atomics || atomicFloat_.shaderSharedFloat64AtomicAdd) {
            *tail = &atomicFloat_;
            tail = &atomicFloat_.pNext;
            extensionNames.push_back(VK_EXT_SHADER_ATOMIC_FLOAT_EXTENSION_NAME);
        }
    }
    if (extensions_.cooperativeMatrixNv && cooperativeMatrixNv_.cooperativeMatrix) {
        cooperativeMatrixNv_.cooperativeMatrixRobustBufferAccess = VK_FALSE;
        cooperativeMatrixNv_.pNext = nullptr;
        *tail = &cooperativeMatrixNv_;
        tail = &cooperativeMatrixNv_.pNext;
        extensionNames.push_back(VK_NV_COOPERATIVE_MATRIX_EXTENSION_NAME);
    }
    if (extensions_.cooperativeMatrixKhr && cooperativeMatrixKhr_.cooperativeMatrix) {
        cooperativeMatrixKhr_.cooperativeMatrixRobustBufferAccess = VK_FALSE;
        cooperativeMatrixKhr_.pNext = nullptr;
        *tail = &cooperativeMatrixKhr_;
        extensionNames.push_back(kCooperativeMatrixKhrName);
    }
    return &features_;
}

} // namespace backplane::vulkan
