// Vendor mapping of the shared GPU plugin sources onto the CUDA driver API and NVRTC.
#pragma once

// plugins/hip/vendor.hpp maps the same names onto the HIP runtime and hiprtc. The shared sources
// (plugins/cuda/gpu_*.cpp) see only what this header defines in namespace bpv:
// - types and constants (Result, DevicePtr, Stream, ...), names for messages;
// - BPV_DRIVER_FUNCTIONS / BPV_RTC_FUNCTIONS: the vendor symbols resolved with dlsym into the
//   Driver / Rtc tables (a symbol macro such as cuMemAlloc -> cuMemAlloc_v2 expands before it is
//   stringified, so the versioned entry point is the one looked up);
// - BPV_OPTIONAL_DRIVER_FUNCTIONS: symbols of newer drivers only, left NULL when absent;
// - thin inline wrappers with one signature for both vendors.
// Only headers are used at build time: the libraries are opened at run time (gpu_library.cpp).

#include <cuda.h>
#include <nvrtc.h>
#if __has_include(<nvtx3/nvToolsExt.h>)
#include <nvtx3/nvToolsExt.h> // header-only: loads a tool (Nsight Systems) only when one is attached
#define BPV_NVTX 1
#endif

#include <cstdint>
#include <cstring>
#include <string>

