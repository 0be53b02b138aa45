// RawCublas: cuBLAS (cublasSgemm through cublasGemmEx) and the CUDA driver API, opened with
// dlopen and declared here from cublas_api.h / cuda.h of CUDA 13 (the subset used).
#include "bench_cublas.hpp"

#include <dlfcn.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <vector>

namespace backplane::tool {
namespace {

using CUresult = int;
using CUdevice = int;
using CUcontext = struct CublasBenchContext *;
using CUstream = struct CublasBenchStream *;
using CUevent = struct CublasBenchEvent *;
using CUdeviceptr = unsigned long long;
struct CUuuid {
    char bytes[16];
};

using CublasStatus = int; // CUBLAS_STATUS_SUCCESS = 0
using CublasHandle = struct CublasBenchHandle *;
constexpr int kOpN = 0;                  // CUBLAS_OP_N
constexpr int kDefaultMath = 0;          // CUBLAS_DEFAULT_MATH
constexpr int kTf32Math = 3;             // CUBLAS_TF32_TENSOR_OP_MATH
constexpr int kR32F = 0;                 // CUDA_R_32F
constexpr int kR16F = 2;                 // CUDA_R_16F
constexpr int kR16BF = 14;               // CUDA_R_16BF
constexpr int kCompute32F = 68;          // CUBLAS_COMPUTE_32F
constexpr int kCompute32FFastTf32 = 77;  // CUBLAS_COMPUTE_32F_FAST_TF32
constexpr int kGemmDefault = -1;         // CUBLAS_GEMM_DEFAULT

struct Api {
    CUresult (*cuInit)(unsigned) = nullptr;
    CUresult (*cuDeviceGetCount)(int *) = nullptr;
    CUresult (*cuDeviceGet)(CUdevice *, int) = nullptr;
    CUresult (*cuDeviceGetUuid)(CUuuid *, CUdevice) = nullptr; // _v2
    CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *, CUdevice) = nullptr;
    CUresult (*cuDevicePrimaryCtxRelease)(CUdevice) = nullptr; // _v2
    CUresult (*cuCtxSetCurrent)(CUcontext) = nullptr;
    CUresult (*cuMemAlloc)(CUdeviceptr *, size_t) = nullptr;             // _v2
    CUresult (*cuMemFree)(CUdeviceptr) = nullptr;                        // _v2
    CUresult (*cuMemsetD16)(CUdeviceptr, unsigned short, size_t) = nullptr; // _v2
    CUresult (*cuStreamCreate)(CUstream *, unsigned) = nullptr;
    CUresult (*cuStreamDestroy)(CUstream) = nullptr; // _v2
    CUresult (*cuEventCreate)(CUevent *, unsigned) = nullptr;
    CUresult (*cuEventDestroy)(CUevent) = nullptr; // _v2
    CUresult (*cuEventRecord)(CUevent, CUstream) = nullptr;
    CUresult (*cuEventSynchronize)(CUevent) = nullptr;
    CUresult (*cuEventElapsedTime)(float *, CUevent, CUevent) = nullptr; // _v2

    CublasStatus (*create)(CublasHandle *) = nullptr;   // cublasCreate_v2
    CublasStatus (*destroy)(CublasHandle) = nullptr;    // cublasDestroy_v2
    CublasStatus (*setStream)(CublasHandle, CUstream) = nullptr; // cublasSetStream_v2
    CublasStatus (*setMathMode)(CublasHandle, int) = nullptr;
    CublasStatus (*getVersion)(CublasHandle, int *) = nullptr; // cublasGetVersion_v2
    CublasStatus (*gemmEx)(CublasHandle, int, int, int, int, int, const void *, const void *, int,
                           int, const void *, int, int, const void *, void *, int, int, int,
                           int) = nullptr;
};

template <class Slot> void bind(Slot &slot, void *library, const char *name, const char *from) {
    void *address = ::dlsym(library, name);
    if (address == nullptr) throw std::runtime_error(std::string(from) + " has no " + name);
    slot = reinterpret_cast<Slot>(address);
}

void check(CUresult r, const char *call) {
    if (r != 0) throw std::runtime_error(std::string(call) + " failed (CUresult " + std::to_string(r) + ")");
}
void checkBlas(CublasStatus s, const char *call) {
    if (s != 0) throw std::runtime_error(std::string(call) + " failed (cublasStatus " + std::to_string(s) + ")");
}

} // namespace

