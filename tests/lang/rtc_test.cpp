// The generated CUDA and HIP sources of every portable kernel compile offline, without a GPU:
// this file is built twice, with plugins/cuda/vendor.hpp (NVRTC, sm_90) and with
// plugins/hip/vendor.hpp (hiprtc, gfx90a), around the plugins' own compile function. Skips (77)
// only when the runtime compiler library is missing.
#include "gpu_compile.hpp"
#include "every_type.hpp"

#include <backplane/kernels.hpp>
#include <backplane/lang.hpp>

#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <string>
#include <vector>

using namespace backplane;
using lang::Value;

namespace {

#ifdef BACKPLANE_LANG_RTC_HIP
constexpr Dialect kDialect = Dialect::Hip;
constexpr const char *kArch = "gfx90a";
#else
constexpr Dialect kDialect = Dialect::Cuda;
constexpr const char *kArch = "sm_90";
#endif

/// Every operation of the language in one kernel, so that each printed form is compiled once.
lang::Kernel everything() {
    return lang::kernel("every op", [](lang::Builder &k) {
        auto f = k.input<float>();
        auto u = k.inout<uint32_t>();
        auto s = k.inout<int32_t>();
        auto out = k.output<float>();
        auto a = k.scalar<float>();
        auto n = k.scalar<uint32_t>();
        auto tile = k.shared<uint32_t>(64);
        auto priv = k.array<float>(4);
        auto i = k.globalId().x;
        auto lane = k.subgroupLane();
        auto sum = subgroupSum(f[i]);
        auto low = subgroupMin(lang::cast<int32_t>(lane));
        auto high = subgroupMax(u[i]);
        auto swapped = shuffleXor(sum, Value<uint32_t>(1u));
        auto first = broadcast(high, Value<uint32_t>(0u));
        tile[k.localIndex()] = first + k.subgroupSize() + k.gridSize().y + k.groupSize().z;
        k.barrier();
        auto x = k.var<float>(f[i]);
        x = select(x < a, -x, abs(x));
        x = sqrt(x) + rsqrt(x + 1.0f) + exp(x) + log(x + 2.0f) + sin(x) * cos(x) + tanh(x);
        x = floor(x) + ceil(x) + pow(x, a) + min(x, a) + max(x, a) + clamp(x, 0.0f, 1.0f);
        x = fma(x, a, x / a) - x * a;
        priv[i % 4u] = x;
        auto si = lang::cast<int32_t>(priv[0u]);
        s[i] = si / 3 + si % 3 + (si << 2) + (si >> 1) + (si & 7) + (si | 1) + (si ^ 5) + ~si + -si;
        auto ui = u[i];
        u[i] = ui / 3u + ui % 3u + (ui << 2u) + (ui >> 1u) + lang::cast<uint32_t>(ui == 4u);
        atomicAdd(u[0u], 1u);
        atomicMin(s[0u], si);
        atomicMax(tile[0u], ui);
        atomicAnd(u[1u], 3u);
        atomicOr(u[2u], 4u);
        atomicXor(u[3u], 5u);
        atomicExchange(s[1u], 7);
        auto flag = k.var<bool>(!(ui > 3u) || (ui <= 9u && ui != 2u) || (ui >= 5u));
        k.If(flag, [&] { out[i] = lang::cast<float>(si) + lang::cast<float>(lang::cast<uint32_t>(flag)); })
            .ElseIf([&] { return ui == 1u; }, [&] { out[i] = swapped + lang::cast<float>(low); })
            .Else([&] { out[i] = 1e30f * 1e30f; });
        k.For<int32_t>(-5, 5, 2, [&](Value<int32_t> j) {
            k.If(j == 1, [&] { k.Continue(); });
            out[0u] = lang::cast<float>(j);
        });
        auto w = k.var<uint32_t>(0u);
        k.While([&] { return w < n; }, [&] {
            w += 1u;
            k.If(w == 7u, [&] { k.Break(); });
        });
        k.If(i > n, [&] { k.Return(); });
    }, {.checked = true});
}

std::vector<lang::Kernel> allKernels() {
    return {kernels::saxpy(),
            kernels::reduceSum<float>(256),
            kernels::reduceSum<uint32_t>(64),
            kernels::inclusiveScan<int32_t>(128),
            kernels::matmul({16, 1, 16}),
            kernels::matmul({64, 4, 16}),
            everything(),
            test::everyType(),
            test::asyncCopies(),
#ifndef BACKPLANE_LANG_RTC_HIP
            test::matrixAndVectors(),
            test::matrixBf16Tf32(),
#endif
    };
}

} // namespace

TEST_CASE("the runtime compiler accepts every generated source") {
    for (const lang::Kernel &k : allKernels()) {
        CAPTURE(k.name());
        const KernelVariant *variant = nullptr;
        for (const KernelVariant &v : k.source().variants)
            if (v.dialect == kDialect) variant = &v;
        REQUIRE(variant != nullptr);
        sdk::CompileOutput out;
        gpu::CompileRequest request{variant->source, variant->entryPoint, kArch, variant->options};
        try {
            gpu::compileSource(gpu::rtc(), request, out);
        } catch (const sdk::Error &e) {
            FAIL(e.what() << "\n" << out.log << "\n" << variant->source);
        }
        CHECK(out.binary.size() > 4);
    }
}

#ifdef BACKPLANE_LANG_RTC_HIP
TEST_CASE("hiprtc refuses a kernel with matrix units, naming why") {
    const lang::Kernel k = test::matrixAndVectors();
    const KernelVariant &variant = k.source().variants[1];
    REQUIRE((variant.dialect == Dialect::Hip));
    sdk::CompileOutput out;
    gpu::CompileRequest request{variant.source, variant.entryPoint, kArch, variant.options};
    CHECK_THROWS(gpu::compileSource(gpu::rtc(), request, out));
    CHECK(out.log.find("not lowered for HIP") != std::string::npos);
}
#endif

int main(int argc, char **argv) {
    try {
        (void)gpu::rtc();
    } catch (const sdk::Error &e) {
        std::printf("SKIP: %s\n", e.what());
        return 77;
    }
    doctest::Context context(argc, argv);
    return context.run();
}
