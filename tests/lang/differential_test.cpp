// Every portable kernel on every device present (host always; lavapipe in CI; CUDA and Vulkan on
// the GPU machine), compared with a CPU reference: exact for integers, a stated bound for floats.
// Also pins down the rules where targets differ: integer division, shifts, casts, contraction,
// out-of-bounds accesses in checked mode, subgroup width, atomics. Public API only.
#include <backplane/client.hpp>
#include <backplane/config.hpp>
#include <backplane/error.hpp>
#include <backplane/kernels.hpp>
#include <backplane/lang.hpp>
#include <backplane/runtime.hpp>

#include <doctest/doctest.h>

#include <bit>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

using namespace backplane;
using lang::Value;

namespace {

/// The runtime over every plugin manifest this build made (plugins whose device is missing
/// simply report none).
const Runtime &runtime() {
    static const Runtime instance([] {
        Config config;
        config.pluginPathOverride = {MANIFESTS};
        config.probeMode = ProbeMode::InProcess;
        config.cacheEnabled = false;
        return config;
    }());
    return instance;
}

/// The host plugin with its compiler switched off: portable kernels run in the interpreter, the
/// reference the compiled host kernels are compared with.
const Runtime &interpreterRuntime() {
    static const Runtime instance([] {
        Config config;
        config.pluginPathOverride = {MANIFESTS};
        config.probeMode = ProbeMode::InProcess;
        config.cacheEnabled = false;
        config.pluginOptions["host"] = R"({"compile_kernels": false})";
        config.pluginEnable = {"host"};
        return config;
    }());
    return instance;
}

/// One client per device present, and the host once more with its kernels interpreted (when
/// the first host compiles them), so that every test compares compiled and interpreted host
/// kernels with the same reference.
std::vector<ComputeClient> &clients() {
    static std::vector<ComputeClient> all = [] {
        std::vector<ComputeClient> opened;
        bool hostCompiles = false;
        for (const PhysicalDevice &device : runtime().devices()) {
            for (const DeviceInfo &route : device.routes) {
                opened.push_back(runtime().open(runtime().select(route.id())));
                std::string kernels;
                if (!route.kernelCompiler.empty())
                    kernels = std::string("; kernels ") +
                              (route.accepts(Dialect::Cpp) ? "compiled by " : "interpreted: ") +
                              route.kernelCompiler;
                MESSAGE("device " << route.id() << ": " << route.name << kernels);
                hostCompiles = hostCompiles || (route.backend == "host" && route.accepts(Dialect::Cpp));
            }
        }
        if (hostCompiles) {
            opened.push_back(interpreterRuntime().open(interpreterRuntime().select("host")));
            MESSAGE("device host:0 again, interpreted");
        }
        return opened;
    }();
    return all;
}

/// The host client that compiles kernels and the one that interprets them (both null when the
/// host has no compiler here).
std::pair<ComputeClient *, ComputeClient *> hostPair() {
    ComputeClient *compiled = nullptr, *interpreted = nullptr;
    for (ComputeClient &c : clients()) {
        if (c.device().backend != "host") continue;
        if (c.device().accepts(Dialect::Cpp)) compiled = &c;
        else interpreted = &c;
    }
    if (compiled == nullptr) interpreted = nullptr;
    return {compiled, interpreted};
}

uint32_t ceilDiv(uint32_t a, uint32_t b) { return (a + b - 1) / b; }

/// Within `ulps` units in the last place of `want`, or `absolute` of it (NaN never matches).
bool close(float got, float want, int ulps, float absolute = 0) {
    if (std::isnan(got) || std::isnan(want)) return false;
    if (std::fabs(got - want) <= absolute) return true;
    const auto a = std::bit_cast<int32_t>(got), b = std::bit_cast<int32_t>(want);
    if ((a < 0) != (b < 0)) return got == want;
    return std::abs(int64_t(a) - int64_t(b)) <= ulps;
}

std::vector<float> randomFloats(size_t n, uint32_t seed, float lo = -1, float hi = 1) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> dist(lo, hi);
    std::vector<float> v(n);
    for (float &x : v) x = dist(rng);
    return v;
}

template <class T> std::vector<T> randomInts(size_t n, uint32_t seed, int64_t lo, int64_t hi) {
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int64_t> dist(lo, hi);
    std::vector<T> v(n);
    for (T &x : v) x = static_cast<T>(dist(rng));
    return v;
}

Dispatch oneD(uint32_t threads, uint32_t block = 64) {
    Dispatch d;
    d.block = {block, 1, 1};
    d.grid = {ceilDiv(threads, block), 1, 1};
    return d;
}

/// Runs the two-pass reduction: per-group partials, then one group over them.
template <class T> T reduceOn(ComputeClient &c, const std::vector<T> &x, uint32_t block) {
    const lang::Kernel k = kernels::reduceSum<T>(block);
    const uint32_t n = static_cast<uint32_t>(x.size()), groups = 40;
    Buffer in = c.createFrom<T>(x);
    Buffer partial = c.empty(groups * sizeof(T));
    Buffer total = c.empty(sizeof(T));
    Dispatch first;
    first.block = {block, 1, 1};
    first.grid = {groups, 1, 1};
    first.bindings = {in, partial};
    first.scalar(n);
    c.execute(k, first);
    Dispatch second;
    second.block = {block, 1, 1};
    second.bindings = {partial, total};
    second.scalar(groups);
    c.execute(k, second);
    return c.readAs<T>(total)[0];
}

template <class T> std::vector<T> scanOn(ComputeClient &c, const std::vector<T> &x, uint32_t block) {
    Buffer in = c.createFrom<T>(x);
    Buffer out = c.empty(x.size() * sizeof(T));
    Dispatch d;
    d.block = {block, 1, 1};
    d.bindings = {in, out};
    d.scalar(static_cast<uint32_t>(x.size()));
    c.execute(kernels::inclusiveScan<T>(block), d);
    return c.readAs<T>(out);
}

bool fits(const DeviceInfo &device, uint32_t threads, uint32_t sharedBytes) {
    return (device.maxBlockThreads == 0 || threads <= device.maxBlockThreads) &&
           (device.maxSharedMemoryBytes == 0 || sharedBytes <= device.maxSharedMemoryBytes);
}

} // namespace

TEST_CASE("there is at least the host device to run on") { REQUIRE(!clients().empty()); }

TEST_CASE("saxpy matches a*x+y fused on every device") {
    const lang::Kernel saxpy = kernels::saxpy();
    const uint32_t n = 10007;
    const std::vector<float> x = randomFloats(n, 1), y = randomFloats(n, 2);
    const float a = 1.37f;
    for (ComputeClient &c : clients()) {
        CAPTURE(c.device().id());
        Buffer bx = c.createFrom<float>(x), by = c.createFrom<float>(y);
        Dispatch d = oneD(n, 256);
        d.bindings = {bx, by};
        d.scalar(a).scalar(n);
        c.execute(saxpy, d);
        const std::vector<float> got = c.readAs<float>(by);
        size_t wrong = 0;
        for (uint32_t i = 0; i < n; ++i)
            // fma() is correctly rounded on CUDA and the host; Vulkan only promises the
            // precision of a multiply and an add: 1 ULP, plus the product's rounding.
            wrong += !close(got[i], std::fma(a, x[i], y[i]), 1, 1e-7f);
        CHECK(wrong == 0);
    }
}

TEST_CASE("the shared-memory reduction sums exactly for integers, within a bound for floats") {
    const std::vector<uint32_t> u = randomInts<uint32_t>(100003, 3, 0, 1u << 20);
    const std::vector<int32_t> s = randomInts<int32_t>(77777, 4, -100000, 100000);
    const std::vector<float> f = randomFloats(65536 + 17, 5);
    uint32_t wantU = 0;
    for (uint32_t v : u) wantU += v;
    int32_t wantS = 0;
    for (int32_t v : s) wantS += v;
    double wantF = 0, magnitude = 0;
    for (float v : f) wantF += v, magnitude += std::fabs(v);
    for (ComputeClient &c : clients()) {
        CAPTURE(c.device().id());
        for (uint32_t block : {64u, 256u}) {
            if (!fits(c.device(), block, block * 4)) continue;
            CAPTURE(block);
            CHECK(reduceOn<uint32_t>(c, u, block) == wantU);
            CHECK(reduceOn<int32_t>(c, s, block) == wantS);
            // Each thread sums a few elements, then a tree: a few tens of roundings of at most
            // eps * sum |x| each; the bound is 1e-5 * sum |x|.
            CHECK(std::fabs(reduceOn<float>(c, f, block) - wantF) <= 1e-5 * magnitude);
        }
    }
}

