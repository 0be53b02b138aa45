// A loaded plugin library: Boost.DLL handle, checked function table, initialised instance.
#pragma once

#include <backplane/abi/plugin.h>
#include <backplane/device.hpp>
#include <backplane/error.hpp>

#include <boost/dll/shared_library.hpp>

#include <cstddef>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

namespace backplane::detail {

/// Why opening a plugin library failed; each maps to one state of the loader's report.
enum class LoadFailure {
    LibraryLoad,   ///< dlopen failed (missing file, missing dependency, not a library)
    EntryMissing,  ///< the library has no BP_PLUGIN_ENTRY_SYMBOL
    AbiMismatch,   ///< the table's ABI major differs from the core's
    InvalidTable,  ///< the table is too small for ABI 1.0 or misses required functions
    InitFailed,    ///< plugin_init returned an error (or threw through the SDK)
};

/// What a plugin's function table says about itself: reports show it once the library was
/// opened, even when loading failed after that.
struct TableIdentity {
    uint32_t abiMajor = 0; ///< 0: the table was not read
    uint32_t abiMinor = 0;
    /// plugin_version; "" when not read (a table of another ABI major has another layout)
    std::string version;
    /// (1.5) options_schema; "" when the table has none
    std::string optionsSchema;
};

/// Thrown by PluginLibrary::open; message names the file and what to do.
class PluginLoadError : public Error {
public:
    PluginLoadError(LoadFailure failure, const std::string &message, TableIdentity table = {})
        : Error(ErrorCode::PluginLoad, message), failure_(failure), table_(std::move(table)) {}
    LoadFailure failure() const noexcept { return failure_; }
    /// The table's ABI and version when the failure came after the table was read.
    const TableIdentity &table() const noexcept { return table_; }

private:
    LoadFailure failure_;
    TableIdentity table_;
};

/// Settings passed to plugin_init.
struct PluginInitOptions {
    std::string cacheDir;          ///< "" = no cache directory
    std::string optionsJson = "{}";
};

/// Converts a failed ABI status into backplane::Error (the one place that does it).
[[noreturn]] void throwStatus(bp_status status, const bp_error &error, const std::string &backend,
                              const std::string &what);

/// The most devices one plugin may report (docs/plugin-abi.md); a probe claiming more is
/// reported probe_failed instead of being enumerated.
inline constexpr uint32_t kMaxDevicesPerPlugin = 1024;

/// The message a plugin wrote into `error`, cut at the field's capacity when it has no NUL, with
/// bytes that are not printable UTF-8 replaced, so it is safe to show and to put in JSON.
std::string errorText(const bp_error &error);

/// A fixed-size string field a plugin filled (device name, driver version): cut at the first
/// NUL or at `capacity`, invalid UTF-8 and control characters replaced by '?'.
std::string fieldText(const char *text, size_t capacity);

/// Writes what escaped plugin function `function` into `error` and returns BP_ERROR_INTERNAL;
/// call from a catch block only (it rethrows the current exception to name it).
bp_status containedException(const char *function, bp_error &error) noexcept;

/// Calls a plugin entry point: `call()` returns its status. The ABI forbids exceptions, but a
/// plugin built without the SDK can still throw; anything it throws, of any type, becomes
/// BP_ERROR_INTERNAL with a message naming `function` and the exception.
template <class Call> bp_status callContained(const char *function, bp_error &error, Call &&call) noexcept {
    try {
        return call();
    } catch (...) {
        return containedException(function, error);
    }
}

/// Calls a plugin function that cannot report failure (releases, destroy): anything it throws is
/// logged with `plugin` and `function` and otherwise ignored.
void logContainedRelease(const std::string &plugin, const char *function) noexcept;
template <class Call>
void releaseContained(const std::string &plugin, const char *function, Call &&call) noexcept {
    try {
        call();
    } catch (...) {
        logContainedRelease(plugin, function);
    }
}

/// A freshly made bp_error, ready to pass to a plugin.
inline bp_error makeError() {
    bp_error e{};
    e.struct_size = sizeof(bp_error);
    return e;
}

/// One loaded plugin. Shared: everything created from the plugin (devices, memory, kernels)
/// holds a shared_ptr to it, so the library stays mapped while any of its objects lives
/// (Boost.DLL's rule). Destruction calls plugin_destroy, then unloads.
class PluginLibrary {
public:
    /// Loads `libraryPath`, imports the entry symbol, checks the ABI and calls plugin_init.
    /// Throws PluginLoadError. `expectedName` (the manifest's) must equal the table's name.
    /// `onStage`, when given, is told "loading" before dlopen and "plugin_init" before init
    /// (backplane-probe reports the stage a crash happened in).
    static std::shared_ptr<PluginLibrary> open(const std::filesystem::path &libraryPath,
                                               const std::string &expectedName,
                                               const PluginInitOptions &options,
                                               const std::function<void(const char *)> &onStage = {});
    ~PluginLibrary();
    PluginLibrary(const PluginLibrary &) = delete;
    PluginLibrary &operator=(const PluginLibrary &) = delete;

