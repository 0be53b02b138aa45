// Conformance cases "graph.*": recorded sequences (ABI 1.3) through the raw table: graph_create's
// refusals, replays equal to the ordinary calls, stream order, graph_update and release.
//
// Graphs are optional. A plugin whose table lacks graph_create, graph_launch and graph_release,
// or whose graph_create answers BP_ERROR_UNSUPPORTED even for a graph of one fill (an SDK plugin
// that does not override createGraph), has no graphs: the core replays recorded calls itself,
// and every case is not applicable. Once a device builds graphs, plugin.h allows
// BP_ERROR_UNSUPPORTED from graph_create only for ops its graphs cannot hold (its examples:
// indirect dispatch, a kind the plugin does not know); these cases use neither, except the
// unknown kinds of graph.create_rejects_bad_arguments.
#include "handles.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

namespace backplane::conformance {
namespace {

constexpr uint32_t kFloats = 4096; // elements of the saxpy pages (16 KiB)
constexpr uint64_t kBytes = uint64_t{kFloats} * sizeof(float);

const char *opName(bp_graph_op_kind kind) {
    switch (kind) {
    case BP_GRAPH_OP_LAUNCH:
        return "launch";
    case BP_GRAPH_OP_COPY_HOST_TO_DEVICE:
        return "host->device copy";
    case BP_GRAPH_OP_COPY_DEVICE_TO_HOST:
        return "device->host copy";
    case BP_GRAPH_OP_COPY_DEVICE_TO_DEVICE:
        return "device->device copy";
    case BP_GRAPH_OP_FILL:
        return "fill";
    }
    return "unknown kind";
}

// Ops and their argument structs ------------------------------------------------------------------

bp_graph_op opOf(const bp_launch_args &a) {
    auto op = abi::make<bp_graph_op>();
    op.kind = BP_GRAPH_OP_LAUNCH;
    op.launch = &a;
    return op;
}
bp_graph_op opOf(const bp_copy_host_to_device_args &a) {
    auto op = abi::make<bp_graph_op>();
    op.kind = BP_GRAPH_OP_COPY_HOST_TO_DEVICE;
    op.to_device = &a;
    return op;
}
bp_graph_op opOf(const bp_copy_device_to_host_args &a) {
    auto op = abi::make<bp_graph_op>();
    op.kind = BP_GRAPH_OP_COPY_DEVICE_TO_HOST;
    op.to_host = &a;
    return op;
}
bp_graph_op opOf(const bp_copy_device_to_device_args &a) {
    auto op = abi::make<bp_graph_op>();
    op.kind = BP_GRAPH_OP_COPY_DEVICE_TO_DEVICE;
    op.copy = &a;
    return op;
}
bp_graph_op opOf(const bp_fill_args &a) {
    auto op = abi::make<bp_graph_op>();
    op.kind = BP_GRAPH_OP_FILL;
    op.fill = &a;
    return op;
}

bp_copy_host_to_device_args toDeviceArgs(const void *src, const Page &dst, uint64_t dstOffset,
                                         uint64_t size) {
    auto a = abi::make<bp_copy_host_to_device_args>();
    a.src = src;
    a.dst = dst.get();
    a.dst_offset = dstOffset;
    a.size = size;
    return a;
}
bp_copy_device_to_host_args toHostArgs(const Page &src, uint64_t srcOffset, void *dst,
                                       uint64_t size) {
    auto a = abi::make<bp_copy_device_to_host_args>();
    a.src = src.get();
    a.src_offset = srcOffset;
    a.dst = dst;
    a.size = size;
    return a;
}
bp_copy_device_to_device_args copyArgs(const Page &src, uint64_t srcOffset, const Page &dst,
                                       uint64_t dstOffset, uint64_t size) {
    auto a = abi::make<bp_copy_device_to_device_args>();
    a.src = src.get();
    a.src_offset = srcOffset;
    a.dst = dst.get();
    a.dst_offset = dstOffset;
    a.size = size;
    return a;
}
bp_fill_args fillArgs(const Page &dst, uint64_t offset, uint64_t size, uint32_t pattern) {
    auto a = abi::make<bp_fill_args>();
    a.dst = dst.get();
    a.offset = offset;
    a.size = size;
    a.pattern = pattern;
    return a;
}

/// Issues `op` as the ordinary call of its kind (kernel_launch, copy_*, fill) on `stream`.
void issue(OpenDevice &device, const Stream &stream, const bp_graph_op &op,
           const std::string &what) {
    const bp_plugin_api &api = device.api();
    bp_error error = makeError();
    bp_status status = BP_ERROR_INVALID_ARGUMENT;
    switch (op.kind) {
    case BP_GRAPH_OP_LAUNCH:
        status = api.kernel_launch(device.get(), stream.get(), op.launch, &error);
        break;
    case BP_GRAPH_OP_COPY_HOST_TO_DEVICE:
        status = api.copy_host_to_device(device.get(), stream.get(), op.to_device, &error);
        break;
    case BP_GRAPH_OP_COPY_DEVICE_TO_HOST:
        status = api.copy_device_to_host(device.get(), stream.get(), op.to_host, &error);
        break;
    case BP_GRAPH_OP_COPY_DEVICE_TO_DEVICE:
        status = api.copy_device_to_device(device.get(), stream.get(), op.copy, &error);
        break;
    case BP_GRAPH_OP_FILL:
        status = api.fill(device.get(), stream.get(), op.fill, &error);
        break;
    }
    succeed(status, error, what + " (" + opName(op.kind) + " as an ordinary call)");
}

// Graphs through the table ------------------------------------------------------------------------

bp_status tryCreateGraph(OpenDevice &device, const bp_graph_op *ops, uint32_t count, Graph &out,
                         bp_error &error) {
    auto args = abi::make<bp_graph_create_args>();
    args.ops = ops;
    args.op_count = count;
    bp_graph *graph = nullptr;
    const bp_status status = device.api().graph_create(device.get(), &args, &graph, &error);
    // Whatever came back is released, even from a call that should have failed.
    if (graph != nullptr) out = Graph(device.api(), device.get(), graph);
    return status;
}

std::string describe(const std::vector<bp_graph_op> &ops) {
    std::string text;
    for (const bp_graph_op &op : ops)
        text += (text.empty() ? "" : ", ") + std::string(opName(op.kind));
    return "[" + text + "]";
}

/// Creates a graph of plain ops (no indirect dispatch, known kinds), which a device with graphs
/// must build: plugin.h allows BP_ERROR_UNSUPPORTED only for ops its graphs cannot hold.
Graph createGraph(OpenDevice &device, const std::vector<bp_graph_op> &ops) {
    Graph graph;
    bp_error error = makeError();
    const bp_status status =
        tryCreateGraph(device, ops.data(), static_cast<uint32_t>(ops.size()), graph, error);
    const std::string what = "graph_create of " + describe(ops);
    if (status == BP_ERROR_UNSUPPORTED)
        throw CaseFailure(what + " returned unsupported (" + errorMessage(error) +
                          "), although the device builds graphs (a graph of one fill worked); "
                          "plugin.h allows unsupported only for ops a graph cannot hold, such as "
                          "indirect dispatch, and these are plain launches, copies and fills");
    succeed(status, error, what);
    require(graph.get() != nullptr, what + " succeeded but returned a NULL graph");
    return graph;
}

void launchGraph(OpenDevice &device, const Stream &stream, const Graph &graph,
                 const std::string &what) {
    bp_error error = makeError();
    succeed(device.api().graph_launch(device.get(), stream.get(), graph.get(), &error), error,
            "graph_launch (" + what + ")");
}

bp_status query(OpenDevice &device, const Event &event) {
    bp_error error = makeError();
    return device.api().event_query(device.get(), event.get(), &error);
}

/// The device under test when it builds graphs; NotApplicable when it has none (the table lacks
/// the functions, or a graph of one fill is unsupported: the core then replays calls itself).
OpenDevice &requireGraphs(CaseContext &ctx) {
    const RawPlugin &plugin = ctx.raw();
    const bool create = plugin.has(&bp_plugin_api::graph_create);
    const bool launch = plugin.has(&bp_plugin_api::graph_launch);
    const bool release = plugin.has(&bp_plugin_api::graph_release);
    if (!create && !launch && !release)
        throw NotApplicable("the table has no graph_create, graph_launch or graph_release "
                            "(recorded sequences are optional, ABI 1.3)");
    require(create && launch && release,
            std::string("the table provides only some of the graph functions: graph_create ") +
                (create ? "yes" : "no") + ", graph_launch " + (launch ? "yes" : "no") +
                ", graph_release " + (release ? "yes" : "no") +
                " (a graph that can be created must be launchable and releasable)");
    OpenDevice &device = ctx.device();
    const Page page = device.allocate(BP_MEMORY_DEVICE, 4096);
    const bp_fill_args fill = fillArgs(page, 0, 4096, 0x01020304u);
    const bp_graph_op op = opOf(fill);
    Graph graph;
    bp_error error = makeError();
    const bp_status status = tryCreateGraph(device, &op, 1, graph, error);
    if (status == BP_ERROR_UNSUPPORTED) {
        expectFailure(status, error, {BP_ERROR_UNSUPPORTED}, "graph_create of a one-fill graph");
        require(graph.get() == nullptr, "graph_create returned unsupported but also a graph");
        throw NotApplicable("graph_create of a one-fill graph answered unsupported (" +
                            errorMessage(error) +
                            "): the device has no graphs, the core replays recorded calls");
    }
    succeed(status, error, "graph_create of a one-fill graph");
    require(graph.get() != nullptr, "graph_create of a one-fill graph returned a NULL graph");
    return device;
}

/// Saxpy's block size, as in the kernel.* cases.
uint32_t saxpyBlock(const bp_device_info &info) {
    return std::max<uint32_t>(1, std::min({64u, info.max_block_size[0], info.max_block_threads}));
}

// Holding a stream --------------------------------------------------------------------------------

/// A host kernel that blocks its stream until the gate opens (or 30 s passed, so that a case that
/// fails cannot hang its worker).
std::atomic<bool> gGateOpen{true};
void gateHost(const bp_host_kernel_context *) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!gGateOpen.load() && std::chrono::steady_clock::now() < until)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
}
const bp_host_kernel_source kGateHost = hostKernelSource(&gateHost);

