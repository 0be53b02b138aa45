// Child process of the tune tests (uses core/src internals: the kernel cache). Modes:
//   tune_helper tune DIR DEVICE VARIANT   tune the sleepers once; prints the counters
//   tune_helper stress DIR ITERATIONS     store/load kernels and tune cheap sets concurrently
#include "tune_fixtures.hpp"

#include "cache/kernel_cache.hpp"

#include <cstdio>
#include <cstring>

using namespace backplane;
using namespace tunetest;

namespace {

int tuneOnce(const std::filesystem::path &dir, const std::string &device,
             const std::string &variant) {
    CacheStore store(dir);
    tune::Tuner tuner(tunerOptions(&store, device));
    SleepSet set = sleepers();
    if (variant == "extra") set.add("extra", [](const Problem &) { return std::string("extra"); });
    const std::string winner = tuner.execute(set, Problem{100});
    const auto c = tuner.counters();
    std::printf("tunings=%llu runs=%llu persistent=%llu winner=%s\n",
                static_cast<unsigned long long>(c.tunings),
                static_cast<unsigned long long>(c.benchmarkRuns),
                static_cast<unsigned long long>(c.persistentHits), winner.c_str());
    return 0;
}

/// The blob every process writes for kernel `k`: both processes agree on it, so any read that
/// differs is a torn or corrupt read.
std::vector<unsigned char> blobFor(int k) {
    std::vector<unsigned char> blob(65536 + static_cast<size_t>(k) * 997);
    for (size_t i = 0; i < blob.size(); ++i) blob[i] = static_cast<unsigned char>(i * 31 + k);
    return blob;
}

int stress(const std::filesystem::path &dir, int iterations) {
    Config config;
    config.cacheDir = dir;
    CacheStore store(dir);
    using CheapSet = tune::TunableSet<int, int>;
    CheapSet set("cheap", [](const int &k, TuneLevel) { return "k=" + std::to_string(k); });
    set.add("a", [](const int &k) { return k; });
    set.add("b", [](const int &k) { return k; });
    for (int i = 0; i < iterations; ++i) {
        const int k = i % 8;
        const std::string key = "stress-kernel-" + std::to_string(k);
        if (auto blob = detail::loadCachedKernel(config, key); blob && *blob != blobFor(k)) {
            std::fprintf(stderr, "torn or wrong kernel blob for %s\n", key.c_str());
            return 1;
        }
        detail::storeCachedKernel(config, key, blobFor(k));
        // A fresh tuner each time: it must read the other process's results or tune itself.
        tune::Tuner tuner(tunerOptions(&store));
        if (tuner.execute(set, k) != k) return 1;
    }
    return 0;
}

} // namespace

int main(int argc, char **argv) {
    try {
        if (argc == 5 && std::strcmp(argv[1], "tune") == 0) return tuneOnce(argv[2], argv[3], argv[4]);
        if (argc == 4 && std::strcmp(argv[1], "stress") == 0)
            return stress(argv[2], std::atoi(argv[3]));
    } catch (const std::exception &e) {
        std::fprintf(stderr, "tune_helper: %s\n", e.what());
        return 1;
    }
    std::fprintf(stderr, "usage: tune_helper tune DIR DEVICE VARIANT | stress DIR ITERATIONS\n");
    return 2;
}
