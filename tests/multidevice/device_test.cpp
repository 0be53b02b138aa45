// Buffer views, strided tensor transfers and copies between devices, on host-plugin devices
// (several devices of one plugin instance: the peer path; of two instances: the staged path).
// Hazards are made observable with gated kernels that hold a stream until the test opens them.
#include "client/open_client.hpp"
#include "plugin/device_info.hpp"
#include "plugin/plugin_library.hpp"

#include <backplane/client.hpp>
#include <backplane/error.hpp>

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

using namespace backplane;

namespace {

/// Devices 0..count-1 of ONE host plugin instance (so they are peers of each other).
std::vector<ComputeClient> openHostDevices(uint32_t count) {
    const std::string options = R"({"mode":"async","devices":)" + std::to_string(count) + "}";
    auto plugin = detail::PluginLibrary::open(HOST_PLUGIN_PATH, "host",
                                              {.cacheDir = "", .optionsJson = options});
    Config config;
    config.cacheEnabled = false;
    std::vector<ComputeClient> clients;
    for (uint32_t i = 0; i < count; ++i)
        clients.push_back(detail::openComputeClient(
            plugin, detail::toDeviceInfo("host", i, plugin->deviceInfo(i)), config));
    return clients;
}

/// One gate per stream to hold: a kernel launched with gate g spins until it opens.
std::atomic<bool> gates[2] = {true, true};

/// dst[i] = src[i] once gate scalars[1] is open; bindings src, dst; scalars {uint32 n, uint32 g}.
void gatedCopy(const bp_host_kernel_context *c) {
    const auto *scalars = static_cast<const uint32_t *>(c->scalars);
    while (!gates[scalars[1]].load()) std::this_thread::yield();
    const auto *src = static_cast<const uint32_t *>(c->buffers[0]);
    auto *dst = static_cast<uint32_t *>(c->buffers[1]);
    for (uint32_t i = 0; i < scalars[0]; ++i) dst[i] = src[i];
}

void launchGatedCopy(ComputeClient &client, const Buffer &src, const Buffer &dst, uint32_t n,
                     uint32_t gate) {
    Dispatch d;
    d.bindings = {src, dst};
    d.scalar(n).scalar(gate);
    client.execute({"gated_copy", {KernelVariant::host(&gatedCopy, "gated_copy")}}, d);
}

std::vector<uint32_t> words(uint32_t n, uint32_t first) {
    std::vector<uint32_t> v(n);
    std::iota(v.begin(), v.end(), first);
    return v;
}

template <class F> std::string errorOf(F &&call) {
    try {
        call();
    } catch (const Error &e) {
        CHECK((e.code() == ErrorCode::InvalidArgument));
        return e.what();
    }
    FAIL("expected Error(InvalidArgument)");
    return {};
}

} // namespace

// ----- views ------------------------------------------------------------------------------------

TEST_CASE("a view reads, writes, copies and fills only its own range") {
    ComputeClient client = openHostDevices(1)[0];
    Buffer whole = client.createFrom<uint32_t>(words(64, 0));
    Buffer middle = whole.view(64, 128); // words 16..47
    CHECK(middle.size() == 128);
    CHECK(middle.offset() == 64);
    CHECK(middle.id() == whole.id());
    CHECK(client.readAs<uint32_t>(middle) == words(32, 16));

    client.fill(middle, 0xffffffffu, 0, 16); // words 16..19
    const std::vector<uint32_t> five = {5, 5};
    client.write(middle, 120, five.data(), 8); // words 46, 47
    Buffer tail = whole.view(192);             // words 48..63
    client.copy(whole, 0, tail, 0, 8);         // words 48, 49 = 0, 1
    std::vector<uint32_t> expected = words(64, 0);
    for (int i = 16; i < 20; ++i) expected[i] = 0xffffffffu;
    expected[46] = expected[47] = 5;
    expected[48] = 0;
    expected[49] = 1;
    CHECK(client.readAs<uint32_t>(whole) == expected);

    // A view of a view counts from the inner view's start.
    Buffer inner = middle.view(8, 8); // words 18, 19
    CHECK(inner.offset() == 72);
    CHECK(client.readAs<uint32_t>(inner) == std::vector<uint32_t>{0xffffffffu, 0xffffffffu});
}