namespace bpv {

using Result = CUresult;
using DeviceId = CUdevice;
using Context = CUcontext;
using DevicePtr = CUdeviceptr;
using Stream = CUstream;
using Event = CUevent;
using Module = CUmodule;
using Function = CUfunction;
using Graph = CUgraph;
using GraphExec = CUgraphExec;
using RtcResult = nvrtcResult;
using RtcProgram = nvrtcProgram;

/// Plugin identity and the words used in messages.
inline constexpr const char *kPluginName = "cuda";
inline constexpr const char *kPluginVersion = "0.1.0";
inline constexpr const char *kVendorName = "NVIDIA";
inline constexpr const char *kApiName = "CUDA";
inline constexpr const char *kDriverDescription = "CUDA driver";
inline constexpr const char *kRtcName = "NVRTC";
/// The dialect compiled natively (the other one is refused).
inline constexpr uint32_t kDialects = 1u << 0; // BP_DIALECT_CUDA

/// Library candidates, tried in order. The driver ships with the kernel module; NVRTC with the
/// toolkit (a versioned soname first; the toolkit directory as a last resort).
inline constexpr const char *kDriverLibraries[] = {"libcuda.so.1"};
inline constexpr const char *kRtcLibraries[] = {
    "libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so",
#ifdef BPV_TOOLKIT_LIB_DIR
    BPV_TOOLKIT_LIB_DIR "/libnvrtc.so",
#endif
};

/// The collective library, opened at run time by gpu_collectives.cpp: its name in messages, in
/// bp_device_info::collectives and as the plugin options key ({"nccl": {"library": PATH}}), the
/// soname opened by default, and the environment variable that overrides the path.
inline constexpr const char *kCollectivesName = "nccl";
/// The options schema the plugin publishes (ABI 1.5; gpu_options.cpp parses the same).
inline constexpr const char *kOptionsSchema =
    R"schema({"type": "object", "additionalProperties": false, "properties": {"nccl": {"type": "object", "additionalProperties": false, "description": "the collectives library", "properties": {"library": {"type": "string", "maxLength": 4095, "description": "path or soname of NCCL (default: libnccl.so.2)"}}}}})schema";
inline constexpr const char *kCollectivesProduct = "NCCL";
inline constexpr const char *kCollectivesLibrary = "libnccl.so.2";
inline constexpr const char *kCollectivesEnvironment = "BACKPLANE_NCCL_LIBRARY";

inline constexpr Result kSuccess = CUDA_SUCCESS;
inline constexpr Result kNotReady = CUDA_ERROR_NOT_READY;
inline constexpr Result kNoDevice = CUDA_ERROR_NO_DEVICE;
inline constexpr Result kNotFound = CUDA_ERROR_NOT_FOUND;
inline constexpr RtcResult kRtcSuccess = NVRTC_SUCCESS;

/// A vendor call's result and the name of the vendor function, for error messages.
struct Call {
    Result result;
    const char *name;
    bool ok() const { return result == CUDA_SUCCESS; }
};

/// Driver entry points resolved at run time. X(symbol), or XT(symbol, type) for an overloaded one.
#define BPV_DRIVER_FUNCTIONS(X, XT)                                                                    \
    X(cuInit)                                                                                      \
    X(cuDriverGetVersion)                                                                          \
    X(cuGetErrorName)                                                                              \
    X(cuGetErrorString)                                                                            \
    X(cuDeviceGetCount)                                                                            \
    X(cuDeviceGet)                                                                                 \
    X(cuDeviceGetName)                                                                             \
    X(cuDeviceGetUuid)                                                                             \
    X(cuDeviceGetAttribute)                                                                        \
    X(cuDeviceTotalMem)                                                                            \
    X(cuDeviceGetPCIBusId)                                                                         \
    X(cuDeviceCanAccessPeer)                                                                       \
    X(cuDevicePrimaryCtxRetain)                                                                    \
    X(cuDevicePrimaryCtxRelease)                                                                   \
    X(cuCtxGetCurrent)                                                                             \
    X(cuCtxSetCurrent)                                                                             \
    X(cuCtxEnablePeerAccess)                                                                       \
    X(cuMemAlloc)                                                                                  \
    X(cuMemFree)                                                                                   \
    X(cuMemHostAlloc)                                                                              \
    X(cuMemFreeHost)                                                                               \
    X(cuStreamCreate)                                                                              \
    X(cuStreamDestroy)                                                                             \
    X(cuStreamSynchronize)                                                                         \
    X(cuStreamWaitEvent)                                                                           \
    X(cuEventCreate)                                                                               \
    X(cuEventDestroy)                                                                              \
    X(cuEventRecord)                                                                               \
    X(cuEventQuery)                                                                                \
    X(cuEventSynchronize)                                                                          \
    X(cuEventElapsedTime)                                                                          \
    X(cuMemcpyHtoDAsync)                                                                           \
    X(cuMemcpyDtoHAsync)                                                                           \
    X(cuMemcpyDtoDAsync)                                                                           \
    X(cuMemcpyPeerAsync)                                                                           \
    X(cuMemsetD32Async)                                                                            \
    X(cuModuleLoadData)                                                                            \
    X(cuModuleUnload)                                                                              \
    X(cuModuleGetFunction)                                                                         \
    X(cuFuncSetAttribute)                                                                          \
    X(cuLaunchKernel)                                                                              \
    X(cuMemHostRegister)                                                                           \
    X(cuMemHostUnregister)

/// Driver entry points that older drivers lack: NULL in the table when absent, and the wrappers
/// that use them report "unknown" instead of failing. X(symbol).
/// cuFuncGetParamInfo: CUDA 12.4+ drivers; the launch check of the kernel's parameters.
/// Graphs (hasGraphs, hasGraphUpdate): without them graph_create / graph_update are unsupported
/// and the core replays the ops. The macros of cuda.h pick the current versions:
/// cuStreamBeginCapture_v2, cuGraphInstantiateWithFlags (11.4+), cuGraphExecUpdate_v2 (12.0+).
#define BPV_OPTIONAL_DRIVER_FUNCTIONS(X)                                                           \
    X(cuFuncGetParamInfo)                                                                          \
    X(cuStreamBeginCapture)                                                                        \
    X(cuStreamEndCapture)                                                                          \
    X(cuGraphInstantiate)                                                                          \
    X(cuGraphLaunch)                                                                               \
    X(cuGraphExecUpdate)                                                                           \
    X(cuGraphExecDestroy)                                                                          \
    X(cuGraphDestroy)

/// Compiler entry points resolved at run time. X(symbol).
#define BPV_RTC_FUNCTIONS(X)                                                                       \
    X(nvrtcGetErrorString)                                                                         \
    X(nvrtcVersion)                                                                                \
    X(nvrtcCreateProgram)                                                                          \
    X(nvrtcDestroyProgram)                                                                         \
    X(nvrtcCompileProgram)                                                                         \
    X(nvrtcGetProgramLogSize)                                                                      \
    X(nvrtcGetProgramLog)                                                                          \
    X(nvrtcGetCUBINSize)                                                                           \
    X(nvrtcGetCUBIN)

#define BPV_DECLARE_MEMBER(symbol) decltype(&::symbol) symbol = nullptr;
#define BPV_DECLARE_TYPED_MEMBER(symbol, type) type symbol = nullptr;

/// The driver's function table (filled by gpu_library.cpp).
struct Driver {
    BPV_DRIVER_FUNCTIONS(BPV_DECLARE_MEMBER, BPV_DECLARE_TYPED_MEMBER)
    BPV_OPTIONAL_DRIVER_FUNCTIONS(BPV_DECLARE_MEMBER)
};

/// The compiler's function table.
struct Rtc {
    BPV_RTC_FUNCTIONS(BPV_DECLARE_MEMBER)
};

/// Device attributes the shared code reads.
enum class Attribute {
    MaxBlockDimX = CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X,
    MaxBlockDimY = CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y,
    MaxBlockDimZ = CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z,
    MaxThreadsPerBlock = CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
    MaxGridDimX = CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X,
    MaxGridDimY = CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y,
    MaxGridDimZ = CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z,
    MaxSharedMemoryPerBlock = CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
    WarpSize = CU_DEVICE_ATTRIBUTE_WARP_SIZE,
    Integrated = CU_DEVICE_ATTRIBUTE_INTEGRATED,
    ComputeCapabilityMajor = CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
    ComputeCapabilityMinor = CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
};

/// The plugin reports the matrix shapes the kernel language lowers to PTX mma.sync
/// (bp_device_info::matrix_shapes) by compute capability.
inline constexpr bool kWmmaShapes = true;

/// Error classes the shared translation (gpu_error.cpp) needs to tell apart.
/// cuInit's answer on a machine with the driver but no usable GPU.
inline bool isNoDevice(Result r) { return r == CUDA_ERROR_NO_DEVICE; }
inline bool isOutOfMemory(Result r) { return r == CUDA_ERROR_OUT_OF_MEMORY; }
/// Sticky errors that a kernel's fault caused: after one the driver keeps the device unusable
/// for the rest of the process (measured: docs/measurements/h200-2026-11-28-s4-cuda-sticky-
/// fault.txt). Not the other sticky answers (a device another process holds, a context another
/// library destroyed), after which a later open may work.
inline bool isFault(Result r) {
    switch (r) {
    case CUDA_ERROR_ILLEGAL_ADDRESS:
    case CUDA_ERROR_LAUNCH_FAILED:
    case CUDA_ERROR_ECC_UNCORRECTABLE:
    case CUDA_ERROR_HARDWARE_STACK_ERROR:
    case CUDA_ERROR_ILLEGAL_INSTRUCTION:
    case CUDA_ERROR_MISALIGNED_ADDRESS:
    case CUDA_ERROR_INVALID_ADDRESS_SPACE:
    case CUDA_ERROR_INVALID_PC:
    case CUDA_ERROR_ASSERT:
    case CUDA_ERROR_LAUNCH_TIMEOUT:
        return true;
    default:
        return false;
    }
}
/// Errors after which the context is unusable (CUDA documents them as sticky): a kernel's
/// fault, a context another library destroyed, a device another process holds.
inline bool isSticky(Result r) {
    return isFault(r) || r == CUDA_ERROR_CONTEXT_IS_DESTROYED || r == CUDA_ERROR_DEVICE_UNAVAILABLE;
}
/// Errors of a launch that the caller's arguments caused (block too large, resources).
inline bool isLaunchError(Result r) {
    return r == CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES || r == CUDA_ERROR_INVALID_VALUE ||
           r == CUDA_ERROR_INVALID_IMAGE;
}

inline std::string errorName(const Driver &d, Result r) {
    const char *name = nullptr;
    if (d.cuGetErrorName == nullptr || d.cuGetErrorName(r, &name) != CUDA_SUCCESS || !name)
        return "CUresult " + std::to_string(static_cast<int>(r));
    return name;
}
inline std::string errorString(const Driver &d, Result r) {
    const char *text = nullptr;
    if (d.cuGetErrorString == nullptr || d.cuGetErrorString(r, &text) != CUDA_SUCCESS || !text)
        return "unknown error";
    return text;
}
inline std::string rtcErrorString(const Rtc &c, RtcResult r) {
    return c.nvrtcGetErrorString ? c.nvrtcGetErrorString(r) : "NVRTC error";
}

/// cuDriverGetVersion's 13000 -> "13.0".
inline std::string versionString(int v) {
    return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}

// --- device queries (no context needed) ------------------------------------------------------
inline Call init(const Driver &d) {
    return {d.cuInit(0), "cuInit"};
}
inline Call driverVersion(const Driver &d, int *v) {
    return {d.cuDriverGetVersion(v), "cuDriverGetVersion"};
}
inline Call deviceCount(const Driver &d, int *n) {
    return {d.cuDeviceGetCount(n), "cuDeviceGetCount"};
}
inline Call deviceGet(const Driver &d, DeviceId *dev, int ordinal) {
    return {d.cuDeviceGet(dev, ordinal), "cuDeviceGet"};
}
inline Call deviceName(const Driver &d, char *name, int len, DeviceId dev) {
    return {d.cuDeviceGetName(name, len, dev), "cuDeviceGetName"};
}
inline Call deviceUuid(const Driver &d, uint8_t (&out)[16], DeviceId dev) {
    CUuuid u{};
    const Result r = d.cuDeviceGetUuid(&u, dev);
    std::memcpy(out, u.bytes, 16);
    return {r, "cuDeviceGetUuid"};
}
inline Call deviceAttribute(const Driver &d, int *value, Attribute a, DeviceId dev) {
    return {d.cuDeviceGetAttribute(value, static_cast<CUdevice_attribute>(a), dev), "cuDeviceGetAttribute"};
}
inline Call deviceTotalMem(const Driver &d, size_t *bytes, DeviceId dev) {
    return {d.cuDeviceTotalMem(bytes, dev), "cuDeviceTotalMem"};
}
inline Call devicePciBusId(const Driver &d, char *id, int len, DeviceId dev) {
    return {d.cuDeviceGetPCIBusId(id, len, dev), "cuDeviceGetPCIBusId"};
}
inline Call canAccessPeer(const Driver &d, int *can, DeviceId dev, DeviceId peer) {
    return {d.cuDeviceCanAccessPeer(can, dev, peer), "cuDeviceCanAccessPeer"};
}
/// The exact compile target: "sm_90" from the compute capability.
inline Call deviceArch(const Driver &d, std::string *arch, DeviceId dev) {
    int major = 0, minor = 0;
    Result r = d.cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev);
    if (r == CUDA_SUCCESS)
        r = d.cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev);
    *arch = "sm_" + std::to_string(major) + std::to_string(minor);
    return {r, "cuDeviceGetAttribute"};
}

