// Recorded sequences (suite 'replay'): on every device present (host always, lavapipe in CI, CUDA
// and Vulkan on the GPU machine), with the plugin's graphs and with the core issuing the recorded
// calls (streams.native_recordings = false). Replays must give the results of the unrecorded
// calls, be ordered like them against other streams, keep their memory from the pool while the
// recording lives (tracel-ai/cubecl#1612), and take updates only for later replays. Public API.
#include <backplane/client.hpp>
#include <backplane/config.hpp>
#include <backplane/error.hpp>
#include <backplane/lang.hpp>
#include <backplane/runtime.hpp>

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

using namespace backplane;

namespace {

const Runtime &runtime(bool native) {
    static const auto make = [](bool graphs) {
        Config config;
        config.pluginPathOverride = {MANIFESTS};
        config.probeMode = ProbeMode::InProcess;
        config.cacheEnabled = false;
        config.nativeRecordings = graphs;
        return config;
    };
    static const Runtime withGraphs(make(true));
    static const Runtime withCalls(make(false));
    return native ? withGraphs : withCalls;
}

std::vector<ComputeClient> openAll(bool native) {
    std::vector<ComputeClient> list;
    for (const PhysicalDevice &device : runtime(native).devices())
        for (const DeviceInfo &route : device.routes)
            list.push_back(runtime(native).open(runtime(native).select(route.id())));
    return list;
}

/// One client per device present, per replay mode. Made after the runtimes (whose plugins
/// register their own exit-time destructors), so the clients are destroyed first at exit.
std::vector<ComputeClient> &clients(bool native) {
    static std::vector<ComputeClient> withGraphs = openAll(true);
    static std::vector<ComputeClient> withCalls = openAll(false);
    return native ? withGraphs : withCalls;
}

/// Runs `body` for every device in both modes, naming the device and mode in failures.
template <class F> void forEachClient(F &&body) {
    for (bool native : {true, false})
        for (ComputeClient &client : clients(native)) {
            const std::string where =
                client.device().id() + (native ? " (native graphs)" : " (recorded calls)");
            INFO(where);
            body(client, native);
        }
}

/// y[i] = a * x[i] + y[i] for i < n, in u32 (wraps): exact on every device.
const lang::Kernel &scaleAdd() {
    static const lang::Kernel k = lang::kernel("replay_scale_add", [](lang::Builder &b) {
        auto x = b.input<uint32_t>();
        auto y = b.inout<uint32_t>();
        auto a = b.scalar<uint32_t>();
        auto n = b.scalar<uint32_t>();
        auto i = b.globalId().x;
        b.If(i < n, [&] { y[i] = a * x[i] + y[i]; });
    });
    return k;
}

/// out[i] = v for i < n.
const lang::Kernel &setValue() {
    static const lang::Kernel k = lang::kernel("replay_set_value", [](lang::Builder &b) {
        auto out = b.output<uint32_t>();
        auto v = b.scalar<uint32_t>();
        auto n = b.scalar<uint32_t>();
        auto i = b.globalId().x;
        b.If(i < n, [&] { out[i] = v; });
    });
    return k;
}

Dispatch over(uint32_t n, std::vector<Buffer> bindings) {
    Dispatch d;
    d.block = {64, 1, 1};
    d.grid = {(n + 63) / 64, 1, 1};
    d.bindings = std::move(bindings);
    return d;
}

void scaleAddOn(ComputeClient &c, const Buffer &x, const Buffer &y, uint32_t a, uint32_t n) {
    c.execute(scaleAdd(), over(n, {x, y}).scalar(a).scalar(n));
}

void setValueOn(ComputeClient &c, const Buffer &out, uint32_t v, uint32_t n) {
    c.execute(setValue(), over(n, {out}).scalar(v).scalar(n));
}

std::vector<uint32_t> randomWords(size_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<uint32_t> v(n);
    for (uint32_t &w : v) w = rng();
    return v;
}

Buffer upload(ComputeClient &c, const std::vector<uint32_t> &words) {
    return c.create(words.data(), words.size() * 4);
}

std::vector<uint32_t> words(ComputeClient &c, const Buffer &b) { return c.readAs<uint32_t>(b); }

// A host-dialect kernel that waits for a gate (host plugin only): holds a stream busy so that a
// test can issue work behind it and check what that work sees once the gate opens.
std::atomic<bool> gateOpen{true};

void gatedSet(const bp_host_kernel_context *c) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!gateOpen.load() && std::chrono::steady_clock::now() < until)
        std::this_thread::sleep_for(std::chrono::microseconds(100));
    if (c->workgroup[0] != 0) return;
    uint32_t value;
    std::memcpy(&value, c->scalars, 4);
    auto *out = static_cast<uint32_t *>(c->buffers[0]);
    for (uint64_t i = 0; i < c->buffer_sizes[0] / 4; ++i) out[i] = value;
}

