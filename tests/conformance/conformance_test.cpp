// One behaviour suite for every plugin: BACKPLANE_CONFORMANCE_PLUGIN names the plugin and
// BACKPLANE_CONFORMANCE_LIBRARY its module; exits 77 (SKIP) only when the plugin reports no device
// or no driver here, and fails on any other setup error (tests internals: opens the plugin through
// detail::PluginLibrary, backplane_internal_dep).
#define DOCTEST_CONFIG_IMPLEMENT
#include "conformance_kernels.hpp"

#include "../test_skip.hpp"

#include "client/open_client.hpp"
#include "plugin/device_info.hpp"
#include "plugin/plugin_library.hpp"

#include <backplane/client.hpp>

#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <thread>
#include <vector>

using namespace backplane;
using namespace conformance;

namespace {

std::shared_ptr<detail::PluginLibrary> gPlugin;
DeviceInfo gDevice;

ComputeClient openClient() {
    Config config;
    config.cacheEnabled = false;
    return detail::openComputeClient(gPlugin, gDevice, config);
}

} // namespace

TEST_CASE("bytes written to a buffer read back unchanged") {
    ComputeClient client = openClient();
    std::vector<uint32_t> data(100000);
    for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint32_t>(i * 7 + 1);
    Buffer b = client.createFrom<uint32_t>(data);
    CHECK(client.readAs<uint32_t>(b) == data);
}

TEST_CASE("saxpy matches the CPU element by element") {
    ComputeClient client = openClient();
    const uint32_t n = 100003;
    std::vector<float> x(n), y(n);
    for (uint32_t i = 0; i < n; ++i) {
        x[i] = static_cast<float>(i % 1000);
        y[i] = static_cast<float>(i % 7);
    }
    Buffer bx = client.createFrom<float>(x), by = client.createFrom<float>(y);
    client.execute(saxpyKernel(), saxpyDispatch(bx, by, 0.5f, n));
    const auto out = client.readAs<float>(by);
    REQUIRE(out.size() == n);
    size_t wrong = 0;
    for (uint32_t i = 0; i < n; ++i)
        if (out[i] != 0.5f * x[i] + y[i]) ++wrong;
    CHECK(wrong == 0);
}

TEST_CASE("threads on separate streams exchange buffers correctly") {
    ComputeClient client = openClient();
    const int threads = 4, rounds = 10;
    const uint32_t n = 4096;
    std::vector<std::vector<Buffer>> inputs(threads, std::vector<Buffer>(rounds));
    std::vector<std::atomic<int>> published(threads);
    std::atomic<int> wrong{0};
    std::vector<std::thread> workers;
    for (int t = 0; t < threads; ++t)
        workers.emplace_back([&, t] {
            StreamGuard guard(static_cast<StreamId>(20 + t));
            for (int r = 0; r < rounds; ++r) {
                std::vector<float> x(n);
                for (uint32_t i = 0; i < n; ++i) x[i] = static_cast<float>(t * 100 + r + i % 50);
                inputs[t][r] = client.createFrom<float>(x);
                published[t].store(r + 1);
                const int peer = (t + 1) % threads;
                while (published[peer].load() < r + 1) std::this_thread::yield();
                std::vector<float> y(n, 1.0f);
                Buffer by = client.createFrom<float>(y);
                client.execute(saxpyKernel(), saxpyDispatch(inputs[peer][r], by, 2.0f, n));
                const auto out = client.readAs<float>(by);
                for (uint32_t i = 0; i < n; ++i)
                    if (out[i] != 2.0f * static_cast<float>(peer * 100 + r + i % 50) + 1.0f)
                        ++wrong;
            }
        });
    for (auto &w : workers) w.join();
    CHECK(wrong.load() == 0);
}

TEST_CASE("streams that share nothing create no alignment events") {
    ComputeClient client = openClient();
    std::vector<std::thread> workers;
    for (int t = 0; t < 3; ++t)
        workers.emplace_back([&, t] {
            StreamGuard guard(static_cast<StreamId>(t));
            std::vector<float> x(1024, 1.0f);
            for (int r = 0; r < 10; ++r) {
                Buffer bx = client.createFrom<float>(x), by = client.createFrom<float>(x);
                client.execute(saxpyKernel(), saxpyDispatch(bx, by, 1.0f, 1024));
                client.sync();
            }
        });
    for (auto &w : workers) w.join();
    CHECK(client.stats().alignmentEvents == 0);
}

TEST_CASE("a freed and reallocated size takes no new page") {
    ComputeClient client = openClient();
    { Buffer a = client.empty(1 << 20); }
    const uint64_t pages = client.stats().pageAllocations;
    for (int i = 0; i < 50; ++i) Buffer b = client.empty(1 << 20);
    CHECK(client.stats().pageAllocations == pages);
}

TEST_CASE("profiling tokens nest") {
    ComputeClient client = openClient();
    std::vector<float> x(1 << 18, 1.0f);
    Buffer bx = client.createFrom<float>(x), by = client.createFrom<float>(x);
    ProfileToken outer = client.profileStart();
    client.execute(saxpyKernel(), saxpyDispatch(bx, by, 1.0f, 1 << 18));
    ProfileToken inner = client.profileStart();
    client.execute(saxpyKernel(), saxpyDispatch(bx, by, 1.0f, 1 << 18));
    const uint64_t innerNs = client.profileEnd(inner).nanoseconds;
    const uint64_t outerNs = client.profileEnd(outer).nanoseconds;
    CHECK(outerNs >= innerNs);
}

int main(int argc, char **argv) {
    const char *name = std::getenv("BACKPLANE_CONFORMANCE_PLUGIN");
    const char *library = std::getenv("BACKPLANE_CONFORMANCE_LIBRARY");
    if (name == nullptr || library == nullptr)
        return test::fail("set BACKPLANE_CONFORMANCE_PLUGIN and BACKPLANE_CONFORMANCE_LIBRARY "
                          "(meson test sets both)");
    const char *options = std::getenv("BACKPLANE_CONFORMANCE_OPTIONS");
    const std::string plugin = std::string("plugin ") + name;
    try {
        gPlugin = detail::PluginLibrary::open(library, name,
                                              {.cacheDir = "", .optionsJson = options ? options : "{}"});
        if (gPlugin->probe().device_count == 0) return test::skip(plugin + " reports no device");
    } catch (const std::exception &e) {
        return test::skipOrFail(e, "opening and probing " + plugin + " (" + library + ")");
    }
    try {
        gDevice = detail::toDeviceInfo(name, 0, gPlugin->deviceInfo(0));
    } catch (const std::exception &e) {
        // The probe found a device: not describing it is the plugin's failure, whatever the code.
        return test::fail(plugin + " probed a device but device_info(0) failed: " + e.what());
    }
    std::printf("conformance: %s on %s (%s)\n", name, gDevice.id().c_str(), gDevice.name.c_str());
    doctest::Context context(argc, argv);
    const int rc = context.run();
    gPlugin.reset();
    return rc;
}