/// Holds streams while a case records the work whose order it checks. With the host dialect and
/// async streams a gate kernel holds them until open(); elsewhere large saxpy launches keep the
/// device busy, which usually keeps the window open but does not guarantee it (held() is false).
/// Declare it after the streams it holds: its destructor opens the gate and waits for them before
/// its own pages go.
class Hold {
public:
    Hold(CaseContext &ctx, const Kernel &saxpy)
        : device_(ctx.device()), saxpy_(saxpy), block_(saxpyBlock(ctx.info())),
          gated_(ctx.accepts(BP_DIALECT_HOST) && ctx.declares(BP_CAPABILITY_ASYNC_STREAMS)) {
        if (gated_) {
            std::vector<uint8_t> blob;
            std::string log;
            bp_error error = makeError();
            succeed(compileKernel(device_, BP_DIALECT_HOST, {&kGateHost, sizeof(kGateHost), "gate"},
                                  blob, log, error),
                    error, "kernel_compile(gate host kernel)");
            auto load = abi::make<bp_kernel_load_args>();
            load.dialect = BP_DIALECT_HOST;
            load.entry_point = "gate";
            load.binary = blob.data();
            load.binary_size = blob.size();
            bp_kernel *kernel = nullptr;
            error = makeError();
            succeed(device_.api().kernel_load(device_.get(), &load, &kernel, &error), error,
                    "kernel_load(gate host kernel)");
            gate_ = Kernel(device_.api(), device_.get(), kernel);
            return;
        }
        const bp_device_info &info = ctx.info();
        const uint64_t bytes =
            std::min<uint64_t>(16ull << 20, info.max_allocation_bytes) & ~4095ull;
        busyCount_ = static_cast<uint32_t>(
            std::min<uint64_t>(bytes / sizeof(float), uint64_t{info.max_grid_size[0]} * block_));
        busyX_ = device_.allocate(BP_MEMORY_DEVICE, bytes);
        busyY_ = device_.allocate(BP_MEMORY_DEVICE, bytes);
    }
    ~Hold() {
        gGateOpen.store(true);
        for (const Stream *stream : held_) {
            try {
                device_.finish(*stream);
            } catch (const std::exception &) {
                // The case already failed; its reason matters more than this one.
            }
        }
    }
    Hold(const Hold &) = delete;
    Hold &operator=(const Hold &) = delete;

