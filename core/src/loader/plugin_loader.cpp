// Plugin discovery, filtering before dlopen, loading and probing; every candidate gets a report.
#include "plugin_loader.hpp"

#include "loader/plugin_manifest.hpp"
#include "plugin/device_info.hpp"
#include "runtime/device_selector.hpp"

#include <backplane/cache.hpp>
#include <backplane/log.hpp>

#include <boost/dll/runtime_symbol_info.hpp>

#include <algorithm>
#include <cstring>
#include <optional>
#include <set>
#include <system_error>

#ifndef BACKPLANE_BUILD_ROOT
#define BACKPLANE_BUILD_ROOT ""
#endif
#ifndef BACKPLANE_INSTALL_PLUGIN_DIR
#define BACKPLANE_INSTALL_PLUGIN_DIR ""
#endif

namespace backplane::detail {
namespace {

namespace fs = std::filesystem;

bool contains(const std::vector<std::string> &list, const std::string &item) {
    return std::find(list.begin(), list.end(), item) != list.end();
}

std::string joined(const std::vector<std::string> &list) {
    std::string out;
    for (const auto &item : list) out += (out.empty() ? "" : ", ") + item;
    return out;
}

bool isUnder(const fs::path &path, const fs::path &root) {
    std::error_code ec;
    const fs::path p = fs::weakly_canonical(path, ec);
    const fs::path r = fs::weakly_canonical(root, ec);
    if (ec || r.empty()) return false;
    auto [rootEnd, pathAt] = std::mismatch(r.begin(), r.end(), p.begin(), p.end());
    return rootEnd == r.end() || (std::next(rootEnd) == r.end() && rootEnd->empty());
}

std::vector<fs::path> sortedEntries(const fs::path &dir, bool directories) {
    std::vector<fs::path> out;
    std::error_code ec;
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
        const bool isDir = it->is_directory(ec);
        if (directories ? isDir : (!isDir && it->path().extension() == ".json"))
            out.push_back(it->path());
    }
    std::sort(out.begin(), out.end());
    return out;
}

/// Names the selectors of a `required` preference restrict loading to, or {} when any plugin
/// could serve them (some selector is "*", "*:gpu"...).
std::optional<std::vector<std::string>> requiredBackends(const Config &config) {
    if (!config.deviceRequired || config.devicePreference.empty()) return std::nullopt;
    std::vector<std::string> names;
    for (const auto &text : config.devicePreference) {
        DeviceSelector selector;
        try {
            selector = parseSelector(text);
        } catch (const Error &) {
            return std::nullopt; // select() reports the bad selector; do not filter on it here
        }
        if (!selector.namesBackend()) return std::nullopt;
        if (!contains(names, selector.backend)) names.push_back(selector.backend);
    }
    return names;
}

std::string pluginCacheDir(const Config &config, const std::string &name) {
    const fs::path root = cacheDirectory(config);
    if (root.empty()) return {};
    const fs::path dir = root / toString(CacheKind::Pipelines) / name;
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) {
        log::write(log::Subsystem::Loader, log::Level::Warn,
                   "cannot create the plugin cache directory " + dir.string() + ": " +
                       ec.message() + "; " + name + " runs without a cache");
        return {};
    }
    return dir.string();
}

PluginState stateOf(LoadFailure failure) {
    switch (failure) {
    case LoadFailure::LibraryLoad: return PluginState::LibraryLoadFailed;
    case LoadFailure::EntryMissing: return PluginState::EntryMissing;
    case LoadFailure::AbiMismatch: return PluginState::AbiMismatch;
    case LoadFailure::InvalidTable: return PluginState::InvalidTable;
    case LoadFailure::InitFailed: return PluginState::InitFailed;
    }
    return PluginState::LibraryLoadFailed;
}

/// Loads one candidate that passed the filters; fills report and result.
void loadOne(const Config &config, const PluginManifest &manifest, PluginReport &report,
             LoadedPlugins &result) {
    if (manifest.abiMajor != BP_ABI_VERSION_MAJOR) {
        report.state = PluginState::AbiMismatch;
        report.reason = "manifest declares plugin ABI " + std::to_string(manifest.abiMajor) + "." +
                        std::to_string(manifest.abiMinor) + " but this backplane speaks ABI " +
                        std::to_string(BP_ABI_VERSION_MAJOR) + "." +
                        std::to_string(BP_ABI_VERSION_MINOR) +
                        "; the library was not opened. Use a plugin built for ABI " +
                        std::to_string(BP_ABI_VERSION_MAJOR) + ".x";
        return;
    }
    std::error_code ec;
    if (!fs::exists(manifest.library, ec)) {
        report.state = PluginState::LibraryLoadFailed;
        report.reason = manifest.library.string() + " does not exist (named by /library of " +
                        manifest.file.string() + ")";
        return;
    }
    std::shared_ptr<PluginLibrary> library;
    try {
        PluginInitOptions options;
        options.cacheDir = pluginCacheDir(config, manifest.name);
        if (const auto it = config.pluginOptions.find(manifest.name);
            it != config.pluginOptions.end())
            options.optionsJson = it->second;
        library = PluginLibrary::open(manifest.library, manifest.name, options);
    } catch (const PluginLoadError &e) {
        report.state = stateOf(e.failure());
        report.reason = e.what();
        return;
    } catch (const std::exception &e) {
        report.state = PluginState::LibraryLoadFailed;
        report.reason = "cannot load " + manifest.library.string() + ": " + e.what();
        return;
    }
    report.version = library->version();
    report.abiMajor = library->api().abi_major;
    report.abiMinor = library->abiMinor();
    bp_probe_result probe{};
    try {
        probe = library->probe();
    } catch (const Error &e) {
        report.state = e.code() == ErrorCode::NoDevice ? PluginState::NoDevice
                                                        : PluginState::ProbeFailed;
        report.reason = e.what();
        return;
    }
    report.driverVersion = std::string(probe.driver_version,
                                       strnlen(probe.driver_version, sizeof(probe.driver_version)));
    report.deviceCount = probe.device_count;
    std::vector<DeviceInfo> devices;
    std::string failures;
    for (uint32_t i = 0; i < probe.device_count; ++i) {
        try {
            devices.push_back(toDeviceInfo(manifest.name, i, library->deviceInfo(i)));
        } catch (const Error &e) {
            failures += std::string(failures.empty() ? "" : "; ") + e.what();
            log::write(log::Subsystem::Loader, log::Level::Warn,
                       std::string(e.what()) + "; that device is skipped");
        }
    }
    if (probe.device_count == 0) {
        report.state = PluginState::NoDevice;
        report.reason = "the probe reports 0 devices";
        return;
    }
    if (devices.empty()) {
        report.state = PluginState::ProbeFailed;
        report.reason = failures;
        return;
    }
    report.state = PluginState::Loaded;
    report.reason = failures;
    result.libraries[manifest.name] = library;
    for (auto &d : devices) result.devices.push_back(std::move(d));
}

} // namespace

