// Sizes and offsets the API cannot represent (near 2^64, or past a buffer by wrapping) are refused
// at every entry point that takes a size or a shape, with Error(OutOfMemory) or
// Error(InvalidArgument) naming the size, before anything is reserved or transferred: on the host
// plugin (async and sync streams) and on every Vulkan device present (lavapipe in CI). Each case
// first fills sentinel buffers and checks them afterwards: a refused size that aliased memory
// would show another buffer's bytes. Public API only.
#include <backplane/client.hpp>
#include <backplane/config.hpp>
#include <backplane/error.hpp>
#include <backplane/lang.hpp>
#include <backplane/runtime.hpp>

#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

using namespace backplane;

namespace {

const Runtime &runtime(const char *hostMode) {
    static const auto make = [](const char *mode) {
        Config config;
        config.pluginPathOverride = {MANIFESTS};
        config.probeMode = ProbeMode::InProcess;
        config.cacheEnabled = false;
        config.pluginOptions["host"] =
            std::string(R"({"workers":2,"memory_bytes":268435456,"mode":")") + mode + "\"}";
        return config;
    };
    static const Runtime async(make("async"));
    static const Runtime sync(make("sync"));
    return std::string(hostMode) == "async" ? async : sync;
}

/// One client per device: the host plugin in both stream modes, every other device once.
std::vector<ComputeClient> &clients() {
    static std::vector<ComputeClient> list = [] {
        std::vector<ComputeClient> out;
        for (const char *mode : {"async", "sync"}) {
            const Runtime &r = runtime(mode);
            for (const PhysicalDevice &device : r.devices())
                for (const DeviceInfo &route : device.routes)
                    if (route.backend == "host" || std::string(mode) == "async")
                        out.push_back(r.open(r.select(route.id())));
        }
        return out;
    }();
    return list;
}

template <class F> void forEachClient(F &&body) {
    for (ComputeClient &client : clients()) {
        INFO(client.device().id() << " (" << client.device().name << ")");
        body(client);
    }
}

/// Sizes within an alignment (256 B to 64 KiB) of 2^64, and 2^63 (never a device's memory).
const std::vector<uint64_t> &hugeSizes() {
    static const std::vector<uint64_t> sizes = {
        UINT64_MAX,           UINT64_MAX - 1,       UINT64_MAX - 63,     UINT64_MAX - 255,
        UINT64_MAX - 256,     UINT64_MAX - 4095,    UINT64_MAX - 65535,  (1ull << 63) + 1,
        1ull << 63};
    return sizes;
}

/// Runs `call`, which must throw Error with one of `codes` and a message naming `size`.
void refused(const std::function<void()> &call, uint64_t size,
             std::initializer_list<ErrorCode> codes = {ErrorCode::OutOfMemory,
                                                        ErrorCode::InvalidArgument}) {
    try {
        call();
        FAIL("accepted a size of " << size);
    } catch (const Error &e) {
        bool expected = false;
        for (ErrorCode code : codes) expected = expected || e.code() == code;
        CHECK_MESSAGE(expected, e.what());
        CHECK_MESSAGE(std::string(e.what()).find(std::to_string(size)) != std::string::npos,
                      "the message does not name " << size << ": " << e.what());
    }
}

/// Buffers of known bytes, checked after the attack: nothing the refused calls did may show.
struct Sentinels {
    explicit Sentinels(ComputeClient &c) : client(c) {
        for (uint32_t i = 0; i < 8; ++i) {
            std::vector<uint32_t> words(2048, 0xa5a50000u + i);
            buffers.push_back(client.create(words.data(), words.size() * 4));
        }
        client.sync();
    }
    void check() {
        for (uint32_t i = 0; i < buffers.size(); ++i) {
            const std::vector<uint32_t> words = client.readAs<uint32_t>(buffers[i]);
            size_t wrong = 0;
            for (uint32_t w : words) wrong += w != 0xa5a50000u + i ? 1 : 0;
            CHECK_MESSAGE(wrong == 0, "sentinel " << i << " has " << wrong << " changed words");
        }
    }
    ComputeClient &client;
    std::vector<Buffer> buffers;
};

} // namespace

