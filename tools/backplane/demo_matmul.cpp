// The demo's matmul candidates (the portable kernel per tile set; the hand-written native HOST
// functions, GLSL and CUDA/HIP sources as the benchmarks' reference) and its tunable set.
#include "demo_matmul.hpp"

#include <backplane/error.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace backplane::tool {
namespace {

// -- HOST: called once per workgroup; workgroup[1] picks block[0] consecutive rows of C ----------

struct RowRange {
    uint32_t begin, end;
};

RowRange rowsOf(const bp_host_kernel_context *c, const MatmulScalars &s) {
    const uint32_t begin = c->workgroup[1] * c->block[0];
    return {begin, std::min(s.m, begin + c->block[0])};
}

/// Dot products, loop order i-j-k: B is read down its columns (strided), the naive baseline.
void matmulHostIjk(const bp_host_kernel_context *c) {
    const auto &s = *static_cast<const MatmulScalars *>(c->scalars);
    const auto *a = static_cast<const float *>(c->buffers[0]);
    const auto *b = static_cast<const float *>(c->buffers[1]);
    auto *out = static_cast<float *>(c->buffers[2]);
    const RowRange rows = rowsOf(c, s);
    for (uint32_t i = rows.begin; i < rows.end; ++i)
        for (uint32_t j = 0; j < s.n; ++j) {
            float acc = 0;
            for (uint32_t p = 0; p < s.k; ++p)
                acc += a[size_t(i) * s.k + p] * b[size_t(p) * s.n + j];
            out[size_t(i) * s.n + j] = acc;
        }
}

/// Loop order k-i-j over the workgroup's rows: each row of B is read once per workgroup and
/// applied to all its rows while it is in L1 (contiguous, vectorisable inner loop).
void matmulHostIkj(const bp_host_kernel_context *c) {
    const auto &s = *static_cast<const MatmulScalars *>(c->scalars);
    const auto *a = static_cast<const float *>(c->buffers[0]);
    const auto *b = static_cast<const float *>(c->buffers[1]);
    auto *out = static_cast<float *>(c->buffers[2]);
    const RowRange rows = rowsOf(c, s);
    for (uint32_t i = rows.begin; i < rows.end; ++i)
        std::fill_n(out + size_t(i) * s.n, s.n, 0.0f);
    for (uint32_t p = 0; p < s.k; ++p) {
        const float *brow = b + size_t(p) * s.n;
        for (uint32_t i = rows.begin; i < rows.end; ++i) {
            const float av = a[size_t(i) * s.k + p];
            float *row = out + size_t(i) * s.n;
            for (uint32_t j = 0; j < s.n; ++j) row[j] += av * brow[j];
        }
    }
}

// -- CUDA / HIP: one source; TILE (outputs per block edge) and WPT (outputs per thread edge) -------

constexpr const char *kMatmulCuda = R"(
#ifndef TILE
#define TILE 16
#endif
#ifndef WPT
#define WPT 1
#endif
#define BK 16
#define TD (TILE / WPT)
struct MatmulScalars { unsigned int m, n, k; };

// One thread per element of C.
extern "C" __global__ void matmul_naive(const float *a, const float *b, float *c, MatmulScalars s) {
    unsigned int col = blockIdx.x * blockDim.x + threadIdx.x;
    unsigned int row = blockIdx.y * blockDim.y + threadIdx.y;
    if (row >= s.m || col >= s.n) return;
    float acc = 0.0f;
    for (unsigned int p = 0; p < s.k; ++p) acc += a[row * s.k + p] * b[p * s.n + col];
    c[row * s.n + col] = acc;
}

// A TILE x TILE block of C per workgroup of TD x TD threads, each thread WPT x WPT elements
// (strided by TD: coalesced stores, conflict-free reads of tileB); K in steps of BK through
// shared memory.
extern "C" __global__ void matmul_tiled(const float *a, const float *b, float *c, MatmulScalars s) {
    __shared__ float tileA[TILE * BK];
    __shared__ float tileB[BK * TILE];
    const unsigned int tx = threadIdx.x, ty = threadIdx.y;
    const unsigned int row0 = blockIdx.y * TILE, col0 = blockIdx.x * TILE;
    const unsigned int tid = ty * TD + tx;
    float acc[WPT][WPT];
#pragma unroll
    for (int i = 0; i < WPT; ++i)
#pragma unroll
        for (int j = 0; j < WPT; ++j) acc[i][j] = 0.0f;
    for (unsigned int k0 = 0; k0 < s.k; k0 += BK) {
        for (unsigned int e = tid; e < TILE * BK; e += TD * TD) {
            unsigned int r = e / BK, kk = e % BK;
            tileA[e] = (row0 + r < s.m && k0 + kk < s.k) ? a[(row0 + r) * s.k + k0 + kk] : 0.0f;
        }
        for (unsigned int e = tid; e < BK * TILE; e += TD * TD) {
            unsigned int kk = e / TILE, cc = e % TILE;
            tileB[e] = (k0 + kk < s.k && col0 + cc < s.n) ? b[(k0 + kk) * s.n + col0 + cc] : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < BK; ++kk) {
            float av[WPT], bv[WPT];
#pragma unroll
            for (int i = 0; i < WPT; ++i) av[i] = tileA[(ty + i * TD) * BK + kk];
#pragma unroll
            for (int j = 0; j < WPT; ++j) bv[j] = tileB[kk * TILE + tx + j * TD];
#pragma unroll
            for (int i = 0; i < WPT; ++i)
#pragma unroll
                for (int j = 0; j < WPT; ++j) acc[i][j] += av[i] * bv[j];
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < WPT; ++i)
#pragma unroll
        for (int j = 0; j < WPT; ++j) {
            unsigned int row = row0 + ty + i * TD, col = col0 + tx + j * TD;
            if (row < s.m && col < s.n) c[row * s.n + col] = acc[i][j];
        }
}
)";

// -- GLSL (Vulkan): the same two algorithms; block size through specialization constants ---------

constexpr const char *kMatmulNaiveGlsl = R"(#version 450
layout(local_size_x_id = 0, local_size_y_id = 1, local_size_z_id = 2) in;
layout(set = 0, binding = 0) readonly buffer A { float a[]; };
layout(set = 0, binding = 1) readonly buffer B { float b[]; };
layout(set = 0, binding = 2) writeonly buffer C { float c[]; };
layout(push_constant) uniform Scalars { uint m; uint n; uint k; } s;
void main() {
    uint col = gl_GlobalInvocationID.x, row = gl_GlobalInvocationID.y;
    if (row >= s.m || col >= s.n) return;
    float acc = 0.0;
    for (uint p = 0; p < s.k; ++p) acc += a[row * s.k + p] * b[p * s.n + col];
    c[row * s.n + col] = acc;
}
)";