    const bp_plugin_api &api() const noexcept { return *api_; }
    bp_plugin *instance() const noexcept { return instance_; }
    const std::string &name() const noexcept { return name_; }
    const std::string &version() const noexcept { return version_; }
    /// The table's options schema (ABI 1.5), "" when it publishes none.
    const std::string &optionsSchema() const noexcept { return optionsSchema_; }
    uint32_t abiMinor() const noexcept { return api_->abi_minor; }
    const std::filesystem::path &path() const noexcept { return path_; }

    /// True when the plugin's table has function `member` (inside its struct_size, non-null).
    template <class Member> bool has(Member bp_plugin_api::*member) const noexcept {
        const auto offset = reinterpret_cast<size_t>(
            &(static_cast<const bp_plugin_api *>(nullptr)->*member));
        return offset + sizeof(Member) <= api_->struct_size && api_->*member != nullptr;
    }

    /// Runs the cheap probe. Throws Error (NoDriver, NoDevice...) with the plugin's message.
    bp_probe_result probe() const;
    /// Describes one device; no context is created.
    bp_device_info deviceInfo(uint32_t index) const;

    /// Records that probe() ran in this process (the in-process probe at start) and found
    /// `deviceCount` devices.
    void markProbed(uint32_t deviceCount);
    /// Sets what an isolated probe answered (device count, driver version), for ensureProbed to
    /// check; `onStale(why)` is called when the plugin in this process disagrees (the loader
    /// drops the cached answer then).
    /// `probing(true)` / `probing(false)` bracket that in-process probe (the loader leaves a
    /// marker meanwhile, so a crash there is noticed by the next start).
    void expectProbe(uint32_t deviceCount, std::string driverVersion,
                     std::function<void(const std::string &)> onStale,
                     std::function<void(bool)> probing = {});
    /// Before device_open of `expected`: runs probe() in this process if it has not run yet (the
    /// loader takes an isolated probe's answer instead; the ABI's order, probe before
    /// device_open, is kept), then checks that `expected.index` is still below the device count
    /// and that device_info of it still describes the same device (UUID, else name). Throws
    /// Error naming what changed; a probe failure is remembered and thrown again. Thread-safe.
    void ensureProbed(const DeviceInfo &expected);

private:
    PluginLibrary() = default;

    boost::dll::shared_library library_;
    const bp_plugin_api *api_ = nullptr;
    bp_plugin *instance_ = nullptr;
    std::string name_;
    std::string version_;
    std::string optionsSchema_;
    std::filesystem::path path_;
    std::mutex probeMutex_;
    bool probed_ = false;
    uint32_t probedCount_ = 0;
    std::optional<Error> probeFailure_;
    std::optional<uint32_t> expectedCount_;
    std::string expectedDriver_;
    std::function<void(const std::string &)> onStale_;
    std::function<void(bool)> probing_;
};

} // namespace backplane::detail