const char *toString(GemmKind kind) {
    switch (kind) {
    case GemmKind::F32: return "f32";
    case GemmKind::Tf32: return "tf32";
    case GemmKind::F16: return "f16";
    case GemmKind::Bf16: return "bf16";
    }
    return "?";
}

struct RawCublas::State {
    Api api;
    void *cuda = nullptr, *blas = nullptr;
    CUdevice device = 0;
    CUcontext context = nullptr;
    bool retained = false;
    CUstream stream = nullptr;
    CublasHandle handle = nullptr;
    CUevent begin = nullptr, end = nullptr;
    std::vector<CUdeviceptr> buffers;
    size_t capacity = 0; ///< bytes of each of buffers[0..2]
    std::string library;

    ~State() {
        if (context != nullptr) api.cuCtxSetCurrent(context);
        if (handle != nullptr) api.destroy(handle);
        for (CUdeviceptr p : buffers) api.cuMemFree(p);
        if (begin != nullptr) api.cuEventDestroy(begin);
        if (end != nullptr) api.cuEventDestroy(end);
        if (stream != nullptr) api.cuStreamDestroy(stream);
        if (retained) api.cuDevicePrimaryCtxRelease(device);
        if (blas != nullptr) ::dlclose(blas);
        if (cuda != nullptr) ::dlclose(cuda);
    }

    /// Three buffers of at least `bytes` each, filled with small values (0x3c00: 1.0 in f16; in
    /// bf16 and f32 words a small normal number), so the products stay finite.
    void reserve(size_t bytes) {
        if (bytes <= capacity) return;
        for (CUdeviceptr p : buffers) api.cuMemFree(p);
        buffers.clear();
        capacity = 0;
        for (int i = 0; i < 3; ++i) {
            CUdeviceptr p = 0;
            check(api.cuMemAlloc(&p, bytes), "cuMemAlloc");
            buffers.push_back(p);
            check(api.cuMemsetD16(p, 0x3c00, bytes / 2), "cuMemsetD16");
        }
        capacity = bytes;
    }
};

RawCublas::RawCublas(const std::array<uint8_t, 16> &uuid) : state_(std::make_unique<State>()) {
    State &s = *state_;
    Api &a = s.api;
    s.cuda = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (s.cuda == nullptr) throw std::runtime_error("libcuda.so.1 not found");
    for (const char *name : {"libcublas.so.13", "libcublas.so.12", "libcublas.so"}) {
        s.blas = ::dlopen(name, RTLD_NOW | RTLD_LOCAL);
        if (s.blas != nullptr) {
            s.library = name;
            break;
        }
    }
    if (s.blas == nullptr)
        throw std::runtime_error("libcublas.so.13 not found (install the CUDA toolkit's cuBLAS, "
                                 "or put it on LD_LIBRARY_PATH)");
    bind(a.cuInit, s.cuda, "cuInit", "libcuda.so.1");
    bind(a.cuDeviceGetCount, s.cuda, "cuDeviceGetCount", "libcuda.so.1");
    bind(a.cuDeviceGet, s.cuda, "cuDeviceGet", "libcuda.so.1");
    bind(a.cuDeviceGetUuid, s.cuda, "cuDeviceGetUuid_v2", "libcuda.so.1");
    bind(a.cuDevicePrimaryCtxRetain, s.cuda, "cuDevicePrimaryCtxRetain", "libcuda.so.1");
    bind(a.cuDevicePrimaryCtxRelease, s.cuda, "cuDevicePrimaryCtxRelease_v2", "libcuda.so.1");
    bind(a.cuCtxSetCurrent, s.cuda, "cuCtxSetCurrent", "libcuda.so.1");
    bind(a.cuMemAlloc, s.cuda, "cuMemAlloc_v2", "libcuda.so.1");
    bind(a.cuMemFree, s.cuda, "cuMemFree_v2", "libcuda.so.1");
    bind(a.cuMemsetD16, s.cuda, "cuMemsetD16_v2", "libcuda.so.1");
    bind(a.cuStreamCreate, s.cuda, "cuStreamCreate", "libcuda.so.1");
    bind(a.cuStreamDestroy, s.cuda, "cuStreamDestroy_v2", "libcuda.so.1");
    bind(a.cuEventCreate, s.cuda, "cuEventCreate", "libcuda.so.1");
    bind(a.cuEventDestroy, s.cuda, "cuEventDestroy_v2", "libcuda.so.1");
    bind(a.cuEventRecord, s.cuda, "cuEventRecord", "libcuda.so.1");
    bind(a.cuEventSynchronize, s.cuda, "cuEventSynchronize", "libcuda.so.1");
    bind(a.cuEventElapsedTime, s.cuda, "cuEventElapsedTime_v2", "libcuda.so.1");
    const char *lib = s.library.c_str();
    bind(a.create, s.blas, "cublasCreate_v2", lib);
    bind(a.destroy, s.blas, "cublasDestroy_v2", lib);
    bind(a.setStream, s.blas, "cublasSetStream_v2", lib);
    bind(a.setMathMode, s.blas, "cublasSetMathMode", lib);
    bind(a.getVersion, s.blas, "cublasGetVersion_v2", lib);
    bind(a.gemmEx, s.blas, "cublasGemmEx", lib);

    check(a.cuInit(0), "cuInit");
    int count = 0;
    check(a.cuDeviceGetCount(&count), "cuDeviceGetCount");
    bool found = false;
    for (int i = 0; i < count && !found; ++i) {
        CUdevice d = 0;
        CUuuid id{};
        check(a.cuDeviceGet(&d, i), "cuDeviceGet");
        check(a.cuDeviceGetUuid(&id, d), "cuDeviceGetUuid");
        if (std::memcmp(id.bytes, uuid.data(), 16) == 0) {
            s.device = d;
            found = true;
        }
    }
    if (!found) throw std::runtime_error("no CUDA device has this GPU's UUID");
    check(a.cuDevicePrimaryCtxRetain(&s.context, s.device), "cuDevicePrimaryCtxRetain");
    s.retained = true;
    check(a.cuCtxSetCurrent(s.context), "cuCtxSetCurrent");
    check(a.cuStreamCreate(&s.stream, 0x1), "cuStreamCreate");
    check(a.cuEventCreate(&s.begin, 0), "cuEventCreate");
    check(a.cuEventCreate(&s.end, 0), "cuEventCreate");
    checkBlas(a.create(&s.handle), "cublasCreate");
    checkBlas(a.setStream(s.handle, s.stream), "cublasSetStream");
    int version = 0;
    a.getVersion(s.handle, &version);
    s.library += " (cuBLAS " + std::to_string(version) + ")";
}

