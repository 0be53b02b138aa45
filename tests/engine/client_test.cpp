// ComputeClient on the host plugin: memory pools, OOM, transfers, kernels, profiling (tests
// internals: opens the plugin through detail::PluginLibrary, backplane_internal_dep).
#include "host_fixture.hpp"

#include <doctest/doctest.h>

#include <concepts>
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
    client.write(b, 0, pinned, 4096);
    PinnedBuffer back = client.allocatePinned(4096);
    client.readInto(b, 0, back, 4096);
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

// ----- API sharp edges (issue 12) ----------------------------------------------------------------

TEST_CASE("readAs refuses a buffer whose size is not a whole number of elements") {
    ComputeClient client = openHost();
    Buffer odd = client.empty(10);
    try {
        (void)client.readAs<uint32_t>(odd);
        FAIL("readAs<uint32_t> of 10 bytes should throw");
    } catch (const Error &e) {
        CHECK((e.code() == ErrorCode::InvalidArgument));
        const std::string message = e.what();
        CHECK(message.find("10 bytes") != std::string::npos);
        CHECK(message.find("sizeof(T) = 4") != std::string::npos);
    }
    std::vector<uint16_t> halves = {1, 2, 3, 4, 5};
    Buffer even = client.createFrom<uint16_t>(halves);
    CHECK(client.readAs<uint16_t>(even) == halves); // the client stays usable
}

namespace {

void checkZeroByteBuffer(const std::string &mode) {
    CAPTURE(mode);
    ComputeClient client = openHost(R"({"mode":")" + mode + R"("})");
    const uint64_t pages = client.stats().pageAllocations;
    Buffer zero = client.empty(0);
    CHECK(zero.valid());
    CHECK(zero.size() == 0);
    Buffer created = client.create(nullptr, 0);
    CHECK(created.size() == 0);
    CHECK(created.id() != zero.id());
    CHECK(client.stats().pageAllocations == pages);
    const MemoryUsage usage = client.memoryUsage();
    CHECK(usage.pageCount == 0);
    CHECK(usage.bytesReserved == 0);
    CHECK(usage.allocationCount == 0);

    CHECK(client.read(zero).wait().empty());
    CHECK(client.readAs<uint32_t>(zero).empty());
    client.write(zero, 0, nullptr, 0);
    client.readInto(zero, 0, nullptr, 0);
    PinnedBuffer pinned = client.allocatePinned(16);
    client.write(zero, 0, pinned, 0);
    client.readInto(zero, 0, pinned, 0);
    client.fill(zero, 0x01020304u);
    Buffer other = client.createFrom<uint32_t>(std::vector<uint32_t>{7, 7, 7, 7});
    client.copy(zero, 0, other, 16, 0);
    client.copy(other, 0, zero, 0, 0);
    const std::vector<uint64_t> empty = {0, 8};
    CHECK(client.emptyTensor(empty, 4).buffer.size() == 0);
    CHECK(client.stats().pageAllocations == pages + 1); // `other` only
    uint32_t word = 1;
    CHECK_THROWS_AS(client.write(zero, 0, &word, 4), Error); // a transfer into it overruns it

    // A kernel cannot bind it: binding 1 is named.
    try {
        client.execute(saxpyKernel(), saxpyDispatch(other, zero, 1.0f, 0));
        FAIL("binding a zero-byte buffer should throw");
    } catch (const Error &e) {
        CHECK((e.code() == ErrorCode::InvalidArgument));
        CHECK(std::string(e.what()).find("binding 1 is a zero-byte Buffer") != std::string::npos);
    }
    CHECK_THROWS_WITH_AS(client.nativeHandle(NativeKind::Memory, &zero),
                         doctest::Contains("zero-byte Buffer has no memory"), Error);
    client.sync();
    CHECK(client.readAs<uint32_t>(other) == std::vector<uint32_t>{7, 7, 7, 7});
}

} // namespace

TEST_CASE("a zero-byte buffer takes no page and is usable wherever a buffer is") {
    checkZeroByteBuffer("async");
    checkZeroByteBuffer("sync"); // scheduler streams
}

TEST_CASE("a buffer used with the wrong client says whose it is") {
    const std::string twoDevices = R"({"mode":"async","devices":2})";
    ComputeClient client = openHost(twoDevices);
    ComputeClient again = openHost(twoDevices);         // another open() of host:0
    ComputeClient second = openHost(twoDevices, {}, 1); // host:1
    Buffer mine = client.empty(16);
    const auto messageOf = [](auto &&call) {
        try {
            call();
        } catch (const Error &e) {
            CHECK((e.code() == ErrorCode::InvalidArgument));
            return std::string(e.what());
        }
        FAIL("expected an error");
        return std::string();
    };
    const std::string fromOtherOpen = messageOf([&] { (void)again.read(mine); });
    CHECK(fromOtherOpen.find("another open() of host:0") != std::string::npos);
    CHECK(fromOtherOpen.find("another device") == std::string::npos);

    const std::string fromOtherDevice = messageOf([&] { second.fill(mine, 0); });
    CHECK(fromOtherDevice.find("belongs to host:0") != std::string::npos);
    CHECK(fromOtherDevice.find("this client's device is host:1") != std::string::npos);

    Buffer orphan;
    {
        ComputeClient gone = openHost(twoDevices);
        orphan = gone.empty(16);
    }
    const std::string fromClosed = messageOf([&] { client.copy(orphan, 0, mine, 0, 16); });
    CHECK(fromClosed.find("was closed") != std::string::npos);
    CHECK(client.readAs<uint32_t>(mine).size() == 4); // still usable
}

