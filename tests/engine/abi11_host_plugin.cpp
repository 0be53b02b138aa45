// Test fixture: the host plugin presented as an ABI 1.1 plugin (its table copied, abi_minor 1),
// for the core's handling of host kernels with data on a plugin older than ABI 1.2.
#include <backplane/abi/plugin.h>

#include <dlfcn.h>

extern "C" BP_PLUGIN_EXPORT const bp_plugin_api *bp_get_plugin_api(void) {
    // A NULL table is reported by the loader as "no usable function table".
    static const bp_plugin_api *const api = []() -> const bp_plugin_api * {
        void *library = dlopen(HOST_PLUGIN_PATH, RTLD_NOW | RTLD_LOCAL);
        if (library == nullptr) return nullptr;
        auto entry = reinterpret_cast<bp_get_plugin_api_fn>(dlsym(library, BP_PLUGIN_ENTRY_SYMBOL));
        if (entry == nullptr || entry() == nullptr) return nullptr;
        static bp_plugin_api table = *entry();
        table.abi_minor = 1;
        return &table;
    }();
    return api;
}
