// Conversion of the ABI's bp_device_info into the public DeviceInfo.
#pragma once

#include <backplane/abi/plugin.h>
#include <backplane/device.hpp>

namespace backplane::detail {

/// The core's view of what device_info filled: strings cut at their field size and made
/// printable, enums clamped. Throws Error(Internal) for a value the engine cannot work with
/// (a binding alignment that is not a power of two of at most 1 MiB).
DeviceInfo toDeviceInfo(const std::string &backend, uint32_t index, const bp_device_info &in);

} // namespace backplane::detail
