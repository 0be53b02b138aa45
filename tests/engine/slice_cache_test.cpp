// The per-stream slice caches (core/src/memory/slice_cache.hpp) on the host plugin: a slice
// handed out again without the engine lock still carries its hazards, and the caches never make
// an allocation fail, keep a page, grow the footprint, falsify the usage report or outlive their
// client. Gated kernels (host_fixture.hpp) hold the hazard windows open (tests internals:
// detail::serverOf for the cache's hit count, backplane_internal_dep).
#include "host_fixture.hpp"

#include "server/compute_server.hpp"

#include <doctest/doctest.h>

#include <array>
#include <cstring>
#include <optional>
#include <random>
#include <thread>
#include <vector>

using namespace backplane;
using backplane::detail::SliceCache;
using namespace enginetest;
using namespace std::chrono_literals;

namespace {

constexpr uint64_t kMiB = 1ull << 20;

// One workgroup thread per device: a gated kernel blocks its own stream's worker only.
constexpr const char *kAsync = R"({"mode":"async","workers":1})";
// 64 MiB of device memory: one sliced page of 16 MiB serving up to 2 MiB (eight 2 MiB slices
// fill it), larger requests on exclusive pages.
constexpr const char *kAsync64 = R"({"mode":"async","workers":1,"memory_bytes":67108864})";

constexpr StreamId kA = 1;
constexpr StreamId kB = 2;

/// Time a wrong engine gets to run work it should hold back (correctness never depends on it).
constexpr auto kMisbehaveTime = 100ms;

/// A host client with the slice cache on (memory.slice_cache is off by default in this version:
/// docs/performance.md).
ComputeClient openCached(const std::string &options = R"({"mode":"async"})", Config config = {}) {
    config.sliceCache = true;
    return openHost(options, config);
}

uint64_t cacheHits(const ComputeClient &client) {
    return detail::serverOf(client)->sliceCacheHits();
}

std::vector<uint32_t> words(const std::vector<std::byte> &bytes) {
    std::vector<uint32_t> out(bytes.size() / 4);
    std::memcpy(out.data(), bytes.data(), out.size() * 4);
    return out;
}

size_t countNot(const std::vector<uint32_t> &values, uint32_t expected) {
    size_t wrong = 0;
    for (uint32_t v : values) wrong += v != expected ? 1 : 0;
    return wrong;
}

/// Stream B fills `z` while gate 0's kernel (which copies 0xAAAAAAAA into the bytes z reuses)
/// is held; once the gate opens, z must still hold B's fill everywhere.
void checkBsFillSurvivesTheOldKernel(ComputeClient &client, Gate<0> &gate, const Buffer &z) {
    ReadFuture early;
    {
        StreamGuard onB(kB);
        client.fill(z, 0xB0B0B0B0u);
        early = client.read(z);
        client.flush();
    }
    std::this_thread::sleep_for(kMisbehaveTime);
    gate.open();
    const std::vector<uint32_t> first = words(early.wait());
    client.syncAll();
    StreamGuard onB(kB);
    const std::vector<uint32_t> later = client.readAs<uint32_t>(z);
    INFO("0xAAAAAAAA is the old kernel's output landing in the new buffer after B's fill");
    CHECK(countNot(first, 0xB0B0B0B0u) == 0);
    CHECK(countNot(later, 0xB0B0B0B0u) == 0);
}

} // namespace

// ----- hazards ----------------------------------------------------------------------------------

TEST_CASE("a slice freed while its kernel runs and taken back from the cache waits for that "
          "kernel on another stream") {
    ComputeClient client = openCached(kAsync);
    Gate<0> gate;
    Watchdog watchdog;
    const uint32_t n = 16384;
    const uint64_t bytes = uint64_t{n} * 4;
    Buffer y;
    {
        StreamGuard onA(kA);
        Buffer src = client.empty(bytes);
        client.fill(src, 0xAAAAAAAAu);
        Buffer x = client.empty(bytes);
        client.execute(Gate<0>::kernel(), Gate<0>::copy(src, x, n));
        client.flush();
        REQUIRE(watchdog.waitUntil([&] { return gate.entered() > 0; }));
        const void *xSlice = x.id();
        x = Buffer(); // into stream A's cache, its kernel still pending
        const uint64_t hits = cacheHits(client);
        y = client.empty(bytes);
        REQUIRE(cacheHits(client) == hits + 1); // the cache served y: x's slice, whole
        CHECK(y.id() == xSlice);
    }
    checkBsFillSurvivesTheOldKernel(client, gate, y);
    CHECK_FALSE(watchdog.fired());
}