TEST_CASE("the inclusive prefix sum is exact for integers and bounded for floats") {
    const std::vector<int32_t> s = randomInts<int32_t>(5000, 6, -1000, 1000);
    const std::vector<float> f = randomFloats(3001, 7);
    for (ComputeClient &c : clients()) {
        CAPTURE(c.device().id());
        const std::vector<int32_t> gotS = scanOn<int32_t>(c, s, 128);
        int32_t running = 0;
        size_t wrong = 0;
        for (size_t i = 0; i < s.size(); ++i) wrong += gotS[i] != (running += s[i]);
        CHECK(wrong == 0);
        const std::vector<float> gotF = scanOn<float>(c, f, 256);
        double exact = 0, magnitude = 0;
        wrong = 0;
        for (size_t i = 0; i < f.size(); ++i) {
            exact += f[i];
            magnitude += std::fabs(f[i]);
            // One rounding per chunk carried plus log2(block) in the chunk: 4e-6 * sum |x|.
            wrong += !(std::fabs(gotF[i] - exact) <= 4e-6 * magnitude + 1e-6);
        }
        CHECK(wrong == 0);
    }
}

TEST_CASE("the tiled matmul matches a double-precision CPU product for every tile set") {
    const uint32_t m = 67, n = 45, k = 33;
    const std::vector<float> a = randomFloats(size_t(m) * k, 8), b = randomFloats(size_t(k) * n, 9);
    std::vector<double> want(size_t(m) * n, 0.0);
    for (uint32_t i = 0; i < m; ++i)
        for (uint32_t p = 0; p < k; ++p)
            for (uint32_t j = 0; j < n; ++j) want[size_t(i) * n + j] += double(a[i * k + p]) * b[p * n + j];
    for (ComputeClient &c : clients()) {
        CAPTURE(c.device().id());
        for (kernels::MatmulTiles tiles : {kernels::MatmulTiles{16, 1, 16}, kernels::MatmulTiles{32, 2, 8},
                                           kernels::MatmulTiles{64, 4, 16}}) {
            if (!fits(c.device(), tiles.threads() * tiles.threads(), tiles.sharedBytes())) continue;
            CAPTURE(tiles.name());
            Buffer ba = c.createFrom<float>(a), bb = c.createFrom<float>(b), bc = c.empty(size_t(m) * n * 4);
            Dispatch d;
            d.block = {tiles.threads(), tiles.threads(), 1};
            d.grid = {ceilDiv(n, tiles.tile), ceilDiv(m, tiles.tile), 1};
            d.bindings = {ba, bb, bc};
            d.scalar(m).scalar(n).scalar(k);
            c.execute(kernels::matmul(tiles), d);
            const std::vector<float> got = c.readAs<float>(bc);
            size_t wrong = 0;
            for (size_t i = 0; i < got.size(); ++i)
                // k fused products of values in [-1, 1]: k * eps bounds the error.
                wrong += !(std::fabs(got[i] - want[i]) <= 1e-6 * k);
            CHECK(wrong == 0);
        }
    }
}

TEST_CASE("integer division, remainder, shifts and casts give the same bits on every device") {
    // out = { a / b, a % b, a << s, a >> s } for i32, and the u32 and float-cast cases.
    const lang::Kernel k = lang::kernel("int_rules", [](lang::Builder &b) {
        auto x = b.input<int32_t>();
        auto f = b.input<float>();
        auto out = b.output<int32_t>();
        auto uout = b.output<uint32_t>();
        auto n = b.scalar<uint32_t>();
        auto i = b.globalId().x;
        b.If(i < n, [&] {
            Value<int32_t> a = x[2u * i], d = x[2u * i + 1u];
            out[4u * i] = a / d;
            out[4u * i + 1u] = a % d;
            out[4u * i + 2u] = a << d;
            out[4u * i + 3u] = a >> d;
            auto ua = lang::cast<uint32_t>(a), ud = lang::cast<uint32_t>(d);
            uout[4u * i] = ua / ud;
            uout[4u * i + 1u] = ua % ud;
            uout[4u * i + 2u] = lang::cast<uint32_t>(lang::cast<int32_t>(f[i]));
            uout[4u * i + 3u] = lang::cast<uint32_t>(f[i]);
        });
    });
    const int32_t kMin = std::numeric_limits<int32_t>::min();
    const std::vector<int32_t> pairs = {7, 2, -7, 2, 7, -2, -7, -2, kMin, -1, 5, 0, -5, 0, 0, 0,
                                        1, 33, -8, 33, 1, 31, kMin, 1};
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const std::vector<float> floats = {-1.5f, 3e9f, -3e9f, nan, 2.9f, 5e9f, -0.5f, 1e10f,
                                       -2147483648.0f, 4294967040.0f, 0.99f, -7.9f};
    const uint32_t count = static_cast<uint32_t>(pairs.size() / 2);
    // The rules of lang.hpp: truncating division, x / 0 = 0, x % 0 = 0, INT_MIN / -1 = INT_MIN,
    // shift counts modulo 32, float -> int saturating with NaN -> 0.
    auto div = [&](int32_t a, int32_t d) { return d == 0 ? 0 : d == -1 ? int32_t(0u - uint32_t(a)) : a / d; };
    auto rem = [&](int32_t a, int32_t d) { return d == 0 || d == -1 ? 0 : a % d; };
    auto f2i = [](float v) -> int32_t {
        if (std::isnan(v)) return 0;
        if (v <= -2147483648.0f) return std::numeric_limits<int32_t>::min();
        if (v >= 2147483648.0f) return std::numeric_limits<int32_t>::max();
        return static_cast<int32_t>(v);
    };
    auto f2u = [](float v) -> uint32_t {
        if (std::isnan(v) || v <= 0.0f) return 0;
        if (v >= 4294967296.0f) return std::numeric_limits<uint32_t>::max();
        return static_cast<uint32_t>(v);
    };
    for (ComputeClient &c : clients()) {
        CAPTURE(c.device().id());
        Buffer bx = c.createFrom<int32_t>(pairs), bf = c.createFrom<float>(floats);
        Buffer bo = c.empty(count * 16), bu = c.empty(count * 16);
        Dispatch d = oneD(count, 32);
        d.bindings = {bx, bf, bo, bu};
        d.scalar(count);
        c.execute(k, d);
        const std::vector<int32_t> got = c.readAs<int32_t>(bo);
        const std::vector<uint32_t> ugot = c.readAs<uint32_t>(bu);
        for (uint32_t i = 0; i < count; ++i) {
            const int32_t a = pairs[2 * i], dv = pairs[2 * i + 1];
            const uint32_t ua = uint32_t(a), ud = uint32_t(dv);
            CAPTURE(a);
            CAPTURE(dv);
            CHECK(got[4 * i] == div(a, dv));
            CHECK(got[4 * i + 1] == rem(a, dv));
            CHECK(got[4 * i + 2] == int32_t(ua << (ud & 31)));
            CHECK(got[4 * i + 3] == (a >> (dv & 31)));
            CHECK(ugot[4 * i] == (ud == 0 ? 0 : ua / ud));
            CHECK(ugot[4 * i + 1] == (ud == 0 ? 0 : ua % ud));
            CAPTURE(floats[i]);
            CHECK(ugot[4 * i + 2] == uint32_t(f2i(floats[i])));
            CHECK(ugot[4 * i + 3] == f2u(floats[i]));
        }
    }
}