TEST_CASE("empty() and create() refuse sizes near 2^64 in both allocation modes") {
    forEachClient([](ComputeClient &client) {
        Sentinels sentinels(client);
        const uint64_t before = client.memoryUsage().allocationCount;
        const std::vector<std::byte> small(16);
        for (AllocationMode mode : {AllocationMode::Auto, AllocationMode::Persistent}) {
            client.setAllocationMode(mode);
            for (uint64_t size : hugeSizes()) {
                CAPTURE(size);
                refused([&] { (void)client.empty(size); }, size, {ErrorCode::OutOfMemory});
                // create() must refuse before it reads the (16-byte) data.
                refused([&] { (void)client.create(small.data(), size); }, size,
                        {ErrorCode::OutOfMemory});
            }
            const uint64_t beyond = client.device().maxAllocationBytes != 0
                                        ? client.device().maxAllocationBytes + 1
                                        : client.device().memoryBytes + 1;
            refused([&] { (void)client.empty(beyond); }, beyond, {ErrorCode::OutOfMemory});
        }
        client.setAllocationMode(AllocationMode::Auto);
        CHECK(client.memoryUsage().allocationCount == before);
        sentinels.check();
        // The client is usable afterwards.
        Buffer after = client.empty(4096);
        client.fill(after, 7u);
        CHECK(client.readAs<uint32_t>(after).front() == 7u);
    });
}

TEST_CASE("emptyTensor refuses shapes whose bytes wrap or come within an alignment of 2^64") {
    forEachClient([](ComputeClient &client) {
        Sentinels sentinels(client);
        struct Case {
            std::vector<uint64_t> shape;
            uint64_t elementSize;
        };
        const std::vector<Case> cases = {
            {{(1ull << 61) - 1}, 8},          // 2^64 - 8 bytes
            {{1ull << 32, 1ull << 32}, 1},    // 2^64: wraps to 0
            {{(1ull << 32) + 1, 1ull << 32}, 1},
            {{3, 0x5555555555555555ull}, 1},  // UINT64_MAX
            {{UINT64_MAX}, 1},
            {{2, 2, 1ull << 61}, 2},
        };
        for (const Case &c : cases)
            for (TensorLayout layout : {TensorLayout::Contiguous, TensorLayout::Optimized}) {
                CAPTURE(c.shape.size());
                CAPTURE(c.elementSize);
                try {
                    (void)client.emptyTensor(c.shape, c.elementSize, layout);
                    FAIL("accepted a tensor of " << c.shape.size() << " dimensions");
                } catch (const Error &e) {
                    CHECK_MESSAGE((e.code() == ErrorCode::OutOfMemory ||
                                   e.code() == ErrorCode::InvalidArgument),
                                  e.what());
                    // The message names the shape (its last dimension at least).
                    if (e.code() == ErrorCode::InvalidArgument)
                        CHECK_MESSAGE(std::string(e.what()).find(std::to_string(c.shape.back())) !=
                                          std::string::npos,
                                      e.what());
                }
            }
        sentinels.check();
    });
}

TEST_CASE("pinned and registered host memory refuse sizes near 2^64; zero bytes are valid") {
    forEachClient([](ComputeClient &client) {
        Sentinels sentinels(client);
        for (uint64_t size : {uint64_t{SIZE_MAX}, uint64_t{SIZE_MAX - 255}, uint64_t{1} << 63})
            refused([&] { (void)client.allocatePinned(static_cast<size_t>(size)); }, size);
        // allocatePinned(0) is valid like empty(0): transfers of 0 bytes with it do nothing.
        const PinnedBuffer none = client.allocatePinned(0);
        CHECK(none.valid());
        CHECK(none.size() == 0);
        client.write(sentinels.buffers[0], 0, none, 0);
        client.readInto(sentinels.buffers[0], 0, none, 0);
        Buffer b = sentinels.buffers[0];
        refused([&] { client.write(b, 0, none, 4); }, 4, {ErrorCode::InvalidArgument});
        // A registration whose range runs past the address space.
        std::vector<std::byte> mine(4096);
        for (uint64_t size : {uint64_t{SIZE_MAX}, uint64_t{SIZE_MAX - 4095}}) {
            try {
                (void)client.registerHost(mine.data(), static_cast<size_t>(size));
                FAIL("registered " << size << " bytes");
            } catch (const Error &e) {
                CHECK_MESSAGE((e.code() == ErrorCode::InvalidArgument ||
                               e.code() == ErrorCode::Unsupported || // Vulkan: no registration
                               e.code() == ErrorCode::OutOfMemory),
                              e.what());
            }
        }
        sentinels.check();
    });
}

