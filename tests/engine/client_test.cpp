// ComputeClient on the host plugin: memory pools, OOM, transfers, kernels, profiling (tests
// internals: opens the plugin through detail::PluginLibrary, backplane_internal_dep).
#include "host_fixture.hpp"

#include <doctest/doctest.h>

#include <cstring>
#include <numeric>
#include <vector>

using namespace backplane;
using namespace enginetest;

TEST_CASE("a buffer created from host data reads back the same bytes") {
    ComputeClient client = openHost();
    std::vector<uint32_t> data(1000);
    std::iota(data.begin(), data.end(), 7u);
    Buffer b = client.createFrom<uint32_t>(data);
    CHECK(b.size() == data.size() * 4);
    CHECK(client.readAs<uint32_t>(b) == data);
}

TEST_CASE("transfers larger than the staging chunk go through the pipeline intact") {
    Config config;
    config.stagingChunkBytes = 64 * 1024;
    ComputeClient client = openHost(R"({"mode":"async"})", config);
    std::vector<uint32_t> data(300 * 1000 + 3);
    for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint32_t>(i * 2654435761u);
    Buffer b = client.createFrom<uint32_t>(data);
    CHECK(client.readAs<uint32_t>(b) == data);
    // Partial read at an offset.
    const auto part = client.read(b, 40, 400).wait();
    CHECK(std::memcmp(part.data(), reinterpret_cast<const std::byte *>(data.data()) + 40, 400) == 0);
}

TEST_CASE("pinned buffers transfer directly") {
    ComputeClient client = openHost();
    PinnedBuffer pinned = client.allocatePinned(4096);
    std::memset(pinned.data(), 0x5a, 4096);
    Buffer b = client.empty(4096);
    client.write(b, pinned, 4096);
    PinnedBuffer back = client.allocatePinned(4096);
    client.read(b, back, 4096);
    CHECK(std::memcmp(back.data(), pinned.data(), 4096) == 0);
}

TEST_CASE("saxpy through a host kernel matches the CPU") {
    ComputeClient client = openHost();
    const uint32_t n = 100000;
    std::vector<float> x(n), y(n);
    for (uint32_t i = 0; i < n; ++i) {
        x[i] = static_cast<float>(i);
        y[i] = 1.0f;
    }
    Buffer bx = client.createFrom<float>(x), by = client.createFrom<float>(y);
    client.execute(saxpyKernel(), saxpyDispatch(bx, by, 2.0f, n));
    const auto out = client.readAs<float>(by);
    REQUIRE(out.size() == n);
    for (uint32_t i = 0; i < n; i += 997) CHECK(out[i] == 2.0f * x[i] + 1.0f);
    CHECK(client.stats().kernelsCompiled == 1);
    client.execute(saxpyKernel(), saxpyDispatch(bx, by, 2.0f, n));
    CHECK(client.stats().kernelsCompiled == 1);
    CHECK(client.stats().kernelCacheHits >= 1);
}

TEST_CASE("a kernel without a variant the device accepts is a clear error") {
    ComputeClient client = openHost();
    KernelSource k{"glsl_only", {KernelVariant::text(Dialect::Glsl, "main", "void main(){}")}};
    try {
        client.execute(k, Dispatch{});
        CHECK_MESSAGE(false, "expected an error");
    } catch (const Error &e) {
        CHECK((e.code() == ErrorCode::Unsupported));
        CHECK(std::string(e.what()).find("glsl_only") != std::string::npos);
    }
}

TEST_CASE("a freed size is served again from the same page") {
    ComputeClient client = openHost();
    { Buffer a = client.empty(1 << 20); }
    const MemoryUsage before = client.memoryUsage();
    const uint64_t pagesBefore = client.stats().pageAllocations;
    for (int i = 0; i < 100; ++i) {
        Buffer b = client.empty(1 << 20);
        CHECK(b.size() == (1u << 20));
    }
    CHECK(client.stats().pageAllocations == pagesBefore);
    const MemoryUsage after = client.memoryUsage();
    CHECK(after.pageCount == before.pageCount);
    CHECK(after.allocationCount == 0);
}

