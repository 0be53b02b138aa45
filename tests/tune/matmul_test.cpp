// The demo's tuned matmul (tools/backplane/demo_matmul.cpp) on one real plugin: the portable
// candidates (kernels::matmul per tile set) and the hand-written reference kernels vs the CPU,
// which candidates a device's limits admit, the tuner's pick, the warm cache.
// BACKPLANE_MATMUL_PLUGIN names the plugin ("host", "vulkan"); exits 77 (SKIP) with the reason
// only when the plugin has no driver or device here, and fails on any other setup error. The test
// cases use the public API only; main() probes the plugin through detail::PluginLibrary
// (internals) when the runtime's report cannot tell a missing driver from another probe failure.
#define DOCTEST_CONFIG_IMPLEMENT
#include "demo_matmul.hpp"
#include "tune_fixtures.hpp"

#include "../test_skip.hpp"
#include "plugin/plugin_library.hpp"

#include <backplane/cache.hpp>
#include <backplane/client.hpp>
#include <backplane/error.hpp>
#include <backplane/kernels.hpp>
#include <backplane/runtime.hpp>
#include <backplane/tune.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

using namespace backplane;
using namespace backplane::tool;

namespace {

std::optional<Runtime> gRuntime;
std::optional<ComputeClient> gClient;

std::vector<float> randomValues(size_t count, uint32_t seed) {
    std::vector<float> values(count);
    for (float &v : values) {
        seed = seed * 1664525u + 1013904223u;
        v = static_cast<float>(seed >> 8) / static_cast<float>(1u << 23) - 1.0f;
    }
    return values;
}

/// A problem on the test's device with its host copies, for the CPU reference.
struct HostProblem {
    std::vector<float> a, b;
    MatmulProblem problem;

    HostProblem(uint32_t m, uint32_t n, uint32_t k)
        : a(randomValues(size_t(m) * k, m * 31 + k)), b(randomValues(size_t(k) * n, n * 17 + k)) {
        problem = {&*gClient, gClient->createFrom<float>(a), gClient->createFrom<float>(b), m, n,
                   k};
    }
    std::string compare(const MatmulResult &result) const {
        return compareMatmul(gClient->readAs<float>(result.c),
                             matmulOnCpu(a, b, problem.m, problem.n, problem.k), problem.n,
                             problem.k);
    }
};

/// A tuner on `store` with few samples (the policy is not what these tests are about).
tune::Tuner makeTuner(CacheStore &store) {
    tune::Tuner::Options options;
    options.store = &store;
    options.device = deviceFingerprint(gClient->device());
    options.timer = std::make_shared<tune::ClientTimer>(*gClient);
    options.progress = false;
    tune::BenchPolicy policy;
    policy.minSamples = 2;
    policy.maxSamples = 3;
    options.policy = policy;
    return tune::Tuner(options);
}

} // namespace

TEST_CASE("every device gets the portable matmul at each tile set that fits, named by its tiles") {
    std::vector<std::string> expected;
    for (const kernels::MatmulTiles &tiles : portableMatmulTiles()) {
        const MatmulCandidate c = portableMatmulCandidate(tiles);
        CAPTURE(tiles.name());
        CHECK(c.name == "t" + std::to_string(tiles.tile) + "-w" + std::to_string(tiles.perThread) +
                            "-k" + std::to_string(tiles.depth));
        REQUIRE(c.portable.has_value());
        CHECK(c.portable->name() == tiles.name());
        CHECK(c.block == std::array<uint32_t, 3>{tiles.threads(), tiles.threads(), 1});
        CHECK(c.sharedMemoryBytes == tiles.sharedBytes());
        if (fitsDevice(c, gClient->device())) expected.push_back(c.name);
    }
    const std::vector<MatmulCandidate> candidates = matmulCandidates(gClient->device());
    REQUIRE(candidates.size() >= 2);
    std::vector<std::string> names;
    for (const MatmulCandidate &c : candidates) {
        CAPTURE(c.name);
        names.push_back(c.name);
        // What run() launches is the portable kernel, not a hand-written variant.
        REQUIRE(c.portable.has_value());
        CHECK(c.kernel.name == c.portable->name());
    }
    CHECK(names == expected);
    // The tuner chooses among exactly these.
    CHECK(matmulTunable(gClient->device()).info().names == names);
}