TEST_CASE("views, transfers, copies and fills refuse offsets and sizes that wrap") {
    forEachClient([](ComputeClient &client) {
        Sentinels sentinels(client);
        Buffer a = client.empty(8192);
        Buffer b = client.empty(8192);
        std::vector<std::byte> host(8192);
        const PinnedBuffer pinned = client.allocatePinned(8192);
        for (uint64_t big : {UINT64_MAX, UINT64_MAX - 3, UINT64_MAX - 4095}) {
            CAPTURE(big);
            if (big != UINT64_MAX) CHECK_THROWS_AS((void)a.view(8, big), Error); // MAX: to the end
            CHECK_THROWS_AS((void)a.view(big, 8), Error);
            CHECK_THROWS_AS(client.write(a, big, host.data(), 8192), Error);
            CHECK_THROWS_AS(client.write(a, 8, host.data(), big), Error);
            CHECK_THROWS_AS(client.write(a, big, pinned, 16), Error);
            CHECK_THROWS_AS(client.readInto(a, big, host.data(), 16), Error);
            CHECK_THROWS_AS(client.readInto(a, 16, pinned, big), Error);
            CHECK_THROWS_AS((void)client.read(a, big, 16), Error);
            CHECK_THROWS_AS((void)client.read(a, 16, big - 1), Error);
            CHECK_THROWS_AS(client.copy(a, big, b, 0, 16), Error);
            CHECK_THROWS_AS(client.copy(a, 0, b, big, 16), Error);
            CHECK_THROWS_AS(client.copy(a, 16, b, 0, big), Error);
            CHECK_THROWS_AS(client.fill(a, 1u, big & ~uint64_t{3}, 16), Error);
            CHECK_THROWS_AS(client.fill(a, 1u, 16, (big - 15) & ~uint64_t{3}), Error);
            Tensor t;
            t.buffer = a;
            t.elementSize = 4;
            t.shape = {2, 2};
            t.strides = {big / 4, 1};
            CHECK_THROWS_AS((void)client.readTensor(t), Error);
            CHECK_THROWS_AS(client.writeTensor(t, host.data(), 16), Error);
        }
        sentinels.check();
    });
}

TEST_CASE("readTensor of a broadcast larger than host memory is Error(OutOfMemory), not bad_alloc") {
    // Review finding (previous session): 4 bytes broadcast to 2^61 elements threw std::bad_alloc
    // out of readTensor.
    forEachClient([](ComputeClient &client) {
        Sentinels sentinels(client);
        Buffer a = client.createFrom<uint32_t>(std::vector<uint32_t>{7});
        Tensor t;
        t.buffer = a;
        t.elementSize = 4;
        t.shape = {uint64_t{1} << 30, uint64_t{1} << 29, 2};
        t.strides = {0, 0, 0};
        try {
            (void)client.readTensor(t).wait();
            FAIL("reading 2^63 bytes succeeded");
        } catch (const Error &e) {
            CHECK((e.code() == ErrorCode::OutOfMemory || e.code() == ErrorCode::InvalidArgument));
            CHECK(std::string(e.what()).find("readTensor") != std::string::npos);
        }
        CHECK(client.readAs<uint32_t>(a) == std::vector<uint32_t>{7}); // the client goes on
        sentinels.check();
    });
}

TEST_CASE("a recording refuses the same wrapped sizes as the calls it records") {
    forEachClient([](ComputeClient &client) {
        Sentinels sentinels(client);
        Buffer a = client.empty(8192);
        const PinnedBuffer pinned = client.allocatePinned(64);
        client.beginRecording();
        CHECK_THROWS_AS((void)client.empty(UINT64_MAX - 7), Error);
        CHECK_THROWS_AS(client.fill(a, 1u, 16, UINT64_MAX - 15), Error);
        CHECK_THROWS_AS(client.copy(a, UINT64_MAX - 15, a, 0, 16), Error);
        CHECK_THROWS_AS(client.write(a, UINT64_MAX - 15, pinned, 16), Error);
        const Recording recording = client.endRecording();
        CHECK(recording.operations() == 0);
        client.replay(recording);
        sentinels.check();
    });
}

