// dlopen of the vendor libraries into function tables, and the one vendor-error translation.
#include "gpu_library.hpp"

#include <dlfcn.h>

#include <iterator>

#include <string>

namespace backplane::gpu {
namespace {

#define BPV_STRINGIFY_EXPANDED(x) BPV_STRINGIFY(x)
#define BPV_STRINGIFY(x) #x

/// A table and why it could not be loaded ("" when it was).
template <class Table> struct Loaded {
    Table table{};
    std::string error;
};

// Opens the first candidate that loads; the loader's messages of the others explain a failure.
void *openFirst(const char *const *names, size_t count, std::string &tried, std::string &failures) {
    for (size_t i = 0; i < count; ++i) {
        if (void *handle = ::dlopen(names[i], RTLD_NOW | RTLD_LOCAL)) {
            tried = names[i];
            return handle;
        }
        const char *why = ::dlerror();
        if (!failures.empty()) failures += "; ";
        failures += std::string(names[i]) + " not found: " + (why ? why : "unknown loader error");
    }
    return nullptr;
}

template <class Symbol>
bool resolve(void *handle, const char *name, Symbol &out, const std::string &library,
             std::string &error) {
    out = reinterpret_cast<Symbol>(::dlsym(handle, name));
    if (out != nullptr) return true;
    if (error.empty())
        error = library + " has no " + name + ": the installed version is too old for this plugin";
    return false;
}

Loaded<bpv::Driver> loadDriver() {
    Loaded<bpv::Driver> loaded;
    std::string library;
    std::string failures;
    void *handle = openFirst(bpv::kDriverLibraries, std::size(bpv::kDriverLibraries), library,
                             failures);
    if (handle == nullptr) {
        loaded.error = std::string("no ") + bpv::kDriverDescription + " (" + failures + ")";
        return loaded;
    }
    auto &t = loaded.table;
#define BPV_RESOLVE(symbol)                                                                        \
    resolve(handle, BPV_STRINGIFY_EXPANDED(symbol), t.symbol, library, loaded.error);
#define BPV_RESOLVE_TYPED(symbol, type) BPV_RESOLVE(symbol)
    BPV_DRIVER_FUNCTIONS(BPV_RESOLVE, BPV_RESOLVE_TYPED)
#undef BPV_RESOLVE_TYPED
#undef BPV_RESOLVE
    // Newer drivers' symbols: absent ones stay NULL, the wrappers using them check.
#define BPV_RESOLVE_OPTIONAL(symbol)                                                               \
    t.symbol =                                                                                     \
        reinterpret_cast<decltype(t.symbol)>(::dlsym(handle, BPV_STRINGIFY_EXPANDED(symbol)));
    BPV_OPTIONAL_DRIVER_FUNCTIONS(BPV_RESOLVE_OPTIONAL)
#undef BPV_RESOLVE_OPTIONAL
    if (!loaded.error.empty()) loaded.error = std::string("unusable ") + bpv::kDriverDescription +
                                             ": " + loaded.error;
    return loaded;
}

Loaded<bpv::Rtc> loadRtc() {
    Loaded<bpv::Rtc> loaded;
    std::string library;
    std::string failures;
    void *handle =
        openFirst(bpv::kRtcLibraries, std::size(bpv::kRtcLibraries), library, failures);
    if (handle == nullptr) {
        loaded.error = std::string(bpv::kRtcName) + " not found, kernels cannot be compiled (" +
                       failures + ")";
        return loaded;
    }
    auto &t = loaded.table;
#define BPV_RESOLVE(symbol)                                                                        \
    resolve(handle, BPV_STRINGIFY_EXPANDED(symbol), t.symbol, library, loaded.error);
    BPV_RTC_FUNCTIONS(BPV_RESOLVE)
#undef BPV_RESOLVE
    if (!loaded.error.empty())
        loaded.error = std::string("unusable ") + bpv::kRtcName + ": " + loaded.error;
    return loaded;
}

} // namespace

const bpv::Driver &driver() {
    static const Loaded<bpv::Driver> loaded = loadDriver();
    if (!loaded.error.empty()) throw sdk::Error(BP_ERROR_NO_DRIVER, loaded.error);
    return loaded.table;
}

const bpv::Rtc &rtc() {
    static const Loaded<bpv::Rtc> loaded = loadRtc();
    if (!loaded.error.empty()) throw sdk::Error(BP_ERROR_NO_DRIVER, loaded.error);
    return loaded.table;
}

sdk::Error toError(const bpv::Driver &d, const bpv::Call &call, bp_status fallback) {
    const bpv::Result r = call.result;
    std::string message = std::string(call.name) + " failed: " + bpv::errorName(d, r) + " (" +
                          bpv::errorString(d, r) + ")";
    bp_status code = fallback;
    if (bpv::isOutOfMemory(r)) {
        code = BP_ERROR_OUT_OF_MEMORY;
        message += "; free device memory or allocate less";
    } else if (bpv::isSticky(r)) {
        code = BP_ERROR_DEVICE_LOST;
        message += "; a kernel faulted or trapped, and the driver keeps this device unusable "
                   "for the rest of this process (no reset or new context recovers it): restart "
                   "the process (other devices keep working), and find the fault with "
                   "compute-sanitizer";
    } else if (bpv::isNoDevice(r)) {
        code = BP_ERROR_NO_DEVICE;
    } else if (r == bpv::kNotFound) {
        code = BP_ERROR_NOT_FOUND;
    } else if (fallback == BP_ERROR_LAUNCH && !bpv::isLaunchError(r)) {
        code = BP_ERROR_INTERNAL;
    }
    return sdk::Error(code, message, static_cast<int64_t>(r));
}

} // namespace backplane::gpu
