// Benchmark suites of `backplane bench`: each compares the runtime with the raw API, same run.
#pragma once

#include <backplane/raw_plugin.hpp>
#include <backplane/runtime.hpp>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <functional>
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
/// The staging sweep: pageable write and read through every combination of chunk size, ring
/// depth, copy threads and streaming stores, against the plugin's pinned copy
/// (bench_transfers.cpp).
void benchTransfers(const BenchOptions &options, BenchRows &rows);

/// The plugin that gives `info`, opened again as `runtime` starts it (its plugins.options object,
/// its pipeline cache directory), for a raw side that runs like the runtime (bench_engine.cpp).
RawPlugin openRawPlugin(const Runtime &runtime, const DeviceInfo &info);

// A probe in a fresh process (cmd_bench.cpp) ------------------------------------------------------

/// What a child run by runBenchChild wrote, or why there is nothing.
struct ChildAnswer {
    std::string text;  ///< everything the child wrote to its answer pipe
    std::string why;   ///< "" when the child ran; else why it could not be started
    int exitStatus = -1;
};
/// Runs this binary again as `backplane bench SUITE` (stdout to /dev/null) with `variables`
/// ("NAME=value") added to the environment, entries starting with `dropPrefix` removed, and
/// `fdVariable` naming the write end of a pipe; returns what the child wrote there. For rows
/// that need a new process (a kernel loaded from the disk cache without compiling).
ChildAnswer runBenchChild(const std::string &suite, const std::string &fdVariable,
                          std::vector<std::string> variables, const std::string &dropPrefix);

// Transfer rows, shared by the engine and cuda suites (bench_transfers.cpp) ----------------------

/// The sizes every transfer row is measured at: 4 KiB, 64 KiB, 1 MiB and 256 MiB (16 MiB with
/// --quick), the largest capped at `largestCap` bytes when that is not 0.
std::vector<uint64_t> transferSizes(bool quick, uint64_t largestCap = 0);
/// "4 KiB", "1 MiB", "256 MiB".
std::string sizeText(uint64_t bytes);
/// Seconds one call of `transfer` (moving `bytes`) takes: one warm-up call, then the median of
/// three batches, each of enough calls to move about 64 MiB (8 MiB with `quick`), at most 2000.
double secondsPerTransfer(uint64_t bytes, bool quick, const std::function<void()> &transfer);
/// Times of one transfer of one size and direction through the runtime and two raw paths.
struct TransferTimes {
    std::string direction; ///< "write" (host -> device) or "read" (device -> host, readInto)
    uint64_t bytes = 0;
    double runtime = 0;  ///< seconds: pageable memory through the runtime's staging
    double pageable = 0; ///< seconds: the raw path's copy from / into the same pageable memory
    double pinned = 0;   ///< seconds: the raw path's copy from / into pinned memory
};
/// Two rows for `t`: the runtime against the raw pageable path (target: never slower) and against
/// the raw pinned copy (target >= 0.85x at the largest size). Up to 1 MiB in microseconds per
/// transfer, larger sizes in GB/s. `pageableName` / `pinnedName` say what the raw side ran.
void addTransferRows(BenchRows &rows, const std::string &suite, const std::string &device,
                     const TransferTimes &t, const std::string &pageableName,
                     const std::string &pinnedName);

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