KernelSource gatedSetKernel() {
    return {"replay_gated_set", {KernelVariant::host(&gatedSet, "replay_gated_set")}};
}

bool isHost(const ComputeClient &c) { return c.device().accepts(Dialect::Host) &&
                                              !c.device().accepts(Dialect::Glsl) &&
                                              !c.device().accepts(Dialect::Cuda); }

} // namespace

TEST_CASE("a replayed sequence gives the results of the same calls issued again") {
    forEachClient([](ComputeClient &c, bool native) {
        constexpr uint32_t n = 1000;
        const uint64_t bytes = n * 4;
        const auto x0 = randomWords(n, 1), y0 = randomWords(n, 2), w0 = randomWords(n, 3);
        PinnedBuffer in = c.allocatePinned(bytes), outDirect = c.allocatePinned(bytes),
                     outReplay = c.allocatePinned(bytes);

        // The sequence: two kernels, a copy, a fill, a pinned upload and download.
        const auto step = [&](Buffer &x, Buffer &y, Buffer &z, Buffer &w, PinnedBuffer &out) {
            scaleAddOn(c, x, y, 3, n);
            c.copy(y, 0, z, 0, bytes);
            scaleAddOn(c, z, x, 5, n);
            c.fill(y, 0x01010101u, 0, bytes / 2);
            c.write(w, 0, in, bytes);
            scaleAddOn(c, w, y, 7, n);
            c.readInto(y, 0, out, bytes);
        };
        Buffer x1 = upload(c, x0), y1 = upload(c, y0), z1 = c.empty(bytes), w1 = upload(c, w0);
        Buffer x2 = upload(c, x0), y2 = upload(c, y0), z2 = c.empty(bytes), w2 = upload(c, w0);

        c.beginRecording();
        CHECK(c.recording());
        step(x2, y2, z2, w2, outReplay);
        Recording recording = c.endRecording();
        CHECK_FALSE(c.recording());
        CHECK(recording.operations() == 7);
        CHECK(recording.launches() == 3);
        MESSAGE(c.device().id() << ": " << recording.replayNote());
        if (!native) CHECK_FALSE(recording.native());
        if (native && isHost(c)) CHECK(recording.native());
        // Nothing ran while recording: y2 still holds its first value.
        CHECK(words(c, y2) == y0);

        for (uint32_t round = 0; round < 4; ++round) {
            // The pinned input changes between rounds: a replay reads it when it runs.
            const auto fresh = randomWords(n, 100 + round);
            std::memcpy(in.data(), fresh.data(), bytes);
            step(x1, y1, z1, w1, outDirect);
            c.sync();
            c.replay(recording);
            c.sync();
            INFO("round " << round);
            CHECK(words(c, x2) == words(c, x1));
            CHECK(words(c, y2) == words(c, y1));
            CHECK(words(c, z2) == words(c, z1));
            CHECK(words(c, w2) == words(c, w1));
            CHECK(std::memcmp(outReplay.data(), outDirect.data(), bytes) == 0);
        }
    });
}

