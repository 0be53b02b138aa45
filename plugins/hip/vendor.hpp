// Vendor mapping of the shared GPU plugin sources (plugins/cuda/gpu_*.cpp) onto HIP and hiprtc.
#pragma once

// The same names as plugins/cuda/vendor.hpp; a diff of the two files is the whole difference
// between the CUDA and HIP plugins. Differences worth knowing:
// - HIP has no explicit contexts in the runtime API: a "context" is the device ordinal and making
//   it current is hipSetDevice (per thread, like cuCtxSetCurrent).
// - Debian's HIP 5.2 ships hiprtc inside libamdhip64; ROCm 6 has a separate libhiprtc. Both are
//   tried.
// - AMD GPUs have no dynamic shared memory opt-in; allowDynamicShared does nothing.

#include <hip/hip_runtime_api.h>
#include <hip/hiprtc.h>

#include <cstdint>
#include <cstring>
#include <string>

namespace bpv {

using Result = hipError_t;
using DeviceId = hipDevice_t;
using Context = int; // device ordinal: HIP's runtime API selects devices per thread
using DevicePtr = hipDeviceptr_t;
using Stream = hipStream_t;
using Event = hipEvent_t;
using Module = hipModule_t;
using Function = hipFunction_t;
using Graph = hipGraph_t;
using GraphExec = hipGraphExec_t;
using RtcResult = hiprtcResult;
using RtcProgram = hiprtcProgram;

inline constexpr const char *kPluginName = "hip";
inline constexpr const char *kPluginVersion = "0.1.0";
inline constexpr const char *kVendorName = "AMD";
inline constexpr const char *kApiName = "HIP";
inline constexpr const char *kDriverDescription = "HIP runtime";
inline constexpr const char *kRtcName = "hiprtc";
/// hiprtc compiles both CUDA-style and HIP sources (BP_DIALECT_CUDA | BP_DIALECT_HIP).
inline constexpr uint32_t kDialects = (1u << 0) | (1u << 1);

inline constexpr const char *kDriverLibraries[] = {"libamdhip64.so.6", "libamdhip64.so.5",
                                                   "libamdhip64.so"};
inline constexpr const char *kRtcLibraries[] = {"libhiprtc.so.6",   "libhiprtc.so.5",
                                                "libhiprtc.so",     "libamdhip64.so.6",
                                                "libamdhip64.so.5", "libamdhip64.so"};

/// RCCL implements the NCCL API (same names, types and values) for HIP.
inline constexpr const char *kCollectivesName = "rccl";
/// The options schema the plugin publishes (ABI 1.5; gpu_options.cpp parses the same).
inline constexpr const char *kOptionsSchema =
    R"schema({"type": "object", "additionalProperties": false, "properties": {"rccl": {"type": "object", "additionalProperties": false, "description": "the collectives library", "properties": {"library": {"type": "string", "maxLength": 4095, "description": "path or soname of RCCL (default: librccl.so.1)"}}}}})schema";
inline constexpr const char *kCollectivesProduct = "RCCL";
inline constexpr const char *kCollectivesLibrary = "librccl.so.1";
inline constexpr const char *kCollectivesEnvironment = "BACKPLANE_RCCL_LIBRARY";

inline constexpr Result kSuccess = hipSuccess;
inline constexpr Result kNotReady = hipErrorNotReady;
inline constexpr Result kNoDevice = hipErrorNoDevice;
inline constexpr Result kNotFound = hipErrorNotFound;
inline constexpr RtcResult kRtcSuccess = HIPRTC_SUCCESS;

/// A vendor call's result and the name of the vendor function, for error messages.
struct Call {
    Result result;
    const char *name;
    bool ok() const { return result == hipSuccess; }
};

// hipMalloc and hipHostMalloc are overloaded with C++ templates: their type is spelled out.
using MallocFn = hipError_t (*)(void **, size_t);
using HostMallocFn = hipError_t (*)(void **, size_t, unsigned int);

#define BPV_DRIVER_FUNCTIONS(X, XT)                                                                    \
    X(hipInit)                                                                                     \
    X(hipDriverGetVersion)                                                                         \
    X(hipGetErrorName)                                                                             \
    X(hipGetErrorString)                                                                           \
    X(hipGetDeviceCount)                                                                           \
    X(hipDeviceGet)                                                                                \
    X(hipDeviceGetName)                                                                            \
    X(hipDeviceGetUuid)                                                                            \
    X(hipDeviceGetAttribute)                                                                       \
    X(hipDeviceTotalMem)                                                                           \
    X(hipDeviceGetPCIBusId)                                                                        \
    X(hipDeviceCanAccessPeer)                                                                      \
    X(hipGetDeviceProperties)                                                                      \
    X(hipGetDevice)                                                                                \
    X(hipSetDevice)                                                                                \
    X(hipDeviceEnablePeerAccess)                                                                   \
    XT(hipMalloc, MallocFn)                                                                       \
    X(hipFree)                                                                                     \
    XT(hipHostMalloc, HostMallocFn)                                                                \
    X(hipHostFree)                                                                                 \
    X(hipStreamCreateWithFlags)                                                                    \
    X(hipStreamDestroy)                                                                            \
    X(hipStreamSynchronize)                                                                        \
    X(hipStreamWaitEvent)                                                                          \
    X(hipEventCreateWithFlags)                                                                     \
    X(hipEventDestroy)                                                                             \
    X(hipEventRecord)                                                                              \
    X(hipEventQuery)                                                                               \
    X(hipEventSynchronize)                                                                         \
    X(hipEventElapsedTime)                                                                         \
    X(hipMemcpyHtoDAsync)                                                                          \
    X(hipMemcpyDtoHAsync)                                                                          \
    X(hipMemcpyDtoDAsync)                                                                          \
    X(hipMemcpyPeerAsync)                                                                          \
    X(hipMemsetD32Async)                                                                           \
    X(hipModuleLoadData)                                                                           \
    X(hipModuleUnload)                                                                             \
    X(hipModuleGetFunction)                                                                        \
    X(hipModuleLaunchKernel)                                                                       \
    X(hipHostRegister)                                                                             \
    X(hipHostUnregister)

// HIP 5.2 (Debian) has no query of a kernel's parameters. Graphs (beta in HIP 5.2): without
// them graph_create / graph_update are unsupported and the core replays the ops.
#define BPV_OPTIONAL_DRIVER_FUNCTIONS(X)                                                           \
    X(hipStreamBeginCapture)                                                                       \
    X(hipStreamEndCapture)                                                                         \
    X(hipGraphInstantiate)                                                                         \
    X(hipGraphLaunch)                                                                              \
    X(hipGraphExecUpdate)                                                                          \
    X(hipGraphExecDestroy)                                                                         \
    X(hipGraphDestroy)

#define BPV_RTC_FUNCTIONS(X)                                                                       \
    X(hiprtcGetErrorString)                                                                        \
    X(hiprtcVersion)                                                                               \
    X(hiprtcCreateProgram)                                                                         \
    X(hiprtcDestroyProgram)                                                                        \
    X(hiprtcCompileProgram)                                                                        \
    X(hiprtcGetProgramLogSize)                                                                     \
    X(hiprtcGetProgramLog)                                                                         \
    X(hiprtcGetCodeSize)                                                                           \
    X(hiprtcGetCode)

#define BPV_DECLARE_MEMBER(symbol) decltype(&::symbol) symbol = nullptr;
#define BPV_DECLARE_TYPED_MEMBER(symbol, type) type symbol = nullptr;

struct Driver {
    BPV_DRIVER_FUNCTIONS(BPV_DECLARE_MEMBER, BPV_DECLARE_TYPED_MEMBER)
    BPV_OPTIONAL_DRIVER_FUNCTIONS(BPV_DECLARE_MEMBER)
};

struct Rtc {
    BPV_RTC_FUNCTIONS(BPV_DECLARE_MEMBER)
};

enum class Attribute {
    MaxBlockDimX = hipDeviceAttributeMaxBlockDimX,
    MaxBlockDimY = hipDeviceAttributeMaxBlockDimY,
    MaxBlockDimZ = hipDeviceAttributeMaxBlockDimZ,
    MaxThreadsPerBlock = hipDeviceAttributeMaxThreadsPerBlock,
    MaxGridDimX = hipDeviceAttributeMaxGridDimX,
    MaxGridDimY = hipDeviceAttributeMaxGridDimY,
    MaxGridDimZ = hipDeviceAttributeMaxGridDimZ,
    MaxSharedMemoryPerBlock = hipDeviceAttributeMaxSharedMemoryPerBlock,
    WarpSize = hipDeviceAttributeWarpSize,
    Integrated = hipDeviceAttributeIntegrated,
    ComputeCapabilityMajor = hipDeviceAttributeComputeCapabilityMajor,
    ComputeCapabilityMinor = hipDeviceAttributeComputeCapabilityMinor,
};

/// No matrix shapes: rocWMMA is not part of hiprtc, and AMD's compute capability numbers
/// (gfx90a: 9.0) say nothing about its matrix cores.
inline constexpr bool kWmmaShapes = false;

inline bool isOutOfMemory(Result r) { return r == hipErrorOutOfMemory; }
/// Whether a fault keeps the device unusable for the rest of the process: not measured on HIP,
/// so no device is refused for the process there (a reopen is tried).
inline bool isFault(Result) { return false; }
inline bool isSticky(Result r) {
    switch (r) {
    case hipErrorIllegalAddress:
    case hipErrorLaunchFailure:
    case hipErrorECCNotCorrectable:
    case hipErrorIllegalState:
    case hipErrorAssert:
    case hipErrorContextIsDestroyed:
        return true;
    default:
        return false;
    }
}
inline bool isLaunchError(Result r) {
    return r == hipErrorLaunchOutOfResources || r == hipErrorInvalidValue ||
           r == hipErrorInvalidConfiguration || r == hipErrorInvalidImage;
}
/// hipInit reports a machine without an AMD GPU as hipErrorInvalidDevice (HIP 5.2) or NoDevice.
inline bool isNoDevice(Result r) { return r == hipErrorNoDevice || r == hipErrorInvalidDevice; }

inline std::string errorName(const Driver &d, Result r) {
    const char *name = d.hipGetErrorName ? d.hipGetErrorName(r) : nullptr;
    return name ? name : "hipError_t " + std::to_string(static_cast<int>(r));
}
inline std::string errorString(const Driver &d, Result r) {
    const char *text = d.hipGetErrorString ? d.hipGetErrorString(r) : nullptr;
    return text ? text : "unknown error";
}
inline std::string rtcErrorString(const Rtc &c, RtcResult r) {
    return c.hiprtcGetErrorString ? c.hiprtcGetErrorString(r) : "hiprtc error";
}

/// hipDriverGetVersion's major * 10^7 + minor * 10^5 + patch -> "5.2.21153".
inline std::string versionString(int v) {
    return std::to_string(v / 10000000) + "." + std::to_string((v / 100000) % 100) + "." +
           std::to_string(v % 100000);
}

inline Call init(const Driver &d) {
    return {d.hipInit(0), "hipInit"};
}
inline Call driverVersion(const Driver &d, int *v) {
    return {d.hipDriverGetVersion(v), "hipDriverGetVersion"};
}
inline Call deviceCount(const Driver &d, int *n) {
    return {d.hipGetDeviceCount(n), "hipGetDeviceCount"};
}
inline Call deviceGet(const Driver &d, DeviceId *dev, int ordinal) {
    return {d.hipDeviceGet(dev, ordinal), "hipDeviceGet"};
}
inline Call deviceName(const Driver &d, char *name, int len, DeviceId dev) {
    return {d.hipDeviceGetName(name, len, dev), "hipDeviceGetName"};
}
inline Call deviceUuid(const Driver &d, uint8_t (&out)[16], DeviceId dev) {
    hipUUID u{};
    const Result r = d.hipDeviceGetUuid(&u, dev);
    std::memcpy(out, u.bytes, 16);
    return {r, "hipDeviceGetUuid"};
}
inline Call deviceAttribute(const Driver &d, int *value, Attribute a, DeviceId dev) {
    return {d.hipDeviceGetAttribute(value, static_cast<hipDeviceAttribute_t>(a), dev), "hipDeviceGetAttribute"};
}
inline Call deviceTotalMem(const Driver &d, size_t *bytes, DeviceId dev) {
    return {d.hipDeviceTotalMem(bytes, dev), "hipDeviceTotalMem"};
}
inline Call devicePciBusId(const Driver &d, char *id, int len, DeviceId dev) {
    return {d.hipDeviceGetPCIBusId(id, len, dev), "hipDeviceGetPCIBusId"};
}
inline Call canAccessPeer(const Driver &d, int *can, DeviceId dev, DeviceId peer) {
    return {d.hipDeviceCanAccessPeer(can, dev, peer), "hipDeviceCanAccessPeer"};
}
/// The exact compile target: "gfx90a" (the feature suffix ":sramecc+:xnack-" is dropped).
inline Call deviceArch(const Driver &d, std::string *arch, DeviceId dev) {
    hipDeviceProp_t props{};
    const Result r = d.hipGetDeviceProperties(&props, dev);
    *arch = props.gcnArchName;
    *arch = arch->substr(0, arch->find(':'));
    return {r, "hipGetDeviceProperties"};
}

inline Call contextRetain(const Driver &, Context *ctx, DeviceId dev) {
    *ctx = dev;
    return {hipSuccess, "hipDeviceGet"};
}
inline Call contextRelease(const Driver &, Context, DeviceId) { return {hipSuccess, "none"}; }
inline Call contextCurrent(const Driver &d, Context *ctx) {
    return {d.hipGetDevice(ctx), "hipGetDevice"};
}
inline Call contextSetCurrent(const Driver &d, Context ctx) {
    return {d.hipSetDevice(ctx), "hipSetDevice"};
}
inline Call enablePeerAccess(const Driver &d, Context peer) {
    const Result r = d.hipDeviceEnablePeerAccess(peer, 0);
    return {r == hipErrorPeerAccessAlreadyEnabled ? hipSuccess : r, "hipDeviceEnablePeerAccess"};
}

inline Call memAlloc(const Driver &d, DevicePtr *p, size_t size) {
    return {d.hipMalloc(p, size), "hipMalloc"};
}
inline Call memFree(const Driver &d, DevicePtr p) {
    return {d.hipFree(p), "hipFree"};
}
inline Call hostAlloc(const Driver &d, void **p, size_t size) {
    return {d.hipHostMalloc(p, size, hipHostMallocPortable | hipHostMallocMapped), "hipHostMalloc"};
}
inline Call hostFree(const Driver &d, void *p) {
    return {d.hipHostFree(p), "hipHostFree"};
}
/// Page-locks the application's range (ABI 1.3 memory_register) for every device, mapped like
/// hostAlloc's pages.
inline Call hostRegister(const Driver &d, void *p, size_t size) {
    return {d.hipHostRegister(p, size, hipHostRegisterPortable | hipHostRegisterMapped),
            "hipHostRegister"};
}
inline Call hostUnregister(const Driver &d, void *p) {
    return {d.hipHostUnregister(p), "hipHostUnregister"};
}
inline DevicePtr offsetPtr(DevicePtr p, uint64_t offset) { return static_cast<char *>(p) + offset; }
/// Pinned host pages are addressable from the device at the same address (unified addressing).
inline DevicePtr fromHostPtr(void *p) { return p; }
inline uint64_t ptrValue(DevicePtr p) { return reinterpret_cast<uint64_t>(p); }

inline Call streamCreate(const Driver &d, Stream *s) {
    return {d.hipStreamCreateWithFlags(s, hipStreamNonBlocking), "hipStreamCreateWithFlags"};
}
inline Call streamDestroy(const Driver &d, Stream s) {
    return {d.hipStreamDestroy(s), "hipStreamDestroy"};
}
inline Call streamSynchronize(const Driver &d, Stream s) {
    return {d.hipStreamSynchronize(s), "hipStreamSynchronize"};
}
inline Call streamWaitEvent(const Driver &d, Stream s, Event e) {
    return {d.hipStreamWaitEvent(s, e, 0), "hipStreamWaitEvent"};
}
inline Call eventCreate(const Driver &d, Event *e, bool timing) {
    return {d.hipEventCreateWithFlags(e, timing ? hipEventDefault : hipEventDisableTiming), "hipEventCreateWithFlags"};
}
inline Call eventDestroy(const Driver &d, Event e) {
    return {d.hipEventDestroy(e), "hipEventDestroy"};
}
inline Call eventRecord(const Driver &d, Event e, Stream s) {
    return {d.hipEventRecord(e, s), "hipEventRecord"};
}
inline Call eventQuery(const Driver &d, Event e) {
    return {d.hipEventQuery(e), "hipEventQuery"};
}
inline Call eventSynchronize(const Driver &d, Event e) {
    return {d.hipEventSynchronize(e), "hipEventSynchronize"};
}
inline Call eventElapsedMs(const Driver &d, float *ms, Event start, Event end) {
    return {d.hipEventElapsedTime(ms, start, end), "hipEventElapsedTime"};
}

inline Call copyHtoD(const Driver &d, DevicePtr dst, const void *src, size_t n, Stream s) {
    // HIP 5.2 declares the source non-const; it is only read.
    return {d.hipMemcpyHtoDAsync(dst, const_cast<void *>(src), n, s), "hipMemcpyHtoDAsync"};
}
inline Call copyDtoH(const Driver &d, void *dst, DevicePtr src, size_t n, Stream s) {
    return {d.hipMemcpyDtoHAsync(dst, src, n, s), "hipMemcpyDtoHAsync"};
}
inline Call copyDtoD(const Driver &d, DevicePtr dst, DevicePtr src, size_t n, Stream s) {
    return {d.hipMemcpyDtoDAsync(dst, src, n, s), "hipMemcpyDtoDAsync"};
}
inline Call copyPeer(const Driver &d, DevicePtr dst, Context, DeviceId dstDev, DevicePtr src,
                       Context, DeviceId srcDev, size_t n, Stream s) {
    return {d.hipMemcpyPeerAsync(dst, dstDev, src, srcDev, n, s), "hipMemcpyPeerAsync"};
}
inline Call fillD32(const Driver &d, DevicePtr dst, uint32_t pattern, size_t count, Stream s) {
    return {d.hipMemsetD32Async(dst, static_cast<int>(pattern), count, s), "hipMemsetD32Async"};
}

inline Call moduleLoad(const Driver &d, Module *m, const void *image) {
    return {d.hipModuleLoadData(m, image), "hipModuleLoadData"};
}
inline Call moduleUnload(const Driver &d, Module m) {
    return {d.hipModuleUnload(m), "hipModuleUnload"};
}
inline Call moduleFunction(const Driver &d, Function *f, Module m, const char *name) {
    return {d.hipModuleGetFunction(f, m, name), "hipModuleGetFunction"};
}
inline Call allowDynamicShared(const Driver &, Function, uint32_t) { return {hipSuccess, "none"}; }
inline Call launch(const Driver &d, Function f, const uint32_t (&grid)[3],
                     const uint32_t (&block)[3], uint32_t sharedBytes, Stream s, void **params) {
    return {d.hipModuleLaunchKernel(f, grid[0], grid[1], grid[2], block[0], block[1], block[2],
                                   sharedBytes, s, params, nullptr), "hipModuleLaunchKernel"};
}

/// What the runtime says about one kernel parameter (same names as the CUDA mapping).
enum class ParamQuery { Found, PastEnd, Unknown };
/// HIP 5.2 cannot tell a hipFunction_t's parameters (newer ROCm documents hipKernelGetParamInfo,
/// for hipKernel_t library handles, not the module functions this plugin loads): unchecked.
inline ParamQuery paramInfo(const Driver &, Function, size_t, size_t *) {
    return ParamQuery::Unknown;
}

inline bool hasGraphs(const Driver &d) {
    return d.hipStreamBeginCapture != nullptr && d.hipStreamEndCapture != nullptr &&
           d.hipGraphInstantiate != nullptr && d.hipGraphLaunch != nullptr &&
           d.hipGraphExecDestroy != nullptr && d.hipGraphDestroy != nullptr;
}
inline bool hasGraphUpdate(const Driver &d) { return d.hipGraphExecUpdate != nullptr; }
inline Call beginCapture(const Driver &d, Stream s) {
    return {d.hipStreamBeginCapture(s, hipStreamCaptureModeThreadLocal), "hipStreamBeginCapture"};
}
inline Call endCapture(const Driver &d, Stream s, Graph *g) {
    return {d.hipStreamEndCapture(s, g), "hipStreamEndCapture"};
}
inline Call graphInstantiate(const Driver &d, GraphExec *e, Graph g) {
    return {d.hipGraphInstantiate(e, g, nullptr, nullptr, 0), "hipGraphInstantiate"};
}
inline Call graphLaunch(const Driver &d, GraphExec e, Stream s) {
    return {d.hipGraphLaunch(e, s), "hipGraphLaunch"};
}
inline Call graphExecUpdate(const Driver &d, GraphExec e, Graph g, std::string *why) {
    hipGraphNode_t errorNode{};
    hipGraphExecUpdateResult result = hipGraphExecUpdateSuccess;
    const Result r = d.hipGraphExecUpdate(e, g, &errorNode, &result);
    switch (result) {
    case hipGraphExecUpdateSuccess: *why = ""; break;
    case hipGraphExecUpdateErrorTopologyChanged: *why = "the topology changed"; break;
    case hipGraphExecUpdateErrorNodeTypeChanged: *why = "a node type changed"; break;
    case hipGraphExecUpdateErrorFunctionChanged:
    case hipGraphExecUpdateErrorUnsupportedFunctionChange:
        *why = "a kernel changed";
        break;
    case hipGraphExecUpdateErrorParametersChanged:
        *why = "a node's parameters changed in a way it cannot take";
        break;
    default: *why = "hipGraphExecUpdateResult " + std::to_string(static_cast<int>(result));
    }
    return {r, "hipGraphExecUpdate"};
}
inline Call graphExecDestroy(const Driver &d, GraphExec e) {
    return {d.hipGraphExecDestroy(e), "hipGraphExecDestroy"};
}
inline Call graphDestroy(const Driver &d, Graph g) {
    return {d.hipGraphDestroy(g), "hipGraphDestroy"};
}

/// hiprtc 5.2 reads the target from --offload-arch (or --gpu-architecture); without it, it asks
/// the current device, which fails on a machine without an AMD GPU.
inline std::string archOption(const std::string &arch) { return "--offload-arch=" + arch; }
inline RtcResult rtcCreate(const Rtc &c, RtcProgram *p, const char *src, const char *name) {
    return c.hiprtcCreateProgram(p, src, name, 0, nullptr, nullptr);
}
inline RtcResult rtcDestroy(const Rtc &c, RtcProgram *p) { return c.hiprtcDestroyProgram(p); }
inline RtcResult rtcCompile(const Rtc &c, RtcProgram p, int n, const char *const *options) {
    return c.hiprtcCompileProgram(p, n, const_cast<const char **>(options));
}
inline RtcResult rtcLogSize(const Rtc &c, RtcProgram p, size_t *n) {
    return c.hiprtcGetProgramLogSize(p, n);
}
inline RtcResult rtcLog(const Rtc &c, RtcProgram p, char *log) {
    return c.hiprtcGetProgramLog(p, log);
}
inline RtcResult rtcCodeSize(const Rtc &c, RtcProgram p, size_t *n) {
    return c.hiprtcGetCodeSize(p, n);
}
inline RtcResult rtcCode(const Rtc &c, RtcProgram p, char *code) { return c.hiprtcGetCode(p, code); }

/// Named ranges for profilers: none on HIP yet (roctx is a library to link, not a header).
inline void rangePush(const char *) noexcept {}
inline void rangePop() noexcept {}
inline constexpr const char *kRangeApi = "";

} // namespace bpv
