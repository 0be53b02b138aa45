// Host kernels with data (KernelVariant::host with hostData, ABI 1.2) through the public API:
// the data reaches the function, the cache shares kernels by key, and the core keeps the data
// alive while it may call the function.
#include <backplane/client.hpp>
#include <backplane/config.hpp>
#include <backplane/error.hpp>
#include <backplane/kernel.hpp>
#include <backplane/runtime.hpp>

#include <doctest/doctest.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

using namespace backplane;

namespace {

/// What the kernel's data says: y[i] = x[i] * factor + offset.
struct Affine {
    uint32_t factor;
    uint32_t offset;
};

/// One workgroup of y[i] = x[i] * factor + offset with factor and offset from user_data;
/// bindings x, y; scalars {uint32 n}. Without data it writes UINT32_MAX (the test then fails).
void affineFromData(const bp_host_kernel_context *c) {
    const uint32_t n = *static_cast<const uint32_t *>(c->scalars);
    const auto *x = static_cast<const uint32_t *>(c->buffers[0]);
    auto *y = static_cast<uint32_t *>(c->buffers[1]);
    const auto *affine = static_cast<const Affine *>(c->user_data);
    for (uint32_t t = 0; t < c->block[0]; ++t) {
        const uint32_t i = c->workgroup[0] * c->block[0] + t;
        if (i < n) y[i] = affine ? x[i] * affine->factor + affine->offset : UINT32_MAX;
    }
}

/// One workgroup of y[i] = x[i] (the variant without data).
void copyWithoutData(const bp_host_kernel_context *c) {
    const uint32_t n = *static_cast<const uint32_t *>(c->scalars);
    const auto *x = static_cast<const uint32_t *>(c->buffers[0]);
    auto *y = static_cast<uint32_t *>(c->buffers[1]);
    for (uint32_t t = 0; t < c->block[0]; ++t) {
        const uint32_t i = c->workgroup[0] * c->block[0] + t;
        if (i < n) y[i] = x[i];
    }
}

/// A Runtime over the one plugin manifest `manifest`, probed in this process, no disk cache.
Config configFor(const char *manifest) {
    Config config;
    config.pluginPathOverride = {manifest};
    config.probeMode = ProbeMode::InProcess;
    config.cacheDir = TEST_CACHE_DIR;
    config.cacheEnabled = false;
    config.pluginOptions["host"] = R"({"mode":"async","workers":4})";
    return config;
}

KernelSource affineKernel(std::shared_ptr<const Affine> data, std::string key) {
    return {"affine_from_data",
            {KernelVariant::host(&affineFromData, "affine", std::move(data), std::move(key))}};
}

/// The device's y after one run of `kernel` over x = 0, 1, ..., n - 1.
std::vector<uint32_t> run(ComputeClient &client, const KernelSource &kernel, uint32_t n = 1000) {
    std::vector<uint32_t> x(n);
    for (uint32_t i = 0; i < n; ++i)
        x[i] = i;
    Buffer bx = client.createFrom<uint32_t>(x);
    Buffer by = client.empty(n * 4);
    Dispatch d;
    d.block = {64, 1, 1};
    d.grid = {(n + 63) / 64, 1, 1};
    d.bindings = {bx, by};
    d.scalar(n);
    client.execute(kernel, d);
    return client.readAs<uint32_t>(by);
}

/// Whether y[i] == i * factor + offset for every i.
bool isAffine(const std::vector<uint32_t> &y, uint32_t factor, uint32_t offset) {
    for (uint32_t i = 0; i < y.size(); ++i)
        if (y[i] != i * factor + offset) return false;
    return !y.empty();
}

} // namespace

TEST_CASE("a host kernel with data runs and sees its data") {
    const Runtime runtime(configFor(HOST_MANIFEST));
    ComputeClient client = runtime.open(runtime.select("host"));
    CHECK(isAffine(run(client, affineKernel(std::make_shared<const Affine>(Affine{3, 7}), "3x+7")),
                   3, 7));
}

