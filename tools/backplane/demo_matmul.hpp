// The demo's tuned matrix multiply: HOST, GLSL and CUDA/HIP candidates, the tunable set, a CPU check.
#pragma once

#include <backplane/buffer.hpp>
#include <backplane/client.hpp>
#include <backplane/device.hpp>
#include <backplane/kernel.hpp>
#include <backplane/tune.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace backplane::tool {

/// The scalars of every matmul kernel, in every dialect: HOST casts ctx->scalars to it, GLSL
/// mirrors it in its push-constant block, CUDA/HIP take it by value after the three pointers.
struct MatmulScalars {
    uint32_t m, n, k;
};

/// C (m x n) = A (m x k) * B (k x n): row-major float32 buffers on `client`'s device. The client
/// is borrowed; it must outlive every use of the problem.
struct MatmulProblem {
    ComputeClient *client = nullptr;
    Buffer a, b;
    uint32_t m = 0, n = 0, k = 0;
};

/// The output of one candidate: a new C buffer (m x n floats) written on the current stream.
struct MatmulResult {
    ComputeClient *client = nullptr;
    Buffer c;
    uint32_t m = 0, n = 0, k = 0;
};

/// One fixed implementation: a kernel (one variant per dialect it exists in) and its launch shape.
/// Workgroup (x, y) computes the tileRows x tileCols block of C at row y*tileRows, column
/// x*tileCols; tileCols == 0 means whole rows (the HOST kernels, whose block[0] is the number of
/// rows one call computes).
struct MatmulCandidate {
    std::string name;               ///< "tiled32-2x2", "host-ikj-rows8": unique within a device
    KernelSource kernel;            ///< its variants, in the order the server should prefer them
    std::array<uint32_t, 3> block{1, 1, 1};
    uint32_t tileRows = 1;
    uint32_t tileCols = 0;
    uint32_t sharedMemoryBytes = 0; ///< static shared memory of the GPU variants (limit check)

    /// Allocates C and launches the kernel on the current stream (asynchronously). Throws Error
    /// (compile, launch, out of memory) like ComputeClient::execute.
    MatmulResult run(const MatmulProblem &problem) const;
};

/// The candidates `device` can run: those with a variant in a dialect it accepts and whose block
/// and shared memory fit its limits. HOST devices get the native ones, Vulkan the GLSL ones, CUDA
/// and HIP the CUDA-source ones (HIP compiles the same text). Empty for a device with none.
std::vector<MatmulCandidate> matmulCandidates(const DeviceInfo &device);

/// The tunable set type of the matmul.
using MatmulSet = tune::TunableSet<MatmulProblem, MatmulResult>;

/// The tunable set "matmul-f32" of `device`'s candidates (matmulCandidates(device), first one
/// the reference): key "m=..,n=..,k=..,dtype=f32" anchored by the tuner's level (powers of two at
/// Balanced); the tuner's device fingerprint separates devices. Each candidate's output is read
/// back and checked against the reference's with compareMatmul(). Throws Error(Unsupported) when
/// the device has no candidate.
MatmulSet matmulTunable(const DeviceInfo &device);

/// C = A * B on the CPU (accumulated in double), the reference of the checks.
std::vector<float> matmulOnCpu(const std::vector<float> &a, const std::vector<float> &b,
                               uint32_t m, uint32_t n, uint32_t k);

/// "" when every element of `got` is within a relative tolerance of `want`: |got - want| <=
/// 1e-4 * (|want| + sqrt(k)) (sqrt(k) is the typical size of a dot product of k values in
/// [-1, 1], so elements that cancel to near zero are not held to a tighter bound than rounding
/// allows). Else the count of differing elements and the first of them.
std::string compareMatmul(const std::vector<float> &got, const std::vector<float> &want,
                          uint32_t n, uint32_t k);

} // namespace backplane::tool