TEST_CASE("a view past its buffer, and a transfer past a view, are refused") {
    ComputeClient client = openHostDevices(1)[0];
    Buffer b = client.empty(256);
    CHECK(errorOf([&] { (void)b.view(257); }).find("past the end") != std::string::npos);
    CHECK(errorOf([&] { (void)b.view(128, 129); }).find("overruns") != std::string::npos);
    CHECK(errorOf([&] { (void)Buffer().view(0); }).find("empty Buffer") != std::string::npos);
    Buffer v = b.view(128, 64);
    CHECK(errorOf([&] { (void)client.read(v, 0, 65); }).find("overruns a buffer of 64") !=
          std::string::npos);
    CHECK(errorOf([&] { client.fill(v.view(2), 0); }).find("of 4") != std::string::npos);
}

TEST_CASE("a kernel binds a view at its offset, and refuses an unaligned one naming the alignment") {
    ComputeClient client = openHostDevices(1)[0];
    const uint32_t alignment = client.device().bindingAlignment; // 64 on the host plugin
    Buffer src = client.createFrom<uint32_t>(words(64, 100));
    Buffer dst = client.createFrom<uint32_t>(std::vector<uint32_t>(64, 0));
    launchGatedCopy(client, src.view(alignment), dst.view(2 * alignment), 4, 0);
    const std::vector<uint32_t> out = client.readAs<uint32_t>(dst);
    const uint32_t from = alignment / 4, to = 2 * alignment / 4;
    for (uint32_t i = 0; i < 4; ++i) CHECK(out[to + i] == 100 + from + i);
    CHECK(out[to - 1] == 0);
    CHECK(out[to + 4] == 0);
    const std::string message =
        errorOf([&] { launchGatedCopy(client, src.view(4), dst, 4, 0); });
    CHECK(message.find("binding 0 is a view starting at byte 4") != std::string::npos);
    CHECK(message.find("multiples of " + std::to_string(alignment)) != std::string::npos);
}

TEST_CASE("a view used on another stream waits for pending work on the whole buffer") {
    ComputeClient client = openHostDevices(1)[0];
    Buffer src = client.createFrom<uint32_t>(words(32, 1000));
    Buffer dst = client.createFrom<uint32_t>(std::vector<uint32_t>(32, 0));
    gates[0] = false;
    {
        StreamGuard s(101);
        launchGatedCopy(client, src, dst, 32, 0); // writes all of dst, held by the gate
    }
    std::thread opener([] {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        gates[0] = true;
    });
    StreamGuard s(202);
    // Another stream reads a view of the pending destination: it must see the kernel's result.
    const std::vector<uint32_t> part = client.readAs<uint32_t>(dst.view(64, 16));
    opener.join();
    CHECK(part == words(4, 1016));
}

// ----- strided tensors --------------------------------------------------------------------------

TEST_CASE("an optimized tensor writes and reads back contiguous without touching its padding") {
    ComputeClient client = openHostDevices(1)[0];
    const std::vector<uint64_t> shape = {5, 3};
    Tensor t = client.emptyTensor(shape, 4, TensorLayout::Optimized);
    REQUIRE(t.strides[0] > 3); // padded rows
    client.fill(t.buffer, 0xdeadbeefu);
    const std::vector<uint32_t> data = words(15, 1);
    client.writeTensor(t, data.data(), data.size() * 4);
    const std::vector<std::byte> back = client.readTensor(t).wait();
    REQUIRE(back.size() == 60);
    CHECK(std::memcmp(back.data(), data.data(), 60) == 0);
    const std::vector<uint32_t> raw = client.readAs<uint32_t>(t.buffer);
    for (uint64_t row = 0; row < 5; ++row)
        for (uint64_t col = 3; col < t.strides[0] && row * t.strides[0] + col < raw.size(); ++col)
            CHECK(raw[row * t.strides[0] + col] == 0xdeadbeefu);
}

