// Opening a ComputeClient on one device of a loaded plugin (used by Runtime::open and tests).
#pragma once

#include "plugin/plugin_library.hpp"

#include <backplane/client.hpp>
#include <backplane/config.hpp>

#include <memory>

namespace backplane::detail {

/// Opens device `info.index` of `plugin` (device_open) and builds its ComputeServer. The client
/// keeps the plugin loaded. Throws Error.
ComputeClient openComputeClient(std::shared_ptr<PluginLibrary> plugin, const DeviceInfo &info,
                                const Config &config);

} // namespace backplane::detail
