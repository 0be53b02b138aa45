// CUDA graphs (ABI 1.3 graph_create / graph_launch / graph_update) through the plugin's C table
// on a real GPU; exits 77 (SKIP) only without a CUDA driver or device.
#define DOCTEST_CONFIG_IMPLEMENT
#include "gpu_test_support.hpp"

#include "../test_skip.hpp"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>

using backplane::test::AbiDevice;
using backplane::test::pluginPath;

namespace {

const char *const kKernels = R"(
struct Step { float scale; float add; unsigned n; };
extern "C" __global__ void step(const float *x, float *y, Step p) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < p.n) y[i] = y[i] * p.scale + x[i] + p.add;
}
struct Add { unsigned value; unsigned n; };
extern "C" __global__ void add_value(unsigned *out, Add p) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < p.n) out[i] += p.value;
}
extern "C" __global__ void wait_for_flag(volatile unsigned *flag) {
    while (*flag == 0) {
    }
}
)";

struct Step {
    float scale;
    float add;
    unsigned n;
};
struct Add {
    unsigned value;
    unsigned n;
};

constexpr uint32_t kThreads = 128;

size_t countOf(const std::vector<uint32_t> &words, uint32_t value) {
    return static_cast<size_t>(std::count(words.begin(), words.end(), value));
}

std::shared_ptr<backplane::detail::PluginLibrary> openPlugin() {
    return backplane::detail::PluginLibrary::open(pluginPath(CUDA_PLUGIN_PATH), "cuda", {});
}

/// The module of kKernels, compiled once per device.
std::vector<char> compileKernels(AbiDevice &gpu) {
    std::vector<char> binary;
    std::string log;
    gpu.expectOk(gpu.compile(kKernels, "step", binary, log), "kernel_compile");
    return binary;
}

bp_launch_args launchOf(bp_kernel *kernel, const bp_binding *bindings, uint32_t bindingCount,
                        const void *scalars, size_t scalarSize, unsigned n) {
    auto args = AbiDevice::makeArgs<bp_launch_args>();
    args.kernel = kernel;
    args.grid[0] = (n + kThreads - 1) / kThreads;
    args.grid[1] = args.grid[2] = 1;
    args.block[0] = kThreads;
    args.block[1] = args.block[2] = 1;
    args.bindings = bindings;
    args.binding_count = bindingCount;
    args.scalars = scalars;
    args.scalar_size = scalarSize;
    return args;
}

bp_graph_op opOf(const bp_launch_args &args) {
    auto op = AbiDevice::makeArgs<bp_graph_op>();
    op.kind = BP_GRAPH_OP_LAUNCH;
    op.launch = &args;
    return op;
}
bp_graph_op opOf(const bp_copy_host_to_device_args &args) {
    auto op = AbiDevice::makeArgs<bp_graph_op>();
    op.kind = BP_GRAPH_OP_COPY_HOST_TO_DEVICE;
    op.to_device = &args;
    return op;
}
bp_graph_op opOf(const bp_copy_device_to_host_args &args) {
    auto op = AbiDevice::makeArgs<bp_graph_op>();
    op.kind = BP_GRAPH_OP_COPY_DEVICE_TO_HOST;
    op.to_host = &args;
    return op;
}
bp_graph_op opOf(const bp_copy_device_to_device_args &args) {
    auto op = AbiDevice::makeArgs<bp_graph_op>();
    op.kind = BP_GRAPH_OP_COPY_DEVICE_TO_DEVICE;
    op.copy = &args;
    return op;
}
bp_graph_op opOf(const bp_fill_args &args) {
    auto op = AbiDevice::makeArgs<bp_graph_op>();
    op.kind = BP_GRAPH_OP_FILL;
    op.fill = &args;
    return op;
}

