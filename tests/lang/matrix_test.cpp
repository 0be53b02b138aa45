// The matrix units (lang::Matrix, kernels::matmulMatrixUnits) on every device present (host
// always; lavapipe in CI, which has none and must refuse; CUDA and Vulkan on the GPU machine),
// against a CPU reference of the rounded inputs: every input type, both layouts of A and B,
// buffers and shared memory, checked edges, odd matrix sizes. Public API only.
#include <backplane/client.hpp>
#include <backplane/config.hpp>
#include <backplane/error.hpp>
#include <backplane/kernels.hpp>
#include <backplane/lang.hpp>
#include <backplane/runtime.hpp>
#include <backplane/tune.hpp>
#include <backplane/cache.hpp>

#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

using namespace backplane;
using lang::Layout;
using lang::Value;

namespace {

Runtime makeRuntime(const std::string &hostOptions) {
    Config config;
    config.pluginPathOverride = {MANIFESTS};
    config.probeMode = ProbeMode::InProcess;
    config.cacheEnabled = false;
    if (!hostOptions.empty()) config.pluginOptions["host"] = hostOptions;
    return Runtime(config);
}

const Runtime &runtime() {
    static const Runtime instance = makeRuntime("");
    return instance;
}

std::vector<ComputeClient> &clients() {
    static std::vector<ComputeClient> all = [] {
        std::vector<ComputeClient> opened;
        for (const PhysicalDevice &device : runtime().devices())
            for (const DeviceInfo &route : device.routes) {
                opened.push_back(runtime().open(runtime().select(route.id())));
                MESSAGE("device " << route.id() << ": " << route.name << "; "
                                  << route.features.describe());
            }
        return opened;
    }();
    return all;
}

/// f32 rounded to tf32 the way the matrix units take f32 inputs (nearest, ties away).
float tf32(float f) {
    uint32_t bits = std::bit_cast<uint32_t>(f);
    if ((bits & 0x7f800000u) == 0x7f800000u) return f;
    return std::bit_cast<float>((bits + 0x1000u) & 0xffffe000u);
}

/// Host data of one input type: its element values, stored as the kernel's buffers hold them.
template <class T> struct Input {
    std::vector<T> stored;
    std::vector<float> value; ///< what the matrix units multiply (rounded)

    explicit Input(size_t n, uint32_t seed) {
        std::mt19937 rng(seed);
        std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
        for (size_t i = 0; i < n; ++i) {
            const float x = dist(rng);
            if constexpr (std::is_same_v<T, float>) {
                stored.push_back(x);
                value.push_back(tf32(x));
            } else {
                stored.push_back(T(x));
                value.push_back(static_cast<float>(T(x)));
            }
        }
    }
};

/// |got - want| within the bound of k products of inputs below `scale` summed in f32 (a few
/// roundings of partial sums: GPUs do not sum exactly).
bool near(float got, double want, uint32_t k, double scale) {
    return std::fabs(got - want) <= 1e-5 * k * scale * scale + 1e-6;
}

/// D (16 x 16) = A * B + C from `a`, `b` (16 x k, k x 16 elements at offset 8 with a stride of
/// 24 or, column-major, the transposed placement), read from buffers or staged through shared
/// memory first. C comes in from `c` and D goes out to it.
template <class T>
lang::Kernel tileKernel(lang::MatrixTile tile, Layout la, Layout lb, bool shared, bool checked) {
    const std::string name = std::string("mu_tile_") + lang::toString(lang::typeOf<T>()) +
                             (la == Layout::ColMajor ? "_acol" : "_arow") +
                             (lb == Layout::ColMajor ? "_bcol" : "_brow") +
                             (shared ? "_shared" : "_buffer") + (checked ? "_checked" : "");
    return lang::kernel(
        name,
        [&](lang::Builder &k) {
            auto a = k.input<T>();
            auto b = k.input<T>();
            auto c = k.inout<float>();
            auto fa = k.matrixA<T>(tile);
            auto fb = k.matrixB<T>(tile);
            auto acc = k.accumulator<float>(tile);
            acc.load(c, 0u, 16u);
            if (shared) {
                auto sa = k.shared<T>(512);
                auto sb = k.shared<T>(512);
                k.For(k.localIndex(), 512u, k.groupSize().x, [&](Value<uint32_t> i) {
                    sa[i] = a[i];
                    sb[i] = b[i];
                });
                k.barrier();
                fa.load(sa, 8u, 24u, la);
                fb.load(sb, 8u, 24u, lb);
            } else {
                fa.load(a, 8u, 24u, la);
                fb.load(b, 8u, 24u, lb);
            }
            mma(acc, fa, fb, acc);
            acc.store(c, 0u, 16u);
        },
        lang::KernelOptions{checked});
}

template <class T> void checkTiles(lang::MatrixTile tile) {
    const uint32_t kk = tile.k;
    const Input<T> a(512, 1), b(512, 2);
    std::vector<float> c0(256);
    for (uint32_t i = 0; i < 256; ++i) c0[i] = 0.25f * static_cast<float>(i % 7) - 0.5f;
    for (Layout la : {Layout::RowMajor, Layout::ColMajor})
        for (Layout lb : {Layout::RowMajor, Layout::ColMajor})
            for (bool shared : {false, true})
                for (bool checked : {false, true}) {
                    const lang::Kernel kernel = tileKernel<T>(tile, la, lb, shared, checked);
                    // Element (r, c) of a matrix at offset 8, stride 24, in `layout`.
                    const auto at = [](Layout layout, uint32_t r, uint32_t c) {
                        return layout == Layout::RowMajor ? 8 + r * 24 + c : 8 + c * 24 + r;
                    };
                    std::vector<double> want(256);
                    for (uint32_t r = 0; r < 16; ++r)
                        for (uint32_t col = 0; col < 16; ++col) {
                            double sum = c0[r * 16 + col];
                            for (uint32_t p = 0; p < kk; ++p)
                                sum += double(a.value[at(la, r, p)]) * b.value[at(lb, p, col)];
                            want[r * 16 + col] = sum;
                        }
                    for (ComputeClient &client : clients()) {
                        CAPTURE(client.device().id());
                        CAPTURE(kernel.name());
                        Buffer ba = client.createFrom<T>(a.stored), bb = client.createFrom<T>(b.stored);
                        Buffer bc = client.createFrom<float>(c0);
                        Dispatch d;
                        d.grid = {1};
                        d.block = {client.device().subgroupSize};
                        d.bindings = {ba, bb, bc};
                        const std::string missing = kernel.missingOn(client.device().features);
                        if (!missing.empty()) {
                            // Refused before anything runs, naming the kernel and the shape.
                            CHECK_THROWS_WITH_AS(client.execute(kernel, d),
                                                 doctest::Contains("matrix units of"), Error);
                            try {
                                client.execute(kernel, d);
                            } catch (const Error &e) {
                                CHECK((e.code() == ErrorCode::Unsupported));
                                CHECK(std::string(e.what()).find(kernel.name()) != std::string::npos);
                            }
                            continue;
                        }
                        client.execute(kernel, d);
                        const std::vector<float> got = client.readAs<float>(bc);
                        int bad = 0;
                        for (uint32_t i = 0; i < 256; ++i)
                            if (!near(got[i], want[i], kk, 2.0) && bad++ < 4)
                                FAIL_CHECK(("element (" + std::to_string(i / 16) + ", " +
                                            std::to_string(i % 16) + "): got " + std::to_string(got[i]) +
                                            ", want " + std::to_string(want[i])));
                        CHECK(bad == 0);
                    }
                }
}

/// C = A * B on the CPU in double, from the rounded inputs.
std::vector<double> reference(const std::vector<float> &a, const std::vector<float> &b,
                              uint32_t m, uint32_t n, uint32_t k) {
    std::vector<double> c(size_t{m} * n, 0.0);
    for (uint32_t i = 0; i < m; ++i)
        for (uint32_t p = 0; p < k; ++p) {
            const double x = a[size_t{i} * k + p];
            for (uint32_t j = 0; j < n; ++j) c[size_t{i} * n + j] += x * b[size_t{p} * n + j];
        }
    return c;
}

template <class T> void checkMatmul(kernels::MatrixMatmulTiles tiles, uint32_t m, uint32_t n,
                                    uint32_t k) {
    const lang::Kernel kernel = kernels::matmulMatrixUnits<T>(tiles);
    const Input<T> a(size_t{m} * k, 11), b(size_t{k} * n, 12);
    const std::vector<double> want = reference(a.value, b.value, m, n, k);
    for (ComputeClient &client : clients()) {
        CAPTURE(client.device().id());
        CAPTURE(kernel.name());
        CAPTURE(m);
        CAPTURE(n);
        CAPTURE(k);
        const std::string missing = kernel.missingOn(client.device().features);
        Buffer ba = client.createFrom<T>(a.stored), bb = client.createFrom<T>(b.stored);
        Buffer bc = client.createFrom<float>(std::vector<float>(size_t{m} * n, -7.0f));
        Dispatch d;
        d.grid = {(n + tiles.blockN - 1) / tiles.blockN, (m + tiles.blockM - 1) / tiles.blockM};
        d.block = {tiles.threads(client.device().subgroupSize)};
        d.bindings = {ba, bb, bc};
        d.scalar(m).scalar(n).scalar(k);
        if (!missing.empty()) {
            CHECK_THROWS_AS(client.execute(kernel, d), Error);
            continue;
        }
        client.execute(kernel, d);
        const std::vector<float> got = client.readAs<float>(bc);
        int bad = 0;
        for (size_t i = 0; i < got.size(); ++i)
            if (!near(got[i], want[i], k, 2.0) && bad++ < 4)
                FAIL_CHECK(("C(" + std::to_string(i / n) + ", " + std::to_string(i % n) + "): got " +
                            std::to_string(got[i]) + ", want " + std::to_string(want[i])));
        CHECK(bad == 0);
    }
}

} // namespace

