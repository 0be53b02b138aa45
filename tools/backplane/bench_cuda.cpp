// `backplane bench cuda`: ComputeClient on a CUDA device against the raw CUDA driver API, same run.
//
// The "runtime" side goes through the public API (Runtime::open, ComputeClient). The raw side
// dlopens libcuda.so.1 and NVRTC itself (the tool links neither, so it runs anywhere) and drives
// the same device through its primary context, which is the context the plugin uses too. Kernels
// for both sides come from the same NVRTC with the same --gpu-architecture, so the CUBINs match.
//
// The cache row needs a second process: the suite re-executes this binary as
// `backplane bench cuda` with BACKPLANE_BENCH_CUDA_PROBE_FD set; benchCuda() then only opens the
// device, times one prepare() from the on-disk cache, writes the figures to that pipe and exits.
#include "bench.hpp"

#include <backplane/client.hpp>
#include <backplane/config.hpp>
#include <backplane/error.hpp>
#include <backplane/kernel.hpp>
#include <backplane/runtime.hpp>

#include <cuda.h>
#include <nvrtc.h>

#include <dlfcn.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

extern char **environ;

namespace backplane::tool {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

/// Environment of the cache probe child: the pipe to answer on, the cache dir, the device id.
constexpr const char *kProbeFdVariable = "BACKPLANE_BENCH_CUDA_PROBE_FD";
constexpr const char *kProbeCacheVariable = "BACKPLANE_BENCH_CUDA_PROBE_CACHE";
constexpr const char *kProbeDeviceVariable = "BACKPLANE_BENCH_CUDA_PROBE_DEVICE";

double secondsSince(Clock::time_point start) {
    return std::chrono::duration<double>(Clock::now() - start).count();
}

/// Median of `repeats` runs of `body`, in seconds per run.
double median(int repeats, const std::function<void()> &body) {
    std::vector<double> times;
    for (int i = 0; i < repeats; ++i) {
        const auto start = Clock::now();
        body();
        times.push_back(secondsSince(start));
    }
    std::sort(times.begin(), times.end());
    const size_t n = times.size();
    return n % 2 == 1 ? times[n / 2] : (times[n / 2 - 1] + times[n / 2]) / 2;
}

/// Runs `action` at scope exit (frees raw vendor objects on every path).
template <class Action> class ScopeExit {
public:
    explicit ScopeExit(Action action) : action_(std::move(action)) {}
    ~ScopeExit() { action_(); }
    ScopeExit(const ScopeExit &) = delete;
    ScopeExit &operator=(const ScopeExit &) = delete;

private:
    Action action_;
};

// Kernels. Launch convention of the plugin (docs/cuda.md): one device pointer per binding, then
// one by-value struct holding the scalar bytes.
const char *const kEmptySource = "extern \"C\" __global__ void empty() {}\n";

const char *const kTouchSource = R"(struct Params { unsigned n; };
extern "C" __global__ void touch(unsigned *x, Params p) {
    const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < p.n && x[i] == 0xffffffffu) x[i] = 0u;
}
)";

// The kernel of the compile rows: small, but more than an empty body.
const char *const kSaxpySource = R"(struct Params { float a; unsigned n; };
extern "C" __global__ void saxpy(const float *x, float *y, Params p) {
    const unsigned stride = gridDim.x * blockDim.x;
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < p.n; i += stride)
        y[i] = p.a * x[i] + y[i];
}
)";

struct TouchParams {
    unsigned n;
};

KernelSource cudaKernel(const char *name, const char *source,
                        std::vector<std::string> compileOptions = {}) {
    return {name, {KernelVariant::text(Dialect::Cuda, name, source, std::move(compileOptions))}};
}

// ------------------------------------------------------------------------------------------------
// The raw side

// Driver entry points. cuda.h maps several names onto versioned symbols (cuMemAlloc ->
// cuMemAlloc_v2); BENCH_STRING expands the macro before stringifying, so dlsym looks up the
// versioned symbol, as the plugin does.
#define BENCH_CU_FUNCTIONS(X)                                                                      \
    X(cuInit)                                                                                      \
    X(cuGetErrorName)                                                                              \
    X(cuDeviceGet)                                                                                 \
    X(cuDevicePrimaryCtxRetain)                                                                    \
    X(cuDevicePrimaryCtxRelease)                                                                   \
    X(cuCtxSetCurrent)                                                                             \
    X(cuCtxSynchronize)                                                                            \
    X(cuModuleLoadData)                                                                            \
    X(cuModuleUnload)                                                                              \
    X(cuModuleGetFunction)                                                                         \
    X(cuLaunchKernel)                                                                              \
    X(cuStreamCreate)                                                                              \
    X(cuStreamDestroy)                                                                             \
    X(cuStreamSynchronize)                                                                         \
    X(cuEventCreate)                                                                               \
    X(cuEventDestroy)                                                                              \
    X(cuEventRecord)                                                                               \
    X(cuStreamWaitEvent)                                                                           \
    X(cuMemAlloc)                                                                                  \
    X(cuMemFree)                                                                                   \
    X(cuMemAllocAsync)                                                                             \
    X(cuMemFreeAsync)                                                                              \
    X(cuMemcpyHtoD)                                                                                \
    X(cuMemcpyDtoH)                                                                                \
    X(cuMemcpyDtoD)                                                                                \
    X(cuMemHostAlloc)                                                                              \
    X(cuMemFreeHost)                                                                               \
    X(cuMemcpyHtoDAsync)                                                                           \
    X(cuMemcpyDtoHAsync)                                                                           \
    X(cuMemHostRegister)                                                                           \
    X(cuMemHostUnregister)