// --- contexts -----------------------------------------------------------------------------------
inline Call contextRetain(const Driver &d, Context *ctx, DeviceId dev) {
    return {d.cuDevicePrimaryCtxRetain(ctx, dev), "cuDevicePrimaryCtxRetain"};
}
inline Call contextRelease(const Driver &d, Context, DeviceId dev) {
    return {d.cuDevicePrimaryCtxRelease(dev), "cuDevicePrimaryCtxRelease"};
}
inline Call contextCurrent(const Driver &d, Context *ctx) {
    return {d.cuCtxGetCurrent(ctx), "cuCtxGetCurrent"};
}
inline Call contextSetCurrent(const Driver &d, Context ctx) {
    return {d.cuCtxSetCurrent(ctx), "cuCtxSetCurrent"};
}
/// Lets the current context read `peer`'s memory; already-enabled is not an error.
inline Call enablePeerAccess(const Driver &d, Context peer) {
    const Result r = d.cuCtxEnablePeerAccess(peer, 0);
    return {r == CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED ? CUDA_SUCCESS : r, "cuCtxEnablePeerAccess"};
}

// --- memory -------------------------------------------------------------------------------------
inline Call memAlloc(const Driver &d, DevicePtr *p, size_t size) {
    return {d.cuMemAlloc(p, size), "cuMemAlloc"};
}
inline Call memFree(const Driver &d, DevicePtr p) {
    return {d.cuMemFree(p), "cuMemFree"};
}
/// Pinned, mapped into the device address space, usable from every context.
inline Call hostAlloc(const Driver &d, void **p, size_t size) {
    return {d.cuMemHostAlloc(p, size, CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP), "cuMemHostAlloc"};
}
inline Call hostFree(const Driver &d, void *p) {
    return {d.cuMemFreeHost(p), "cuMemFreeHost"};
}
/// Page-locks the application's range (ABI 1.3 memory_register) for every context, mapped like
/// hostAlloc's pages.
inline Call hostRegister(const Driver &d, void *p, size_t size) {
    return {d.cuMemHostRegister(p, size, CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP),
            "cuMemHostRegister"};
}
inline Call hostUnregister(const Driver &d, void *p) {
    return {d.cuMemHostUnregister(p), "cuMemHostUnregister"};
}
inline DevicePtr offsetPtr(DevicePtr p, uint64_t offset) { return p + offset; }
/// Pinned host pages are addressable from the device at the same address (unified addressing).
inline DevicePtr fromHostPtr(void *p) { return reinterpret_cast<DevicePtr>(p); }
inline uint64_t ptrValue(DevicePtr p) { return static_cast<uint64_t>(p); }