    /// True when the window is certainly open until open().
    bool held() const noexcept { return gated_; }

    /// Records the holding work on `stream`.
    void close(const Stream &stream) {
        if (std::find(held_.begin(), held_.end(), &stream) == held_.end()) held_.push_back(&stream);
        bp_error error = makeError();
        if (gated_) {
            gGateOpen.store(false);
            auto g = abi::make<bp_launch_args>();
            g.kernel = gate_.get();
            g.grid[0] = g.grid[1] = g.grid[2] = 1;
            g.block[0] = g.block[1] = g.block[2] = 1;
            succeed(device_.api().kernel_launch(device_.get(), stream.get(), &g, &error), error,
                    "kernel_launch(gate host kernel)");
            return;
        }
        // Uninitialised pages: only the time matters, the results are never read.
        for (int i = 0; i < 4; ++i) {
            error = makeError();
            succeed(device_.launchSaxpy(stream, saxpy_, busyX_, busyY_, 1.0f, busyCount_, error, 0,
                                        block_),
                    error,
                    "kernel_launch(saxpy over " + std::to_string(busyCount_) +
                        " elements, to keep the device busy)");
        }
    }

    void open() { gGateOpen.store(true); }

    /// With the gate: `event` (flushed after the held work) must still be pending.
    void checkPending(const Event &event, const std::string &what) {
        if (!gated_) return;
        const bp_status status = query(device_, event);
        require(status == BP_ERROR_NOT_READY, "event_query of " + what +
                                                  " behind a blocked gate kernel returned " +
                                                  toString(status) + ", expected not_ready");
    }

private:
    OpenDevice &device_;
    const Kernel &saxpy_;
    uint32_t block_;
    bool gated_;
    Kernel gate_;
    Page busyX_, busyY_;
    uint32_t busyCount_ = 0;
    std::vector<const Stream *> held_;
};

// Values ------------------------------------------------------------------------------------------

/// Exactly representable inputs: x[i] in [-48 + shift, 48 + shift], y[i] in [0, 12].
std::vector<float> xValues(size_t n, int shift = 0) {
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i)
        v[i] = static_cast<float>(static_cast<int>(i % 97) - 48 + shift);
    return v;
}
std::vector<float> yValues(size_t n) {
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i)
        v[i] = static_cast<float>(i % 13);
    return v;
}
/// y + a * x, element by element (exact for the values above).
std::vector<float> axpy(float a, const std::vector<float> &x, std::vector<float> y) {
    for (size_t i = 0; i < y.size(); ++i)
        y[i] = a * x[i] + y[i];
    return y;
}
std::vector<uint8_t> filled(size_t size, uint32_t pattern) {
    std::vector<uint8_t> bytes(size);
    for (size_t i = 0; i + 4 <= size; i += 4)
        std::memcpy(bytes.data() + i, &pattern, 4);
    return bytes;
}

/// Fails unless the bytes are equal; the message names the first differing byte.
void requireBytes(const std::vector<uint8_t> &got, const std::vector<uint8_t> &expected,
                  const std::string &what) {
    require(got.size() == expected.size(), what + ": " + std::to_string(got.size()) +
                                               " bytes, expected " +
                                               std::to_string(expected.size()));
    const auto [a, b] = std::mismatch(got.begin(), got.end(), expected.begin());
    if (a == got.end()) return;
    const size_t at = static_cast<size_t>(a - got.begin());
    size_t wrong = 0;
    for (size_t i = at; i < got.size(); ++i)
        wrong += got[i] != expected[i] ? 1 : 0;
    throw CaseFailure(what + ": " + std::to_string(wrong) + " of " + std::to_string(got.size()) +
                      " bytes differ; first at byte " + std::to_string(at) + " (float " +
                      std::to_string(at / 4) + "): got " + std::to_string(*a) + ", expected " +
                      std::to_string(*b));
}