TEST_CASE("a device's block and shared-memory limits leave out the tile sets that exceed them") {
    DeviceInfo device;
    device.backend = "fake";
    device.dialects = 1u << static_cast<int>(Dialect::Glsl);
    auto names = [&] {
        std::vector<std::string> out;
        for (const MatmulCandidate &c : matmulCandidates(device)) out.push_back(c.name);
        return out;
    };
    // No limits: every tile set.
    CHECK(names() == std::vector<std::string>{"t16-w1-k16", "t32-w1-k16", "t32-w2-k16",
                                              "t64-w4-k16", "t64-w4-k8"});
    // 256 threads per workgroup: t32-w1-k16 (32 x 32 threads) is out.
    device.maxBlockThreads = 256;
    CHECK(names() == std::vector<std::string>{"t16-w1-k16", "t32-w2-k16", "t64-w4-k16",
                                              "t64-w4-k8"});
    // 4 KiB of shared memory: t64-w4-k16 (2 x 64 x 16 floats = 8 KiB) is out too.
    device.maxSharedMemoryBytes = 4096;
    CHECK(names() == std::vector<std::string>{"t16-w1-k16", "t32-w2-k16", "t64-w4-k8"});
    // 8 threads along x: nothing fits, and the tunable set says why.
    device.maxBlockSize = {8, 1024, 64};
    CHECK(names().empty());
    try {
        (void)matmulTunable(device);
        FAIL("matmulTunable accepted a device that fits no tile set");
    } catch (const Error &e) {
        CHECK((e.code() == ErrorCode::Unsupported));
        CHECK(std::string(e.what()).find("fits none") != std::string::npos);
    }
    // A device that accepts no dialect of the kernel gets nothing.
    DeviceInfo spirvOnly;
    spirvOnly.dialects = 1u << static_cast<int>(Dialect::Spirv);
    CHECK(matmulCandidates(spirvOnly).empty());
}

TEST_CASE("every portable and hand-written matmul of the device matches the CPU, tile edges "
          "included") {
    std::vector<MatmulCandidate> candidates = matmulCandidates(gClient->device());
    const size_t portable = candidates.size();
    for (MatmulCandidate &c : handWrittenMatmulCandidates(gClient->device()))
        candidates.push_back(std::move(c));
    REQUIRE(portable >= 2);
    // The hand-written references (the benchmarks' baseline) exist for every in-tree plugin.
    REQUIRE(candidates.size() > portable);
    // 70 x 45 x 33: no candidate's tile divides it, so every bounds check is exercised.
    for (const auto &[m, n, k] : {std::array<uint32_t, 3>{70, 45, 33}, {64, 64, 64}}) {
        const HostProblem p(m, n, k);
        for (const MatmulCandidate &candidate : candidates) {
            CAPTURE(candidate.name);
            CAPTURE(m);
            CHECK(p.compare(candidate.run(p.problem)) == "");
            // launch() into a C of the caller's: the same product.
            const Buffer c = gClient->empty(uint64_t(m) * n * sizeof(float));
            candidate.launch(p.problem, c);
            CHECK(p.compare(MatmulResult{&*gClient, c, m, n, k}) == "");
        }
    }
}

TEST_CASE("the tuner picks one of the candidates and its output matches the CPU") {
    tunetest::TempDir dir;
    CacheStore store(dir.path());
    tune::Tuner tuner = makeTuner(store);
    const MatmulSet set = matmulTunable(gClient->device());
    const HostProblem p(96, 80, 72);

    CHECK(p.compare(tuner.execute(set, p.problem)) == "");
    CHECK(tuner.counters().tunings == 1);
    CHECK(tuner.counters().benchmarkRuns > 0);
    const auto record = tuner.lookup(set.info(), set.key(p.problem, tuner.level()));
    REQUIRE(record.has_value());
    const auto &names = set.info().names;
    CHECK(std::find(names.begin(), names.end(), record->winner) != names.end());
    CHECK(record->ranking.size() == names.size());
    for (const tune::CandidateResult &r : record->results) {
        CAPTURE(r.name);
        CHECK(r.ok);
    }
}

