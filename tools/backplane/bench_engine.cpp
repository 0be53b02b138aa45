// `backplane bench engine`: ComputeClient against the same plugin's raw C table, same process.
//
// For every device present (or the one --device selects): the raw side opens the device's plugin
// through RawPlugin (its own instance, with the runtime's options for it) and runs on the C table
// with status checks only (RawDevice: no pools, no alignment), then closes it; then the runtime
// side opens a ComputeClient on the same device.
#include "bench.hpp"
#include "raw_device.hpp"

#include <backplane/cache.hpp>
#include <backplane/client.hpp>
#include <backplane/config.hpp>
#include <backplane/raw_plugin.hpp>
#include <backplane/runtime.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace backplane::tool {
namespace {

using Clock = std::chrono::steady_clock;

double usSince(Clock::time_point start) {
    return std::chrono::duration<double, std::micro>(Clock::now() - start).count();
}

void noopHost(const bp_host_kernel_context *) {}

constexpr const char *kNoopGlsl = R"(#version 450
layout(local_size_x_id = 0, local_size_y_id = 1, local_size_z_id = 2) in;
layout(set = 0, binding = 0) buffer B { uint b[]; };
void main() { if (gl_GlobalInvocationID.x == 0xffffffffu) b[0] = 0u; }
)";
constexpr const char *kNoopCuda = R"(
extern "C" __global__ void noop(unsigned int *b) { if (threadIdx.x == 0xffffffffu) b[0] = 0u; }
)";

KernelSource noopKernel() {
    return {"noop",
            {KernelVariant::host(&noopHost, "noop"),
             KernelVariant::text(Dialect::Cuda, "noop", kNoopCuda),
             KernelVariant::text(Dialect::Hip, "noop", kNoopCuda),
             KernelVariant::text(Dialect::Glsl, "main", kNoopGlsl)}};
}

const KernelVariant *variantFor(const DeviceInfo &info, const KernelSource &k) {
    for (const KernelVariant &v : k.variants)
        if (info.accepts(v.dialect)) return &v;
    return nullptr;
}

struct RawFigures {
    double allocUs = 0, launchUs = 0, crossUs = 0;
    /// Per size and direction: the plugin's copy from / into pageable and pinned memory + wait.
    std::vector<TransferTimes> transfers;
};

