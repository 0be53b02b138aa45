// Portable kernels written once in the kernel language: saxpy, reduction, prefix sum, tiled matmul.
#pragma once

#include <backplane/lang.hpp>

#include <algorithm>
#include <functional>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

/// Each function records its kernel (cheap: microseconds to a few milliseconds for the largest
/// matmul tiles) and returns it; keep the lang::Kernel and launch it as often as needed. The launch
/// shape each kernel expects is in its comment. These are also the examples of docs/kernels.md.
namespace backplane::kernels {

/// y[i] = a * x[i] + y[i] (fused) for i < n. Bindings: x (read), y (read-write); scalars: a (f32),
/// n (u32). Any 1-D launch covering n threads, e.g. block {256}, grid {ceil(n / 256)}.
inline lang::Kernel saxpy() {
    return lang::kernel("saxpy", [](lang::Builder &k) {
        auto x = k.input<float>();
        auto y = k.inout<float>();
        auto a = k.scalar<float>();
        auto n = k.scalar<uint32_t>();
        auto i = k.globalId().x;
        k.If(i < n, [&] { y[i] = fma(a, x[i], y[i]); });
    });
}

/// Per-workgroup sums: partial[g] = the sum of the elements x[i], i < n, that workgroup g visits
/// (a grid-stride loop, then a tree in shared memory with barriers). Launch block {blockSize},
/// any grid; partial holds at least grid[0] elements. Reduce the partials with a second launch
/// of grid {1} (n = the first grid's size). T: int32_t, uint32_t or float. blockSize: a power of
/// two, at most the device's maxBlockThreads.
template <class T> lang::Kernel reduceSum(uint32_t blockSize) {
    return lang::kernel("reduce_sum_" + std::string(lang::toString(lang::typeOf<T>())) + "_" +
                            std::to_string(blockSize),
                        [blockSize](lang::Builder &k) {
        auto x = k.input<T>();
        auto partial = k.output<T>();
        auto n = k.scalar<uint32_t>();
        auto tile = k.shared<T>(blockSize);
        auto t = k.localId().x;
        auto g = k.groupId().x;
        auto stride = k.gridSize().x * blockSize;
        auto sum = k.var<T>(T(0));
        k.For(g * blockSize + t, n, stride, [&](lang::Value<uint32_t> i) { sum += x[i]; });
        tile[t] = sum;
        k.barrier();
        // A C++ loop over constants: unrolled into log2(blockSize) recorded steps.
        for (uint32_t half = blockSize / 2; half > 0; half /= 2) {
            k.If(t < half, [&] { tile[t] = tile[t] + tile[t + half]; });
            k.barrier();
        }
        k.If(t == 0u, [&] { partial[g] = tile[0u]; });
    });
}

/// out[i] = x[0] + ... + x[i] for i < n, by one workgroup of blockSize threads walking the input
/// in chunks of blockSize: a Hillis-Steele scan of each chunk in shared memory plus the running
/// total of the chunks before it. Launch block {blockSize}, grid {1}. T: int32_t, uint32_t or
/// float; blockSize a power of two.
template <class T> lang::Kernel inclusiveScan(uint32_t blockSize) {
    return lang::kernel("inclusive_scan_" + std::string(lang::toString(lang::typeOf<T>())) + "_" +
                            std::to_string(blockSize),
                        [blockSize](lang::Builder &k) {
        auto x = k.input<T>();
        auto out = k.output<T>();
        auto n = k.scalar<uint32_t>();
        auto tile = k.shared<T>(blockSize);
        auto t = k.localId().x;
        auto carry = k.var<T>(T(0));
        k.For(0u, n, blockSize, [&](lang::Value<uint32_t> base) {
            auto i = base + t;
            auto v = k.var<T>(T(0));
            k.If(i < n, [&] { v = x[i]; });
            tile[t] = v;
            k.barrier();
            for (uint32_t offset = 1; offset < blockSize; offset *= 2) {
                auto before = k.var<T>(T(0));
                k.If(t >= offset, [&] { before = tile[t - offset]; });
                k.barrier();
                tile[t] = tile[t] + before;
                k.barrier();
            }
            k.If(i < n, [&] { out[i] = carry + tile[t]; });
            carry += tile[blockSize - 1];
            k.barrier(); // the next chunk overwrites tile
        });
    });
}

/// The tile sizes of matmul(): compile-time constants, so each set is its own kernel (and its own
/// autotune candidate).
struct MatmulTiles {
    uint32_t tile = 16;     ///< outputs per workgroup edge (TILE x TILE of C)
    uint32_t perThread = 1; ///< outputs per thread edge; tile % perThread == 0
    uint32_t depth = 16;    ///< K step through shared memory

