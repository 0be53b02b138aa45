// The raw cuBLAS reference of `backplane bench kernels`: what a user would pick instead of a
// portable matmul on an NVIDIA GPU, measured in the same process (bench_cublas.cpp).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>

namespace backplane::tool {

/// The GEMM precisions measured: f32 (SGEMM, f32 FMA), TF32 tensor cores (f32 data), and f16 /
/// bf16 data with f32 accumulation (cublasGemmEx).
enum class GemmKind { F32, Tf32, F16, Bf16 };
const char *toString(GemmKind kind);

/// libcublas and libcuda opened with dlopen (the tool links neither) on the CUDA device whose
/// UUID is `uuid`, with its own stream and buffers; row-major C (m x n) = A (m x k) * B (k x n).
/// Every call throws std::runtime_error naming what failed; construct it inside a try.
class RawCublas {
public:
    explicit RawCublas(const std::array<uint8_t, 16> &uuid);
    ~RawCublas();
    RawCublas(const RawCublas &) = delete;
    RawCublas &operator=(const RawCublas &) = delete;

    /// Median milliseconds of one GEMM of this shape and kind (device events; warm-up first).
    double gemmMs(GemmKind kind, uint32_t m, uint32_t n, uint32_t k, int samples);
    /// What was loaded, e.g. "libcublas.so.13 (cuBLAS 130100)".
    const std::string &library() const;

private:
    struct State;
    std::unique_ptr<State> state_;
};

} // namespace backplane::tool
