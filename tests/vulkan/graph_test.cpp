// Tests of the Vulkan plugin's recorded sequences (ABI 1.3 graphs as reusable command buffers)
// through its C ABI (internals: detail::PluginLibrary), on lavapipe in CI. Exits 77 (SKIP) only
// when there is no Vulkan loader or device. The `vulkan_graph_validation` entry runs it under the
// Khronos validation layer (synchronization validation on); the last case asserts no errors.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include "../test_skip.hpp"
#include "plugin/plugin_library.hpp"

#include <backplane/abi/caller.hpp>
#include <backplane/log.hpp>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

using backplane::detail::PluginLibrary;
namespace abi = backplane::abi;

namespace {

std::atomic<int> gValidationErrors{0};
std::atomic<bool> gPluginLacksValidationLayer{false};
std::mutex gFirstErrorMutex;
std::string gFirstValidationError;

void installLogSink() {
    backplane::log::setLevel(backplane::log::Subsystem::Plugin, backplane::log::Level::Debug);
    backplane::log::setSink([](backplane::log::Level level, backplane::log::Subsystem,
                               std::string_view message) {
        const std::string text(message);
        if (text.find("validation: ") != std::string::npos &&
            level == backplane::log::Level::Error && gValidationErrors.fetch_add(1) == 0) {
            std::lock_guard lock(gFirstErrorMutex);
            gFirstValidationError = text;
        }
        if (text.find("validation requested but") != std::string::npos)
            gPluginLacksValidationLayer = true;
        if (level >= backplane::log::Level::Warn) std::cerr << text << "\n";
    });
}

bool validationRequested() {
    const char *value = std::getenv("BACKPLANE_VULKAN_VALIDATION");
    return value != nullptr && value[0] != '\0' && std::strcmp(value, "0") != 0;
}

std::shared_ptr<PluginLibrary> openPlugin(const std::string &options = "{}") {
    backplane::detail::PluginInitOptions init;
    init.optionsJson = options;
    // BACKPLANE_VULKAN_PLUGIN: run the built test elsewhere (the GPU machine) with its module.
    const char *path = std::getenv("BACKPLANE_VULKAN_PLUGIN");
    return PluginLibrary::open(path ? path : VULKAN_PLUGIN_PATH, "vulkan", init);
}

/// Fails the current test with the plugin's message when a call does not succeed.
#define VK_OK(call)                                                                                \
    do {                                                                                           \
        auto error_ = abi::make<bp_error>();                                                       \
        bp_error *err = &error_;                                                                   \
        const bp_status status_ = (call);                                                          \
        INFO(#call << ": " << error_.message);                                                     \
        REQUIRE(status_ == BP_SUCCESS);                                                            \
    } while (false)

/// One opened device of the plugin, with helpers over the raw table.
struct Device {
    std::shared_ptr<PluginLibrary> plugin;
    const bp_plugin_api *api = nullptr;
    abi::Owned<bp_device> device; // device_close when the Device goes
    bp_device_info info{};

    explicit Device(std::shared_ptr<PluginLibrary> p) : plugin(std::move(p)), api(&plugin->api()) {
        info = plugin->deviceInfo(0);
        const auto args = abi::make<bp_device_open_args>();
        bp_device *opened = nullptr;
        VK_OK(api->device_open(plugin->instance(), 0, &args, &opened, err));
        device = abi::Owned<bp_device>(*api, opened);
        const bool hasGraphs =
            api->struct_size >= offsetof(bp_plugin_api, graph_release) + sizeof(void *) &&
            api->graph_create != nullptr && api->graph_launch != nullptr &&
            api->graph_release != nullptr;
        REQUIRE(hasGraphs);
    }

    bp_memory *allocate(uint64_t size, bp_memory_kind kind = BP_MEMORY_DEVICE,
                        void **mapped = nullptr) {
        auto args = abi::make<bp_memory_allocate_args>();
        args.kind = kind;
        args.size = size;
        bp_memory *memory = nullptr;
        void *m = nullptr;
        VK_OK(api->memory_allocate(device.get(), &args, &memory, &m, err));
        if (mapped) *mapped = m;
        return memory;
    }
    void free(bp_memory *memory) { api->memory_free(device.get(), memory); }
    bp_stream *stream() {
        const auto args = abi::make<bp_stream_create_args>();
        bp_stream *s = nullptr;
        VK_OK(api->stream_create(device.get(), &args, &s, err));
        return s;
    }
    void destroy(bp_stream *s) { api->stream_destroy(device.get(), s); }
    bp_event *flush(bp_stream *s) {
        const auto args = abi::make<bp_flush_args>();
        bp_event *event = nullptr;
        VK_OK(api->stream_flush(device.get(), s, &args, &event, err));
        return event;
    }
    void wait(bp_event *event) { VK_OK(api->event_wait(device.get(), event, UINT64_MAX, err)); }
    void sync(bp_stream *s) {
        const abi::Owned<bp_event> event(*api, device.get(), flush(s));
        wait(event.get());
    }
    bp_kernel *kernel(const std::string &glsl, const char *entry) {
        auto args = abi::make<bp_kernel_compile_args>();
        args.dialect = BP_DIALECT_GLSL;
        args.entry_point = entry;
        args.source = glsl.data();
        args.source_size = glsl.size();
        std::vector<unsigned char> binary;
        args.binary = {&binary, [](void *user, const void *data, size_t size) {
                           auto *out = static_cast<std::vector<unsigned char> *>(user);
                           const auto *bytes = static_cast<const unsigned char *>(data);
                           out->insert(out->end(), bytes, bytes + size);
                       }};
        VK_OK(api->kernel_compile(device.get(), &args, err));
        auto load = abi::make<bp_kernel_load_args>();
        load.dialect = BP_DIALECT_GLSL;
        load.entry_point = entry;
        load.binary = binary.data();
        load.binary_size = binary.size();
        bp_kernel *k = nullptr;
        VK_OK(api->kernel_load(device.get(), &load, &k, err));
        return k;
    }
    void release(bp_kernel *k) { api->kernel_release(device.get(), k); }
    /// Reads a whole device buffer of uints (its own stream, synchronously).
    std::vector<uint32_t> download(bp_memory *memory, uint32_t count) {
        bp_stream *s = stream();
        std::vector<uint32_t> out(count);
        auto args = abi::make<bp_copy_device_to_host_args>();
        args.src = memory;
        args.dst = out.data();
        args.size = count * 4ull;
        VK_OK(api->copy_device_to_host(device.get(), s, &args, err));
        sync(s);
        destroy(s);
        return out;
    }
};

// y[i] = y[i] * 2 + x[i] * scale + add, for i < n: reads what the op before wrote, so the
// order of the ops shows in the result.
const std::string kStep = R"(#version 450
layout(local_size_x_id = 0) in;
layout(set = 0, binding = 0) readonly buffer X { uint x[]; };
layout(set = 0, binding = 1) buffer Y { uint y[]; };
layout(push_constant) uniform P { uint n; uint scale; uint add; };
void main() {
    uint i = gl_GlobalInvocationID.x;
    if (i < n) y[i] = y[i] * 2u + x[i] * scale + add;
}
)";

// Spins until the host sets `open` (a bounded spin, so a failing test cannot hang the queue):
// holds a replay pending while the test submits another one.
const std::string kGate = R"(#version 450
layout(local_size_x_id = 0) in;
layout(set = 0, binding = 0) coherent buffer Gate { uint open; uint spins; };
void main() {
    uint i = 0u;
    while (atomicAdd(open, 0u) == 0u && i < 200000000u) ++i;
    spins = i;
}
)";
constexpr uint32_t kGateLimit = 200000000u;

