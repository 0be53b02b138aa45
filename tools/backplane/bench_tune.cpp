// `backplane bench tune`: autotune cost with a cold vs a warm cache, and the tuned matmul's regret.
#include "bench.hpp"
#include "demo_matmul.hpp"

#include <backplane/client.hpp>
#include <backplane/runtime.hpp>
#include <backplane/tune.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <vector>

namespace backplane::tool {
namespace {

using Clock = std::chrono::steady_clock;

double msSince(Clock::time_point start) {
    return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}


/// Cold vs warm cache with synthetic candidates of known cost (busy loops of 50/100/200 us).
void coldVsWarm(const BenchOptions &options, BenchRows &rows) {
    TempDir cache("bp-bench-tune");
    if (cache.path.empty()) {
        std::fprintf(stderr, "bench tune: no temporary directory; cold/warm rows skipped\n");
        return;
    }
    auto spin = [](int us) {
        const auto end = Clock::now() + std::chrono::microseconds(us);
        while (Clock::now() < end) {
        }
    };
    tune::TunableSet<int, int> set("bench-synthetic", [](const int &n, TuneLevel level) {
        return tune::KeyBuilder(level).axis("n", static_cast<uint64_t>(n)).str();
    });
    set.add("spin-200us", [&](const int &n) { spin(200); return n; });
    set.add("spin-50us", [&](const int &n) { spin(50); return n; });
    set.add("spin-100us", [&](const int &n) { spin(100); return n; });
    const int keys = options.quick ? 4 : 16;

    auto tuneAll = [&](tune::TuneCounters &counters) {
        CacheStore store(cache.path);
        tune::Tuner::Options o;
        o.store = &store;
        o.device = "bench";
        o.progress = false;
        tune::Tuner tuner(o);
        const auto start = Clock::now();
        for (int k = 0; k < keys; ++k) tuner.execute(set, 1 << k);
        counters = tuner.counters();
        return msSince(start);
    };
    tune::TuneCounters cold, warm;
    const double coldMs = tuneAll(cold);
    const double warmMs = tuneAll(warm);
    const std::string device = "host (synthetic candidates)";
    rows.push_back({"tune", device,
                    "first use of " + std::to_string(keys) + " keys, warm cache vs cold cache",
                    warmMs, coldMs, "ms", ""});
    rows.push_back({"tune", device, "benchmark runs, warm cache vs cold cache",
                    static_cast<double>(warm.benchmarkRuns),
                    static_cast<double>(cold.benchmarkRuns), "runs", "0 runs warm"});
    if (warm.benchmarkRuns != 0)
        std::fprintf(stderr, "bench tune: FAILED target: warm cache made %llu benchmark runs\n",
                     static_cast<unsigned long long>(warm.benchmarkRuns));
}

// -- matmul regret: the demo's tuned matmul vs each of its fixed candidates, on every device ------

/// Deterministic values in [-1, 1).
std::vector<float> matmulInput(size_t count, uint32_t seed) {
    std::vector<float> values(count);
    for (float &v : values) {
        seed = seed * 1664525u + 1013904223u;
        v = static_cast<float>(seed >> 8) / static_cast<float>(1u << 23) - 1.0f;
    }
    return values;
}

void matmulRegret(ComputeClient &client, const BenchOptions &options, BenchRows &rows) {
    const DeviceInfo &device = client.device();
    const std::string deviceName = device.id() + " " + device.name;
    const bool cpu = device.type == DeviceType::Cpu;
    const uint32_t size = cpu ? (options.quick ? 128 : 256) : (options.quick ? 512 : 1024);
    const MatmulSet set = matmulTunable(device);
    MatmulProblem in{&client,
                     client.createFrom<float>(matmulInput(size_t(size) * size, 1)),
                     client.createFrom<float>(matmulInput(size_t(size) * size, 2)), size, size,
                     size};

    // A memory-only tuner: the decision is made fresh in this run, then judged.
    tune::Tuner::Options o;
    o.device = deviceFingerprint(device);
    o.timer = std::make_shared<tune::ClientTimer>(client);
    o.progress = false;
    tune::Tuner tuner(o);
    (void)tuner.execute(set, in);
    const auto record = tuner.lookup(set.info(), set.key(in, o.level));
    if (!record) {
        std::fprintf(stderr, "bench tune: %s: no tuning decision recorded, regret rows skipped\n",
                     deviceName.c_str());
        return;
    }

    // Round robin, so drifts of the machine hit the tuned path and every fixed one alike. The
    // tuned path is the real one: Tuner::execute, key and lookup included.
    tune::ClientTimer timer(client);
    std::vector<std::vector<double>> times(set.size() + 1);
    auto ms = [](std::chrono::nanoseconds t) {
        return std::chrono::duration<double, std::milli>(t).count();
    };
    for (int r = 0; r < (options.quick ? 5 : 15); ++r) {
        times[0].push_back(ms(timer.time([&] { (void)tuner.execute(set, in); })));
        for (size_t i = 0; i < set.size(); ++i)
            times[i + 1].push_back(ms(timer.time([&] { (void)set.candidate(i)(in); })));
    }
    auto median = [](std::vector<double> t) {
        std::sort(t.begin(), t.end());
        return t[t.size() / 2];
    };
    const double tuned = median(times[0]);
    for (size_t i = 0; i < set.size(); ++i) {
        const bool isWinner = set.info().names[i] == record->winner;
        rows.push_back({"tune", deviceName,
                        "matmul " + std::to_string(size) + "^3 tuned (" + record->winner +
                            ") vs fixed " + set.info().names[i],
                        tuned, median(times[i + 1]), "ms", isWinner ? "<= 1.05x" : ""});
    }
}

/// Every route of every device present (the same GPU through cuda and vulkan is measured once
/// per plugin), or only the selected one when --device is given.
void matmulRegretAll(const BenchOptions &options, BenchRows &rows) {
    std::optional<Runtime> runtime;
    std::vector<DeviceInfo> targets;
    try {
        runtime.emplace();
        if (!options.device.empty()) {
            targets.push_back(runtime->select(options.device).device);
        } else {
            for (const PhysicalDevice &physical : runtime->devices())
                for (const DeviceInfo &route : physical.routes) targets.push_back(route);
        }
    } catch (const Error &e) {
        std::fprintf(stderr, "bench tune: no device for the matmul regret rows: %s\n", e.what());
        return;
    }
    for (const DeviceInfo &target : targets) {
        try {
            ComputeClient client = runtime->open(Selection{target, "bench tune", {}});
            matmulRegret(client, options, rows);
        } catch (const Error &e) {
            std::fprintf(stderr, "bench tune: matmul regret on %s skipped: %s\n",
                         target.id().c_str(), e.what());
        }
    }
}

} // namespace

void benchTune(const BenchOptions &options, BenchRows &rows) {
    coldVsWarm(options, rows);
    matmulRegretAll(options, rows);
}

} // namespace backplane::tool
