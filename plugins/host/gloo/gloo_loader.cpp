// Opening the host plugin's Gloo module: where it is, and what to say when it cannot be used.
#include "gloo_loader.hpp"

#include <backplane/abi/plugin_sdk.hpp>

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

namespace backplane::host {
namespace {

constexpr const char *kEnvironment = "BACKPLANE_GLOO_MODULE";

/// What a user does about a missing module or libgloo: short, since bp_device_info::collectives
/// holds 255 characters; errors add kOtherModuleHint.
constexpr const char *kInstallHint =
    "collectives need libgloo0 (apt install libgloo0) and this module (built with libgloo-dev)";
constexpr const char *kOtherModuleHint =
    "; BACKPLANE_GLOO_MODULE or the option collectives.module name another module file";

/// The directory of the library this function is in (the host plugin), with a trailing '/'; ""
/// when the loader cannot say.
std::string ownDirectory() {
    Dl_info info{};
    if (::dladdr(reinterpret_cast<const void *>(&ownDirectory), &info) == 0 ||
        info.dli_fname == nullptr)
        return "";
    const std::string file = info.dli_fname;
    const size_t slash = file.rfind('/');
    return slash == std::string::npos ? "" : file.substr(0, slash + 1);
}

} // namespace

GlooLoader::GlooLoader(std::string configured) {
    const char *environment = std::getenv(kEnvironment);
    if (environment != nullptr && *environment != '\0') {
        path_ = environment;
        source_ = std::string(" (from ") + kEnvironment + ")";
    } else if (!configured.empty()) {
        path_ = std::move(configured);
        source_ = " (from plugins.options.host.collectives.module)";
    } else {
        path_ = ownDirectory() + BP_HOST_GLOO_MODULE_FILE;
    }
}

const bp_host_gloo_api *GlooLoader::api() {
    std::call_once(once_, [this] { load(); });
    return api_;
}

const std::string &GlooLoader::status() {
    api();
    return status_;
}

const bp_host_gloo_api &GlooLoader::require(const std::string &operation) {
    if (const bp_host_gloo_api *loaded = api()) return *loaded;
    throw sdk::Error(BP_ERROR_UNSUPPORTED,
                     operation + ": no collectives: " + status_ + kOtherModuleHint);
}

void GlooLoader::load() {
#ifndef BACKPLANE_HOST_GLOO_MODULE_BUILT
    if (source_.empty()) {
        status_ = std::string("this host plugin was built without Gloo (no libgloo-dev); ") +
                  kInstallHint;
        return;
    }
#endif
    if (::access(path_.c_str(), R_OK) != 0) {
        status_ = "the Gloo module " + path_ + source_ + " is missing; " + kInstallHint;
        return;
    }
    // Local symbols: Gloo's (and the module's) resolve against nothing else in the process.
    void *handle = ::dlopen(path_.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
        const char *why = ::dlerror();
        status_ = "the Gloo module " + path_ + source_ +
                  " cannot be loaded: " + (why != nullptr ? why : "unknown loader error") + "; " +
                  kInstallHint;
        return;
    }
    auto entry =
        reinterpret_cast<bp_host_gloo_entry_fn>(::dlsym(handle, BP_HOST_GLOO_MODULE_ENTRY));
    const bp_host_gloo_api *api = entry != nullptr ? entry(BP_HOST_GLOO_MODULE_VERSION) : nullptr;
    if (api == nullptr || api->struct_size < sizeof(bp_host_gloo_api) ||
        api->version != BP_HOST_GLOO_MODULE_VERSION) {
        ::dlclose(handle);
        status_ = path_ + source_ + " is not a Gloo module of this host plugin (" +
                  (entry == nullptr ? std::string("no entry ") + BP_HOST_GLOO_MODULE_ENTRY
                                    : std::string("another interface version")) +
                  "); reinstall backplane so that the plugin and its module match";
        return;
    }
    api_ = api;
    status_ = api->engine != nullptr ? api->engine : "gloo";
}

} // namespace backplane::host