constexpr const char *kMatmulTiledGlsl = R"(#version 450
#ifndef TILE
#define TILE 16
#endif
#ifndef WPT
#define WPT 1
#endif
#define BK 16
#define TD (TILE / WPT)
layout(local_size_x_id = 0, local_size_y_id = 1, local_size_z_id = 2) in;
layout(set = 0, binding = 0) readonly buffer A { float a[]; };
layout(set = 0, binding = 1) readonly buffer B { float b[]; };
layout(set = 0, binding = 2) writeonly buffer C { float c[]; };
layout(push_constant) uniform Scalars { uint m; uint n; uint k; } s;
shared float tileA[TILE * BK];
shared float tileB[BK * TILE];
void main() {
    uint tx = gl_LocalInvocationID.x, ty = gl_LocalInvocationID.y;
    uint row0 = gl_WorkGroupID.y * TILE, col0 = gl_WorkGroupID.x * TILE;
    uint tid = ty * TD + tx;
    float acc[WPT * WPT];
    for (int i = 0; i < WPT * WPT; ++i) acc[i] = 0.0;
    for (uint k0 = 0; k0 < s.k; k0 += BK) {
        for (uint e = tid; e < TILE * BK; e += TD * TD) {
            uint r = e / BK, kk = e % BK;
            tileA[e] = (row0 + r < s.m && k0 + kk < s.k) ? a[(row0 + r) * s.k + k0 + kk] : 0.0;
        }
        for (uint e = tid; e < BK * TILE; e += TD * TD) {
            uint kk = e / TILE, cc = e % TILE;
            tileB[e] = (k0 + kk < s.k && col0 + cc < s.n) ? b[(k0 + kk) * s.n + col0 + cc] : 0.0;
        }
        barrier();
        for (uint kk = 0; kk < BK; ++kk) {
            float av[WPT], bv[WPT];
            for (uint i = 0; i < WPT; ++i) av[i] = tileA[(ty + i * TD) * BK + kk];
            for (uint j = 0; j < WPT; ++j) bv[j] = tileB[kk * TILE + tx + j * TD];
            for (uint i = 0; i < WPT; ++i)
                for (uint j = 0; j < WPT; ++j) acc[i * WPT + j] += av[i] * bv[j];
        }
        barrier();
    }
    for (uint i = 0; i < WPT; ++i)
        for (uint j = 0; j < WPT; ++j) {
            uint row = row0 + ty + i * TD, col = col0 + tx + j * TD;
            if (row < s.m && col < s.n) c[row * s.n + col] = acc[i * WPT + j];
        }
}
)";

constexpr uint32_t kTileK = 16; // BK in the sources