TEST_CASE("a 16x16 tile of f16 inputs: both layouts, buffers and shared memory, checked") {
    checkTiles<lang::f16>({16, 16, 16});
}

TEST_CASE("a 16x16 tile of bf16 inputs: both layouts, buffers and shared memory, checked") {
    checkTiles<lang::bf16>({16, 16, 16});
}

TEST_CASE("a 16x16x8 tile of f32 inputs rounds them to tf32") { checkTiles<float>({16, 16, 8}); }

TEST_CASE("matmul on the matrix units: odd sizes, several tile sets, every input type") {
    const kernels::MatrixMatmulTiles small{32, 32, 16, 1, 2};
    const kernels::MatrixMatmulTiles wide{64, 32, 32, 2, 1};
    checkMatmul<lang::bf16>(small, 37, 45, 70);
    checkMatmul<lang::f16>(wide, 70, 33, 41);
    checkMatmul<float>(small, 35, 18, 29);
    checkMatmul<lang::bf16>(kernels::MatrixMatmulTiles{}, 130, 131, 40);
    // Shapes whose blocks are (partly) wholly inside C with K a whole number of steps: the
    // pipelined path on 32-wide subgroups, the general one elsewhere (and on the host).
    checkMatmul<lang::bf16>(small, 64, 64, 48);
    checkMatmul<lang::f16>({64, 64, 32, 2, 2}, 128, 96, 64);
    checkMatmul<float>({32, 32, 16, 1, 2, 4}, 64, 80, 32);
    // Asynchronous copies into 3 and 4 stages: edges in every dimension, K not a whole
    // number of steps (n and k multiples of the vector: the staged path), and a shape that
    // takes the general path (n % 8 != 0).
    checkMatmul<lang::bf16>({64, 64, 32, 2, 2, 8, 3, true}, 130, 136, 72);
    checkMatmul<lang::f16>({32, 32, 16, 1, 2, 8, 4, true}, 64, 64, 48);
    checkMatmul<float>({32, 32, 16, 1, 2, 4, 3, true}, 45, 40, 36);
    checkMatmul<lang::bf16>({32, 32, 16, 1, 2, 8, 2, true}, 33, 45, 70);
    checkMatmul<lang::f16>({32, 32, 16, 1, 2, 8, 3, true}, 8, 8, 8); // one partial step
    // 4 stages of 128 x 128 x 32: 82 KiB of shared memory, dynamic on CUDA.
    checkMatmul<lang::bf16>({128, 128, 32, 2, 2, 8, 4, true}, 200, 264, 96);
}

