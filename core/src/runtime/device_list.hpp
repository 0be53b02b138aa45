// Building the physical device list: dedup by UUID, preferred route, default order.
#pragma once

#include <backplane/runtime.hpp>

#include <string>
#include <vector>

namespace backplane::detail {

/// Rank of a route in devices.backend_priority (lower is preferred): the position of its plugin
/// name, else of its backend kind (from `reports`), else after every listed one.
size_t backendRank(const DeviceInfo &route, const std::vector<std::string> &priority,
                   const std::vector<PluginReport> &reports);

/// Groups routes with equal UUIDs (has_uuid) into one PhysicalDevice, picks each one's preferred
/// route by backend priority, and sorts best first: discrete GPU, integrated GPU, virtual/other,
/// CPU; then more memory; then backend priority; then discovery order.
std::vector<PhysicalDevice> buildDeviceList(const std::vector<DeviceInfo> &routes,
                                            const std::vector<std::string> &priority,
                                            const std::vector<PluginReport> &reports);

} // namespace backplane::detail
