// A host device and a Vulkan device (lavapipe in CI, any Vulkan GPU elsewhere) in one process:
// copies between the two plugins in both directions, ordered without syncs, and a staged
// Communicator over the mix (no common engine) checked exactly. Exits 77 (SKIP) only when the
// Vulkan plugin sees no device.
#include "../test_skip.hpp"
#include "client/open_client.hpp"
#include "plugin/device_info.hpp"
#include "plugin/plugin_library.hpp"

#include <backplane/client.hpp>
#include <backplane/communicator.hpp>
#include <backplane/error.hpp>

#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <numeric>
#include <vector>

using namespace backplane;

namespace {

std::shared_ptr<detail::PluginLibrary> gVulkan;
DeviceInfo gVulkanDevice;

ComputeClient openVulkan() {
    Config config;
    config.cacheEnabled = false;
    return detail::openComputeClient(gVulkan, gVulkanDevice, config);
}

ComputeClient openHost() {
    auto plugin = detail::PluginLibrary::open(HOST_PLUGIN_PATH, "host",
                                              {.cacheDir = "", .optionsJson = R"({"mode":"async"})"});
    Config config;
    config.cacheEnabled = false;
    return detail::openComputeClient(plugin, detail::toDeviceInfo("host", 0, plugin->deviceInfo(0)),
                                     config);
}

std::vector<uint32_t> words(uint32_t n, uint32_t first) {
    std::vector<uint32_t> v(n);
    std::iota(v.begin(), v.end(), first);
    return v;
}

} // namespace

TEST_CASE("copies between the host plugin and Vulkan go both ways, staged, with views") {
    ComputeClient host = openHost();
    ComputeClient vulkan = openVulkan();
    const uint32_t n = 5 * 1024 * 1024 + 3; // several staging chunks
    Buffer onHost = host.createFrom<uint32_t>(words(n, 11));
    Buffer onGpu = vulkan.empty(uint64_t{n} * 4);
    host.copy(onHost, 0, vulkan, onGpu, 0, uint64_t{n} * 4);
    // No sync: the Vulkan side reads right after, on its own stream.
    CHECK(vulkan.readAs<uint32_t>(onGpu) == words(n, 11));
    Buffer back = host.createFrom<uint32_t>(std::vector<uint32_t>(16, 0));
    vulkan.copy(onGpu.view(256), 0, host, back.view(16), 0, 32); // words 64..71 -> 4..11
    const std::vector<uint32_t> out = host.readAs<uint32_t>(back);
    CHECK(out[3] == 0);
    CHECK(std::vector<uint32_t>(out.begin() + 4, out.begin() + 12) == words(8, 11 + 64));
    CHECK(out[12] == 0);
    CHECK(host.stats().stagedCopies == 1);
    CHECK(vulkan.stats().stagedCopies == 1);
}

TEST_CASE("a host device and a Vulkan device all-reduce through the staged path exactly") {
    std::vector<ComputeClient> devices = {openHost(), openVulkan()};
    auto rendezvous = localRendezvous();
    Communicator comm = Communicator::create(devices, *rendezvous);
    CHECK(comm.staged());
    CHECK(comm.size() == 2);
    const uint64_t count = 100000;
    std::vector<Buffer> f, i;
    for (uint32_t r = 0; r < 2; ++r) {
        std::vector<float> floats(count);
        std::vector<int32_t> ints(count);
        for (uint64_t k = 0; k < count; ++k) {
            floats[k] = static_cast<float>((k + r) % 9) - 4.0f;
            ints[k] = static_cast<int32_t>(k * (r + 1)) - 7;
        }
        f.push_back(devices[r].createFrom<float>(floats));
        i.push_back(devices[r].createFrom<int32_t>(ints));
    }
    comm.allReduce(f, f, count, DataType::F32, ReduceOp::Sum);
    comm.allReduce(i, i, count, DataType::I32, ReduceOp::Max);
    for (uint32_t r = 0; r < 2; ++r) {
        const std::vector<float> fs = devices[r].readAs<float>(f[r]);
        const std::vector<int32_t> is = devices[r].readAs<int32_t>(i[r]);
        size_t wrong = 0;
        for (uint64_t k = 0; k < count; ++k) {
            const float expect = static_cast<float>(k % 9) - 4.0f + static_cast<float>((k + 1) % 9) - 4.0f;
            if (fs[k] != expect || is[k] != static_cast<int32_t>(k * 2) - 7) ++wrong;
        }
        CHECK(wrong == 0);
    }
}

int main(int argc, char **argv) {
    int status = 0;
    try {
        gVulkan = detail::PluginLibrary::open(VULKAN_PLUGIN_PATH, "vulkan", {});
        const bp_probe_result probe = gVulkan->probe();
        if (probe.device_count == 0) {
            gVulkan.reset();
            return test::skip("the Vulkan plugin sees no device (lavapipe: mesa-vulkan-drivers)");
        }
        gVulkanDevice = detail::toDeviceInfo("vulkan", 0, gVulkan->deviceInfo(0));
    } catch (const std::exception &e) {
        gVulkan.reset();
        return test::skipOrFail(e, "opening and probing the Vulkan plugin");
    }
    doctest::Context context(argc, argv);
    status = context.run();
    gVulkan.reset(); // before static destruction (NVIDIA's driver is gone by then)
    return status;
}
