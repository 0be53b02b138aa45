// Raw NCCL all-reduce over every GPU of the machine, for `backplane bench` (bench_nccl.hpp).
#include "bench_nccl.hpp"

#include <dlfcn.h>

#include <chrono>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

// Neither cuda.h nor nccl.h is needed: the few driver and NCCL declarations used are below, so
// this file builds wherever the tool does.

namespace backplane::tool {
namespace {

// The CUDA driver API subset used (cuda.h of CUDA 13). dlsym names are the versioned entry
// points cuda.h maps the plain names onto (cuMemAlloc -> cuMemAlloc_v2).
using CUresult = int; // CUDA_SUCCESS = 0
using CUdevice = int;
using CUcontext = struct CudaContextOpaque *;
using CUstream = struct CudaStreamOpaque *;
using CUdeviceptr = unsigned long long;
constexpr unsigned kStreamNonBlocking = 0x1; // CU_STREAM_NON_BLOCKING

struct Driver {
    CUresult (*cuInit)(unsigned) = nullptr;
    CUresult (*cuGetErrorName)(CUresult, const char **) = nullptr;
    CUresult (*cuDeviceGetCount)(int *) = nullptr;
    CUresult (*cuDeviceGet)(CUdevice *, int) = nullptr;
    CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *, CUdevice) = nullptr;
    CUresult (*cuDevicePrimaryCtxRelease)(CUdevice) = nullptr; // _v2
    CUresult (*cuCtxSetCurrent)(CUcontext) = nullptr;
    CUresult (*cuMemAlloc)(CUdeviceptr *, size_t) = nullptr;          // _v2
    CUresult (*cuMemFree)(CUdeviceptr) = nullptr;                     // _v2
    CUresult (*cuMemsetD32)(CUdeviceptr, unsigned, size_t) = nullptr; // _v2
    CUresult (*cuStreamCreate)(CUstream *, unsigned) = nullptr;
    CUresult (*cuStreamDestroy)(CUstream) = nullptr; // _v2
    CUresult (*cuStreamSynchronize)(CUstream) = nullptr;

    void check(CUresult result, const char *call) const {
        if (result == 0) return;
        const char *name = nullptr;
        if (cuGetErrorName != nullptr) cuGetErrorName(result, &name);
        throw std::runtime_error(std::string(call) + " failed: " +
                                 (name != nullptr ? name : "CUresult " + std::to_string(result)));
    }
};

// The NCCL C API subset used, declared from nccl.h (2.28.9).
using NcclResult = int;               // ncclResult_t; 0 = ncclSuccess
using NcclComm = struct NcclOpaque *; // ncclComm_t
constexpr int kNcclFloat32 = 7;       // ncclDataType_t ncclFloat32
constexpr int kNcclSum = 0;           // ncclRedOp_t ncclSum

struct Nccl {
    NcclResult (*getVersion)(int *) = nullptr;
    const char *(*getErrorString)(NcclResult) = nullptr;
    NcclResult (*commInitAll)(NcclComm *, int, const int *) = nullptr;
    NcclResult (*commDestroy)(NcclComm) = nullptr;
    NcclResult (*groupStart)() = nullptr;
    NcclResult (*groupEnd)() = nullptr;
    NcclResult (*allReduce)(const void *, void *, size_t, int, int, NcclComm, CUstream) = nullptr;
};

template <class Slot>
void bind(Slot &slot, void *library, const char *name, const std::string &libraryName) {
    void *address = ::dlsym(library, name);
    if (address == nullptr) throw std::runtime_error(libraryName + " has no " + name);
    slot = reinterpret_cast<Slot>(address);
}

/// Everything allocated, released in reverse on every path.
struct Devices {
    const Driver &cu;
    const Nccl &nccl;
    std::vector<CUdevice> ids;
    std::vector<CUcontext> contexts;
    std::vector<CUstream> streams;
    std::vector<CUdeviceptr> send, recv;
    std::vector<NcclComm> comms;