/// Records `op` on `s` through the ordinary call of its kind.
void runOne(AbiDevice &gpu, bp_stream *s, const bp_graph_op &op) {
    auto &api = gpu.api();
    switch (op.kind) {
    case BP_GRAPH_OP_LAUNCH:
        gpu.expectOk(api.kernel_launch(gpu.get(), s, op.launch, &gpu.error()), "kernel_launch");
        return;
    case BP_GRAPH_OP_COPY_HOST_TO_DEVICE:
        gpu.expectOk(api.copy_host_to_device(gpu.get(), s, op.to_device, &gpu.error()),
                     "copy_host_to_device");
        return;
    case BP_GRAPH_OP_COPY_DEVICE_TO_HOST:
        gpu.expectOk(api.copy_device_to_host(gpu.get(), s, op.to_host, &gpu.error()),
                     "copy_device_to_host");
        return;
    case BP_GRAPH_OP_COPY_DEVICE_TO_DEVICE:
        gpu.expectOk(api.copy_device_to_device(gpu.get(), s, op.copy, &gpu.error()),
                     "copy_device_to_device");
        return;
    case BP_GRAPH_OP_FILL:
        gpu.expectOk(api.fill(gpu.get(), s, op.fill, &gpu.error()), "fill");
        return;
    }
    FAIL("unknown op kind");
}

bp_status createGraph(AbiDevice &gpu, const std::vector<bp_graph_op> &ops, bp_graph **out) {
    auto args = AbiDevice::makeArgs<bp_graph_create_args>();
    args.ops = ops.data();
    args.op_count = static_cast<uint32_t>(ops.size());
    *out = nullptr;
    return gpu.api().graph_create(gpu.get(), &args, out, &gpu.error());
}

void fillWith(AbiDevice &gpu, bp_stream *s, bp_memory *memory, uint64_t size, uint32_t pattern) {
    auto fill = AbiDevice::makeArgs<bp_fill_args>();
    fill.dst = memory;
    fill.size = size;
    fill.pattern = pattern;
    runOne(gpu, s, opOf(fill));
}

/// Keeps a kernel spinning on a flag in pinned host memory, which holds back everything recorded
/// after it on its stream, until release(). A watchdog releases it after `limit` so that a
/// plugin that blocks while the gate is closed fails the test instead of hanging it.
class Gate {
public:
    explicit Gate(volatile uint32_t *flag, std::chrono::seconds limit) : flag_(flag) {
        *flag_ = 0;
        watchdog_ = std::thread([this, limit] {
            std::unique_lock lock(mutex_);
            if (!cv_.wait_for(lock, limit, [this] { return released_; })) {
                timedOut_ = true;
                *flag_ = 1;
            }
        });
    }
    ~Gate() { release(); }
    Gate(const Gate &) = delete;
    Gate &operator=(const Gate &) = delete;
    void release() {
        {
            std::lock_guard lock(mutex_);
            released_ = true;
            *flag_ = 1;
        }
        cv_.notify_all();
        if (watchdog_.joinable()) watchdog_.join();
    }
    /// Whether the watchdog had to open the gate.
    bool timedOut() const { return timedOut_; }

private:
    volatile uint32_t *flag_;
    std::mutex mutex_;
    std::condition_variable cv_;
    bool released_ = false;
    bool timedOut_ = false;
    std::thread watchdog_;
};

} // namespace

