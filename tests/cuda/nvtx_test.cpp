// NVTX ranges of the CUDA plugin, seen by a stand-in profiler (nvtx_recorder.cpp, loaded by the
// NVTX header through NVTX_INJECTION64_PATH as `nsys profile` loads its own): a launch is a
// range named by the kernel, a write, read, copy and fill each a range. Public API only. Exit
// 77 (SKIP) without a CUDA device.
#include <backplane/client.hpp>
#include <backplane/config.hpp>
#include <backplane/kernels.hpp>
#include <backplane/runtime.hpp>

#include <doctest/doctest.h>

#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

using namespace backplane;

namespace {

std::string recordedEvents() {
    void *recorder = ::dlopen(NVTX_RECORDER, RTLD_LAZY | RTLD_NOLOAD);
    REQUIRE_MESSAGE(recorder != nullptr,
                    "the NVTX header never loaded " NVTX_RECORDER " (no range was pushed)");
    using Events = size_t (*)(char *, size_t);
    auto events = reinterpret_cast<Events>(::dlsym(recorder, "bp_test_nvtx_events"));
    REQUIRE_MESSAGE(bool(events), "bp_test_nvtx_events missing from " NVTX_RECORDER);
    std::string text(events(nullptr, 0) + 1, '\0');
    text.resize(events(text.data(), text.size()));
    ::dlclose(recorder);
    return text;
}

} // namespace

TEST_CASE("the CUDA plugin names its submissions with NVTX ranges for profilers") {
    // Before any NVTX call of the process: the NVTX header reads it once, at its first call.
    ::setenv("NVTX_INJECTION64_PATH", NVTX_RECORDER, 1);
    Config config;
    config.pluginPathOverride = {CUDA_MANIFEST};
    config.pluginEnable = {"cuda"};
    config.probeMode = ProbeMode::InProcess;
    config.cacheEnabled = false;
    const Runtime runtime(config);
    if (runtime.devices().empty()) {
        std::printf("SKIP: no CUDA device\n");
        std::exit(77);
    }
    ComputeClient client = runtime.open(runtime.select("cuda"));
    const uint32_t n = 1 << 16;
    Buffer x = client.createFrom<float>(std::vector<float>(n, 1.0f));
    Buffer y = client.createFrom<float>(std::vector<float>(n, 2.0f));
    Dispatch d;
    d.block = {256};
    d.grid = {n / 256};
    d.bindings = {x, y};
    d.scalar(3.0f).scalar(n);
    client.execute(kernels::saxpy(), d);
    const std::vector<float> got = client.readAs<float>(y);
    CHECK(got[n - 1] == 5.0f);
    Buffer z = client.empty(uint64_t{n} * 4);
    client.copy(y, 0, z, 0, uint64_t{n} * 4);
    client.fill(z, 0u);
    client.sync();

    const std::string events = recordedEvents();
    INFO(events);
    CHECK(events.find("push copy host to device\npop\n") != std::string::npos);
    CHECK(events.find("push copy device to host\npop\n") != std::string::npos);
    CHECK(events.find("push copy device to device\npop\n") != std::string::npos);
    CHECK(events.find("push fill\npop\n") != std::string::npos);
    // The generated CUDA entry point of the portable kernel carries its name.
    CHECK(events.find("saxpy") != std::string::npos);
    // Balanced: as many pops as pushes.
    size_t pushes = 0, pops = 0;
    for (size_t at = 0; (at = events.find("push ", at)) != std::string::npos; ++at) ++pushes;
    for (size_t at = 0; (at = events.find("pop\n", at)) != std::string::npos; ++at) ++pops;
    CHECK(pushes == pops);
    CHECK(pushes >= 5);
}