RawCublas::~RawCublas() = default;

const std::string &RawCublas::library() const { return state_->library; }

double RawCublas::gemmMs(GemmKind kind, uint32_t m, uint32_t n, uint32_t k, int samples) {
    State &s = *state_;
    Api &a = s.api;
    check(a.cuCtxSetCurrent(s.context), "cuCtxSetCurrent");
    const size_t element = kind == GemmKind::F16 || kind == GemmKind::Bf16 ? 2 : 4;
    s.reserve(element * std::max({size_t{m} * k, size_t{k} * n, size_t{m} * n * 2}));
    const int data = kind == GemmKind::F16 ? kR16F : kind == GemmKind::Bf16 ? kR16BF : kR32F;
    const int compute = kind == GemmKind::Tf32 ? kCompute32FFastTf32 : kCompute32F;
    checkBlas(a.setMathMode(s.handle, kind == GemmKind::Tf32 ? kTf32Math : kDefaultMath),
              "cublasSetMathMode");
    const float alpha = 1.0f, beta = 0.0f;
    // Row-major C = A * B is column-major C^T = B^T * A^T: the operands swap, no transposes.
    const auto gemm = [&] {
        checkBlas(a.gemmEx(s.handle, kOpN, kOpN, static_cast<int>(n), static_cast<int>(m),
                           static_cast<int>(k), &alpha, reinterpret_cast<const void *>(s.buffers[1]),
                           data, static_cast<int>(n), reinterpret_cast<const void *>(s.buffers[0]),
                           data, static_cast<int>(k), &beta, reinterpret_cast<void *>(s.buffers[2]),
                           kR32F, static_cast<int>(n), compute, kGemmDefault),
                  "cublasGemmEx");
    };
    for (int w = 0; w < 3; ++w) gemm();
    std::vector<double> times;
    for (int i = 0; i < samples; ++i) {
        check(a.cuEventRecord(s.begin, s.stream), "cuEventRecord");
        gemm();
        check(a.cuEventRecord(s.end, s.stream), "cuEventRecord");
        check(a.cuEventSynchronize(s.end), "cuEventSynchronize");
        float ms = 0;
        check(a.cuEventElapsedTime(&ms, s.begin, s.end), "cuEventElapsedTime");
        times.push_back(ms);
    }
    std::sort(times.begin(), times.end());
    return times[times.size() / 2];
}

} // namespace backplane::tool