TEST_CASE("a*b+c rounds twice and fma() once on every device") {
    const lang::Kernel k = lang::kernel("contraction", [](lang::Builder &b) {
        auto x = b.input<float>();
        auto out = b.output<float>();
        auto i = b.globalId().x;
        b.If(i == 0u, [&] {
            Value<float> p = x[0u], q = x[1u], r = x[2u];
            out[0u] = p * q - r;
            out[1u] = fma(p, q, -r);
        });
    });
    // (1 + 2^-23)^2 = 1 + 2^-22 + 2^-46: the product rounds to 1 + 2^-22, so a*b - c is 0 with
    // two roundings and 2^-46 fused.
    const float one = 1.0f + std::ldexp(1.0f, -23);
    const std::vector<float> in = {one, one, 1.0f + std::ldexp(1.0f, -22)};
    for (ComputeClient &c : clients()) {
        CAPTURE(c.device().id());
        Buffer bx = c.createFrom<float>(in), bo = c.empty(8);
        Dispatch d = oneD(1, 1);
        d.bindings = {bx, bo};
        c.execute(k, d);
        const std::vector<float> got = c.readAs<float>(bo);
        CHECK(got[0] == 0.0f);
        // Vulkan's fma() only promises the precision of a multiply and an add (the spec's
        // precision table); llvmpipe rounds twice. Every other target fuses.
        if (c.device().backend == "vulkan") CHECK((got[1] == 0.0f || got[1] == std::ldexp(1.0f, -46)));
        else CHECK(got[1] == std::ldexp(1.0f, -46));
    }
}

TEST_CASE("checked kernels read 0 and write nothing out of bounds, on views too") {
    const lang::Kernel k = lang::kernel("checked_copy", [](lang::Builder &b) {
        auto x = b.input<uint32_t>();
        auto y = b.inout<uint32_t>();
        auto n = b.scalar<uint32_t>();
        auto shared = b.shared<uint32_t>(4);
        auto priv = b.array<uint32_t>(2);
        auto i = b.globalId().x;
        b.If(i < n, [&] {
            priv[i] = 5u;                     // in range only for i < 2
            shared[i] = 7u;                   // in range only for i < 4
            y[i] = x[i] + 1u + priv[i] * 0u;  // x has n / 2 elements: the rest read 0
            atomicAdd(y[i + n], 1u);          // always past the end of y's view
        });
    }, {.checked = true});
    const uint32_t n = 64;
    std::vector<uint32_t> x(n / 2);
    for (uint32_t i = 0; i < n / 2; ++i) x[i] = 100 + i;
    for (ComputeClient &c : clients()) {
        CAPTURE(c.device().id());
        Buffer bx = c.createFrom<uint32_t>(x);
        Buffer whole = c.createFrom<uint32_t>(std::vector<uint32_t>(2 * n, 0xdeadbeef));
        Buffer y = whole.view(0, n * 4); // the second half must stay untouched
        Dispatch d = oneD(n, 32);
        d.bindings = {bx, y};
        d.scalar(n);
        c.execute(k, d);
        const std::vector<uint32_t> got = c.readAs<uint32_t>(whole);
        for (uint32_t i = 0; i < n; ++i) CHECK(got[i] == (i < n / 2 ? 101 + i : 1u));
        for (uint32_t i = n; i < 2 * n; ++i) CHECK(got[i] == 0xdeadbeef);
    }
}

TEST_CASE("subgroup operations use the width the device reports") {
    const lang::Kernel k = lang::kernel("subgroups", [](lang::Builder &b) {
        auto out = b.output<uint32_t>();
        auto i = b.globalId().x;
        auto lane = b.subgroupLane();
        auto width = b.subgroupSize();
        auto sum = subgroupSum(Value<uint32_t>(1u));
        auto x = shuffleXor(lane, Value<uint32_t>(1u));
        auto top = subgroupMax(lane);
        out[4u * i] = width;
        out[4u * i + 1u] = sum;
        out[4u * i + 2u] = x;
        out[4u * i + 3u] = top;
    });
    for (ComputeClient &c : clients()) {
        CAPTURE(c.device().id());
        const uint32_t width = c.device().subgroupSize, threads = 128;
        if (width == 0 || threads % width != 0) continue;
        Buffer out = c.empty(threads * 16);
        Dispatch d = oneD(threads, threads);
        d.bindings = {out};
        c.execute(k, d);
        const std::vector<uint32_t> got = c.readAs<uint32_t>(out);
        for (uint32_t i = 0; i < threads; ++i) {
            CHECK(got[4 * i] == width);
            CHECK(got[4 * i + 1] == width);
            CHECK(got[4 * i + 3] == width - 1);
            if (width > 1) CHECK((got[4 * i + 2] ^ 1u) < width);
        }
    }
}

TEST_CASE("atomics from every thread of every workgroup all land") {
    const lang::Kernel k = lang::kernel("atomics", [](lang::Builder &b) {
        auto counters = b.inout<uint32_t>();
        auto signedMin = b.inout<int32_t>();
        auto n = b.scalar<uint32_t>();
        auto i = b.globalId().x;
        b.If(i < n, [&] {
            atomicAdd(counters[0u], 1u);
            atomicMax(counters[1u], i);
            atomicMin(signedMin[0u], Value<int32_t>(0) - lang::cast<int32_t>(i));
            atomicOr(counters[2u], Value<uint32_t>(1u) << (i % 32u));
        });
    });
    const uint32_t n = 5000;
    for (ComputeClient &c : clients()) {
        CAPTURE(c.device().id());
        Buffer counters = c.createFrom<uint32_t>(std::vector<uint32_t>{0u, 0u, 0u});
        Buffer smin = c.createFrom<int32_t>(std::vector<int32_t>{0});
        Dispatch d = oneD(n, 64);
        d.bindings = {counters, smin};
        d.scalar(n);
        c.execute(k, d);
        const std::vector<uint32_t> got = c.readAs<uint32_t>(counters);
        CHECK(got[0] == n);
        CHECK(got[1] == n - 1);
        CHECK(got[2] == 0xffffffffu);
        CHECK(c.readAs<int32_t>(smin)[0] == -int32_t(n - 1));
    }
}

TEST_CASE("control flow: nested loops with break, continue and return agree with the CPU") {
    const lang::Kernel k = lang::kernel("control", [](lang::Builder &b) {
        auto out = b.output<uint32_t>();
        auto n = b.scalar<uint32_t>();
        auto i = b.globalId().x;
        b.If(i >= n, [&] { b.Return(); });
        auto total = b.var<uint32_t>(0u);
        b.For(0u, i % 7u + 1u, [&](Value<uint32_t> j) {
            b.If(j == 3u, [&] { b.Continue(); });
            auto w = b.var<uint32_t>(j);
            b.While([&] { return w < 10u; }, [&] {
                b.If((w + i) % 5u == 0u, [&] { b.Break(); });
                total += w;
                w += 2u;
            });
            b.If(total > 40u, [&] { b.Break(); }).Else([&] { total += 1u; });
        });
        out[i] = total;
    });
    const uint32_t n = 1000;
    std::vector<uint32_t> want(n);
    for (uint32_t i = 0; i < n; ++i) {
        uint32_t total = 0;
        for (uint32_t j = 0; j < i % 7 + 1; ++j) {
            if (j == 3) continue;
            for (uint32_t w = j; w < 10; w += 2) {
                if ((w + i) % 5 == 0) break;
                total += w;
            }
            if (total > 40) break;
            total += 1;
        }
        want[i] = total;
    }
    for (ComputeClient &c : clients()) {
        CAPTURE(c.device().id());
        Buffer out = c.empty(n * 4);
        Dispatch d = oneD(n + 30, 64); // extra threads return early
        d.bindings = {out};
        d.scalar(n);
        c.execute(k, d);
        CHECK(c.readAs<uint32_t>(out) == want);
    }
}

TEST_CASE("the host interpreter refuses a workgroup whose scratch it could not hold") {
    // 1 Mi private floats per thread: 4 MiB a lane, 4 GiB for 1024 lanes.
    const lang::Kernel k = lang::kernel("huge_private", [](lang::Builder &b) {
        auto out = b.output<float>();
        auto big = b.array<float>(1u << 20);
        big[b.localIndex()] = 1.0f;
        out[b.globalId().x] = big[b.localIndex()];
    });
    for (ComputeClient &c : clients()) {
        if (c.device().backend != "host" || c.device().maxBlockThreads < 1024) continue;
        Buffer out = c.empty(1024 * 4);
        Dispatch d = oneD(1024, 1024);
        d.bindings = {out};
        std::string message;
        try {
            c.execute(k, d);
        } catch (const Error &e) {
            message = e.what();
        }
        CHECK(message.find("kernel 'huge_private'") != std::string::npos);
        CHECK(message.find("interpreter scratch") != std::string::npos);
        // A small workgroup of the same kernel fits and runs.
        Dispatch small = oneD(4, 4);
        small.bindings = {out};
        CHECK_NOTHROW(c.execute(k, small));
        CHECK(c.readAs<float>(out)[3] == 1.0f);
    }
}