TEST_CASE("a cached slice passes a pending use it inherited from another stream to its next "
          "owner") {
    ComputeClient client = openCached(kAsync64);
    Gate<0> gate;
    Watchdog watchdog;
    const uint32_t n = static_cast<uint32_t>(2 * kMiB / 4);
    std::vector<Buffer> page;
    {
        // Eight 2 MiB slices fill the one sliced page; the gated kernel writes the second.
        StreamGuard onA(kA);
        for (int i = 0; i < 8; ++i) page.push_back(client.empty(2 * kMiB));
        REQUIRE(client.stats().pageAllocations == 1);
        client.fill(page[0], 0xAAAAAAAAu);
        client.execute(Gate<0>::kernel(), Gate<0>::copy(page[0], page[1], n));
        client.flush();
        REQUIRE(watchdog.waitUntil([&] { return gate.entered() > 0; }));
        page[1] = Buffer(); // into stream A's cache
    }
    client.memoryUsage(); // flushes the caches: the range is free again, its use still pending
    Buffer z;
    {
        StreamGuard onB(kB);
        // The only free range left: y inherits A's pending use, and dies unused into B's cache.
        Buffer y = client.empty(2 * kMiB);
        CHECK(client.stats().pageAllocations == 1);
        y = Buffer();
        const uint64_t hits = cacheHits(client);
        z = client.empty(2 * kMiB);
        REQUIRE(cacheHits(client) == hits + 1);
    }
    checkBsFillSurvivesTheOldKernel(client, gate, z);
    CHECK_FALSE(watchdog.fired());
}

TEST_CASE("a slice reused from its own stream's cache follows stream order without events "
          "(guard)") {
    ComputeClient client = openCached(kAsync);
    Gate<0> gate;
    Watchdog watchdog;
    const uint32_t n = 16384;
    StreamGuard onA(kA);
    Buffer src = client.empty(uint64_t{n} * 4);
    client.fill(src, 0xAAAAAAAAu);
    Buffer x = client.empty(uint64_t{n} * 4);
    client.execute(Gate<0>::kernel(), Gate<0>::copy(src, x, n));
    client.flush();
    x = Buffer();
    const uint64_t hits = cacheHits(client);
    Buffer y = client.empty(uint64_t{n} * 4);
    REQUIRE(cacheHits(client) == hits + 1);
    client.fill(y, 0x55555555u);
    ReadFuture future = client.read(y);
    std::this_thread::sleep_for(kMisbehaveTime);
    gate.open();
    CHECK(countNot(words(future.wait()), 0x55555555u) == 0);
    CHECK_FALSE(watchdog.fired());
    CHECK(client.stats().alignmentEvents == 0);
    CHECK(client.stats().streamWaits == 0);
}

// ----- cached memory is free memory -------------------------------------------------------------

TEST_CASE("memoryCleanup gives back a page whose only slice waits in a cache") {
    ComputeClient client = openCached(kAsync);
    {
        StreamGuard onA(kA);
        Buffer b = client.empty(kMiB);
    } // cached
    client.memoryCleanup();
    CHECK(client.stats().pageReleases == 1);
    CHECK(client.memoryUsage().pageCount == 0);
}