TEST_CASE("host kernels with equal keys share one compiled kernel, other keys compile anew") {
    const Runtime runtime(configFor(HOST_MANIFEST));
    ComputeClient client = runtime.open(runtime.select("host"));
    // A KernelSource rebuilt per call: equal key, equal meaning, a new data object each time.
    for (int call = 0; call < 3; ++call) {
        CAPTURE(call);
        CHECK(isAffine(
            run(client, affineKernel(std::make_shared<const Affine>(Affine{3, 7}), "3x+7")), 3, 7));
    }
    CHECK(client.stats().kernelsCompiled == 1);
    CHECK(client.stats().kernelCacheHits >= 2);
    // Another key is another kernel, with its own data.
    CHECK(isAffine(run(client, affineKernel(std::make_shared<const Affine>(Affine{5, 1}), "5x+1")),
                   5, 1));
    CHECK(client.stats().kernelsCompiled == 2);
}

TEST_CASE("the data of a host kernel lives while the client may call it, and not after") {
    std::atomic<bool> released{false}; // set by the data's deleter, on whichever thread
    {
        const Runtime runtime(configFor(HOST_MANIFEST));
        ComputeClient client = runtime.open(runtime.select("host"));
        {
            std::shared_ptr<const Affine> data(new Affine{2, 9}, [&released](const Affine *a) {
                released = true;
                delete a;
            });
            CHECK(isAffine(run(client, affineKernel(std::move(data), "2x+9")), 2, 9));
        }
        // The caller dropped its KernelSource and data: the cached kernel still holds the data.
        REQUIRE_FALSE(released.load());
        // Equal key, a new data object: the cached kernel serves it (and keeps its own data).
        CHECK(isAffine(
            run(client, affineKernel(std::make_shared<const Affine>(Affine{2, 9}), "2x+9")), 2, 9));
        client.sync();
        CHECK_FALSE(released.load());
    }
    CHECK(released.load());
}

TEST_CASE("a host kernel with data is skipped on an ABI 1.1 plugin, and the error says why") {
    const Runtime runtime(configFor(ABI11_HOST_MANIFEST));
    REQUIRE(runtime.devices().size() == 1);
    ComputeClient client = runtime.open(runtime.select("host"));
    const auto data = std::make_shared<const Affine>(Affine{3, 7});

    // A variant without data further down the list is taken instead.
    KernelSource withFallback{"affine_or_copy",
                              {KernelVariant::host(&affineFromData, "affine", data, "3x+7"),
                               KernelVariant::host(&copyWithoutData, "copy")}};
    CHECK(isAffine(run(client, withFallback), 1, 0));

    try {
        run(client, affineKernel(data, "3x+7"));
        FAIL("a host kernel with data ran on an ABI 1.1 plugin");
    } catch (const Error &e) {
        CHECK((e.code() == ErrorCode::Unsupported));
        const std::string message = e.what();
        CAPTURE(message);
        CHECK(message.find("affine_from_data") != std::string::npos);
        CHECK(message.find("plugin 'host' speaks ABI 1.1; host kernels with data need 1.2") !=
              std::string::npos);
    }
}

TEST_CASE("a plugin whose table says ABI 1.1 gets the kernel features of ABI 1.3 kernels") {
    // The plugin behind the table is today's host plugin, which fills the 1.4 fields: the core
    // goes by the table's version, not by what happens to be in the struct.
    const Runtime runtime(configFor(ABI11_HOST_MANIFEST));
    REQUIRE(runtime.devices().size() == 1);
    const KernelFeatures &old = runtime.devices().front().info().features;
    CHECK(old.describe() == "types bool i32 u32 f32; native bool i32 u32 f32; atomic add i32 "
                            "u32; atomic bits i32 u32; vectors none; matrix none");
    CHECK_FALSE(old.stores(ElementType::F64));
    CHECK_FALSE(old.addsAtomically(ElementType::F32));

    const Runtime current(configFor(HOST_MANIFEST));
    REQUIRE(current.devices().size() == 1);
    CHECK(current.devices().front().info().features.stores(ElementType::F64));
}