TEST_CASE("checked matrix loads past the memory load zeros and stores write nothing") {
    // A 16x16 A at offset 8 with stride 24 ends at element 8 + 15 * 24 + 15 = 383: a buffer of
    // 383 elements is one short, so the whole fragment loads as zeros and D = C.
    const lang::Kernel kernel = tileKernel<lang::f16>({16, 16, 16}, Layout::RowMajor,
                                                      Layout::RowMajor, false, true);
    const Input<lang::f16> a(383, 3), b(512, 4);
    std::vector<float> c0(256);
    for (uint32_t i = 0; i < 256; ++i) c0[i] = static_cast<float>(i);
    for (ComputeClient &client : clients()) {
        CAPTURE(client.device().id());
        if (!kernel.missingOn(client.device().features).empty()) continue;
        Buffer ba = client.createFrom<lang::f16>(a.stored), bb = client.createFrom<lang::f16>(b.stored);
        Buffer bc = client.createFrom<float>(c0);
        Dispatch d;
        d.grid = {1};
        d.block = {client.device().subgroupSize};
        d.bindings = {ba, bb, bc};
        client.execute(kernel, d);
        CHECK(client.readAs<float>(bc) == c0);
        // C one element short: nothing is stored, not even the part that would fit.
        Buffer full = client.createFrom<lang::f16>(Input<lang::f16>(512, 5).stored);
        Buffer shortC = client.createFrom<float>(std::vector<float>(255, 3.0f));
        d.bindings = {full, bb, shortC};
        client.execute(kernel, d);
        CHECK(client.readAs<float>(shortC) == std::vector<float>(255, 3.0f));
    }
}

TEST_CASE("matrix operations break the language's rules loudly at recording") {
    const auto refused = [](const char *what, const std::function<void(lang::Builder &)> &body) {
        CAPTURE(what);
        CHECK_THROWS_WITH_AS(lang::kernel("mu_rules", body), doctest::Contains(what), Error);
    };
    refused("accumulators are f32", [](lang::Builder &k) { k.accumulator<lang::f16>(); });
    refused("the matrix units take", [](lang::Builder &k) { k.matrixA<lang::bf16>({16, 16, 8}); });
    refused("the matrix units take", [](lang::Builder &k) { k.matrixA<double>(); });
    refused("multiples of 8", [](lang::Builder &k) {
        auto a = k.input<lang::f16>();
        k.matrixA<lang::f16>().load(a, 4u, 16u);
    });
    refused("less than the 16 elements", [](lang::Builder &k) {
        auto a = k.input<lang::f16>();
        k.matrixA<lang::f16>().load(a, 0u, 8u);
    });
    refused("thread-dependent control flow", [](lang::Builder &k) {
        auto a = k.input<lang::f16>();
        auto fa = k.matrixA<lang::f16>();
        k.If(k.localIndex() < 4u, [&] { fa.load(a, 0u, 16u); });
    });
    refused("private array", [](lang::Builder &k) {
        auto p = k.array<lang::f16>(256);
        k.matrixA<lang::f16>().load(p, 0u, 16u);
    });
    refused("is an input (read-only)", [](lang::Builder &k) {
        auto c = k.input<float>();
        auto acc = k.accumulator<float>();
        acc.fill(0.0f);
        acc.store(c, 0u, 16u);
    });
    refused("different tiles or input types", [](lang::Builder &k) {
        auto acc = k.accumulator<float>({16, 16, 8});
        mma(acc, k.matrixA<lang::f16>(), k.matrixB<lang::f16>(), acc);
    });
}

