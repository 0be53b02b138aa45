// backplane::RawPlugin: the runtime's manifest reader and plugin loader, opened up for tools.
#include <backplane/raw_plugin.hpp>

#include "loader/plugin_loader.hpp"
#include "loader/plugin_manifest.hpp"
#include "plugin/plugin_library.hpp"

#include <algorithm>
#include <utility>

namespace backplane {

struct RawPlugin::State {
    PluginManifestInfo manifest;
    std::shared_ptr<detail::PluginLibrary> library;
    std::string version;
};

namespace {

PluginManifestInfo toInfo(detail::PluginManifest m) {
    return {.file = std::move(m.file),
            .name = std::move(m.name),
            .library = std::move(m.library),
            .abiMajor = m.abiMajor,
            .abiMinor = m.abiMinor,
            .backend = std::move(m.backend),
            .description = std::move(m.description),
            .expectedFailures = std::move(m.expectedFailures)};
}

} // namespace

PluginManifestInfo readPluginManifest(const std::filesystem::path &file) {
    return toInfo(detail::readManifest(file));
}

std::vector<PluginManifestInfo> findPluginManifests(const Config &config) {
    std::vector<PluginManifestInfo> manifests;
    for (const auto &file : detail::findManifests(detail::pluginSearchPath(config))) {
        try {
            PluginManifestInfo m = toInfo(detail::readManifest(file));
            const bool shadowed = std::any_of(manifests.begin(), manifests.end(),
                                              [&](const auto &other) { return other.name == m.name; });
            if (!shadowed) manifests.push_back(std::move(m));
        } catch (const Error &) {
            // Unreadable manifests are the runtime report's business (backplane devices).
        }
    }
    return manifests;
}

PluginManifestInfo findPluginManifest(const Config &config, const std::string &name) {
    std::string found;
    for (const auto &file : detail::findManifests(detail::pluginSearchPath(config))) {
        try {
            detail::PluginManifest m = detail::readManifest(file);
            if (m.name == name) return toInfo(std::move(m));
            found += (found.empty() ? "" : ", ") + m.name;
        } catch (const Error &) {
            // Unreadable manifests are the runtime report's business (backplane devices).
        }
    }
    throw Error(ErrorCode::NotFound,
                "no plugin called '" + name + "' on the plugin search path (found: " +
                    (found.empty() ? std::string("none") : found) +
                    "); pass its manifest file instead, or add its directory to "
                    "BACKPLANE_PLUGIN_PATH");
}

RawPlugin RawPlugin::open(const PluginManifestInfo &manifest, const RawPluginOptions &options) {
    auto state = std::make_shared<State>();
    state->manifest = manifest;
    state->library = detail::PluginLibrary::open(
        manifest.library, manifest.name,
        {.cacheDir = options.cacheDir.string(), .optionsJson = options.optionsJson});
    state->version = state->library->version();
    return RawPlugin(std::move(state));
}

const bp_plugin_api &RawPlugin::api() const noexcept { return state_->library->api(); }
bp_plugin *RawPlugin::instance() const noexcept { return state_->library->instance(); }
const PluginManifestInfo &RawPlugin::manifest() const noexcept { return state_->manifest; }
const std::string &RawPlugin::version() const noexcept { return state_->version; }

bp_error makeError() noexcept { return detail::makeError(); }

std::string errorMessage(const bp_error &error) { return detail::errorText(error); }

std::string fieldText(const char *text, size_t capacity) {
    return detail::fieldText(text, capacity);
}

const char *toString(bp_status status) noexcept {
    switch (static_cast<int>(status)) {
    case BP_SUCCESS: return "success";
    case BP_ERROR_INVALID_ARGUMENT: return "invalid_argument";
    case BP_ERROR_UNSUPPORTED: return "unsupported";
    case BP_ERROR_OUT_OF_MEMORY: return "out_of_memory";
    case BP_ERROR_NOT_FOUND: return "not_found";
    case BP_ERROR_NO_DRIVER: return "no_driver";
    case BP_ERROR_NO_DEVICE: return "no_device";
    case BP_ERROR_DEVICE_LOST: return "device_lost";
    case BP_ERROR_COMPILE: return "compile";
    case BP_ERROR_LAUNCH: return "launch";
    case BP_ERROR_TIMEOUT: return "timeout";
    case BP_ERROR_NOT_READY: return "not_ready";
    case BP_ERROR_INTERNAL: return "internal";
    case BP_ERROR_REMOTE: return "remote";
    default: return "unknown";
    }
}

void throwIfFailed(bp_status status, const bp_error &error, const std::string &plugin,
                   const std::string &what) {
    if (status != BP_SUCCESS) detail::throwStatus(status, error, plugin, what);
}

} // namespace backplane