MatmulCandidate hostCandidate(std::string name, bp_host_kernel_fn function, uint32_t rows) {
    MatmulCandidate c;
    c.kernel = {"matmul-" + name, {KernelVariant::host(function, name)}};
    c.name = std::move(name);
    c.block = {rows, 1, 1};
    c.tileRows = rows;
    return c;
}

MatmulCandidate naiveGpuCandidate() {
    MatmulCandidate c;
    c.name = "naive";
    c.kernel = {"matmul-naive",
                {KernelVariant::text(Dialect::Cuda, "matmul_naive", kMatmulCuda),
                 KernelVariant::text(Dialect::Hip, "matmul_naive", kMatmulCuda),
                 KernelVariant::text(Dialect::Glsl, "main", kMatmulNaiveGlsl)}};
    c.block = {16, 16, 1};
    c.tileRows = c.tileCols = 16;
    return c;
}

} // namespace

MatmulCandidate handWrittenTiledCandidate(uint32_t tile, uint32_t perThread) {
    MatmulCandidate c;
    const std::string name = "tiled" + std::to_string(tile) +
                             (perThread == 1 ? std::string()
                                             : "-" + std::to_string(perThread) + "x" +
                                                   std::to_string(perThread));
    const std::vector<std::string> options = {"-DTILE=" + std::to_string(tile),
                                              "-DWPT=" + std::to_string(perThread)};
    c.kernel = {"matmul-" + name,
                {KernelVariant::text(Dialect::Cuda, "matmul_tiled", kMatmulCuda, options),
                 KernelVariant::text(Dialect::Hip, "matmul_tiled", kMatmulCuda, options),
                 KernelVariant::text(Dialect::Glsl, "main", kMatmulTiledGlsl, options)}};
    c.name = name;
    c.block = {tile / perThread, tile / perThread, 1};
    c.tileRows = c.tileCols = tile;
    c.sharedMemoryBytes = 2 * tile * kTileK * static_cast<uint32_t>(sizeof(float));
    return c;
}

std::vector<kernels::MatmulTiles> portableMatmulTiles() {
    // Depth 16 is the hand-written kernels' BK (the benchmarks compare like with like); the last
    // set trades shared memory for more K steps.
    return {{16, 1, 16}, {32, 1, 16}, {32, 2, 16}, {64, 4, 16}, {64, 4, 8}};
}

std::string matmulCandidateName(const kernels::MatmulTiles &tiles) {
    return "t" + std::to_string(tiles.tile) + "-w" + std::to_string(tiles.perThread) + "-k" +
           std::to_string(tiles.depth);
}

MatmulCandidate portableMatmulCandidate(const kernels::MatmulTiles &tiles) {
    MatmulCandidate c;
    c.name = matmulCandidateName(tiles);
    c.portable = kernels::matmul(tiles);
    c.kernel = c.portable->source();
    c.block = {tiles.threads(), tiles.threads(), 1};
    c.tileRows = c.tileCols = tiles.tile;
    c.sharedMemoryBytes = tiles.sharedBytes();
    return c;
}

bool fitsDevice(const MatmulCandidate &c, const DeviceInfo &device) {
    bool accepted = false;
    for (const KernelVariant &v : c.kernel.variants) accepted = accepted || device.accepts(v.dialect);
    if (!accepted) return false;
    const uint32_t threads = c.block[0] * c.block[1] * c.block[2];
    if (device.maxBlockThreads != 0 && threads > device.maxBlockThreads) return false;
    for (int d = 0; d < 3; ++d)
        if (device.maxBlockSize[d] != 0 && c.block[d] > device.maxBlockSize[d]) return false;
    return device.maxSharedMemoryBytes == 0 || c.sharedMemoryBytes <= device.maxSharedMemoryBytes;
}

namespace {

uint32_t ceilDiv(uint32_t a, uint32_t b) { return (a + b - 1) / b; }

} // namespace

MatmulResult MatmulCandidate::run(const MatmulProblem &problem) const {
    if (problem.client == nullptr || problem.m == 0 || problem.n == 0 || problem.k == 0)
        throw Error(ErrorCode::InvalidArgument,
                    "matmul '" + name + "': the problem needs a client and m, n, k > 0");
    MatmulResult result{problem.client,
                        problem.client->empty(uint64_t(problem.m) * problem.n * sizeof(float)),
                        problem.m, problem.n, problem.k};
    launch(problem, result.c);
    return result;
}

