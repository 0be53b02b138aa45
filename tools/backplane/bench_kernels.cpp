// `backplane bench kernels`: the portable kernels (backplane/kernels.hpp) against hand-written
// ones.
//
// Per device present (or the one --device selects):
// - GPU devices (CUDA, HIP, Vulkan): the portable tiled matmul against the hand-written CUDA/GLSL
//   kernel with the same tile sizes (TILE, WPT; depth 16 = the hand-written BK), both outputs
//   compared;
// - every device: the autotuner choosing the portable matmul's tile sizes (a fresh cache in a
//   temporary directory), its winner against the fastest hand-written kernel measured;
// - host devices: the interpreted portable matmul and saxpy against native host functions.
// Rows in GFLOP/s or GB/s have ratio = portable / hand-written speed (>= 1: portable faster); rows
// in ms have ratio = portable / hand-written time (<= 1: portable faster).
#include "bench.hpp"
#include "bench_cublas.hpp"
#include "demo_matmul.hpp"

#include <backplane/cache.hpp>
#include <backplane/client.hpp>
#include <backplane/error.hpp>
#include <backplane/kernels.hpp>
#include <backplane/runtime.hpp>
#include <backplane/tune.hpp>

#include <dlfcn.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

extern char **environ;

namespace backplane::tool {
namespace {

using Clock = std::chrono::steady_clock;

double secondsSince(Clock::time_point start) {
    return std::chrono::duration<double>(Clock::now() - start).count();
}


/// Deterministic values in [-1, 1).
std::vector<float> benchInput(size_t count, uint32_t seed) {
    std::vector<float> values(count);
    for (float &v : values) {
        seed = seed * 1664525u + 1013904223u;
        v = static_cast<float>(seed >> 8) / static_cast<float>(1u << 23) - 1.0f;
    }
    return values;
}

/// The median time in ms of each run: `warmups` untimed rounds (compile, caches), then `samples`
/// timed rounds, round robin so that drifts of a shared machine hit every run alike. Timed with
/// the client's profiling tokens (device timestamps where the device has them).
std::vector<double> medianMs(ComputeClient &client, const std::vector<std::function<void()>> &runs,
                             int warmups, int samples) {
    for (int w = 0; w < warmups; ++w)
        for (const auto &run : runs) {
            run();
            client.sync();
        }
    tune::ClientTimer timer(client);
    std::vector<std::vector<double>> times(runs.size());
    for (int s = 0; s < samples; ++s)
        for (size_t i = 0; i < runs.size(); ++i)
            times[i].push_back(
                std::chrono::duration<double, std::milli>(timer.time(runs[i])).count());
    std::vector<double> medians;
    for (std::vector<double> &t : times) {
        std::sort(t.begin(), t.end());
        medians.push_back(t[t.size() / 2]);
    }
    return medians;
}

/// Timed samples per run: few where a GPU-style device runs on the CPU (lavapipe: a 512^3 matmul
/// takes a few hundred ms), more elsewhere (milliseconds per run).
int sampleCount(const DeviceInfo &info, const BenchOptions &options) {
    if (info.type == DeviceType::Cpu && !info.accepts(Dialect::Host)) return options.quick ? 3 : 5;
    return options.quick ? 7 : 20;
}

double gflops(uint32_t size, double ms) { return 2.0 * double(size) * size * size / (ms * 1e6); }

/// A square problem with its C buffers, one per side of a comparison.
struct SquareProblem {
    MatmulProblem problem;
    Buffer portableC, handC;