TEST_CASE("a device without matrix units refuses the kernel naming the shape, before running") {
    // The host plugin with its matrix units switched off fakes such a device.
    const Runtime small = makeRuntime(R"({"matrix_units": false})");
    const lang::Kernel kernel = kernels::matmulMatrixUnits<lang::bf16>({32, 32, 16, 1, 2});
    for (const PhysicalDevice &device : small.devices())
        for (const DeviceInfo &route : device.routes) {
            if (route.backend != "host") continue;
            CHECK(route.features.matrixShapes.empty());
            ComputeClient client = small.open(small.select(route.id()));
            Buffer a = client.empty(2 * 32 * 32), b = client.empty(2 * 32 * 32);
            Buffer c = client.createFrom<float>(std::vector<float>(32 * 32, 5.0f));
            Dispatch d;
            d.grid = {1, 1};
            d.block = {2};
            d.bindings = {a, b, c};
            d.scalar(32u).scalar(32u).scalar(32u);
            CHECK_THROWS_WITH_AS(client.execute(kernel, d),
                                 doctest::Contains("uses matrix units of 16x16x16 bf16*bf16+f32"),
                                 Error);
            CHECK(client.readAs<float>(c) == std::vector<float>(32 * 32, 5.0f));
        }
}

namespace {

/// out[o + i] = 2 * x[o + i + shift] + 1 for the vectors of N elements starting at multiples of
/// N (o = that start), through loadVector / storeVector; `shift` (a scalar) makes the loads
/// misaligned at run time (bindings themselves start aligned: DeviceInfo::bindingAlignment).
template <class T, uint32_t N> lang::Kernel vectorKernel(bool checked) {
    return lang::kernel(
        std::string("vectors_") + lang::toString(lang::typeOf<T>()) + "x" + std::to_string(N) +
            (checked ? "_checked" : ""),
        [](lang::Builder &k) {
            auto x = k.input<T>();
            auto out = k.output<T>();
            auto shift = k.scalar<uint32_t>();
            auto count = k.scalar<uint32_t>();
            auto o = k.globalId().x * N;
            k.If(o < count, [&] {
                const lang::Vector<T, N> v = lang::loadVector<N>(x, o + shift);
                lang::storeVector(out, o, v * lang::Vector<T, N>(Value<T>(T(2))) + Value<T>(T(1)));
            });
        },
        lang::KernelOptions{checked});
}

template <class T> T fromInt(int v) {
    if constexpr (std::is_same_v<T, lang::f16> || std::is_same_v<T, lang::bf16>) return T(float(v));
    else return static_cast<T>(v);
}
template <class T> double toDouble(T v) {
    if constexpr (std::is_same_v<T, lang::f16> || std::is_same_v<T, lang::bf16>) return float(v);
    else return static_cast<double>(v);
}

template <class T, uint32_t N> void checkVectors() {
    const uint32_t count = 8 * 37 + N / 2; // a partial vector at the end
    std::vector<T> x;
    for (uint32_t i = 0; i < count + 2 * N; ++i) x.push_back(fromInt<T>(static_cast<int>(i % 50) - 20));
    for (bool checked : {false, true}) {
        const lang::Kernel kernel = vectorKernel<T, N>(checked);
        for (ComputeClient &client : clients()) {
            CAPTURE(client.device().id());
            CAPTURE(kernel.name());
            if (const std::string missing = kernel.missingOn(client.device().features); !missing.empty()) {
                const auto attempt = [&] {
                    Dispatch d;
                    d.grid = {1};
                    d.block = {1};
                    Buffer in = client.createFrom<T>(x);
                    Buffer o = client.empty(sizeof(T) * count);
                    d.bindings = {in, o};
                    d.scalar(0u).scalar(count);
                    client.execute(kernel, d);
                };
                CHECK_THROWS_AS(attempt(), Error);
                continue;
            }
            Buffer whole = client.createFrom<T>(x);
            // Unchecked kernels must stay in bounds: the partial last vector reads and writes
            // past `count`, so their buffers have a vector of slack.
            for (uint32_t shift : {0u, 1u, N / 2}) {
                    CAPTURE(shift);
                    Buffer in = whole;
                    const uint32_t outCount = checked ? count : count + N;
                    Buffer outBuffer = client.createFrom<T>(std::vector<T>(outCount + 1, fromInt<T>(7)));
                    Buffer out = outBuffer.view(0, sizeof(T) * outCount);
                    Dispatch d;
                    d.grid = {(count + 64 * N - 1) / (64 * N)};
                    d.block = {64};
                    d.bindings = {in, out};
                    d.scalar(shift).scalar(count);
                    client.execute(kernel, d);
                    const std::vector<T> got = client.readAs<T>(outBuffer);
                    const uint32_t base = 0;
                    int bad = 0;
                    for (uint32_t i = 0; i < outCount; ++i) {
                        const uint32_t from = i + shift + base;
                        const bool inside = i < (count + N - 1) / N * N && (!checked || (i < count && from < x.size()));
                        if (!inside) continue;
                        // In T: 8- and 16-bit integers wrap, like the kernel's arithmetic.
                        double want = 2 * toDouble(x[from]) + 1;
                        if constexpr (std::is_integral_v<T>)
                            want = static_cast<double>(static_cast<T>(2 * static_cast<int64_t>(x[from]) + 1));
                        if (toDouble(got[base + i]) != want && bad++ < 4)
                            FAIL_CHECK(("element " + std::to_string(i) + ": got " +
                                        std::to_string(toDouble(got[base + i])) + ", want " + std::to_string(want)));
                    }
                    CHECK(bad == 0);
                    // Checked: nothing past `count` is written.
                    if (checked) CHECK(toDouble(got[base + count]) == 7.0);
                }
        }
    }
}

} // namespace