TEST_CASE("the out-of-memory retry takes back what eight streams' caches hold") {
    ComputeClient client = openCached(kAsync64);
    for (StreamId s = 1; s <= 8; ++s) {
        StreamGuard guard(s);
        Buffer b = client.empty(2 * kMiB); // the eight fill the 16 MiB sliced page
    }
    REQUIRE(client.stats().pageAllocations == 1);
    StreamGuard onA(kA);
    try {
        Buffer big = client.empty(60 * kMiB); // fits only once the sliced page went back
        CHECK(big.size() == 60 * kMiB);
        CHECK(client.stats().outOfMemoryRetries == 1);
    } catch (const Error &e) {
        FAIL_CHECK("60 MiB with the OOM retry: Error(" << toString(e.code())
                                                       << "): " << std::string(e.what()));
    }
}

TEST_CASE("the periodic release gives back a page whose only slice waits in a cache") {
    Config config;
    config.releaseIdleAfterMs = 0; // a check on every allocation from the pool
    ComputeClient client = openCached(kAsync64, config);
    {
        StreamGuard onA(kA);
        Buffer x = client.empty(kMiB); // the sliced page; x waits in A's cache
    }
    StreamGuard onB(kB);
    Buffer large = client.empty(4 * kMiB); // an exclusive page, through the pool and its check
    CHECK(client.stats().pageReleases == 1);
    CHECK(client.stats().pageAllocations == 2);
}

TEST_CASE("a stream served only by its cache still runs the periodic release") {
    Config config;
    config.releaseIdleAfterMs = 0;
    ComputeClient client = openCached(kAsync64, config);
    std::optional<Buffer> large;
    {
        StreamGuard onB(kB);
        large = client.empty(4 * kMiB); // an exclusive page
    }
    StreamGuard onA(kA);
    { Buffer first = client.empty(kMiB); } // the last allocation from the pool: A's cache has it
    large.reset(); // the exclusive page is idle; only a check of the pool can give it back
    const uint64_t hits = cacheHits(client);
    for (int i = 0; i < 200; ++i) Buffer b = client.empty(kMiB);
    CHECK(cacheHits(client) >= hits + SliceCache::kMaintenancePeriod);
    CHECK(client.stats().pageReleases >= 1);
}

TEST_CASE("memory usage counts cached slices as free and a reused slice at its new size") {
    ComputeClient client = openCached(kAsync);
    StreamGuard onA(kA);
    Buffer b = client.empty(1000);
    const MemoryUsage live = client.memoryUsage();
    CHECK(live.bytesInUse == 1000);
    CHECK(live.allocationCount == 1);
    const uint64_t reserved = 1000 + live.bytesPadding;
    b = Buffer(); // cached
    const MemoryUsage cached = client.memoryUsage();
    CHECK(cached.bytesInUse == 0);
    CHECK(cached.bytesPadding == 0);
    CHECK(cached.allocationCount == 0);
    CHECK(cached.bytesReserved == live.bytesReserved);

    b = client.empty(1000);
    client.memoryUsage(); // the report flushed the cache: b came from the pool
    b = Buffer();         // cached again
    const uint64_t hits = cacheHits(client);
    Buffer c = client.empty(reserved - 100); // the same aligned size, fewer bytes requested
    REQUIRE(cacheHits(client) == hits + 1);
    const MemoryUsage reused = client.memoryUsage();
    CHECK(reused.bytesInUse == reserved - 100);
    CHECK(reused.bytesPadding == 100);
    CHECK(reused.allocationCount == 1);
    c = Buffer();
    const MemoryUsage after = client.memoryUsage();
    CHECK(after.bytesInUse == 0);
    CHECK(after.bytesPadding == 0);
    CHECK(after.allocationCount == 0);
}

TEST_CASE("sixteen streams that each free a slice do not make the pool grow") {
    ComputeClient client = openCached(kAsync64);
    for (StreamId s = 1; s <= 16; ++s) {
        StreamGuard guard(s);
        Buffer b = client.empty(2 * kMiB); // eight of them fill the page
    }
    CHECK(client.stats().pageAllocations == 1);
    CHECK(client.memoryUsage().pageCount == 1);
}