TEST_CASE("fill(buffer, pattern) fills every byte of a buffer whose size is not a multiple of 4") {
    forEachClient([](ComputeClient &client) {
        for (uint64_t size : {1u, 2u, 3u, 5u, 6u, 7u, 4099u}) {
            CAPTURE(size);
            Buffer whole = client.createFrom<uint8_t>(std::vector<uint8_t>(size + 8, 0xee));
            Buffer b = whole.view(0, size);
            client.fill(b, 0x44332211u);
            const std::vector<uint8_t> got = client.readAs<uint8_t>(whole);
            for (uint64_t i = 0; i < size; ++i) CHECK(got[i] == 0x11 + 0x11 * (i % 4));
            for (uint64_t i = size; i < size + 8; ++i) CHECK(got[i] == 0xee); // past the view
            // The same, recorded and replayed.
            Buffer again = client.createFrom<uint8_t>(std::vector<uint8_t>(size, 0));
            client.beginRecording();
            client.fill(again, 0x44332211u);
            const Recording r = client.endRecording();
            client.replay(r);
            const std::vector<uint8_t> replayed = client.readAs<uint8_t>(again);
            for (uint64_t i = 0; i < size; ++i) CHECK(replayed[i] == 0x11 + 0x11 * (i % 4));
        }
        // An offset that is not a multiple of 4 stays refused, naming the offset.
        Buffer b = client.empty(16);
        refused([&] { client.fill(b, 1u, 2, 4); }, 2, {ErrorCode::InvalidArgument});
    });
}

TEST_CASE("a recorded fill whose tail cannot get pinned memory records nothing") {
    // A small host device whose pinned memory is used up: the fill's 4-byte tail block fails,
    // and the fill of the whole words before it must not stay in the recording.
    for (const char *mode : {"async", "sync"}) {
        CAPTURE(mode);
        Config config;
        config.pluginPathOverride = {MANIFESTS};
        config.probeMode = ProbeMode::InProcess;
        config.cacheEnabled = false;
        config.pluginOptions["host"] =
            std::string(R"({"workers":1,"memory_bytes":16777216,"mode":")") + mode + "\"}";
        const Runtime r(config);
        ComputeClient c = r.open(r.select("host"));
        Buffer b = c.createFrom<uint32_t>(std::vector<uint32_t>(16, 0x11111111u));
        c.sync();
        std::vector<PinnedBuffer> hog;
        for (uint64_t size = 1u << 24; size != 0; size /= 2)
            for (;;) {
                try {
                    hog.push_back(c.allocatePinned(size));
                } catch (const Error &) {
                    break;
                }
            }
        c.beginRecording();
        CHECK_THROWS_AS(c.fill(b, 0xaabbccddu, 0, 5), Error);
        const Recording recording = c.endRecording();
        CHECK(recording.operations() == 0);
        c.replay(recording);
        CHECK(c.readAs<uint32_t>(b) == std::vector<uint32_t>(16, 0x11111111u));
    }
}

TEST_CASE("a launch with a zero block or shared memory the device lacks leaves the device usable") {
    // Host sync runs launches later, on its scheduler: a refusal there used to lose the device.
    const lang::Kernel k = lang::kernel("sizes_set_one", [](lang::Builder &b) {
        auto out = b.inout<uint32_t>();
        out[b.globalId().x] = 1u;
    });
    forEachClient([&](ComputeClient &client) {
        Buffer out = client.createFrom<uint32_t>(std::vector<uint32_t>(4, 0));
        Dispatch zero;
        zero.grid = {4};
        zero.block = {0};
        zero.bindings = {out};
        CHECK_NOTHROW(client.execute(k, zero));
        client.sync();
        CHECK(client.readAs<uint32_t>(out) == std::vector<uint32_t>(4, 0));
        Dispatch shared;
        shared.grid = {4};
        shared.bindings = {out};
        shared.sharedMemoryBytes = client.device().maxSharedMemoryBytes + 64;
        CHECK_THROWS_AS(client.execute(k, shared), Error);
        client.sync();
        Dispatch fine;
        fine.grid = {4};
        fine.bindings = {out};
        client.execute(k, fine);
        CHECK(client.readAs<uint32_t>(out) == std::vector<uint32_t>(4, 1));
    });
}
