// A portable kernel that uses every element type of the language and its operations (issue 25):
// compiled offline by NVRTC and hiprtc (rtc_test.cpp) and kept as golden text (lang_test.cpp).
#pragma once

#include <backplane/lang.hpp>

namespace backplane::test {

/// Bindings: i8, u8, i16, u16 (inout), i64, u64 (inout), f16, bf16 (inout), f64 (inout),
/// f32 (inout, float atomics); scalars: i64 k, f64 scale, u32 n.
inline lang::Kernel everyType() {
    using lang::cast;
    using lang::Value;
    return lang::kernel("every type", [](lang::Builder &b) {
        auto a8 = b.inout<int8_t>();
        auto u8 = b.inout<uint8_t>();
        auto a16 = b.inout<int16_t>();
        auto u16 = b.inout<uint16_t>();
        auto a64 = b.inout<int64_t>();
        auto u64 = b.inout<uint64_t>();
        auto h = b.inout<lang::f16>();
        auto g = b.inout<lang::bf16>();
        auto d = b.inout<double>();
        auto f = b.inout<float>();
        auto k = b.scalar<int64_t>();
        auto scale = b.scalar<double>();
        auto n = b.scalar<uint32_t>();
        auto tile = b.shared<lang::f16>(64);
        auto priv = b.array<int8_t>(4);
        auto i = b.globalId().x;
        b.If(i < n, [&] {
            Value<int8_t> x8 = a8[i];
            Value<uint8_t> y8 = u8[i];
            priv[i % 4u] = x8 * int8_t(5) - int8_t(3);
            a8[i] = priv[i % 4u] / int8_t(-7) + (x8 % int8_t(3)) + (x8 << int8_t(2)) +
                    (x8 >> int8_t(1)) + ~x8 + -x8 + abs(x8);
            u8[i] = y8 / uint8_t(3) + (y8 & uint8_t(7)) + (y8 | uint8_t(8)) + (y8 ^ uint8_t(9)) +
                    min(y8, uint8_t(200)) + max(y8, uint8_t(20));
            Value<int16_t> x16 = a16[i];
            a16[i] = x16 * int16_t(-300) + cast<int16_t>(y8);
            u16[i] = cast<uint16_t>(x16) * uint16_t(3) + cast<uint16_t>(h[i]);
            Value<int64_t> x64 = a64[i];
            a64[i] = x64 * k / int64_t(7) + x64 % int64_t(5) + (x64 << int64_t(40)) +
                     (x64 >> int64_t(3)) + cast<int64_t>(d[i]) + abs(x64);
            Value<uint64_t> y64 = u64[i];
            u64[i] = y64 / uint64_t(3) + (y64 >> uint64_t(33)) + cast<uint64_t>(x16) +
                     cast<uint64_t>(f[i]);
            Value<lang::f16> p = h[i];
            tile[b.localIndex()] = p * p + sqrt(abs(p)) - exp(p) / cast<lang::f16>(x8);
            h[i] = tile[b.localIndex()] + cast<lang::f16>(g[i]) + cast<lang::f16>(d[i]);
            Value<lang::bf16> q = g[i];
            g[i] = q * q + floor(q) + cast<lang::bf16>(y64) + max(q, cast<lang::bf16>(p));
            Value<double> e = d[i];
            d[i] = fma(e, scale, e * e) + sqrt(abs(e)) + floor(e) + ceil(e) + min(e, scale) +
                   cast<double>(x64) + cast<double>(p) + cast<double>(e > scale);
            atomicAdd(a64[0u], x64);
            atomicMax(a64[1u], x64);
            atomicAnd(u64[0u], y64);
            atomicExchange(u64[1u], y64);
            atomicAdd(f[0u], cast<float>(e));
        });
    }, {.checked = true});
}

/// The matrix units (f16 tiles staged in shared memory with vector copies, both layouts,
/// checked edges) and vector loads and stores of floats: the operations of issue 25 that each
/// target lowers its own way. Bindings: a, b (f16), c (f32, inout).
inline lang::Kernel matrixAndVectors() {
    return lang::kernel("matrix_and_vectors", [](lang::Builder &k) {
        using lang::Value;
        auto a = k.input<lang::f16>();
        auto b = k.input<lang::f16>();
        auto c = k.inout<float>();
        auto sa = k.shared<lang::f16>(512);
        auto sb = k.shared<lang::f16>(512);
        auto t = k.localIndex();
        k.For(t * 8u, 512u, k.groupSize().x * 8u, [&](Value<uint32_t> i) {
            lang::storeVector(sa, i, lang::loadVector<8>(a, i));
            lang::storeVector(sb, i, lang::loadVector<8>(b, i));
        });
        k.barrier();
        auto fa = k.matrixA<lang::f16>();
        auto fb = k.matrixB<lang::f16>();
        auto acc = k.accumulator<float>();
        acc.load(c, 0u, 16u);
        fa.load(sa, 8u, 24u, lang::Layout::ColMajor);
        fb.load(sb, 8u, 24u);
        mma(acc, fa, fb, acc);
        acc.store(c, 0u, 16u);
        k.barrier();
        const lang::Vector<float, 4> v = lang::loadVector<4>(c, t * 4u);
        lang::storeVector(c, t * 4u, v * Value<float>(2.0f));
    }, {.checked = true});
}

/// Asynchronous copies (cp.async on CUDA, ordinary stores elsewhere) of f16 and f32 vectors
/// into over 48 KiB of shared memory (dynamic shared memory on CUDA and HIP), a commit, a
/// wait and the read back. Bindings: h (f16), x (f32), out (f32).
inline lang::Kernel asyncCopies() {
    return lang::kernel("async_copies", [](lang::Builder &k) {
        using lang::Value;
        auto h = k.input<lang::f16>();
        auto x = k.input<float>();
        auto out = k.output<float>();
        auto limit = k.scalar<uint32_t>();
        auto sh = k.shared<lang::f16>(8192);
        auto sx = k.shared<float>(12288);
        auto t = k.localIndex();
        lang::copyAsync<8>(sh, t * 8u, h, t * 8u, t * 8u + 8u <= limit);
        lang::copyAsync<4>(sx, t * 4u, x, t * 4u);
        k.commitCopies();
        lang::copyAsync<2>(sx, 4096u + t * 2u, x, t * 2u + 1u);
        k.commitCopies();
        k.waitCopies(1);
        k.waitCopies();
        k.barrier();
        out[t] = cast<float>(Value<lang::f16>(sh[t])) + sx[t] + sx[4096u + t];
    });
}

/// bf16 and tf32 (f32-input) tiles read straight from buffers: CUDA only (GLSL's cooperative
/// matrices have neither; HIP has no matrix units in the language).
inline lang::Kernel matrixBf16Tf32() {
    return lang::kernel("matrix_bf16_tf32", [](lang::Builder &k) {
        auto a = k.input<lang::bf16>();
        auto b = k.input<lang::bf16>();
        auto x = k.input<float>();
        auto c = k.inout<float>();
        auto fa = k.matrixA<lang::bf16>();
        auto fb = k.matrixB<lang::bf16>();
        auto acc = k.accumulator<float>();
        acc.fill(0.0f);
        fa.load(a, 0u, 16u);
        fb.load(b, 0u, 16u, lang::Layout::ColMajor);
        mma(acc, fa, fb, acc);
        const lang::MatrixTile tf32{16, 16, 8};
        auto ta = k.matrixA<float>(tf32);
        auto tb = k.matrixB<float>(tf32);
        auto tacc = k.accumulator<float>(tf32);
        ta.load(x, 0u, 8u);
        tb.load(x, 128u, 16u);
        tacc.fill(1.0f);
        mma(tacc, ta, tb, tacc);
        acc.store(c, 0u, 16u);
        tacc.store(c, 256u, 16u, lang::Layout::ColMajor);
    });
}

} // namespace backplane::test