// --- streams and events -------------------------------------------------------------------------
inline Call streamCreate(const Driver &d, Stream *s) {
    return {d.cuStreamCreate(s, CU_STREAM_NON_BLOCKING), "cuStreamCreate"};
}
inline Call streamDestroy(const Driver &d, Stream s) {
    return {d.cuStreamDestroy(s), "cuStreamDestroy"};
}
inline Call streamSynchronize(const Driver &d, Stream s) {
    return {d.cuStreamSynchronize(s), "cuStreamSynchronize"};
}
inline Call streamWaitEvent(const Driver &d, Stream s, Event e) {
    return {d.cuStreamWaitEvent(s, e, 0), "cuStreamWaitEvent"};
}
inline Call eventCreate(const Driver &d, Event *e, bool timing) {
    return {d.cuEventCreate(e, timing ? CU_EVENT_DEFAULT : CU_EVENT_DISABLE_TIMING), "cuEventCreate"};
}
inline Call eventDestroy(const Driver &d, Event e) {
    return {d.cuEventDestroy(e), "cuEventDestroy"};
}
inline Call eventRecord(const Driver &d, Event e, Stream s) {
    return {d.cuEventRecord(e, s), "cuEventRecord"};
}
inline Call eventQuery(const Driver &d, Event e) {
    return {d.cuEventQuery(e), "cuEventQuery"};
}
inline Call eventSynchronize(const Driver &d, Event e) {
    return {d.cuEventSynchronize(e), "cuEventSynchronize"};
}
inline Call eventElapsedMs(const Driver &d, float *ms, Event start, Event end) {
    return {d.cuEventElapsedTime(ms, start, end), "cuEventElapsedTime"};
}