    SquareProblem(ComputeClient &client, uint32_t size) {
        problem = {&client,
                   client.createFrom<float>(benchInput(size_t(size) * size, 1)),
                   client.createFrom<float>(benchInput(size_t(size) * size, 2)),
                   size,
                   size,
                   size};
        portableC = client.empty(uint64_t(size) * size * sizeof(float));
        handC = client.empty(uint64_t(size) * size * sizeof(float));
    }
    /// compareMatmul of the two C buffers as the last runs left them ("" when they agree).
    std::string compare() const {
        ComputeClient &c = *problem.client;
        return compareMatmul(c.readAs<float>(portableC), c.readAs<float>(handC), problem.n,
                             problem.k);
    }
};

/// The target column of a comparison whose outputs differ.
const char *checked(const std::string &mismatch) {
    return mismatch.empty() ? "" : "OUTPUTS DIFFER";
}

/// One comparison as two rows: times (ms) and speeds (GFLOP/s).
void matmulRows(BenchRows &rows, const std::string &device, const std::string &what, uint32_t size,
                double portableMs, double handMs, const std::string &mismatch,
                const std::string &speedTarget) {
    const std::string cube = "matmul " + std::to_string(size) + "^3 ";
    rows.push_back({"kernels", device, cube + what, portableMs, handMs, "ms", checked(mismatch)});
    rows.push_back({"kernels", device, cube + what, gflops(size, portableMs), gflops(size, handMs),
                    "GFLOP/s", mismatch.empty() ? speedTarget : "OUTPUTS DIFFER"});
}

/// The hand-written kernel that the portable one is measured against.
struct Baseline {
    std::string name;
    double ms = std::numeric_limits<double>::infinity();
};

/// Portable vs hand-written tiled matmul with the same tiles, on a GPU device. Returns the
/// fastest hand-written kernel measured (the autotuner's baseline).
Baseline gpuTiles(ComputeClient &client, const std::string &device, uint32_t size,
                  const BenchOptions &options, BenchRows &rows) {
    const SquareProblem p(client, size);
    const bool cpu = client.device().type == DeviceType::Cpu;
    const int samples = sampleCount(client.device(), options);
    Baseline best;
    for (const kernels::MatmulTiles &tiles :
         std::vector<kernels::MatmulTiles>{{32, 2, 16}, {64, 4, 16}}) {
        const MatmulCandidate portable = portableMatmulCandidate(tiles);
        const MatmulCandidate hand = handWrittenTiledCandidate(tiles.tile, tiles.perThread);
        if (!fitsDevice(portable, client.device()) || !fitsDevice(hand, client.device())) {
            std::fprintf(stderr, "bench kernels: %s: tiles %s do not fit the device, skipped\n",
                         device.c_str(), portable.name.c_str());
            continue;
        }
        const std::vector<double> ms = medianMs(client,
                                                {[&] { portable.launch(p.problem, p.portableC); },
                                                 [&] { hand.launch(p.problem, p.handC); }},
                                                cpu ? 1 : 3, samples);
        const std::string mismatch = p.compare();
        if (!mismatch.empty())
            std::fprintf(stderr, "bench kernels: %s: portable %s and hand-written %s differ: %s\n",
                         device.c_str(), portable.name.c_str(), hand.name.c_str(),
                         mismatch.c_str());
        matmulRows(rows, device, "portable " + portable.name + " vs hand-written " + hand.name,
                   size, ms[0], ms[1], mismatch, ">= 0.95x");
        if (ms[1] < best.ms) best = {hand.name, ms[1]};
    }
    return best;
}

// The conformance suite's native host saxpy (tools/backplane/conformance/kernels.cpp): one call
// per workgroup of block[0] elements.
struct SaxpyScalars {
    float a;
    uint32_t n;
};

void saxpyHost(const bp_host_kernel_context *c) {
    const auto *s = static_cast<const SaxpyScalars *>(c->scalars);
    const auto *x = static_cast<const float *>(c->buffers[0]);
    auto *y = static_cast<float *>(c->buffers[1]);
    for (uint32_t t = 0; t < c->block[0]; ++t) {
        const uint32_t i = c->workgroup[0] * c->block[0] + t;
        if (i < s->n) y[i] = s->a * x[i] + y[i];
    }
}

/// The fastest hand-written host matmul at `size`^3 (every native function is timed).
Baseline hostBaseline(ComputeClient &client, uint32_t size, const BenchOptions &options) {
    const std::vector<MatmulCandidate> hand = handWrittenMatmulCandidates(client.device());
    const SquareProblem p(client, size);
    std::vector<std::function<void()>> runs;
    for (const MatmulCandidate &c : hand)
        runs.push_back([&] { c.launch(p.problem, p.handC); });
    const std::vector<double> ms = medianMs(client, runs, 1, sampleCount(client.device(), options));
    Baseline best;
    for (size_t i = 0; i < hand.size(); ++i)
        if (ms[i] < best.ms) best = {hand[i].name, ms[i]};
    return best;
}

/// Interpreted portable saxpy vs the native host function, 1M elements.
void hostSaxpy(ComputeClient &client, const std::string &device, const BenchOptions &options,
               BenchRows &rows) {
    const uint32_t n = 1u << 20, block = 256;
    const float a = 1.5f;
    const std::vector<float> x = benchInput(n, 3), y = benchInput(n, 4);
    const Buffer bx = client.createFrom<float>(x);
    const Buffer portableY = client.createFrom<float>(y), handY = client.createFrom<float>(y);
    const lang::Kernel portable = kernels::saxpy();
    const KernelSource hand{"bench-saxpy-host", {KernelVariant::host(&saxpyHost, "saxpy")}};
    auto dispatch = [&](const Buffer &target) {
        Dispatch d;
        d.block = {block, 1, 1};
        d.grid = {(n + block - 1) / block, 1, 1};
        d.bindings = {bx, target};
        d.scalar(SaxpyScalars{a, n});
        return d;
    };
    const Dispatch portableLaunch = dispatch(portableY), handLaunch = dispatch(handY);
    const int warmups = 1, samples = sampleCount(client.device(), options);
    const std::vector<double> ms = medianMs(client,
                                            {[&] { client.execute(portable, portableLaunch); },
                                             [&] { client.execute(hand, handLaunch); }},
                                            warmups, samples);
    // The check: one launch of each on fresh copies of y (fused or not: the native function
    // rounds twice, so they may differ in the last bit).
    const Buffer checkPortable = client.createFrom<float>(y),
                 checkHand = client.createFrom<float>(y);
    client.execute(portable, dispatch(checkPortable));
    client.execute(hand, dispatch(checkHand));
    const std::vector<float> gotPortable = client.readAs<float>(checkPortable);
    const std::vector<float> gotHand = client.readAs<float>(checkHand);
    size_t wrong = 0;
    for (uint32_t i = 0; i < n; ++i)
        wrong +=
            !(std::fabs(gotPortable[i] - gotHand[i]) <= 1e-6f * (std::fabs(gotHand[i]) + 1.0f));
    const std::string mismatch =
        wrong == 0 ? "" : std::to_string(wrong) + " of " + std::to_string(n) + " elements differ";
    if (!mismatch.empty())
        std::fprintf(stderr, "bench kernels: %s: saxpy outputs differ: %s\n", device.c_str(),
                     mismatch.c_str());
    const bool compiled = portable.hostNote(client.device()).rfind("compiled", 0) == 0;
    const std::string what = std::string("saxpy 1M portable (") +
                             (compiled ? "compiled" : "interpreted") + ") vs native host function";
    rows.push_back({"kernels", device, what, ms[0], ms[1], "ms", checked(mismatch)});
    // 12 bytes per element: x and y read, y written.
    const double bytes = 12.0 * n;
    rows.push_back({"kernels", device, what, bytes / (ms[0] * 1e6), bytes / (ms[1] * 1e6), "GB/s",
                    mismatch.empty() ? (compiled ? ">= 0.90x" : "") : "OUTPUTS DIFFER"});
}

// -- compiled host kernels against OpenBLAS, memcpy and the disk cache ------------------------

constexpr const char *kHostProbeFdVariable = "BACKPLANE_BENCH_HOST_PROBE_FD";
constexpr const char *kHostProbeCacheVariable = "BACKPLANE_BENCH_HOST_PROBE_CACHE";

/// The host-friendly matmul candidates measured at 1024^3 (the best is the portable row).
std::vector<std::pair<lang::Kernel, Dispatch>> hostMatmulCandidates(uint32_t size, bool quick) {
    std::vector<std::pair<lang::Kernel, Dispatch>> out;
    std::vector<kernels::RegisterTiles> blocks = {{6, 4, 8, 8}, {4, 4, 16, 4}};
    if (!quick) blocks.push_back({4, 8, 8, 8});
    for (const kernels::RegisterTiles &t : blocks) {
        Dispatch d;
        d.block = {t.threadsX, t.threadsY, 1};
        d.grid = {(size + t.cols() * t.threadsX - 1) / (t.cols() * t.threadsX),
                  (size + t.rows * t.threadsY - 1) / (t.rows * t.threadsY), 1};
        out.emplace_back(kernels::matmulRegisters(t), d);
    }
    const kernels::MatmulTiles tiled{64, 4, 16};
    Dispatch d;
    d.block = {tiled.threads(), tiled.threads(), 1};
    d.grid = {(size + tiled.tile - 1) / tiled.tile, (size + tiled.tile - 1) / tiled.tile, 1};
    out.emplace_back(kernels::matmul(tiled), d);
    return out;
}

/// OpenBLAS (Debian libopenblas0) loaded with dlopen, for cblas_sgemm at a thread count.
class OpenBlas {
public:
    OpenBlas() {
        for (const char *name : {"libopenblas.so.0", "libopenblas.so"}) {
            handle_ = ::dlopen(name, RTLD_NOW | RTLD_LOCAL);
            if (handle_ != nullptr) break;
        }
        if (handle_ == nullptr)
            throw std::runtime_error(std::string("libopenblas.so.0 not found (apt install "
                                                 "libopenblas0): ") + ::dlerror());
        sgemm_ = reinterpret_cast<Sgemm>(::dlsym(handle_, "cblas_sgemm"));
        threads_ = reinterpret_cast<SetThreads>(::dlsym(handle_, "openblas_set_num_threads"));
        if (sgemm_ == nullptr) throw std::runtime_error("libopenblas.so.0 has no cblas_sgemm");
    }
    ~OpenBlas() {
        if (handle_ != nullptr) ::dlclose(handle_);
    }
    OpenBlas(const OpenBlas &) = delete;
    OpenBlas &operator=(const OpenBlas &) = delete;
    void setThreads(int n) const {
        if (threads_ != nullptr) threads_(n);
    }
    /// C = A * B, row-major, square.
    void sgemm(uint32_t n, const float *a, const float *b, float *c) const {
        constexpr int kRowMajor = 101, kNoTrans = 111;
        const int s = static_cast<int>(n);
        sgemm_(kRowMajor, kNoTrans, kNoTrans, s, s, s, 1.0f, a, s, b, s, 0.0f, c, s);
    }

private:
    using Sgemm = void (*)(int, int, int, int, int, int, float, const float *, int, const float *,
                           int, float, float *, int);
    using SetThreads = void (*)(int);
    void *handle_ = nullptr;
    Sgemm sgemm_ = nullptr;
    SetThreads threads_ = nullptr;
};

double medianOf(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

/// In the probe child: the first candidate's kernel from the disk cache; writes "ms compiled
/// diskHits" to the pipe and exits.
[[noreturn]] void runHostCacheProbe(const char *fdText) {
    const int fd = std::atoi(fdText);
    int status = 1;
    try {
        Config config = loadConfig();
        config.cacheDir = std::getenv(kHostProbeCacheVariable);
        config.cacheEnabled = true;
        Runtime runtime(config);
        ComputeClient client = runtime.open(runtime.select("host"));
        const lang::Kernel kernel = hostMatmulCandidates(1024, true).front().first;
        const auto start = Clock::now();
        client.prepare(kernel.source());
        const double ms = secondsSince(start) * 1e3;
        const EngineStats stats = client.stats();
        char line[128];
        const int n = std::snprintf(line, sizeof line, "%.6f %llu %llu\n", ms,
                                    static_cast<unsigned long long>(stats.kernelsCompiled),
                                    static_cast<unsigned long long>(stats.diskCacheHits));
        if (n > 0 && ::write(fd, line, static_cast<size_t>(n)) == n) status = 0;
    } catch (const std::exception &e) {
        std::fprintf(stderr, "host cache probe: %s\n", e.what());
    }
    ::_exit(status);
}

/// Re-runs this binary as `backplane bench kernels` in probe mode; "" or why it failed.
std::string spawnHostCacheProbe(const std::string &cacheDir, double &ms, unsigned long long &compiled,
                                unsigned long long &diskHits) {
    const ChildAnswer child =
        runBenchChild("kernels", kHostProbeFdVariable,
                      {std::string(kHostProbeCacheVariable) + "=" + cacheDir}, "BACKPLANE_BENCH_HOST_PROBE_");
    if (!child.why.empty()) return child.why;
    if (std::sscanf(child.text.c_str(), "%lf %llu %llu", &ms, &compiled, &diskHits) != 3)
        return "the probe child gave no answer";
    return "";
}

/// Compiled host kernels: matmul 1024^3 against OpenBLAS sgemm (same thread count), saxpy 64M
/// against memcpy, first-launch compile against a disk-cache load in a new process.
void hostCompiledRows(ComputeClient &client, const std::string &device, const BenchOptions &options,
                      BenchRows &rows) {
    const DeviceInfo &info = client.device();
    if (!info.accepts(Dialect::Cpp)) {
        std::fprintf(stderr, "bench kernels: %s interprets portable kernels (%s): no compiled rows\n",
                     device.c_str(), info.kernelCompiler.c_str());
        return;
    }
    // The host plugin's default worker count (the "workers" option): OpenBLAS gets as many.
    const int threads = static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 4u));
    const int samples = options.quick ? 3 : 5;