TEST_CASE("vector loads and stores: aligned, misaligned at run time, views, checked tails") {
    checkVectors<float, 4>();
    checkVectors<lang::f16, 8>();
    checkVectors<lang::bf16, 4>();
    checkVectors<int32_t, 2>();
    checkVectors<uint8_t, 8>();
    checkVectors<int16_t, 8>();
    checkVectors<int64_t, 2>();
}

namespace {

/// out[i] = x[i + shift] through shared memory: each thread copies vectors of N with
/// copyAsync (zeros where i + shift is past `limit`), waits, and the workgroup reads back.
template <class T, uint32_t N> lang::Kernel asyncCopyKernel(bool checked) {
    return lang::kernel(
        std::string("copy_async_") + lang::toString(lang::typeOf<T>()) + "x" + std::to_string(N) +
            (checked ? "_checked" : ""),
        [](lang::Builder &k) {
            auto x = k.input<T>();
            auto out = k.output<T>();
            auto shift = k.scalar<uint32_t>();
            auto limit = k.scalar<uint32_t>();
            auto tile = k.shared<T>(64 * N);
            auto t = k.localId().x;
            auto base = k.groupId().x * (64 * N);
            auto from = base + t * N + shift;
            lang::copyAsync<N>(tile, t * N, x, from, from + N <= limit);
            k.commitCopies();
            k.waitCopies(0);
            k.barrier();
            for (uint32_t q = 0; q < N; ++q) {
                // Thread t reads what another thread copied: the barrier orders it.
                auto i = (t + 1u) % 64u * N + q;
                out[base + i] = tile[i];
            }
        },
        lang::KernelOptions{checked});
}

template <class T, uint32_t N> void checkAsyncCopies() {
    const uint32_t groups = 3, count = groups * 64 * N;
    std::vector<T> x;
    for (uint32_t i = 0; i < count + 2 * N; ++i) x.push_back(fromInt<T>(static_cast<int>(i % 61) - 30));
    for (bool checked : {false, true}) {
        const lang::Kernel kernel = asyncCopyKernel<T, N>(checked);
        for (ComputeClient &client : clients()) {
            CAPTURE(client.device().id());
            CAPTURE(kernel.name());
            if (!kernel.missingOn(client.device().features).empty()) continue;
            // shift 1: every copy misaligned (the synchronous path); limit cuts the last group.
            for (uint32_t shift : {0u, 1u, N}) {
                CAPTURE(shift);
                const uint32_t limit = count - 5 * N;
                Buffer in = client.createFrom<T>(x);
                Buffer o = client.createFrom<T>(std::vector<T>(count, fromInt<T>(7)));
                Dispatch d;
                d.grid = {groups};
                d.block = {64};
                d.bindings = {in, o};
                d.scalar(shift).scalar(limit);
                client.execute(kernel, d);
                const std::vector<T> got = client.readAs<T>(o);
                int bad = 0;
                for (uint32_t i = 0; i < count; ++i) {
                    const uint32_t vectorStart = i / N * N + shift;
                    const double want = vectorStart + N <= limit ? toDouble(x[i + shift]) : 0.0;
                    if (toDouble(got[i]) != want && bad++ < 4)
                        FAIL_CHECK(("element " + std::to_string(i) + ": got " +
                                    std::to_string(toDouble(got[i])) + ", want " + std::to_string(want)));
                }
                CHECK(bad == 0);
            }
        }
    }
}

} // namespace

TEST_CASE("asynchronous copies: aligned, misaligned at run time, zeros where the condition is "
          "false, checked") {
    checkAsyncCopies<lang::f16, 8>();
    checkAsyncCopies<lang::bf16, 4>();
    checkAsyncCopies<float, 4>();
    checkAsyncCopies<float, 2>();
    checkAsyncCopies<int32_t, 2>();
    checkAsyncCopies<uint8_t, 8>(); // no raw copy (8-bit integers are ints in shared memory)
    checkAsyncCopies<double, 2>();
}