TEST_CASE("profileEnd out of order, twice or from another client is refused") {
    ComputeClient client = openHost();
    const ProfileToken outer = client.profileStart();
    const ProfileToken inner = client.profileStart();
    try {
        client.profileEnd(outer);
        FAIL("ending the outer token first should throw");
    } catch (const Error &e) {
        CHECK((e.code() == ErrorCode::InvalidArgument));
        CHECK(std::string(e.what()).find("token " + std::to_string(inner.id) + " is still open") !=
              std::string::npos);
    }
    // Nothing was ended by the refused call: the right order still works.
    client.profileEnd(inner);
    client.profileEnd(outer);
    CHECK_THROWS_WITH_AS(client.profileEnd(outer), doctest::Contains("already ended"), Error);
    CHECK_THROWS_WITH_AS(client.profileEnd(ProfileToken{}),
                         doctest::Contains("not returned by profileStart"), Error);

    ComputeClient other = openHost();
    const ProfileToken theirs = other.profileStart();
    CHECK_THROWS_WITH_AS(client.profileEnd(theirs), doctest::Contains("another ComputeClient"),
                         Error);
    other.profileEnd(theirs);

    // Tokens of different streams do not nest with each other.
    ProfileToken first, second;
    {
        StreamGuard stream(1000);
        first = client.profileStart();
    }
    {
        StreamGuard stream(1001);
        second = client.profileStart();
    }
    client.profileEnd(first);
    client.profileEnd(second);
}

// Every transfer takes (buffer, offset, host side, size). A literal 0 offset picks read()'s only
// overload, and the old orders no longer compile, so no old call quietly changes meaning.
template <class Client>
concept ReadsOffsetThenSize = requires(Client &c, const Buffer &b, uint64_t n) {
    { c.read(b, 0, n) } -> std::same_as<ReadFuture>;
    { c.read(b, 0, 16) } -> std::same_as<ReadFuture>;
};
template <class Client>
concept TakesOldReadIntoOrder = requires(Client &c, const Buffer &b, void *into, uint64_t n) {
    c.read(b, into, n);
};
template <class Client>
concept TakesOldWriteOrder = requires(Client &c, const Buffer &b, const void *data, uint64_t n) {
    c.write(b, data, n, n);
};
template <class Client>
concept TakesOldPinnedOrder = requires(Client &c, const Buffer &b, const PinnedBuffer &p,
                                       uint64_t n) {
    c.write(b, p, n);
};
static_assert(ReadsOffsetThenSize<ComputeClient>);
static_assert(!TakesOldReadIntoOrder<ComputeClient>);
static_assert(!TakesOldWriteOrder<ComputeClient>);
static_assert(!TakesOldPinnedOrder<ComputeClient>);

TEST_CASE(
    "every transfer takes the offset before the size; read(buffer, 0, n) is offset 0, n bytes") {
    ComputeClient client = openHost();
    std::vector<uint8_t> bytes(16);
    std::iota(bytes.begin(), bytes.end(), uint8_t{0});
    Buffer b = client.createFrom<uint8_t>(bytes);
    const auto asBytes = [](const std::vector<std::byte> &v) {
        std::vector<uint8_t> out(v.size());
        std::memcpy(out.data(), v.data(), v.size());
        return out;
    };
    const uint64_t n = 8;
    CHECK(asBytes(client.read(b, 0, n).wait()) == std::vector<uint8_t>{0, 1, 2, 3, 4, 5, 6, 7});
    CHECK(asBytes(client.read(b, 4, 8).wait()) == std::vector<uint8_t>{4, 5, 6, 7, 8, 9, 10, 11});
    CHECK(asBytes(client.read(b, 12).wait()) == std::vector<uint8_t>{12, 13, 14, 15});
    CHECK(client.read(b, 16).wait().empty());

    const uint8_t four[4] = {0xa0, 0xa1, 0xa2, 0xa3};
    client.write(b, 12, four, 4);
    uint8_t into[4] = {};
    client.readInto(b, 10, into, 4);
    CHECK(std::vector<uint8_t>(into, into + 4) == std::vector<uint8_t>{10, 11, 0xa0, 0xa1});

    PinnedBuffer pinned = client.allocatePinned(8);
    std::memset(pinned.data(), 0x5c, 8);
    client.write(b, 2, pinned, 2);
    PinnedBuffer back = client.allocatePinned(8);
    client.readInto(b, 0, back, 4);
    const auto *seen = static_cast<const uint8_t *>(back.data());
    CHECK(std::vector<uint8_t>(seen, seen + 4) == std::vector<uint8_t>{0, 1, 0x5c, 0x5c});

    // A range past the end is an error for every transfer, read() included (no silent clamp).
    CHECK_THROWS_WITH_AS(client.read(b, 12, 8), doctest::Contains("overruns a buffer of 16"),
                         Error);
    CHECK_THROWS_AS(client.read(b, 17), Error);
    CHECK_THROWS_AS(client.readInto(b, 8, into, 9), Error);
    CHECK_THROWS_AS(client.write(b, 16, four, 1), Error);
    CHECK_THROWS_WITH_AS(client.write(b, 0, pinned, 9), doctest::Contains("PinnedBuffer of 8"),
                         Error);
    CHECK_THROWS_WITH_AS(client.readInto(b, 0, nullptr, 4), doctest::Contains("null"), Error);
}
