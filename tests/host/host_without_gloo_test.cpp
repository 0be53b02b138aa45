// The host plugin where Gloo is missing: its Gloo module is pointed at an empty directory
// (BACKPLANE_GLOO_MODULE, set by meson), as on a machine without libgloo. The plugin still loads,
// its devices open and run kernels, libgloo is never mapped into the process, and collectives are
// off with the reason: in the device report, from comm_id_create, and from a Communicator that
// needs them. Public API only (Runtime, RawPlugin, Communicator).
#include <backplane/client.hpp>
#include <backplane/communicator.hpp>
#include <backplane/error.hpp>
#include <backplane/raw_plugin.hpp>
#include <backplane/runtime.hpp>

#include <doctest/doctest.h>

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <string>
#include <vector>

using namespace backplane;

namespace {

/// The directory BACKPLANE_GLOO_MODULE points into: it must hold no module.
std::string hiddenModule() {
    const char *value = std::getenv("BACKPLANE_GLOO_MODULE");
    REQUIRE_MESSAGE(value != nullptr, "meson sets BACKPLANE_GLOO_MODULE for this test");
    REQUIRE_FALSE(std::filesystem::exists(value));
    return value;
}

/// $BACKPLANE_TEST_HOST_MANIFEST (another build's plugin), else the build tree's manifest.
std::string manifestPath() {
    const char *env = std::getenv("BACKPLANE_TEST_HOST_MANIFEST");
    return env != nullptr && *env != '\0' ? env : HOST_PLUGIN_MANIFEST;
}

Config hostOnly(const std::string &options) {
    Config config;
    config.pluginPathOverride = {manifestPath()};
    config.pluginOptions["host"] = options;
    config.probeMode = ProbeMode::InProcess;
    config.cacheEnabled = false;
    return config;
}

/// Whether a library whose file name contains `name` is mapped into this process.
bool mapped(const std::string &name) {
    std::ifstream maps("/proc/self/maps");
    std::string line;
    while (std::getline(maps, line))
        if (line.find(name) != std::string::npos) return true;
    return false;
}

/// buffer 0: uint32 values; adds 1 to each element a thread of the grid covers.
void addOneKernel(const bp_host_kernel_context *context) {
    auto *data = static_cast<uint32_t *>(context->buffers[0]);
    const uint64_t count = context->buffer_sizes[0] / sizeof(uint32_t);
    for (uint32_t t = 0; t < context->block[0]; ++t) {
        const uint64_t i = uint64_t{context->workgroup[0]} * context->block[0] + t;
        if (i < count) data[i] += 1;
    }
}

} // namespace

TEST_CASE("without its Gloo module the host plugin loads, runs kernels and says why collectives "
          "are off") {
    const std::string module = hiddenModule();
    Runtime runtime(hostOnly(R"({"devices": 2})"));
    REQUIRE(runtime.devices().size() == 2);
    for (const PhysicalDevice &device : runtime.devices()) {
        const DeviceInfo &route = device.info();
        INFO(route.id() << ": " << route.collectives);
        CHECK(route.backend == "host");
        CHECK((route.capabilities & BP_CAPABILITY_COLLECTIVES) == 0);
        // The reason names the module it looked for and what to install.
        CHECK(route.collectives.find(module) != std::string::npos);
        CHECK(route.collectives.find("libgloo") != std::string::npos);
    }

    ComputeClient client = runtime.open(runtime.select("host:0"));
    std::vector<uint32_t> values(1000);
    for (uint32_t i = 0; i < values.size(); ++i)
        values[i] = i;
    Buffer buffer = client.create(values.data(), values.size() * sizeof(uint32_t));
    Dispatch dispatch;
    dispatch.grid = {16};
    dispatch.block = {64};
    dispatch.bindings = {buffer};
    client.execute(KernelSource{"add_one", {KernelVariant::host(addOneKernel)}}, dispatch);
    const std::vector<uint32_t> back = client.readAs<uint32_t>(buffer);
    for (uint32_t i = 0; i < values.size(); ++i)
        REQUIRE(back[i] == i + 1);

    // Nothing loaded Gloo (or the module) along the way.
    CHECK_FALSE(mapped("libgloo"));
    CHECK_FALSE(mapped("backplane_host_gloo"));
}

TEST_CASE("without its Gloo module comm_id_create is unsupported and names the module") {
    const std::string module = hiddenModule();
    RawPlugin plugin =
        RawPlugin::open(readPluginManifest(manifestPath()), {.optionsJson = "{}", .cacheDir = {}});
    REQUIRE(plugin.has(&bp_plugin_api::comm_id_create));
    std::vector<unsigned char> id(BP_COMM_ID_MAX_BYTES);
    size_t size = 0;
    bp_error error = makeError();
    const bp_status status =
        plugin.api().comm_id_create(plugin.instance(), id.data(), id.size(), &size, &error);
    const std::string message = errorMessage(error);
    INFO(message);
    CHECK(status == BP_ERROR_UNSUPPORTED);
    CHECK(message.find(module) != std::string::npos);
    CHECK(message.find("BACKPLANE_GLOO_MODULE") != std::string::npos);
    CHECK(message.find("libgloo") != std::string::npos);
}

TEST_CASE("without its Gloo module a communicator between processes is refused with the reason") {
    const std::string module = hiddenModule();
    Runtime runtime(hostOnly(R"({"devices": 2})"));
    // Two "processes" of a directory rendezvous, as two threads: the staged path between
    // processes needs the host plugin's Gloo, which is missing.
    const std::filesystem::path directory =
        std::filesystem::temp_directory_path() /
        ("bp-no-gloo-" + std::to_string(static_cast<long>(::getpid())));
    std::filesystem::remove_all(directory);
    std::filesystem::create_directories(directory);
    auto join = [&](uint32_t process) -> std::string {
        ComputeClient client = runtime.open(runtime.select("host:" + std::to_string(process)));
        auto rendezvous = directoryRendezvous(directory.string(), process, 2);
        try {
            Communicator::create(runtime, {client}, *rendezvous);
        } catch (const Error &e) {
            return e.what();
        }
        return "";
    };
    auto other = std::async(std::launch::async, join, 1u);
    const std::string mine = join(0);
    const std::string theirs = other.get();
    std::filesystem::remove_all(directory);
    for (const std::string &message : {mine, theirs}) {
        INFO(message);
        CHECK(message.find("collectives") != std::string::npos);
        CHECK(message.find(module) != std::string::npos);
    }

    // In one process the staged engine needs no Gloo: a communicator works and says so.
    ComputeClient a = runtime.open(runtime.select("host:0"));
    ComputeClient b = runtime.open(runtime.select("host:1"));
    auto local = localRendezvous();
    Communicator comm = Communicator::create(runtime, {a, b}, *local);
    CHECK(comm.staged());
    std::vector<float> ones(64, 1.0f);
    std::vector<Buffer> buffers = {a.create(ones.data(), 256), b.create(ones.data(), 256)};
    comm.allReduce(buffers, buffers, 64, DataType::F32, ReduceOp::Sum);
    CHECK(a.readAs<float>(buffers[0]) == std::vector<float>(64, 2.0f));
}