TEST_CASE("asynchronous copies break the language's rules loudly at recording") {
    const auto refused = [](const std::function<void(lang::Builder &)> &body, const char *words) {
        CAPTURE(words);
        try {
            (void)lang::kernel("bad_copy", body);
            FAIL_CHECK("recorded");
        } catch (const Error &e) {
            CHECK(std::string(e.what()).find(words) != std::string::npos);
        }
    };
    refused([](lang::Builder &k) {
        auto x = k.input<float>();
        auto p = k.array<float>(8);
        lang::copyAsync<4>(p, 0u, x, 0u);
    }, "private array");
    refused([](lang::Builder &k) {
        auto x = k.output<float>();
        auto s = k.shared<float>(8);
        lang::copyAsync<4>(s, 0u, x, 0u);
    }, "write-only");
    refused([](lang::Builder &k) {
        auto x = k.input<double>();
        auto s = k.shared<double>(8);
        lang::copyAsync<4>(s, 0u, x, 0u);
    }, "over 16 bytes");
    refused([](lang::Builder &k) {
        auto x = k.input<float>();
        auto s = k.shared<float>(8);
        lang::copyAsync<4>(s, 2u, x, 0u);
    }, "not a multiple of 4");
}

TEST_CASE("a kernel whose shared memory exceeds the device's is refused before it compiles") {
    const lang::Kernel big = lang::kernel("big_shared", [](lang::Builder &k) {
        auto out = k.output<float>();
        auto s = k.shared<float>(1u << 20); // 4 MiB
        s[k.localId().x] = 1.0f;
        k.barrier();
        out[k.localId().x] = s[0u];
    });
    for (ComputeClient &client : clients()) {
        CAPTURE(client.device().id());
        if (client.device().maxSharedMemoryBytes == 0 || client.device().accepts(Dialect::Host)) continue;
        Buffer o = client.empty(256);
        Dispatch d;
        d.grid = {1};
        d.block = {64};
        d.bindings = {o};
        try {
            client.execute(big, d);
            FAIL_CHECK("ran");
        } catch (const Error &e) {
            CHECK((e.code() == ErrorCode::Unsupported));
            CHECK(std::string(e.what()).find("bytes of shared memory") != std::string::npos);
        }
    }
}

TEST_CASE("vectors break the language's rules loudly at recording") {
    CHECK_THROWS_WITH_AS(lang::kernel("vec_rules",
                                      [](lang::Builder &k) {
                                          auto x = k.input<float>();
                                          (void)lang::loadVector<4>(x, 6u);
                                      }),
                         doctest::Contains("not a multiple of 4"), Error);
    CHECK_THROWS_WITH_AS(lang::kernel("vec_rules",
                                      [](lang::Builder &k) {
                                          auto x = k.output<float>();
                                          lang::storeVector(x, 2u, lang::Vector<float, 4>(Value<float>(1.0f)));
                                      }),
                         doctest::Contains("not a multiple of 4"), Error);
}

TEST_CASE("hostile SPIR-V with the cooperative-matrix capability is refused, never a crash") {
    // Modules a reviewer built: garbage opcodes (SPIRV-Cross's parser crashed on it), truncated
    // strings, an interface that omits the buffers it uses, a 2^32-byte push-constant offset,
    // a 2^31-bit integer. Every one gets an Error from kernel_load or the launch.
    std::vector<std::filesystem::path> files;
    for (const auto &entry : std::filesystem::directory_iterator(SPIRV_DIR)) files.push_back(entry.path());
    std::sort(files.begin(), files.end());
    REQUIRE(files.size() >= 6);
    for (ComputeClient &client : clients()) {
        if (!client.device().accepts(Dialect::Spirv)) continue;
        for (const std::filesystem::path &file : files) {
            CAPTURE(file.filename().string());
            std::ifstream in(file, std::ios::binary);
            KernelVariant variant;
            variant.dialect = Dialect::Spirv;
            variant.entryPoint = "main";
            variant.source.assign(std::istreambuf_iterator<char>(in), {});
            KernelSource kernel;
            kernel.name = "hostile_spirv";
            kernel.variants.push_back(variant);
            Buffer buffer = client.createFrom<float>(std::vector<float>(1024, 0.0f));
            Dispatch d;
            d.grid = {1};
            d.block = {1};
            d.bindings = {buffer, buffer, buffer};
            d.scalar(1u).scalar(2u).scalar(3u);
            CHECK_THROWS_AS(client.execute(kernel, d), Error);
        }
        // The device still works afterwards.
        Buffer ok = client.createFrom<float>(std::vector<float>{1.0f, 2.0f});
        CHECK(client.readAs<float>(ok) == std::vector<float>{1.0f, 2.0f});
    }
}