// The kernel cache remembers each thread's last hits by the KernelSource's address; a
// KernelSource is a plain value its owner may change in place between launches.

TEST_CASE("a KernelSource changed in place between launches launches its new kernel") {
    const Runtime runtime(configFor(HOST_MANIFEST));
    ComputeClient client = runtime.open(runtime.select("host"));
    KernelSource kernel = affineKernel(std::make_shared<const Affine>(Affine{3, 7}), "key-a");
    for (int call = 0; call < 3; ++call)
        REQUIRE(isAffine(run(client, kernel), 3, 7));
    const uint64_t compiled = client.stats().kernelsCompiled;

    SUBCASE("the key changed in its own bytes (same size, same storage) with other data") {
        KernelVariant &variant = kernel.variants[0];
        const char *storage = variant.source.data();
        variant.source[4] = 'b'; // "key-a" -> "key-b"
        variant.hostData = std::make_shared<const Affine>(Affine{5, 1});
        REQUIRE(variant.source.data() == storage);
        CHECK(isAffine(run(client, kernel), 5, 1));
        CHECK(client.stats().kernelsCompiled == compiled + 1);
    }
    SUBCASE("the function changed") {
        kernel.variants[0].hostFunction = &copyWithoutData;
        CHECK(isAffine(run(client, kernel), 1, 0));
        CHECK(client.stats().kernelsCompiled == compiled + 1);
    }
    SUBCASE("an option added") {
        kernel.variants[0].options.push_back("-DSOMETHING");
        CHECK(isAffine(run(client, kernel), 3, 7));
        CHECK(client.stats().kernelsCompiled == compiled + 1);
    }
    SUBCASE("the name changed") {
        kernel.name = "affine_renamed";
        CHECK(isAffine(run(client, kernel), 3, 7));
        CHECK(client.stats().kernelsCompiled == compiled + 1);
    }
    SUBCASE("a variant the device prefers put in front") {
        kernel.variants.insert(kernel.variants.begin(),
                               KernelVariant::host(&copyWithoutData, "copy"));
        CHECK(isAffine(run(client, kernel), 1, 0));
        CHECK(client.stats().kernelsCompiled == compiled + 1);
    }
    // Changed back: the first kernel again, from the cache.
    kernel = affineKernel(std::make_shared<const Affine>(Affine{9, 9}), "key-a");
    const uint64_t before = client.stats().kernelsCompiled;
    CHECK(isAffine(run(client, kernel), 3, 7));
    CHECK(client.stats().kernelsCompiled == before);
}

TEST_CASE("one KernelSource launched on two devices is compiled once for each") {
    Config config = configFor(HOST_MANIFEST);
    config.pluginOptions["host"] = R"({"mode":"async","workers":2,"devices":2})";
    const Runtime runtime(config);
    const KernelSource kernel = affineKernel(std::make_shared<const Affine>(Affine{3, 7}), "3x+7");
    for (int round = 0; round < 2; ++round) {
        CAPTURE(round);
        // The second round's clients may reuse the first round's memory.
        ComputeClient first = runtime.open(runtime.select("host:0"));
        ComputeClient second = runtime.open(runtime.select("host:1"));
        CHECK(isAffine(run(first, kernel), 3, 7));
        CHECK(isAffine(run(first, kernel), 3, 7));
        CHECK(isAffine(run(second, kernel), 3, 7));
        CHECK(first.stats().kernelsCompiled == 1);
        CHECK(second.stats().kernelsCompiled == 1);
        CHECK(first.stats().kernelCacheHits == 1);
    }
}
