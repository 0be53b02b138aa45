// `backplane demo`: select a device, say why, run the portable saxpy, reduction and tuned matmul;
// check each on the CPU.
#include "commands.hpp"
#include "trace_option.hpp"
#include "demo_matmul.hpp"

#include <backplane/cache.hpp>
#include <backplane/client.hpp>
#include <backplane/communicator.hpp>
#include <backplane/error.hpp>
#include <backplane/kernels.hpp>
#include <backplane/runtime.hpp>
#include <backplane/tune.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <vector>

namespace backplane::tool {
namespace {

struct SaxpyScalars {
    float a;
    uint32_t n;
};

/// The reduction's workgroup size: 256 threads, or the largest power of two the device allows.
uint32_t sumBlock(const DeviceInfo &device) {
    uint32_t block = 256;
    while (device.maxBlockThreads != 0 && block > device.maxBlockThreads) block /= 2;
    return block;
}

double msSince(std::chrono::steady_clock::time_point start) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
        .count();
}

double toMs(std::chrono::nanoseconds t) { return std::chrono::duration<double, std::milli>(t).count(); }

/// Deterministic values in [-1, 1) (a 32-bit LCG), so every run checks the same product.
std::vector<float> matmulInput(size_t count, uint32_t seed) {
    std::vector<float> values(count);
    for (float &v : values) {
        seed = seed * 1664525u + 1013904223u;
        v = static_cast<float>(seed >> 8) / static_cast<float>(1u << 23) - 1.0f;
    }
    return values;
}

/// The tuned matmul: tunes (or finds the cached winner), prints the tuner's counters, the winner
/// and its time, and checks C against the CPU. Returns true when C matches.
bool runMatmul(ComputeClient &client, const Config &config) {
    // CPU devices (host plugin, lavapipe) get a smaller problem: the demo runs on 2-core CI.
    const uint32_t size = client.device().type == DeviceType::Cpu ? 256 : 512;
    const std::vector<float> a = matmulInput(size_t(size) * size, 1);
    const std::vector<float> b = matmulInput(size_t(size) * size, 2);
    const MatmulProblem problem{&client, client.createFrom<float>(a), client.createFrom<float>(b),
                                size, size, size};
    const MatmulSet set = matmulTunable(client.device());

    tune::Tuner::Options options;
    options.level = config.tuneLevel;
    options.store = &CacheStore::forConfig(config);
    options.device = deviceFingerprint(client.device());
    options.timer = std::make_shared<tune::ClientTimer>(client);
    tune::Tuner tuner(options);

    std::string names;
    for (const std::string &name : set.info().names) names += (names.empty() ? "" : ", ") + name;
    std::printf("matmul %ux%ux%u f32, autotune %s, %zu candidates: %s\n", size, size, size,
                toString(options.level), set.size(), names.c_str());

    const auto start = std::chrono::steady_clock::now();
    const MatmulResult first = tuner.execute(set, problem);
    const std::vector<float> c = client.readAs<float>(first.c);
    const double firstMs = msSince(start);
    const tune::TuneCounters counters = tuner.counters();
    const std::string cacheDir = options.store->directory().empty()
                                     ? std::string("memory only")
                                     : options.store->directory().string();
    std::printf("tuner: %llu tunings, %llu benchmark runs, %llu memory hits, %llu persistent "
                "hits (cache: %s)\n",
                static_cast<unsigned long long>(counters.tunings),
                static_cast<unsigned long long>(counters.benchmarkRuns),
                static_cast<unsigned long long>(counters.memoryHits),
                static_cast<unsigned long long>(counters.persistentHits), cacheDir.c_str());

    // The winner's time now: the best of three tuned calls (memory hits, no tuning).
    tune::ClientTimer timer(client);
    std::chrono::nanoseconds best = std::chrono::nanoseconds::max();
    for (int i = 0; i < 3; ++i)
        best = std::min(best, timer.time([&] { (void)tuner.execute(set, problem); }));
    const auto record = tuner.lookup(set.info(), set.key(problem, options.level));
    if (record) {
        std::string ranking;
        for (const std::string &name : record->ranking)
            ranking += (ranking.empty() ? "" : " > ") + name;
        std::printf("winner: %s, %.3f ms per call (first call %.1f ms%s); ranking: %s\n",
                    record->winner.c_str(), toMs(best), firstMs,
                    counters.tunings != 0 ? ", tuning included" : ", cached decision",
                    ranking.c_str());
    } else {
        std::printf("winner: none recorded (autotune off: the first candidate that runs), %.3f ms "
                    "per call\n",
                    toMs(best));
    }

    const std::string mismatch = compareMatmul(c, matmulOnCpu(a, b, size, size, size), size, size);
    std::printf("matmul vs CPU: %s\n", mismatch.empty() ? "match (relative tolerance 1e-4)"
                                                          : mismatch.c_str());
    return mismatch.empty();
}

/// `--devices all|SEL,SEL...`: one data-parallel step over several devices of this process, and
/// of the other processes when a launcher's environment says there are some (BACKPLANE_RANK /
/// BACKPLANE_WORLD_SIZE / BACKPLANE_RENDEZVOUS, Open MPI, Slurm...: rendezvousFromEnvironment).
/// The data is split across the ranks; each computes its gradient shard with saxpy; the
/// gradients are all-reduced (summed) through a Communicator; every local result is checked
/// against the CPU. Prints the devices, the engine, and the all-reduce bandwidth.
int runDataParallel(const std::string &which) {
    Runtime runtime;
    std::vector<ComputeClient> devices;
    std::vector<std::string> selectors;
    if (which == "all") {
        for (const PhysicalDevice &d : runtime.devices()) selectors.push_back(d.info().id());
    } else {
        size_t from = 0;
        while (from <= which.size()) {
            const size_t comma = std::min(which.find(',', from), which.size());
            if (comma > from) selectors.push_back(which.substr(from, comma - from));
            from = comma + 1;
        }
    }
    if (selectors.empty()) throw Error(ErrorCode::NoDevice, "no device to run on");
    bool cpuOnly = true;
    for (const std::string &sel : selectors) {
        const Selection s = runtime.select(sel);
        devices.push_back(runtime.open(s));
        cpuOnly = cpuOnly && s.device.type == DeviceType::Cpu;
        std::printf("rank %zu: %s %s\n", devices.size() - 1, s.device.id().c_str(),
                    s.device.name.c_str());
    }
    auto rendezvous = rendezvousFromEnvironment(std::chrono::seconds(60));
    Communicator comm = Communicator::create(runtime, devices, *rendezvous);
    std::printf("engine: %s (%u ranks in %u processes; this process: ranks %u..%u)\n",
                comm.engine().c_str(), comm.size(), rendezvous->processCount(), comm.rank(0),
                comm.rank(comm.localSize() - 1));

    // Gradient of m floats per rank; the data (m * ranks values) is split across them.
    const uint32_t ranks = comm.size();
    const uint32_t local = comm.localSize();
    const uint32_t m = cpuOnly ? (1u << 18) : (1u << 24);
    const float a = 0.5f;
    std::vector<Buffer> grads(local), inputs(local);
    const lang::Kernel saxpy = kernels::saxpy();
    for (uint32_t r = 0; r < local; ++r) {
        const uint32_t global = comm.rank(r);
        std::vector<float> shard(m);
        for (uint32_t i = 0; i < m; ++i) shard[i] = static_cast<float>((i + 3 * global) % 17);
        inputs[r] = devices[r].createFrom<float>(shard);
        grads[r] = devices[r].createFrom<float>(std::vector<float>(m, 0.0f));
        Dispatch d;
        d.block = {256, 1, 1};
        d.grid = {(m + 255) / 256, 1, 1};
        d.bindings = {inputs[r], grads[r]};
        d.scalar(SaxpyScalars{a, m});
        devices[r].execute(saxpy, d); // grad_r = a * shard_r
    }
    const auto start = std::chrono::steady_clock::now();
    comm.allReduce(grads, grads, m, DataType::F32, ReduceOp::Sum);
    for (ComputeClient &c : devices) c.sync();
    const double firstMs = msSince(start);
    // Timed: a few more all-reduces of a scratch copy (the checked result stays as it is).
    std::vector<Buffer> scratch(local);
    for (uint32_t r = 0; r < local; ++r) scratch[r] = devices[r].empty(uint64_t{m} * 4);
    const int iterations = cpuOnly ? 3 : 10;
    const auto timed = std::chrono::steady_clock::now();
    for (int i = 0; i < iterations; ++i)
        comm.allReduce(scratch, scratch, m, DataType::F32, ReduceOp::Sum);
    for (ComputeClient &c : devices) c.sync();
    const double ms = msSince(timed) / iterations;

    size_t wrong = 0;
    for (uint32_t r = 0; r < local; ++r) {
        const std::vector<float> got = devices[r].readAs<float>(grads[r]);
        for (uint32_t i = 0; i < m; ++i) {
            float expected = 0;
            for (uint32_t q = 0; q < ranks; ++q)
                expected += a * static_cast<float>((i + 3 * q) % 17);
            if (std::fabs(got[i] - expected) > 1e-5f * std::fabs(expected) + 1e-6f) ++wrong;
        }
    }
    const double bytes = 4.0 * m;
    const double algBw = bytes / (ms * 1e6);
    const double busBw = ranks > 1 ? algBw * 2.0 * (ranks - 1) / ranks : algBw;
    std::printf("all-reduce of %.1f MiB per rank: %.3f ms (first %.1f ms), algorithm bandwidth "
                "%.2f GB/s, bus bandwidth %.2f GB/s\n",
                bytes / (1 << 20), ms, firstMs, algBw, busBw);
    std::printf("%s: %zu mismatches against the CPU over %u ranks\n", wrong == 0 ? "PASS" : "FAIL",
                wrong, ranks);
    return wrong == 0 ? 0 : 1;
}

} // namespace

