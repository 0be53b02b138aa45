// Benchmark suites of `backplane bench`: each compares the runtime with the raw API, same run.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

namespace backplane::tool {

/// One measured comparison. `ratio` is runtime/raw for times and raw/runtime for rates, so that
/// for every row lower is better for times; `better` says which way the target points.
struct BenchRow {
    std::string suite;  ///< "engine", "vulkan", "cuda", "tune", "kernels"
    std::string device; ///< "host:0 (x86_64)", "cuda:0 NVIDIA H100 80GB HBM3"
    std::string what;   ///< "launch, back to back"
    double runtime = 0; ///< value through backplane
    double raw = 0;     ///< value of the raw API in the same process and run
    std::string unit;   ///< "us", "GB/s", "ms"
    std::string target; ///< from shared BASELINES, e.g. "<= 1.10x"; "" if none
    double ratio() const { return raw == 0 ? 0 : runtime / raw; }
};

/// Options shared by every suite.
struct BenchOptions {
    std::string device;      ///< selector; "" = every device the suite can use
    bool quick = false;      ///< fewer iterations (CI smoke runs)
};

using BenchRows = std::vector<BenchRow>;

/// Suites, each in its own file; a suite whose backend is absent returns no rows and prints why.
void benchEngine(const BenchOptions &options, BenchRows &rows); ///< bench_engine.cpp
void benchVulkan(const BenchOptions &options, BenchRows &rows); ///< bench_vulkan.cpp
void benchCuda(const BenchOptions &options, BenchRows &rows);   ///< bench_cuda.cpp
void benchTune(const BenchOptions &options, BenchRows &rows);   ///< bench_tune.cpp
void benchStartup(const BenchOptions &options, BenchRows &rows); ///< bench_startup.cpp
void benchMultidevice(const BenchOptions &options, BenchRows &rows); ///< bench_multidevice.cpp
void benchKernels(const BenchOptions &options, BenchRows &rows); ///< bench_kernels.cpp

/// A fresh temporary directory ("<tmp>/<prefix>-XXXXXX", e.g. a tuner or kernel cache for one
/// bench suite), removed at scope exit. `path` is empty when none could be made.
struct TempDir {
    std::filesystem::path path;
    explicit TempDir(const std::string &prefix) {
        std::string pattern =
            (std::filesystem::temp_directory_path() / (prefix + "-XXXXXX")).string();
        if (::mkdtemp(pattern.data()) != nullptr) path = pattern;
    }
    ~TempDir() {
        std::error_code ec;
        if (!path.empty()) std::filesystem::remove_all(path, ec);
    }
    TempDir(const TempDir &) = delete;
    TempDir &operator=(const TempDir &) = delete;
};

} // namespace backplane::tool