TEST_CASE("a graph of a launch, copies and a fill replays like the same ops run one by one") {
    auto plugin = openPlugin();
    AbiDevice gpu(plugin, 0);
    auto &api = gpu.api();
    REQUIRE((api.graph_create != nullptr && api.graph_launch != nullptr &&
             api.graph_release != nullptr));
    const auto blob = compileKernels(gpu);
    bp_kernel *step = gpu.load(blob, "step");
    bp_stream *s = gpu.stream();

    constexpr unsigned n = 10000;
    constexpr uint64_t bytes = n * 4, zBytes = 256 + bytes + 256;
    void *inMapped = nullptr, *outMapped = nullptr;
    bp_memory *in = gpu.allocate(bytes, BP_MEMORY_PINNED_HOST, &inMapped);
    bp_memory *out = gpu.allocate(zBytes, BP_MEMORY_PINNED_HOST, &outMapped);
    auto *inHost = static_cast<float *>(inMapped);
    const auto *outHost = static_cast<const uint32_t *>(outMapped);
    bp_memory *x = gpu.allocate(bytes);
    bp_memory *y = gpu.allocate(bytes);
    bp_memory *z = gpu.allocate(zBytes);

    // x <- in; y <- y * 2 + x + 1; z[256, +bytes) <- y; z's last 256 bytes <- a pattern;
    // out <- z.
    auto toDevice = AbiDevice::makeArgs<bp_copy_host_to_device_args>();
    toDevice.src = inHost;
    toDevice.dst = x;
    toDevice.size = bytes;
    const bp_binding bindings[2] = {{x, 0, bytes}, {y, 0, bytes}};
    const Step params{2.0f, 1.0f, n};
    const auto launch = launchOf(step, bindings, 2, &params, sizeof params, n);
    auto copy = AbiDevice::makeArgs<bp_copy_device_to_device_args>();
    copy.src = y;
    copy.dst = z;
    copy.dst_offset = 256;
    copy.size = bytes;
    auto fill = AbiDevice::makeArgs<bp_fill_args>();
    fill.dst = z;
    fill.offset = 256 + bytes;
    fill.size = 256;
    fill.pattern = 0xa5a5a5a5u;
    auto toHost = AbiDevice::makeArgs<bp_copy_device_to_host_args>();
    toHost.src = z;
    toHost.dst = outMapped;
    toHost.size = zBytes;
    const std::vector<bp_graph_op> ops = {opOf(toDevice), opOf(launch), opOf(copy), opOf(fill),
                                          opOf(toHost)};

    // Three rounds; the host input changes between them, so a replay must read it when it runs.
    const auto rounds = [&](const std::function<void()> &runSequence) {
        fillWith(gpu, s, y, bytes, 0);
        fillWith(gpu, s, z, zBytes, 0);
        REQUIRE(gpu.finish(s) == BP_SUCCESS);
        for (unsigned round = 0; round < 3; ++round) {
            for (unsigned i = 0; i < n; ++i)
                inHost[i] = static_cast<float>(i % 100 + round);
            runSequence();
            REQUIRE(gpu.finish(s) == BP_SUCCESS);
        }
        return std::vector<uint32_t>(outHost, outHost + zBytes / 4);
    };
    const auto oneByOne = rounds([&] {
        for (const auto &op : ops)
            runOne(gpu, s, op);
    });
    bp_graph *graph = nullptr;
    gpu.expectOk(createGraph(gpu, ops, &graph), "graph_create");
    REQUIRE(graph != nullptr);
    const auto replayed = rounds(
        [&] { gpu.expectOk(api.graph_launch(gpu.get(), s, graph, &gpu.error()), "graph_launch"); });

    std::vector<uint32_t> expected(zBytes / 4, 0);
    for (unsigned i = 0; i < n; ++i) {
        float value = 0;
        for (unsigned round = 0; round < 3; ++round)
            value = value * 2.0f + static_cast<float>(i % 100 + round) + 1.0f;
        std::memcpy(&expected[64 + i], &value, 4);
    }
    for (size_t i = 64 + n; i < expected.size(); ++i)
        expected[i] = 0xa5a5a5a5u;
    size_t wrong = 0, first = expected.size();
    for (size_t i = 0; i < expected.size(); ++i)
        if (replayed[i] != expected[i] && wrong++ == 0) first = i;
    INFO("first wrong word " << first << " of " << expected.size());
    CHECK(wrong == 0);
    CHECK(oneByOne == expected);

    api.graph_release(gpu.get(), graph);
    for (bp_memory *m : {in, out, x, y, z})
        api.memory_free(gpu.get(), m);
    api.stream_destroy(gpu.get(), s);
    api.kernel_release(gpu.get(), step);
}