TEST_CASE("review findings: kernels with only B or accumulator fragments are refused too; "
          "vectors of the wrong size; checked vectors at the top of the u32 range; bad tiles") {
    // B-only and accumulator-only kernels need the matrix units as much as A does.
    const lang::Kernel accOnly = lang::kernel("mu_acc_only", [](lang::Builder &k) {
        auto c = k.inout<float>();
        auto acc = k.accumulator<float>();
        acc.load(c, 0u, 16u);
        acc.store(c, 0u, 16u);
    });
    const lang::Kernel bOnly = lang::kernel("mu_b_only", [](lang::Builder &k) {
        auto b = k.input<lang::bf16>();
        k.matrixB<lang::bf16>().load(b, 0u, 16u);
    });
    KernelFeatures none = clients().front().device().features; // host: every type
    none.matrixShapes.clear();
    CHECK(accOnly.missingOn(none) == "matrix units of 16x16x16 (an f32 accumulator)");
    CHECK(bOnly.missingOn(none) == "matrix units of 16x16x16 bf16*bf16+f32");
    const Runtime small = makeRuntime(R"({"matrix_units": false})");
    ComputeClient host = small.open(small.select("host:0"));
    Buffer c = host.createFrom<float>(std::vector<float>(256, 4.0f));
    Dispatch d;
    d.grid = {1};
    d.block = {1};
    d.bindings = {c};
    CHECK_THROWS_WITH_AS(host.execute(accOnly, d), doctest::Contains("an f32 accumulator"), Error);

    // A Vector is exactly N values.
    CHECK_THROWS_AS(lang::kernel("vec_parts", [](lang::Builder &k) {
        auto x = k.input<float>();
        (void)lang::Vector<float, 4>(std::vector<Value<float>>{x[0u]});
    }), Error);

    // Checked: a vector at 0xfffffffe has no element inside an 8-element buffer (its parts do
    // not wrap to elements 0 and 1).
    const lang::Kernel top = lang::kernel("vec_top", [](lang::Builder &k) {
        auto x = k.inout<float>();
        auto at = k.scalar<uint32_t>();
        const lang::Vector<float, 4> v = lang::loadVector<4>(x, at);
        lang::storeVector(x, at, v + Value<float>(5.0f));
    }, {.checked = true});
    for (ComputeClient &client : clients()) {
        CAPTURE(client.device().id());
        Buffer x = client.createFrom<float>(std::vector<float>(8, 1.0f));
        Dispatch t;
        t.grid = {1};
        t.block = {1};
        t.bindings = {x};
        t.scalar(0xfffffffeu);
        client.execute(top, t);
        CHECK(client.readAs<float>(x) == std::vector<float>(8, 1.0f));
    }

    // Tiles that do not divide into 16 x 16 accumulators per subgroup are refused.
    CHECK_THROWS_AS(kernels::matmulMatrixUnits<lang::bf16>({48, 32, 16, 2, 1}), Error);
    CHECK_THROWS_AS(kernels::matmulMatrixUnits<lang::bf16>({32, 32, 24, 1, 2}), Error);
}

TEST_CASE("matrix kernels need workgroups of whole subgroups") {
    const lang::Kernel kernel = tileKernel<lang::f16>({16, 16, 16}, Layout::RowMajor,
                                                      Layout::RowMajor, false, false);
    for (ComputeClient &client : clients()) {
        CAPTURE(client.device().id());
        const uint32_t width = client.device().subgroupSize;
        if (width <= 1 || !kernel.missingOn(client.device().features).empty()) continue;
        Buffer a = client.empty(1024), b = client.empty(1024), c = client.empty(1024);
        Dispatch d;
        d.grid = {1};
        d.block = {width / 2};
        d.bindings = {a, b, c};
        CHECK_THROWS_WITH_AS(client.execute(kernel, d), doctest::Contains("whole subgroups"), Error);
    }
}

TEST_CASE("the tuner skips a matrix-unit candidate on a device without matrix units, with the "
          "reason, and its key names the device's capabilities") {
    const Runtime small = makeRuntime(R"({"matrix_units": false})");
    ComputeClient client = small.open(small.select("host:0"));
    const uint32_t size = 32;
    Buffer a = client.createFrom<float>(std::vector<float>(size * size, 1.0f));
    Buffer b = client.createFrom<float>(std::vector<float>(size * size, 1.0f));
    Buffer half = client.empty(2 * size * size);
    Buffer c = client.empty(4 * size * size);
    const lang::Kernel units = kernels::matmulMatrixUnits<lang::bf16>({32, 32, 16, 1, 2});
    const lang::Kernel plain = kernels::matmul({16, 1, 16});
    tune::TunableSet<uint32_t, void> set("matmul_units_or_not",
                                         [](const uint32_t &n, TuneLevel) { return "n=" + std::to_string(n); });
    set.add("matrix_units", [&](const uint32_t &n) {
        Dispatch d;
        d.grid = {1, 1};
        d.block = {2};
        d.bindings = {half, half, c};
        d.scalar(n).scalar(n).scalar(n);
        client.execute(units, d);
    });
    set.add("tiled", [&](const uint32_t &n) {
        Dispatch d;
        d.grid = {n / 16, n / 16};
        d.block = {16, 16};
        d.bindings = {a, b, c};
        d.scalar(n).scalar(n).scalar(n);
        client.execute(plain, d);
    });
    tune::Tuner::Options options;
    options.device = deviceFingerprint(client.device());
    options.progress = false;
    tune::Tuner tuner(options);
    tuner.execute(set, size);
    const auto record = tuner.lookup(set.info(), "n=32");
    REQUIRE(record.has_value());
    CHECK(record->winner == "tiled");
    REQUIRE(record->results.size() == 2);
    CHECK_FALSE(record->results[0].ok);
    CHECK(record->results[0].error.find("matrix units of 16x16x16 bf16*bf16+f32") != std::string::npos);
    // The same host with its matrix units is another device for the tuner.
    CHECK(deviceFingerprint(client.device()) != deviceFingerprint(clients().front().device()));
    CHECK(options.device.find("matrix none") != std::string::npos);
}

