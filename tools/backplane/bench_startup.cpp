// Suite "startup": what constructing a Runtime costs, with the isolated probe (cold: no probe
// cache, every plugin probed in a backplane-probe child; warm: answers cached) against probing
// in process. The "raw" column is the in-process start in the same run.
#include "bench.hpp"

#include <backplane/config.hpp>
#include <backplane/runtime.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <unistd.h>
#include <vector>

namespace backplane::tool {
namespace {

namespace fs = std::filesystem;

/// Milliseconds to construct a Runtime from `config`.
double startMs(const Config &config) {
    const auto start = std::chrono::steady_clock::now();
    const Runtime runtime(config);
    const auto end = std::chrono::steady_clock::now();
    return std::chrono::duration<double, std::milli>(end - start).count();
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0 : v[v.size() / 2];
}

} // namespace

void benchStartup(const BenchOptions &options, BenchRows &rows) {
    Config base = loadConfig();
    base.logSpec = "error";
    const int reps = options.quick ? 3 : 9;
    const fs::path root = fs::temp_directory_path() /
                          ("backplane-bench-startup-" + std::to_string(::getpid()));
    std::vector<double> cold, warm, inProcessCold, inProcessWarm;
    std::string plugins;
    for (int i = 0; i < reps; ++i) {
        // Cold: a fresh cache directory, so no probe record and no plugin cache exist.
        Config isolated = base;
        isolated.probeMode = ProbeMode::Isolated;
        isolated.cacheEnabled = true;
        isolated.cacheDir = root / ("isolated-" + std::to_string(i));
        cold.push_back(startMs(isolated));
        warm.push_back(startMs(isolated));
        Config inProcess = base;
        inProcess.probeMode = ProbeMode::InProcess;
        inProcess.cacheEnabled = true;
        inProcess.cacheDir = root / ("in-process-" + std::to_string(i));
        inProcessCold.push_back(startMs(inProcess));
        inProcessWarm.push_back(startMs(inProcess));
    }
    {
        Config probe = base;
        probe.cacheEnabled = false;
        const Runtime runtime(probe);
        for (const auto &r : runtime.plugins())
            if (r.state == PluginState::Loaded || r.state == PluginState::NoDevice ||
                r.state == PluginState::ProbeFailed)
                plugins += (plugins.empty() ? "" : "+") + r.name;
    }
    std::error_code ec;
    fs::remove_all(root, ec);
    const std::string device = "plugins: " + (plugins.empty() ? std::string("none") : plugins);
    rows.push_back({"startup", device, "Runtime() cold: isolated probe vs in process (no caches)",
                    median(cold), median(inProcessCold), "ms", ""});
    rows.push_back({"startup", device, "Runtime() warm: probe answers cached vs in process",
                    median(warm), median(inProcessWarm), "ms", "<= 1.05x"});
}

} // namespace backplane::tool
