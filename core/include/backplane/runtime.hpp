// backplane::Runtime: config, plugin discovery and loading, device list, selection, report.
#pragma once

#include <backplane/config.hpp>
#include <backplane/device.hpp>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

namespace backplane {

/// How one plugin candidate (one manifest) ended. Every manifest found is reported with exactly
/// one of these; docs/devices-json.md lists the same names.
enum class PluginState {
    Loaded,            ///< library loaded, probe succeeded, at least one device
    FilteredOut,       ///< plugins.enable/disable or a `required` preference excluded it; never opened
    Shadowed,          ///< an earlier manifest with the same plugin name won; never opened
    ManifestInvalid,   ///< the manifest is unreadable, not JSON, or has a missing/mistyped field
    AbiMismatch,       ///< ABI major differs (manifest or function table); reason names both
    EntryMissing,      ///< the library does not export the entry symbol
    InvalidTable,      ///< the function table is too small, lacks required functions, or its
                       ///< name differs from the manifest's
    LibraryLoadFailed, ///< dlopen failed: missing file, missing dependency, not a library
    InitFailed,        ///< plugin_init returned an error
    ProbeFailed,       ///< probe (or device_info) failed: typically the vendor driver is missing
    NoDevice,          ///< the plugin works but sees no device
    ProbeCrashed,      ///< the isolated probe process died (signal, exit) while loading, initialising
                       ///< or probing the plugin; reason names the signal and the stage. Not loaded
    ProbeTimeout,      ///< the isolated probe gave no answer within plugins.probe_timeout_ms and
                       ///< was killed; not loaded
};

/// Stable snake_case name of a state ("library_load_failed"), as in `backplane devices --json`.
const char *toString(PluginState state) noexcept;

/// What happened to one plugin candidate. Plain value.
struct PluginReport {
    std::string name;        ///< the manifest's "name" ("" when the manifest could not be read)
    std::string backend;     ///< the manifest's "backend" kind ("cuda", "vulkan", "fake"...)
    std::string description; ///< the manifest's "description"
    std::string version;     ///< the plugin's own version (from its table; "" unless the
                             ///< library was opened and its table read)
    std::filesystem::path manifest; ///< the manifest file
    std::filesystem::path library;  ///< the library the manifest names, resolved
    PluginState state = PluginState::ManifestInvalid;
    std::string reason;      ///< why not loaded (loader / plugin message); "" when Loaded
    uint32_t abiMajor = 0;   ///< the plugin's ABI version: its table's once the library was
                             ///< opened (even when loading failed after that), else the manifest's
    uint32_t abiMinor = 0;
    std::string driverVersion; ///< from the probe, "" if unknown
    /// The schema of the plugin's options (ABI 1.5; checkPluginOptions reads it), "" when the
    /// plugin publishes none or its table was not read.
    std::string optionsSchema;
    uint32_t deviceCount = 0;  ///< devices the probe reported
    /// How the probe result was obtained: "isolated" (a backplane-probe child ran this time),
    /// "cached" (a record from an earlier run; no child), "in_process" (plugins.probe is
    /// in_process, or no backplane-probe was found), "" (never probed: filtered, shadowed, bad
    /// manifest, library rejected before loading).
    std::string probe;
};

/// One physical device, possibly reached through several plugins ("routes"): the same GPU seen
/// by e.g. the cuda and vulkan plugins (equal UUIDs) is one PhysicalDevice with two routes.
struct PhysicalDevice {
    std::vector<DeviceInfo> routes; ///< every plugin's view of it, in plugin load order
    size_t preferred = 0;           ///< index into routes chosen by devices.backend_priority
    /// The preferred route's description.
    const DeviceInfo &info() const { return routes.at(preferred); }
};

/// The result of a selection: the device (route) to open, and why.
struct Selection {
    DeviceInfo device;                 ///< the chosen route
    std::string reason;                ///< which selector matched, or why the default was used
    std::vector<std::string> rejected; ///< earlier selectors that matched nothing, with reasons
};

class ComputeClient; // backplane/client.hpp

/// The entry point of the library: reads nothing itself beyond what its Config says; finds
/// plugin manifests (BACKPLANE_PLUGIN_PATH / pluginPathOverride, plugins.paths, the install
/// dir, the build tree), applies plugins.enable/disable and a `required` device preference
/// before any library is opened, loads and probes the rest, and lists their devices,
/// deduplicated by UUID. A plugin that fails never stops the others: its failure is in
/// plugins(). Construction never throws for plugin problems; it throws Error(Config) only when
/// the config's log spec is invalid.
///
/// Thread-safety: const member functions may be called concurrently. Move-only; the plugin
/// libraries stay loaded while the Runtime or anything opened from it lives.
class Runtime {
public:
    /// Uses `config` exactly as given (no environment is read).
    explicit Runtime(Config config);
    /// Runtime(loadConfig()): config file plus environment overrides. Throws Error(Config).
    Runtime();
    ~Runtime();
    Runtime(Runtime &&) noexcept;
    Runtime &operator=(Runtime &&) noexcept;
    Runtime(const Runtime &) = delete;
    Runtime &operator=(const Runtime &) = delete;

    /// The configuration in effect.
    const Config &config() const;
    /// One report per manifest found, in search order.
    const std::vector<PluginReport> &plugins() const;
    /// The usable devices, best first by the default order (discrete GPU, integrated, other,
    /// CPU; then memory; then backend priority).
    const std::vector<PhysicalDevice> &devices() const;
    /// Where manifests were searched, in order (directories and files).
    const std::vector<std::filesystem::path> &searchPath() const;

    /// Picks a device. `selector` is a comma-separated list of selectors ("cuda:0",
    /// "vulkan:<uuid or unique prefix>", "hip", "*:gpu", "*:cpu", "*"); the first one matching a
    /// device wins, and an explicit selector is always `required`. "" uses the config's
    /// devices.prefer and devices.required; when nothing there matches and required is false,
    /// the best device is taken and a warning names the selectors that failed and why. Messages
    /// name where the preference came from (Config::devicePreferenceSource: BACKPLANE_DEVICE or
    /// the config file).
    /// Throws Error(NoMatchingDevice) with the plugin report when nothing matches and the
    /// selection is required, Error(NoDevice) when no device exists at all, Error(Config) for a
    /// malformed selector.
    Selection select(const std::string &selector = "") const;

    /// Opens the selected device (contexts, queues) and returns the client for it (see
    /// backplane/client.hpp). Throws Error.
    ComputeClient open(const Selection &selection) const;

    /// The stable JSON of `backplane devices --json` (docs/devices-json.md, schema_version 1):
    /// search path, plugin reports, devices with their routes, and the default selection.
    std::string reportJson(int indent = 2) const;

    /// Implementation (core/src/runtime/runtime_impl.hpp); opaque to applications.
    struct Impl;
    /// For the core's own parts (ComputeClient); never null for a live Runtime.
    const Impl &impl() const { return *impl_; }

private:
    std::unique_ptr<Impl> impl_;
};

} // namespace backplane