namespace {

template <class T> void checkRowKernels(double tolerance) {
    const lang::Kernel softmax = kernels::softmaxRows<T>(64);
    const lang::Kernel sums = kernels::rowSum<T>(64);
    // Up to 64 * 32 = 2048 columns a row stays in registers (read once); 2051 takes two passes.
    for (uint32_t cols : {1000u, 1024u, 3u, 2048u, 2051u}) {
        const uint32_t rows = 5;
        const Input<T> x(size_t{rows} * cols, 21 + cols);
        // The stored values (Input::value rounds floats to tf32, for the matrix units).
        std::vector<double> value;
        for (const T &v : x.stored) value.push_back(toDouble(v));
        std::vector<double> want(size_t{rows} * cols), wantSum(rows, 0.0);
        for (uint32_t r = 0; r < rows; ++r) {
            double top = -1e300, total = 0;
            for (uint32_t i = 0; i < cols; ++i) top = std::max<double>(top, value[r * cols + i]);
            for (uint32_t i = 0; i < cols; ++i) total += std::exp(value[r * cols + i] - top);
            for (uint32_t i = 0; i < cols; ++i) {
                want[r * cols + i] = std::exp(value[r * cols + i] - top) / total;
                wantSum[r] += value[r * cols + i];
            }
        }
        for (ComputeClient &client : clients()) {
            CAPTURE(client.device().id());
            CAPTURE(cols);
            CAPTURE(softmax.name());
            if (!softmax.missingOn(client.device().features).empty()) continue;
            Buffer in = client.createFrom<T>(x.stored);
            Buffer out = client.empty(sizeof(T) * rows * cols), total = client.empty(4 * rows);
            Dispatch d;
            d.grid = {rows};
            d.block = {64};
            d.bindings = {in, out};
            d.scalar(cols);
            client.execute(softmax, d);
            d.bindings = {in, total};
            client.execute(sums, d);
            const std::vector<T> got = client.readAs<T>(out);
            int bad = 0;
            for (size_t i = 0; i < got.size(); ++i) {
                const double g = toDouble(got[i]);
                if (std::fabs(g - want[i]) > tolerance * want[i] + 1e-7 && bad++ < 4)
                    FAIL_CHECK(("softmax element " + std::to_string(i) + ": got " + std::to_string(g) +
                                ", want " + std::to_string(want[i])));
            }
            CHECK(bad == 0);
            const std::vector<float> gotSum = client.readAs<float>(total);
            for (uint32_t r = 0; r < rows; ++r)
                CHECK(std::fabs(gotSum[r] - wantSum[r]) <= 1e-4 * (std::fabs(wantSum[r]) + cols));
        }
    }
}

} // namespace

TEST_CASE("row softmax and row sums in f32, f16 and bf16, with vector bodies and scalar tails") {
    checkRowKernels<float>(2e-5);
    checkRowKernels<lang::f16>(1.5e-3);
    checkRowKernels<lang::bf16>(8e-3);
}

TEST_CASE("row softmax gives the same special values on both of its paths: -inf is 0, a NaN "
          "makes the row NaN") {
    // Review finding: the two-pass path (rows past blockSize * 32) turned a row that starts with
    // -inf (a masked position) into NaN everywhere, while the kept path gave the right answer;
    // and the paths disagreed on NaN.
    const lang::Kernel softmax = kernels::softmaxRows<float>(64);
    const float inf = std::numeric_limits<float>::infinity();
    for (uint32_t cols : {5u, 2048u, 2051u, 3000u}) {
        const uint32_t rows = 2;
        std::vector<float> x(size_t{rows} * cols);
        for (uint32_t i = 0; i < cols; ++i) {
            x[i] = i < 4 ? -inf : std::sin(float(i)) * 3.0f;     // row 0: masked start
            x[cols + i] = i == cols / 2 ? NAN : float(i % 7);     // row 1: one NaN
        }
        double top = -1e300, total = 0;
        for (uint32_t i = 4; i < cols; ++i) top = std::max<double>(top, x[i]);
        for (uint32_t i = 4; i < cols; ++i) total += std::exp(double(x[i]) - top);
        for (ComputeClient &client : clients()) {
            CAPTURE(client.device().id());
            CAPTURE(cols);
            Buffer in = client.createFrom<float>(x);
            Buffer out = client.empty(4ull * rows * cols);
            Dispatch d;
            d.grid = {rows};
            d.block = {64};
            d.bindings = {in, out};
            d.scalar(cols);
            client.execute(softmax, d);
            const std::vector<float> got = client.readAs<float>(out);
            int bad = 0;
            for (uint32_t i = 0; i < cols; ++i) {
                const double want = i < 4 ? 0.0 : std::exp(double(x[i]) - top) / total;
                if (!(std::fabs(got[i] - want) <= 2e-5 * want + 1e-7) && bad++ < 3)
                    FAIL_CHECK(("row 0 element " + std::to_string(i) + ": got " + std::to_string(got[i]) +
                                ", want " + std::to_string(want)));
                if (!std::isnan(got[cols + i]) && bad++ < 3)
                    FAIL_CHECK(("row 1 element " + std::to_string(i) + ": got " +
                                std::to_string(got[cols + i]) + ", want NaN"));
            }
            CHECK(bad == 0);
        }
    }
}