    // matmul 1024^3
    const uint32_t size = 1024;
    const std::vector<float> a = benchInput(size_t(size) * size, 1), b = benchInput(size_t(size) * size, 2);
    const Buffer ba = client.createFrom<float>(a), bb = client.createFrom<float>(b);
    const Buffer bc = client.empty(uint64_t(size) * size * 4);
    std::string best;
    double bestMs = std::numeric_limits<double>::infinity();
    std::vector<float> portableC;
    for (auto &[kernel, dispatch] : hostMatmulCandidates(size, options.quick)) {
        Dispatch d = dispatch;
        d.bindings = {ba, bb, bc};
        d.scalar(size).scalar(size).scalar(size);
        const double ms = medianMs(client, {[&] { client.execute(kernel, d); }}, 1, samples)[0];
        std::fprintf(stderr, "bench kernels: %s: %s at %u^3: %.1f ms (%.1f GFLOP/s)\n",
                     device.c_str(), kernel.name().c_str(), size, ms, gflops(size, ms));
        if (ms < bestMs) {
            bestMs = ms;
            best = kernel.name();
            portableC = client.readAs<float>(bc);
        }
    }
    try {
        OpenBlas blas;
        blas.setThreads(threads);
        std::vector<float> c(size_t(size) * size);
        blas.sgemm(size, a.data(), b.data(), c.data());
        std::vector<double> times;
        for (int i = 0; i < samples; ++i) {
            const auto start = Clock::now();
            blas.sgemm(size, a.data(), b.data(), c.data());
            times.push_back(secondsSince(start) * 1e3);
        }
        const double blasMs = medianOf(times);
        const std::string mismatch = compareMatmul(portableC, c, size, size);
        matmulRows(rows, device,
                   "portable " + best + " (compiled) vs OpenBLAS sgemm, " + std::to_string(threads) +
                       " threads",
                   size, bestMs, blasMs, mismatch, ">= 0.50x");
    } catch (const std::exception &e) {
        std::fprintf(stderr, "bench kernels: %s: no OpenBLAS reference: %s\n", device.c_str(), e.what());
    }