void requireFloats(OpenDevice &device, const Stream &stream, const Page &page,
                   const std::vector<float> &expected, const std::string &what) {
    requireBytes(device.readAll(stream, page), floatBytes(expected), what);
}

/// The pages and argument structs of graph.replay_matches_calls' sequence; ops() points into it.
/// [0] y = 2x + y (saxpy), [1] copy y -> z, [2] fill part of z, [3] upload the pinned input into
/// x (read by the next round's saxpy), [4] download z into the pinned output.
class ReplaySequence {
public:
    ReplaySequence(OpenDevice &device, const Stream &stream, const Kernel &kernel, uint32_t block)
        : x(device.pageWith(stream, floatBytes(xValues(kFloats)))),
          y(device.pageWith(stream, floatBytes(yValues(kFloats)))),
          z(device.pageWith(stream, std::vector<uint8_t>(kBytes, 0))),
          in(device.allocateIfSupported(BP_MEMORY_PINNED_HOST, kBytes)),
          out(device.allocateIfSupported(BP_MEMORY_PINNED_HOST, kBytes)) {
        if (!in.memory || !out.memory)
            throw NotApplicable("the device has no PINNED_HOST pages, which the host addresses "
                                "of a graph's copies must lie in");
        std::memset(out.mapped, 0, kBytes);
        launch_ = saxpyArgs(kernel, x, y, 2.0f, kFloats, block, 0, bindings_, scalars_);
        copy_ = copyArgs(y, 0, z, 0, kBytes);
        fill_ = fillArgs(z, 1024, 4096, 0x3f800000u);
        upload_ = toDeviceArgs(in.mapped, x, 0, kBytes);
        download_ = toHostArgs(z, 0, out.mapped, kBytes);
    }
    ReplaySequence(const ReplaySequence &) = delete;
    ReplaySequence &operator=(const ReplaySequence &) = delete;

    std::vector<bp_graph_op> ops() const {
        return {opOf(launch_), opOf(copy_), opOf(fill_), opOf(upload_), opOf(download_)};
    }
    std::vector<uint8_t> output() const {
        const auto *bytes = static_cast<const uint8_t *>(out.mapped);
        return {bytes, bytes + kBytes};
    }

    Page x, y, z, in, out;

private:
    bp_binding bindings_[2] = {};
    SaxpyScalars scalars_{};
    bp_launch_args launch_{};
    bp_copy_device_to_device_args copy_{};
    bp_fill_args fill_{};
    bp_copy_host_to_device_args upload_{};
    bp_copy_device_to_host_args download_{};
};

} // namespace

// graph_create refusals ---------------------------------------------------------------------------