TEST_CASE("u32 indices wrap: lane 0's x[i - 1] is out of bounds, the other lanes' are not") {
    // Checked, so lane 0's index 0xffffffff is defined everywhere: it reads 0, writes nothing.
    const lang::Kernel k = lang::kernel("wrap", [](lang::Builder &b) {
        auto x = b.input<uint32_t>();
        auto y = b.output<uint32_t>();
        auto z = b.inout<uint32_t>();
        auto i = b.globalId().x;
        y[i] = x[i - 1u];
        z[i - 1u] = i;
    }, {.checked = true});
    std::vector<uint32_t> x(16);
    for (uint32_t i = 0; i < 16; ++i) x[i] = 100 + i;
    for (ComputeClient &c : clients()) {
        CAPTURE(c.device().id());
        Buffer bx = c.createFrom<uint32_t>(x), by = c.empty(64);
        Buffer bz = c.createFrom<uint32_t>(std::vector<uint32_t>(16, 0));
        Dispatch d = oneD(16, 8);
        d.bindings = {bx, by, bz};
        c.execute(k, d);
        const std::vector<uint32_t> y = c.readAs<uint32_t>(by), z = c.readAs<uint32_t>(bz);
        for (uint32_t i = 0; i < 16; ++i) CHECK(y[i] == (i == 0 ? 0u : 99 + i));
        for (uint32_t i = 0; i < 16; ++i) CHECK(z[i] == (i < 15 ? i + 1 : 0u));
    }
}

TEST_CASE("checked accesses at constant indices out of range read 0 and write nothing") {
    // Literal indices past private and shared arrays and at 2^31 and more in a buffer: vendor
    // compilers refuse such an index outright (glslang: "index out of range"), so the kernel must
    // still build and behave as docs/kernels.md defines.
    const lang::Kernel k = lang::kernel("constant_indices", [](lang::Builder &b) {
        auto x = b.input<uint32_t>();
        auto y = b.inout<uint32_t>();
        auto priv = b.array<uint32_t>(4);
        auto shared = b.shared<uint32_t>(4);
        auto i = b.globalId().x;
        b.If(i == 0u, [&] {
            priv[0u] = 11u;
            priv[7u] = 13u;    // does nothing
            shared[3u] = 17u;
            shared[4u] = 19u;  // does nothing
            y[0u] = priv[0u] + priv[7u];                   // 11 + 0
            y[1u] = shared[3u] + shared[9u];               // 17 + 0
            y[2u] = x[0x80000000u] + x[0xffffffffu] + 1u;  // 0 + 0 + 1
            y[0x80000000u] = 23u;                          // does nothing
            y[0xffffffffu] = 29u;                          // does nothing
            y[3u] = atomicAdd(y[0x90000000u], 1u) + 2u;    // 0 + 2
            y[4u] = atomicAdd(shared[5u], 1u) + 3u;        // 0 + 3
        });
    }, {.checked = true});
    for (ComputeClient &c : clients()) {
        CAPTURE(c.device().id());
        Buffer bx = c.createFrom<uint32_t>(std::vector<uint32_t>(8, 5));
        Buffer by = c.createFrom<uint32_t>(std::vector<uint32_t>(8, 0xdeadbeef));
        Dispatch d = oneD(1, 1);
        d.bindings = {bx, by};
        REQUIRE_NOTHROW(c.execute(k, d));
        const std::vector<uint32_t> y = c.readAs<uint32_t>(by);
        CHECK(y[0] == 11u);
        CHECK(y[1] == 17u);
        CHECK(y[2] == 1u);
        CHECK(y[3] == 2u);
        CHECK(y[4] == 3u);
        for (uint32_t j = 5; j < 8; ++j) CHECK(y[j] == 0xdeadbeef);
    }
}

TEST_CASE("0 * inf, 0 * NaN and 0 * -2 under a literal zero: IEEE on every device but lavapipe") {
    // The specials come from a buffer and meet a literal zero in the kernel: a compiler that
    // folds x * 0 to 0 loses them. CUDA, HIP and the host keep them; generated GLSL asks for
    // SignedZeroInfNanPreserve where the device has it. Mesa 22.3's lavapipe (Debian 12) reports
    // the property yet folds x * 0 to +0 in its own compiler, with the execution mode, `precise`
    // and -O0 alike (docs/kernels.md, "IEEE specials"): pinned here, so a driver that changes
    // shows up. Values that meet at run time keep their specials there too.
    const lang::Kernel k = lang::kernel("zero_times_specials", [](lang::Builder &b) {
        auto x = b.input<float>();
        auto out = b.output<float>();
        auto i = b.globalId().x;
        b.If(i < 3u, [&] { out[i] = Value<float>(0.0f) * x[i]; });
    });
    const float inf = std::numeric_limits<float>::infinity();
    const std::vector<float> in = {inf, std::numeric_limits<float>::quiet_NaN(), -2.0f};
    for (ComputeClient &c : clients()) {
        CAPTURE(c.device().id());
        Buffer bx = c.createFrom<float>(in), bo = c.empty(12);
        Dispatch d = oneD(3, 1);
        d.bindings = {bx, bo};
        c.execute(k, d);
        const std::vector<float> got = c.readAs<float>(bo);
        if (c.device().name.find("llvmpipe") != std::string::npos) {
            for (float g : got) CHECK((g == 0.0f && !std::signbit(g)));
            continue;
        }
        CHECK(std::isnan(got[0]));
        CHECK(std::isnan(got[1]));
        CHECK(got[2] == 0.0f);
        CHECK(std::signbit(got[2]));
    }
}

TEST_CASE("0 * inf, 0 * NaN and 0 * -2 met at run time are IEEE on every device") {
    const lang::Kernel k = lang::kernel("zero_times_specials_at_run_time", [](lang::Builder &b) {
        auto x = b.input<float>();
        auto out = b.output<float>();
        auto i = b.globalId().x;
        b.If(i < 3u, [&] { out[i] = x[3u] * x[i]; });
    });
    const float inf = std::numeric_limits<float>::infinity();
    const std::vector<float> in = {inf, std::numeric_limits<float>::quiet_NaN(), -2.0f, 0.0f};
    for (ComputeClient &c : clients()) {
        CAPTURE(c.device().id());
        Buffer bx = c.createFrom<float>(in), bo = c.empty(12);
        Dispatch d = oneD(3, 1);
        d.bindings = {bx, bo};
        c.execute(k, d);
        const std::vector<float> got = c.readAs<float>(bo);
        CHECK(std::isnan(got[0]));
        CHECK(std::isnan(got[1]));
        CHECK(got[2] == 0.0f);
        CHECK(std::signbit(got[2]));
    }
}

TEST_CASE("grid = {4} and block = {2} leave the other dimensions 1: 4 workgroups of 2 run") {
    const lang::Kernel k = lang::kernel("grid_defaults", [](lang::Builder &b) {
        auto out = b.inout<uint32_t>();
        auto i = b.globalId().x;
        out[i] = i + 1u;
    });
    for (ComputeClient &c : clients()) {
        CAPTURE(c.device().id());
        Buffer bo = c.createFrom<uint32_t>(std::vector<uint32_t>(8, 0));
        Dispatch d;
        d.grid = {4};
        d.block = {2};
        CHECK(d.grid[1] == 1u);
        CHECK(d.block[2] == 1u);
        d.bindings = {bo};
        c.execute(k, d);
        const std::vector<uint32_t> got = c.readAs<uint32_t>(bo);
        for (uint32_t i = 0; i < 8; ++i) CHECK(got[i] == i + 1);
        // A zero given on purpose stays a no-op.
        Buffer none = c.createFrom<uint32_t>(std::vector<uint32_t>(8, 0));
        Dispatch zero;
        zero.grid = {4, 0};
        zero.block = {2};
        zero.bindings = {none};
        c.execute(k, zero);
        for (uint32_t v : c.readAs<uint32_t>(none)) CHECK(v == 0u);
    }
}

// ----- element types (issue 25) -------------------------------------------------------------

namespace {

/// The CPU reference of the narrow rules: 8- and 16-bit integers compute in 32 bits and wrap;
/// f16 and bf16 compute in float and round to nearest even after every operation.
float roundHalf(float x) { return static_cast<float>(lang::f16(x)); }
float roundBf16(float x) { return static_cast<float>(lang::bf16(x)); }

} // namespace