TEST_CASE("an update reaches the next launch of a graph while a launch recorded before keeps the "
          "old scalar and binding") {
    auto plugin = openPlugin();
    AbiDevice gpu(plugin, 0);
    auto &api = gpu.api();
    REQUIRE((api.graph_update != nullptr));
    const auto blob = compileKernels(gpu);
    bp_kernel *addValue = gpu.load(blob, "add_value");
    bp_kernel *waitForFlag = gpu.load(blob, "wait_for_flag");
    bp_stream *s = gpu.stream();
    constexpr unsigned n = 4096;
    constexpr uint64_t bytes = n * 4;
    bp_memory *a = gpu.allocate(bytes);
    bp_memory *b = gpu.allocate(bytes);
    void *flagMapped = nullptr;
    bp_memory *flag = gpu.allocate(256, BP_MEMORY_PINNED_HOST, &flagMapped);
    fillWith(gpu, s, a, bytes, 0);
    fillWith(gpu, s, b, bytes, 0);
    REQUIRE(gpu.finish(s) == BP_SUCCESS);

    const bp_binding intoA[1] = {{a, 0, bytes}};
    const Add one{1, n};
    const auto addOneToA = launchOf(addValue, intoA, 1, &one, sizeof one, n);
    bp_graph *graph = nullptr;
    gpu.expectOk(createGraph(gpu, {opOf(addOneToA)}, &graph), "graph_create");

    const bp_binding gateBinding[1] = {{flag, 0, 256}};
    auto gateLaunch = launchOf(waitForFlag, gateBinding, 1, nullptr, 0, 1);
    gateLaunch.block[0] = 1;
    {
        Gate gate(static_cast<volatile uint32_t *>(flagMapped), std::chrono::seconds(20));
        gpu.expectOk(api.kernel_launch(gpu.get(), s, &gateLaunch, &gpu.error()), "gate launch");
        gpu.expectOk(api.graph_launch(gpu.get(), s, graph, &gpu.error()), "graph_launch 1");

        // While launch 1 waits behind the gate: add 2 into b instead of 1 into a.
        const bp_binding intoB[1] = {{b, 0, bytes}};
        const Add two{2, n};
        const auto addTwoToB = launchOf(addValue, intoB, 1, &two, sizeof two, n);
        const bp_graph_op update = opOf(addTwoToB);
        gpu.expectOk(api.graph_update(gpu.get(), graph, 0, &update, &gpu.error()), "graph_update");
        gpu.expectOk(api.graph_launch(gpu.get(), s, graph, &gpu.error()), "graph_launch 2");
        bp_event *pending = gpu.flush(s);
        // The hazard window was open: nothing behind the gate has run yet.
        CHECK(api.event_query(gpu.get(), pending, &gpu.error()) == BP_ERROR_NOT_READY);
        api.event_release(gpu.get(), pending);
        gate.release();
        INFO("the watchdog opened the gate: a call blocked until the gated launch completed");
        CHECK_FALSE(gate.timedOut());
    }
    REQUIRE(gpu.finish(s) == BP_SUCCESS);
    std::vector<uint32_t> hostA(n), hostB(n);
    gpu.read(s, a, 0, hostA.data(), bytes);
    gpu.read(s, b, 0, hostB.data(), bytes);
    REQUIRE(gpu.finish(s) == BP_SUCCESS);
    // Launch 1 added 1 into a (the old op), launch 2 added 2 into b (the new one).
    CHECK(countOf(hostA, 1u) == n);
    CHECK(countOf(hostB, 2u) == n);

    // The update stays: a third launch adds 2 into b again.
    gpu.expectOk(api.graph_launch(gpu.get(), s, graph, &gpu.error()), "graph_launch 3");
    gpu.read(s, a, 0, hostA.data(), bytes);
    gpu.read(s, b, 0, hostB.data(), bytes);
    REQUIRE(gpu.finish(s) == BP_SUCCESS);
    CHECK(countOf(hostA, 1u) == n);
    CHECK(countOf(hostB, 4u) == n);

    api.graph_release(gpu.get(), graph);
    for (bp_memory *m : {a, b, flag})
        api.memory_free(gpu.get(), m);
    api.stream_destroy(gpu.get(), s);
    api.kernel_release(gpu.get(), addValue);
    api.kernel_release(gpu.get(), waitForFlag);
}