RawFigures measureRaw(RawPlugin plugin, const DeviceInfo &info, int iterations,
                      const std::vector<uint64_t> &transferSizes, bool quick) {
    const RawDevice device(std::move(plugin), info.index);
    if (const std::string name = fieldText(device.info().name, sizeof(device.info().name));
        name != info.name)
        throw Error(ErrorCode::Internal, "the raw side's " + info.id() + " is " + name +
                                             ", not the runtime's " + info.name);
    RawFigures f;
    {
        const auto start = Clock::now();
        for (int i = 0; i < iterations; ++i)
            RawMemory page = device.allocate(BP_MEMORY_DEVICE, 1 << 20);
        f.allocUs = usSince(start) / iterations;
    }
    const KernelSource noop = noopKernel();
    const KernelVariant *v = variantFor(info, noop);
    bp_host_kernel_source hostSource{sizeof(hostSource), v->hostFunction, nullptr};
    const bool host = v->dialect == Dialect::Host;
    const auto dialect = static_cast<bp_dialect>(v->dialect);
    const std::vector<unsigned char> compiled =
        device.compile(dialect, v->entryPoint,
                       host ? static_cast<const void *>(&hostSource) : v->source.data(),
                       host ? sizeof(hostSource) : v->source.size(), v->options);
    const abi::Owned<bp_kernel> kernel = device.load(dialect, v->entryPoint, compiled);
    const RawMemory buffer = device.allocate(BP_MEMORY_DEVICE, 4096);
    const abi::Owned<bp_stream> a = device.createStream(), b = device.createStream();
    bp_binding binding{buffer.memory.get(), 0, 4096};
    auto args = abi::make<bp_launch_args>();
    args.kernel = kernel.get();
    args.grid[0] = args.grid[1] = args.grid[2] = 1;
    args.block[0] = 64;
    args.block[1] = args.block[2] = 1;
    args.bindings = &binding;
    args.binding_count = 1;
    {
        const auto start = Clock::now();
        for (int i = 0; i < iterations; ++i) device.launch(a.get(), args);
        device.sync(a.get());
        f.launchUs = usSince(start) / iterations;
    }
    {
        const auto start = Clock::now();
        for (int i = 0; i < iterations; ++i) {
            device.launch(a.get(), args);
            const abi::Owned<bp_event> e = device.flush(a.get());
            device.waitEvent(b.get(), e.get());
            device.launch(b.get(), args);
        }
        device.sync(b.get());
        f.crossUs = usSince(start) / iterations;
    }
    {
        const uint64_t largest = transferSizes.back();
        const RawMemory dst = device.allocate(BP_MEMORY_DEVICE, largest);
        std::vector<unsigned char> pageable(largest, 1);
        const RawMemory pinned = device.allocate(BP_MEMORY_PINNED_HOST, largest);
        std::memset(pinned.mapped, 1, largest);
        for (const uint64_t bytes : transferSizes) {
            for (const char *direction : {"write", "read"}) {
                TransferTimes t;
                t.direction = direction;
                t.bytes = bytes;
                const bool write = t.direction == "write";
                auto copy = [&](void *memory) {
                    if (write)
                        device.copyHostToDevice(a.get(), memory, dst.memory.get(), 0, bytes);
                    else
                        device.copyDeviceToHost(a.get(), dst.memory.get(), 0, memory, bytes);
                    device.sync(a.get());
                };
                t.pageable = secondsPerTransfer(bytes, quick, [&] { copy(pageable.data()); });
                t.pinned = secondsPerTransfer(bytes, quick, [&] { copy(pinned.mapped); });
                f.transfers.push_back(t);
            }
        }
    }
    return f;
}