TEST_CASE("8- and 16-bit integers wrap like C and f16 and bf16 round after every operation") {
    const lang::Kernel k = lang::kernel("narrow_types", [](lang::Builder &b) {
        auto a = b.input<int8_t>();
        auto u = b.input<uint16_t>();
        auto h = b.input<lang::f16>();
        auto g = b.input<lang::bf16>();
        auto outA = b.output<int8_t>();
        auto outU = b.output<uint16_t>();
        auto outH = b.output<lang::f16>();
        auto outG = b.output<lang::bf16>();
        auto casts = b.output<int32_t>();
        auto n = b.scalar<uint32_t>();
        auto i = b.globalId().x;
        b.If(i < n, [&] {
            Value<int8_t> x = a[i];
            outA[i] = x * int8_t(3) + int8_t(100);
            Value<uint16_t> y = u[i];
            outU[i] = y * y - uint16_t(7);
            Value<lang::f16> p = h[i];
            outH[i] = p * p + p;
            Value<lang::bf16> q = g[i];
            outG[i] = q * q + q;
            casts[i * 4u] = cast<int32_t>(p);                        // truncates
            casts[i * 4u + 1u] = cast<int32_t>(cast<int8_t>(cast<float>(y) * 3.0f)); // saturates
            casts[i * 4u + 2u] = cast<int32_t>(cast<uint8_t>(cast<int32_t>(y)));      // wraps
            casts[i * 4u + 3u] = cast<int32_t>(cast<int16_t>(x) * int16_t(-300));
        });
    });
    const uint32_t n = 200;
    std::vector<int8_t> a(n);
    std::vector<uint16_t> u(n);
    std::vector<lang::f16> h(n);
    std::vector<lang::bf16> g(n);
    std::mt19937 rng(25);
    for (uint32_t i = 0; i < n; ++i) {
        a[i] = static_cast<int8_t>(rng());
        u[i] = static_cast<uint16_t>(rng());
        h[i] = lang::f16(std::ldexp(static_cast<float>(rng() % 20000) - 10000.0f, -6));
        g[i] = lang::bf16(std::ldexp(static_cast<float>(rng() % 20000) - 10000.0f, -3));
    }
    h[0] = lang::f16(std::numeric_limits<float>::infinity());
    h[1] = lang::f16::fromBits(0x0001); // the smallest subnormal
    h[2] = lang::f16(255.9f);           // p * p overflows f16 (65504): inf
    for (ComputeClient &c : clients()) {
        CAPTURE(c.device().id());
        Buffer ba = c.createFrom<int8_t>(a), bu = c.createFrom<uint16_t>(u);
        Buffer bh = c.createFrom<lang::f16>(h), bg = c.createFrom<lang::bf16>(g);
        Buffer oa = c.empty(n), ou = c.empty(2 * n), oh = c.empty(2 * n), og = c.empty(2 * n);
        Buffer oc = c.empty(16 * n);
        Dispatch d = oneD(n, 64);
        d.bindings = {ba, bu, bh, bg, oa, ou, oh, og, oc};
        d.scalar(n);
        c.execute(k, d);
        const auto gotA = c.readAs<int8_t>(oa);
        const auto gotU = c.readAs<uint16_t>(ou);
        const auto gotH = c.readAs<uint16_t>(oh);
        const auto gotG = c.readAs<uint16_t>(og);
        const auto gotC = c.readAs<int32_t>(oc);
        size_t wrong = 0;
        for (uint32_t i = 0; i < n; ++i) {
            const auto wantA = static_cast<int8_t>(static_cast<int8_t>(a[i] * 3) + 100);
            const auto wantU = static_cast<uint16_t>(static_cast<uint16_t>(u[i] * u[i]) - 7);
            const float p = static_cast<float>(h[i]);
            const uint16_t wantH = lang::f16(roundHalf(p * p) + p).bits;
            const float q = static_cast<float>(g[i]);
            const uint16_t wantG = lang::bf16(roundBf16(q * q) + q).bits;
            const float tripled = static_cast<float>(u[i]) * 3.0f;
            const int32_t wantC[4] = {
                std::isinf(p) ? INT32_MAX : static_cast<int32_t>(p),
                tripled >= 127.0f ? 127 : static_cast<int32_t>(tripled),
                static_cast<int32_t>(static_cast<uint8_t>(u[i])),
                static_cast<int32_t>(static_cast<int16_t>(a[i] * -300))};
            const bool ok = gotA[i] == wantA && gotU[i] == wantU && gotH[i] == wantH &&
                            gotG[i] == wantG && gotC[i * 4] == wantC[0] &&
                            gotC[i * 4 + 1] == wantC[1] && gotC[i * 4 + 2] == wantC[2] &&
                            gotC[i * 4 + 3] == wantC[3];
            if (!ok && wrong++ < 5)
                MESSAGE("element " << i << ": i8 " << int(gotA[i]) << "/" << int(wantA) << " u16 "
                                   << gotU[i] << "/" << wantU << " f16 " << std::hex << gotH[i]
                                   << "/" << wantH << " bf16 " << gotG[i] << "/" << wantG
                                   << std::dec << " casts " << gotC[i * 4] << "/" << wantC[0]
                                   << " " << gotC[i * 4 + 1] << "/" << wantC[1] << " "
                                   << gotC[i * 4 + 2] << "/" << wantC[2] << " "
                                   << gotC[i * 4 + 3] << "/" << wantC[3]);
        }
        CHECK(wrong == 0);
    }
}

TEST_CASE("64-bit integers and doubles compute exactly where the device has them, and are "
          "refused naming the type where it does not") {
    const lang::Kernel k = lang::kernel("wide_types", [](lang::Builder &b) {
        auto a = b.input<int64_t>();
        auto u = b.input<uint64_t>();
        auto d = b.input<double>();
        auto outA = b.output<int64_t>();
        auto outU = b.output<uint64_t>();
        auto outD = b.output<double>();
        auto k64 = b.scalar<int64_t>();
        auto n = b.scalar<uint32_t>();
        auto i = b.globalId().x;
        b.If(i < n, [&] {
            Value<int64_t> x = a[i];
            outA[i * 2u] = x * k64 / int64_t(-7) + x % int64_t(1000003) + (x >> int64_t(3));
            outA[i * 2u + 1u] = cast<int64_t>(d[i]); // saturates to the int64 range
            Value<uint64_t> y = u[i];
            outU[i] = y / uint64_t(3) + (y << uint64_t(7)) + cast<uint64_t>(x);
            Value<double> e = d[i];
            outD[i] = e * e + e / 3.0 + cast<double>(x);
        });
    });
    const uint32_t n = 128;
    std::vector<int64_t> a(n);
    std::vector<uint64_t> u(n);
    std::vector<double> d(n);
    std::mt19937_64 rng(64);
    for (uint32_t i = 0; i < n; ++i) {
        a[i] = static_cast<int64_t>(rng());
        u[i] = rng();
        d[i] = std::ldexp(static_cast<double>(static_cast<int64_t>(rng() >> 11)), -20);
    }
    a[0] = INT64_MIN;
    d[1] = 1e300;
    const int64_t k64 = -123456789012345;
    for (ComputeClient &c : clients()) {
        CAPTURE(c.device().id());
        Buffer ba = c.createFrom<int64_t>(a), bu = c.createFrom<uint64_t>(u);
        Buffer bd = c.createFrom<double>(d);
        Buffer oa = c.empty(16 * n), ou = c.empty(8 * n), od = c.empty(8 * n);
        Dispatch dispatch = oneD(n, 64);
        dispatch.bindings = {ba, bu, bd, oa, ou, od};
        dispatch.scalar(k64).scalar(n);
        const std::string missing = k.missingOn(c.device().features);
        if (!missing.empty()) {
            MESSAGE(c.device().id() << " lacks " << missing);
            CHECK_THROWS_WITH_AS(c.execute(k, dispatch), doctest::Contains("wide_types"), Error);
            try {
                c.execute(k, dispatch);
            } catch (const Error &e) {
                CHECK(std::string(toString(e.code())) == "unsupported");
                CHECK(std::string(e.what()).find(missing) != std::string::npos);
            }
            continue;
        }
        c.execute(k, dispatch);
        const auto gotA = c.readAs<int64_t>(oa);
        const auto gotU = c.readAs<uint64_t>(ou);
        const auto gotD = c.readAs<double>(od);
        size_t wrong = 0;
        for (uint32_t i = 0; i < n; ++i) {
            const auto wrapMul = static_cast<int64_t>(static_cast<uint64_t>(a[i]) *
                                                      static_cast<uint64_t>(k64));
            const int64_t q = wrapMul / -7;
            const int64_t wantA = static_cast<int64_t>(
                static_cast<uint64_t>(q) + static_cast<uint64_t>(a[i] % 1000003) +
                static_cast<uint64_t>(a[i] >> 3));
            const int64_t wantSat = d[i] >= 9223372036854775808.0 ? INT64_MAX
                                                                  : static_cast<int64_t>(d[i]);
            const uint64_t wantU = u[i] / 3 + (u[i] << 7) + static_cast<uint64_t>(a[i]);
            const double wantD = d[i] * d[i] + d[i] / 3.0 + static_cast<double>(a[i]);
            const bool ok = gotA[2 * i] == wantA && gotA[2 * i + 1] == wantSat &&
                            gotU[i] == wantU &&
                            (gotD[i] == wantD || std::fabs(gotD[i] - wantD) <= 1e-15 * std::fabs(wantD));
            if (!ok && wrong++ < 5)
                MESSAGE("element " << i << ": " << gotA[2 * i] << "/" << wantA << " "
                                   << gotA[2 * i + 1] << "/" << wantSat << " " << gotU[i] << "/"
                                   << wantU << " " << gotD[i] << "/" << wantD);
        }
        CHECK(wrong == 0);
    }
}