    // saxpy 64M against the machine's copy bandwidth (memcpy on as many threads).
    {
        const uint32_t n = options.quick ? (1u << 24) : (1u << 26), block = 256;
        const Buffer x = client.createFrom<float>(benchInput(n, 3));
        const Buffer y = client.createFrom<float>(benchInput(n, 4));
        const lang::Kernel saxpy = kernels::saxpy();
        Dispatch d;
        d.block = {block, 1, 1};
        d.grid = {n / block, 1, 1};
        d.bindings = {x, y};
        d.scalar(1.5f).scalar(n);
        const double saxpyMs = medianMs(client, {[&] { client.execute(saxpy, d); }}, 1, samples)[0];
        std::vector<float> from(n, 1.0f), to(n, 0.0f);
        std::vector<double> times;
        for (int i = 0; i < samples + 1; ++i) {
            const auto start = Clock::now();
            std::vector<std::thread> workers;
            const size_t chunk = (size_t(n) + threads - 1) / threads;
            for (int t = 0; t < threads; ++t)
                workers.emplace_back([&, t] {
                    const size_t first = std::min(size_t(n), t * chunk);
                    const size_t count = std::min(size_t(n), first + chunk) - first;
                    std::memcpy(to.data() + first, from.data() + first, count * sizeof(float));
                });
            for (std::thread &w : workers) w.join();
            if (i > 0) times.push_back(secondsSince(start) * 1e3);
        }
        const double copyMs = medianOf(times);
        // saxpy moves 12 bytes per element (x, y read; y written), memcpy 8 (read, write).
        rows.push_back({"kernels", device,
                        "saxpy " + std::to_string(n >> 20) + "M portable (compiled) vs memcpy " +
                            std::to_string(threads) + " threads",
                        12.0 * n / (saxpyMs * 1e6), 8.0 * n / (copyMs * 1e6), "GB/s", ">= 0.80x"});
    }

