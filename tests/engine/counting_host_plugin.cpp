// Test fixture: the host plugin with its host registrations counted (memory_register and the
// memory_free of a registered page), and memory_register switchable off, for the core's handling
// of registered memory (tests/engine/transfer_test.cpp reads the count through dlsym).
#include <backplane/abi/plugin.h>

#include <dlfcn.h>

#include <atomic>
#include <mutex>
#include <set>

namespace {

const bp_plugin_api *host = nullptr;
bp_plugin_api table{};
std::atomic<int> live{0};
std::mutex registeredMutex;
std::set<bp_memory *> registered;

bp_status countedRegister(bp_device *device, const bp_memory_register_args *args, bp_memory **out,
                          bp_error *error) {
    const bp_status status = host->memory_register(device, args, out, error);
    if (status == BP_SUCCESS) {
        std::lock_guard lock(registeredMutex);
        registered.insert(*out);
        ++live;
    }
    return status;
}

void countedFree(bp_device *device, bp_memory *memory) {
    {
        std::lock_guard lock(registeredMutex);
        if (registered.erase(memory) != 0) --live;
    }
    host->memory_free(device, memory);
}

} // namespace

extern "C" BP_PLUGIN_EXPORT const bp_plugin_api *bp_get_plugin_api(void) {
    // A NULL table is reported by the loader as "no usable function table".
    static const bp_plugin_api *const api = []() -> const bp_plugin_api * {
        void *library = dlopen(HOST_PLUGIN_PATH, RTLD_NOW | RTLD_LOCAL);
        if (library == nullptr) return nullptr;
        auto entry = reinterpret_cast<bp_get_plugin_api_fn>(dlsym(library, BP_PLUGIN_ENTRY_SYMBOL));
        if (entry == nullptr || entry() == nullptr) return nullptr;
        host = entry();
        table = *host;
        table.memory_register = &countedRegister;
        table.memory_free = &countedFree;
        return &table;
    }();
    return api;
}

/// Registered pages not freed yet.
extern "C" BP_PLUGIN_EXPORT int bp_test_live_registrations(void) { return live.load(); }

/// 0: the table has no memory_register (as a plugin of ABI 1.2); otherwise the counted one.
extern "C" BP_PLUGIN_EXPORT void bp_test_offer_registration(int offer) {
    table.memory_register = offer != 0 ? &countedRegister : nullptr;
}
