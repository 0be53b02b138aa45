// Conversion of the ABI's bp_device_info into the public DeviceInfo.
#pragma once

#include <backplane/abi/plugin.h>
#include <backplane/device.hpp>

#include <cstddef>

namespace backplane::detail {

/// Where ABI 1.4's kernel features end: a struct_size below it has none. (Checked at the end,
/// not the start: ABI 1.3's struct ended in 4 bytes of padding, where element_storage now lies.)
inline constexpr size_t kDeviceInfoSize14 =
    offsetof(bp_device_info, matrix_shapes) + sizeof(bp_device_info::matrix_shapes);
/// sizeof(bp_device_info) in ABI 1.1 to 1.3: the collectives field, rounded up to the struct's
/// alignment.
inline constexpr size_t kDeviceInfoSize13 =
    (offsetof(bp_device_info, element_storage) + alignof(bp_device_info) - 1) /
    alignof(bp_device_info) * alignof(bp_device_info);
static_assert(kDeviceInfoSize13 < kDeviceInfoSize14);
/// Where ABI 1.5's kernel_compiler ends.
inline constexpr size_t kDeviceInfoSize15 =
    offsetof(bp_device_info, kernel_compiler) + sizeof(bp_device_info::kernel_compiler);

/// What kernels of a plugin older than ABI 1.4 may use: storage and arithmetic of bool, i32,
/// u32, f32; atomic add and bits on i32 and u32; no vectors; no matrix units.
KernelFeatures kernelFeaturesBeforeAbi14();

/// The core's view of what device_info filled: strings cut at their field size and made
/// printable, enums clamped. Throws Error(Internal) for a value the engine cannot work with
/// (a binding alignment that is not a power of two of at most 1 MiB). A struct_size below
/// kDeviceInfoSize14 (a plugin older than ABI 1.4) gets kernelFeaturesBeforeAbi14(); from a newer
/// one, mask bits of unknown types and unusable matrix shapes are dropped.
DeviceInfo toDeviceInfo(const std::string &backend, uint32_t index, const bp_device_info &in);

} // namespace backplane::detail
