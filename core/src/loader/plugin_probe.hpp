// Loading, initialising and probing one plugin library: the same steps in this process and in
// the backplane-probe helper, with the same states and messages.
#pragma once

#include <backplane/device.hpp>
#include <backplane/runtime.hpp>

#include "plugin/plugin_library.hpp"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace backplane::detail {

/// What loading and probing one plugin gave.
struct ProbeOutcome {
    PluginState state = PluginState::LibraryLoadFailed;
    std::string reason;          ///< "" when Loaded without failures
    std::string version;         ///< the plugin's own version ("" if its table was not read)
    std::string optionsSchema;   ///< the table's options schema (ABI 1.5), "" if none
    uint32_t abiMajor = 0;
    uint32_t abiMinor = 0;
    std::string driverVersion;   ///< from the probe
    uint32_t deviceCount = 0;    ///< what the probe reported (<= kMaxDevicesPerPlugin)
    std::vector<DeviceInfo> devices;          ///< the devices described without error
    std::shared_ptr<PluginLibrary> library;   ///< the loaded library (state Loaded only)
};

/// Opens `library` as plugin `name` with `options`, probes it and describes every device.
/// Never throws for the plugin's failures: they are in the outcome. `onStage` hears each stage
/// ("loading", "plugin_init", "probe", "device_info(N)") before it starts.
ProbeOutcome probePlugin(const std::filesystem::path &library, const std::string &name,
                         const PluginInitOptions &options,
                         const std::function<void(const char *)> &onStage = {});

/// The outcome as JSON (no library), every device field included: what backplane-probe answers
/// and the probe cache keeps.
nlohmann::json outcomeJson(const ProbeOutcome &outcome);
/// Reads outcomeJson's output; the devices get `backend` as their plugin name. Throws
/// Error(Internal) naming the pointer when a field is missing, mistyped or out of range.
ProbeOutcome outcomeFromJson(const nlohmann::json &json, const std::string &backend);

/// Loads the library and runs plugin_init only, taking the devices from `answer` (an isolated
/// probe's, fresh or cached): probe and device_info are not called in this process until a
/// device of the plugin is opened (PluginLibrary::ensureProbed). Never throws for the plugin's
/// failures.
ProbeOutcome loadWithAnswer(const std::filesystem::path &library, const std::string &name,
                            const PluginInitOptions &options, ProbeOutcome answer);

/// The state named `name` ("probe_failed"), or nothing.
std::optional<PluginState> pluginStateNamed(const std::string &name);

} // namespace backplane::detail