TEST_CASE("a transposed, a broadcast and a view-based tensor read as their logical layout") {
    ComputeClient client = openHostDevices(1)[0];
    Buffer b = client.createFrom<uint32_t>(words(12, 0)); // a 3x4 row-major matrix
    Tensor transposed{b, {4, 3}, {1, 4}, 4};
    std::vector<uint32_t> out(12);
    auto bytes = client.readTensor(transposed).wait();
    std::memcpy(out.data(), bytes.data(), 48);
    CHECK(out == std::vector<uint32_t>{0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11});

    Tensor broadcast{b.view(16), {3, 2}, {0, 1}, 4}; // row 1's first two elements, three times
    bytes = client.readTensor(broadcast).wait();
    out.assign(6, 0);
    std::memcpy(out.data(), bytes.data(), 24);
    CHECK(out == std::vector<uint32_t>{4, 5, 4, 5, 4, 5});

    // Writing column 1 of the matrix touches nothing else.
    Tensor column{b.view(4), {3}, {4}, 4};
    const std::vector<uint32_t> values = {100, 200, 300};
    client.writeTensor(column, values.data(), 12);
    std::vector<uint32_t> expected = words(12, 0);
    expected[1] = 100;
    expected[5] = 200;
    expected[9] = 300;
    CHECK(client.readAs<uint32_t>(b) == expected);
}

TEST_CASE("bad tensor descriptors are refused before any transfer") {
    ComputeClient client = openHostDevices(1)[0];
    Buffer b = client.empty(48);
    const uint32_t data[12] = {};
    CHECK(errorOf([&] { (void)client.readTensor(Tensor{b, {4, 4}, {4, 1}, 4}); })
              .find("past the") != std::string::npos);
    CHECK(errorOf([&] { (void)client.readTensor(Tensor{b, {4}, {1, 1}, 4}); })
              .find("dimensions") != std::string::npos);
    CHECK(errorOf([&] { client.writeTensor(Tensor{b, {3, 2}, {0, 1}, 4}, data, 24); })
              .find("overlap") != std::string::npos);
    CHECK(errorOf([&] { client.writeTensor(Tensor{b, {3, 4}, {4, 1}, 4}, data, 40); })
              .find("48") != std::string::npos);
    CHECK(errorOf([&] {
              (void)client.readTensor(Tensor{b, {UINT64_MAX / 2, 4}, {UINT64_MAX / 4, 1}, 4});
          }).find("overflow") != std::string::npos);
}

// ----- copies between devices -------------------------------------------------------------------