    ~Devices() {
        for (NcclComm comm : comms)
            if (comm != nullptr) nccl.commDestroy(comm);
        for (size_t i = 0; i < contexts.size(); ++i) {
            cu.cuCtxSetCurrent(contexts[i]);
            if (i < streams.size() && streams[i] != nullptr) cu.cuStreamDestroy(streams[i]);
            if (i < send.size() && send[i] != 0) cu.cuMemFree(send[i]);
            if (i < recv.size() && recv[i] != 0) cu.cuMemFree(recv[i]);
            cu.cuDevicePrimaryCtxRelease(ids[i]);
        }
    }
};

} // namespace

RawNcclAllReduce runRawNcclAllReduce(const std::string &ncclLibrary, uint64_t bytes,
                                     uint32_t iterations, uint32_t warmup) {
    if (bytes == 0 || bytes % 4 != 0)
        throw std::invalid_argument("runRawNcclAllReduce: bytes must be a positive multiple of 4");
    if (iterations == 0) throw std::invalid_argument("runRawNcclAllReduce: iterations must be > 0");
    // NVLink multicast must stay off on the shared GPU machines (../shared/DEVICE.md).
    ::setenv("NCCL_NVLS_ENABLE", "0", 0);

    RawNcclAllReduce result;
    // Both libraries stay loaded: they start threads that outlive this call.
    void *cuda = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (cuda == nullptr) throw std::runtime_error(std::string("no CUDA driver: ") + ::dlerror());
    Driver cu;
    const std::string cudaName = "libcuda.so.1";
    bind(cu.cuInit, cuda, "cuInit", cudaName);
    bind(cu.cuGetErrorName, cuda, "cuGetErrorName", cudaName);
    bind(cu.cuDeviceGetCount, cuda, "cuDeviceGetCount", cudaName);
    bind(cu.cuDeviceGet, cuda, "cuDeviceGet", cudaName);
    bind(cu.cuDevicePrimaryCtxRetain, cuda, "cuDevicePrimaryCtxRetain", cudaName);
    bind(cu.cuDevicePrimaryCtxRelease, cuda, "cuDevicePrimaryCtxRelease_v2", cudaName);
    bind(cu.cuCtxSetCurrent, cuda, "cuCtxSetCurrent", cudaName);
    bind(cu.cuMemAlloc, cuda, "cuMemAlloc_v2", cudaName);
    bind(cu.cuMemFree, cuda, "cuMemFree_v2", cudaName);
    bind(cu.cuMemsetD32, cuda, "cuMemsetD32_v2", cudaName);
    bind(cu.cuStreamCreate, cuda, "cuStreamCreate", cudaName);
    bind(cu.cuStreamDestroy, cuda, "cuStreamDestroy_v2", cudaName);
    bind(cu.cuStreamSynchronize, cuda, "cuStreamSynchronize", cudaName);

    const char *environment = std::getenv("BACKPLANE_NCCL_LIBRARY");
    result.library = !ncclLibrary.empty()                             ? ncclLibrary
                     : environment != nullptr && *environment != '\0' ? environment
                                                                      : "libnccl.so.2";
    void *library = ::dlopen(result.library.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (library == nullptr)
        throw std::runtime_error("NCCL not found: " + std::string(::dlerror()) +
                                 " (set BACKPLANE_NCCL_LIBRARY)");
    Nccl nccl;
    bind(nccl.getVersion, library, "ncclGetVersion", result.library);
    bind(nccl.getErrorString, library, "ncclGetErrorString", result.library);
    bind(nccl.commInitAll, library, "ncclCommInitAll", result.library);
    bind(nccl.commDestroy, library, "ncclCommDestroy", result.library);
    bind(nccl.groupStart, library, "ncclGroupStart", result.library);
    bind(nccl.groupEnd, library, "ncclGroupEnd", result.library);
    bind(nccl.allReduce, library, "ncclAllReduce", result.library);
    auto checkNccl = [&](NcclResult r, const char *call) {
        if (r != 0)
            throw std::runtime_error(std::string(call) + " failed: " + nccl.getErrorString(r));
    };
    int code = 0;
    checkNccl(nccl.getVersion(&code), "ncclGetVersion");
    const bool old = code < 10000; // NCCL_VERSION: major * 1000 + ... before 2.9
    result.version = std::to_string(old ? code / 1000 : code / 10000) + "." +
                     std::to_string(old ? code / 100 % 10 : code / 100 % 100) + "." +
                     std::to_string(code % 100);

    cu.check(cu.cuInit(0), "cuInit");
    int count = 0;
    cu.check(cu.cuDeviceGetCount(&count), "cuDeviceGetCount");
    if (count < 2)
        throw std::runtime_error("an all-reduce needs 2 or more GPUs; the driver reports " +
                                 std::to_string(count));
    result.devices = static_cast<uint32_t>(count);
    result.bytes = bytes;
    result.iterations = iterations;

    Devices d{cu, nccl, {}, {}, {}, {}, {}, {}};
    const size_t n = static_cast<size_t>(count);
    for (int i = 0; i < count; ++i) {
        CUdevice id = 0;
        cu.check(cu.cuDeviceGet(&id, i), "cuDeviceGet");
        CUcontext context = nullptr;
        cu.check(cu.cuDevicePrimaryCtxRetain(&context, id), "cuDevicePrimaryCtxRetain");
        d.ids.push_back(id);
        d.contexts.push_back(context);
        cu.check(cu.cuCtxSetCurrent(context), "cuCtxSetCurrent");
        d.streams.push_back(nullptr);
        cu.check(cu.cuStreamCreate(&d.streams.back(), kStreamNonBlocking), "cuStreamCreate");
        d.send.push_back(0);
        cu.check(cu.cuMemAlloc(&d.send.back(), bytes), "cuMemAlloc");
        d.recv.push_back(0);
        cu.check(cu.cuMemAlloc(&d.recv.back(), bytes), "cuMemAlloc");
        cu.check(cu.cuMemsetD32(d.send.back(), 0x3f800000u, bytes / 4), "cuMemsetD32"); // 1.0f
    }
    // Rank i on CUDA device i: the runtime NCCL uses makes device i's primary context current,
    // the one set above.
    d.comms.assign(n, nullptr);
    checkNccl(nccl.commInitAll(d.comms.data(), count, nullptr), "ncclCommInitAll");

    auto runOnce = [&] {
        checkNccl(nccl.groupStart(), "ncclGroupStart");
        for (size_t i = 0; i < n; ++i)
            checkNccl(nccl.allReduce(reinterpret_cast<const void *>(d.send[i]),
                                     reinterpret_cast<void *>(d.recv[i]), bytes / 4, kNcclFloat32,
                                     kNcclSum, d.comms[i], d.streams[i]),
                      "ncclAllReduce");
        checkNccl(nccl.groupEnd(), "ncclGroupEnd");
    };
    auto synchronize = [&] {
        for (size_t i = 0; i < n; ++i) {
            cu.check(cu.cuCtxSetCurrent(d.contexts[i]), "cuCtxSetCurrent");
            cu.check(cu.cuStreamSynchronize(d.streams[i]), "cuStreamSynchronize");
        }
    };
    for (uint32_t i = 0; i < warmup; ++i)
        runOnce();
    synchronize();
    const auto start = std::chrono::steady_clock::now();
    for (uint32_t i = 0; i < iterations; ++i)
        runOnce();
    synchronize();
    result.seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() /
        iterations;
    const double ranks = static_cast<double>(n);
    result.busBandwidth =
        static_cast<double>(bytes) * 2.0 * (ranks - 1.0) / ranks / result.seconds / 1e9;
    return result;
}

} // namespace backplane::tool