TEST_CASE("an update to another kernel, block size, binding count or kind is refused and the "
          "graph keeps its op") {
    auto plugin = openPlugin();
    AbiDevice gpu(plugin, 0);
    auto &api = gpu.api();
    const auto blob = compileKernels(gpu);
    bp_kernel *addValue = gpu.load(blob, "add_value");
    bp_kernel *step = gpu.load(blob, "step");
    bp_stream *s = gpu.stream();
    constexpr unsigned n = 1024;
    constexpr uint64_t bytes = n * 4;
    bp_memory *a = gpu.allocate(bytes);
    bp_memory *b = gpu.allocate(bytes);
    fillWith(gpu, s, a, bytes, 0);
    REQUIRE(gpu.finish(s) == BP_SUCCESS);

    // op 0 adds 1 into a, op 1 fills b.
    const bp_binding intoA[1] = {{a, 0, bytes}};
    const Add one{1, n};
    const auto addOne = launchOf(addValue, intoA, 1, &one, sizeof one, n);
    auto fillB = AbiDevice::makeArgs<bp_fill_args>();
    fillB.dst = b;
    fillB.size = bytes;
    fillB.pattern = 5;
    bp_graph *graph = nullptr;
    gpu.expectOk(createGraph(gpu, {opOf(addOne), opOf(fillB)}, &graph), "graph_create");
    const auto message = [&] { return std::string(gpu.error().message); };
    const auto update = [&](uint32_t index, const bp_graph_op &op) {
        return api.graph_update(gpu.get(), graph, index, &op, &gpu.error());
    };

    const bp_binding two[2] = {{a, 0, bytes}, {a, 0, bytes}};
    const Step params{1.0f, 0.0f, n};
    const auto otherKernel = launchOf(step, two, 2, &params, sizeof params, n);
    CHECK(update(0, opOf(otherKernel)) == BP_ERROR_INVALID_ARGUMENT);
    MESSAGE(message());
    CHECK(message().find("another kernel") != std::string::npos);

    auto otherBlock = addOne;
    otherBlock.block[0] = kThreads / 2;
    CHECK(update(0, opOf(otherBlock)) == BP_ERROR_INVALID_ARGUMENT);
    CHECK(message().find("block size") != std::string::npos);

    auto moreBindings = addOne;
    moreBindings.bindings = two;
    moreBindings.binding_count = 2;
    CHECK(update(0, opOf(moreBindings)) == BP_ERROR_INVALID_ARGUMENT);
    CHECK(message().find("binding count") != std::string::npos);

    CHECK(update(0, opOf(fillB)) == BP_ERROR_INVALID_ARGUMENT);
    CHECK(update(1, opOf(addOne)) == BP_ERROR_INVALID_ARGUMENT);
    CHECK(update(2, opOf(fillB)) == BP_ERROR_INVALID_ARGUMENT);

    // The same kernel with a binding past its page: the launch's own check refuses it.
    const bp_binding outside[1] = {{a, 0, bytes * 2}};
    auto outsidePage = addOne;
    outsidePage.bindings = outside;
    CHECK(update(0, opOf(outsidePage)) == BP_ERROR_INVALID_ARGUMENT);
    MESSAGE(message());

    // None of them changed the graph: an update of op 1 captures op 0 as it was, and the graph
    // still adds 1 into a.
    fillB.pattern = 7;
    gpu.expectOk(update(1, opOf(fillB)), "graph_update of op 1");
    gpu.expectOk(api.graph_launch(gpu.get(), s, graph, &gpu.error()), "graph_launch");
    std::vector<uint32_t> hostA(n), hostB(n);
    gpu.read(s, a, 0, hostA.data(), bytes);
    gpu.read(s, b, 0, hostB.data(), bytes);
    REQUIRE(gpu.finish(s) == BP_SUCCESS);
    CHECK(countOf(hostA, 1u) == n);
    CHECK(countOf(hostB, 7u) == n);

    api.graph_release(gpu.get(), graph);
    api.memory_free(gpu.get(), a);
    api.memory_free(gpu.get(), b);
    api.stream_destroy(gpu.get(), s);
    api.kernel_release(gpu.get(), addValue);
    api.kernel_release(gpu.get(), step);
}

