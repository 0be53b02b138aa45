// Physical device list: dedup by UUID, preferred route, default order.
#include "device_list.hpp"

#include <algorithm>

namespace backplane::detail {
namespace {

int typeRank(DeviceType type) {
    switch (type) {
    case DeviceType::DiscreteGpu: return 0;
    case DeviceType::IntegratedGpu: return 1;
    case DeviceType::VirtualGpu:
    case DeviceType::Other: return 2;
    case DeviceType::Cpu: return 3;
    }
    return 2;
}

} // namespace

size_t backendRank(const DeviceInfo &route, const std::vector<std::string> &priority,
                   const std::vector<PluginReport> &reports) {
    const auto byName = std::find(priority.begin(), priority.end(), route.backend);
    if (byName != priority.end()) return static_cast<size_t>(byName - priority.begin());
    for (const auto &report : reports) {
        if (report.name != route.backend || report.state != PluginState::Loaded) continue;
        const auto byKind = std::find(priority.begin(), priority.end(), report.backend);
        if (byKind != priority.end()) return static_cast<size_t>(byKind - priority.begin());
    }
    return priority.size();
}

std::vector<PhysicalDevice> buildDeviceList(const std::vector<DeviceInfo> &routes,
                                            const std::vector<std::string> &priority,
                                            const std::vector<PluginReport> &reports) {
    std::vector<PhysicalDevice> devices;
    for (const auto &route : routes) {
        const auto same = std::find_if(devices.begin(), devices.end(), [&](const PhysicalDevice &d) {
            return route.hasUuid && d.routes.front().hasUuid && d.routes.front().uuid == route.uuid;
        });
        if (same != devices.end()) same->routes.push_back(route);
        else devices.push_back(PhysicalDevice{{route}, 0});
    }
    for (auto &device : devices) {
        size_t best = 0;
        for (size_t i = 1; i < device.routes.size(); ++i)
            if (backendRank(device.routes[i], priority, reports) <
                backendRank(device.routes[best], priority, reports))
                best = i;
        device.preferred = best;
    }
    std::stable_sort(devices.begin(), devices.end(),
                     [&](const PhysicalDevice &a, const PhysicalDevice &b) {
                         const DeviceInfo &x = a.info();
                         const DeviceInfo &y = b.info();
                         if (typeRank(x.type) != typeRank(y.type))
                             return typeRank(x.type) < typeRank(y.type);
                         if (x.memoryBytes != y.memoryBytes) return x.memoryBytes > y.memoryBytes;
                         return backendRank(x, priority, reports) <
                                backendRank(y, priority, reports);
                     });
    return devices;
}

} // namespace backplane::detail
