// Conversion of the ABI's bp_device_info into the public DeviceInfo.
#pragma once

#include <backplane/abi/plugin.h>
#include <backplane/device.hpp>

namespace backplane::detail {

DeviceInfo toDeviceInfo(const std::string &backend, uint32_t index, const bp_device_info &in);

} // namespace backplane::detail