TEST_CASE("graph_create checks each op like its ordinary call and refuses an indirect launch as "
          "unsupported") {
    auto plugin = openPlugin();
    AbiDevice gpu(plugin, 0);
    auto &api = gpu.api();
    const auto blob = compileKernels(gpu);
    bp_kernel *addValue = gpu.load(blob, "add_value");
    bp_stream *s = gpu.stream();
    constexpr unsigned n = 1024;
    constexpr uint64_t bytes = n * 4;
    bp_memory *a = gpu.allocate(bytes);
    fillWith(gpu, s, a, bytes, 0);
    REQUIRE(gpu.finish(s) == BP_SUCCESS);
    const bp_binding intoA[1] = {{a, 0, bytes}};
    const Add one{1, n};
    const auto addOne = launchOf(addValue, intoA, 1, &one, sizeof one, n);
    const auto message = [&] { return std::string(gpu.error().message); };
    bp_graph *graph = nullptr;

    // A fill past the page after a valid launch: refused naming the op; the capture in progress
    // is ended, so the next graph builds.
    auto outside = AbiDevice::makeArgs<bp_fill_args>();
    outside.dst = a;
    outside.offset = bytes - 4;
    outside.size = 8;
    CHECK(createGraph(gpu, {opOf(addOne), opOf(outside)}, &graph) == BP_ERROR_INVALID_ARGUMENT);
    MESSAGE(message());
    CHECK(message().find("op 1") != std::string::npos);
    CHECK(graph == nullptr);

    auto misaligned = addOne;
    const bp_binding atOffset[1] = {{a, 4, bytes - 4}};
    misaligned.bindings = atOffset;
    CHECK(createGraph(gpu, {opOf(misaligned)}, &graph) == BP_ERROR_INVALID_ARGUMENT);

    // The grid read from memory cannot be captured: the core replays such a sequence itself.
    auto indirect = addOne;
    indirect.grid_memory = a;
    CHECK(createGraph(gpu, {opOf(addOne), opOf(indirect)}, &graph) == BP_ERROR_UNSUPPORTED);
    MESSAGE(message());

    gpu.expectOk(createGraph(gpu, {opOf(addOne), opOf(addOne)}, &graph), "graph_create");
    gpu.expectOk(api.graph_launch(gpu.get(), s, graph, &gpu.error()), "graph_launch");
    std::vector<uint32_t> host(n);
    gpu.read(s, a, 0, host.data(), bytes);
    REQUIRE(gpu.finish(s) == BP_SUCCESS);
    CHECK(countOf(host, 2u) == n);

    api.graph_release(gpu.get(), graph);
    api.memory_free(gpu.get(), a);
    api.stream_destroy(gpu.get(), s);
    api.kernel_release(gpu.get(), addValue);
}

int main(int argc, char **argv) {
    try {
        if (openPlugin()->probe().device_count == 0)
            return backplane::test::skip("the CUDA driver reports no device");
    } catch (const std::exception &e) {
        return backplane::test::skipOrFail(e, "opening and probing the CUDA plugin");
    }
    doctest::Context context(argc, argv);
    return context.run();
}