void benchDevice(const Runtime &runtime, const DeviceInfo &info, const BenchOptions &options,
                 BenchRows &rows) {
    const int iterations = options.quick ? 200 : 5000;
    uint64_t largestCap = info.memoryBytes != 0 ? info.memoryBytes / 8 : 0;
    if (info.maxAllocationBytes != 0)
        largestCap = largestCap == 0 ? info.maxAllocationBytes
                                     : std::min(largestCap, info.maxAllocationBytes);
    const std::vector<uint64_t> sizes = transferSizes(options.quick, largestCap);
    if (variantFor(info, noopKernel()) == nullptr) {
        std::fprintf(stderr, "bench engine: skipping %s (no kernel dialect)\n", info.id().c_str());
        return;
    }
    // The raw side closes its device before the client opens it.
    const RawFigures raw =
        measureRaw(openRawPlugin(runtime, info), info, iterations, sizes, options.quick);

    Selection selection;
    selection.device = info;
    ComputeClient client = runtime.open(selection);
    const std::string device = info.id() + " " + info.name;
    auto row = [&](const char *what, double runtimeValue, double rawValue, const char *unit,
                   const char *target) {
        rows.push_back({"engine", device, what, runtimeValue, rawValue, unit, target});
    };

    { Buffer warm = client.empty(1 << 20); }
    auto start = Clock::now();
    for (int i = 0; i < iterations; ++i) Buffer b = client.empty(1 << 20);
    row("allocate + free 1 MiB (pool vs raw page)", usSince(start) / iterations, raw.allocUs, "us",
        "<= 0.10x");

    const KernelSource noop = noopKernel();
    Buffer buffer = client.empty(4096);
    Dispatch d;
    d.block = {64, 1, 1};
    d.bindings = {buffer};
    client.execute(noop, d);
    client.sync();
    start = Clock::now();
    for (int i = 0; i < iterations; ++i) client.execute(noop, d);
    client.sync();
    row("launch, back to back", usSince(start) / iterations, raw.launchUs, "us", "<= 1.10x");

    // Recorded sequences: 100 launches recorded once, replayed; host cost per launch.
    {
        constexpr int kLaunches = 100;
        client.beginRecording();
        for (int i = 0; i < kLaunches; ++i) client.execute(noop, d);
        const Recording recording = client.endRecording();
        client.replay(recording);
        client.sync();
        const int replays = std::max(2, iterations / kLaunches);
        start = Clock::now();
        for (int i = 0; i < replays; ++i) client.replay(recording);
        client.sync();
        rows.push_back({"engine", device,
                        std::string("100 launches replayed from a recording (") +
                            (recording.native() ? "the plugin's graph" : "calls issued by the core") +
                            "), per launch, vs raw launches back to back",
                        usSince(start) / (replays * kLaunches), raw.launchUs, "us", "<= 0.50x"});
    }

    const StreamId first = ComputeClient::currentStream();
    start = Clock::now();
    // Each iteration hands a fresh buffer produced on A to B: one dependency, as on the raw side.
    for (int i = 0; i < iterations; ++i) {
        Dispatch shared = d;
        {
            StreamGuard a(first + 1000);
            shared.bindings = {client.empty(4096)};
            client.execute(noop, shared);
        }
        StreamGuard b(first + 1001);
        client.execute(noop, shared);
    }
    {
        StreamGuard b(first + 1001);
        client.sync();
    }
    row("cross-stream dependency (launch A, launch B using A's buffer)",
        usSince(start) / iterations, raw.crossUs, "us", "<= 1.5x");

    // Pageable transfers of every size through staging, against the plugin's own copies.
    const uint64_t largest = sizes.back();
    std::vector<unsigned char> pageable(largest, 1);
    {
        const Buffer big = client.empty(largest);
        for (TransferTimes t : raw.transfers) {
            const bool write = t.direction == "write";
            t.runtime = secondsPerTransfer(t.bytes, options.quick, [&] {
                if (write) {
                    client.write(big, 0, pageable.data(), t.bytes);
                    client.sync();
                } else {
                    client.readInto(big, 0, pageable.data(), t.bytes);
                }
            });
            addTransferRows(rows, "engine", device, t, "plugin copy from pageable + wait",
                            "plugin copy from pinned + wait");
        }
        // The same memory registered (registerHost): the pinned path on the caller's memory.
        try {
            const PinnedBuffer registered = client.registerHost(pageable.data(), largest);
            for (const TransferTimes &t : raw.transfers) {
                if (t.bytes != largest) continue;
                const bool write = t.direction == "write";
                const double seconds = secondsPerTransfer(largest, options.quick, [&] {
                    if (write) {
                        client.write(big, 0, registered, largest);
                        client.sync();
                    } else {
                        client.readInto(big, 0, registered, largest);
                    }
                });
                const double gb = static_cast<double>(largest) / 1e9;
                rows.push_back({"engine", device,
                                t.direction + " " + sizeText(largest) +
                                    " registered (registerHost) vs plugin copy from pinned + wait",
                                gb / seconds, gb / t.pinned, "GB/s", ">= 0.95x"});
            }
        } catch (const Error &e) {
            if (e.code() != ErrorCode::Unsupported) throw;
            std::fprintf(stderr, "bench engine: %s: no registered rows (%s)\n", info.id().c_str(),
                         e.what());
        }
    }

    // Zero events when streams share nothing: report the count as its own row.
    const uint64_t before = client.stats().alignmentEvents;
    for (int i = 0; i < 100; ++i) {
        StreamGuard s(first + 2000 + static_cast<StreamId>(i % 4));
        Buffer own = client.empty(4096);
        Dispatch own_d = d;
        own_d.bindings = {own};
        client.execute(noop, own_d);
    }
    client.syncAll();
    row("alignment events, 4 streams sharing nothing", static_cast<double>(
            client.stats().alignmentEvents - before), 0, "events", "== 0");
}

