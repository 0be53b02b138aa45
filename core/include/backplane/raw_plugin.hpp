// backplane::RawPlugin: one plugin opened for direct calls into its C function table.
#pragma once

// The runtime (backplane/runtime.hpp) hides plugins behind devices, pools and streams. Tools that
// test or measure a plugin itself need its table: the conformance suite calls every function of
// it, raw-ABI benchmarks call them without the engine in between. RawPlugin opens a plugin with
// the runtime's own checks (manifest, ELF headers, entry symbol, ABI, table, plugin_init) and then
// hands out the table. What is called through it is the caller's responsibility: the ABI's rules
// (backplane/abi/plugin.h) apply as written, with no core in between to enforce them.

#include <backplane/abi/plugin.h>
#include <backplane/config.hpp>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

namespace backplane {

/// A plugin manifest as read from disk (docs/plugin-abi.md, "The manifest"); nothing is loaded.
struct PluginManifestInfo {
    std::filesystem::path file;    ///< the manifest itself
    std::string name;              ///< the plugin's name; equals its table's plugin_name
    std::filesystem::path library; ///< the library it names, resolved against file's directory
    uint32_t abiMajor = 0;         ///< "abi_version": "MAJOR.MINOR"
    uint32_t abiMinor = 0;
    std::string backend;           ///< backend kind ("cuda", "vulkan", "host"...)
    std::string description;
    /// "conformance": {"expected_failures": [...]}: names of conformance cases the plugin is
    /// known to fail (`backplane conformance` reports them as expected, not as passes).
    std::vector<std::string> expectedFailures;
};

/// Reads and checks one manifest file. Throws Error(PluginLoad) naming the file, the JSON
/// pointer and what is wrong.
PluginManifestInfo readPluginManifest(const std::filesystem::path &file);

/// Every readable manifest on config's search path, in search order, the first of each plugin
/// name only (as the runtime would load them); nothing is opened. Unreadable manifests are
/// skipped (`backplane devices` reports them).
std::vector<PluginManifestInfo> findPluginManifests(const Config &config);

/// The manifest of the plugin called `name` on config's search path (the first one, as the
/// runtime would load it), without opening any library. Unreadable manifests are skipped.
/// Throws Error(NotFound) listing the plugin names that were found.
PluginManifestInfo findPluginManifest(const Config &config, const std::string &name);

/// What plugin_init receives.
struct RawPluginOptions {
    std::string optionsJson = "{}";  ///< the plugin's options object, as JSON text
    std::filesystem::path cacheDir;  ///< "" passes no cache directory
};

/// An opened plugin: its library stays loaded and its instance initialised while any copy lives
/// (copies share it). The destructor calls plugin_destroy: every device opened through the
/// table must have been closed before the last copy goes. A moved-from RawPlugin may only be
/// assigned to or destroyed.
class RawPlugin {
public:
    /// Checks and loads `manifest.library`, checks the table (ABI major, size, required
    /// functions, name equal to the manifest's) and calls plugin_init. Throws Error(PluginLoad)
    /// with the loader's message, or the plugin_init status as Error.
    static RawPlugin open(const PluginManifestInfo &manifest, const RawPluginOptions &options = {});

    /// The plugin's function table (its own struct_size: test has() before calling a function
    /// that may lie past an older plugin's table).
    const bp_plugin_api &api() const noexcept;
    /// The instance plugin_init created.
    bp_plugin *instance() const noexcept;
    /// The manifest it was opened from.
    const PluginManifestInfo &manifest() const noexcept;
    /// The table's plugin_version, sanitised for display.
    const std::string &version() const noexcept;

    /// True when the table provides `member`: inside its struct_size and not NULL.
    template <class Member> bool has(Member bp_plugin_api::*member) const noexcept {
        const auto offset = reinterpret_cast<size_t>(
            &(static_cast<const bp_plugin_api *>(nullptr)->*member));
        return offset + sizeof(Member) <= api().struct_size && api().*member != nullptr;
    }

    struct State;

private:
    explicit RawPlugin(std::shared_ptr<State> state) : state_(std::move(state)) {}
    std::shared_ptr<State> state_;
};

/// A bp_error ready to pass to a plugin: zeroed, struct_size set.
bp_error makeError() noexcept;

/// The message a plugin wrote into `error`: cut at the field's capacity when it has no NUL,
/// bytes that are not printable UTF-8 replaced, so it is safe to print and to put in JSON.
std::string errorMessage(const bp_error &error);

/// A fixed-size text field a plugin filled (device name, version): cut at the first NUL or at
/// `capacity`, invalid UTF-8 and control characters replaced.
std::string fieldText(const char *text, size_t capacity);

/// Stable snake_case name of a status ("out_of_memory"); "unknown" for a value not in the ABI.
const char *toString(bp_status status) noexcept;

/// Throws the Error a failed status maps to (the runtime's mapping), with message
/// "<what>: <plugin's message>" and backend `plugin`. Does nothing for BP_SUCCESS.
void throwIfFailed(bp_status status, const bp_error &error, const std::string &plugin,
                   const std::string &what);

} // namespace backplane