    // First launch: compile (fresh cache directory) against a disk-cache load in a new process.
    {
        TempDir cache("bp-bench-host-cache");
        Config config = loadConfig();
        config.cacheDir = cache.path;
        config.cacheEnabled = true;
        Runtime runtime(config);
        ComputeClient fresh = runtime.open(runtime.select(info.id()));
        const lang::Kernel kernel = hostMatmulCandidates(size, true).front().first;
        const auto start = Clock::now();
        fresh.prepare(kernel.source());
        const double compileMs = secondsSince(start) * 1e3;
        double loadMs = 0;
        unsigned long long compiled = 0, diskHits = 0;
        const std::string why = spawnHostCacheProbe(cache.path.string(), loadMs, compiled, diskHits);
        if (!why.empty() || compiled != 0 || diskHits == 0) {
            std::fprintf(stderr, "bench kernels: %s: cache probe: %s (compiled %llu, disk hits %llu)\n",
                         device.c_str(), why.empty() ? "not a disk hit" : why.c_str(), compiled, diskHits);
        } else {
            rows.push_back({"kernels", device,
                            "first launch of " + kernel.name() +
                                ": disk-cache load in a new process vs compile",
                            loadMs, compileMs, "ms", "load <= 5 ms"});
        }
    }
}

/// The autotuner on the portable candidates (a fresh cache directory), then its winner against
/// `baseline`.
void tunedMatmul(ComputeClient &client, const std::string &device, uint32_t size,
                 const Baseline &baseline, const BenchOptions &options, BenchRows &rows) {
    const MatmulSet set = matmulTunable(client.device());
    const SquareProblem p(client, size);
    TempDir cache("bp-bench-kernels");
    CacheStore store(cache.path);
    tune::Tuner::Options o;
    o.level = TuneLevel::Balanced;
    o.store = &store;
    o.device = deviceFingerprint(client.device());
    o.timer = std::make_shared<tune::ClientTimer>(client);
    o.progress = false;
    if (options.quick) {
        // Fewer samples per candidate: the ranking of tile sets is seldom close.
        tune::BenchPolicy policy = tune::BenchPolicy::forLevel(TuneLevel::Balanced);
        policy.minSamples = 2;
        policy.maxSamples = 3;
        o.policy = policy;
    }
    tune::Tuner tuner(o);
    const auto start = Clock::now();
    (void)tuner.execute(set, p.problem);
    client.sync();
    const double tuningS = secondsSince(start);
    const auto record = tuner.lookup(set.info(), set.key(p.problem, o.level));
    if (!record) {
        std::fprintf(stderr, "bench kernels: %s: the tuner recorded no decision\n", device.c_str());
        return;
    }
    std::string ranking;
    for (const std::string &name : record->ranking)
        ranking += (ranking.empty() ? "" : " > ") + name;
    std::fprintf(stderr,
                 "bench kernels: %s: autotuned %zu portable candidates at %u^3 in %.1f s "
                 "(%llu runs): winner %s; ranking %s\n",
                 device.c_str(), set.size(), size, tuningS,
                 static_cast<unsigned long long>(tuner.counters().benchmarkRuns),
                 record->winner.c_str(), ranking.c_str());

    // The winner's kernel alone (launched into a C allocated once, like the baseline), in the same
    // rounds as the baseline when there is one, so both see the same machine.
    std::optional<MatmulCandidate> winner, hand;
    for (MatmulCandidate &c : matmulCandidates(client.device()))
        if (c.name == record->winner) winner = std::move(c);
    for (MatmulCandidate &c : handWrittenMatmulCandidates(client.device()))
        if (c.name == baseline.name) hand = std::move(c);
    if (!winner) {
        std::fprintf(stderr, "bench kernels: %s: the winner %s is not a candidate\n",
                     device.c_str(), record->winner.c_str());
        return;
    }
    std::vector<std::function<void()>> runs = {[&] { winner->launch(p.problem, p.portableC); }};
    if (hand) runs.push_back([&] { hand->launch(p.problem, p.handC); });
    const std::vector<double> ms = medianMs(client, runs, 1, sampleCount(client.device(), options));
    if (!hand) {
        rows.push_back({"kernels", device,
                        "matmul " + std::to_string(size) + "^3 autotuned portable " +
                            record->winner + " (no hand-written baseline)",
                        ms[0], 0, "ms", ""});
        return;
    }
    const std::string mismatch = p.compare();
    if (!mismatch.empty())
        std::fprintf(stderr, "bench kernels: %s: autotuned %s and %s differ: %s\n", device.c_str(),
                     record->winner.c_str(), hand->name.c_str(), mismatch.c_str());
    matmulRows(rows, device, "tuned " + record->winner + " vs best hand " + hand->name, size, ms[0],
               ms[1], mismatch, "");
}

// -- matrix units against cuBLAS ---------------------------------------------------------------

/// The matrix-unit matmul candidates the bench picks from (the fastest at the first size wins).
std::vector<kernels::MatrixMatmulTiles> matrixTileCandidates(bool quick) {
    if (quick) return {{128, 128, 32, 2, 4, 8, 3, true}, {64, 64, 32, 2, 2}};
    // Tiles staged through registers (2 stages), and by asynchronous copies into 3 or 4
    // stages; over 48 KiB of shared memory they need a device that has it (CUDA: dynamic
    // shared memory; Vulkan refuses them, and the smaller ones run).
    return {{128, 128, 32, 2, 4},
            {64, 64, 32, 2, 2},
            {128, 128, 32, 2, 4, 8, 3, true},
            {128, 128, 32, 2, 4, 8, 4, true},
            {128, 128, 32, 2, 2, 8, 3, true},
            {128, 128, 32, 2, 2, 8, 4, true},
            {128, 256, 32, 2, 4, 8, 3, true},
            {256, 128, 32, 4, 2, 8, 3, true},
            {128, 128, 64, 2, 4, 8, 3, true},
            {64, 64, 32, 2, 2, 8, 4, true}};
}

struct Shape {
    uint32_t m, n, k;
    std::string text() const {
        return m == n && n == k ? std::to_string(m) + "^3"
                                : std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k);
    }
    double flops() const { return 2.0 * m * n * k; }
};