std::vector<fs::path> pluginSearchPath(const Config &config) {
    std::vector<fs::path> path = config.pluginPathOverride;
    path.insert(path.end(), config.pluginPaths.begin(), config.pluginPaths.end());
    if (!config.pluginPathOverride.empty()) return path;

    std::error_code ec;
    const fs::path self = boost::dll::this_line_location(ec);
    const fs::path buildRoot = BACKPLANE_BUILD_ROOT;
    if (!ec && !buildRoot.empty() && isUnder(self, buildRoot)) {
        // Running from the build tree (meson test, meson devenv): each plugin's build writes
        // <name>.json next to its module in <build>/plugins/<name>/.
        for (const auto &dir : sortedEntries(buildRoot / "plugins", true)) path.push_back(dir);
        return path;
    }
    if (!ec) path.push_back(self.parent_path() / "backplane" / "plugins");
    const fs::path installed = BACKPLANE_INSTALL_PLUGIN_DIR;
    if (!installed.empty() && std::find(path.begin(), path.end(), installed) == path.end())
        path.push_back(installed);
    return path;
}

std::vector<fs::path> findManifests(const std::vector<fs::path> &path) {
    std::vector<fs::path> manifests;
    std::set<fs::path> seen;
    const auto add = [&](const fs::path &file) {
        std::error_code ec;
        const fs::path key = fs::weakly_canonical(file, ec);
        if (seen.insert(ec ? file : key).second) manifests.push_back(file);
    };
    for (const auto &entry : path) {
        std::error_code ec;
        if (fs::is_directory(entry, ec)) {
            for (const auto &file : sortedEntries(entry, false)) add(file);
        } else if (fs::exists(entry, ec)) {
            add(entry);
        } else {
            log::write(log::Subsystem::Loader, log::Level::Debug,
                       "plugin search path entry " + entry.string() + " does not exist");
        }
    }
    return manifests;
}

LoadedPlugins loadPlugins(const Config &config) {
    LoadedPlugins result;
    result.searchPath = pluginSearchPath(config);
    const auto required = requiredBackends(config);
    std::map<std::string, fs::path> winners; // plugin name -> manifest that claimed it

    for (const auto &file : findManifests(result.searchPath)) {
        PluginReport report;
        report.manifest = file;
        PluginManifest manifest;
        try {
            manifest = readManifest(file);
        } catch (const ManifestError &e) {
            report.state = PluginState::ManifestInvalid;
            report.reason = e.what();
            result.reports.push_back(std::move(report));
            continue;
        }
        report.name = manifest.name;
        report.backend = manifest.backend;
        report.description = manifest.description;
        report.library = manifest.library;
        report.abiMajor = manifest.abiMajor;
        report.abiMinor = manifest.abiMinor;

        if (const auto it = winners.find(manifest.name); it != winners.end()) {
            report.state = PluginState::Shadowed;
            report.reason = "plugin '" + manifest.name + "' is already provided by " +
                            it->second.string() + ", found earlier in the search path";
        } else {
            winners.emplace(manifest.name, file);
            if (!config.pluginEnable.empty() && !contains(config.pluginEnable, manifest.name)) {
                report.state = PluginState::FilteredOut;
                report.reason = "not in plugins.enable (" + joined(config.pluginEnable) + ")";
            } else if (contains(config.pluginDisable, manifest.name)) {
                report.state = PluginState::FilteredOut;
                report.reason = "listed in plugins.disable";
            } else if (required && !contains(*required, manifest.name)) {
                report.state = PluginState::FilteredOut;
                report.reason = "devices.required is set and devices.prefer names only " +
                                joined(*required);
            } else {
                loadOne(config, manifest, report, result);
            }
        }
        const bool failed = report.state != PluginState::Loaded &&
                            report.state != PluginState::FilteredOut &&
                            report.state != PluginState::Shadowed;
        log::write(log::Subsystem::Loader, failed ? log::Level::Info : log::Level::Debug,
                   (report.name.empty() ? file.string() : report.name) + ": " +
                       toString(report.state) +
                       (report.reason.empty() ? "" : " (" + report.reason + ")"));
        result.reports.push_back(std::move(report));
    }
    return result;
}

} // namespace backplane::detail
