// `backplane bench multidevice`: copies between devices and all-reduce through backplane against
// the raw vendor calls in the same run (docs/multi-device.md):
// - peer copy of 1 GiB between two CUDA devices vs raw cuMemcpyPeerAsync;
// - all-reduce bus bandwidth at 256 MiB over every CUDA device vs raw NCCL in this process;
// - a cross-plugin copy (cuda -> vulkan of the same GPU, else any two plugins) vs a plain host
//   round trip through the API (readInto, then write);
// - on CPU-only machines: a copy between two host devices, peer vs staged, and the staged and
//   Gloo all-reduce of 4 host devices (no raw reference: the ratio is between the two paths).
#include "bench.hpp"
#ifdef BACKPLANE_HAVE_RAW_NCCL
#include "bench_nccl.hpp"
#endif

#include <backplane/client.hpp>
#include <backplane/communicator.hpp>
#include <backplane/config.hpp>
#include <backplane/error.hpp>
#include <backplane/runtime.hpp>

#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

namespace backplane::tool {

namespace {
/// Raw NCCL all-reduce bus bandwidth (GB/s) over every CUDA device in this process at `bytes`
/// per rank; 0 with `why` set when NCCL or CUDA is missing.
double rawNcclAllReduceBusBandwidth(uint64_t bytes, int iterations, std::string &why) {
#ifdef BACKPLANE_HAVE_RAW_NCCL
    try {
        return runRawNcclAllReduce("", bytes, static_cast<uint32_t>(iterations)).busBandwidth;
    } catch (const std::exception &e) {
        why = e.what();
        return 0;
    }
#else
    (void)bytes;
    (void)iterations;
    why = "this build has no raw NCCL reference (bench_nccl.cpp)";
    return 0;
#endif
}
} // namespace

namespace {

using Clock = std::chrono::steady_clock;

double secondsOf(const std::function<void()> &body, int repeats) {
    std::vector<double> times;
    for (int i = 0; i < repeats; ++i) {
        const auto start = Clock::now();
        body();
        times.push_back(std::chrono::duration<double>(Clock::now() - start).count());
    }
    std::sort(times.begin(), times.end());
    return times[times.size() / 2];
}

// ----- the few CUDA driver calls of the raw peer copy (declared here: no cuda.h needed) --------

using CUresult = int;
using CUdevice = int;
using CUcontext = void *;
using CUstream = void *;
using CUdeviceptr = unsigned long long;

struct RawPeer {
    CUresult (*cuInit)(unsigned) = nullptr;
    CUresult (*cuDeviceGet)(CUdevice *, int) = nullptr;
    CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *, CUdevice) = nullptr;
    CUresult (*cuCtxSetCurrent)(CUcontext) = nullptr;
    CUresult (*cuCtxEnablePeerAccess)(CUcontext, unsigned) = nullptr;
    CUresult (*cuMemAlloc)(CUdeviceptr *, size_t) = nullptr;
    CUresult (*cuMemFree)(CUdeviceptr) = nullptr;
    CUresult (*cuStreamCreate)(CUstream *, unsigned) = nullptr;
    CUresult (*cuStreamDestroy)(CUstream) = nullptr;
    CUresult (*cuStreamSynchronize)(CUstream) = nullptr;
    CUresult (*cuMemcpyPeerAsync)(CUdeviceptr, CUcontext, CUdeviceptr, CUcontext, size_t,
                                  CUstream) = nullptr;