    std::string name() const {
        return "matmul_t" + std::to_string(tile) + "_w" + std::to_string(perThread) + "_k" +
               std::to_string(depth);
    }
    /// Threads per workgroup edge: Dispatch::block = {threads(), threads(), 1}.
    uint32_t threads() const { return tile / perThread; }
    uint32_t sharedBytes() const { return 2 * tile * depth * 4; }
};

/// C (m x n) = A (m x k) * B (k x n), row-major f32, tiled: each workgroup stages a tile x depth
/// block of A and a depth x tile block of B in shared memory, each thread accumulates perThread x
/// perThread outputs in a private array. Bindings: a, b (read), c (write); scalars m, n, k (u32).
/// Launch block {threads, threads, 1}, grid {ceil(n / tile), ceil(m / tile), 1}.
inline lang::Kernel matmul(MatmulTiles tiles = {}) {
    return lang::kernel(tiles.name(), [tiles](lang::Builder &k) {
        using lang::Value;
        const uint32_t tile = tiles.tile, wpt = tiles.perThread, depth = tiles.depth;
        const uint32_t td = tile / wpt, threads = td * td;
        auto a = k.input<float>();
        auto b = k.input<float>();
        auto c = k.output<float>();
        auto m = k.scalar<uint32_t>();
        auto n = k.scalar<uint32_t>();
        auto kk = k.scalar<uint32_t>();
        auto tileA = k.shared<float>(tile * depth);
        auto tileB = k.shared<float>(depth * tile);
        auto acc = k.array<float>(wpt * wpt);
        auto tx = k.localId().x;
        auto ty = k.localId().y;
        auto row0 = k.groupId().y * tile;
        auto col0 = k.groupId().x * tile;
        auto tid = ty * td + tx;
        for (uint32_t i = 0; i < wpt * wpt; ++i) acc[i] = 0.0f;

        // Copies a rows x cols block of `src` (row stride `stride`, clipped to limitRows x
        // limitCols, zeros outside) starting at (r0, c0) into `dst`; every thread takes every
        // threads-th element.
        auto stage = [&](lang::Array<float> dst, lang::Binding<float> src, uint32_t rows,
                         uint32_t cols, Value<uint32_t> r0, Value<uint32_t> c0,
                         Value<uint32_t> limitRows, Value<uint32_t> limitCols,
                         Value<uint32_t> stride) {
            for (uint32_t first = 0; first < rows * cols; first += threads) {
                auto e = tid + first;
                auto copy = [&] {
                    auto r = e / cols;
                    auto col = e % cols;
                    auto v = k.var<float>(0.0f);
                    k.If(r0 + r < limitRows && c0 + col < limitCols,
                         [&] { v = src[(r0 + r) * stride + c0 + col]; });
                    dst[e] = v;
                };
                if (first + threads <= rows * cols) copy();
                else k.If(e < rows * cols, copy);
            }
        };

        k.For(0u, kk, depth, [&](Value<uint32_t> k0) {
            stage(tileA, a, tile, depth, row0, k0, m, kk, kk);
            stage(tileB, b, depth, tile, k0, col0, kk, n, n);
            k.barrier();
            for (uint32_t p = 0; p < depth; ++p) {
                std::vector<Value<float>> av, bv;
                for (uint32_t i = 0; i < wpt; ++i) av.push_back(tileA[(ty + i * td) * depth + p]);
                for (uint32_t j = 0; j < wpt; ++j) bv.push_back(tileB[tx + j * td + p * tile]);
                for (uint32_t i = 0; i < wpt; ++i)
                    for (uint32_t j = 0; j < wpt; ++j)
                        acc[i * wpt + j] = fma(av[i], bv[j], acc[i * wpt + j]);
            }
            k.barrier();
        });
        for (uint32_t i = 0; i < wpt; ++i)
            for (uint32_t j = 0; j < wpt; ++j) {
                auto row = row0 + ty + i * td;
                auto col = col0 + tx + j * td;
                k.If(row < m && col < n, [&] { c[row * n + col] = acc[i * wpt + j]; });
            }
    });
}

/// The blocks of matmulRegisters(): each thread computes `rows` x (4 * `vectors`) outputs.
struct RegisterTiles {
    uint32_t rows = 4;     ///< rows of C per thread
    uint32_t vectors = 4;  ///< vectors of 4 columns of C per thread
    uint32_t threadsX = 16, threadsY = 4; ///< Dispatch::block