CONFORMANCE_CASE("graph.create_rejects_bad_arguments",
                 "graph_create refuses op_count 0, NULL ops, an unknown kind, a kind whose pointer "
                 "is NULL, a launch with a NULL kernel and copies or fills past their page with "
                 "BP_ERROR_INVALID_ARGUMENT, creating nothing and writing nothing.") {
    OpenDevice &device = requireGraphs(ctx);
    Stream stream = device.createStream();
    const std::vector<uint8_t> original = patternBytes(4096, 70);
    const Page page = device.pageWith(stream, original), other = device.pageWith(stream, original);
    const Page pinned = device.allocateIfSupported(BP_MEMORY_PINNED_HOST, 4096);
    std::vector<uint8_t> hostFallback(4096, 0);
    void *host = pinned.memory ? pinned.mapped : hostFallback.data();
    const Kernel kernel = device.saxpy();

    // Valid arguments of every kind; each bad graph is a valid fill followed by one bad op, so a
    // plugin must check every op, not only the first.
    bp_binding bindings[2];
    SaxpyScalars scalars;
    const bp_launch_args launch =
        saxpyArgs(kernel, page, other, 2.0f, 1024, saxpyBlock(ctx.info()), 0, bindings, scalars);
    const bp_copy_host_to_device_args toDevice = toDeviceArgs(host, page, 0, 4096);
    const bp_copy_device_to_host_args toHost = toHostArgs(page, 0, host, 4096);
    const bp_copy_device_to_device_args copy = copyArgs(page, 0, other, 0, 4096);
    const bp_fill_args fill = fillArgs(page, 0, 4096, 0xa5a5a5a5u);

    const auto refused = [&](const bp_graph_op *ops, uint32_t count,
                             std::initializer_list<bp_status> allowed, const std::string &what) {
        Graph graph;
        bp_error error = makeError();
        const bp_status status = tryCreateGraph(device, ops, count, graph, error);
        expectFailure(status, error, allowed, "graph_create with " + what);
        require(graph.get() == nullptr,
                "graph_create with " + what +
                    " failed but returned a graph (nothing may be created)");
    };
    const auto refusedAfterFill = [&](const bp_graph_op &bad,
                                      std::initializer_list<bp_status> allowed,
                                      const std::string &what) {
        const bp_graph_op ops[2] = {opOf(fill), bad};
        refused(ops, 2, allowed, what + " as op 1 (after a valid fill)");
    };

    const bp_graph_op fillOp = opOf(fill);
    refused(&fillOp, 0, {BP_ERROR_INVALID_ARGUMENT}, "op_count 0");
    refused(nullptr, 1, {BP_ERROR_INVALID_ARGUMENT}, "ops NULL and op_count 1");
    {
        Graph graph;
        bp_error error = makeError();
        bp_graph *raw = nullptr;
        const bp_status status = device.api().graph_create(device.get(), nullptr, &raw, &error);
        if (raw != nullptr) graph = Graph(device.api(), device.get(), raw);
        expectFailure(status, error, {BP_ERROR_INVALID_ARGUMENT}, "graph_create with args NULL");
        require(raw == nullptr, "graph_create with args NULL failed but returned a graph");
    }

    // Every pointer set, so a plugin cannot refuse the op for a NULL pointer instead of its kind.
    auto all = abi::make<bp_graph_op>();
    all.launch = &launch;
    all.to_device = &toDevice;
    all.to_host = &toHost;
    all.copy = &copy;
    all.fill = &fill;
    for (const int kind : {5, 77, -1}) {
        bp_graph_op op = all;
        op.kind = rawEnum<bp_graph_op_kind>(kind);
        // plugin.h: "a plugin that cannot build a graph for some op (..., a kind it does not
        // know) returns BP_ERROR_UNSUPPORTED": a kind of a later ABI must not be an error the core
        // reports. Both answers are allowed.
        refusedAfterFill(op, {BP_ERROR_INVALID_ARGUMENT, BP_ERROR_UNSUPPORTED},
                         "op kind " + std::to_string(kind) + " (not a bp_graph_op_kind)");
    }
    for (const bp_graph_op_kind kind :
         {BP_GRAPH_OP_LAUNCH, BP_GRAPH_OP_COPY_HOST_TO_DEVICE, BP_GRAPH_OP_COPY_DEVICE_TO_HOST,
          BP_GRAPH_OP_COPY_DEVICE_TO_DEVICE, BP_GRAPH_OP_FILL}) {
        bp_graph_op op = all;
        op.kind = kind;
        switch (kind) {
        case BP_GRAPH_OP_LAUNCH:
            op.launch = nullptr;
            break;
        case BP_GRAPH_OP_COPY_HOST_TO_DEVICE:
            op.to_device = nullptr;
            break;
        case BP_GRAPH_OP_COPY_DEVICE_TO_HOST:
            op.to_host = nullptr;
            break;
        case BP_GRAPH_OP_COPY_DEVICE_TO_DEVICE:
            op.copy = nullptr;
            break;
        case BP_GRAPH_OP_FILL:
            op.fill = nullptr;
            break;
        }
        refusedAfterFill(op, {BP_ERROR_INVALID_ARGUMENT},
                         std::string("a ") + opName(kind) + " op whose argument pointer is NULL");
    }

    bp_launch_args nullKernel = launch;
    nullKernel.kernel = nullptr;
    refusedAfterFill(opOf(nullKernel), {BP_ERROR_INVALID_ARGUMENT}, "a launch with kernel NULL");

    const bp_copy_host_to_device_args toDevicePast = toDeviceArgs(host, page, 4092, 8);
    refusedAfterFill(opOf(toDevicePast), {BP_ERROR_INVALID_ARGUMENT},
                     "a host->device copy of 8 bytes at offset 4092 of a 4096-byte page");
    const bp_copy_device_to_host_args toHostPast = toHostArgs(page, 4096, host, 4);
    refusedAfterFill(opOf(toHostPast), {BP_ERROR_INVALID_ARGUMENT},
                     "a device->host copy of 4 bytes at offset 4096 of a 4096-byte page");
    const bp_copy_device_to_device_args srcPast = copyArgs(page, 8, other, 0, 4096);
    refusedAfterFill(opOf(srcPast), {BP_ERROR_INVALID_ARGUMENT},
                     "a device->device copy of 4096 bytes from offset 8 of a 4096-byte page");
    const bp_copy_device_to_device_args dstOverflow = copyArgs(page, 0, other, UINT64_MAX - 3, 8);
    refusedAfterFill(opOf(dstOverflow), {BP_ERROR_INVALID_ARGUMENT},
                     "a device->device copy to offset 2^64-4 (offset + size overflows)");
    const bp_fill_args fillPast = fillArgs(page, 4096, 4, 0);
    refusedAfterFill(opOf(fillPast), {BP_ERROR_INVALID_ARGUMENT},
                     "a fill of 4 bytes at offset 4096 of a 4096-byte page");

    // graph_create touches no stream: the refused graphs' fills and copies wrote nothing.
    requireBytes(device.readAll(stream, page), original, "the page after refused graph_creates");
    requireBytes(device.readAll(stream, other), original,
                 "the other page after refused graph_creates");
}

// Replays -----------------------------------------------------------------------------------------

CONFORMANCE_CASE("graph.replay_matches_calls",
                 "A graph of [saxpy launch, device->device copy, fill, host->device copy from a "
                 "pinned page, device->host copy into a pinned page] launched 3 times, with the "
                 "pinned input changed between launches, leaves the same bytes as the same ops "
                 "issued as ordinary calls.") {
    OpenDevice &device = requireGraphs(ctx);
    const Kernel kernel = device.saxpy();
    const uint32_t block = saxpyBlock(ctx.info());
    // Kernel and pages first, the graph next, the stream last: each released after its users.
    Stream setup = device.createStream();
    ReplaySequence replayed(device, setup, kernel, block), called(device, setup, kernel, block);
    const Graph graph = createGraph(device, replayed.ops());
    Stream stream = device.createStream();
    for (int round = 0; round < 3; ++round) {
        const std::string when = "round " + std::to_string(round + 1) + " of 3";
        const std::vector<uint8_t> input = floatBytes(xValues(kFloats, 7 * (round + 1)));
        std::memcpy(replayed.in.mapped, input.data(), kBytes);
        std::memcpy(called.in.mapped, input.data(), kBytes);
        launchGraph(device, stream, graph, when);
        device.finish(stream);
        const std::vector<bp_graph_op> ops = called.ops();
        for (size_t i = 0; i < ops.size(); ++i)
            issue(device, stream, ops[i], when + ", op " + std::to_string(i));
        device.finish(stream);
        requireBytes(replayed.output(), called.output(),
                     when + ": the pinned output of the graph's device->host copy vs the "
                            "ordinary calls'");
    }
    requireBytes(device.readAll(stream, replayed.x), device.readAll(stream, called.x),
                 "x (saxpy input, written by the host->device copy) after 3 replays vs 3 rounds "
                 "of ordinary calls");
    requireBytes(device.readAll(stream, replayed.y), device.readAll(stream, called.y),
                 "y (written by the saxpy launch) after 3 replays vs 3 rounds of ordinary calls");
    requireBytes(device.readAll(stream, replayed.z), device.readAll(stream, called.z),
                 "z (written by the copy and the fill) after 3 replays vs 3 rounds of ordinary "
                 "calls");
}