// --- transfers ----------------------------------------------------------------------------------
inline Call copyHtoD(const Driver &d, DevicePtr dst, const void *src, size_t n, Stream s) {
    return {d.cuMemcpyHtoDAsync(dst, src, n, s), "cuMemcpyHtoDAsync"};
}
inline Call copyDtoH(const Driver &d, void *dst, DevicePtr src, size_t n, Stream s) {
    return {d.cuMemcpyDtoHAsync(dst, src, n, s), "cuMemcpyDtoHAsync"};
}
inline Call copyDtoD(const Driver &d, DevicePtr dst, DevicePtr src, size_t n, Stream s) {
    return {d.cuMemcpyDtoDAsync(dst, src, n, s), "cuMemcpyDtoDAsync"};
}
inline Call copyPeer(const Driver &d, DevicePtr dst, Context dstCtx, DeviceId, DevicePtr src,
                       Context srcCtx, DeviceId, size_t n, Stream s) {
    return {d.cuMemcpyPeerAsync(dst, dstCtx, src, srcCtx, n, s), "cuMemcpyPeerAsync"};
}
inline Call fillD32(const Driver &d, DevicePtr dst, uint32_t pattern, size_t count, Stream s) {
    return {d.cuMemsetD32Async(dst, pattern, count, s), "cuMemsetD32Async"};
}