// A noop kernel whose name and text are new for every `n`: its first prepare() misses the
// in-memory cache and compiles for real (the host variant has nothing to compile; its new name
// still makes the server load it again).
KernelSource freshKernel(uint64_t n) {
    const std::string value = std::to_string(n % 0xfffffffeu) + "u";
    const std::string glsl = R"(#version 450
layout(local_size_x_id = 0, local_size_y_id = 1, local_size_z_id = 2) in;
layout(set = 0, binding = 0) buffer B { uint b[]; };
void main() { if (gl_GlobalInvocationID.x == 0xffffffffu) b[0] = )" +
                             value + "; }\n";
    const std::string cuda = R"(
extern "C" __global__ void noop(unsigned int *b) { if (threadIdx.x == 0xffffffffu) b[0] = )" +
                             value + "; }\n";
    return {"noop-" + std::to_string(n),
            {KernelVariant::host(&noopHost, "noop"),
             KernelVariant::text(Dialect::Cuda, "noop", cuda),
             KernelVariant::text(Dialect::Hip, "noop", cuda),
             KernelVariant::text(Dialect::Glsl, "main", glsl)}};
}

// Mean host-side cost of one noop launch on `stream`: back-to-back execute() until `enough`
// (asked after every launch, so idle and contended loops pay the same clock reads). The sync
// that drains the stream is outside the timed part: under contention it would wait out the
// other stream's operation in progress and charge it to these launches.
double launchCostUs(ComputeClient &client, StreamId stream, const KernelSource &noop,
                    const Dispatch &d, const std::function<bool(uint64_t, double)> &enough) {
    StreamGuard guard(stream);
    uint64_t launches = 0;
    double elapsedUs = 0;
    const auto start = Clock::now();
    do {
        client.execute(noop, d);
        ++launches;
        elapsedUs = usSince(start);
    } while (!enough(launches, elapsedUs));
    client.sync();
    return elapsedUs / static_cast<double>(launches);
}

// Launch cost on stream `b` while another thread runs `operation(n)` on stream `a` back to back.
// B starts after A's first operation (warm-up) and runs for `iterations` launches and at least
// two more of A's operations, so the window covers A's whole cycle. A stops on its own `capUs`
// into the window: a lock that B never wins would otherwise starve B's launch without bound.
double launchCostWhileBusy(ComputeClient &client, StreamId a, StreamId b, const KernelSource &noop,
                           const Dispatch &d, int iterations, double capUs,
                           const std::function<void(uint64_t)> &operation) {
    std::atomic<bool> stop{false}, failed{false}, measuring{false};
    std::atomic<uint64_t> finished{0};
    std::exception_ptr failure;
    Clock::time_point windowStart;
    std::thread busy([&] {
        StreamGuard guard(a);
        try {
            for (uint64_t n = 0; !stop.load(); ++n) {
                if (measuring.load() && usSince(windowStart) > capUs) break;
                operation(n);
                finished.fetch_add(1);
            }
            client.sync();
        } catch (...) {
            failure = std::current_exception();
            failed = true;
        }
    });
    while (finished.load() == 0 && !failed.load())
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    double us = 0;
    if (!failed.load()) {
        const uint64_t before = finished.load();
        windowStart = Clock::now();
        measuring = true;
        try {
            us = launchCostUs(client, b, noop, d, [&](uint64_t launches, double elapsedUs) {
                return failed.load() || elapsedUs > capUs ||
                       (launches >= static_cast<uint64_t>(iterations) &&
                        finished.load() >= before + 2);
            });
        } catch (...) {
            stop = true;
            busy.join();
            throw;
        }
    }
    stop = true;
    busy.join();
    if (failure) std::rethrow_exception(failure);
    return us;
}