// Stream order ------------------------------------------------------------------------------------

CONFORMANCE_CASE("graph.launch_is_stream_ordered",
                 "A graph launch runs after the work recorded before it on its stream and before "
                 "the work recorded after it, and on another stream orders like a launch through "
                 "stream_wait_event, in both directions.") {
    OpenDevice &device = requireGraphs(ctx);
    const Kernel kernel = device.saxpy();
    const uint32_t block = saxpyBlock(ctx.info());
    constexpr uint32_t kBefore = 0x11111111u, kGraph = 0x33333333u;
    const std::vector<float> x = xValues(kFloats), y0 = yValues(kFloats);

    // Pages first, graphs next, streams last: each is released after what uses it.
    Stream setup = device.createStream();
    const Page px = device.pageWith(setup, floatBytes(x)),
               py = device.pageWith(setup, floatBytes(y0));
    const Page p = device.allocate(BP_MEMORY_DEVICE, kBytes),
               q = device.allocate(BP_MEMORY_DEVICE, kBytes),
               r = device.allocate(BP_MEMORY_DEVICE, kBytes),
               s = device.allocate(BP_MEMORY_DEVICE, kBytes);
    const Page p2 = device.allocate(BP_MEMORY_DEVICE, kBytes),
               r2 = device.allocate(BP_MEMORY_DEVICE, kBytes),
               s2 = device.allocate(BP_MEMORY_DEVICE, kBytes),
               t2 = device.allocate(BP_MEMORY_DEVICE, kBytes);
    const Page p3 = device.allocate(BP_MEMORY_DEVICE, kBytes),
               s3 = device.allocate(BP_MEMORY_DEVICE, kBytes);

    // One stream: [copy y -> q, copy p -> s, fill p := C].
    const bp_copy_device_to_device_args copyYQ = copyArgs(py, 0, q, 0, kBytes);
    const bp_copy_device_to_device_args copyPS = copyArgs(p, 0, s, 0, kBytes);
    const bp_fill_args fillP = fillArgs(p, 0, kBytes, kGraph);
    // Two streams, graph first: [copy p2 -> s2, fill p2 := C]. Graph second: [copy p3 -> s3].
    const bp_copy_device_to_device_args copyP2S2 = copyArgs(p2, 0, s2, 0, kBytes);
    const bp_fill_args fillP2 = fillArgs(p2, 0, kBytes, kGraph);
    const bp_copy_device_to_device_args copyP3S3 = copyArgs(p3, 0, s3, 0, kBytes);
    const Graph one = createGraph(device, {opOf(copyYQ), opOf(copyPS), opOf(fillP)});
    const Graph first = createGraph(device, {opOf(copyP2S2), opOf(fillP2)});
    const Graph second = createGraph(device, {opOf(copyP3S3)});

    Stream a = device.createStream(), b = device.createStream();
    Hold hold(ctx, kernel);

    // One stream: y := 2x + y and p := A before the graph; q := 2x + q and r := p after it.
    hold.close(a);
    bp_error error = makeError();
    succeed(device.launchSaxpy(a, kernel, px, py, 2.0f, kFloats, error, 0, block), error,
            "kernel_launch(saxpy) before the graph");
    device.fill(a, p, 0, kBytes, kBefore);
    launchGraph(device, a, one, "one stream");
    error = makeError();
    succeed(device.launchSaxpy(a, kernel, px, q, 2.0f, kFloats, error, 0, block), error,
            "kernel_launch(saxpy on the graph's copy) after the graph");
    error = makeError();
    succeed(device.tryCopy(a, p, 0, r, 0, kBytes, error), error,
            "copy_device_to_device after the graph");
    const Event oneDone = device.flush(a);
    hold.checkPending(oneDone, "the flush after the graph");
    hold.open();
    device.wait(oneDone);
    requireBytes(device.readAll(a, s), filled(kBytes, kBefore),
                 "one stream: the graph's copy of p (p was filled with 0x11111111 before the "
                 "graph launch)");
    requireFloats(
        device, a, q, axpy(2.0f, x, axpy(2.0f, x, y0)),
        "one stream: q = the graph's copy of y (after a saxpy recorded before the graph), "
        "then a saxpy recorded after the graph");
    requireBytes(device.readAll(a, r), filled(kBytes, kGraph),
                 "one stream: a copy of p recorded after the graph (the graph filled p with "
                 "0x33333333)");

    // Graph on stream a, later work on stream b after stream_wait_event on an event of a flushed
    // after the graph launch.
    hold.close(a);
    device.fill(a, p2, 0, kBytes, kBefore);
    launchGraph(device, a, first, "stream a, before the wait of stream b");
    const Event afterGraph = device.flush(a);
    error = makeError();
    succeed(device.api().stream_wait_event(device.get(), b.get(), afterGraph.get(), &error), error,
            "stream_wait_event(b, event flushed on a after the graph launch)");
    error = makeError();
    succeed(device.tryCopy(b, p2, 0, r2, 0, kBytes, error), error, "copy p2 -> r2 on stream b");
    error = makeError();
    succeed(device.tryCopy(b, s2, 0, t2, 0, kBytes, error), error, "copy s2 -> t2 on stream b");
    const Event bDone = device.flush(b);
    hold.checkPending(bDone, "stream b's flush, waiting for a graph behind the gate");
    hold.open();
    device.wait(bDone);
    requireBytes(device.readAll(b, r2), filled(kBytes, kGraph),
                 "two streams: stream b's copy of p2 after waiting for the graph (which filled p2 "
                 "with 0x33333333)");
    requireBytes(device.readAll(b, t2), filled(kBytes, kBefore),
                 "two streams: stream b's copy of the graph's copy of p2 (p2 held 0x11111111 "
                 "before the graph ran)");

    // The graph on the waiting stream: stream b waits for ordinary work of stream a.
    hold.close(a);
    device.fill(a, p3, 0, kBytes, kBefore);
    const Event filledP3 = device.flush(a);
    error = makeError();
    succeed(device.api().stream_wait_event(device.get(), b.get(), filledP3.get(), &error), error,
            "stream_wait_event(b, event flushed on a after a fill)");
    launchGraph(device, b, second, "stream b, after waiting for stream a");
    const Event secondDone = device.flush(b);
    hold.checkPending(secondDone, "stream b's flush after the graph, waiting for a held fill");
    hold.open();
    device.wait(secondDone);
    requireBytes(device.readAll(b, s3), filled(kBytes, kBefore),
                 "two streams: the graph's copy of p3 on stream b, after waiting for stream a's "
                 "fill of p3 with 0x11111111");
}