constexpr uint32_t kBlock = 64;

/// The arguments of one launch of kStep (or of kGate with no scalars), kept with their storage.
struct StepLaunch {
    bp_binding bindings[2];
    uint32_t scalars[3];
    bp_launch_args args;

    StepLaunch(bp_kernel *kernel, bp_memory *x, bp_memory *y, uint32_t n, uint32_t scale,
               uint32_t add)
        : bindings{{x, 0, n * 4ull}, {y, 0, n * 4ull}}, scalars{n, scale, add},
          args(abi::make<bp_launch_args>()) {
        args.kernel = kernel;
        args.grid[0] = (n + kBlock - 1) / kBlock;
        args.grid[1] = args.grid[2] = 1;
        args.block[0] = kBlock;
        args.block[1] = args.block[2] = 1;
        args.bindings = bindings;
        args.binding_count = 2;
        args.scalars = scalars;
        args.scalar_size = sizeof scalars;
    }
    StepLaunch(const StepLaunch &) = delete;
    StepLaunch &operator=(const StepLaunch &) = delete;
};

bp_copy_host_to_device_args toDevice(const void *src, bp_memory *dst, uint64_t size) {
    auto args = abi::make<bp_copy_host_to_device_args>();
    args.src = src;
    args.dst = dst;
    args.size = size;
    return args;
}
bp_copy_device_to_host_args toHost(bp_memory *src, void *dst, uint64_t size) {
    auto args = abi::make<bp_copy_device_to_host_args>();
    args.src = src;
    args.dst = dst;
    args.size = size;
    return args;
}
bp_copy_device_to_device_args copyArgs(bp_memory *src, uint64_t srcOffset, bp_memory *dst,
                                       uint64_t dstOffset, uint64_t size) {
    auto args = abi::make<bp_copy_device_to_device_args>();
    args.src = src;
    args.src_offset = srcOffset;
    args.dst = dst;
    args.dst_offset = dstOffset;
    args.size = size;
    return args;
}
bp_fill_args fillArgs(bp_memory *dst, uint64_t size, uint32_t pattern) {
    auto args = abi::make<bp_fill_args>();
    args.dst = dst;
    args.size = size;
    args.pattern = pattern;
    return args;
}