TEST_CASE("constants of different types with the same bits keep their own values") {
    // f16 2.0 is 0x4000 and bf16 1.0 is 0x3f80: the u32 constants 16384 and 16256 have the same
    // bits, and the host interpreter once gave them one register.
    const lang::Kernel k = lang::kernel("same_bits", [](lang::Builder &b) {
        auto h = b.inout<lang::f16>();
        auto g = b.inout<lang::bf16>();
        auto u = b.inout<uint32_t>();
        auto i = b.globalId().x;
        b.If(i < 2u, [&] {
            h[i] = h[i] * lang::f16(2.0f);
            g[i] = g[i] + lang::bf16(1.0f);
            u[i] = u[i] + 16384u + 16256u;
        });
    });
    for (ComputeClient &c : clients()) {
        CAPTURE(c.device().id());
        Buffer bh = c.createFrom<lang::f16>(std::vector<lang::f16>{lang::f16(3.0f), lang::f16(5.0f)});
        Buffer bg = c.createFrom<lang::bf16>(std::vector<lang::bf16>{lang::bf16(3.0f), lang::bf16(6.0f)});
        Buffer bu = c.createFrom<uint32_t>(std::vector<uint32_t>{1, 2});
        Dispatch d = oneD(2, 2);
        d.bindings = {bh, bg, bu};
        c.execute(k, d);
        const auto gotH = c.readAs<lang::f16>(bh);
        const auto gotG = c.readAs<lang::bf16>(bg);
        CHECK(static_cast<float>(gotH[0]) == 6.0f);
        CHECK(static_cast<float>(gotH[1]) == 10.0f);
        CHECK(static_cast<float>(gotG[0]) == 4.0f);
        CHECK(static_cast<float>(gotG[1]) == 7.0f);
        CHECK(c.readAs<uint32_t>(bu) == std::vector<uint32_t>{32641, 32642});
    }
}

// -- compiled host kernels against the interpreter ---------------------------------------------

namespace {

/// Bytes equal, or both NaN floats where `floats` (NaN payloads are not part of the contract).
bool sameBits(const std::vector<std::byte> &a, const std::vector<std::byte> &b, bool floats) {
    if (a.size() != b.size()) return false;
    if (!floats) return a == b;
    for (size_t i = 0; i + 4 <= a.size(); i += 4) {
        float x, y;
        std::memcpy(&x, a.data() + i, 4);
        std::memcpy(&y, b.data() + i, 4);
        if (std::memcmp(&x, &y, 4) != 0 && !(std::isnan(x) && std::isnan(y))) return false;
    }
    return true;
}

/// Runs `kernel` on `c` with fresh copies of `inputs` (then zeroed outputs of the given sizes)
/// and returns every binding's bytes after the launch.
std::vector<std::vector<std::byte>> runWith(ComputeClient &c, const lang::Kernel &kernel,
                                            const std::vector<std::vector<std::byte>> &inputs,
                                            const std::vector<size_t> &outputs, Dispatch d) {
    std::vector<Buffer> buffers;
    for (const auto &in : inputs) buffers.push_back(c.create(in.data(), in.size()));
    for (size_t bytes : outputs) {
        std::vector<std::byte> zeros(bytes);
        buffers.push_back(c.create(zeros.data(), zeros.size()));
    }
    d.bindings = buffers;
    c.execute(kernel, d);
    std::vector<std::vector<std::byte>> result;
    for (Buffer &b : buffers) result.push_back(c.read(b).wait());
    return result;
}

template <class T> std::vector<std::byte> bytesOf(const std::vector<T> &v) {
    std::vector<std::byte> out(v.size() * sizeof(T));
    std::memcpy(out.data(), v.data(), out.size());
    return out;
}

/// Runs `kernel` on the compiled and the interpreted host and checks every binding agrees.
void sameOnBothHosts(const lang::Kernel &kernel, const std::vector<std::vector<std::byte>> &inputs,
                     const std::vector<size_t> &outputs, const Dispatch &d, bool floats) {
    auto [compiled, interpreted] = hostPair();
    if (compiled == nullptr) return;
    INFO("kernel " << kernel.name() << ": " << kernel.hostNote(compiled->device()));
    const auto got = runWith(*compiled, kernel, inputs, outputs, d);
    const auto want = runWith(*interpreted, kernel, inputs, outputs, d);
    REQUIRE(got.size() == want.size());
    for (size_t b = 0; b < got.size(); ++b) {
        INFO("binding " << b);
        CHECK(sameBits(got[b], want[b], floats));
    }
}

std::vector<float> edgyFloats(size_t n, uint32_t seed) {
    std::vector<float> v = randomFloats(n, seed, -4, 4);
    const float specials[] = {0.0f, -0.0f, 1.0f, -1.0f, 65504.0f, 1e-8f, 3e9f, -3e9f,
                              std::numeric_limits<float>::infinity(),
                              -std::numeric_limits<float>::infinity(),
                              std::numeric_limits<float>::quiet_NaN(), 0.5f, 2.5f, -2.5f};
    for (size_t i = 0; i < n; i += 7) v[i] = specials[(i / 7) % std::size(specials)];
    return v;
}

std::vector<int32_t> edgyInts(size_t n, uint32_t seed) {
    std::vector<int32_t> v = randomInts<int32_t>(n, seed, -300, 300);
    const int32_t specials[] = {0, -1, 1, std::numeric_limits<int32_t>::min(),
                                std::numeric_limits<int32_t>::max(), 31, 32, 33, -128, 255, 65535};
    for (size_t i = 0; i < n; i += 5) v[i] = specials[(i / 5) % std::size(specials)];
    return v;
}

/// A random straight-line program with loops and branches over i32, u32, f32 and the narrow
/// types (through casts): every operation of the language the host generator prints, seeded.
lang::Kernel randomProgram(uint32_t seed) {
    return lang::kernel("random_program_" + std::to_string(seed), [seed](lang::Builder &k) {
        std::mt19937 rng(seed);
        auto pick = [&](size_t n) { return static_cast<size_t>(rng() % n); };
        auto xi = k.input<int32_t>();
        auto xf = k.input<float>();
        auto oi = k.output<int32_t>();
        auto of = k.output<float>();
        auto n = k.scalar<uint32_t>();
        auto g = k.globalId().x;
        std::vector<Value<int32_t>> ints = {xi[g], xi[(g * 7u + 3u) % n], Value<int32_t>(-7)};
        std::vector<Value<uint32_t>> uints = {g, cast<uint32_t>(xi[(g + 1u) % n])};
        std::vector<Value<float>> floats = {xf[g], xf[(g * 3u + 1u) % n], Value<float>(0.75f)};
        auto I = [&] { return ints[pick(ints.size())]; };
        auto U = [&] { return uints[pick(uints.size())]; };
        auto F = [&] { return floats[pick(floats.size())]; };
        for (int step = 0; step < 40; ++step) {
            switch (pick(14)) {
            case 0: {
                auto a = I(), b = I();
                switch (pick(10)) {
                case 0: ints.push_back(a + b); break;
                case 1: ints.push_back(a - b); break;
                case 2: ints.push_back(a * b); break;
                case 3: ints.push_back(a / b); break;
                case 4: ints.push_back(a % b); break;
                case 5: ints.push_back(a << b); break;
                case 6: ints.push_back(a >> b); break;
                case 7: ints.push_back(lang::min(a, b) ^ (a & ~b)); break;
                case 8: ints.push_back(lang::abs(a) | -b); break;
                default: ints.push_back(lang::select(a < b, a, lang::max(a, b))); break;
                }
                break;
            }
            case 1: {
                auto a = U(), b = U();
                switch (pick(7)) {
                case 0: uints.push_back(a + b * 3u); break;
                case 1: uints.push_back(a / b); break;
                case 2: uints.push_back(a % b); break;
                case 3: uints.push_back(a >> b); break;
                case 4: uints.push_back(a << b); break;
                case 5: uints.push_back(lang::select(a >= b, a - b, lang::min(a, b))); break;
                default: uints.push_back(~a ^ b); break;
                }
                break;
            }
            case 2: {
                auto a = F(), b = F();
                switch (pick(9)) {
                case 0: floats.push_back(a + b); break;
                case 1: floats.push_back(a * b - a); break;
                case 2: floats.push_back(a / b); break;
                case 3: floats.push_back(lang::min(a, b)); break;
                case 4: floats.push_back(lang::max(a, -b)); break;
                case 5: floats.push_back(lang::fma(a, b, F())); break;
                case 6: floats.push_back(lang::sqrt(lang::abs(a))); break;
                case 7: floats.push_back(lang::floor(a) + lang::ceil(b)); break;
                default: floats.push_back(lang::select(a == b || a != a, b, a)); break;
                }
                break;
            }
            case 3: floats.push_back(pick(2) ? lang::exp(F() * 0.25f) : lang::log(lang::abs(F()))); break;
            case 4: floats.push_back(pick(2) ? lang::sin(F()) + lang::cos(F()) : lang::tanh(F())); break;
            case 5: floats.push_back(lang::pow(lang::abs(F()), Value<float>(0.5f)) + lang::rsqrt(lang::abs(F()) + 1.0f)); break;
            case 6: ints.push_back(pick(2) ? cast<int32_t>(F() * 1e9f) : cast<int32_t>(cast<int8_t>(F() * 100.0f))); break;
            case 7: uints.push_back(pick(2) ? cast<uint32_t>(F() * 1e9f) : cast<uint32_t>(cast<uint16_t>(F() * 1e5f))); break;
            case 8: floats.push_back(pick(2) ? cast<float>(I()) : cast<float>(U())); break;
            case 9: {
                // 8- and 16-bit arithmetic, f16 and bf16 rounding after every operation.
                auto a = cast<int8_t>(I()), b = cast<int8_t>(I());
                auto h = cast<lang::f16>(F()), c = cast<lang::f16>(F());
                auto e = cast<lang::bf16>(F());
                ints.push_back(cast<int32_t>(a * b + a));
                ints.push_back(cast<int32_t>(cast<uint16_t>(U()) * cast<uint16_t>(U())));
                floats.push_back(cast<float>(h * c + h));
                floats.push_back(cast<float>(e / cast<lang::bf16>(F())));
                break;
            }
            case 10: {
                // A loop with a variable, a data-dependent bound and a break.
                auto acc = k.var<int32_t>(I());
                auto bound = (U() & 7u);
                k.For(0u, bound, [&](Value<uint32_t> j) {
                    acc = acc * 3 + cast<int32_t>(j);
                    k.If(acc > 1000, [&] { k.Break(); });
                });
                ints.push_back(acc);
                break;
            }
            case 11: {
                auto v = k.var<float>(F());
                k.If(F() < F(), [&] { v = v * 2.0f; }).Else([&] { v = v - 1.0f; });
                floats.push_back(v);
                break;
            }
            case 12: ints.push_back(cast<int32_t>(F() < F()) + cast<int32_t>(!(I() == I()))); break;
            default: {
                auto w = k.var<uint32_t>(U());
                k.While([&] { return w > 10u; }, [&] { w = w / 3u; });
                uints.push_back(w);
                break;
            }
            }
        }
        for (uint32_t j = 0; j < 4; ++j) {
            oi[g * 8u + j] = ints[ints.size() - 1 - j % ints.size()];
            oi[g * 8u + 4u + j] = cast<int32_t>(uints[uints.size() - 1 - j % uints.size()]);
            of[g * 4u + j] = floats[floats.size() - 1 - j % floats.size()];
        }
    });
}

} // namespace