// Updates -----------------------------------------------------------------------------------------

CONFORMANCE_CASE("graph.update",
                 "graph_update changes a launch's scalars and bindings for later launches while "
                 "launches recorded before keep the old ones; another kernel, block size, binding "
                 "count or kind, or an index past the end, is refused and changes nothing.") {
    OpenDevice &device = requireGraphs(ctx);
    if (!ctx.raw().has(&bp_plugin_api::graph_update))
        throw NotApplicable("the table has no graph_update (optional, ABI 1.3)");
    const Kernel kernel = device.saxpy(), otherKernel = device.saxpy();
    const uint32_t block = saxpyBlock(ctx.info());
    const std::vector<float> x = xValues(kFloats), y0 = yValues(kFloats);

    Stream stream = device.createStream();
    const Page px = device.pageWith(stream, floatBytes(x));
    const Page y1 = device.pageWith(stream, floatBytes(y0)),
               y2 = device.pageWith(stream, floatBytes(y0));
    const Page f = device.allocate(BP_MEMORY_DEVICE, 4096);

    // [0] y1 = 2x + y1, [1] fill f. The update makes op 0 y2 = 3x + y2: each launch's value and
    // target page say which arguments it ran with.
    bp_binding oldBindings[2], newBindings[2];
    SaxpyScalars oldScalars, newScalars;
    const bp_launch_args before =
        saxpyArgs(kernel, px, y1, 2.0f, kFloats, block, 0, oldBindings, oldScalars);
    const bp_launch_args after =
        saxpyArgs(kernel, px, y2, 3.0f, kFloats, block, 0, newBindings, newScalars);
    const bp_fill_args fill = fillArgs(f, 0, 4096, 0x5a5a5a5au);
    Graph graph = createGraph(device, {opOf(before), opOf(fill)});
    Stream run = device.createStream();
    Hold hold(ctx, kernel);

    const auto update = [&](uint32_t index, const bp_graph_op *op, bp_error &error) {
        return device.api().graph_update(device.get(), graph.get(), index, op, &error);
    };

    // Launch 1 flushed, launch 2 only recorded: both recorded before the update (plugin.h:
    // "launches already recorded are not affected"). Launch 3 comes after it.
    hold.close(run);
    launchGraph(device, run, graph, "launch 1, before the update");
    const Event first = device.flush(run);
    launchGraph(device, run, graph, "launch 2, recorded before the update, not flushed");
    hold.checkPending(first, "the flush of launch 1");
    const bp_graph_op newOp = opOf(after);
    bp_error error = makeError();
    const bp_status updated = update(0, &newOp, error);
    if (updated != BP_SUCCESS)
        expectFailure(updated, error, {BP_ERROR_UNSUPPORTED},
                      "graph_update of op 0 with new scalars (a = 3) and bindings (y2)");
    const bool inPlace = updated == BP_SUCCESS;
    launchGraph(device, run, graph, "launch 3, after the update");
    const Event third = device.flush(run);
    hold.open();
    device.wait(third);
    const std::vector<float> y1Expected = axpy(2.0f, x, axpy(2.0f, x, y0));
    if (inPlace) {
        requireFloats(device, stream, y1, y1Expected,
                      "y1 (old bindings) after launches 1 and 2, recorded before the update with "
                      "a = 2: each must add 2x");
        requireFloats(device, stream, y2, axpy(3.0f, x, y0),
                      "y2 (new bindings) after launch 3, recorded after the update to a = 3");
    } else {
        requireFloats(device, stream, y1, axpy(2.0f, x, y1Expected),
                      "y1 after 3 launches of a graph whose update was refused (unsupported)");
    }

    // Refusals: a launch keeps its kernel, block size and binding count; an op keeps its kind;
    // the index must exist. Both invalid_argument and unsupported (the core rebuilds) are allowed.
    const auto refused = [&](uint32_t index, const bp_graph_op *op, const std::string &what) {
        bp_error e = makeError();
        expectFailure(update(index, op, e), e, {BP_ERROR_INVALID_ARGUMENT, BP_ERROR_UNSUPPORTED},
                      "graph_update with " + what);
    };
    bp_launch_args otherKernelArgs = after;
    otherKernelArgs.kernel = otherKernel.get();
    const bp_graph_op otherKernelOp = opOf(otherKernelArgs);
    refused(0, &otherKernelOp, "another kernel (saxpy loaded again) for op 0");
    const uint32_t maxBlock = std::min(ctx.info().max_block_size[0], ctx.info().max_block_threads);
    if (block > 1 || maxBlock > 1) {
        bp_launch_args otherBlock = after;
        otherBlock.block[0] = block > 1 ? block / 2 : 2;
        otherBlock.grid[0] = (kFloats + otherBlock.block[0] - 1) / otherBlock.block[0];
        const bp_graph_op otherBlockOp = opOf(otherBlock);
        refused(0, &otherBlockOp,
                "block " + std::to_string(otherBlock.block[0]) + " instead of " +
                    std::to_string(block) + " for op 0");
    }
    const bp_binding threeBindings[3] = {newBindings[0], newBindings[1], newBindings[1]};
    bp_launch_args otherCount = after;
    otherCount.bindings = threeBindings;
    otherCount.binding_count = 3;
    const bp_graph_op otherCountOp = opOf(otherCount);
    refused(0, &otherCountOp, "3 bindings instead of 2 for op 0");
    const bp_graph_op fillOp = opOf(fill);
    refused(0, &fillOp, "a fill for op 0 (a launch)");
    refused(1, &newOp, "a launch for op 1 (a fill)");
    refused(2, &newOp, "index 2 of a graph of 2 ops");
    refused(UINT32_MAX, &newOp, "index 4294967295 of a graph of 2 ops");
    error = makeError();
    expectFailure(update(0, nullptr, error), error, {BP_ERROR_INVALID_ARGUMENT},
                  "graph_update with op NULL");

    // A refused update changes nothing: the graph still runs what it ran before.
    launchGraph(device, run, graph, "launch 4, after the refused updates");
    device.finish(run);
    if (inPlace) {
        requireFloats(device, stream, y2, axpy(3.0f, x, axpy(3.0f, x, y0)),
                      "y2 after launch 4 (after the refused updates the graph still runs the "
                      "update to a = 3 on y2)");
        requireFloats(device, stream, y1, y1Expected,
                      "y1 after launch 4 (no launch after the update may touch it)");
    } else {
        requireFloats(device, stream, y1, axpy(2.0f, x, axpy(2.0f, x, y1Expected)),
                      "y1 after launch 4 of a graph whose updates were all refused");
    }
    if (!inPlace)
        throw NotApplicable("graph_update answers unsupported for a valid update (allowed: the "
                            "core builds a new graph); its refusals were checked");
}