/// runDemo without --trace.
static int runDemoUntraced(const Args &args) {
    static constexpr const char *kUsage =
        "usage: backplane demo [--device SELECTOR | --devices all|SEL,SEL...] [--trace FILE |\n"
        "                      --trace-device FILE]\n"
        "Runs the built-in workload (a matmul, checked against the host) on the best device\n"
        "present, or the one SELECTOR names; --devices runs it data-parallel over several;\n"
        "--trace FILE records a timeline of the run (docs/trace.md); --trace-device FILE also\n"
        "draws when each operation ran on the device.\n";
    if (wantsHelp(args)) return printUsage(kUsage, true);
    std::string selector;
    std::string many;
    for (size_t i = 0; i < args.size(); ++i) {
        if (args[i] == "--device" && i + 1 < args.size()) {
            selector = args[++i];
        } else if (args[i] == "--devices" && i + 1 < args.size()) {
            many = args[++i];
        } else {
            std::fprintf(stderr, "backplane demo: unknown argument '%s'\n", args[i].c_str());
            return printUsage(kUsage, false);
        }
    }
    if (!many.empty()) {
        try {
            return runDataParallel(many);
        } catch (const Error &e) {
            std::fprintf(stderr, "backplane demo --devices: %s\n", e.what());
            return 1;
        }
    }
    try {
        Runtime runtime;
        const Selection selection = runtime.select(selector);
        for (const std::string &r : selection.rejected) std::printf("not used: %s\n", r.c_str());
        std::printf("device: %s %s\nwhy:    %s\n", selection.device.id().c_str(),
                    selection.device.name.c_str(), selection.reason.c_str());
        ComputeClient client = runtime.open(selection);

        const uint32_t n = 1u << 20;
        const float a = 2.5f;
        std::vector<float> x(n), y(n);
        for (uint32_t i = 0; i < n; ++i) {
            x[i] = static_cast<float>(i % 1024) * 0.25f;
            y[i] = static_cast<float>(i % 7) - 3.0f;
        }
        const lang::Kernel saxpyKernel = kernels::saxpy();
        const uint32_t block = sumBlock(client.device());
        const lang::Kernel sumKernel = kernels::reduceSum<float>(block);
        const auto start = std::chrono::steady_clock::now();
        Buffer bx = client.createFrom<float>(x), by = client.createFrom<float>(y);
        Dispatch saxpy;
        saxpy.block = {256, 1, 1};
        saxpy.grid = {(n + 255) / 256, 1, 1};
        saxpy.bindings = {bx, by};
        saxpy.scalar(SaxpyScalars{a, n});
        client.execute(saxpyKernel, saxpy);

        // Two passes: per-workgroup partial sums, then one workgroup over the partials.
        const uint32_t groups = 64;
        Buffer partial = client.empty(groups * sizeof(float));
        Buffer total = client.empty(sizeof(float));
        Dispatch sum;
        sum.block = {block, 1, 1};
        sum.grid = {groups, 1, 1};
        sum.bindings = {by, partial};
        sum.scalar(n);
        client.execute(sumKernel, sum);
        Dispatch last;
        last.block = {block, 1, 1};
        last.bindings = {partial, total};
        last.scalar(groups);
        client.execute(sumKernel, last);

        const std::vector<float> result = client.readAs<float>(by);
        const double deviceSum = client.readAs<float>(total)[0];
        const double elapsed = msSince(start);

        size_t wrong = 0;
        double cpuSum = 0;
        for (uint32_t i = 0; i < n; ++i) {
            const float expected = a * x[i] + y[i];
            if (std::fabs(result[i] - expected) > 1e-5f * std::fabs(expected) + 1e-6f) ++wrong;
            cpuSum += expected;
        }
        const bool sumOk = std::fabs(deviceSum - cpuSum) <= 1e-4 * std::fabs(cpuSum) + 1.0;
        std::printf("saxpy over %u floats: %zu mismatches\n", n, wrong);
        std::printf("sum: device %.3f, cpu %.3f\n", deviceSum, cpuSum);
        const bool saxpyOk = wrong == 0 && sumOk;
        std::printf("saxpy + sum %s in %.2f ms (upload, 3 launches, download; first run includes "
                    "compile)\n",
                    saxpyOk ? "match" : "DIFFER", elapsed);

        const bool matmulOk = runMatmul(client, runtime.config());
        const bool pass = saxpyOk && matmulOk;
        std::printf("%s: saxpy, sum and tuned matmul %s the CPU\n", pass ? "PASS" : "FAIL",
                    pass ? "match" : "do not all match");
        return pass ? 0 : 1;
    } catch (const Error &e) {
        std::fprintf(stderr, "backplane demo: %s\n", e.what());
        return 1;
    }
}

int runDemo(const Args &args) { return runTraced(args, "demo", &runDemoUntraced); }

} // namespace backplane::tool