// --- modules and launches -----------------------------------------------------------------------
inline Call moduleLoad(const Driver &d, Module *m, const void *image) {
    return {d.cuModuleLoadData(m, image), "cuModuleLoadData"};
}
inline Call moduleUnload(const Driver &d, Module m) {
    return {d.cuModuleUnload(m), "cuModuleUnload"};
}
inline Call moduleFunction(const Driver &d, Function *f, Module m, const char *name) {
    return {d.cuModuleGetFunction(f, m, name), "cuModuleGetFunction"};
}
/// Allows `bytes` of dynamic shared memory (above the default 48 KiB, an opt-in on NVIDIA).
inline Call allowDynamicShared(const Driver &d, Function f, uint32_t bytes) {
    return {d.cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                static_cast<int>(bytes)), "cuFuncSetAttribute"};
}
inline Call launch(const Driver &d, Function f, const uint32_t (&grid)[3],
                     const uint32_t (&block)[3], uint32_t sharedBytes, Stream s, void **params) {
    return {d.cuLaunchKernel(f, grid[0], grid[1], grid[2], block[0], block[1], block[2], sharedBytes,
                            s, params, nullptr), "cuLaunchKernel"};
}

/// What the driver says about one kernel parameter.
enum class ParamQuery {
    Found,   ///< *size is the parameter's size in the device-side parameter layout
    PastEnd, ///< the kernel has no parameter of this index (the count is the index)
    Unknown, ///< the driver cannot tell (too old, or not for this kernel): do not check
};
/// Size of the kernel's parameter `index`, through cuFuncGetParamInfo (CUDA 12.4+ drivers).
inline ParamQuery paramInfo(const Driver &d, Function f, size_t index, size_t *size) {
    if (d.cuFuncGetParamInfo == nullptr) return ParamQuery::Unknown;
    size_t offset = 0;
    const Result r = d.cuFuncGetParamInfo(f, index, &offset, size);
    if (r == CUDA_SUCCESS) return ParamQuery::Found;
    // The documented answer for an index at or past the parameter count. Anything else
    // (CUDA_ERROR_NOT_SUPPORTED, ...) leaves the kernel unchecked.
    if (r == CUDA_ERROR_INVALID_VALUE) return ParamQuery::PastEnd;
    return ParamQuery::Unknown;
}

