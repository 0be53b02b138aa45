// ComputeClient::close() on every device present (host async and sync, lavapipe in CI, CUDA on the
// GPU machine): idempotent, later calls and Buffers refuse with a message naming close, work
// issued before it completes, and the device opens again at once while a ReadFuture or a
// PinnedBuffer of the closed client lives (issue 26). Public API only.
#include <backplane/client.hpp>
#include <backplane/config.hpp>
#include <backplane/error.hpp>
#include <backplane/runtime.hpp>

#include <doctest/doctest.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

using namespace backplane;

namespace {

const Runtime &runtime(const std::string &mode) {
    static const auto make = [](const std::string &m) {
        Config config;
        config.pluginPathOverride = {MANIFESTS};
        config.probeMode = ProbeMode::InProcess;
        config.cacheEnabled = false;
        config.pluginOptions["host"] = R"({"workers":2,"mode":")" + m + "\"}";
        return config;
    };
    static const Runtime async(make("async"));
    static const Runtime sync(make("sync"));
    return mode == "async" ? async : sync;
}

/// Every device route: the host in both modes, the others once.
std::vector<std::pair<const Runtime *, Selection>> routes() {
    std::vector<std::pair<const Runtime *, Selection>> out;
    for (const char *mode : {"async", "sync"}) {
        const Runtime &r = runtime(mode);
        for (const PhysicalDevice &device : r.devices())
            for (const DeviceInfo &route : device.routes)
                if (route.backend == "host" || std::string(mode) == "async")
                    out.emplace_back(&r, r.select(route.id()));
    }
    return out;
}

bool mentionsClose(const std::function<void()> &call) {
    try {
        call();
    } catch (const Error &e) {
        return std::string(toString(e.code())) == "invalid_argument" &&
               std::string(e.what()).find("close") != std::string::npos;
    }
    return false;
}

} // namespace

TEST_CASE("close() waits for issued work, refuses later calls and lets the device reopen at once") {
    for (const auto &[r, selection] : routes()) {
        CAPTURE(selection.device.id());
        ComputeClient client = r->open(selection);
        ComputeClient copy = client;
        std::vector<uint32_t> words(1 << 16, 7);
        Buffer b = client.createFrom<uint32_t>(words);
        client.fill(b, 9u);
        ReadFuture pending = client.read(b, 0, 64);
        PinnedBuffer pinned = client.allocatePinned(4096);
        client.close();
        CHECK_NOTHROW(client.close()); // idempotent
        // Issued before close: completed.
        const std::vector<std::byte> bytes = pending.wait();
        REQUIRE(bytes.size() == 64);
        CHECK(static_cast<uint8_t>(bytes[0]) == 9);
        // Every later call, through any copy, names close.
        CHECK(mentionsClose([&] { (void)client.empty(16); }));
        CHECK(mentionsClose([&] { copy.fill(b, 1u); }));
        CHECK(mentionsClose([&] { (void)copy.read(b); }));
        CHECK(mentionsClose([&] { client.write(b, 0, words.data(), 16); }));
        // No driver handle of a closed client (review finding: live pointers came back).
        CHECK(mentionsClose([&] { (void)client.nativeHandle(NativeKind::Device); }));
        CHECK(mentionsClose([&] { (void)client.nativeHandle(NativeKind::Stream); }));
        CHECK(mentionsClose([&] { (void)copy.nativeHandle(NativeKind::Memory, &b); }));
        // The device opens again while the closed client's PinnedBuffer and Buffer live.
        ComputeClient again = r->open(selection);
        Buffer fresh = again.createFrom<uint32_t>(std::vector<uint32_t>(16, 5));
        CHECK(again.readAs<uint32_t>(fresh) == std::vector<uint32_t>(16, 5));
        CHECK_THROWS_AS(again.fill(b, 1u), Error); // the closed client's Buffer stays its own
        CHECK(pinned.size() == 4096);
    }
}