    bool load(std::string &why) {
        void *lib = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
        if (lib == nullptr) {
            const char *e = ::dlerror();
            why = e ? e : "libcuda.so.1 not found";
            return false;
        }
        const auto get = [&](auto &fn, const char *name) {
            fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(::dlsym(lib, name));
            if (fn == nullptr) why = std::string("libcuda.so.1 has no ") + name;
            return fn != nullptr;
        };
        return get(cuInit, "cuInit") && get(cuDeviceGet, "cuDeviceGet") &&
               get(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain") &&
               get(cuCtxSetCurrent, "cuCtxSetCurrent") &&
               get(cuCtxEnablePeerAccess, "cuCtxEnablePeerAccess") &&
               get(cuMemAlloc, "cuMemAlloc_v2") && get(cuMemFree, "cuMemFree_v2") &&
               get(cuStreamCreate, "cuStreamCreate") &&
               get(cuStreamDestroy, "cuStreamDestroy_v2") &&
               get(cuStreamSynchronize, "cuStreamSynchronize") &&
               get(cuMemcpyPeerAsync, "cuMemcpyPeerAsync");
    }
};

void check(CUresult r, const char *what) {
    if (r != 0) throw std::runtime_error(std::string(what) + " failed: CUresult " + std::to_string(r));
}

/// Seconds of one raw cuMemcpyPeerAsync of `bytes` from ordinal `from` to `to` (median).
double rawPeerCopySeconds(int from, int to, uint64_t bytes, int repeats, std::string &why) {
    RawPeer cu;
    if (!cu.load(why)) return 0;
    check(cu.cuInit(0), "cuInit");
    CUdevice a = 0, b = 0;
    check(cu.cuDeviceGet(&a, from), "cuDeviceGet");
    check(cu.cuDeviceGet(&b, to), "cuDeviceGet");
    CUcontext ca = nullptr, cb = nullptr;
    check(cu.cuDevicePrimaryCtxRetain(&ca, a), "cuDevicePrimaryCtxRetain");
    check(cu.cuDevicePrimaryCtxRetain(&cb, b), "cuDevicePrimaryCtxRetain");
    check(cu.cuCtxSetCurrent(cb), "cuCtxSetCurrent");
    (void)cu.cuCtxEnablePeerAccess(ca, 0); // already enabled is fine
    CUdeviceptr dst = 0, src = 0;
    check(cu.cuMemAlloc(&dst, bytes), "cuMemAlloc");
    CUstream stream = nullptr;
    check(cu.cuStreamCreate(&stream, 1), "cuStreamCreate");
    check(cu.cuCtxSetCurrent(ca), "cuCtxSetCurrent");
    (void)cu.cuCtxEnablePeerAccess(cb, 0);
    check(cu.cuMemAlloc(&src, bytes), "cuMemAlloc");
    check(cu.cuCtxSetCurrent(cb), "cuCtxSetCurrent");
    const double seconds = secondsOf(
        [&] {
            check(cu.cuMemcpyPeerAsync(dst, cb, src, ca, bytes, stream), "cuMemcpyPeerAsync");
            check(cu.cuStreamSynchronize(stream), "cuStreamSynchronize");
        },
        repeats);
    cu.cuStreamDestroy(stream);
    cu.cuMemFree(dst);
    check(cu.cuCtxSetCurrent(ca), "cuCtxSetCurrent");
    cu.cuMemFree(src);
    return seconds;
}

/// Seconds of one backplane copy of `bytes` between two clients, the destination synced.
double copySeconds(ComputeClient &from, ComputeClient &to, uint64_t bytes, int repeats) {
    Buffer src = from.empty(bytes);
    Buffer dst = to.empty(bytes);
    from.fill(src, 0x3f800000u);
    from.sync();
    return secondsOf(
        [&] {
            from.copy(src, 0, to, dst, 0, bytes);
            to.sync();
        },
        repeats);
}

/// Seconds of the same bytes moved by hand: readInto host memory, then write.
double roundTripSeconds(ComputeClient &from, ComputeClient &to, uint64_t bytes, int repeats) {
    Buffer src = from.empty(bytes);
    Buffer dst = to.empty(bytes);
    std::vector<std::byte> host(bytes);
    return secondsOf(
        [&] {
            from.readInto(src, 0, host.data(), bytes);
            to.write(dst, 0, host.data(), bytes);
            to.sync();
        },
        repeats);
}

/// Bus bandwidth (GB/s) of backplane all-reduces of `bytes` per rank over `devices`, measured
/// as the raw NCCL reference is (bench_nccl.cpp): out of place, a warm-up, then `repeats`
/// all-reduces back to back and one wait for every device.
double allReduceBusBandwidth(Communicator &comm, std::vector<ComputeClient> &devices,
                             uint64_t bytes, int repeats) {
    std::vector<Buffer> send, recv;
    for (ComputeClient &c : devices) {
        send.push_back(c.empty(bytes));
        recv.push_back(c.empty(bytes));
        c.fill(send.back(), 0x3f800000u);
    }
    const uint64_t count = bytes / 4;
    const auto run = [&](int times) {
        for (int i = 0; i < times; ++i)
            comm.allReduce(send, recv, count, DataType::F32, ReduceOp::Sum);
        for (ComputeClient &c : devices) c.sync();
    };
    run(std::min(repeats, 5)); // warm-up (connections, buffers)
    const auto start = Clock::now();
    run(repeats);
    const double seconds =
        std::chrono::duration<double>(Clock::now() - start).count() / repeats;
    const double n = static_cast<double>(comm.size());
    return static_cast<double>(bytes) / seconds / 1e9 * (n > 1 ? 2.0 * (n - 1) / n : 1.0);
}

std::vector<ComputeClient> openAll(const Runtime &runtime, const std::string &backend) {
    std::vector<ComputeClient> out;
    for (const PhysicalDevice &d : runtime.devices())
        for (const DeviceInfo &route : d.routes)
            if (route.backend == backend) out.push_back(runtime.open(runtime.select(route.id())));
    return out;
}

void benchGpus(const Runtime &runtime, const BenchOptions &options, BenchRows &rows) {
    std::vector<ComputeClient> gpus = openAll(runtime, "cuda");
    if (gpus.empty()) {
        std::fprintf(stderr, "multidevice: no CUDA device; GPU rows skipped\n");
        return;
    }
    const int repeats = options.quick ? 3 : 10;
    const std::string names = std::to_string(gpus.size()) + " x " + gpus[0].device().name;
    if (gpus.size() >= 2) {
        const uint64_t bytes = options.quick ? (64ull << 20) : (1ull << 30);
        const double ours = copySeconds(gpus[0], gpus[1], bytes, repeats);
        const bool peer = gpus[0].stats().peerCopies > 0;
        std::string why;
        const double raw = rawPeerCopySeconds(static_cast<int>(gpus[0].device().index),
                                              static_cast<int>(gpus[1].device().index), bytes,
                                              repeats, why);
        if (raw == 0) std::fprintf(stderr, "multidevice: raw peer copy skipped (%s)\n", why.c_str());
        const double gb = static_cast<double>(bytes) / 1e9;
        rows.push_back({"multi", gpus[0].device().id() + " -> " + gpus[1].device().id(),
                        std::string("copy ") + (bytes >> 20 >= 1024 ? "1 GiB" : "64 MiB") +
                            (peer ? " (copy_peer)" : " (staged!)") + " vs cuMemcpyPeerAsync",
                        gb / ours, raw == 0 ? 0 : gb / raw, "GB/s", ">= 0.95x"});
        // Rates: ratio() is runtime/raw, so the row reads as a fraction of the raw speed.
    }
    {
        const uint64_t bytes = options.quick ? (16ull << 20) : (256ull << 20);
        auto rendezvous = localRendezvous();
        Communicator comm = Communicator::create(runtime, gpus, *rendezvous);
        const double ours = allReduceBusBandwidth(comm, gpus, bytes, repeats);
        std::string why;
        const double raw = rawNcclAllReduceBusBandwidth(bytes, repeats, why);
        if (raw == 0) std::fprintf(stderr, "multidevice: raw NCCL skipped (%s)\n", why.c_str());
        rows.push_back({"multi", names,
                        "all-reduce " + std::to_string(bytes >> 20) + " MiB bus bandwidth (" +
                            comm.engine() + ") vs raw NCCL",
                        ours, raw, "GB/s", ">= 0.95x"});
    }
    // Cross-plugin: the Vulkan route of the same GPU, when there is one.
    std::vector<ComputeClient> vulkan = openAll(runtime, "vulkan");
    for (ComputeClient &v : vulkan) {
        if (v.device().type == DeviceType::Cpu) continue;
        const uint64_t bytes = options.quick ? (64ull << 20) : (256ull << 20);
        const double ours = copySeconds(gpus[0], v, bytes, repeats);
        const double raw = roundTripSeconds(gpus[0], v, bytes, repeats);
        const double gb = static_cast<double>(bytes) / 1e9;
        rows.push_back({"multi", gpus[0].device().id() + " -> " + v.device().id(),
                        "cross-plugin copy " + std::to_string(bytes >> 20) +
                            " MiB vs readInto + write by hand",
                        gb / ours, gb / raw, "GB/s", ">= 1.0x"});
        break;
    }
}

void benchHost(const BenchOptions &options, BenchRows &rows) {
    Config config = loadConfig();
    config.pluginOptions["host"] = R"({"devices": 4})";
    config.pluginEnable = {"host"};
    const Runtime runtime(config);
    std::vector<ComputeClient> hosts = openAll(runtime, "host");
    if (hosts.size() < 4) {
        std::fprintf(stderr, "multidevice: fewer than 4 host devices; host rows skipped\n");
        return;
    }
    const int repeats = options.quick ? 3 : 7;
    const uint64_t bytes = options.quick ? (16ull << 20) : (64ull << 20);
    const double gb = static_cast<double>(bytes) / 1e9;
    const double peer = copySeconds(hosts[0], hosts[1], bytes, repeats);
    const double byHand = roundTripSeconds(hosts[0], hosts[1], bytes, repeats);
    rows.push_back({"multi", "host:0 -> host:1",
                    "copy " + std::to_string(bytes >> 20) + " MiB (copy_peer) vs readInto + write",
                    gb / peer, gb / byHand, "GB/s", ""});
    auto rendezvous = localRendezvous();
    Communicator gloo = Communicator::create(runtime, hosts, *rendezvous);
    CommunicatorOptions stagedOptions;
    stagedOptions.forceStaged = true;
    Communicator staged = Communicator::create(runtime, hosts, *rendezvous, stagedOptions);
    const uint64_t reduceBytes = options.quick ? (4ull << 20) : (16ull << 20);
    const double ours = allReduceBusBandwidth(gloo, hosts, reduceBytes, repeats);
    const double stagedBw = allReduceBusBandwidth(staged, hosts, reduceBytes, repeats);
    rows.push_back({"multi", "4 x host",
                    "all-reduce " + std::to_string(reduceBytes >> 20) + " MiB bus bandwidth, " +
                        gloo.engine() + " vs staged",
                    ours, stagedBw, "GB/s", ""});
}

} // namespace

void benchMultidevice(const BenchOptions &options, BenchRows &rows) {
    try {
        benchHost(options, rows);
    } catch (const std::exception &e) {
        std::fprintf(stderr, "multidevice: host rows failed: %s\n", e.what());
    }
    try {
        const Runtime runtime;
        benchGpus(runtime, options, rows);
    } catch (const std::exception &e) {
        std::fprintf(stderr, "multidevice: GPU rows failed: %s\n", e.what());
    }
}

} // namespace backplane::tool