/// Milliseconds of `kernel` (a matmulMatrixUnits or matmul kernel) on one shape.
template <class T>
double matmulMs(ComputeClient &client, const lang::Kernel &kernel, const Shape &s,
                uint32_t blockM, uint32_t blockN, uint32_t threadsX, uint32_t threadsY,
                const BenchOptions &options) {
    const size_t elementA = sizeof(T);
    Buffer a = client.empty(size_t{s.m} * s.k * elementA), b = client.empty(size_t{s.k} * s.n * elementA);
    client.fill(a, 0);
    client.fill(b, 0);
    Buffer c = client.empty(size_t{s.m} * s.n * 4);
    Dispatch d;
    d.grid = {(s.n + blockN - 1) / blockN, (s.m + blockM - 1) / blockM};
    d.block = {threadsX, threadsY};
    d.bindings = {a, b, c};
    d.scalar(s.m).scalar(s.n).scalar(s.k);
    const int samples = options.quick ? 3 : 7;
    return medianMs(client, {[&] { client.execute(kernel, d); }}, 1, samples)[0];
}

template <class T>
void matrixUnitRows(ComputeClient &client, const std::string &device, const char *type,
                    const std::vector<Shape> &shapes, const BenchOptions &options, BenchRows &rows,
                    const std::function<double(const Shape &)> &cublasMs, const std::string &target) {
    const DeviceInfo &info = client.device();
    const uint32_t width = std::max<uint32_t>(1, info.subgroupSize);
    // The fastest candidate on the first shape.
    std::optional<kernels::MatrixMatmulTiles> best;
    double bestMs = std::numeric_limits<double>::infinity();
    for (const kernels::MatrixMatmulTiles &tiles : matrixTileCandidates(options.quick)) {
        const lang::Kernel kernel = kernels::matmulMatrixUnits<T>(tiles);
        if (!kernel.missingOn(info.features).empty()) {
            std::fprintf(stderr, "bench kernels: %s: %s skipped: the device lacks %s\n",
                         device.c_str(), kernel.name().c_str(), kernel.missingOn(info.features).c_str());
            return;
        }
        if (tiles.threads(width) > info.maxBlockThreads) continue;
        try {
            const double ms = matmulMs<T>(client, kernel, shapes[0], tiles.blockM, tiles.blockN,
                                          tiles.threads(width), 1, options);
            std::fprintf(stderr, "bench kernels: %s: %s %s: %.3f ms\n", device.c_str(),
                         kernel.name().c_str(), shapes[0].text().c_str(), ms);
            if (ms < bestMs) {
                bestMs = ms;
                best = tiles;
            }
        } catch (const Error &e) {
            std::fprintf(stderr, "bench kernels: %s: %s skipped: %s\n", device.c_str(),
                         kernel.name().c_str(), e.what());
        }
    }
    if (!best) return;
    const lang::Kernel kernel = kernels::matmulMatrixUnits<T>(*best);
    for (const Shape &s : shapes) {
        const double ms = matmulMs<T>(client, kernel, s, best->blockM, best->blockN,
                                      best->threads(width), 1, options);
        double raw = 0;
        std::string against = "cuBLAS " + std::string(type);
        try {
            raw = cublasMs(s);
        } catch (const std::exception &e) {
            against = std::string("(no cuBLAS: ") + e.what() + ")";
        }
        rows.push_back({"kernels", device,
                        "matmul " + s.text() + " " + type + " matrix units " + kernel.name() +
                            " vs " + against,
                        s.flops() / (ms * 1e9), raw > 0 ? s.flops() / (raw * 1e9) : 0, "TFLOP/s",
                        raw > 0 ? target : ""});
    }
}

