// Test helper: opens a ComputeClient on the built host plugin with given options (internal API).
#pragma once

#include "client/open_client.hpp"
#include "plugin/device_info.hpp"
#include "plugin/plugin_library.hpp"

#include "../conformance/conformance_kernels.hpp"

#include <backplane/client.hpp>

#include <atomic>
#include <string>

namespace enginetest {

/// Opens host device 0. `options` is the host plugin's options JSON.
inline backplane::ComputeClient openHost(const std::string &options = R"({"mode":"async"})",
                                         backplane::Config config = {}) {
    auto plugin = backplane::detail::PluginLibrary::open(HOST_PLUGIN_PATH, "host",
                                                         {.cacheDir = "", .optionsJson = options});
    const auto info = backplane::detail::toDeviceInfo("host", 0, plugin->deviceInfo(0));
    config.cacheEnabled = false;
    return backplane::detail::openComputeClient(plugin, info, config);
}

// saxpy's host kernel and scalars are the conformance suite's (one definition for all tests).
using conformance::SaxpyScalars;
using conformance::saxpyHost;

/// Set by tests: the gated copy kernel spins until it is true.
inline std::atomic<bool> gateOpen{true};

/// dst[i] = src[i] after the gate opens; bindings src, dst; scalars {uint32 n}.
inline void gatedCopyHost(const bp_host_kernel_context *c) {
    while (!gateOpen.load()) {
    }
    const uint32_t n = *static_cast<const uint32_t *>(c->scalars);
    const auto *src = static_cast<const uint32_t *>(c->buffers[0]);
    auto *dst = static_cast<uint32_t *>(c->buffers[1]);
    for (uint32_t t = 0; t < c->block[0]; ++t) {
        const uint32_t i = c->workgroup[0] * c->block[0] + t;
        if (i < n) dst[i] = src[i];
    }
}

inline backplane::KernelSource saxpyKernel() {
    return {"saxpy", {backplane::KernelVariant::host(&saxpyHost, "saxpy")}};
}
inline backplane::KernelSource gatedCopyKernel() {
    return {"gated_copy", {backplane::KernelVariant::host(&gatedCopyHost, "gated_copy")}};
}

inline backplane::Dispatch saxpyDispatch(const backplane::Buffer &x, const backplane::Buffer &y,
                                         float a, uint32_t n) {
    backplane::Dispatch d;
    d.block = {256, 1, 1};
    d.grid = {(n + 255) / 256, 1, 1};
    d.bindings = {x, y};
    d.scalar(a).scalar(n);
    return d;
}

} // namespace enginetest