TEST_CASE("a closed client's caches hold nothing") {
    std::optional<ComputeClient> client = openCached(kAsync);
    Buffer late;
    {
        StreamGuard onA(kA);
        Buffer cached = client->empty(kMiB);
        late = client->empty(kMiB);
    } // `cached` waits in A's cache
    // The slice's queue holds the caches; cached slices hold the queue.
    const std::weak_ptr<detail::FreeQueue> queue =
        static_cast<const detail::Slice *>(late.id())->queue;
    client.reset(); // closes: nothing may stay cached
    late = Buffer(); // dies after the close: must not be cached either
    CHECK(queue.expired());
}

// ----- threads ----------------------------------------------------------------------------------

TEST_CASE("threads allocating and dropping buffers on shared streams never alias them and keep "
          "the usage report exact") {
    ComputeClient client = openCached(R"({"mode":"async","workers":2})");
    constexpr int kThreads = 4;
    constexpr int kRounds = 600;
    constexpr std::array<uint64_t, 5> kSizes{256, 1000, 4096, 64 * 1024, kMiB};
    std::mutex handoffMutex;
    std::vector<Buffer> handoff; // buffers another thread drops (a Buffer may die anywhere)
    std::atomic<uint32_t> corrupted{0};
    std::atomic<uint32_t> badReports{0};
    std::atomic<int> finished{0};
    std::atomic<bool> stop{false};
    Watchdog watchdog(std::chrono::seconds(60));
    std::vector<size_t> helpers;
    // Threads 0 and 1 share stream A; 2 and 3 have their own.
    for (int t = 0; t < kThreads; ++t)
        helpers.push_back(watchdog.spawn([&, t] {
            StreamGuard guard(t < 2 ? kA : StreamId(t + 1));
            std::mt19937 rng(1234 + t);
            std::vector<std::pair<Buffer, uint32_t>> live; // buffer, pattern it holds (0: none)
            for (int round = 0; round < kRounds && !watchdog.fired(); ++round) {
                Buffer b = client.empty(kSizes[rng() % kSizes.size()]);
                uint32_t pattern = 0;
                if (rng() % 4 == 0) {
                    pattern = 0x01000000u * (t + 1) + round;
                    client.fill(b, pattern);
                }
                live.emplace_back(std::move(b), pattern);
                if (live.size() > 6 || rng() % 2 == 0) {
                    auto victim = live.begin() + rng() % live.size();
                    // Another live buffer on the same bytes would have overwritten the pattern.
                    if (victim->second != 0 &&
                        countNot(client.readAs<uint32_t>(victim->first), victim->second) != 0)
                        ++corrupted;
                    if (rng() % 3 == 0) {
                        std::lock_guard lock(handoffMutex);
                        handoff.push_back(std::move(victim->first));
                    }
                    live.erase(victim);
                }
                if (rng() % 5 == 0) {
                    std::vector<Buffer> theirs;
                    std::lock_guard lock(handoffMutex);
                    theirs.swap(handoff);
                } // dropped here, by this thread
            }
            live.clear();
            ++finished;
        }));
    // Reports and cleanups flush the caches while the workers use them.
    helpers.push_back(watchdog.spawn([&] {
        while (!stop.load()) {
            const MemoryUsage u = client.memoryUsage();
            if (u.bytesInUse > u.bytesReserved) ++badReports;
            client.memoryCleanup();
            std::this_thread::sleep_for(2ms);
        }
    }));
    watchdog.waitUntil([&] { return finished.load() == kThreads; });
    stop = true;
    watchdog.join();
    CHECK_FALSE(watchdog.fired());
    for (size_t h : helpers)
        if (std::exception_ptr e = watchdog.error(h)) {
            try {
                std::rethrow_exception(e);
            } catch (const std::exception &x) {
                FAIL_CHECK("helper " << h << " threw: " << std::string(x.what()));
            }
        }
    CHECK(corrupted.load() == 0);
    CHECK(badReports.load() == 0);
    handoff.clear();
    const MemoryUsage end = client.memoryUsage();
    CHECK(end.bytesInUse == 0);
    CHECK(end.bytesPadding == 0);
    CHECK(end.allocationCount == 0);
    CHECK(cacheHits(client) > 0);
    client.memoryCleanup();
    CHECK(client.memoryUsage().pageCount == 0);
}