// --- graphs (stream capture) ---------------------------------------------------------------------
/// Whether the driver can capture, instantiate, launch and destroy graphs.
inline bool hasGraphs(const Driver &d) {
    return d.cuStreamBeginCapture != nullptr && d.cuStreamEndCapture != nullptr &&
           d.cuGraphInstantiate != nullptr && d.cuGraphLaunch != nullptr &&
           d.cuGraphExecDestroy != nullptr && d.cuGraphDestroy != nullptr;
}
/// Whether an instantiated graph can take the parameters of a new capture in place.
inline bool hasGraphUpdate(const Driver &d) { return d.cuGraphExecUpdate != nullptr; }
/// Starts capturing `s`. Thread-local mode: only this thread's capture-unsafe calls are refused,
/// other threads of the process keep working.
inline Call beginCapture(const Driver &d, Stream s) {
    return {d.cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), "cuStreamBeginCapture"};
}
/// Ends the capture of `s`; *g is the captured graph, or NULL when the capture was invalidated.
inline Call endCapture(const Driver &d, Stream s, Graph *g) {
    return {d.cuStreamEndCapture(s, g), "cuStreamEndCapture"};
}
inline Call graphInstantiate(const Driver &d, GraphExec *e, Graph g) {
    return {d.cuGraphInstantiate(e, g, 0), "cuGraphInstantiate"};
}
inline Call graphLaunch(const Driver &d, GraphExec e, Stream s) {
    return {d.cuGraphLaunch(e, s), "cuGraphLaunch"};
}
/// Gives `e` the parameters of `g` (captured from the same sequence of operations); on a refusal
/// `*why` says what the driver could not change, and `e` is unchanged.
inline Call graphExecUpdate(const Driver &d, GraphExec e, Graph g, std::string *why) {
    CUgraphExecUpdateResultInfo info{};
    const Result r = d.cuGraphExecUpdate(e, g, &info);
    switch (info.result) {
    case CU_GRAPH_EXEC_UPDATE_SUCCESS: *why = ""; break;
    case CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED: *why = "the topology changed"; break;
    case CU_GRAPH_EXEC_UPDATE_ERROR_NODE_TYPE_CHANGED: *why = "a node type changed"; break;
    case CU_GRAPH_EXEC_UPDATE_ERROR_FUNCTION_CHANGED:
    case CU_GRAPH_EXEC_UPDATE_ERROR_UNSUPPORTED_FUNCTION_CHANGE:
        *why = "a kernel changed";
        break;
    case CU_GRAPH_EXEC_UPDATE_ERROR_PARAMETERS_CHANGED:
        *why = "a node's parameters changed in a way it cannot take";
        break;
    default: *why = "CUgraphExecUpdateResult " + std::to_string(static_cast<int>(info.result));
    }
    return {r, "cuGraphExecUpdate"};
}
inline Call graphExecDestroy(const Driver &d, GraphExec e) {
    return {d.cuGraphExecDestroy(e), "cuGraphExecDestroy"};
}
inline Call graphDestroy(const Driver &d, Graph g) {
    return {d.cuGraphDestroy(g), "cuGraphDestroy"};
}

// --- runtime compilation ------------------------------------------------------------------------
/// The option that selects the exact target ("sm_90" -> real CUBIN for sm_90, not PTX).
inline std::string archOption(const std::string &arch) { return "--gpu-architecture=" + arch; }
inline RtcResult rtcCreate(const Rtc &c, RtcProgram *p, const char *src, const char *name) {
    return c.nvrtcCreateProgram(p, src, name, 0, nullptr, nullptr);
}
inline RtcResult rtcDestroy(const Rtc &c, RtcProgram *p) { return c.nvrtcDestroyProgram(p); }
inline RtcResult rtcCompile(const Rtc &c, RtcProgram p, int n, const char *const *options) {
    return c.nvrtcCompileProgram(p, n, options);
}
inline RtcResult rtcLogSize(const Rtc &c, RtcProgram p, size_t *n) {
    return c.nvrtcGetProgramLogSize(p, n);
}
inline RtcResult rtcLog(const Rtc &c, RtcProgram p, char *log) {
    return c.nvrtcGetProgramLog(p, log);
}
inline RtcResult rtcCodeSize(const Rtc &c, RtcProgram p, size_t *n) {
    return c.nvrtcGetCUBINSize(p, n);
}
inline RtcResult rtcCode(const Rtc &c, RtcProgram p, char *code) { return c.nvrtcGetCUBIN(p, code); }

/// Named ranges for profilers (NVTX): without an attached tool each call is one indirect call
/// to an empty function; with one (NVTX_INJECTION64_PATH, set by `nsys profile`) the work the
/// plugin submits inside a range is shown under its name.
#ifdef BPV_NVTX
inline void rangePush(const char *name) noexcept { nvtxRangePushA(name); }
inline void rangePop() noexcept { nvtxRangePop(); }
inline constexpr const char *kRangeApi = "NVTX";
#else
inline void rangePush(const char *) noexcept {}
inline void rangePop() noexcept {}
inline constexpr const char *kRangeApi = "";
#endif

} // namespace bpv