/// A bp_graph_op naming one argument struct (which must outlive graph_create).
bp_graph_op graphOp(const bp_launch_args &a) {
    auto op = abi::make<bp_graph_op>();
    op.kind = BP_GRAPH_OP_LAUNCH;
    op.launch = &a;
    return op;
}
bp_graph_op graphOp(const bp_copy_host_to_device_args &a) {
    auto op = abi::make<bp_graph_op>();
    op.kind = BP_GRAPH_OP_COPY_HOST_TO_DEVICE;
    op.to_device = &a;
    return op;
}
bp_graph_op graphOp(const bp_copy_device_to_host_args &a) {
    auto op = abi::make<bp_graph_op>();
    op.kind = BP_GRAPH_OP_COPY_DEVICE_TO_HOST;
    op.to_host = &a;
    return op;
}
bp_graph_op graphOp(const bp_copy_device_to_device_args &a) {
    auto op = abi::make<bp_graph_op>();
    op.kind = BP_GRAPH_OP_COPY_DEVICE_TO_DEVICE;
    op.copy = &a;
    return op;
}
bp_graph_op graphOp(const bp_fill_args &a) {
    auto op = abi::make<bp_graph_op>();
    op.kind = BP_GRAPH_OP_FILL;
    op.fill = &a;
    return op;
}

/// graph_create's status and message for `ops`; *out gets the graph on success.
bp_status createGraph(Device &d, const std::vector<bp_graph_op> &ops, bp_graph **out,
                      std::string &message) {
    auto args = abi::make<bp_graph_create_args>();
    args.ops = ops.data();
    args.op_count = static_cast<uint32_t>(ops.size());
    auto error = abi::make<bp_error>();
    *out = nullptr;
    const bp_status status = d.api->graph_create(d.device.get(), &args, out, &error);
    message = error.message;
    return status;
}

bp_graph *requireGraph(Device &d, const std::vector<bp_graph_op> &ops) {
    bp_graph *graph = nullptr;
    std::string message;
    const bp_status status = createGraph(d, ops, &graph, message);
    INFO(message);
    REQUIRE(status == BP_SUCCESS);
    REQUIRE(graph != nullptr);
    return graph;
}

/// The buffers one run of the replay sequence works on: x, y, z (n uints each), history (a z
/// per round), and a pinned page (input: n uints, then output: n uints).
struct Buffers {
    Device &d;
    uint32_t n;
    bp_memory *x, *y, *z, *history, *pinned;
    uint32_t *pinnedIn = nullptr, *pinnedOut = nullptr;

