// Loading a plugin library: dlopen through Boost.DLL, entry symbol, ABI check, init.
#include "plugin_library.hpp"

#include <backplane/log.hpp>

#include <cstring>
#include <system_error>

namespace backplane::detail {
namespace {

ErrorCode toErrorCode(bp_status status) {
    switch (status) {
    case BP_ERROR_INVALID_ARGUMENT: return ErrorCode::InvalidArgument;
    case BP_ERROR_UNSUPPORTED: return ErrorCode::Unsupported;
    case BP_ERROR_OUT_OF_MEMORY: return ErrorCode::OutOfMemory;
    case BP_ERROR_NOT_FOUND: return ErrorCode::NotFound;
    case BP_ERROR_NO_DRIVER: return ErrorCode::NoDriver;
    case BP_ERROR_NO_DEVICE: return ErrorCode::NoDevice;
    case BP_ERROR_DEVICE_LOST: return ErrorCode::DeviceLost;
    case BP_ERROR_COMPILE: return ErrorCode::Compile;
    case BP_ERROR_LAUNCH: return ErrorCode::Launch;
    case BP_ERROR_TIMEOUT: return ErrorCode::Timeout;
    default: return ErrorCode::Internal;
    }
}

void logFromPlugin(void *user, bp_log_level level, const char *message) {
    const auto *name = static_cast<const std::string *>(user);
    const auto l = static_cast<log::Level>(level <= BP_LOG_ERROR ? level : BP_LOG_ERROR);
    if (log::enabled(log::Subsystem::Plugin, l))
        log::write(log::Subsystem::Plugin, l, *name + ": " + (message ? message : ""));
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

} // namespace

void throwStatus(bp_status status, const bp_error &error, const std::string &backend,
                 const std::string &what) {
    std::string message = what;
    if (error.message[0] != '\0') message += ": " + std::string(error.message);
    throw Error(toErrorCode(status), message, backend, error.vendor_code);
}

std::shared_ptr<PluginLibrary> PluginLibrary::open(const std::filesystem::path &libraryPath,
                                                   const std::string &expectedName,
                                                   const PluginInitOptions &options) {
    std::shared_ptr<PluginLibrary> plugin(new PluginLibrary());
    plugin->path_ = libraryPath;
    const std::string file = libraryPath.string();
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
    const bp_plugin_api *api = entry();
    constexpr size_t kMinimumTable = offsetof(bp_plugin_api, native_handle) + sizeof(void *);
    if (api == nullptr || api->struct_size < offsetof(bp_plugin_api, plugin_version) + sizeof(void *))
        throw PluginLoadError(LoadFailure::InvalidTable,
                              file + ": the entry symbol returned no usable function table");
    if (api->abi_major != BP_ABI_VERSION_MAJOR)
        throw PluginLoadError(
            LoadFailure::AbiMismatch,
            file + " was built for plugin ABI " + std::to_string(api->abi_major) + "." +
                std::to_string(api->abi_minor) + " but this backplane speaks ABI " +
                std::to_string(BP_ABI_VERSION_MAJOR) + "." + std::to_string(BP_ABI_VERSION_MINOR) +
                "; rebuild the plugin against this backplane's headers");
    if (api->struct_size < kMinimumTable || api->plugin_init == nullptr ||
        api->plugin_destroy == nullptr || api->probe == nullptr || api->device_info == nullptr)
        throw PluginLoadError(LoadFailure::InvalidTable,
                              file + ": function table of " + std::to_string(api->struct_size) +
                                  " bytes is smaller than ABI 1.0's " +
                                  std::to_string(kMinimumTable) + " or lacks required functions");
    plugin->api_ = api;
    plugin->name_ = api->plugin_name ? api->plugin_name : "";
    plugin->version_ = api->plugin_version ? api->plugin_version : "";
    if (!expectedName.empty() && plugin->name_ != expectedName)
        throw PluginLoadError(LoadFailure::InvalidTable,
                              file + " calls itself '" + plugin->name_ +
                                  "' but its manifest says '" + expectedName + "'");

    bp_plugin_init_args args{};
    args.struct_size = sizeof(args);
    args.host_abi_major = BP_ABI_VERSION_MAJOR;
    args.host_abi_minor = BP_ABI_VERSION_MINOR;
    args.log = &logFromPlugin;
    args.log_user = &plugin->name_;
    args.cache_dir = options.cacheDir.empty() ? nullptr : options.cacheDir.c_str();
    args.options_json = options.optionsJson.c_str();
    bp_error error = makeError();
    const bp_status status = api->plugin_init(&args, &plugin->instance_, &error);
    if (status != BP_SUCCESS) {
        plugin->instance_ = nullptr;
        throw PluginLoadError(LoadFailure::InitFailed,
                              file + ": plugin_init failed: " + std::string(error.message));
    }
    log::write(log::Subsystem::Loader, log::Level::Debug,
               "loaded " + plugin->name_ + " " + plugin->version_ + " from " + file);
    return plugin;
}

PluginLibrary::~PluginLibrary() {
    if (instance_ != nullptr) api_->plugin_destroy(instance_);
    // library_ unloads after this body, once the plugin's threads are joined by plugin_destroy.
}

bp_probe_result PluginLibrary::probe() const {
    bp_probe_result result{};
    result.struct_size = sizeof(result);
    bp_error error = makeError();
    const bp_status status = api_->probe(instance_, &result, &error);
    if (status != BP_SUCCESS) throwStatus(status, error, name_, name_ + " probe failed");
    return result;
}

bp_device_info PluginLibrary::deviceInfo(uint32_t index) const {
    bp_device_info info{};
    info.struct_size = sizeof(info);
    bp_error error = makeError();
    const bp_status status = api_->device_info(instance_, index, &info, &error);
    if (status != BP_SUCCESS)
        throwStatus(status, error, name_,
                    name_ + " device_info(" + std::to_string(index) + ") failed");
    // An older plugin fills fewer fields; the rest stay zero, which the core treats as unknown.
    return info;
}

} // namespace backplane::detail