    std::string name() const {
        return "matmul_regs_r" + std::to_string(rows) + "_v" + std::to_string(vectors) + "_b" +
               std::to_string(threadsX) + "x" + std::to_string(threadsY);
    }
    uint32_t cols() const { return 4 * vectors; }
};

/// C (m x n) = A (m x k) * B (k x n), row-major f32, without shared memory or barriers: each
/// thread keeps a rows x cols() block of C in a private array and steps through K one element
/// at a time, a broadcast of A times vector loads of B. Made for CPUs, where the host compiles
/// each thread's loop into SIMD FMAs (a register-blocked micro-kernel); GPUs run it too, slower
/// than matmul(). Bindings: a, b (read), c (write); scalars m, n, k (u32). Launch block
/// {threadsX, threadsY, 1}, grid {ceil(n / (cols() * threadsX)), ceil(m / (rows * threadsY)), 1}.
inline lang::Kernel matmulRegisters(RegisterTiles tiles = {}) {
    return lang::kernel(tiles.name(), [tiles](lang::Builder &k) {
        using lang::Value;
        const uint32_t rows = tiles.rows, cols = tiles.cols();
        auto a = k.input<float>();
        auto b = k.input<float>();
        auto c = k.output<float>();
        auto m = k.scalar<uint32_t>();
        auto n = k.scalar<uint32_t>();
        auto kk = k.scalar<uint32_t>();
        auto row0 = k.globalId().y * rows;
        auto col0 = k.globalId().x * cols;
        auto acc = k.array<float>(rows * cols);
        for (uint32_t i = 0; i < rows * cols; ++i) acc[i] = 0.0f;
        k.If(row0 < m && col0 < n, [&] {
            k.For(0u, kk, [&](Value<uint32_t> p) {
                std::vector<Value<float>> av;
                // Rows past m read index m * k and beyond: out of range, 0.
                for (uint32_t r = 0; r < rows; ++r) av.push_back(a[(row0 + r) * kk + p]);
                for (uint32_t v = 0; v < tiles.vectors; ++v) {
                    // Columns past n read the next row of B: their sums are never stored.
                    const auto bv = lang::loadVector<4>(b, p * n + col0 + v * 4);
                    for (uint32_t r = 0; r < rows; ++r)
                        for (uint32_t j = 0; j < 4; ++j)
                            acc[r * cols + v * 4 + j] = fma(av[r], bv[j], acc[r * cols + v * 4 + j]);
                }
            });
            for (uint32_t r = 0; r < rows; ++r)
                for (uint32_t j = 0; j < cols; ++j)
                    k.If(row0 + r < m && col0 + j < n,
                         [&] { c[(row0 + r) * n + col0 + j] = acc[r * cols + j]; });
        });
    });
}

/// The tiles of matmulMatrixUnits(): a block of blockM x blockN outputs per workgroup, split
/// among warpsM x warpsN subgroups (each computes (blockM / warpsM) x (blockN / warpsN) outputs
/// as 16 x 16 accumulators), stepping blockK through K in shared memory.
struct MatrixMatmulTiles {
    uint32_t blockM = 128, blockN = 128, blockK = 32;
    uint32_t warpsM = 2, warpsN = 4;
    /// Elements per vector access when staging tiles (2, 4 or 8; at most 16 bytes: 8 for f16 and
    /// bf16, 4 for float). A device must load vectors of this width
    /// (DeviceInfo::features.loadsVectorsOf); 4 works everywhere vectors do.
    uint32_t vector = 8;
    /// Shared-memory stages of the K loop: 2 is double buffering; more keep more tiles in
    /// flight while the matrix units work (each stage is blockM x blockK + blockK x blockN
    /// elements of shared memory).
    uint32_t stages = 2;
    /// Stage tiles with lang::copyAsync (cp.async on CUDA 8.0+, straight into shared memory)
    /// instead of through registers. Without it only 2 stages are possible.
    bool asyncCopies = false;