    Buffers(Device &device, uint32_t count, uint32_t rounds) : d(device), n(count) {
        x = d.allocate(n * 4ull);
        y = d.allocate(n * 4ull);
        z = d.allocate(n * 4ull);
        history = d.allocate(n * 4ull * rounds);
        void *mapped = nullptr;
        pinned = d.allocate(n * 8ull, BP_MEMORY_PINNED_HOST, &mapped);
        REQUIRE(mapped != nullptr);
        pinnedIn = static_cast<uint32_t *>(mapped);
        pinnedOut = pinnedIn + n;
        // Initial state: y[i] = i, z[i] = 2i + 1, x = 0 (through the pinned page).
        bp_stream *s = d.stream();
        for (uint32_t i = 0; i < n; ++i) pinnedIn[i] = i;
        auto up = toDevice(pinnedIn, y, n * 4ull);
        VK_OK(d.api->copy_host_to_device(d.device.get(), s, &up, err));
        d.sync(s);
        for (uint32_t i = 0; i < n; ++i) pinnedIn[i] = 2 * i + 1;
        up.dst = z;
        VK_OK(d.api->copy_host_to_device(d.device.get(), s, &up, err));
        const auto zero = fillArgs(x, n * 4ull, 0);
        VK_OK(d.api->fill(d.device.get(), s, &zero, err));
        d.sync(s);
        d.destroy(s);
    }
    ~Buffers() {
        for (bp_memory *m : {x, y, z, history, pinned}) d.free(m);
    }
    Buffers(const Buffers &) = delete;
    Buffers &operator=(const Buffers &) = delete;
};

/// The host's input of round r.
void writeInput(Buffers &b, uint32_t round) {
    for (uint32_t i = 0; i < b.n; ++i) b.pinnedIn[i] = i * 3 + round;
}

/// The graph's ops on `b`, in order (their argument structs live in `storage`):
///   x = in; y = 2y + 3x + 5; z = y; x = 7; z = 2z + x + 2; out = z.
struct SequenceOps {
    bp_copy_host_to_device_args input;
    StepLaunch first;
    bp_copy_device_to_device_args copy;
    bp_fill_args fill;
    StepLaunch second;
    bp_copy_device_to_host_args output;

    SequenceOps(Buffers &b, bp_kernel *step)
        : input(toDevice(b.pinnedIn, b.x, b.n * 4ull)), first(step, b.x, b.y, b.n, 3, 5),
          copy(copyArgs(b.y, 0, b.z, 0, b.n * 4ull)), fill(fillArgs(b.x, b.n * 4ull, 7)),
          second(step, b.x, b.z, b.n, 1, 2), output(toHost(b.z, b.pinnedOut, b.n * 4ull)) {}

    std::vector<bp_graph_op> ops() const {
        return {graphOp(input), graphOp(first.args), graphOp(copy),
                graphOp(fill),  graphOp(second.args), graphOp(output)};
    }
    /// The same ops through the ordinary calls.
    void record(Device &d, bp_stream *s) const {
        VK_OK(d.api->copy_host_to_device(d.device.get(), s, &input, err));
        VK_OK(d.api->kernel_launch(d.device.get(), s, &first.args, err));
        VK_OK(d.api->copy_device_to_device(d.device.get(), s, &copy, err));
        VK_OK(d.api->fill(d.device.get(), s, &fill, err));
        VK_OK(d.api->kernel_launch(d.device.get(), s, &second.args, err));
        VK_OK(d.api->copy_device_to_host(d.device.get(), s, &output, err));
    }
};

/// The ordinary work of round r around the sequence, left in the stream's open batch: before
/// it y = 2y + z + r (reads the z of the previous round), after it history[r] = z and x = 0xabc.
void recordBefore(Device &d, bp_stream *s, Buffers &b, bp_kernel *step, uint32_t round) {
    const StepLaunch before(step, b.z, b.y, b.n, 1, round);
    VK_OK(d.api->kernel_launch(d.device.get(), s, &before.args, err));
}
void recordAfter(Device &d, bp_stream *s, Buffers &b, uint32_t round) {
    const auto save = copyArgs(b.z, 0, b.history, round * b.n * 4ull, b.n * 4ull);
    VK_OK(d.api->copy_device_to_device(d.device.get(), s, &save, err));
    const auto clobber = fillArgs(b.x, b.n * 4ull, 0xabc);
    VK_OK(d.api->fill(d.device.get(), s, &clobber, err));
}