TEST_CASE("usage reports bytes in use, padding and allocations per pool") {
    ComputeClient client = openHost();
    Buffer a = client.empty(1000);
    Buffer b = client.empty(3000);
    const MemoryUsage usage = client.memoryUsage();
    CHECK(usage.bytesInUse == 4000);
    CHECK(usage.allocationCount == 2);
    CHECK(usage.bytesPadding == (1024 - 1000) + (3072 - 3000));
    CHECK(usage.bytesReserved >= usage.bytesInUse);
    REQUIRE_FALSE(usage.pools.empty());
    CHECK(usage.toString().find("sliced") != std::string::npos);
}

TEST_CASE("out of memory cleans up, retries, then fails clearly and the client stays usable") {
    Config config;
    config.stagingChunkBytes = 64 * 1024;
    ComputeClient client = openHost(R"({"mode":"async","memory_bytes":67108864})", config);
    std::vector<Buffer> keep;
    // Fill the device with exclusive allocations, free them: cached pages stay reserved.
    {
        std::vector<Buffer> temp;
        for (int i = 0; i < 5; ++i) temp.push_back(client.empty(10 << 20));
    }
    CHECK(client.memoryUsage().bytesReserved >= (50u << 20));
    // A different size cannot reuse those pages; the retry must release them.
    Buffer big = client.empty(40 << 20);
    CHECK(client.stats().outOfMemoryRetries == 1);
    try {
        Buffer tooBig = client.empty(60 << 20);
        CHECK_MESSAGE(false, "expected out of memory");
    } catch (const Error &e) {
        CHECK((e.code() == ErrorCode::OutOfMemory));
        const std::string message = e.what();
        CHECK(message.find(std::to_string(60 << 20)) != std::string::npos);
        CHECK(message.find("in use") != std::string::npos);
    }
    big = Buffer();
    std::vector<uint32_t> data(1000, 42);
    Buffer ok = client.createFrom<uint32_t>(data);
    CHECK(client.readAs<uint32_t>(ok) == data);
}

TEST_CASE("persistent allocations use exact pages kept after a free") {
    ComputeClient client = openHost();
    client.setAllocationMode(AllocationMode::Persistent);
    { Buffer a = client.empty(5000); }
    const uint64_t pages = client.stats().pageAllocations;
    { Buffer b = client.empty(5000); }
    CHECK(client.stats().pageAllocations == pages);
    client.setAllocationMode(AllocationMode::Auto);
    client.memoryCleanup();
    CHECK(client.memoryUsage().pageCount == 0);
}

TEST_CASE("optimized tensors pad rows to the pitch alignment") {
    ComputeClient client = openHost();
    const std::vector<uint64_t> shape = {3, 10};
    Tensor t = client.emptyTensor(shape, 4, TensorLayout::Optimized);
    CHECK(t.strides[1] == 1);
    CHECK(t.strides[0] == 64); // 256-byte pitch / 4 bytes
    CHECK(t.buffer.size() == 3 * 256);
    Tensor c = client.emptyTensor(shape, 4);
    CHECK(c.strides[0] == 10);
}

TEST_CASE("profiling tokens nest and measure the work between them") {
    ComputeClient client = openHost();
    const uint32_t n = 1 << 20;
    std::vector<float> x(n, 1.0f);
    Buffer bx = client.createFrom<float>(x), by = client.createFrom<float>(x);
    ProfileToken outer = client.profileStart();
    client.execute(saxpyKernel(), saxpyDispatch(bx, by, 1.0f, n));
    ProfileToken inner = client.profileStart();
    client.execute(saxpyKernel(), saxpyDispatch(bx, by, 1.0f, n));
    const ProfileDuration innerTime = client.profileEnd(inner);
    const ProfileDuration outerTime = client.profileEnd(outer);
    CHECK(innerTime.nanoseconds > 0);
    CHECK(outerTime.nanoseconds >= innerTime.nanoseconds);
    CHECK_THROWS_AS(client.profileEnd(inner), Error);
}

TEST_CASE("fill and device copies are stream-ordered") {
    ComputeClient client = openHost();
    Buffer a = client.empty(4096), b = client.empty(4096);
    client.fill(a, 0x01020304u);
    client.copy(a, 0, b, 0, 4096);
    const auto out = client.readAs<uint32_t>(b);
    CHECK(out.front() == 0x01020304u);
    CHECK(out.back() == 0x01020304u);
}