// One device lock around blocking work would stall every stream behind one stream's compile or
// pageable write. Measured on a client of its own whose disk cache is off: every compile here
// is new, and none of them belongs in the user's kernel cache.
void benchStreamContention(const Runtime &uncached, const DeviceInfo &info,
                           const BenchOptions &options, BenchRows &rows) {
    if (variantFor(info, noopKernel()) == nullptr) return; // benchDevice said why
    const int iterations = options.quick ? 200 : 5000;
    const double capUs = options.quick ? 1e6 : 3e6;
    uint64_t writeBytes = options.quick ? (16ull << 20) : (256ull << 20);
    if (info.memoryBytes != 0) writeBytes = std::min(writeBytes, info.memoryBytes / 8);
    if (info.maxAllocationBytes != 0) writeBytes = std::min(writeBytes, info.maxAllocationBytes);

    Selection selection;
    selection.device = info;
    ComputeClient client = uncached.open(selection);
    const std::string device = info.id() + " " + info.name;
    const StreamId first = ComputeClient::currentStream();
    const StreamId a = first + 3000, b = first + 3001;

    const KernelSource noop = noopKernel();
    Dispatch d;
    d.block = {64, 1, 1};
    d.bindings = {client.empty(4096)};
    {
        StreamGuard guard(b);
        client.execute(noop, d);
        client.sync();
    }
    const double idleUs = launchCostUs(client, b, noop, d, [&](uint64_t launches, double) {
        return launches >= static_cast<uint64_t>(iterations);
    });

    const double compilingUs =
        launchCostWhileBusy(client, a, b, noop, d, iterations, capUs,
                            [&](uint64_t n) { client.prepare(freshKernel(n)); });
    rows.push_back({"engine", device, "launch on B while A compiles new kernels, vs B idle",
                    compilingUs, idleUs, "us", "<= 1.2x"});

    Buffer target = client.empty(writeBytes);
    std::vector<unsigned char> pageable(writeBytes, 1);
    const double writingUs =
        launchCostWhileBusy(client, a, b, noop, d, iterations, capUs,
                            [&](uint64_t) { client.write(target, 0, pageable.data(), writeBytes); });
    rows.push_back({"engine", device,
                    "launch on B while A writes " + std::to_string(writeBytes >> 20) +
                        " MiB pageable, vs B idle",
                    writingUs, idleUs, "us", "<= 1.2x"});
}

} // namespace

RawPlugin openRawPlugin(const Runtime &runtime, const DeviceInfo &info) {
    for (const PluginReport &report : runtime.plugins()) {
        if (report.name != info.backend || report.state != PluginState::Loaded) continue;
        const Config &config = runtime.config();
        RawPluginOptions options;
        if (const auto it = config.pluginOptions.find(report.name);
            it != config.pluginOptions.end())
            options.optionsJson = it->second;
        if (const auto cache = cacheDirectory(config); !cache.empty())
            options.cacheDir = cache / toString(CacheKind::Pipelines) / report.name;
        return RawPlugin::open(readPluginManifest(report.manifest), options);
    }
    throw Error(ErrorCode::NotFound, "no loaded plugin gives " + info.id(), info.backend);
}

void benchEngine(const BenchOptions &options, BenchRows &rows) {
    Runtime runtime;
    std::vector<DeviceInfo> devices;
    if (!options.device.empty()) {
        devices.push_back(runtime.select(options.device).device);
    } else {
        for (const PhysicalDevice &p : runtime.devices()) devices.push_back(p.info());
    }
    if (devices.empty()) std::fprintf(stderr, "bench engine: no device found\n");
    Config uncachedConfig = runtime.config();
    uncachedConfig.cacheEnabled = false;
    const Runtime uncached(std::move(uncachedConfig));
    for (const DeviceInfo &info : devices) {
        try {
            benchDevice(runtime, info, options, rows);
        } catch (const Error &e) {
            std::fprintf(stderr, "bench engine: %s failed: %s\n", info.id().c_str(), e.what());
        }
        try {
            benchStreamContention(uncached, info, options, rows);
        } catch (const Error &e) {
            std::fprintf(stderr, "bench engine: %s stream contention failed: %s\n",
                         info.id().c_str(), e.what());
        }
    }
}

} // namespace backplane::tool