TEST_CASE("the pool never hands out memory a recording uses, even after its buffers were dropped") {
    // tracel-ai/cubecl#1612: a temporary allocated while recording and dropped afterwards went
    // back to the pool, a new buffer got its memory, and every replay overwrote that buffer.
    forEachClient([](ComputeClient &c, bool) {
        constexpr uint32_t n = 4096;
        const uint64_t bytes = n * 4;
        Buffer out = upload(c, std::vector<uint32_t>(n, 100));
        c.beginRecording();
        {
            Buffer temporary = c.empty(bytes);
            setValueOn(c, temporary, 7, n);
            Buffer ones = c.empty(bytes);
            setValueOn(c, ones, 1, n);
            scaleAddOn(c, temporary, out, 1, n); // out += 7
            scaleAddOn(c, ones, out, 2, n);      // out += 2
        } // the application drops its temporaries here
        Recording recording = c.endRecording();
        c.memoryCleanup(); // cached pages go back: the recording's must stay

        std::vector<Buffer> others;
        for (int i = 0; i < 32; ++i) {
            others.push_back(c.empty(bytes));
            c.fill(others.back(), 0xABABABABu);
        }
        c.replay(recording);
        c.replay(recording);
        c.sync();
        CHECK(words(c, out) == std::vector<uint32_t>(n, 100 + 2 * 9));
        for (size_t i = 0; i < others.size(); ++i) {
            INFO("buffer " << i << " allocated after the recording");
            CHECK(words(c, others[i]) == std::vector<uint32_t>(n, 0xABABABABu));
        }
    });
}

TEST_CASE("a replay waits for earlier work on other streams that uses its buffers") {
    forEachClient([](ComputeClient &c, bool) {
        if (!isHost(c)) return; // the gate is a host kernel
        constexpr uint32_t n = 256;
        const uint64_t bytes = n * 4;
        Buffer src = upload(c, std::vector<uint32_t>(n, 1));
        Buffer dst = upload(c, std::vector<uint32_t>(n, 0));
        Recording recording;
        {
            StreamGuard streamA(9001);
            c.beginRecording();
            scaleAddOn(c, src, dst, 2, n); // dst += 2 * src
            recording = c.endRecording();
        }
        gateOpen = false;
        {
            StreamGuard streamB(9002);
            Dispatch d;
            d.bindings = {src};
            d.scalar(uint32_t{5});
            c.execute(gatedSetKernel(), d); // src = 5 once the gate opens
            c.flush();
        }
        {
            StreamGuard streamA(9001);
            c.replay(recording);
            c.flush();
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
            gateOpen = true;
            c.sync();
        }
        CHECK(words(c, dst) == std::vector<uint32_t>(n, 10));
        c.syncAll();
        (void)bytes;
    });
}

TEST_CASE("an update changes later replays and leaves replays already issued as they were") {
    forEachClient([](ComputeClient &c, bool) {
        constexpr uint32_t n = 512;
        Buffer a = upload(c, std::vector<uint32_t>(n, 0));
        Buffer b = upload(c, std::vector<uint32_t>(n, 0));
        Buffer gate = c.empty(4);
        c.beginRecording();
        setValueOn(c, a, 1, n);
        Recording recording = c.endRecording();
        REQUIRE(recording.launches() == 1);

        const bool gated = isHost(c);
        if (gated) {
            // Hold the stream: the first replay is still queued when the update comes.
            gateOpen = false;
            Dispatch d;
            d.bindings = {gate};
            d.scalar(uint32_t{0});
            c.execute(gatedSetKernel(), d);
        }
        c.replay(recording);
        recording.update(0, setValue(), over(n, {b}).scalar(uint32_t{2}).scalar(n));
        c.replay(recording);
        if (gated) {
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
            gateOpen = true;
        }
        c.sync();
        CHECK(words(c, a) == std::vector<uint32_t>(n, 1));
        CHECK(words(c, b) == std::vector<uint32_t>(n, 2));

        // The old binding was dropped by the update: the recording no longer holds it.
        recording.update(0, setValue(), over(n, {a}).scalar(uint32_t{3}).scalar(n));
        c.replay(recording);
        c.sync();
        CHECK(words(c, a) == std::vector<uint32_t>(n, 3));
        CHECK(words(c, b) == std::vector<uint32_t>(n, 2));
    });
}