/// The host model of x, y, z, history and the output after `rounds` rounds.
struct Model {
    std::vector<uint32_t> x, y, z, history, out;
};
Model model(uint32_t n, uint32_t rounds) {
    Model m{std::vector<uint32_t>(n, 0), std::vector<uint32_t>(n), std::vector<uint32_t>(n),
            std::vector<uint32_t>(size_t{n} * rounds), std::vector<uint32_t>(n)};
    for (uint32_t i = 0; i < n; ++i) {
        m.y[i] = i;
        m.z[i] = 2 * i + 1;
    }
    for (uint32_t r = 0; r < rounds; ++r)
        for (uint32_t i = 0; i < n; ++i) {
            m.y[i] = m.y[i] * 2 + m.z[i] + r;
            m.x[i] = i * 3 + r;
            m.y[i] = m.y[i] * 2 + m.x[i] * 3 + 5;
            m.z[i] = m.y[i];
            m.x[i] = 7;
            m.z[i] = m.z[i] * 2 + m.x[i] + 2;
            m.out[i] = m.z[i];
            m.history[size_t{r} * n + i] = m.z[i];
            m.x[i] = 0xabc;
        }
    return m;
}

/// Index of the first difference, or -1.
long firstDifference(const std::vector<uint32_t> &a, const std::vector<uint32_t> &b) {
    REQUIRE(a.size() == b.size());
    for (size_t i = 0; i < a.size(); ++i)
        if (a[i] != b[i]) return static_cast<long>(i);
    return -1;
}

void checkEqual(const char *what, const std::vector<uint32_t> &got,
                const std::vector<uint32_t> &expected) {
    const long at = firstDifference(got, expected);
    INFO(std::string(what) << ": first difference at " << at << " (got "
              << (at >= 0 ? got[static_cast<size_t>(at)] : 0) << ", expected "
              << (at >= 0 ? expected[static_cast<size_t>(at)] : 0) << ")");
    CHECK(at == -1);
}

/// The replay test for one set of plugin options.
void replayMatchesOrdinaryCalls(const std::string &options) {
    CAPTURE(options);
    Device d(openPlugin(options));
    bp_kernel *step = d.kernel(kStep, "step");
    // 1 MiB per buffer: the device->device copy takes the shader path where shader_copy is on.
    const uint32_t n = 1u << 18;
    const uint32_t rounds = 3;
    const Model expected = model(n, rounds);

    // The reference: the ordinary calls, one by one.
    Buffers ref(d, n, rounds);
    {
        bp_stream *s = d.stream();
        const SequenceOps ops(ref, step);
        for (uint32_t r = 0; r < rounds; ++r) {
            writeInput(ref, r);
            recordBefore(d, s, ref, step, r);
            ops.record(d, s);
            recordAfter(d, s, ref, r);
            d.sync(s); // the host writes the next round's input into the pinned page
        }
        d.destroy(s);
    }

    // The graph: recorded once, launched in each round between the same ordinary work.
    Buffers run(d, n, rounds);
    const SequenceOps ops(run, step);
    bp_graph *graph = requireGraph(d, ops.ops());
    bp_stream *s = d.stream();
    bp_event *last = nullptr;
    for (uint32_t r = 0; r < rounds; ++r) {
        writeInput(run, r);
        recordBefore(d, s, run, step, r);
        VK_OK(d.api->graph_launch(d.device.get(), s, graph, err));
        recordAfter(d, s, run, r);
        if (last != nullptr) d.api->event_release(d.device.get(), last);
        last = d.flush(s);
        d.wait(last);
    }
    // Released right after the last launch's event completed, as the core does.
    d.api->graph_release(d.device.get(), graph);
    d.api->event_release(d.device.get(), last);
    d.destroy(s);

    std::vector<uint32_t> refOut(ref.pinnedOut, ref.pinnedOut + n);
    std::vector<uint32_t> runOut(run.pinnedOut, run.pinnedOut + n);
    checkEqual("reference output vs model", refOut, expected.out);
    checkEqual("graph output vs reference", runOut, refOut);
    checkEqual("reference history vs model", d.download(ref.history, n * rounds), expected.history);
    checkEqual("graph history vs reference", d.download(run.history, n * rounds),
               d.download(ref.history, n * rounds));
    for (auto [name, a, b] : {std::tuple{"x", run.x, ref.x}, std::tuple{"y", run.y, ref.y},
                              std::tuple{"z", run.z, ref.z}})
        checkEqual(name, d.download(a, n), d.download(b, n));
    checkEqual("y vs model", d.download(run.y, n), expected.y);
    d.release(step);
}

std::string firstMessage(Device &d, const std::vector<bp_graph_op> &ops, bp_status expected) {
    bp_graph *graph = nullptr;
    std::string message;
    const bp_status status = createGraph(d, ops, &graph, message);
    INFO(message);
    CHECK(status == expected);
    CHECK(graph == nullptr);
    if (graph != nullptr) d.api->graph_release(d.device.get(), graph);
    return message;
}

} // namespace

