// A stand-in for a profiler's NVTX injection library (what `nsys profile` puts in
// NVTX_INJECTION64_PATH): it records every range pushed and popped, for tests/cuda/nvtx_test.cpp
// to read back with dlsym.
#include <nvtx3/nvToolsExt.h>

#include <cstddef>
#include <mutex>
#include <string>
#include <vector>

namespace {

std::mutex mutex;
std::vector<std::string> events; // "push NAME" and "pop"

int pushA(const char *message) {
    std::lock_guard lock(mutex);
    events.push_back(std::string("push ") + (message != nullptr ? message : "(null)"));
    return static_cast<int>(events.size());
}

int pop() {
    std::lock_guard lock(mutex);
    events.emplace_back("pop");
    return 0;
}

} // namespace

extern "C" __attribute__((visibility("default"))) int
InitializeInjectionNvtx2(NvtxGetExportTableFunc_t getExportTable) {
    const auto *callbacks =
        static_cast<const NvtxExportTableCallbacks *>(getExportTable(NVTX_ETID_CALLBACKS));
    if (callbacks == nullptr || callbacks->GetModuleFunctionTable == nullptr) return 0;
    NvtxFunctionTable table = nullptr;
    unsigned int size = 0;
    if (callbacks->GetModuleFunctionTable(NVTX_CB_MODULE_CORE, &table, &size) == 0 ||
        table == nullptr || size <= NVTX_CBID_CORE_RangePop)
        return 0;
    *table[NVTX_CBID_CORE_RangePushA] = reinterpret_cast<NvtxFunctionPointer>(&pushA);
    *table[NVTX_CBID_CORE_RangePop] = reinterpret_cast<NvtxFunctionPointer>(&pop);
    return 1;
}

/// The events recorded so far, one per line.
extern "C" __attribute__((visibility("default"))) size_t bp_test_nvtx_events(char *out,
                                                                             size_t capacity) {
    std::lock_guard lock(mutex);
    std::string all;
    for (const std::string &e : events) all += e + "\n";
    if (out != nullptr && capacity > 0) {
        const size_t n = all.size() < capacity - 1 ? all.size() : capacity - 1;
        all.copy(out, n);
        out[n] = '\0';
    }
    return all.size();
}