TEST_CASE("updates that would change a recorded launch's shape are refused and change nothing") {
    ComputeClient &c = clients(true).front();
    constexpr uint32_t n = 64;
    Buffer a = upload(c, std::vector<uint32_t>(n, 0));
    Buffer x = upload(c, std::vector<uint32_t>(n, 1));
    c.beginRecording();
    setValueOn(c, a, 4, n);
    Recording recording = c.endRecording();
    const auto refused = [&](auto &&call, const std::string &needle) {
        try {
            call();
            FAIL("accepted");
        } catch (const Error &e) {
            CHECK(std::string(toString(e.code())) == toString(ErrorCode::InvalidArgument));
            INFO(e.what());
            CHECK(std::string(e.what()).find(needle) != std::string::npos);
        }
    };
    refused([&] { recording.update(1, over(n, {a})); }, "launch 1 does not exist");
    refused([&] { recording.update(0, setValue(), over(n, {a, x}).scalar(1u).scalar(n)); },
            "the kernel declares 1"); // the portable kernel's own check
    refused([&] { recording.update(0, scaleAdd(), over(n, {x, a}).scalar(1u).scalar(n)); },
            "keeps its kernel");
    refused([&] { recording.update(0, over(n, {a}).scalar(1u)); }, "scalar bytes");
    Dispatch wider = over(n, {a});
    wider.block = {128, 1, 1};
    refused([&] { recording.update(0, setValue(), wider.scalar(1u).scalar(n)); },
            "block size cannot change");
    c.replay(recording);
    c.sync();
    CHECK(words(c, a) == std::vector<uint32_t>(n, 4));
}

TEST_CASE("calls that must run now are refused while the stream records, on that stream only") {
    ComputeClient &c = clients(true).front();
    constexpr uint32_t n = 64;
    const uint64_t bytes = n * 4;
    std::vector<uint32_t> host(n, 9);
    Buffer a = upload(c, host);
    c.beginRecording();
    const auto refused = [&](auto &&call, const std::string &needle) {
        try {
            call();
            FAIL("accepted");
        } catch (const Error &e) {
            CHECK(std::string(toString(e.code())) == toString(ErrorCode::InvalidArgument));
            INFO(e.what());
            CHECK(std::string(e.what()).find(needle) != std::string::npos);
        }
    };
    refused([&] { c.write(a, 0, host.data(), bytes); }, "is recording");
    refused([&] { c.write(a, 0, host.data(), bytes); }, "write() of pageable");
    refused([&] { (void)c.create(host.data(), bytes); }, "create()");
    refused([&] { (void)c.read(a); }, "read()");
    refused([&] { c.readInto(a, 0, host.data(), bytes); }, "readInto()");
    refused([&] { c.sync(); }, "sync()");
    refused([&] { (void)c.profileStart(); }, "profileStart()");
    refused([&] { c.beginRecording(); }, "already recording");
    {
        // Another stream works as usual meanwhile.
        StreamGuard other(4242);
        CHECK_FALSE(c.recording());
        CHECK(words(c, a) == host);
    }
    {
        // So does another thread on the same stream id: only this thread's calls are recorded.
        const StreamId shared = ComputeClient::currentStream();
        std::vector<uint32_t> seen;
        std::thread([&] {
            StreamGuard same(shared);
            CHECK_FALSE(c.recording());
            c.fill(a, 5u);
            seen = words(c, a);
        }).join();
        CHECK(seen == std::vector<uint32_t>(n, 5));
    }
    Recording empty = c.endRecording();
    CHECK(empty.operations() == 0);
    c.replay(empty); // nothing to do
    try {
        (void)c.endRecording();
        FAIL("accepted");
    } catch (const Error &e) {
        CHECK(std::string(e.what()).find("is not recording") != std::string::npos);
    }
    try {
        c.replay(Recording{});
        FAIL("accepted");
    } catch (const Error &e) {
        CHECK(std::string(toString(e.code())) == toString(ErrorCode::InvalidArgument));
    }
    // A recording of one client is refused by another.
    ComputeClient &other = clients(false).front();
    try {
        other.replay(empty);
        FAIL("accepted");
    } catch (const Error &e) {
        CHECK(std::string(e.what()).find("another client") != std::string::npos);
    }
}