/// The portable f32 matmul's best tiles against SGEMM at the given shapes.
void f32Rows(ComputeClient &client, const std::string &device, const std::vector<Shape> &shapes,
             const BenchOptions &options, BenchRows &rows,
             const std::function<double(const Shape &)> &cublasMs) {
    std::optional<kernels::MatmulTiles> best;
    double bestMs = std::numeric_limits<double>::infinity();
    const std::vector<kernels::MatmulTiles> candidates =
        options.quick ? std::vector<kernels::MatmulTiles>{{64, 4, 8}}
                      : std::vector<kernels::MatmulTiles>{{64, 4, 8}, {64, 4, 16}, {128, 8, 8}, {128, 8, 16}, {64, 8, 8}};
    for (const kernels::MatmulTiles &tiles : candidates) {
        if (tiles.threads() * tiles.threads() > client.device().maxBlockThreads) continue;
        const lang::Kernel kernel = kernels::matmul(tiles);
        try {
            const double ms = matmulMs<float>(client, kernel, shapes[0], tiles.tile, tiles.tile,
                                              tiles.threads(), tiles.threads(), options);
            if (ms < bestMs) {
                bestMs = ms;
                best = tiles;
            }
        } catch (const Error &e) {
            std::fprintf(stderr, "bench kernels: %s: %s skipped: %s\n", device.c_str(),
                         tiles.name().c_str(), e.what());
        }
    }
    if (!best) return;
    const lang::Kernel kernel = kernels::matmul(*best);
    for (const Shape &s : shapes) {
        const double ms = matmulMs<float>(client, kernel, s, best->tile, best->tile,
                                          best->threads(), best->threads(), options);
        double raw = 0;
        std::string against = "cuBLAS SGEMM";
        try {
            raw = cublasMs(s);
        } catch (const std::exception &e) {
            against = std::string("(no cuBLAS: ") + e.what() + ")";
        }
        rows.push_back({"kernels", device,
                        "matmul " + s.text() + " f32 portable " + best->name() + " vs " + against,
                        s.flops() / (ms * 1e9), raw > 0 ? s.flops() / (raw * 1e9) : 0, "TFLOP/s",
                        raw > 0 ? ">= 0.80x" : ""});
    }
}

/// Row softmax and row sums against the device's own copy rate: bytes the kernel must move
/// (softmax: the row in and out; sums: the row in) per second, over a device-to-device copy's
/// bytes read and written per second, same run.
template <class T>
void rowKernelRows(ComputeClient &client, const std::string &device, const char *type,
                   const BenchOptions &options, BenchRows &rows) {
    const uint32_t count = options.quick ? 1024 : 8192, cols = options.quick ? 1024 : 8192;
    const uint64_t bytes = uint64_t{count} * cols * sizeof(T);
    Buffer x = client.empty(bytes), y = client.empty(bytes), sums = client.empty(4ull * count);
    client.fill(x, 0);
    const lang::Kernel softmax = kernels::softmaxRows<T>(256);
    const lang::Kernel sum = kernels::rowSum<T>(256);
    Dispatch d;
    d.grid = {count};
    d.block = {256};
    d.bindings = {x, y};
    d.scalar(cols);
    Dispatch s = d;
    s.bindings = {x, sums};
    const int samples = options.quick ? 3 : 9;
    const std::vector<double> ms = medianMs(client,
                                            {[&] { client.copy(x, 0, y, 0, bytes); },
                                             [&] { client.execute(softmax, d); },
                                             [&] { client.execute(sum, s); }},
                                            1, samples);
    const double copyRate = 2.0 * double(bytes) / (ms[0] * 1e6); // GB/s read + written
    const std::string shape = std::to_string(count) + "x" + std::to_string(cols) + " " + type;
    rows.push_back({"kernels", device, "softmax rows " + shape + " vs D2D copy rate",
                    2.0 * double(bytes) / (ms[1] * 1e6), copyRate, "GB/s", ">= 0.80x"});
    rows.push_back({"kernels", device, "row sums " + shape + " vs D2D copy rate",
                    double(bytes) / (ms[2] * 1e6), copyRate, "GB/s", ">= 0.80x"});
}