#define BENCH_NVRTC_FUNCTIONS(X)                                                                   \
    X(nvrtcCreateProgram)                                                                          \
    X(nvrtcDestroyProgram)                                                                         \
    X(nvrtcCompileProgram)                                                                         \
    X(nvrtcGetProgramLogSize)                                                                      \
    X(nvrtcGetProgramLog)                                                                          \
    X(nvrtcGetCUBINSize)                                                                           \
    X(nvrtcGetCUBIN)                                                                               \
    X(nvrtcGetErrorString)

// Graphs, for the recorded-sequence rows (loaded like the functions above).
#define BENCH_CU_GRAPH_FUNCTIONS(X)                                                                \
    X(cuStreamBeginCapture)                                                                        \
    X(cuStreamEndCapture)                                                                          \
    X(cuGraphInstantiate)                                                                          \
    X(cuGraphLaunch)                                                                               \
    X(cuGraphExecDestroy)                                                                          \
    X(cuGraphDestroy)

#define BENCH_STRING_(x) #x
#define BENCH_STRING(x) BENCH_STRING_(x)
#define BENCH_DECLARE(name) decltype(&::name) name = nullptr;

/// The driver library, opened once and never closed (it starts threads).
void *openDriver(std::string &why) {
    void *library = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (library == nullptr) {
        const char *error = ::dlerror();
        why = error != nullptr ? error : "libcuda.so.1 not found";
    }
    return library;
}

/// The raw CUDA driver and NVRTC, bound to one device's primary context.
struct RawCuda {
    BENCH_CU_FUNCTIONS(BENCH_DECLARE)
    BENCH_CU_GRAPH_FUNCTIONS(BENCH_DECLARE)
    BENCH_NVRTC_FUNCTIONS(BENCH_DECLARE)
    CUdevice device = 0;
    CUcontext context = nullptr;