TEST_CASE("replays from many threads on many streams match the same calls counted in order") {
    // Every thread replays one shared recording (y += x) and issues the same call unrecorded,
    // on its own stream: all of them touch y, so the engine must order them across streams.
    forEachClient([](ComputeClient &c, bool) {
        constexpr uint32_t n = 1u << 18; // long enough kernels for unordered ones to overlap
        constexpr int threads = 4, rounds = 25;
        Buffer x = upload(c, std::vector<uint32_t>(n, 1));
        Buffer y = upload(c, std::vector<uint32_t>(n, 0));
        c.beginRecording();
        scaleAddOn(c, x, y, 1, n);
        scaleAddOn(c, x, y, 1, n);
        Recording recording = c.endRecording();
        std::vector<std::thread> pool;
        std::atomic<int> failures{0};
        for (int t = 0; t < threads; ++t)
            pool.emplace_back([&, t] {
                try {
                    StreamGuard stream(7000 + t);
                    std::mt19937 rng(t);
                    for (int r = 0; r < rounds; ++r) {
                        if (rng() % 2) c.replay(recording);
                        else {
                            scaleAddOn(c, x, y, 1, n);
                            scaleAddOn(c, x, y, 1, n);
                        }
                    }
                    c.sync();
                } catch (...) {
                    ++failures;
                }
            });
        for (std::thread &t : pool) t.join();
        c.syncAll();
        CHECK(failures == 0);
        CHECK(words(c, y) == std::vector<uint32_t>(n, 2 * threads * rounds));
    });
}

TEST_CASE("a thread that ends while recording leaves no recording and no memory behind") {
    ComputeClient &c = clients(true).front();
    constexpr uint32_t n = 1u << 18; // 1 MiB
    constexpr StreamId kShared = 31337;
    Buffer out = upload(c, std::vector<uint32_t>(n, 0));
    c.memoryCleanup();
    const uint64_t inUse = c.memoryUsage().bytesInUse;
    std::thread([&] {
        StreamGuard stream(kShared);
        c.beginRecording();
        Buffer temporary = c.empty(n * 4);
        setValueOn(c, temporary, 1, n);
        // ends without endRecording()
    }).join();
    std::string failure;
    std::thread([&] {
        // A later thread, possibly with the same std::thread::id, on the same stream id.
        try {
            StreamGuard stream(kShared);
            if (c.recording()) failure = "the later thread's stream is still recording";
            setValueOn(c, out, 42, n);
            c.sync();
        } catch (const std::exception &e) {
            failure = e.what();
        }
    }).join();
    CHECK(failure == "");
    CHECK(words(c, out) == std::vector<uint32_t>(n, 42));
    c.memoryCleanup();
    CHECK(c.memoryUsage().bytesInUse == inUse);
}

TEST_CASE("a launch the device would refuse is refused when it is recorded, not later") {
    forEachClient([](ComputeClient &c, bool) {
        constexpr uint32_t n = 64;
        Buffer a = upload(c, std::vector<uint32_t>(n, 0));
        c.beginRecording();
        Dispatch tooWide = over(n, {a}).scalar(1u).scalar(n);
        tooWide.grid[0] = c.device().maxGridSize[0] + 1;
        try {
            c.execute(setValue(), tooWide);
            FAIL("accepted");
        } catch (const Error &e) {
            CHECK(std::string(toString(e.code())) == toString(ErrorCode::Launch));
            INFO(e.what());
            CHECK(std::string(e.what()).find("grid dimension 0") != std::string::npos);
        }
        setValueOn(c, a, 6, n); // the recording goes on
        Recording recording = c.endRecording();
        CHECK(recording.operations() == 1);
        c.replay(recording);
        c.sync();
        CHECK(words(c, a) == std::vector<uint32_t>(n, 6));
    });
}

TEST_CASE("an op the plugin's graphs refuse is replayed by the core instead of lost") {
    // A PinnedBuffer of another device: the calls take it, Vulkan's graphs do not.
    std::vector<ComputeClient> &all = clients(true);
    if (all.size() < 2) {
        MESSAGE("one device only: nothing to mix");
        return;
    }
    constexpr uint32_t n = 256;
    for (ComputeClient &c : all) {
        ComputeClient &other = &c == &all.front() ? all.back() : all.front();
        const std::string where = c.device().id() + " with a PinnedBuffer of " + other.device().id();
        INFO(where);
        PinnedBuffer foreign = other.allocatePinned(n * 4);
        Buffer a = upload(c, std::vector<uint32_t>(n, 0));
        c.beginRecording();
        c.write(a, 0, foreign, n * 4);
        Recording recording = c.endRecording();
        MESSAGE(where << ": " << recording.replayNote());
        for (uint32_t round = 1; round <= 2; ++round) {
            std::vector<uint32_t> fresh(n, round * 11);
            std::memcpy(foreign.data(), fresh.data(), n * 4);
            c.replay(recording);
            c.sync();
            CHECK(words(c, a) == fresh);
        }
    }
}