TEST_CASE("a second tuner on the same cache runs the stored winner without benchmarking") {
    tunetest::TempDir dir;
    CacheStore store(dir.path());
    const MatmulSet set = matmulTunable(gClient->device());
    const HostProblem p(128, 128, 128);
    std::string winner;
    {
        tune::Tuner cold = makeTuner(store);
        (void)cold.execute(set, p.problem);
        REQUIRE(cold.counters().benchmarkRuns > 0);
        winner = cold.lookup(set.info(), set.key(p.problem, cold.level()))->winner;
    }
    tune::Tuner warm = makeTuner(store);
    CHECK(p.compare(warm.execute(set, p.problem)) == "");
    CHECK(warm.counters().tunings == 0);
    CHECK(warm.counters().benchmarkRuns == 0);
    CHECK(warm.counters().persistentHits == 1);
    // 100 anchors to the same power of two (128): the same decision, still no benchmark.
    const HostProblem near(100, 100, 100);
    CHECK(near.compare(warm.execute(set, near.problem)) == "");
    CHECK(warm.counters().benchmarkRuns == 0);
    CHECK(warm.lookup(set.info(), set.key(p.problem, warm.level()))->winner == winner);
}

TEST_CASE("the output check rejects a candidate whose product is wrong") {
    tunetest::TempDir dir;
    CacheStore store(dir.path());
    tune::Tuner tuner = makeTuner(store);
    MatmulSet set = matmulTunable(gClient->device());
    const MatmulCandidate reference = matmulCandidates(gClient->device()).front();
    set.add("zeroes", [reference](const MatmulProblem &problem) {
        MatmulResult result = reference.run(problem);
        problem.client->fill(result.c, 0);
        return result;
    });
    const HostProblem p(40, 40, 40);
    CHECK(p.compare(tuner.execute(set, p.problem)) == "");
    const auto record = tuner.lookup(set.info(), set.key(p.problem, tuner.level()));
    REQUIRE(record.has_value());
    CHECK(record->winner != "zeroes");
    const auto rejected = std::find_if(record->results.begin(), record->results.end(),
                                       [](const auto &r) { return r.name == "zeroes"; });
    REQUIRE(rejected != record->results.end());
    CHECK_FALSE(rejected->ok);
    CHECK(rejected->error.find("differ") != std::string::npos);
}

namespace {

/// Whether the runtime has a device of `plugin`: nullopt when it does, else the exit status with
/// the reason printed (77 only for a missing driver or device).
std::optional<int> exitUnlessUsable(const Runtime &runtime, const std::string &plugin) {
    const auto &reports = runtime.plugins();
    const auto report = std::find_if(reports.begin(), reports.end(),
                                     [&](const PluginReport &r) { return r.name == plugin; });
    if (report == reports.end())
        return test::fail("no plugin named '" + plugin + "' in the plugin search path");
    const std::string state = "plugin " + plugin + " is " + toString(report->state) + ": " +
                              report->reason;
    switch (report->state) {
    case PluginState::Loaded: return std::nullopt;
    case PluginState::NoDevice: return test::skip(state);
    case PluginState::ProbeFailed:
        // The report keeps the probe's message but not its code: probe again to tell a missing
        // driver (skip) from any other probe failure (fail).
        try {
            detail::PluginLibrary::open(report->library, report->name, {})->probe();
        } catch (const std::exception &e) {
            return test::skipOrFail(e, "probing plugin " + plugin);
        }
        return test::fail(state);
    default: return test::fail(state);
    }
}

} // namespace

int main(int argc, char **argv) {
    const char *plugin = std::getenv("BACKPLANE_MATMUL_PLUGIN");
    if (plugin == nullptr || *plugin == '\0') {
        std::fprintf(stderr, "matmul_test: set BACKPLANE_MATMUL_PLUGIN (host, vulkan...)\n");
        return 2;
    }
    try {
        Config config;
        config.cacheEnabled = false;
        config.pluginEnable = {plugin};
        gRuntime.emplace(config);
        if (const std::optional<int> status = exitUnlessUsable(*gRuntime, plugin)) return *status;
        gClient.emplace(gRuntime->open(gRuntime->select(plugin)));
    } catch (const std::exception &e) {
        return test::skipOrFail(e, std::string("opening a ") + plugin + " device");
    }
    std::printf("matmul test on %s %s\n", gClient->device().id().c_str(),
                gClient->device().name.c_str());
    doctest::Context context(argc, argv);
    const int result = context.run();
    gClient.reset();
    gRuntime.reset();
    return result;
}
