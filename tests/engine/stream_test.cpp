// Streams on the host plugin: threads x streams exchanging buffers, GC protection of buffers in
// flight on another stream, zero events without sharing, scheduler streams in sync mode (tests
// internals: opens the plugin through detail::PluginLibrary, backplane_internal_dep).
#include "host_fixture.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <thread>
#include <vector>

using namespace backplane;
using namespace enginetest;


TEST_CASE("threads on several streams exchange buffers and every element is right") {
    ComputeClient client = openHost(R"({"mode":"async","workers":2})");
    const int threads = 6;
    const int rounds = 20;
    const uint32_t n = 2048;
    // Each thread writes its buffer, then reads the previous thread's buffer of the same round
    // into its own output with a kernel; the reading thread checks every element.
    std::vector<std::vector<Buffer>> inputs(threads, std::vector<Buffer>(rounds));
    std::vector<std::atomic<int>> published(threads);
    std::atomic<int> wrong{0};
    std::vector<std::thread> workers;
    for (int t = 0; t < threads; ++t)
        workers.emplace_back([&, t] {
            StreamGuard guard(static_cast<StreamId>(10 + t));
            for (int r = 0; r < rounds; ++r) {
                std::vector<float> x(n);
                for (uint32_t i = 0; i < n; ++i) x[i] = static_cast<float>(t * 1000 + r + i);
                inputs[t][r] = client.createFrom<float>(x);
                published[t].store(r + 1);
                const int peer = (t + threads - 1) % threads;
                while (published[peer].load() < r + 1) std::this_thread::yield();
                Buffer px = inputs[peer][r];
                std::vector<float> y(n, 0.5f);
                Buffer by = client.createFrom<float>(y);
                client.execute(saxpyKernel(), saxpyDispatch(px, by, 3.0f, n));
                const auto out = client.readAs<float>(by);
                for (uint32_t i = 0; i < n; ++i)
                    if (out[i] != 3.0f * static_cast<float>(peer * 1000 + r + i) + 0.5f) ++wrong;
            }
        });
    for (auto &w : workers) w.join();
    CHECK(wrong.load() == 0);
    CHECK(client.stats().alignmentEvents > 0);
}

TEST_CASE("a buffer freed on one stream while another still reads it is not reused early") {
    ComputeClient client = openHost();
    const uint32_t n = 1 << 16;
    const StreamId a = 1, b = 2;
    Buffer out;
    const void *oldId = nullptr;
    {
        StreamGuard onA(a);
        std::vector<uint32_t> old(n, 111);
        Buffer src = client.createFrom<uint32_t>(old);
        oldId = src.id();
        out = client.empty(n * 4);
        client.sync();
        gateOpen = false;
        {
            StreamGuard onB(b);
            Dispatch d;
            d.block = {256, 1, 1};
            d.grid = {n / 256, 1, 1};
            d.bindings = {src, out};
            d.scalar(n);
            client.execute(gatedCopyKernel(), d); // B waits for A, then spins on the gate
            client.flush();
        }
        // Drop the only handle on A while B's kernel is still gated, and reuse the size on A.
        src = Buffer();
        std::vector<uint32_t> fresh(n, 222);
        Buffer reuse = client.createFrom<uint32_t>(fresh);
        client.flush();
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        gateOpen = true;
        client.sync();
        CHECK(client.readAs<uint32_t>(reuse) == fresh);
    }
    StreamGuard onB(b);
    const auto seen = client.readAs<uint32_t>(out);
    REQUIRE(seen.size() == n);
    CHECK(seen.front() == 111);
    CHECK(seen.back() == 111);
    client.memoryCleanup(); // drains the GC thread
    CHECK(client.stats().gcReleases >= 1);
    (void)oldId;
}

TEST_CASE("streams that share nothing create no alignment events") {
    ComputeClient client = openHost();
    std::vector<std::thread> workers;
    for (int t = 0; t < 4; ++t)
        workers.emplace_back([&, t] {
            StreamGuard guard(static_cast<StreamId>(t));
            std::vector<float> x(1000, 1.0f);
            for (int r = 0; r < 20; ++r) {
                Buffer bx = client.createFrom<float>(x);
                Buffer by = client.createFrom<float>(x);
                client.execute(saxpyKernel(), saxpyDispatch(bx, by, 1.0f, 1000));
                CHECK(client.readAs<float>(by)[999] == 2.0f);
            }
        });
    for (auto &w : workers) w.join();
    const EngineStats stats = client.stats();
    CHECK(stats.alignmentEvents == 0);
    CHECK(stats.streamWaits == 0);
}

TEST_CASE("a buffer written on another stream is read after that write") {
    ComputeClient client = openHost();
    const uint32_t n = 1 << 16;
    Buffer shared;
    {
        StreamGuard onA(5);
        shared = client.empty(n * 4);
        client.fill(shared, 1);
    }
    {
        StreamGuard onB(6);
        std::vector<uint32_t> data(n, 9);
        client.write(shared, 0, data.data(), n * 4);
    }
    StreamGuard onA(5);
    const auto seen = client.readAs<uint32_t>(shared);
    CHECK(seen.front() == 9);
    CHECK(seen.back() == 9);
}

TEST_CASE("scheduler streams drive a plugin without async streams") {
    for (const SchedulerMode mode : {SchedulerMode::Interleave, SchedulerMode::Sequential}) {
        CAPTURE(toString(mode));
        Config config;
        config.schedulerMode = mode;
        config.schedulerMaxTasks = 4;
        ComputeClient client = openHost(R"({"mode":"sync"})", config);
        const uint32_t n = 5000;
        std::vector<float> x(n, 2.0f), y(n, 1.0f);
        Buffer bx, by;
        {
            StreamGuard onA(1);
            bx = client.createFrom<float>(x);
        }
        StreamGuard onB(2);
        by = client.createFrom<float>(y);
        for (int i = 0; i < 10; ++i) client.execute(saxpyKernel(), saxpyDispatch(bx, by, 1.0f, n));
        const auto out = client.readAs<float>(by);
        CHECK(out[0] == 21.0f);
        CHECK(out[n - 1] == 21.0f);
        CHECK(client.stats().schedulerFlushes > 0);
    }
}