TEST_CASE("compiled host kernels give the interpreter's bits: random programs") {
    auto [compiled, interpreted] = hostPair();
    if (compiled == nullptr) {
        MESSAGE("the host compiles no kernels here; nothing to compare");
        return;
    }
    const uint32_t n = 1000;
    const std::vector<std::vector<std::byte>> inputs = {bytesOf(edgyInts(n, 11)),
                                                        bytesOf(edgyFloats(n, 12))};
    Dispatch d = oneD(n, 64);
    d.scalar(n);
    for (uint32_t seed = 1; seed <= 8; ++seed) {
        const lang::Kernel kernel = randomProgram(seed);
        CAPTURE(seed);
        REQUIRE(kernel.hostNote(compiled->device()).rfind("compiled", 0) == 0);
        sameOnBothHosts(kernel, inputs, {n * 8 * 4, n * 4 * 4}, d, true);
    }
}

TEST_CASE("compiled host kernels give the interpreter's bits: every library kernel") {
    auto [compiled, interpreted] = hostPair();
    if (compiled == nullptr) {
        MESSAGE("the host compiles no kernels here; nothing to compare");
        return;
    }
    const uint32_t n = 3001;
    {
        Dispatch d = oneD(n, 256);
        d.scalar(1.5f).scalar(n - 5);
        sameOnBothHosts(kernels::saxpy(), {bytesOf(edgyFloats(n, 1)), bytesOf(edgyFloats(n, 2))},
                        {}, d, true);
    }
    for (uint32_t block : {64u, 256u}) {
        Dispatch d;
        d.block = {block, 1, 1};
        d.grid = {7, 1, 1};
        d.scalar(n);
        sameOnBothHosts(kernels::reduceSum<float>(block), {bytesOf(edgyFloats(n, 3))}, {7 * 4}, d, true);
        sameOnBothHosts(kernels::reduceSum<int32_t>(block), {bytesOf(edgyInts(n, 4))}, {7 * 4}, d, false);
        sameOnBothHosts(kernels::reduceSum<uint32_t>(block), {bytesOf(edgyInts(n, 5))}, {7 * 4}, d, false);
        Dispatch scan;
        scan.block = {block, 1, 1};
        scan.scalar(n);
        sameOnBothHosts(kernels::inclusiveScan<float>(block), {bytesOf(randomFloats(n, 6))}, {n * 4}, scan, true);
        sameOnBothHosts(kernels::inclusiveScan<int32_t>(block), {bytesOf(edgyInts(n, 7))}, {n * 4}, scan, false);
    }
    const uint32_t m = 67, nn = 45, kk = 39;
    for (const kernels::MatmulTiles tiles : {kernels::MatmulTiles{16, 1, 16}, kernels::MatmulTiles{32, 2, 8},
                                             kernels::MatmulTiles{64, 4, 8}}) {
        Dispatch d;
        d.block = {tiles.threads(), tiles.threads(), 1};
        d.grid = {ceilDiv(nn, tiles.tile), ceilDiv(m, tiles.tile), 1};
        d.scalar(m).scalar(nn).scalar(kk);
        sameOnBothHosts(kernels::matmul(tiles), {bytesOf(randomFloats(m * kk, 8)), bytesOf(randomFloats(kk * nn, 9))},
                        {m * nn * 4}, d, true);
    }
    // The register-blocked matmul is what the generator's statement packs are for (f32x4 FMAs):
    // odd sizes, so that vector loads run past rows and the end of B, and edgy values.
    for (const kernels::RegisterTiles tiles : {kernels::RegisterTiles{4, 4, 16, 4}, kernels::RegisterTiles{6, 2, 8, 8},
                                               kernels::RegisterTiles{3, 1, 4, 2}}) {
        Dispatch d;
        d.block = {tiles.threadsX, tiles.threadsY, 1};
        d.grid = {ceilDiv(nn, tiles.cols() * tiles.threadsX), ceilDiv(m, tiles.rows * tiles.threadsY), 1};
        d.scalar(m).scalar(nn).scalar(kk);
        sameOnBothHosts(kernels::matmulRegisters(tiles), {bytesOf(edgyFloats(m * kk, 13)), bytesOf(edgyFloats(kk * nn, 14))},
                        {m * nn * 4}, d, true);
    }
    const uint32_t rows = 5, cols = 1003;
    Dispatch rowsD;
    rowsD.block = {64, 1, 1};
    rowsD.grid = {rows, 1, 1};
    rowsD.scalar(cols);
    const std::vector<float> x = randomFloats(rows * cols, 10, -3, 3);
    std::vector<uint16_t> halves(x.size()), brains(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
        halves[i] = lang::f16(x[i]).bits;
        brains[i] = lang::bf16(x[i]).bits;
    }
    sameOnBothHosts(kernels::rowSum<float>(64), {bytesOf(x)}, {rows * 4}, rowsD, true);
    sameOnBothHosts(kernels::rowSum<lang::f16>(64), {bytesOf(halves)}, {rows * 4}, rowsD, true);
    sameOnBothHosts(kernels::rowSum<lang::bf16>(64), {bytesOf(brains)}, {rows * 4}, rowsD, true);
    sameOnBothHosts(kernels::softmaxRows<float>(64), {bytesOf(x)}, {rows * cols * 4}, rowsD, true);
    sameOnBothHosts(kernels::softmaxRows<lang::f16>(64), {bytesOf(halves)}, {rows * cols * 2}, rowsD, false);
    sameOnBothHosts(kernels::softmaxRows<lang::bf16>(64), {bytesOf(brains)}, {rows * cols * 2}, rowsD, false);
    {
        // A row past 64 * 32 elements: the two-pass softmax instead of the one kept in registers.
        const uint32_t longCols = 2100;
        Dispatch longD = rowsD;
        longD.scalars.clear();
        longD.scalar(longCols);
        sameOnBothHosts(kernels::softmaxRows<float>(64), {bytesOf(randomFloats(rows * longCols, 16, -3, 3))},
                        {rows * longCols * 4}, longD, true);
    }
    // The matrix-unit matmul is interpreted on the host (the generator prints no fragments yet):
    // the note says so, and the results are the interpreter's.
    const lang::Kernel mu = kernels::matmulMatrixUnits<lang::f16>({32, 32, 16, 1, 1, 8});
    CHECK(mu.hostNote(compiled->device()).find("interpreted: the host generator cannot compile matrix") == 0);
}

