// Plugin discovery (search path, manifests), filtering before dlopen, loading and probing.
#pragma once

#include <backplane/config.hpp>
#include <backplane/device.hpp>
#include <backplane/runtime.hpp>

#include "plugin/plugin_library.hpp"

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace backplane::detail {

/// Everything the loader found: a report per manifest, the loaded libraries, their devices.
struct LoadedPlugins {
    std::vector<std::filesystem::path> searchPath; ///< where manifests were looked for
    std::vector<PluginReport> reports;             ///< one per manifest, in search order
    std::map<std::string, std::shared_ptr<PluginLibrary>> libraries; ///< by plugin name
    std::vector<DeviceInfo> devices;               ///< every device of every loaded plugin
};

/// The manifest search path in order: config.pluginPathOverride (BACKPLANE_PLUGIN_PATH), then
/// config.pluginPaths, then, unless the override is set, the default plugin directories: the
/// build tree's plugins/*/ when libbackplane runs from BACKPLANE_BUILD_ROOT, else
/// <dir of libbackplane>/backplane/plugins and BACKPLANE_INSTALL_PLUGIN_DIR.
std::vector<std::filesystem::path> pluginSearchPath(const Config &config);

/// Manifest files (*.json) in the search path: a directory contributes its *.json files sorted
/// by name (not recursive), a file contributes itself. Missing entries are skipped; each file
/// appears once (the first time it is reached).
std::vector<std::filesystem::path> findManifests(const std::vector<std::filesystem::path> &path);

/// Finds, filters, loads and probes plugins. Never throws for a plugin's failure: it is in the
/// plugin's report. No library excluded by a filter is opened.
LoadedPlugins loadPlugins(const Config &config);

} // namespace backplane::detail