void MatmulCandidate::launch(const MatmulProblem &problem, const Buffer &c) const {
    if (problem.client == nullptr || problem.m == 0 || problem.n == 0 || problem.k == 0)
        throw Error(ErrorCode::InvalidArgument,
                    "matmul '" + name + "': the problem needs a client and m, n, k > 0");
    Dispatch d;
    d.block = block;
    d.grid = {tileCols == 0 ? 1 : ceilDiv(problem.n, tileCols), ceilDiv(problem.m, tileRows), 1};
    d.bindings = {problem.a, problem.b, c};
    d.scalar(MatmulScalars{problem.m, problem.n, problem.k});
    if (portable) problem.client->execute(*portable, d);
    else problem.client->execute(kernel, d);
}

std::vector<MatmulCandidate> matmulCandidates(const DeviceInfo &device) {
    std::vector<MatmulCandidate> usable;
    for (const kernels::MatmulTiles &tiles : portableMatmulTiles()) {
        MatmulCandidate c = portableMatmulCandidate(tiles);
        if (fitsDevice(c, device)) usable.push_back(std::move(c));
    }
    return usable;
}

std::vector<MatmulCandidate> handWrittenMatmulCandidates(const DeviceInfo &device) {
    // The simplest of each kind first (the reference when they are checked against each other).
    std::vector<MatmulCandidate> all = {
        hostCandidate("host-ijk-rows1", &matmulHostIjk, 1),
        hostCandidate("host-ikj-rows1", &matmulHostIkj, 1),
        hostCandidate("host-ikj-rows8", &matmulHostIkj, 8),
        hostCandidate("host-ikj-rows32", &matmulHostIkj, 32),
        naiveGpuCandidate(),
        handWrittenTiledCandidate(16, 1),
        handWrittenTiledCandidate(32, 1),
        handWrittenTiledCandidate(32, 2),
        handWrittenTiledCandidate(64, 4),
    };
    std::vector<MatmulCandidate> usable;
    for (MatmulCandidate &c : all)
        if (fitsDevice(c, device)) usable.push_back(std::move(c));
    return usable;
}

MatmulSet matmulTunable(const DeviceInfo &device) {
    std::vector<MatmulCandidate> candidates = matmulCandidates(device);
    if (candidates.empty())
        throw Error(ErrorCode::Unsupported,
                    "matmul: device " + device.id() + " (" + device.name +
                        ") fits none of the portable matmul's tile sets (block or shared memory "
                        "limits too small)");
    MatmulSet set("matmul-f32", [](const MatmulProblem &p, TuneLevel level) {
        return tune::KeyBuilder(level)
            .axis("m", p.m)
            .axis("n", p.n)
            .axis("k", p.k)
            .exact("dtype", "f32")
            .str();
    });
    for (MatmulCandidate &c : candidates) {
        std::string name = c.name;
        set.add(std::move(name), [c = std::move(c)](const MatmulProblem &p) { return c.run(p); });
    }
    set.check([](const MatmulResult &reference, const MatmulResult &candidate) {
        return compareMatmul(candidate.client->readAs<float>(candidate.c),
                             reference.client->readAs<float>(reference.c), reference.n,
                             reference.k);
    });
    return set;
}

std::vector<float> matmulOnCpu(const std::vector<float> &a, const std::vector<float> &b,
                               uint32_t m, uint32_t n, uint32_t k) {
    std::vector<float> c(size_t(m) * n);
    std::vector<double> row(n);
    for (uint32_t i = 0; i < m; ++i) {
        std::fill(row.begin(), row.end(), 0.0);
        for (uint32_t p = 0; p < k; ++p) {
            const double av = a[size_t(i) * k + p];
            const float *brow = b.data() + size_t(p) * n;
            for (uint32_t j = 0; j < n; ++j) row[j] += av * brow[j];
        }
        for (uint32_t j = 0; j < n; ++j) c[size_t(i) * n + j] = static_cast<float>(row[j]);
    }
    return c;
}

std::string compareMatmul(const std::vector<float> &got, const std::vector<float> &want,
                          uint32_t n, uint32_t k) {
    if (got.size() != want.size())
        return "expected " + std::to_string(want.size()) + " elements, got " +
               std::to_string(got.size());
    const double scale = std::sqrt(static_cast<double>(k));
    size_t wrong = 0, first = 0;
    for (size_t i = 0; i < got.size(); ++i) {
        const double diff = std::fabs(double(got[i]) - double(want[i]));
        // Written so that NaN counts as a mismatch.
        if (!(diff <= 1e-4 * (std::fabs(double(want[i])) + scale)) && wrong++ == 0) first = i;
    }
    if (wrong == 0) return "";
    char text[160];
    std::snprintf(text, sizeof text, "%zu of %zu elements differ; first C[%zu,%zu]: expected %g, got %g",
                  wrong, got.size(), first / (n == 0 ? 1 : n), first % (n == 0 ? 1 : n),
                  double(want[first]), double(got[first]));
    return text;
}

} // namespace backplane::tool