// Release -----------------------------------------------------------------------------------------

CONFORMANCE_CASE("graph.release_after_completion",
                 "graph_release right after the event of the graph's last launch completed "
                 "leaves the device working: an ordinary launch afterwards computes right.") {
    OpenDevice &device = requireGraphs(ctx);
    const Kernel kernel = device.saxpy();
    const uint32_t block = saxpyBlock(ctx.info());
    const std::vector<float> x = xValues(kFloats), y0 = yValues(kFloats);
    Stream setup = device.createStream();
    const Page px = device.pageWith(setup, floatBytes(x)),
               py = device.pageWith(setup, floatBytes(y0));
    const Page f = device.allocate(BP_MEMORY_DEVICE, 4096);
    bp_binding bindings[2];
    SaxpyScalars scalars;
    const bp_launch_args launch =
        saxpyArgs(kernel, px, py, 2.0f, kFloats, block, 0, bindings, scalars);
    const bp_fill_args fill = fillArgs(f, 0, 4096, 0x0badf00du);
    Graph graph = createGraph(device, {opOf(launch), opOf(fill)});
    Stream stream = device.createStream();

    launchGraph(device, stream, graph, "launch 1 of 2");
    const Event firstDone = device.flush(stream);
    launchGraph(device, stream, graph, "launch 2 of 2");
    const Event lastDone = device.flush(stream);
    device.wait(lastDone);
    graph.reset();

    bp_error error = makeError();
    succeed(device.launchSaxpy(stream, kernel, px, py, 2.0f, kFloats, error, 0, block), error,
            "kernel_launch(saxpy) after graph_release");
    device.finish(stream);
    requireFloats(device, stream, py, axpy(2.0f, x, axpy(2.0f, x, axpy(2.0f, x, y0))),
                  "y after 2 graph launches (2x each), graph_release and an ordinary saxpy "
                  "launch (2x)");
    requireBytes(device.readAll(stream, f), filled(4096, 0x0badf00du),
                 "the page the released graph filled");
    error = makeError();
    const bp_status firstStatus = device.api().event_query(device.get(), firstDone.get(), &error);
    require(firstStatus == BP_SUCCESS,
            std::string("event_query of the first launch's event after graph_release returned ") +
                toString(firstStatus) + ", expected success");
}

} // namespace backplane::conformance