TEST_CASE("statement packs: broadcasts, vector parts and values of the pack give the interpreter's bits") {
    auto [compiled, interpreted] = hostPair();
    if (compiled == nullptr) {
        MESSAGE("the host compiles no kernels here; nothing to compare");
        return;
    }
    // Per lane: a private array filled from x, then groups the generator packs into f32x4
    // statements (fma with a broadcast scalar and a vector's parts; -, / and * on values of the
    // pack and the array), and a group it must not pack (the parts in a shuffled order).
    const lang::Kernel kernel = lang::kernel("packed_groups", [](lang::Builder &k) {
        auto x = k.input<float>();
        auto y = k.output<float>();
        auto s = k.scalar<float>();
        auto offset = k.scalar<uint32_t>();
        auto g = k.globalId().x;
        auto acc = k.array<float>(12);
        for (uint32_t i = 0; i < 12; ++i) acc[i] = x[g * 3u + i];
        const auto v = lang::loadVector<4>(x, g * 4u + offset);
        for (uint32_t j = 0; j < 4; ++j) acc[j] = fma(s, v[j], acc[j]);
        for (uint32_t j = 0; j < 4; ++j) acc[4 + j] = (v[j] - acc[j]) / acc[4 + j] * s + acc[8 + j];
        const uint32_t shuffled[4] = {0, 2, 1, 3};
        for (uint32_t j = 0; j < 4; ++j) acc[8 + j] = fma(v[shuffled[j]], acc[j], acc[8 + j]);
        for (uint32_t i = 0; i < 12; ++i) y[g * 12u + i] = acc[i];
    });
    const uint32_t n = 1001, lanes = 256;
    REQUIRE(kernel.hostNote(compiled->device()).rfind("compiled", 0) == 0);
    // The first two groups are packed, the shuffled one is not.
    const std::string text = kernel.text(Dialect::Cpp);
    size_t packs = 0;
    for (size_t at = text.find("as vector statements"); at != std::string::npos;
         at = text.find("as vector statements", at + 1))
        ++packs;
    if (const char *dump = std::getenv("BP_DUMP_PACKS"); dump != nullptr) std::fputs(text.c_str(), stderr);
    CHECK(packs == 2);
    CHECK(text.find("fma4(splat4(") != std::string::npos);
    for (const uint32_t offset : {0u, 2u, 5u, 0xfffffffeu}) {
        CAPTURE(offset);
        Dispatch d = oneD(lanes, 64);
        d.scalar(1.25f).scalar(offset);
        sameOnBothHosts(kernel, {bytesOf(edgyFloats(n, 15 + offset % 7))}, {lanes * 12 * 4}, d, true);
    }
}

TEST_CASE("statement packs: groups that mix a vector's parts with a broadcast, and a vector "
          "loaded before a barrier, are not packed wrongly") {
    auto [compiled, interpreted] = hostPair();
    if (compiled == nullptr) {
        MESSAGE("the host compiles no kernels here; nothing to compare");
        return;
    }
    // Review findings: {v[0], v[1], v[0], v[3]} passed as vector parts in group 1 and as a
    // broadcast in group 2 (lane 2 got v[2]); {v[0], v[0], v[2], v[3]} printed splat4(v[0]).
    const std::vector<std::array<uint32_t, 4>> perms = {{0, 1, 0, 3}, {0, 0, 2, 3}, {0, 1, 2, 3}};
    for (const auto &perm : perms) {
        const lang::Kernel kernel =
            lang::kernel("packed_perm_" + std::to_string(perm[0]) + std::to_string(perm[1]) +
                             std::to_string(perm[2]) + std::to_string(perm[3]),
                         [perm](lang::Builder &k) {
                             auto x = k.input<float>();
                             auto y = k.output<float>();
                             auto s = k.scalar<float>();
                             auto g = k.globalId().x;
                             auto acc = k.array<float>(4);
                             const auto v = lang::loadVector<4>(x, g * 4u);
                             for (uint32_t j = 0; j < 4; ++j) acc[j] = v[perm[j]] + s;
                             for (uint32_t j = 0; j < 4; ++j) y[g * 4u + j] = acc[j];
                         });
        CAPTURE(kernel.name());
        const bool inOrder = perm == std::array<uint32_t, 4>{0, 1, 2, 3};
        CHECK((kernel.text(Dialect::Cpp).find("as vector statements") != std::string::npos) == inOrder);
        Dispatch d = oneD(64, 16);
        d.scalar(0.5f);
        sameOnBothHosts(kernel, {bytesOf(randomFloats(256, 17, -2, 2))}, {256 * 4}, d, true);
    }
    // A vector loaded before a barrier lives in another region's lambda (x<n> is not in scope
    // after it): the pack after the barrier must not use it (review finding: a compile error).
    const lang::Kernel afterBarrier = lang::kernel("packed_after_barrier", [](lang::Builder &k) {
        auto x = k.input<float>();
        auto y = k.output<float>();
        auto g = k.globalId().x;
        auto acc = k.array<float>(4);
        const auto v = lang::loadVector<4>(x, g * 4u);
        k.barrier();
        for (uint32_t j = 0; j < 4; ++j) acc[j] = v[j] * 2.0f;
        for (uint32_t j = 0; j < 4; ++j) y[g * 4u + j] = acc[j];
    });
    REQUIRE(afterBarrier.hostNote(compiled->device()).rfind("compiled", 0) == 0);
    Dispatch d = oneD(64, 16);
    sameOnBothHosts(afterBarrier, {bytesOf(randomFloats(256, 18, -2, 2))}, {256 * 4}, d, true);
}