namespace {

/// The hazards of a copy between devices, observable: the source is written by a kernel held
/// on the source's stream, the destination's stream is held too, and the source is overwritten
/// right after the copy call. The copy must carry the kernel's data (ordered after it) and not
/// the overwrite (the overwrite must wait for the copy), without any sync by the test.
void checkOrderedCopy(ComputeClient &from, ComputeClient &to, bool expectPeer) {
    const uint32_t n = 1024;
    {
        // Which path the pair takes (a wrong guess would make the held copy below block).
        Buffer probe = from.empty(4);
        Buffer target = to.empty(4);
        from.copy(probe, 0, to, target, 0, 4);
        REQUIRE(from.stats().peerCopies == (expectPeer ? 1u : 0u));
        REQUIRE(from.stats().stagedCopies == (expectPeer ? 0u : 1u));
    }
    Buffer staging = from.createFrom<uint32_t>(words(n, 7000));
    Buffer src = from.createFrom<uint32_t>(std::vector<uint32_t>(n, 1));
    Buffer scratchIn = to.createFrom<uint32_t>(words(4, 0));
    Buffer scratchOut = to.empty(16);
    Buffer dst = to.createFrom<uint32_t>(std::vector<uint32_t>(n, 2));
    from.syncAll();
    to.syncAll();
    gates[0] = false;
    gates[1] = false;
    launchGatedCopy(from, staging, src, n, 0);         // src := 7000.. once gate 0 opens
    launchGatedCopy(to, scratchIn, scratchOut, 4, 1);  // holds the destination's stream
    std::thread copier;
    if (expectPeer) {
        from.copy(src, 0, to, dst, 0, n * 4); // asynchronous: returns at once
    } else {
        // The staged copy returns once the bytes left the source: after gate 0 opens.
        copier = std::thread([&] { from.copy(src, 0, to, dst, 0, n * 4); });
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    gates[0] = true;
    if (copier.joinable()) copier.join();
    const std::vector<uint32_t> overwrite(n, 9);
    from.write(src, 0, overwrite.data(), n * 4); // must wait for the copy's read of src
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    gates[1] = true;
    CHECK(to.readAs<uint32_t>(dst) == words(n, 7000));
    CHECK(from.readAs<uint32_t>(src) == overwrite);
    CHECK(from.stats().peerCopies == (expectPeer ? 2u : 0u));
    CHECK(from.stats().stagedCopies == (expectPeer ? 0u : 2u));
}

} // namespace

TEST_CASE("a copy between peer devices is ordered after the source's work and before its reuse") {
    std::vector<ComputeClient> devices = openHostDevices(2);
    checkOrderedCopy(devices[0], devices[1], true);
}

TEST_CASE("a peer copy whose destination stream is free still waits for the source's kernel") {
    std::vector<ComputeClient> devices = openHostDevices(2);
    const uint32_t n = 256;
    Buffer staging = devices[0].createFrom<uint32_t>(words(n, 500));
    Buffer src = devices[0].createFrom<uint32_t>(std::vector<uint32_t>(n, 1));
    Buffer dst = devices[1].createFrom<uint32_t>(std::vector<uint32_t>(n, 2));
    devices[0].syncAll();
    devices[1].syncAll();
    gates[0] = false;
    launchGatedCopy(devices[0], staging, src, n, 0); // src := 500.. once gate 0 opens
    devices[0].copy(src, 0, devices[1], dst, 0, n * 4);
    // The destination's stream has nothing else to do: without the device-side wait the copy
    // would run now and carry the old bytes.
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    gates[0] = true;
    CHECK(devices[1].readAs<uint32_t>(dst) == words(n, 500));
    CHECK(devices[0].stats().peerCopies == 1);
}

TEST_CASE("a staged copy between plugin instances is ordered the same way") {
    ComputeClient a = openHostDevices(1)[0];
    ComputeClient b = openHostDevices(1)[0]; // another plugin instance: no peer access
    checkOrderedCopy(a, b, false);
}

TEST_CASE("copies between devices handle views, sizes past the staging chunk and bad ranges") {
    std::vector<ComputeClient> peers = openHostDevices(2);
    ComputeClient other = openHostDevices(1)[0];
    const uint32_t n = 3 * 1024 * 1024 + 5; // several staging chunks, not a multiple
    const std::vector<uint32_t> data = words(n, 3);
    Buffer src = peers[0].createFrom<uint32_t>(data);
    for (ComputeClient *to : {&peers[1], &other}) {
        Buffer dst = to->createFrom<uint32_t>(std::vector<uint32_t>(n + 16, 0));
        peers[0].copy(src.view(4), 0, *to, dst.view(64), 0, (n - 1) * 4);
        const std::vector<uint32_t> out = to->readAs<uint32_t>(dst);
        CHECK(out[15] == 0);
        CHECK(std::equal(data.begin() + 1, data.end(), out.begin() + 16));
        CHECK(out[16 + n - 1] == 0);
        CHECK(errorOf([&] { peers[0].copy(src, 8, *to, dst, 0, n * 4); }).find("overruns") !=
              std::string::npos);
    }
    // The same client on both sides is a plain copy.
    Buffer dst = peers[0].empty(16);
    peers[0].copy(src, 0, peers[0], dst, 0, 16);
    CHECK(peers[0].readAs<uint32_t>(dst) == words(4, 3));
}