    std::string name(lang::Type input) const {
        return std::string("matmul_mu_") + lang::toString(input) + "_" + std::to_string(blockM) +
               "x" + std::to_string(blockN) + "x" + std::to_string(blockK) + "_w" +
               std::to_string(warpsM) + "x" + std::to_string(warpsN) + "_v" + std::to_string(vector) +
               "_s" + std::to_string(stages) + (asyncCopies ? "a" : "");
    }
    uint32_t subgroups() const { return warpsM * warpsN; }
    /// Dispatch::block for a device of `subgroupSize` (DeviceInfo::subgroupSize).
    uint32_t threads(uint32_t subgroupSize) const { return subgroups() * subgroupSize; }
    /// Whether the tiles divide into 16 x 16 accumulators and K steps of the input's tile.
    bool valid(uint32_t tileK) const {
        return warpsM > 0 && warpsN > 0 && blockM % (16 * warpsM) == 0 &&
               blockN % (16 * warpsN) == 0 && blockK > 0 && blockK % tileK == 0 && blockK % 8 == 0 &&
               (vector == 2 || vector == 4 || vector == 8) && stages >= 2 && stages <= 8 &&
               (asyncCopies || stages == 2);
    }
};

/// C (m x n, f32) = A (m x k) * B (k x n), row-major, on the matrix units: T is lang::f16 or
/// lang::bf16 (16x16x16 tiles) or float (16x16x8 tiles, inputs rounded to tf32). Each
/// workgroup stages blockM x blockK of A and blockK x blockN of B in shared memory (zeros past
/// the edges, so any m, n, k work), each subgroup multiplies its fragments, and the
/// accumulators go out through shared memory with the edges clipped. Bindings: a, b (read), c
/// (write); scalars m, n, k (u32). Launch block {tiles.threads(device.subgroupSize)}, grid
/// {ceil(n / blockN), ceil(m / blockM), 1}. A device without the tile's matrix shape refuses
/// the kernel at execute() (Kernel::missingOn names it); tiles.valid() must hold.
template <class T> lang::Kernel matmulMatrixUnits(MatrixMatmulTiles tiles = {}) {
    constexpr lang::Type input = lang::typeOf<T>();
    tiles.vector = std::min<uint32_t>(tiles.vector, 16 / sizeof(T));
    if (!tiles.valid(std::is_same_v<T, float> ? 8 : 16))
        throw Error(ErrorCode::InvalidArgument,
                    "kernels::matmulMatrixUnits: tiles " + tiles.name(input) +
                        " do not divide into 16 x 16 accumulators per subgroup and K steps of the "
                        "matrix tile (MatrixMatmulTiles::valid)");
    return lang::kernel(tiles.name(input), [tiles](lang::Builder &k) {
        using lang::Value;
        const lang::MatrixTile tile{16, 16, std::is_same_v<T, float> ? 8u : 16u};
        const uint32_t bm = tiles.blockM, bn = tiles.blockN, bk = tiles.blockK;
        const uint32_t fm = bm / tiles.warpsM / 16, fn = bn / tiles.warpsN / 16;
        // Rows of the shared tiles padded by 8 elements: ldmatrix rows then fall in different
        // banks, and offsets stay multiples of 8.
        const uint32_t strideA = bk + 8, strideB = bn + 8;
        auto a = k.input<T>();
        auto b = k.input<T>();
        auto c = k.output<float>();
        auto m = k.scalar<uint32_t>();
        auto n = k.scalar<uint32_t>();
        auto kk = k.scalar<uint32_t>();
        auto tileA = k.shared<T>(tiles.stages * bm * strideA); // one tile per stage
        auto tileB = k.shared<T>(tiles.stages * bk * strideB);
        auto out = k.shared<float>(tiles.subgroups() * 256);
        auto tid = k.localIndex();
        auto threads = k.groupSize().x;
        auto width = k.subgroupSize();
        auto warp = tid / width;
        auto lane = tid - warp * width;
        auto warpRow = warp / tiles.warpsN * (fm * 16);
        auto warpCol = warp % tiles.warpsN * (fn * 16);
        auto row0 = k.groupId().y * bm;
        auto col0 = k.groupId().x * bn;

        std::vector<lang::Matrix<float, lang::MatrixUse::Accumulator>> acc;
        for (uint32_t i = 0; i < fm * fn; ++i) {
            acc.push_back(k.accumulator<float>(tile));
            acc.back().fill(0.0f);
        }
        std::vector<lang::Matrix<T, lang::MatrixUse::A>> fa;
        std::vector<lang::Matrix<T, lang::MatrixUse::B>> fb;
        for (uint32_t i = 0; i < fm; ++i) fa.push_back(k.matrixA<T>(tile));
        for (uint32_t j = 0; j < fn; ++j) fb.push_back(k.matrixB<T>(tile));

        // The fragments of the K step at `step` of the tiles at offsets offA / offB.
        const auto multiply = [&](Value<uint32_t> offA, Value<uint32_t> offB) {
            for (uint32_t step = 0; step < bk; step += tile.k) {
                for (uint32_t i = 0; i < fm; ++i)
                    fa[i].load(tileA, offA + (warpRow + i * 16) * strideA + step, strideA);
                for (uint32_t j = 0; j < fn; ++j)
                    fb[j].load(tileB, offB + warpCol + j * 16 + step * strideB, strideB);
                for (uint32_t i = 0; i < fm; ++i)
                    for (uint32_t j = 0; j < fn; ++j)
                        mma(acc[i * fn + j], fa[i], fb[j], acc[i * fn + j]);
            }
        };
        const auto general = [&]<uint32_t V>() {
            k.For(0u, kk, bk, [&](Value<uint32_t> k0) {
                // rows x cols of `src` (row length `length`, `limitRows` rows) from (r0, c0)
                // into `dst` (row stride `stride`): a vector copy where a whole vector is
                // inside (16-bit types move as bits on CUDA), element copies with zeros past
                // the edges.
                auto stage = [&](lang::Array<T> dst, uint32_t stride, lang::Binding<T> src,
                                 uint32_t rows, uint32_t cols, Value<uint32_t> r0,
                                 Value<uint32_t> c0, Value<uint32_t> limitRows,
                                 Value<uint32_t> length) {
                    k.For(tid, rows * (cols / V), threads, [&](Value<uint32_t> e) {
                        auto r = e / (cols / V);
                        auto col = e % (cols / V) * V;
                        auto at = r * stride + col;
                        auto from = (r0 + r) * length + c0 + col;
                        k.If(r0 + r < limitRows && c0 + col + V <= length,
                             [&] { storeVector(dst, at, lang::loadVector<V>(src, from)); })
                            .Else([&] {
                                for (uint32_t q = 0; q < V; ++q)
                                    k.If(r0 + r < limitRows && c0 + col + q < length,
                                         [&] { dst[at + q] = src[from + q]; })
                                        .Else([&] { dst[at + q] = T(0.0f); });
                            });
                    });
                };
                stage(tileA, strideA, a, bm, bk, row0, k0, m, kk);
                stage(tileB, strideB, b, bk, bn, k0, col0, kk, n);
                k.barrier();
                multiply(0u, 0u);
                k.barrier();
            });
        };
        // Blocks wholly inside C with K a whole number of steps, on 32-wide subgroups: no edge
        // checks, and the next step's tiles load into registers while this step multiplies,
        // into the other half of double-buffered shared tiles (one barrier per step).
        const auto pipelined = [&]<uint32_t V>() {
            const uint32_t lanes = tiles.subgroups() * 32;
            const uint32_t sizeA = bm * strideA, sizeB = bk * strideB;
            // Per thread: its vectors of a rows x cols tile, as (row, column) pairs.
            const auto copies = [&](uint32_t rows, uint32_t cols) {
                std::vector<std::pair<Value<uint32_t>, Value<uint32_t>>> mine;
                for (uint32_t first = 0; first < rows * (cols / V); first += lanes) {
                    auto e = tid + first;
                    mine.push_back({e / (cols / V), e % (cols / V) * V});
                }
                return mine;
            };
            const auto copiesA = copies(bm, bk), copiesB = copies(bk, bn);
            const auto fetch = [&](Value<uint32_t> k0) {
                std::vector<lang::Vector<T, V>> got;
                for (const auto &[r, col] : copiesA)
                    got.push_back(lang::loadVector<V>(a, (row0 + r) * kk + k0 + col));
                for (const auto &[r, col] : copiesB)
                    got.push_back(lang::loadVector<V>(b, (k0 + r) * n + col0 + col));
                return got;
            };
            const auto put = [&](const std::vector<lang::Vector<T, V>> &got, Value<uint32_t> half) {
                size_t g = 0;
                for (const auto &[r, col] : copiesA)
                    storeVector(tileA, half * sizeA + r * strideA + col, got[g++]);
                for (const auto &[r, col] : copiesB)
                    storeVector(tileB, half * sizeB + r * strideB + col, got[g++]);
            };
            put(fetch(0u), 0u);
            k.barrier();
            k.For(0u, kk, bk, [&](Value<uint32_t> k0) {
                auto half = k0 / bk % 2u;
                // The last step fetches its own tiles again (unused): no branch.
                auto next = fetch(lang::min(k0 + bk, kk - bk));
                multiply(half * sizeA, half * sizeB);
                put(next, 1u - half);
                k.barrier();
            });
        };
        // Rows of whole vectors (n and k multiples of V), any block: `stages` shared tiles
        // filled by asynchronous copies (zeros past the edges), the copies of step
        // t + stages - 1 in flight while step t multiplies.
        const auto staged = [&]<uint32_t V>() {
            const uint32_t lanes = tiles.subgroups() * 32, S = tiles.stages;
            const uint32_t sizeA = bm * strideA, sizeB = bk * strideB;
            const uint32_t vectorsA = bm * (bk / V), vectorsB = bk * (bn / V);
            const auto copyA = [&](Value<uint32_t> e, Value<uint32_t> k0, Value<uint32_t> stage) {
                auto r = e / (bk / V);
                auto col = e % (bk / V) * V;
                lang::copyAsync<V>(tileA, stage * sizeA + r * strideA + col, a,
                                   (row0 + r) * kk + k0 + col, row0 + r < m && k0 + col < kk);
            };
            const auto copyB = [&](Value<uint32_t> e, Value<uint32_t> k0, Value<uint32_t> stage) {
                auto r = e / (bn / V);
                auto col = e % (bn / V) * V;
                lang::copyAsync<V>(tileB, stage * sizeB + r * strideB + col, b,
                                   (k0 + r) * n + col0 + col, k0 + r < kk && col0 + col < n);
            };
            // Each thread's copies: unrolled on 32-wide subgroups when they divide evenly
            // (the addresses then stay in registers across steps), a loop otherwise.
            const bool unroll = vectorsA % lanes == 0 && vectorsB % lanes == 0;
            const auto issue = [&](Value<uint32_t> k0, Value<uint32_t> stage) {
                const auto loop = [&] {
                    k.For(tid, vectorsA, threads, [&](Value<uint32_t> e) { copyA(e, k0, stage); });
                    k.For(tid, vectorsB, threads, [&](Value<uint32_t> e) { copyB(e, k0, stage); });
                };
                if (!unroll) return loop();
                k.If(threads == lanes, [&] {
                    for (uint32_t first = 0; first < vectorsA; first += lanes) copyA(tid + first, k0, stage);
                    for (uint32_t first = 0; first < vectorsB; first += lanes) copyB(tid + first, k0, stage);
                }).Else(loop);
            };
            auto steps = (kk + (bk - 1)) / bk;
            for (uint32_t p = 0; p + 1 < S; ++p) {
                k.If(Value<uint32_t>(p) < steps, [&] { issue(Value<uint32_t>(p * bk), Value<uint32_t>(p)); });
                k.commitCopies();
            }
            k.For(0u, steps, 1u, [&](Value<uint32_t> t) {
                k.waitCopies(S - 2);
                k.barrier(); // step t is in shared memory, and step t - 1's stage is free
                auto next = t + (S - 1);
                k.If(next < steps, [&] { issue(next * bk, next % S); });
                k.commitCopies();
                auto stage = t % S;
                multiply(stage * sizeA, stage * sizeB);
            });
            k.waitCopies(0);
        };
        const auto run = [&]<uint32_t V>() {
            const uint32_t lanes = tiles.subgroups() * 32;
            const bool wholeCopies = (bm * (bk / V)) % lanes == 0 && (bk * (bn / V)) % lanes == 0;
            if (tiles.asyncCopies) {
                k.If(n % V == 0u && kk % V == 0u, [&] { staged.template operator()<V>(); })
                    .Else([&] { general.template operator()<V>(); });
                return;
            }
            if (!wholeCopies) return general.template operator()<V>();
            k.If(threads == lanes && row0 + bm <= m && col0 + bn <= n &&
                     kk % bk == 0u && n % V == 0u && kk >= bk,
                 [&] { pipelined.template operator()<V>(); })
                .Else([&] { general.template operator()<V>(); });
        };
        if (tiles.vector == 8) run.template operator()<(sizeof(T) <= 2 ? 8 : 4)>();
        else if (tiles.vector == 4) run.template operator()<4>();
        else run.template operator()<2>();
        // A block inside C stores its accumulators directly; one at an edge goes through this
        // subgroup's 16 x 16 of shared memory, clipped to C.
        k.If(row0 + bm <= m && col0 + bn <= n, [&] {
            for (uint32_t i = 0; i < fm; ++i)
                for (uint32_t j = 0; j < fn; ++j)
                    acc[i * fn + j].store(c, (row0 + warpRow + i * 16) * n + col0 + warpCol + j * 16, n);
        }).Else([&] {
            for (uint32_t i = 0; i < fm; ++i)
                for (uint32_t j = 0; j < fn; ++j) {
                    acc[i * fn + j].store(out, warp * 256u, 16u);
                    k.barrier();
                    k.For(lane, 256u, width, [&](Value<uint32_t> e) {
                        auto row = row0 + warpRow + i * 16 + e / 16u;
                        auto col = col0 + warpCol + j * 16 + e % 16u;
                        k.If(row < m && col < n, [&] { c[row * n + col] = out[warp * 256u + e]; });
                    });
                    k.barrier();
                }
        });
    });
}

namespace detail {
template <class T> lang::Value<float> toF32(const lang::Value<T> &v) {
    if constexpr (std::is_same_v<T, float>) return v;
    else return lang::cast<float>(v);
}
/// Combines tile[0 .. blockSize) into tile[0] with `op` (a tree with barriers); every thread
/// must call it.
inline void treeReduce(lang::Builder &k, lang::Array<float> tile, uint32_t blockSize,
                       const std::function<lang::Value<float>(lang::Value<float>, lang::Value<float>)> &op) {
    auto t = k.localId().x;
    k.barrier();
    for (uint32_t half = blockSize / 2; half > 0; half /= 2) {
        k.If(t < half, [&] { tile[t] = op(tile[t], tile[t + half]); });
        k.barrier();
    }
}
/// Calls f(value) for each element of row `base` .. base + cols - 1 this thread visits: vectors
/// of V where whole ones fit (16-byte accesses on CUDA when cols is a multiple of V), then the
/// tail element by element.
template <class T, uint32_t V>
void eachOfRow(lang::Builder &k, lang::Binding<T> x, lang::Value<uint32_t> base,
               lang::Value<uint32_t> cols, uint32_t blockSize,
               const std::function<void(lang::Value<uint32_t>, const std::vector<lang::Value<T>> &)> &f) {
    auto t = k.localId().x;
    auto whole = cols / V * V;
    k.For(t * V, whole, blockSize * V, [&](lang::Value<uint32_t> i) {
        const lang::Vector<T, V> v = lang::loadVector<V>(x, base + i);
        f(i, v.parts());
    });
    k.For(whole + t, cols, blockSize, [&](lang::Value<uint32_t> i) {
        f(i, {lang::Value<T>(x[base + i])});
    });
}
/// kept[r * V + p] = element p of this thread's vector r of the row at `base` (vector r at element
/// (t + r * blockSize) * V, neighbouring threads reading neighbouring vectors), as f32, for the
/// vectors before `whole`; `missing` for the others. The loads are not branched around: a
/// vector past `whole` loads the row's first vector (a checked load: zeros past the buffer) and
/// is replaced by `missing`, so every load of the thread is issued before the first is used.
template <class T, uint32_t V>
void loadKept(lang::Builder &k, lang::Binding<T> x, lang::Value<uint32_t> base,
              lang::Value<uint32_t> whole, uint32_t blockSize, lang::Array<float> kept,
              uint32_t count, float missing) {
    auto t = k.localId().x;
    for (uint32_t r = 0; r < count / V; ++r) {
        auto i = (t + r * blockSize) * V;
        auto valid = i < whole;
        const lang::Vector<T, V> v = lang::loadVector<V>(x, base + lang::select(valid, i, lang::Value<uint32_t>(0u)));
        for (uint32_t p = 0; p < V; ++p)
            kept[r * V + p] = lang::select(valid, toF32<T>(v.parts()[p]), lang::Value<float>(missing));
    }
}
} // namespace detail

/// sums[r] = the f32 sum of row r of x (rows of `cols` elements, row-major). T: f16, bf16 or
/// float; sums are f32 (the elements are added in f32). One workgroup per row: launch block
/// {blockSize} (a power of two), grid {rows}. Bindings: x (read), sums (write); scalar: cols
/// (u32). (Measured on an H200: loading a row's 32 values per thread before adding, as
/// softmaxRows does, was slower here: 0.55-0.60x against 0.70-0.73x of the copy rate for f16
/// and bf16.)
template <class T> lang::Kernel rowSum(uint32_t blockSize = 256) {
    constexpr uint32_t V = 16 / sizeof(T) > 8 ? 8 : 16 / sizeof(T);
    return lang::kernel("row_sum_" + std::string(lang::toString(lang::typeOf<T>())) + "_" +
                            std::to_string(blockSize),
                        [blockSize](lang::Builder &k) {
        auto x = k.input<T>();
        auto sums = k.output<float>();
        auto cols = k.scalar<uint32_t>();
        auto tile = k.shared<float>(blockSize);
        auto t = k.localId().x;
        auto row = k.groupId().x;
        auto sum = k.var<float>(0.0f);
        detail::eachOfRow<T, V>(k, x, row * cols, cols, blockSize, [&](auto, const auto &parts) {
            for (const auto &p : parts) sum += detail::toF32<T>(p);
        });
        tile[t] = sum;
        detail::treeReduce(k, tile, blockSize, [](auto a, auto b) { return a + b; });
        k.If(t == 0u, [&] { sums[row] = tile[0u]; });
    });
}

/// out = softmax of each row of x: exp(x - max of the row) / sum of those, computed in f32 and
/// rounded to T when stored (T: f16, bf16 or float). One workgroup per row: launch block
/// {blockSize} (a power of two), grid {rows}. Bindings: x (read), out (write); scalar: cols.
///
/// A row of V (a vector: 4 floats, 8 halves) to blockSize * 32 elements (8192 at block 256) is
/// read once: each thread keeps its 32 values in registers (a private array at constant
/// indices), takes the row's maximum, then exp(x - maximum) once per element, then the sum, and
/// writes from the registers. Other rows take two passes over memory: the first keeps a running
/// maximum and a sum rescaled whenever the maximum grows (an online softmax), the second
/// writes. Vector accesses where whole vectors fit, the tail element by element. Both give the
/// same values for special inputs: a -inf element gives 0 (a masked position), a NaN anywhere
/// makes the whole row NaN, a row of only -inf (or one with +inf) is NaN (0 / 0, inf / inf).
template <class T> lang::Kernel softmaxRows(uint32_t blockSize = 256) {
    constexpr uint32_t V = 16 / sizeof(T) > 8 ? 8 : 16 / sizeof(T);
    constexpr uint32_t kKept = 32; // values each thread keeps in registers
    return lang::kernel("softmax_rows_" + std::string(lang::toString(lang::typeOf<T>())) + "_" +
                            std::to_string(blockSize),
                        [blockSize](lang::Builder &k) {
        using lang::Value;
        auto x = k.input<T>();
        auto out = k.output<T>();
        auto cols = k.scalar<uint32_t>();
        auto tops = k.shared<float>(blockSize);
        auto sums = k.shared<float>(blockSize);
        auto t = k.localId().x;
        auto base = k.groupId().x * cols;
        const float lowest = -std::numeric_limits<float>::infinity();
        auto whole = cols / V * V;
        const auto rounded = [](const Value<float> &y) -> Value<T> {
            if constexpr (std::is_same_v<T, float>) return y;
            else return lang::cast<T>(y);
        };
        // The row's maximum and sum out of each thread's (top, sum): a tree over shared memory.
        const auto combineTops = [&] {
            k.barrier();
            for (uint32_t half = blockSize / 2; half > 0; half /= 2) {
                k.If(t < half, [&] { tops[t] = lang::max(tops[t], tops[t + half]); });
                k.barrier();
            }
        };
        const auto combineSums = [&] {
            k.barrier();
            for (uint32_t half = blockSize / 2; half > 0; half /= 2) {
                k.If(t < half, [&] { sums[t] = sums[t] + sums[t + half]; });
                k.barrier();
            }
        };
        // The kept path loads the row's first vector in place of a missing one: a whole vector
        // only where the row has one (review finding: cols < V read past the last row).
        k.If(cols <= blockSize * kKept && cols >= V, [&] {
            // Vector r of this thread starts at element (t + r * blockSize) * V: neighbouring
            // threads read neighbouring vectors.
            // All loads first, then the maximum: a GPU thread then has all its loads in flight
            // at once instead of waiting for each before the next. No branch around them: a
            // vector past the row loads the row's start instead and counts as -inf.
            auto kept = k.array<float>(kKept);
            detail::loadKept<T, V>(k, x, base, whole, blockSize, kept, kKept, lowest);
            auto top = k.var<float>(lowest);
            for (uint32_t j = 0; j < kKept; ++j) top = lang::max(top, kept[j]);
            k.For(whole + t, cols, blockSize, [&](Value<uint32_t> i) {
                top = lang::max(top, detail::toF32<T>(Value<T>(x[base + i])));
            });
            tops[t] = top;
            combineTops();
            Value<float> rowMax = tops[0u];
            auto sum = k.var<float>(0.0f);
            for (uint32_t r = 0; r < kKept / V; ++r) {
                auto i = (t + r * blockSize) * V;
                k.If(i < whole, [&] {
                    for (uint32_t p = 0; p < V; ++p) {
                        Value<float> e = lang::exp(kept[r * V + p] - rowMax);
                        kept[r * V + p] = e;
                        sum += e;
                    }
                });
            }
            k.For(whole + t, cols, blockSize, [&](Value<uint32_t> i) {
                sum += lang::exp(detail::toF32<T>(Value<T>(x[base + i])) - rowMax);
            });
            sums[t] = sum;
            combineSums();
            Value<float> scale = Value<float>(1.0f) / sums[0u];
            for (uint32_t r = 0; r < kKept / V; ++r) {
                auto i = (t + r * blockSize) * V;
                k.If(i < whole, [&] {
                    std::vector<Value<T>> parts;
                    for (uint32_t p = 0; p < V; ++p) parts.push_back(rounded(kept[r * V + p] * scale));
                    lang::storeVector(out, base + i, lang::Vector<T, V>(std::move(parts)));
                });
            }
            k.For(whole + t, cols, blockSize, [&](Value<uint32_t> i) {
                out[base + i] = rounded(lang::exp(detail::toF32<T>(Value<T>(x[base + i])) - rowMax) * scale);
            });
        }).Else([&] {
            auto top = k.var<float>(lowest);
            auto sum = k.var<float>(0.0f);
            // (top, sum) absorbs a vector's values: one rescale of the sum to the new maximum per
            // vector, then one exp per value. exp(-inf - -inf) is avoided: a -inf value adds 0
            // and, while the maximum is -inf, the sum is 0 (review finding: a row starting with
            // -inf came out all NaN). A NaN value makes the sum NaN, as in the kept path.
            detail::eachOfRow<T, V>(k, x, base, cols, blockSize, [&](auto, const auto &parts) {
                std::vector<Value<float>> values;
                for (const auto &p : parts) values.push_back(detail::toF32<T>(p));
                std::vector<Value<float>> maxima{Value<float>(top)}; // Values are not reassignable
                for (const auto &v : values) maxima.push_back(lang::max(maxima.back(), v));
                const Value<float> &next = maxima.back();
                Value<float> rescale = lang::select(top == lowest, Value<float>(0.0f), lang::exp(top - next));
                const auto term = [&](const Value<float> &v) {
                    return lang::select(v == lowest, Value<float>(0.0f), lang::exp(v - next));
                };
                std::vector<Value<float>> added{term(values[0])};
                for (size_t i = 1; i < values.size(); ++i) added.push_back(added.back() + term(values[i]));
                sum = sum * rescale + added.back();
                top = next;
            });
            tops[t] = top;
            sums[t] = sum;
            k.barrier();
            for (uint32_t half = blockSize / 2; half > 0; half /= 2) {
                k.If(t < half, [&] {
                    Value<float> m1 = tops[t], m2 = tops[t + half];
                    Value<float> m = lang::max(m1, m2);
                    // A sum whose maximum is -inf is 0, or NaN when a NaN was seen: kept as is.
                    Value<float> s1 = lang::select(m1 == lowest, Value<float>(sums[t]), sums[t] * lang::exp(m1 - m));
                    Value<float> s2 = lang::select(m2 == lowest, Value<float>(sums[t + half]), sums[t + half] * lang::exp(m2 - m));
                    tops[t] = m;
                    sums[t] = s1 + s2;
                });
                k.barrier();
            }
            Value<float> rowMax = tops[0u];
            Value<float> scale = Value<float>(1.0f) / sums[0u];
            const auto result = [&](const Value<T> &p) -> Value<T> {
                return rounded(lang::exp(detail::toF32<T>(p) - rowMax) * scale);
            };
            k.For(t * V, whole, blockSize * V, [&](Value<uint32_t> i) {
                const lang::Vector<T, V> v = lang::loadVector<V>(x, base + i);
                std::vector<Value<T>> parts;
                for (const auto &p : v.parts()) parts.push_back(result(p));
                lang::storeVector(out, base + i, lang::Vector<T, V>(std::move(parts)));
            });
            k.For(whole + t, cols, blockSize, [&](Value<uint32_t> i) { out[base + i] = result(x[base + i]); });
        });
    });
}

} // namespace backplane::kernels