TEST_CASE("a graph of a kernel, copies and a fill replays exactly like the same calls one by "
          "one, interleaved with ordinary stream work") {
    replayMatchesOrdinaryCalls("{}");
}

TEST_CASE("a graph replays correctly with descriptor pools and the shader copy") {
    // The graph's descriptor sets come from its own pools (the streams' pools are reset after
    // each batch) and the 1 MiB copy becomes a dispatch of the copy kernel.
    replayMatchesOrdinaryCalls(R"({"push_descriptors": false, "shader_copy": "on"})");
}

TEST_CASE("two streams launch one graph while its first launch is still pending, ordered by an "
          "event") {
    Device d(openPlugin());
    bp_kernel *gate = d.kernel(kGate, "gate");
    bp_kernel *step = d.kernel(kStep, "step");
    const uint32_t n = 4096;
    void *gateHost = nullptr;
    bp_memory *gateMemory = d.allocate(256, BP_MEMORY_HOST_VISIBLE, &gateHost);
    auto *gateWords = static_cast<volatile uint32_t *>(gateHost);
    gateWords[0] = 0; // closed
    gateWords[1] = 0;
    Buffers b(d, n, 1);

    const bp_binding gateBinding{gateMemory, 0, 8};
    auto gateLaunch = abi::make<bp_launch_args>();
    gateLaunch.kernel = gate;
    gateLaunch.grid[0] = gateLaunch.grid[1] = gateLaunch.grid[2] = 1;
    gateLaunch.block[0] = gateLaunch.block[1] = gateLaunch.block[2] = 1;
    gateLaunch.bindings = &gateBinding;
    gateLaunch.binding_count = 1;
    const StepLaunch stepLaunch(step, b.z, b.y, n, 1, 1); // y = 2y + z + 1
    bp_graph *graph = requireGraph(d, {graphOp(gateLaunch), graphOp(stepLaunch.args)});

    bp_stream *first = d.stream();
    bp_stream *second = d.stream();
    VK_OK(d.api->graph_launch(d.device.get(), first, graph, err));
    bp_event *firstDone = d.flush(first);
    VK_OK(d.api->stream_wait_event(d.device.get(), second, firstDone, err));
    VK_OK(d.api->graph_launch(d.device.get(), second, graph, err));
    bp_event *secondDone = d.flush(second);
    // The window this test is about: the command buffer was submitted again while pending.
    auto error = abi::make<bp_error>();
    CHECK(d.api->event_query(d.device.get(), firstDone, &error) == BP_ERROR_NOT_READY);
    reinterpret_cast<std::atomic<uint32_t> *>(gateHost)->store(1); // open
    d.wait(secondDone);
    d.api->graph_release(d.device.get(), graph);
    CHECK(d.api->event_query(d.device.get(), firstDone, &error) == BP_SUCCESS);
    CHECK(gateWords[1] < kGateLimit); // the gate opened; it did not time out

    std::vector<uint32_t> expected(n);
    for (uint32_t i = 0; i < n; ++i) expected[i] = (i * 2 + (2 * i + 1) + 1) * 2 + (2 * i + 1) + 1;
    checkEqual("y after two launches", d.download(b.y, n), expected);

    d.api->event_release(d.device.get(), firstDone);
    d.api->event_release(d.device.get(), secondDone);
    d.destroy(first);
    d.destroy(second);
    d.free(gateMemory);
    d.release(gate);
    d.release(step);
}

TEST_CASE("an indirect dispatch in a graph reads its grid at each replay") {
    Device d(openPlugin());
    bp_kernel *step = d.kernel(kStep, "step");
    const uint32_t n = 1024;
    Buffers b(d, n, 1);
    bp_memory *grid = d.allocate(16);
    StepLaunch indirect(step, b.z, b.y, n, 0, 1); // y = 2y + 1 over the grid's blocks
    indirect.args.grid_memory = grid;
    indirect.args.grid_offset = 0;
    bp_graph *graph = requireGraph(d, {graphOp(indirect.args)});

    bp_stream *s = d.stream();
    std::vector<uint32_t> expected(n);
    for (uint32_t i = 0; i < n; ++i) expected[i] = i;
    // Each round the stream writes another block count just before the launch (same batch).
    for (uint32_t blocks : {4u, 16u, 0u}) {
        const uint32_t dims[3] = {blocks, 1, 1};
        const auto write = toDevice(dims, grid, sizeof dims);
        VK_OK(d.api->copy_host_to_device(d.device.get(), s, &write, err));
        VK_OK(d.api->graph_launch(d.device.get(), s, graph, err));
        for (uint32_t i = 0; i < std::min(n, blocks * kBlock); ++i)
            expected[i] = expected[i] * 2 + 1;
    }
    d.sync(s);
    d.api->graph_release(d.device.get(), graph);
    checkEqual("y", d.download(b.y, n), expected);
    d.destroy(s);
    d.free(grid);
    d.release(step);
}