    RawCuda(void *driver, int ordinal) {
#define BENCH_LOAD(name)                                                                           \
    name = reinterpret_cast<decltype(name)>(symbol(library, BENCH_STRING(name)));
        void *library = driver;
        BENCH_CU_FUNCTIONS(BENCH_LOAD)
        BENCH_CU_GRAPH_FUNCTIONS(BENCH_LOAD)
        void *rtc = nullptr;
        std::string tried;
        for (const char *candidate : {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"}) {
            rtc = ::dlopen(candidate, RTLD_NOW | RTLD_LOCAL);
            if (rtc != nullptr) break;
            const char *error = ::dlerror();
            tried += std::string(tried.empty() ? "" : "; ") + (error != nullptr ? error : "");
        }
        if (rtc == nullptr) throw std::runtime_error("NVRTC not found (" + tried + ")");
        library = rtc;
        BENCH_NVRTC_FUNCTIONS(BENCH_LOAD)
#undef BENCH_LOAD
        check(cuInit(0), "cuInit");
        check(cuDeviceGet(&device, ordinal), "cuDeviceGet");
        check(cuDevicePrimaryCtxRetain(&context, device), "cuDevicePrimaryCtxRetain");
        check(cuCtxSetCurrent(context), "cuCtxSetCurrent");
    }
    ~RawCuda() {
        if (context != nullptr) cuDevicePrimaryCtxRelease(device);
    }
    RawCuda(const RawCuda &) = delete;
    RawCuda &operator=(const RawCuda &) = delete;

    static void *symbol(void *library, const char *name) {
        void *address = ::dlsym(library, name);
        if (address == nullptr)
            throw std::runtime_error(std::string("symbol ") + name + " missing");
        return address;
    }

    void check(CUresult result, const char *call) const {
        if (result == CUDA_SUCCESS) return;
        const char *name = nullptr;
        if (cuGetErrorName != nullptr) cuGetErrorName(result, &name);
        throw std::runtime_error(std::string(call) +
                                 " failed: " + (name != nullptr ? name : std::to_string(result)));
    }

    /// Compiles `source` to a CUBIN for `arch` ("sm_90") the way the plugin does.
    std::vector<char> compile(const char *source, const char *name, const std::string &arch,
                              const std::vector<std::string> &extraOptions = {}) const {
        nvrtcProgram program = nullptr;
        if (nvrtcCreateProgram(&program, source, name, 0, nullptr, nullptr) != NVRTC_SUCCESS)
            throw std::runtime_error(std::string("nvrtcCreateProgram failed for ") + name);
        ScopeExit destroy([&] { nvrtcDestroyProgram(&program); });
        std::vector<std::string> options{"--gpu-architecture=" + arch};
        options.insert(options.end(), extraOptions.begin(), extraOptions.end());
        std::vector<const char *> argv;
        for (const auto &o : options)
            argv.push_back(o.c_str());
        const nvrtcResult compiled =
            nvrtcCompileProgram(program, static_cast<int>(argv.size()), argv.data());
        if (compiled != NVRTC_SUCCESS) {
            size_t size = 0;
            nvrtcGetProgramLogSize(program, &size);
            std::string log(size, '\0');
            nvrtcGetProgramLog(program, log.data());
            throw std::runtime_error(std::string("NVRTC failed on ") + name + ": " +
                                     nvrtcGetErrorString(compiled) + "\n" + log);
        }
        size_t size = 0;
        nvrtcGetCUBINSize(program, &size);
        std::vector<char> cubin(size);
        nvrtcGetCUBIN(program, cubin.data());
        return cubin;
    }

    /// A loaded kernel (the module stays loaded for the process; the suite loads a handful).
    CUfunction load(const std::vector<char> &cubin, const char *name) const {
        CUmodule module = nullptr;
        check(cuModuleLoadData(&module, cubin.data()), "cuModuleLoadData");
        CUfunction function = nullptr;
        check(cuModuleGetFunction(&function, module, name), "cuModuleGetFunction");
        return function;
    }

    CUstream stream() const {
        CUstream s = nullptr;
        check(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
        return s;
    }
};

// ------------------------------------------------------------------------------------------------
// The cache probe child

/// In the child: open the device, time the first prepare() of the saxpy kernel from the on-disk
/// cache, write "seconds compiled diskHits" to the pipe and exit without returning.
[[noreturn]] void runCacheProbe(const char *fdText) {
    const int fd = std::atoi(fdText);
    int status = 1;
    try {
        Config config = loadConfig();
        config.cacheDir = std::getenv(kProbeCacheVariable);
        config.cacheEnabled = true;
        Runtime runtime(config);
        const char *device = std::getenv(kProbeDeviceVariable);
        ComputeClient client = runtime.open(runtime.select(device != nullptr ? device : "cuda:0"));
        const KernelSource saxpy = cudaKernel("saxpy", kSaxpySource, {"-DBENCH_VARIANT=0"});
        const auto start = Clock::now();
        client.prepare(saxpy);
        const double seconds = secondsSince(start);
        const EngineStats stats = client.stats();
        char line[128];
        const int n = std::snprintf(line, sizeof line, "%.9f %llu %llu\n", seconds,
                                    static_cast<unsigned long long>(stats.kernelsCompiled),
                                    static_cast<unsigned long long>(stats.diskCacheHits));
        if (n > 0 && ::write(fd, line, static_cast<size_t>(n)) == n) status = 0;
    } catch (const std::exception &e) {
        std::fprintf(stderr, "cuda cache probe: %s\n", e.what());
    }
    std::fflush(stderr);
    ::_exit(status);
}

/// What the probe child measured.
struct ProbeResult {
    bool ok = false;
    double seconds = 0;
    unsigned long long compiled = 0;
    unsigned long long diskHits = 0;
    std::string why; ///< when !ok
};

/// Re-executes this binary as `backplane bench cuda` in probe mode and reads its answer.
ProbeResult spawnCacheProbe(const fs::path &cacheDir, const std::string &device) {
    ProbeResult result;
    const ChildAnswer child = runBenchChild(
        "cuda", kProbeFdVariable,
        {std::string(kProbeCacheVariable) + "=" + cacheDir.string(),
         std::string(kProbeDeviceVariable) + "=" + device},
        "BACKPLANE_BENCH_CUDA_PROBE_");
    if (!child.why.empty()) {
        result.why = child.why;
        return result;
    }
    if (std::sscanf(child.text.c_str(), "%lf %llu %llu", &result.seconds, &result.compiled,
                    &result.diskHits) == 3) {
        result.ok = true;
    } else {
        result.why = "the probe child (`backplane bench cuda`) gave no answer, exit status " +
                     std::to_string(child.exitStatus);
    }
    return result;
}

// ------------------------------------------------------------------------------------------------
// The suite

struct Counts {
    int repeats;
    int launches;    ///< back-to-back launches per repetition
    int roundTrips;  ///< launch + sync per repetition
    int allocations; ///< allocate + free pairs per repetition
    int crossStream; ///< cross-stream iterations per repetition
    int transfers;   ///< repetitions of the 256 MiB / 1 GiB copies
    int compiles;    ///< cold compiles (distinct -D variants)
};

void run(void *driver, const BenchOptions &options, BenchRows &rows) {
    const Counts counts = options.quick ? Counts{3, 1000, 200, 1000, 200, 3, 2}
                                        : Counts{7, 10000, 2000, 10000, 2000, 5, 3};
    TempDir cache("bp-bench-cuda");
    if (cache.path.empty()) throw std::runtime_error("cannot create a temporary cache directory");
    Config config = loadConfig();
    config.cacheDir = cache.path;
    config.cacheEnabled = true;
    Runtime runtime(config);
    const std::string selector = options.device.empty() ? "cuda:0" : options.device;
    Selection selection;
    try {
        selection = runtime.select(selector);
    } catch (const Error &e) {
        std::fprintf(stderr, "cuda: skipped (%s)\n", e.what());
        return;
    }
    if (selection.device.backend != "cuda") {
        std::fprintf(stderr, "cuda: skipped (%s selects %s, not a CUDA device)\n", selector.c_str(),
                     selection.device.id().c_str());
        return;
    }
    ComputeClient client = runtime.open(selection);
    RawCuda raw(driver, static_cast<int>(selection.device.index));
    const std::string arch = selection.device.arch;
    const std::string device = selection.device.id() + " " + selection.device.name;
    auto row = [&](const std::string &what, double runtimeValue, double rawValue, const char *unit,
                   const char *target) {
        rows.push_back({"cuda", device, what, runtimeValue, rawValue, unit, target});
    };
    CUstream rawStream = raw.stream();
    CUstream rawOther = raw.stream();
    ScopeExit destroyStreams([&] {
        raw.cuStreamDestroy(rawStream);
        raw.cuStreamDestroy(rawOther);
    });
    // Every runtime row runs on explicit streams; kStreamA/B are distinct backend slots.
    constexpr StreamId kStreamA = 1, kStreamB = 2, kStreamC = 3, kStreamD = 4;
    StreamGuard onA(kStreamA);

    const KernelSource empty = cudaKernel("empty", kEmptySource);
    const KernelSource touch = cudaKernel("touch", kTouchSource);
    const CUfunction rawEmpty = raw.load(raw.compile(kEmptySource, "empty", arch), "empty");
    const CUfunction rawTouch = raw.load(raw.compile(kTouchSource, "touch", arch), "touch");
    constexpr unsigned kTouchThreads = 256;

    // 1-2. Launch: back to back, and round trip.
    {
        const Buffer x = client.empty(kTouchThreads * 4);
        client.fill(x, 0);
        Dispatch emptyDispatch;
        emptyDispatch.block = {32, 1, 1};
        Dispatch touchDispatch;
        touchDispatch.block = {kTouchThreads, 1, 1};
        touchDispatch.bindings = {x};
        touchDispatch.scalar(kTouchThreads);
        CUdeviceptr rawX = 0;
        raw.check(raw.cuMemAlloc(&rawX, kTouchThreads * 4), "cuMemAlloc");
        ScopeExit freeX([&] { raw.cuMemFree(rawX); });
        raw.check(raw.cuMemcpyHtoD(rawX, std::vector<unsigned>(kTouchThreads, 0).data(),
                                   kTouchThreads * 4),
                  "cuMemcpyHtoD");
        TouchParams params{kTouchThreads};
        void *touchParams[] = {&rawX, &params};
        auto launchEmpty = [&] {
            raw.check(
                raw.cuLaunchKernel(rawEmpty, 1, 1, 1, 32, 1, 1, 0, rawStream, nullptr, nullptr),
                "cuLaunchKernel");
        };
        auto launchTouch = [&] {
            raw.check(raw.cuLaunchKernel(rawTouch, 1, 1, 1, kTouchThreads, 1, 1, 0, rawStream,
                                         touchParams, nullptr),
                      "cuLaunchKernel");
        };
        auto rawSync = [&] {
            raw.check(raw.cuStreamSynchronize(rawStream), "cuStreamSynchronize");
        };

        auto backToBack = [&](const std::function<void()> &launch,
                              const std::function<void()> &sync) {
            for (int i = 0; i < 100; ++i)
                launch(); // warm up (the first runtime one compiles)
            sync();
            return median(counts.repeats,
                          [&] {
                              for (int i = 0; i < counts.launches; ++i)
                                  launch();
                              sync();
                          }) /
                   counts.launches;
        };
        auto roundTrip = [&](const std::function<void()> &launch,
                             const std::function<void()> &sync) {
            return median(counts.repeats,
                          [&] {
                              for (int i = 0; i < counts.roundTrips; ++i) {
                                  launch();
                                  sync();
                              }
                          }) /
                   counts.roundTrips;
        };
        auto runtimeEmpty = [&] { client.execute(empty, emptyDispatch); };
        auto runtimeTouch = [&] { client.execute(touch, touchDispatch); };
        auto runtimeSync = [&] { client.sync(); };

        const double runtimeEmptyTime = backToBack(runtimeEmpty, runtimeSync);
        const double rawEmptyTime = backToBack(launchEmpty, rawSync);
        const double runtimeTouchTime = backToBack(runtimeTouch, runtimeSync);
        const double rawTouchTime = backToBack(launchTouch, rawSync);
        const double runtimeTrip = roundTrip(runtimeEmpty, runtimeSync);
        const double rawTrip = roundTrip(launchEmpty, rawSync);
        row("launch, empty kernel, back to back, per launch: execute vs cuLaunchKernel",
            runtimeEmptyTime * 1e6, rawEmptyTime * 1e6, "us", "<= 1.10x");
        row("launch, 1 binding + scalar struct, back to back, per launch: execute vs "
            "cuLaunchKernel",
            runtimeTouchTime * 1e6, rawTouchTime * 1e6, "us", "<= 1.10x");
        row("launch + sync round trip, empty kernel: execute+sync vs "
            "cuLaunchKernel+cuStreamSynchronize",
            runtimeTrip * 1e6, rawTrip * 1e6, "us", "");
    }

    // Recorded sequences: 100 small kernels (1 binding + scalar struct) recorded once and
    // replayed, against the same launches back to back and against a raw CUDA graph of them.
    {
        constexpr int kKernels = 100;
        const int replays = std::max(10, counts.launches / kKernels);
        const Buffer x = client.empty(kTouchThreads * 4);
        client.fill(x, 0);
        Dispatch touchDispatch;
        touchDispatch.block = {kTouchThreads, 1, 1};
        touchDispatch.bindings = {x};
        touchDispatch.scalar(kTouchThreads);
        client.execute(touch, touchDispatch); // compiled before the recording
        client.beginRecording();
        for (int i = 0; i < kKernels; ++i)
            client.execute(touch, touchDispatch);
        const Recording recording = client.endRecording();
        CUdeviceptr rawX = 0;
        raw.check(raw.cuMemAlloc(&rawX, kTouchThreads * 4), "cuMemAlloc");
        ScopeExit freeX([&] { raw.cuMemFree(rawX); });
        TouchParams params{kTouchThreads};
        void *touchParams[] = {&rawX, &params};
        auto launchTouch = [&] {
            raw.check(raw.cuLaunchKernel(rawTouch, 1, 1, 1, kTouchThreads, 1, 1, 0, rawStream,
                                         touchParams, nullptr),
                      "cuLaunchKernel");
        };
        CUgraph graph = nullptr;
        raw.check(raw.cuStreamBeginCapture(rawStream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
                  "cuStreamBeginCapture");
        for (int i = 0; i < kKernels; ++i)
            launchTouch();
        raw.check(raw.cuStreamEndCapture(rawStream, &graph), "cuStreamEndCapture");
        CUgraphExec exec = nullptr;
        raw.check(raw.cuGraphInstantiate(&exec, graph, 0), "cuGraphInstantiate");
        ScopeExit destroyGraph([&] {
            raw.cuGraphExecDestroy(exec);
            raw.cuGraphDestroy(graph);
        });
        auto perKernel = [&](const std::function<void()> &once, const std::function<void()> &sync) {
            once();
            sync();
            return median(counts.repeats,
                          [&] {
                              for (int i = 0; i < replays; ++i)
                                  once();
                              sync();
                          }) /
                   (replays * kKernels);
        };
        auto rawSync = [&] {
            raw.check(raw.cuStreamSynchronize(rawStream), "cuStreamSynchronize");
        };
        const double replayTime =
            perKernel([&] { client.replay(recording); }, [&] { client.sync(); });
        const double launchTime = perKernel(
            [&] {
                for (int i = 0; i < kKernels; ++i)
                    launchTouch();
            },
            rawSync);
        const double graphTime = perKernel(
            [&] { raw.check(raw.cuGraphLaunch(exec, rawStream), "cuGraphLaunch"); }, rawSync);
        std::fprintf(stderr, "cuda: recording replays as: %s\n", recording.replayNote().c_str());
        row("100 small kernels replayed from a recording, per kernel: replay vs cuLaunchKernel "
            "back to back",
            replayTime * 1e6, launchTime * 1e6, "us", "<= 0.50x");
        row("100 small kernels replayed from a recording, per kernel: replay vs a raw CUDA graph "
            "(cuGraphLaunch)",
            replayTime * 1e6, graphTime * 1e6, "us", "");
    }

    // 3. Allocate + free of 1 MiB.
    {
        constexpr uint64_t kSize = 1ull << 20;
        auto runtimeCycle = [&] {
            for (int i = 0; i < counts.allocations; ++i) {
                const Buffer b = client.empty(kSize);
            }
            client.sync();
        };
        auto rawCycle = [&] {
            for (int i = 0; i < counts.allocations; ++i) {
                CUdeviceptr p = 0;
                raw.check(raw.cuMemAllocAsync(&p, kSize, rawStream), "cuMemAllocAsync");
                raw.check(raw.cuMemFreeAsync(p, rawStream), "cuMemFreeAsync");
            }
            raw.check(raw.cuStreamSynchronize(rawStream), "cuStreamSynchronize");
        };
        const int blocking = std::max(10, counts.allocations / 50);
        auto rawBlockingCycle = [&] {
            for (int i = 0; i < blocking; ++i) {
                CUdeviceptr p = 0;
                raw.check(raw.cuMemAlloc(&p, kSize), "cuMemAlloc");
                raw.check(raw.cuMemFree(p), "cuMemFree");
            }
        };
        runtimeCycle();
        rawCycle();
        rawBlockingCycle();
        const double runtimeTime = median(counts.repeats, runtimeCycle) / counts.allocations;
        const double rawTime = median(counts.repeats, rawCycle) / counts.allocations;
        const double blockingTime = median(counts.repeats, rawBlockingCycle) / blocking;
        row("allocate + free 1 MiB: client.empty + drop (pooled) vs cuMemAllocAsync + "
            "cuMemFreeAsync",
            runtimeTime * 1e6, rawTime * 1e6, "us", "<= 0.10x (10x faster)");
        row("allocate + free 1 MiB: client.empty + drop (pooled) vs cuMemAlloc + cuMemFree",
            runtimeTime * 1e6, blockingTime * 1e6, "us", "");
        client.memoryCleanup();
    }

    // 4. Host memory <-> device at every size: pageable memory through the runtime's staging
    // against the driver's own pageable copy (cuMemcpyHtoD / cuMemcpyDtoH) and its pinned copy;
    // then the same memory registered (registerHost) against the pinned copy, and the cost of
    // one registration against the time it saves per transfer.
    {
        const std::vector<uint64_t> sizes = transferSizes(options.quick);
        const uint64_t largest = sizes.back();
        const double gigabytes = static_cast<double>(largest) / 1e9;
        std::vector<unsigned char> host(largest);
        for (uint64_t i = 0; i < largest; ++i)
            host[i] = static_cast<unsigned char>(i * 7);
        std::vector<unsigned char> into(largest);
        std::vector<TransferTimes> times;
        double registeredWrite = 0, registeredRead = 0, registerSeconds = 0;
        {
            const Buffer buffer = client.empty(largest);
            client.write(buffer, 0, host.data(), largest);
            const std::vector<std::byte> back = client.read(buffer).wait();
            if (back.size() != largest || std::memcmp(back.data(), host.data(), largest) != 0)
                throw std::runtime_error("pageable write/read round trip returned other bytes");
            for (const uint64_t bytes : sizes) {
                for (const char *direction : {"write", "read"}) {
                    TransferTimes t;
                    t.direction = direction;
                    t.bytes = bytes;
                    if (t.direction == "write")
                        t.runtime = secondsPerTransfer(bytes, options.quick, [&] {
                            client.write(buffer, 0, host.data(), bytes);
                            client.sync();
                        });
                    else
                        t.runtime = secondsPerTransfer(bytes, options.quick, [&] {
                            client.readInto(buffer, 0, into.data(), bytes);
                        });
                    times.push_back(t);
                }
            }
            {
                const PinnedBuffer registered = client.registerHost(host.data(), largest);
                registeredWrite = secondsPerTransfer(largest, options.quick, [&] {
                    client.write(buffer, 0, registered, largest);
                    client.sync();
                });
                registeredRead = secondsPerTransfer(largest, options.quick, [&] {
                    client.readInto(buffer, 0, registered, largest);
                });
            }
            client.memoryCleanup(); // every hold of the registration is gone: it is unregistered
            registerSeconds = median(counts.transfers, [&] {
                const PinnedBuffer once = client.registerHost(host.data(), largest);
            });
        }
        client.memoryCleanup();

        CUdeviceptr memory = 0;
        raw.check(raw.cuMemAlloc(&memory, largest), "cuMemAlloc");
        ScopeExit freeMemory([&] { raw.cuMemFree(memory); });
        void *pinned = nullptr;
        raw.check(raw.cuMemHostAlloc(&pinned, largest, 0), "cuMemHostAlloc");
        ScopeExit freePinned([&] { raw.cuMemFreeHost(pinned); });
        std::memcpy(pinned, host.data(), largest);
        for (TransferTimes &t : times) {
            const uint64_t bytes = t.bytes;
            if (t.direction == "write") {
                // A pageable cuMemcpyHtoD may return before the DMA landed: the context sync
                // ends it.
                t.pageable = secondsPerTransfer(bytes, options.quick, [&] {
                    raw.check(raw.cuMemcpyHtoD(memory, host.data(), bytes), "cuMemcpyHtoD");
                    raw.check(raw.cuCtxSynchronize(), "cuCtxSynchronize");
                });
                t.pinned = secondsPerTransfer(bytes, options.quick, [&] {
                    raw.check(raw.cuMemcpyHtoDAsync(memory, pinned, bytes, rawStream),
                              "cuMemcpyHtoDAsync");
                    raw.check(raw.cuStreamSynchronize(rawStream), "cuStreamSynchronize");
                });
                addTransferRows(rows, "cuda", device, t, "raw pageable cuMemcpyHtoD",
                                "raw pinned cuMemcpyHtoDAsync");
            } else {
                t.pageable = secondsPerTransfer(bytes, options.quick, [&] {
                    raw.check(raw.cuMemcpyDtoH(into.data(), memory, bytes), "cuMemcpyDtoH");
                });
                t.pinned = secondsPerTransfer(bytes, options.quick, [&] {
                    raw.check(raw.cuMemcpyDtoHAsync(pinned, memory, bytes, rawStream),
                              "cuMemcpyDtoHAsync");
                    raw.check(raw.cuStreamSynchronize(rawStream), "cuStreamSynchronize");
                });
                addTransferRows(rows, "cuda", device, t, "raw pageable cuMemcpyDtoH",
                                "raw pinned cuMemcpyDtoHAsync");
            }
        }
        const double rawRegisterSeconds = median(counts.transfers, [&] {
            raw.check(raw.cuMemHostRegister(host.data(), largest,
                                            CU_MEMHOSTREGISTER_PORTABLE |
                                                CU_MEMHOSTREGISTER_DEVICEMAP),
                      "cuMemHostRegister");
            raw.check(raw.cuMemHostUnregister(host.data()), "cuMemHostUnregister");
        });
        const TransferTimes &stagedWrite = times[times.size() - 2]; // the largest write
        const std::string size = sizeText(largest);
        row("host->device " + size + " registered (registerHost) vs raw pinned cuMemcpyHtoDAsync",
            gigabytes / registeredWrite, gigabytes / stagedWrite.pinned, "GB/s", ">= 0.95x");
        row("device->host " + size + " registered (registerHost) vs raw pinned cuMemcpyDtoHAsync",
            gigabytes / registeredRead, gigabytes / times.back().pinned, "GB/s", ">= 0.95x");
        row("registerHost + release " + size + " vs cuMemHostRegister + cuMemHostUnregister",
            registerSeconds * 1e3, rawRegisterSeconds * 1e3, "ms", "");
        // The ratio is the number of writes of this size after which registering paid for itself.
        row("registerHost + release " + size +
                " vs time a registered write saves over a staged one (ratio = writes to break "
                "even)",
            registerSeconds * 1e3, (stagedWrite.runtime - registeredWrite) * 1e3, "ms", "");
    }

    // 5. Device-to-device copy of 1 GiB, bytes read + written.
    {
        constexpr uint64_t kSize = 1ull << 30;
        if (selection.device.maxAllocationBytes != 0 &&
            selection.device.maxAllocationBytes < kSize) {
            std::fprintf(stderr, "cuda: device cannot allocate 1 GiB; copy row skipped\n");
        } else {
            double runtimeCopy = 0;
            {
                const Buffer src = client.empty(kSize);
                const Buffer dst = client.empty(kSize);
                client.fill(src, 0x01020304);
                auto copy = [&] {
                    client.copy(src, 0, dst, 0, kSize);
                    client.sync();
                };
                copy();
                runtimeCopy = median(counts.transfers, copy);
            }
            client.memoryCleanup();
            CUdeviceptr src = 0, dst = 0;
            raw.check(raw.cuMemAlloc(&src, kSize), "cuMemAlloc");
            ScopeExit freeSrc([&] { raw.cuMemFree(src); });
            raw.check(raw.cuMemAlloc(&dst, kSize), "cuMemAlloc");
            ScopeExit freeDst([&] { raw.cuMemFree(dst); });
            // cuMemcpyDtoD does not block the host: the context sync ends the copy.
            auto copy = [&] {
                raw.check(raw.cuMemcpyDtoD(dst, src, kSize), "cuMemcpyDtoD");
                raw.check(raw.cuCtxSynchronize(), "cuCtxSynchronize");
            };
            copy();
            const double rawCopy = median(counts.transfers, copy);
            const double bytes = 2.0 * static_cast<double>(kSize) / 1e9;
            row("device->device copy 1 GiB, read+written GB/s: client.copy+sync vs cuMemcpyDtoD",
                bytes / runtimeCopy, bytes / rawCopy, "GB/s", ">= 0.97x");
        }
    }

    // 6. Cross-stream dependency: write on A, a kernel reading it on B, every iteration; the
    // next write on A must wait for B's read, so both directions align, as the raw side does.
    {
        constexpr uint64_t kSize = kTouchThreads * 4;
        const Buffer x = client.empty(kSize);
        const PinnedBuffer pinned = client.allocatePinned(kSize);
        std::memset(pinned.data(), 0, kSize);
        Dispatch dispatch;
        dispatch.block = {kTouchThreads, 1, 1};
        dispatch.bindings = {x};
        dispatch.scalar(kTouchThreads);
        auto runtimeIteration = [&] {
            {
                StreamGuard a(kStreamA);
                client.write(x, 0, pinned, kSize);
            }
            StreamGuard b(kStreamB);
            client.execute(touch, dispatch);
        };
        auto runtimeLoop = [&] {
            for (int i = 0; i < counts.crossStream; ++i)
                runtimeIteration();
            client.syncAll();
        };
        const EngineStats before = client.stats();
        runtimeLoop();
        const EngineStats after = client.stats();
        const double runtimeTime = median(counts.repeats, runtimeLoop) / counts.crossStream;

        CUdeviceptr rawX = 0;
        raw.check(raw.cuMemAlloc(&rawX, kSize), "cuMemAlloc");
        ScopeExit freeX([&] { raw.cuMemFree(rawX); });
        void *rawPinned = nullptr;
        raw.check(raw.cuMemHostAlloc(&rawPinned, kSize, 0), "cuMemHostAlloc");
        ScopeExit freePinned([&] { raw.cuMemFreeHost(rawPinned); });
        std::memset(rawPinned, 0, kSize);
        CUevent written = nullptr, consumed = nullptr;
        raw.check(raw.cuEventCreate(&written, CU_EVENT_DISABLE_TIMING), "cuEventCreate");
        raw.check(raw.cuEventCreate(&consumed, CU_EVENT_DISABLE_TIMING), "cuEventCreate");
        ScopeExit destroyEvents([&] {
            raw.cuEventDestroy(written);
            raw.cuEventDestroy(consumed);
        });
        TouchParams params{kTouchThreads};
        void *touchParams[] = {&rawX, &params};
        auto rawLoop = [&] {
            for (int i = 0; i < counts.crossStream; ++i) {
                raw.check(raw.cuStreamWaitEvent(rawStream, consumed, 0), "cuStreamWaitEvent");
                raw.check(raw.cuMemcpyHtoDAsync(rawX, rawPinned, kSize, rawStream),
                          "cuMemcpyHtoDAsync");
                raw.check(raw.cuEventRecord(written, rawStream), "cuEventRecord");
                raw.check(raw.cuStreamWaitEvent(rawOther, written, 0), "cuStreamWaitEvent");
                raw.check(raw.cuLaunchKernel(rawTouch, 1, 1, 1, kTouchThreads, 1, 1, 0, rawOther,
                                             touchParams, nullptr),
                          "cuLaunchKernel");
                raw.check(raw.cuEventRecord(consumed, rawOther), "cuEventRecord");
            }
            raw.check(raw.cuStreamSynchronize(rawStream), "cuStreamSynchronize");
            raw.check(raw.cuStreamSynchronize(rawOther), "cuStreamSynchronize");
        };
        raw.check(raw.cuEventRecord(consumed, rawOther), "cuEventRecord");
        rawLoop();
        const double rawTime = median(counts.repeats, rawLoop) / counts.crossStream;
        const double alignments =
            static_cast<double>(after.alignmentEvents - before.alignmentEvents) /
            counts.crossStream;
        char what[256];
        std::snprintf(what, sizeof what,
                      "cross-stream write(A) -> kernel(B), per iteration (%.2f alignment events "
                      "each) vs cuEventRecord + cuStreamWaitEvent both ways",
                      alignments);
        row(what, runtimeTime * 1e6, rawTime * 1e6, "us", "<= 1.5x");

        // Streams that share nothing: no events at all (the sync afterwards is not counted).
        Buffer onC, onD;
        {
            StreamGuard c(kStreamC);
            onC = client.empty(kSize);
        }
        {
            StreamGuard d(kStreamD);
            onD = client.empty(kSize);
        }
        Dispatch dispatchC = dispatch, dispatchD = dispatch;
        dispatchC.bindings = {onC};
        dispatchD.bindings = {onD};
        const EngineStats independentBefore = client.stats();
        for (int i = 0; i < counts.crossStream; ++i) {
            {
                StreamGuard c(kStreamC);
                client.fill(onC, 0);
                client.execute(touch, dispatchC);
            }
            StreamGuard d(kStreamD);
            client.fill(onD, 0);
            client.execute(touch, dispatchD);
        }
        const EngineStats independentAfter = client.stats();
        client.syncAll();
        row("events created by " + std::to_string(counts.crossStream) +
                " fill+kernel pairs on each of two streams sharing nothing (raw: none)",
            static_cast<double>(independentAfter.eventsCreated - independentBefore.eventsCreated),
            0, "events", "0 events");
    }

    // 7. A kernel from the on-disk cache in a new process vs a cold NVRTC compile.
    {
        std::vector<double> runtimeCold, rawCold;
        for (int i = 0; i < counts.compiles; ++i) {
            const std::vector<std::string> define{"-DBENCH_VARIANT=" + std::to_string(i)};
            auto start = Clock::now();
            client.prepare(cudaKernel("saxpy", kSaxpySource, define));
            runtimeCold.push_back(secondsSince(start));
            // The raw side compiles a variant no one compiled before either.
            const std::vector<std::string> rawDefine{"-DBENCH_VARIANT=" + std::to_string(100 + i)};
            start = Clock::now();
            raw.load(raw.compile(kSaxpySource, "saxpy", arch, rawDefine), "saxpy");
            rawCold.push_back(secondsSince(start));
        }
        std::sort(runtimeCold.begin(), runtimeCold.end());
        std::sort(rawCold.begin(), rawCold.end());
        const double rawColdMs = rawCold[rawCold.size() / 2] * 1e3;
        row("kernel cold: prepare() (plugin NVRTC + disk cache store) vs raw NVRTC + "
            "cuModuleLoadData",
            runtimeCold[runtimeCold.size() / 2] * 1e3, rawColdMs, "ms", "");
        const ProbeResult probe = spawnCacheProbe(cache.path, selection.device.id());
        if (!probe.ok) {
            std::fprintf(stderr, "cuda: cache row skipped: %s\n", probe.why.c_str());
        } else {
            std::string what = "kernel from the on-disk cache, first prepare() in a new process, "
                               "vs cold raw NVRTC + cuModuleLoadData";
            if (probe.compiled != 0 || probe.diskHits == 0)
                what += " (MISS: the child compiled " + std::to_string(probe.compiled) +
                        ", disk hits " + std::to_string(probe.diskHits) + ")";
            row(what, probe.seconds * 1e3, rawColdMs, "ms", "<= 0.02x (50x faster)");
        }
    }
}

} // namespace

void benchCuda(const BenchOptions &options, BenchRows &rows) {
    if (const char *fd = std::getenv(kProbeFdVariable)) runCacheProbe(fd);
    std::string why;
    void *driver = openDriver(why);
    if (driver == nullptr) {
        std::fprintf(stderr, "cuda: skipped (no CUDA driver: %s)\n", why.c_str());
        return;
    }
    try {
        run(driver, options, rows);
    } catch (const std::exception &e) {
        std::fprintf(stderr, "cuda: suite stopped: %s\n", e.what());
    }
}

} // namespace backplane::tool
