// `backplane bench [SUITE...] [--quick] [--json] [--device SEL]`: runtime vs raw API, one table.
#include "bench.hpp"
#include "commands.hpp"
#include "trace_option.hpp"

#include <backplane/error.hpp>

#include <nlohmann/json.hpp>

#include <cstdio>
#include <functional>
#include <string>
#include <vector>

namespace backplane::tool {
namespace {

struct Suite {
    const char *name;
    void (*run)(const BenchOptions &, BenchRows &);
};

// Only the suites built into this binary (bench_<name>.cpp present).
const std::vector<Suite> &suites() {
    static const std::vector<Suite> all = {
#ifdef BACKPLANE_HAVE_BENCH_ENGINE
        {"engine", &benchEngine},
#endif
#ifdef BACKPLANE_HAVE_BENCH_VULKAN
        {"vulkan", &benchVulkan},
#endif
#ifdef BACKPLANE_HAVE_BENCH_CUDA
        {"cuda", &benchCuda},
#endif
#ifdef BACKPLANE_HAVE_BENCH_TUNE
        {"tune", &benchTune},
#endif
#ifdef BACKPLANE_HAVE_BENCH_STARTUP
        {"startup", &benchStartup},
#endif
#ifdef BACKPLANE_HAVE_BENCH_MULTIDEVICE
        {"multidevice", &benchMultidevice},
#endif
#ifdef BACKPLANE_HAVE_BENCH_KERNELS
        {"kernels", &benchKernels},
#endif
#ifdef BACKPLANE_HAVE_BENCH_TRANSFERS
        {"transfers", &benchTransfers},
#endif
    };
    return all;
}

int usage() {
    std::fputs("usage: backplane bench [SUITE...] [--quick] [--json] [--device SELECTOR] "
               "[--trace FILE]\nsuites:",
               stderr);
    for (const Suite &s : suites()) std::fprintf(stderr, " %s", s.name);
    std::fputs("\n", stderr);
    return 2;
}

} // namespace

/// runBench without --trace.
static int runBenchUntraced(const Args &args) {
    BenchOptions options;
    bool json = false;
    std::vector<std::string> wanted;
    for (size_t i = 0; i < args.size(); ++i) {
        if (args[i] == "--quick") options.quick = true;
        else if (args[i] == "--json") json = true;
        else if (args[i] == "--device" && i + 1 < args.size()) options.device = args[++i];
        else if (!args[i].empty() && args[i][0] == '-') return usage();
        else wanted.push_back(args[i]);
    }
    for (const std::string &w : wanted) {
        bool known = false;
        for (const Suite &s : suites()) known = known || w == s.name;
        if (!known) {
            std::fprintf(stderr, "backplane bench: unknown suite '%s'\n", w.c_str());
            return usage();
        }
    }
    BenchRows rows;
    for (const Suite &s : suites()) {
        bool selected = wanted.empty();
        for (const std::string &w : wanted) selected = selected || w == s.name;
        if (!selected) continue;
        try {
            s.run(options, rows);
        } catch (const Error &e) {
            std::fprintf(stderr, "backplane bench %s: %s\n", s.name, e.what());
        }
    }
    if (json) {
        nlohmann::json out = nlohmann::json::array();
        for (const BenchRow &r : rows)
            out.push_back({{"suite", r.suite}, {"device", r.device}, {"what", r.what},
                           {"runtime", r.runtime}, {"raw", r.raw}, {"unit", r.unit},
                           {"ratio", r.ratio()}, {"target", r.target}});
        std::printf("%s\n", out.dump(2).c_str());
        return 0;
    }
    std::printf("%-8s %-28s %-62s %12s %12s %-6s %8s  %s\n", "suite", "device", "what", "runtime",
                "raw", "unit", "ratio", "target");
    for (const BenchRow &r : rows)
        std::printf("%-8s %-28.28s %-62.62s %12.3f %12.3f %-6s %7.2fx  %s\n", r.suite.c_str(),
                    r.device.c_str(), r.what.c_str(), r.runtime, r.raw, r.unit.c_str(), r.ratio(),
                    r.target.c_str());
    return 0;
}

int runBench(const Args &args) { return runTraced(args, "bench", &runBenchUntraced); }

} // namespace backplane::tool