TEST_CASE("graph ops are checked like the ordinary calls, naming the op") {
    Device d(openPlugin());
    bp_kernel *step = d.kernel(kStep, "step");
    const uint32_t n = 256;
    Buffers b(d, n, 1);
    const auto fine = fillArgs(b.y, n * 4ull, 1);

    const auto outside = fillArgs(b.y, n * 8ull, 1);
    CHECK(firstMessage(d, {graphOp(fine), graphOp(outside)}, BP_ERROR_INVALID_ARGUMENT)
              .find("graph_create: op 1: fill: range") == 0);

    const auto overlap = copyArgs(b.y, 0, b.y, 8, 64);
    CHECK(firstMessage(d, {graphOp(overlap)}, BP_ERROR_INVALID_ARGUMENT).find("overlap") !=
          std::string::npos);

    std::vector<uint32_t> pageable(n);
    const auto fromPageable = toDevice(pageable.data(), b.y, n * 4ull);
    CHECK(firstMessage(d, {graphOp(fine), graphOp(fromPageable)}, BP_ERROR_INVALID_ARGUMENT)
              .find("PINNED_HOST") != std::string::npos);
    const auto intoPageable = toHost(b.y, pageable.data(), n * 4ull);
    CHECK(firstMessage(d, {graphOp(intoPageable)}, BP_ERROR_INVALID_ARGUMENT)
              .find("graph_create: op 0") == 0);

    StepLaunch noScalars(step, b.x, b.y, n, 1, 1);
    noScalars.args.scalar_size = 4; // the shader reads 12 bytes
    CHECK(firstMessage(d, {graphOp(noScalars.args)}, BP_ERROR_INVALID_ARGUMENT).find("push constants") !=
          std::string::npos);
    StepLaunch noMemory(step, b.x, b.y, n, 1, 1);
    noMemory.bindings[1].memory = nullptr;
    firstMessage(d, {graphOp(fine), graphOp(noMemory.args)}, BP_ERROR_INVALID_ARGUMENT);

    // A graph is fixed: graph_update is refused, so the core builds a new graph.
    const StepLaunch launch(step, b.x, b.y, n, 1, 1);
    bp_graph *graph = requireGraph(d, {graphOp(launch.args)});
    if (d.api->graph_update != nullptr) {
        const StepLaunch changed(step, b.x, b.y, n, 2, 2);
        const bp_graph_op op = graphOp(changed.args);
        auto error = abi::make<bp_error>();
        CHECK(d.api->graph_update(d.device.get(), graph, 0, &op, &error) == BP_ERROR_UNSUPPORTED);
    }
    d.api->graph_release(d.device.get(), graph); // never launched
    d.release(step);
}

TEST_CASE("the validation layer reported no errors") {
    // Runs last: every graph above ran under the layer in the `vulkan_graph_validation` entry.
    const bool validation = validationRequested();
    const std::string summary = std::string("validation ") + (validation ? "on" : "off") +
                                ", errors: " + std::to_string(gValidationErrors.load());
    MESSAGE(summary);
    if (validation) CHECK_FALSE(gPluginLacksValidationLayer.load());
    std::lock_guard lock(gFirstErrorMutex);
    INFO(gFirstValidationError);
    CHECK(gValidationErrors.load() == 0);
}

int main(int argc, char **argv) {
    installLogSink();
    try {
        if (openPlugin()->probe().device_count == 0)
            return backplane::test::skip("the Vulkan plugin found no device");
    } catch (const std::exception &e) {
        return backplane::test::skipOrFail(e, "opening and probing the Vulkan plugin");
    }
    doctest::Context context(argc, argv);
    return context.run();
}
