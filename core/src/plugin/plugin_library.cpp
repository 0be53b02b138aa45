// Loading a plugin library: dlopen through Boost.DLL, entry symbol, ABI check, init.
#include "plugin_library.hpp"

#include "input/elf_check.hpp"
#include "plugin/device_info.hpp"

#include <backplane/abi/caller.hpp>
#include <backplane/log.hpp>

#include <cxxabi.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <system_error>
#include <typeinfo>

namespace backplane::detail {
namespace {

/// The log sink plugins call: C code on the other side, so nothing may escape it.
void logFromPlugin(void *user, bp_log_level level, const char *message) noexcept {
    try {
        const auto *name = static_cast<const std::string *>(user);
        const auto l = static_cast<log::Level>(level <= BP_LOG_ERROR ? level : BP_LOG_ERROR);
        if (log::enabled(log::Subsystem::Plugin, l))
            log::write(log::Subsystem::Plugin, l,
                       *name + ": " + (message ? fieldText(message, 4096) : ""));
    } catch (...) { // NOLINT(bugprone-empty-catch): a lost log line is all that can go wrong
    }
}

// Boost.DLL appends "(dlerror system message: ...)"; the dynamic loader's text is what helps.
std::string loaderMessage(const std::system_error &e) {
    const std::string what = e.what();
    const std::string marker = "dlerror system message: ";
    const size_t at = what.find(marker);
    if (at == std::string::npos) return what;
    // "...(dlerror system message: TEXT): Bad file descriptor": keep TEXT only.
    std::string text = what.substr(at + marker.size());
    if (const size_t end = text.rfind("): "); end != std::string::npos) text.resize(end);
    else if (!text.empty() && text.back() == ')') text.pop_back();
    return text;
}

std::string demangled(const char *name) {
    int status = 0;
    char *text = ::abi::__cxa_demangle(name, nullptr, nullptr, &status);
    std::string out = status == 0 && text != nullptr ? text : name;
    std::free(text);
    return out;
}

/// A string the plugin's table points at (plugin_name, plugin_version): at most 256 bytes.
std::string tableString(const char *text) { return text ? fieldText(text, 256) : std::string(); }

/// The most of a plugin's options schema that is read (docs/plugin-abi.md).
constexpr size_t kMaxOptionsSchemaBytes = 64 * 1024;

} // namespace

std::string fieldText(const char *text, size_t capacity) { return abi::fieldText(text, capacity); }

std::string errorText(const bp_error &error) { return abi::errorText(error); }

bp_status containedException(const char *function, bp_error &error) noexcept {
    std::string text;
    try {
        throw;
    } catch (const std::exception &e) {
        try {
            text = std::string(function) + " threw " + demangled(typeid(e).name()) + ": " +
                   fieldText(e.what(), 4096) + " (a plugin must return a status, never throw)";
        } catch (...) { // NOLINT(bugprone-empty-catch): out of memory while describing it
        }
    } catch (...) {
        try {
            text = std::string(function) +
                   " threw an exception that is not a std::exception (a plugin must return a "
                   "status, never throw)";
        } catch (...) { // NOLINT(bugprone-empty-catch): as above
        }
    }
    const size_t n = std::min(text.size(), sizeof(error.message) - 1);
    std::memcpy(error.message, text.data(), n);
    error.message[n] = '\0';
    error.vendor_code = 0;
    return BP_ERROR_INTERNAL;
}

void logContainedRelease(const std::string &plugin, const char *function) noexcept {
    bp_error error = makeError();
    containedException(function, error);
    try {
        log::write(log::Subsystem::Plugin, log::Level::Error,
                   plugin + ": " + errorText(error) + "; ignored");
    } catch (...) { // NOLINT(bugprone-empty-catch): logging failed; nothing else to do
    }
}

void throwStatus(bp_status status, const bp_error &error, const std::string &backend,
                 const std::string &what) {
    abi::throwStatus(status, &error, what, backend);
}

std::shared_ptr<PluginLibrary> PluginLibrary::open(const std::filesystem::path &libraryPath,
                                                   const std::string &expectedName,
                                                   const PluginInitOptions &options,
                                                   const std::function<void(const char *)> &onStage) {
    std::shared_ptr<PluginLibrary> plugin(new PluginLibrary());
    plugin->path_ = libraryPath;
    const std::string file = libraryPath.string();
    // dlopen maps the file: a truncated one ends in SIGBUS, a foreign one in a misleading
    // "No such file or directory". Read the headers first and say what is wrong in words.
    if (const auto problem = libraryFileProblem(libraryPath))
        throw PluginLoadError(LoadFailure::LibraryLoad, "cannot load " + file + ": " + *problem);
    if (onStage) onStage("loading");
    try {
        plugin->library_.load(libraryPath, boost::dll::load_mode::rtld_now |
                                               boost::dll::load_mode::rtld_local);
    } catch (const std::system_error &e) {
        throw PluginLoadError(LoadFailure::LibraryLoad,
                              "cannot load " + file + ": " + loaderMessage(e));
    }
    if (!plugin->library_.has(BP_PLUGIN_ENTRY_SYMBOL))
        throw PluginLoadError(LoadFailure::EntryMissing,
                              file + " does not export the entry symbol '" BP_PLUGIN_ENTRY_SYMBOL
                              "': it is not a backplane plugin, or was built without "
                              "BACKPLANE_PLUGIN()");
    const auto entry = plugin->library_.get<const bp_plugin_api *()>(BP_PLUGIN_ENTRY_SYMBOL);
    const bp_plugin_api *api = nullptr;
    bp_error entryError = makeError();
    if (callContained(BP_PLUGIN_ENTRY_SYMBOL, entryError, [&] {
            api = entry();
            return BP_SUCCESS;
        }) != BP_SUCCESS)
        throw PluginLoadError(LoadFailure::InvalidTable, file + ": " + errorText(entryError));
    constexpr size_t kMinimumTable = offsetof(bp_plugin_api, native_handle) + sizeof(void *);
    if (api == nullptr || api->struct_size < offsetof(bp_plugin_api, plugin_version) + sizeof(void *))
        throw PluginLoadError(LoadFailure::InvalidTable,
                              file + ": the entry symbol returned no usable function table");
    // struct_size and the ABI version lead every table; the rest is laid out by ABI major.
    TableIdentity identity{api->abi_major, api->abi_minor, {}, {}};
    if (api->abi_major != BP_ABI_VERSION_MAJOR)
        throw PluginLoadError(
            LoadFailure::AbiMismatch,
            file + " was built for plugin ABI " + std::to_string(api->abi_major) + "." +
                std::to_string(api->abi_minor) + " but this backplane speaks ABI " +
                std::to_string(BP_ABI_VERSION_MAJOR) + "." + std::to_string(BP_ABI_VERSION_MINOR) +
                "; rebuild the plugin against this backplane's headers",
            identity);
    identity.version = tableString(api->plugin_version); // inside struct_size: checked above
    if (api->abi_minor >= 5 &&
        api->struct_size >= offsetof(bp_plugin_api, options_schema) + sizeof(const char *) &&
        api->options_schema != nullptr)
        identity.optionsSchema = fieldText(api->options_schema, kMaxOptionsSchemaBytes);
    if (api->struct_size < kMinimumTable || api->plugin_init == nullptr ||
        api->plugin_destroy == nullptr || api->probe == nullptr || api->device_info == nullptr)
        throw PluginLoadError(LoadFailure::InvalidTable,
                              file + ": function table of " + std::to_string(api->struct_size) +
                                  " bytes is smaller than ABI 1.0's " +
                                  std::to_string(kMinimumTable) + " or lacks required functions",
                              identity);
    plugin->api_ = api;
    plugin->name_ = tableString(api->plugin_name);
    plugin->version_ = identity.version;
    plugin->optionsSchema_ = identity.optionsSchema;
    if (!expectedName.empty() && plugin->name_ != expectedName)
        throw PluginLoadError(LoadFailure::InvalidTable,
                              file + " calls itself '" + plugin->name_ +
                                  "' but its manifest says '" + expectedName + "'",
                              identity);

    bp_plugin_init_args args{};
    args.struct_size = sizeof(args);
    args.host_abi_major = BP_ABI_VERSION_MAJOR;
    args.host_abi_minor = BP_ABI_VERSION_MINOR;
    args.log = &logFromPlugin;
    args.log_user = &plugin->name_;
    args.cache_dir = options.cacheDir.empty() ? nullptr : options.cacheDir.c_str();
    args.options_json = options.optionsJson.c_str();
    bp_error error = makeError();
    if (onStage) onStage("plugin_init");
    const bp_status status = callContained("plugin_init", error, [&] {
        return api->plugin_init(&args, &plugin->instance_, &error);
    });
    if (status != BP_SUCCESS) {
        plugin->instance_ = nullptr;
        throw PluginLoadError(LoadFailure::InitFailed,
                              file + ": plugin_init failed: " + errorText(error), identity);
    }
    log::write(log::Subsystem::Loader, log::Level::Debug,
               "loaded " + plugin->name_ + " " + plugin->version_ + " from " + file);
    return plugin;
}

PluginLibrary::~PluginLibrary() {
    if (instance_ != nullptr)
        releaseContained(name_, "plugin_destroy", [&] { api_->plugin_destroy(instance_); });
    // library_ unloads after this body, once the plugin's threads are joined by plugin_destroy.
}

bp_probe_result PluginLibrary::probe() const {
    bp_probe_result result{};
    result.struct_size = sizeof(result);
    bp_error error = makeError();
    const bp_status status =
        callContained("probe", error, [&] { return api_->probe(instance_, &result, &error); });
    if (status != BP_SUCCESS) throwStatus(status, error, name_, name_ + " probe failed");
    if (result.device_count > kMaxDevicesPerPlugin)
        throw Error(ErrorCode::Internal,
                    name_ + " probe reports " + std::to_string(result.device_count) +
                        " devices, more than the " + std::to_string(kMaxDevicesPerPlugin) +
                        " a plugin may report; the plugin is broken (none of its devices is used)",
                    name_);
    return result;
}

void PluginLibrary::markProbed(uint32_t deviceCount) {
    const std::lock_guard lock(probeMutex_);
    probed_ = true;
    probedCount_ = deviceCount;
}

void PluginLibrary::expectProbe(uint32_t deviceCount, std::string driverVersion,
                                std::function<void(const std::string &)> onStale,
                                std::function<void(bool)> probing) {
    const std::lock_guard lock(probeMutex_);
    expectedCount_ = deviceCount;
    expectedDriver_ = std::move(driverVersion);
    onStale_ = std::move(onStale);
    probing_ = std::move(probing);
}

void PluginLibrary::ensureProbed(const DeviceInfo &expected) {
    const std::lock_guard lock(probeMutex_);
    const auto stale = [&](const std::string &why) {
        if (onStale_) onStale_(why);
        onStale_ = nullptr; // once is enough
    };
    if (!probed_) {
        probed_ = true;
        if (probing_) probing_(true);
        try {
            const bp_probe_result result = probe();
            probedCount_ = result.device_count;
            const std::string driver =
                fieldText(result.driver_version, sizeof(result.driver_version));
            if (expectedCount_ && (*expectedCount_ != probedCount_ || expectedDriver_ != driver))
                stale("it now reports " + std::to_string(probedCount_) + " device(s), driver '" +
                      driver + "'; the listed answer said " + std::to_string(*expectedCount_) +
                      ", '" + expectedDriver_ + "'");
        } catch (const Error &e) {
            probeFailure_ = e;
            stale(e.what());
        }
        if (probing_) probing_(false);
    }
    if (probeFailure_) throw *probeFailure_;
    if (expected.index >= probedCount_)
        throw Error(ErrorCode::NotFound,
                    "cannot open " + expected.id() + ": " + name_ + " now reports " +
                        std::to_string(probedCount_) +
                        " device(s); the devices changed since they were listed. Create a new "
                        "Runtime to list them again",
                    name_);
    if (!expectedCount_) return; // listed by this process's own probe: nothing to compare
    const DeviceInfo now = toDeviceInfo(name_, expected.index, deviceInfo(expected.index));
    const bool same = expected.hasUuid && now.hasUuid ? expected.uuid == now.uuid
                                                      : expected.name == now.name;
    if (!same) {
        stale("device " + std::to_string(expected.index) + " is now " + now.name + " " +
              now.uuidString());
        throw Error(ErrorCode::NotFound,
                    "cannot open " + expected.id() + " (" + expected.name + " " +
                        expected.uuidString() + "): that index is now " + now.name + " " +
                        now.uuidString() +
                        "; the devices changed since they were listed. Create a new Runtime to "
                        "list them again",
                    name_);
    }
}

bp_device_info PluginLibrary::deviceInfo(uint32_t index) const {
    bp_device_info info{};
    info.struct_size = sizeof(info);
    bp_error error = makeError();
    const bp_status status = callContained("device_info", error, [&] {
        return api_->device_info(instance_, index, &info, &error);
    });
    if (status != BP_SUCCESS)
        throwStatus(status, error, name_,
                    name_ + " device_info(" + std::to_string(index) + ") failed");
    // An older plugin fills fewer fields; the rest stay zero, which the core treats as unknown.
    // One that did not write struct_size back (no SDK) still filled none of the fields its ABI
    // minor lacks: toDeviceInfo gives it the defaults of its version.
    if (abiMinor() < 4) info.struct_size = std::min(info.struct_size, kDeviceInfoSize13);
    // Bits defined after the plugin's ABI mean nothing from it (review finding: a 1.6 plugin's
    // stray bit 7 would have made its VkBuffer-like handles look like addresses).
    if (abiMinor() < 7) info.capabilities &= ~static_cast<uint32_t>(BP_CAPABILITY_ADDRESSABLE_MEMORY);
    return info;
}

} // namespace backplane::detail