/// Rows of the matrix units (and f32) against cuBLAS on the same GPU, where cuBLAS loads.
void cublasRows(ComputeClient &client, const std::string &device, const BenchOptions &options,
                BenchRows &rows) {
    const DeviceInfo &info = client.device();
    if (info.type == DeviceType::Cpu) return;
    std::vector<Shape> shapes = options.quick
                                    ? std::vector<Shape>{{1024, 1024, 1024}, {1023, 1025, 511}}
                                    : std::vector<Shape>{{4096, 4096, 4096}, {2048, 2048, 2048},
                                                         {8192, 8192, 8192}, {4095, 4097, 1023}};
    std::unique_ptr<RawCublas> cublas;
    std::string why;
    if (info.hasUuid) {
        try {
            cublas = std::make_unique<RawCublas>(info.uuid);
            std::fprintf(stderr, "bench kernels: %s: reference %s\n", device.c_str(),
                         cublas->library().c_str());
        } catch (const std::exception &e) {
            why = e.what();
        }
    } else {
        why = "the device reports no UUID";
    }
    const auto reference = [&](GemmKind kind) {
        return [&, kind](const Shape &s) -> double {
            if (!cublas) throw std::runtime_error(why);
            return cublas->gemmMs(kind, s.m, s.n, s.k, options.quick ? 3 : 7);
        };
    };
    matrixUnitRows<lang::bf16>(client, device, "bf16", shapes, options, rows,
                               reference(GemmKind::Bf16), ">= 0.50x");
    matrixUnitRows<lang::f16>(client, device, "f16", shapes, options, rows, reference(GemmKind::F16),
                              info.backend == "vulkan" ? ">= 0.40x" : ">= 0.50x");
    matrixUnitRows<float>(client, device, "tf32", shapes, options, rows, reference(GemmKind::Tf32),
                          ">= 0.50x");
    if (!options.quick || info.backend == "cuda")
        f32Rows(client, device, {shapes[0]}, options, rows, reference(GemmKind::F32));
}

void benchDevice(ComputeClient &client, const BenchOptions &options, BenchRows &rows) {
    const DeviceInfo &info = client.device();
    const std::string device = info.id() + " " + info.name;
    const auto start = Clock::now();
    if (info.accepts(Dialect::Host)) {
        const uint32_t size = 256;
        const Baseline baseline = hostBaseline(client, size, options);
        tunedMatmul(client, device, size, baseline, options, rows);
        hostSaxpy(client, device, options, rows);
        hostCompiledRows(client, device, options, rows);
    } else {
        // CPU-type Vulkan devices (lavapipe) run the GPU comparison at 512^3.
        const uint32_t size = options.quick || info.type == DeviceType::Cpu ? 512 : 2048;
        const Baseline baseline = gpuTiles(client, device, size, options, rows);
        tunedMatmul(client, device, size, baseline, options, rows);
        cublasRows(client, device, options, rows);
        if (info.type != DeviceType::Cpu) {
            rowKernelRows<float>(client, device, "f32", options, rows);
            rowKernelRows<lang::f16>(client, device, "f16", options, rows);
            rowKernelRows<lang::bf16>(client, device, "bf16", options, rows);
        }
    }
    std::fprintf(stderr, "bench kernels: %s done in %.1f s\n", device.c_str(), secondsSince(start));
}

} // namespace

void benchKernels(const BenchOptions &options, BenchRows &rows) {
    if (const char *fd = std::getenv(kHostProbeFdVariable)) runHostCacheProbe(fd);
    std::optional<Runtime> runtime;
    std::vector<DeviceInfo> targets;
    try {
        runtime.emplace();
        if (!options.device.empty()) {
            targets.push_back(runtime->select(options.device).device);
        } else {
            // Every route: the same GPU through cuda and vulkan is measured once per plugin.
            for (const PhysicalDevice &physical : runtime->devices())
                for (const DeviceInfo &route : physical.routes)
                    targets.push_back(route);
        }
    } catch (const Error &e) {
        std::fprintf(stderr, "bench kernels: no device: %s\n", e.what());
        return;
    }
    for (const DeviceInfo &target : targets) {
        try {
            ComputeClient client = runtime->open(Selection{target, "bench kernels", {}});
            benchDevice(client, options, rows);
        } catch (const Error &e) {
            std::fprintf(stderr, "bench kernels: %s skipped: %s\n", target.id().c_str(), e.what());
        }
    }
}

} // namespace backplane::tool
