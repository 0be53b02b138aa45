// The demo's tuned matrix multiply: portable candidates (one per tile set), the hand-written
// reference kernels, the tunable set, a CPU check.
#pragma once

#include <backplane/buffer.hpp>
#include <backplane/client.hpp>
#include <backplane/device.hpp>
#include <backplane/kernel.hpp>
#include <backplane/kernels.hpp>
#include <backplane/lang.hpp>
#include <backplane/tune.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace backplane::tool {

/// The scalars of every matmul kernel, in every dialect: HOST casts ctx->scalars to it, GLSL
/// mirrors it in its push-constant block, CUDA/HIP take it by value after the three pointers; the
/// portable kernel declares the same three u32 scalars.
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
    std::string name;    ///< "t32-w2-k16", "tiled32-2x2", "host-ikj-rows8": unique within a device
    KernelSource kernel; ///< its variants, in the order the server should prefer them
    /// The portable kernel (kernels::matmul) when the candidate is one: run() launches it through
    /// ComputeClient::execute(lang::Kernel), and `kernel` is its source(). Empty for hand-written.
    std::optional<lang::Kernel> portable;
    std::array<uint32_t, 3> block{1, 1, 1};
    uint32_t tileRows = 1;
    uint32_t tileCols = 0;
    uint32_t sharedMemoryBytes = 0; ///< static shared memory of the GPU variants (limit check)

    /// Allocates C and launches the kernel on the current stream (asynchronously). Throws Error
    /// (compile, launch, out of memory) like ComputeClient::execute.
    MatmulResult run(const MatmulProblem &problem) const;
    /// Launches the kernel writing into `c` (at least m x n floats on the problem's device), so
    /// benchmarks time the kernel alone. Throws like run().
    void launch(const MatmulProblem &problem, const Buffer &c) const;
};

/// The tile sets of the portable candidates, in order (the first is the reference of the checks).
std::vector<kernels::MatmulTiles> portableMatmulTiles();

/// "t32-w2-k16": the candidate name of a tile set.
std::string matmulCandidateName(const kernels::MatmulTiles &tiles);

/// The portable tiled matmul (kernels::matmul(tiles)) as a candidate.
MatmulCandidate portableMatmulCandidate(const kernels::MatmulTiles &tiles);

/// The hand-written CUDA/HIP/GLSL tiled kernel with TILE = tile, WPT = perThread (K step 16, like
/// a portable kernel of depth 16), named "tiled<tile>" or "tiled<tile>-<wpt>x<wpt>".
MatmulCandidate handWrittenTiledCandidate(uint32_t tile, uint32_t perThread);

/// Whether `device` can run `candidate`: a variant in a dialect it accepts, block and shared memory
/// within its limits (a limit of 0 means none).
bool fitsDevice(const MatmulCandidate &candidate, const DeviceInfo &device);

/// The portable candidates `device` can run (every device: the host plugin runs them through the
/// kernel language's interpreter), one per tile set of portableMatmulTiles() whose block and
/// shared memory fit its limits. Empty only for a device whose limits admit none.
std::vector<MatmulCandidate> matmulCandidates(const DeviceInfo &device);

/// The hand-written reference kernels `device` can run, kept as the benchmarks' baseline: HOST
/// devices get the native functions, Vulkan the GLSL sources, CUDA and HIP the CUDA source (HIP
/// compiles the same text). Empty for a device with none.
std::vector<MatmulCandidate> handWrittenMatmulCandidates(const DeviceInfo &device);

/// The tunable set type of the matmul.
using MatmulSet = tune::TunableSet<MatmulProblem, MatmulResult>;

/// The tunable set "matmul-f32" of `device`'s portable candidates (matmulCandidates(device), first
/// one the reference), so the tuner picks the portable matmul's tile sizes: key
/// "m=..,n=..,k=..,dtype=f32" anchored by the tuner's level (powers of two at Balanced); the
/// tuner's device fingerprint separates devices. Each candidate's output is read back and checked
/// against the reference's with compareMatmul(). Throws Error(Unsupported) when the device has no
/// candidate.
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
