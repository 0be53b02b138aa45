// `backplane bench tune`: autotune cost with a cold vs a warm cache, and a tuned matmul's regret.
#include "bench.hpp"

#include <backplane/client.hpp>
#include <backplane/runtime.hpp>
#include <backplane/tune.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <thread>

namespace backplane::tool {
namespace {

using Clock = std::chrono::steady_clock;

double msSince(Clock::time_point start) {
    return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

/// A temporary cache directory, removed at scope exit.
struct TempCache {
    std::filesystem::path path;
    TempCache() {
        std::string pattern =
            (std::filesystem::temp_directory_path() / "bp-bench-tune-XXXXXX").string();
        if (::mkdtemp(pattern.data()) != nullptr) path = pattern;
    }
    ~TempCache() {
        std::error_code ec;
        if (!path.empty()) std::filesystem::remove_all(path, ec);
    }
};

/// Cold vs warm cache with synthetic candidates of known cost (busy loops of 50/100/200 us).
void coldVsWarm(const BenchOptions &options, BenchRows &rows) {
    TempCache cache;
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

// -- matmul regret on a device that runs host kernels --------------------------------------------

struct MatmulScalars {
    uint32_t m, n, k, rows;
};

/// C = A B, `rows` rows of C per workgroup, loop order i-j-k (strided reads of B).
void matmulIjk(const bp_host_kernel_context *c) {
    const auto *s = static_cast<const MatmulScalars *>(c->scalars);
    const auto *a = static_cast<const float *>(c->buffers[0]);
    const auto *b = static_cast<const float *>(c->buffers[1]);
    auto *out = static_cast<float *>(c->buffers[2]);
    for (uint32_t i = c->workgroup[0] * s->rows; i < std::min(s->m, (c->workgroup[0] + 1) * s->rows); ++i)
        for (uint32_t j = 0; j < s->n; ++j) {
            float acc = 0;
            for (uint32_t p = 0; p < s->k; ++p) acc += a[i * s->k + p] * b[p * s->n + j];
            out[i * s->n + j] = acc;
        }
}

/// Same result, loop order i-k-j (contiguous reads of B; vectorises).
void matmulIkj(const bp_host_kernel_context *c) {
    const auto *s = static_cast<const MatmulScalars *>(c->scalars);
    const auto *a = static_cast<const float *>(c->buffers[0]);
    const auto *b = static_cast<const float *>(c->buffers[1]);
    auto *out = static_cast<float *>(c->buffers[2]);
    for (uint32_t i = c->workgroup[0] * s->rows; i < std::min(s->m, (c->workgroup[0] + 1) * s->rows); ++i) {
        float *row = out + static_cast<size_t>(i) * s->n;
        std::fill(row, row + s->n, 0.0f);
        for (uint32_t p = 0; p < s->k; ++p) {
            const float av = a[i * s->k + p];
            const float *brow = b + static_cast<size_t>(p) * s->n;
            for (uint32_t j = 0; j < s->n; ++j) row[j] += av * brow[j];
        }
    }
}

struct MatmulInputs {
    ComputeClient *client = nullptr;
    Buffer a, b, c;
    uint32_t m = 0, n = 0, k = 0;
};

void matmulRegret(const BenchOptions &options, BenchRows &rows) {
    std::optional<Runtime> runtime;
    std::optional<ComputeClient> client;
    try {
        runtime.emplace();
        const Selection selection = runtime->select(options.device.empty() ? "host" : options.device);
        if (!selection.device.accepts(Dialect::Host)) {
            std::fprintf(stderr, "bench tune: the matmul tunable has host variants only; %s has "
                                 "no host dialect, regret rows skipped\n",
                         selection.device.id().c_str());
            return;
        }
        client.emplace(runtime->open(selection));
    } catch (const Error &e) {
        std::fprintf(stderr, "bench tune: no device for the matmul regret rows: %s\n", e.what());
        return;
    }
    const uint32_t size = options.quick ? 128 : 256;
    MatmulInputs in;
    in.client = &*client;
    in.m = in.n = in.k = size;
    std::vector<float> host(static_cast<size_t>(size) * size, 1.0f);
    in.a = client->create(host.data(), host.size() * sizeof(float));
    in.b = client->create(host.data(), host.size() * sizeof(float));
    in.c = client->empty(host.size() * sizeof(float));

    tune::TunableSet<MatmulInputs> set("bench-matmul-host", [](const MatmulInputs &x, TuneLevel l) {
        return tune::KeyBuilder(l).axis("m", x.m).axis("n", x.n).axis("k", x.k).str();
    });
    struct Variant {
        const char *name;
        bp_host_kernel_fn fn;
        uint32_t rows;
    };
    const Variant variants[] = {{"ijk-rows1", &matmulIjk, 1},
                                {"ikj-rows1", &matmulIkj, 1},
                                {"ikj-rows8", &matmulIkj, 8},
                                {"ikj-rows64", &matmulIkj, 64}};
    for (const Variant &v : variants)
        set.add(v.name, [v](const MatmulInputs &x) {
            Dispatch d;
            d.grid = {(x.m + v.rows - 1) / v.rows, 1, 1};
            d.bindings = {x.a, x.b, x.c};
            d.scalar(MatmulScalars{x.m, x.n, x.k, v.rows});
            x.client->execute({std::string("matmul-") + v.name, {KernelVariant::host(v.fn, v.name)}},
                              d);
        });

    tune::Tuner::Options o;
    o.device = deviceFingerprint(client->device());
    o.timer = std::make_shared<tune::ClientTimer>(*client);
    o.progress = false;
    tune::Tuner tuner(o);
    tuner.execute(set, in);
    const auto record = tuner.lookup(set.info(), set.key(in, o.level));
    if (!record) return;

    // Round robin, so drifts of the machine hit the tuned path and every fixed one alike. The
    // tuned path is the real one: Tuner::execute, key and lookup included.
    tune::ClientTimer timer(*client);
    std::vector<std::vector<double>> times(set.size() + 1);
    auto ms = [](std::chrono::nanoseconds t) {
        return std::chrono::duration<double, std::milli>(t).count();
    };
    for (int r = 0; r < (options.quick ? 5 : 15); ++r) {
        times[0].push_back(ms(timer.time([&] { tuner.execute(set, in); })));
        for (size_t i = 0; i < set.size(); ++i)
            times[i + 1].push_back(ms(timer.time([&] { set.candidate(i)(in); })));
    }
    auto median = [](std::vector<double> t) {
        std::sort(t.begin(), t.end());
        return t[t.size() / 2];
    };
    const double tuned = median(times[0]);
    for (size_t i = 0; i < set.size(); ++i) {
        const bool isWinner = set.info().names[i] == record->winner;
        rows.push_back({"tune", client->device().id() + " " + client->device().name,
                        "matmul " + std::to_string(size) + "^3 tuned (" + record->winner +
                            ") vs fixed " + set.info().names[i],
                        tuned, median(times[i + 1]), "ms", isWinner ? "<= 1.05x" : ""});
    }
}

} // namespace

void benchTune(const BenchOptions &options, BenchRows &rows) {
    coldVsWarm(options, rows);
    matmulRegret(options, rows);
}

} // namespace backplane::tool
