// Conformance cases "runtime.*": the plugin driven through the public runtime (Runtime,
// ComputeClient) the way applications use it, alone on the search path and probed in process.
#include "handles.hpp"

#include <backplane/kernels.hpp>

#include <backplane/client.hpp>
#include <backplane/error.hpp>
#include <backplane/kernel.hpp>
#include <backplane/runtime.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <thread>

namespace backplane::conformance {
namespace {

/// "<plugin>:<index>", the selector of the device under test.
std::string selector(const CaseContext &ctx) {
    return ctx.name() + ":" + std::to_string(ctx.index());
}

/// The plugin's manifest as the whole search path, probed in this process, nothing cached.
Config runtimeConfig(const CaseContext &ctx) {
    Config config;
    config.pluginPathOverride = {ctx.raw().manifest().file};
    config.probeMode = ProbeMode::InProcess;
    config.cacheEnabled = false;
    config.pluginOptions[ctx.name()] = ctx.optionsJson();
    return config;
}

/// Runs `f`, turning a backplane::Error into a failure that says what was being done.
template <class F> auto during(const std::string &what, F &&f) -> decltype(f()) {
    try {
        return f();
    } catch (const Error &e) {
        throw CaseFailure(what + " threw: " + e.what());
    }
}

/// A runtime over this plugin alone and a client of the device under test.
struct OpenRuntime {
    explicit OpenRuntime(const CaseContext &ctx)
        : runtime(runtimeConfig(ctx)), client(during("Runtime::open(" + selector(ctx) + ")", [&] {
              return runtime.open(runtime.select(selector(ctx)));
          })) {}
    Runtime runtime;
    ComputeClient client;
};

/// The portable saxpy (CUDA, HIP, GLSL, the host interpreter), then the suite's native host
/// function for host-dialect plugins older than ABI 1.2 (the core skips the interpreter there).
KernelSource saxpyKernel(const CaseContext &ctx) {
    static const lang::Kernel portable = kernels::saxpy();
    KernelSource kernel = portable.source();
    const auto *host =
        static_cast<const bp_host_kernel_source *>(saxpySource(BP_DIALECT_HOST).source);
    kernel.variants.push_back(KernelVariant::host(host->function, "saxpy"));
    bool any = false;
    for (const KernelVariant &v : kernel.variants)
        any = any || ctx.accepts(static_cast<bp_dialect>(v.dialect));
    if (!any)
        throw NotApplicable("the device accepts none of the dialects the suite has kernels in "
                            "(host, cuda, hip, glsl)");
    return kernel;
}

Dispatch saxpyDispatch(const CaseContext &ctx, const Buffer &x, const Buffer &y, float a,
                       uint32_t n) {
    const uint32_t block = std::max<uint32_t>(
        1, std::min({256u, ctx.info().max_block_size[0], ctx.info().max_block_threads}));
    Dispatch d;
    d.block = {block, 1, 1};
    d.grid = {(n + block - 1) / block, 1, 1};
    d.bindings = {x, y};
    d.scalar(SaxpyScalars{a, n});
    return d;
}

std::string firstDifference(const std::vector<std::byte> &got, const std::vector<uint8_t> &want) {
    if (got.size() != want.size())
        return "got " + std::to_string(got.size()) + " bytes, expected " +
               std::to_string(want.size());
    for (size_t i = 0; i < got.size(); ++i)
        if (static_cast<uint8_t>(got[i]) != want[i])
            return "byte " + std::to_string(i) + " is " +
                   std::to_string(static_cast<unsigned>(got[i])) + ", expected " +
                   std::to_string(want[i]);
    return {};
}

} // namespace

CONFORMANCE_CASE("runtime.loads_plugin", "The runtime loads the plugin from its manifest, reports "
                                         "it loaded with the table's version, and lists and "
                                         "opens the device as the table describes it.") {
    const Runtime runtime(runtimeConfig(ctx));
    const auto &reports = runtime.plugins();
    const auto report = std::find_if(reports.begin(), reports.end(),
                                     [&](const PluginReport &r) { return r.name == ctx.name(); });
    require(report != reports.end(), "the runtime, given only " +
                                         ctx.raw().manifest().file.string() +
                                         ", reported no plugin named '" + ctx.name() + "'");
    require(report->state == PluginState::Loaded, "the runtime did not load the plugin: state " +
                                                      std::string(toString(report->state)) + ": " +
                                                      report->reason);
    const std::string tableVersion = ctx.raw().version();
    require(report->version == tableVersion, "the runtime reports version '" + report->version +
                                                 "' but the table's is '" + tableVersion + "'");
    require(report->deviceCount == ctx.deviceCount(),
            "the runtime reports " + std::to_string(report->deviceCount) +
                " devices but probe reported " + std::to_string(ctx.deviceCount()));

    std::string listed;
    const DeviceInfo *route = nullptr;
    for (const PhysicalDevice &device : runtime.devices())
        for (const DeviceInfo &r : device.routes) {
            listed += (listed.empty() ? "" : ", ") + r.id();
            if (r.id() == selector(ctx)) route = &r;
        }
    require(route != nullptr, "the runtime lists no device " + selector(ctx) +
                                  " (it lists: " + (listed.empty() ? "none" : listed) + ")");
    const std::string name = fieldText(ctx.info().name, sizeof(ctx.info().name));
    require(route->name == name, "the runtime names " + selector(ctx) + " '" + route->name +
                                     "' but device_info says '" + name + "'");
    // The runtime got the same plugin options, so it sees the same device; only collectives on
    // a device without asynchronous streams are off in its view (the core does not run them
    // there: docs/multi-device.md).
    uint32_t expected = ctx.info().capabilities;
    if ((expected & BP_CAPABILITY_ASYNC_STREAMS) == 0)
        expected &= ~static_cast<uint32_t>(BP_CAPABILITY_COLLECTIVES);
    require(route->dialects == ctx.info().dialects && route->capabilities == expected,
            "the runtime lists " + selector(ctx) + " with dialects " +
                std::to_string(route->dialects) + " and capabilities " +
                std::to_string(route->capabilities) + " but device_info says " +
                std::to_string(ctx.info().dialects) + " and " +
                std::to_string(ctx.info().capabilities) +
                (expected != ctx.info().capabilities
                     ? " (" + std::to_string(expected) + " without collectives on sync streams)"
                     : std::string()));

    const Selection selection = during("Runtime::select(\"" + selector(ctx) + "\")",
                                       [&] { return runtime.select(selector(ctx)); });
    require(selection.device.id() == selector(ctx),
            "Runtime::select(\"" + selector(ctx) + "\") chose " + selection.device.id());
    const ComputeClient client =
        during("Runtime::open(" + selector(ctx) + ")", [&] { return runtime.open(selection); });
    require(client.device().id() == selector(ctx),
            "Runtime::open gave a client of " + client.device().id());
}

CONFORMANCE_CASE("runtime.buffer_round_trip", "Bytes written through ComputeClient (whole "
                                              "buffers and ranges, 1 byte to 9 MiB) read back "
                                              "unchanged.") {
    OpenRuntime rt(ctx);
    ComputeClient &client = rt.client;
    uint32_t seed = 1;
    for (const uint64_t size :
         {uint64_t{1}, uint64_t{3}, uint64_t{4}, uint64_t{100}, uint64_t{4096}, uint64_t{65537},
          (uint64_t{1} << 20) + 3, (uint64_t{9} << 20) + 5}) {
        const std::vector<uint8_t> data = patternBytes(size, seed++);
        const std::string what = std::to_string(size) + "-byte buffer";
        const Buffer buffer =
            during("create(" + what + ")", [&] { return client.create(data.data(), data.size()); });
        const std::string whole = firstDifference(
            during("read(" + what + ")", [&] { return client.read(buffer).wait(); }), data);
        require(whole.empty(), "create then read of a " + what + ": " + whole);

        // A range in the middle, written and read at an offset.
        const uint64_t offset = size / 3, count = size - offset - size / 4;
        const std::vector<uint8_t> patch = patternBytes(count, seed++);
        during("write(" + what + ", offset " + std::to_string(offset) + ")",
               [&] { client.write(buffer, offset, patch.data(), patch.size()); });
        std::vector<uint8_t> expected = data;
        std::copy(patch.begin(), patch.end(), expected.begin() + static_cast<long>(offset));
        const std::string after = firstDifference(
            during("read(" + what + ")", [&] { return client.read(buffer).wait(); }), expected);
        require(after.empty(), "read of a " + what + " after writing " + std::to_string(count) +
                                   " bytes at offset " + std::to_string(offset) + ": " + after);
        std::vector<uint8_t> range(count);
        during("readInto(" + what + ")",
               [&] { client.readInto(buffer, offset, range.data(), range.size()); });
        require(range == patch, "readInto of " + std::to_string(count) + " bytes at offset " +
                                    std::to_string(offset) + " of a " + what +
                                    " did not return the bytes written there");
    }
}

CONFORMANCE_CASE("runtime.saxpy", "ComputeClient::execute runs saxpy (the variant in the device's "
                                  "dialect) over 100003 elements, every element right.") {
    const KernelSource kernel = saxpyKernel(ctx);
    OpenRuntime rt(ctx);
    ComputeClient &client = rt.client;
    const uint32_t n = 100003;
    std::vector<float> x(n), y(n);
    for (uint32_t i = 0; i < n; ++i) {
        x[i] = static_cast<float>(i % 1000);
        y[i] = static_cast<float>(i % 7);
    }
    const Buffer bx = client.createFrom<float>(x), by = client.createFrom<float>(y);
    during("execute(saxpy)", [&] { client.execute(kernel, saxpyDispatch(ctx, bx, by, 0.5f, n)); });
    const std::vector<float> out =
        during("readAs<float>", [&] { return client.readAs<float>(by); });
    require(out.size() == n,
            "read back " + std::to_string(out.size()) + " floats, expected " + std::to_string(n));
    for (uint32_t i = 0; i < n; ++i)
        require(out[i] == 0.5f * x[i] + y[i], "element " + std::to_string(i) + " is " +
                                                  std::to_string(out[i]) + ", expected " +
                                                  std::to_string(0.5f * x[i] + y[i]));
}

CONFORMANCE_CASE("runtime.streams_exchange_buffers", "Four threads on separate streams each "
                                                     "compute with buffers another thread "
                                                     "created, with right results.") {
    const KernelSource kernel = saxpyKernel(ctx);
    OpenRuntime rt(ctx);
    ComputeClient &client = rt.client;
    constexpr int kThreads = 4, kRounds = 10;
    constexpr uint32_t kN = 4096;
    std::vector<std::vector<Buffer>> inputs(kThreads, std::vector<Buffer>(kRounds));
    std::vector<std::atomic<int>> published(kThreads);
    std::atomic<bool> stop{false};
    std::mutex mutex;
    std::string failure;
    std::vector<std::thread> workers;
    for (int t = 0; t < kThreads; ++t)
        workers.emplace_back([&, t] {
            try {
                const StreamGuard guard(static_cast<StreamId>(20 + t));
                for (int r = 0; r < kRounds; ++r) {
                    std::vector<float> x(kN);
                    for (uint32_t i = 0; i < kN; ++i)
                        x[i] = static_cast<float>(t * 100 + r + static_cast<int>(i % 50));
                    inputs[t][r] = client.createFrom<float>(x);
                    published[t].store(r + 1);
                    // Use the buffer the next thread created on its stream in this round.
                    const int peer = (t + 1) % kThreads;
                    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
                    while (published[peer].load() < r + 1) {
                        if (stop.load()) return;
                        if (std::chrono::steady_clock::now() > until)
                            throw CaseFailure("thread " + std::to_string(peer) +
                                              " did not publish its buffer within 60 s");
                        std::this_thread::yield();
                    }
                    const std::vector<float> ones(kN, 1.0f);
                    const Buffer by = client.createFrom<float>(ones);
                    client.execute(kernel, saxpyDispatch(ctx, inputs[peer][r], by, 2.0f, kN));
                    const auto out = client.readAs<float>(by);
                    for (uint32_t i = 0; i < kN; ++i) {
                        const float want =
                            2.0f * static_cast<float>(peer * 100 + r + static_cast<int>(i % 50)) +
                            1.0f;
                        if (out.size() != kN || out[i] != want)
                            throw CaseFailure("round " + std::to_string(r) + ", element " +
                                              std::to_string(i) + " computed from thread " +
                                              std::to_string(peer) + "'s buffer is wrong");
                    }
                }
            } catch (const std::exception &e) {
                stop.store(true);
                std::lock_guard lock(mutex);
                if (failure.empty())
                    failure = "thread " + std::to_string(t) + " (stream " + std::to_string(20 + t) +
                              "): " + e.what();
            }
        });
    for (std::thread &w : workers)
        w.join();
    require(failure.empty(), failure);
}

CONFORMANCE_CASE("runtime.profile_spans_nest", "Profiling spans through ComputeClient nest: an "
                                               "outer span lasts at least as long as an inner "
                                               "one.") {
    const KernelSource kernel = saxpyKernel(ctx);
    OpenRuntime rt(ctx);
    ComputeClient &client = rt.client;
    const uint32_t n = 1u << 18;
    const std::vector<float> x(n, 1.0f);
    const Buffer bx = client.createFrom<float>(x), by = client.createFrom<float>(x);
    const ProfileToken outer = client.profileStart();
    client.execute(kernel, saxpyDispatch(ctx, bx, by, 1.0f, n));
    const ProfileToken inner = client.profileStart();
    client.execute(kernel, saxpyDispatch(ctx, bx, by, 1.0f, n));
    const ProfileDuration innerSpan =
        during("profileEnd(inner)", [&] { return client.profileEnd(inner); });
    const ProfileDuration outerSpan =
        during("profileEnd(outer)", [&] { return client.profileEnd(outer); });
    require(outerSpan.nanoseconds >= innerSpan.nanoseconds,
            "the outer span took " + std::to_string(outerSpan.nanoseconds) +
                " ns, less than the inner span's " + std::to_string(innerSpan.nanoseconds) +
                " ns (" + (innerSpan.deviceTimestamps ? "device timestamps" : "host clock") + ")");
}

} // namespace backplane::conformance
