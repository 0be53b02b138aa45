// The host interpreter of the kernel language (core/src/lang/interpreter.cpp) called directly, one
// workgroup per call like the host plugin does: lock-step masks, the cross-target arithmetic
// rules, bounds checks, atomics across concurrent workgroups. Tests internals (lang/ir.hpp).
#include "lang/ir.hpp"

#include <backplane/lang.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <thread>
#include <vector>

using namespace backplane;
using namespace backplane::lang;
namespace ir = backplane::lang::detail;

namespace {

constexpr uint32_t kUntouched = 0xdeadbeefu;

/// One launch: buffers of 32-bit words (a buffer may report fewer bytes than it holds, to leave
/// a canary after its end), the scalar bytes, the grid and the block.
struct Launch {
    std::vector<std::vector<uint32_t>> buffers;
    std::vector<uint64_t> sizes; ///< bytes per buffer; empty: each buffer's whole size
    std::vector<uint32_t> scalars;
    size_t scalarBytes = SIZE_MAX; ///< SIZE_MAX: all of `scalars`
    uint32_t grid[3] = {1, 1, 1};
    uint32_t block[3] = {1, 1, 1};
};

/// Runs every workgroup of `launch` through the interpreter, on `threads` threads at once.
void run(const Kernel &k, Launch &launch, unsigned threads = 1) {
    std::vector<void *> pointers;
    std::vector<uint64_t> sizes;
    for (size_t b = 0; b < launch.buffers.size(); ++b) {
        pointers.push_back(launch.buffers[b].data());
        sizes.push_back(b < launch.sizes.size() ? launch.sizes[b] : launch.buffers[b].size() * 4);
    }
    const uint64_t groups = uint64_t{launch.grid[0]} * launch.grid[1] * launch.grid[2];
    std::atomic<uint64_t> next{0};
    auto work = [&] {
        for (uint64_t g = next++; g < groups; g = next++) {
            bp_host_kernel_context c{};
            c.struct_size = sizeof c;
            std::copy(std::begin(launch.grid), std::end(launch.grid), c.grid);
            std::copy(std::begin(launch.block), std::end(launch.block), c.block);
            c.workgroup[0] = static_cast<uint32_t>(g % launch.grid[0]);
            c.workgroup[1] = static_cast<uint32_t>(g / launch.grid[0] % launch.grid[1]);
            c.workgroup[2] = static_cast<uint32_t>(g / (uint64_t{launch.grid[0]} * launch.grid[1]));
            c.buffers = pointers.data();
            c.buffer_sizes = sizes.data();
            c.buffer_count = static_cast<uint32_t>(pointers.size());
            c.scalars = launch.scalars.data();
            c.scalar_size =
                launch.scalarBytes == SIZE_MAX ? launch.scalars.size() * 4 : launch.scalarBytes;
            c.user_data = &k.module();
            ir::interpretWorkgroup(&c);
        }
    };
    if (threads <= 1) {
        work();
        return;
    }
    std::vector<std::thread> pool;
    for (unsigned t = 0; t < threads; ++t)
        pool.emplace_back(work);
    for (auto &t : pool)
        t.join();
}

uint32_t bitsOf(float f) { return std::bit_cast<uint32_t>(f); }
uint32_t bitsOf(int32_t i) { return static_cast<uint32_t>(i); }
float asFloat(uint32_t b) { return std::bit_cast<float>(b); }
int32_t asInt(uint32_t b) { return static_cast<int32_t>(b); }

template <class T> std::vector<uint32_t> words(std::initializer_list<T> values) {
    std::vector<uint32_t> w;
    for (T v : values)
        w.push_back(bitsOf(v));
    return w;
}

} // namespace

TEST_CASE("if, else-if and else each run for their own lanes only") {
    const Kernel k = kernel("branches", [](Builder &b) {
        auto out = b.output<uint32_t>();
        auto entered = b.output<uint32_t>();
        auto i = b.globalId().x;
        auto branches = b.var(0u); // a bit per branch the lane ran
        b.If(i % 3u == 0u,
             [&] {
                 out[i] = i * 2u;
                 branches = branches | 1u;
             })
            .ElseIf([&] { return i % 3u == 1u; },
                    [&] {
                        out[i] = i + 100u;
                        branches = branches | 2u;
                    })
            .Else([&] {
                out[i] = 7u;
                branches = branches | 4u;
            });
        entered[i] = branches;
    });
    Launch launch;
    launch.buffers = {std::vector<uint32_t>(40, kUntouched), std::vector<uint32_t>(40, kUntouched)};
    launch.grid[0] = 4;
    launch.block[0] = 10;
    run(k, launch);
    for (uint32_t i = 0; i < 40; ++i) {
        INFO("lane " << i);
        CHECK(launch.buffers[0][i] == (i % 3 == 0 ? i * 2 : i % 3 == 1 ? i + 100 : 7u));
        CHECK(launch.buffers[1][i] == 1u << (i % 3));
    }
}

namespace {

/// What the "jumps" kernel computes for one lane (std::nullopt: the lane returned early).
bool jumpsReference(uint32_t lane, uint32_t &result) {
    uint32_t acc = 0;
    for (uint32_t i = 0; i < 10; ++i) {
        if (i == lane % 4) continue;
        if (i > lane % 7 + 3) break;
        for (uint32_t j = 0; j < i; ++j) {
            if (j == 2) break;
            if ((j + lane) % 3 == 0) continue;
            acc += i * 10 + j;
        }
        if (lane % 8 == 5 && i == 3) return false;
        acc = acc * 3 + i;
    }
    result = acc;
    return true;
}

uint32_t collatzReference(uint32_t lane) {
    uint32_t n = lane, steps = 0;
    while (n != 1) {
        steps += 1;
        if (steps > 50) break;
        if (n % 2 == 0) {
            n /= 2;
            continue;
        }
        n = n * 3 + 1;
    }
    return steps;
}

} // namespace

TEST_CASE("break, continue and return in nested loops follow each lane's own path") {
    const Kernel k = kernel("jumps", [](Builder &b) {
        auto out = b.output<uint32_t>();
        auto steps = b.output<uint32_t>();
        auto lane = b.globalId().x;
        // A While whose continue re-evaluates the condition, and a break out of it.
        auto n = b.var(lane);
        auto count = b.var(0u);
        b.While([&] { return n != 1u; },
                [&] {
                    count += 1u;
                    b.If(count > 50u, [&] { b.Break(); });
                    b.If(n % 2u == 0u, [&] {
                        n = n / 2u;
                        b.Continue();
                    });
                    n = n * 3u + 1u;
                });
        steps[lane] = count;
        auto acc = b.var(0u);
        b.For(0u, 10u, [&](Value<uint32_t> i) {
            b.If(i == lane % 4u, [&] { b.Continue(); });
            b.If(i > lane % 7u + 3u, [&] { b.Break(); });
            b.For(0u, i, [&](Value<uint32_t> j) {
                b.If(j == 2u, [&] { b.Break(); });
                b.If((j + lane) % 3u == 0u, [&] { b.Continue(); });
                acc = acc + (i * 10u + j);
            });
            b.If(lane % 8u == 5u && i == 3u, [&] { b.Return(); });
            acc = acc * 3u + i;
        });
        out[lane] = acc;
    });
    Launch launch;
    launch.buffers = {std::vector<uint32_t>(64, kUntouched), std::vector<uint32_t>(64, kUntouched)};
    launch.grid[0] = 2;
    launch.block[0] = 32;
    run(k, launch);
    for (uint32_t lane = 0; lane < 64; ++lane) {
        INFO("lane " << lane);
        uint32_t want = kUntouched;
        jumpsReference(lane, want);
        CHECK(launch.buffers[0][lane] == want);
        CHECK(launch.buffers[1][lane] == collatzReference(lane));
    }
}

TEST_CASE("a continue in a For still runs the increment, also for a signed index and step") {
    const Kernel k = kernel("for_continue", [](Builder &b) {
        auto out = b.output<int32_t>();
        auto lane = b.globalId().x;
        auto acc = b.var(0);
        auto iterations = b.var(0u);
        b.For<int32_t>(-5, 20, 3, [&](Value<int32_t> i) {
            iterations += 1u;
            // Without the increment a continued lane would loop forever: stop it instead.
            b.If(iterations > 100u, [&] { b.Break(); });
            b.If((i + cast<int32_t>(lane)) % 2 == 0, [&] { b.Continue(); });
            acc = acc + i;
        });
        out[lane] = acc + cast<int32_t>(iterations) * 1000;
    });
    Launch launch;
    launch.buffers = {std::vector<uint32_t>(8, kUntouched)};
    launch.block[0] = 8;
    run(k, launch);
    for (uint32_t lane = 0; lane < 8; ++lane) {
        int32_t acc = 0, iterations = 0;
        for (int32_t i = -5; i < 20; i += 3) {
            ++iterations;
            if ((i + static_cast<int32_t>(lane)) % 2 == 0) continue;
            acc += i;
        }
        INFO("lane " << lane);
        CHECK(asInt(launch.buffers[0][lane]) == acc + iterations * 1000);
    }
}

TEST_CASE("integer division and remainder by zero and INT_MIN / -1 give the pinned results") {
    const Kernel k = kernel("division", [](Builder &b) {
        auto x = b.input<int32_t>();
        auto y = b.input<int32_t>();
        auto quotient = b.output<int32_t>();
        auto remainder = b.output<int32_t>();
        auto uquotient = b.output<uint32_t>();
        auto uremainder = b.output<uint32_t>();
        auto sum = b.output<int32_t>();
        auto product = b.output<int32_t>();
        auto i = b.globalId().x;
        quotient[i] = x[i] / y[i];
        remainder[i] = x[i] % y[i];
        uquotient[i] = cast<uint32_t>(Value<int32_t>(x[i])) / cast<uint32_t>(Value<int32_t>(y[i]));
        uremainder[i] = cast<uint32_t>(Value<int32_t>(x[i])) % cast<uint32_t>(Value<int32_t>(y[i]));
        sum[i] = x[i] + y[i];
        product[i] = x[i] * y[i];
    });
    struct Case {
        int32_t x, y, quotient, remainder;
    };
    const Case cases[] = {
        {7, 2, 3, 1},
        {-7, 2, -3, -1},
        {7, -2, -3, 1},
        {-7, -2, 3, -1},
        {5, 0, 0, 0},
        {-5, 0, 0, 0},
        {0, 0, 0, 0},
        {INT_MIN, -1, INT_MIN, 0},
        {INT_MIN, 1, INT_MIN, 0},
        {INT_MAX, -1, -INT_MAX, 0},
        {INT_MIN, 2, INT_MIN / 2, 0},
        {-1, 7, 0, -1},
    };
    const uint32_t count = std::size(cases);
    Launch launch;
    launch.buffers.resize(8, std::vector<uint32_t>(count, kUntouched));
    for (uint32_t c = 0; c < count; ++c) {
        launch.buffers[0][c] = bitsOf(cases[c].x);
        launch.buffers[1][c] = bitsOf(cases[c].y);
    }
    launch.block[0] = count;
    run(k, launch);
    for (uint32_t c = 0; c < count; ++c) {
        const uint32_t ux = bitsOf(cases[c].x), uy = bitsOf(cases[c].y);
        INFO(cases[c].x << " and " << cases[c].y);
        CHECK(asInt(launch.buffers[2][c]) == cases[c].quotient);
        CHECK(asInt(launch.buffers[3][c]) == cases[c].remainder);
        CHECK(launch.buffers[4][c] == (uy == 0 ? 0 : ux / uy));
        CHECK(launch.buffers[5][c] == (uy == 0 ? 0 : ux % uy));
        CHECK(launch.buffers[6][c] == ux + uy); // wraps
        CHECK(launch.buffers[7][c] == ux * uy);
    }
}

TEST_CASE("division by a divisor all lanes share gives the exact quotient and remainder") {
    // A uniform u32 divisor divides by multiplication; check it against the CPU's division.
    const Kernel k = kernel("uniform_division", [](Builder &b) {
        auto x = b.input<uint32_t>();
        auto quotient = b.output<uint32_t>();
        auto remainder = b.output<uint32_t>();
        auto d = b.scalar<uint32_t>();
        auto i = b.globalId().x;
        quotient[i] = x[i] / d;
        remainder[i] = x[i] % d;
    });
    std::vector<uint32_t> xs = {0u,          1u,          2u,          3u,         6u,
                                7u,          640u,        641u,        642u,       0x7fffffffu,
                                0x80000000u, 0x80000001u, 0xfffffffeu, 0xffffffffu};
    uint32_t seed = 12345;
    while (xs.size() < 256) {
        seed = seed * 1664525u + 1013904223u;
        xs.push_back(seed >> (seed % 29));
    }
    for (uint32_t d : {0u, 1u, 2u, 3u, 7u, 10u, 64u, 641u, 1000003u, 0x7fffffffu, 0x80000000u,
                       0x80000001u, 0xfffffffeu, 0xffffffffu}) {
        Launch launch;
        launch.buffers = {xs, std::vector<uint32_t>(xs.size(), kUntouched),
                          std::vector<uint32_t>(xs.size(), kUntouched)};
        launch.scalars = {d};
        launch.block[0] = static_cast<uint32_t>(xs.size());
        run(k, launch);
        for (size_t i = 0; i < xs.size(); ++i) {
            INFO(xs[i] << " / " << d);
            CHECK(launch.buffers[1][i] == (d == 0 ? 0 : xs[i] / d));
            CHECK(launch.buffers[2][i] == (d == 0 ? 0 : xs[i] % d));
        }
    }
}

TEST_CASE("shift counts are taken modulo 32 and >> on i32 is arithmetic") {
    const Kernel k = kernel("shifts", [](Builder &b) {
        auto out = b.output<uint32_t>();
        auto signedOut = b.output<int32_t>();
        auto count = b.scalar<uint32_t>();
        auto value = b.scalar<int32_t>();
        out[0u] = Value<uint32_t>(1u) << count;
        out[1u] = Value<uint32_t>(0x80000000u) >> count;
        signedOut[0u] = value >> cast<int32_t>(count);
        signedOut[1u] = value << cast<int32_t>(count);
    });
    for (uint32_t count : {1u, 33u, 31u, 63u}) {
        Launch launch;
        launch.buffers = {std::vector<uint32_t>(2, kUntouched),
                          std::vector<uint32_t>(2, kUntouched)};
        launch.scalars = {count, bitsOf(-8)};
        run(k, launch);
        INFO("count " << count);
        CHECK(launch.buffers[0][0] == 1u << (count % 32));
        CHECK(launch.buffers[0][1] == 0x80000000u >> (count % 32));
        CHECK(asInt(launch.buffers[1][0]) == (-8 >> (count % 32)));
        CHECK(launch.buffers[1][1] == (bitsOf(-8) << (count % 32)));
    }
}

TEST_CASE("casts truncate and saturate floats, keep integer bits and map bools to 0 and 1") {
    const Kernel k = kernel("casts", [](Builder &b) {
        auto f = b.input<float>();
        auto u = b.input<uint32_t>();
        auto toI32 = b.output<int32_t>();
        auto toU32 = b.output<uint32_t>();
        auto toBool = b.output<uint32_t>();
        auto fromU32 = b.output<float>();
        auto fromI32 = b.output<float>();
        auto intBits = b.output<int32_t>();
        auto fromBool = b.output<float>();
        auto i = b.globalId().x;
        Value<float> x = f[i];
        Value<uint32_t> v = u[i];
        toI32[i] = cast<int32_t>(x);
        toU32[i] = cast<uint32_t>(x);
        toBool[i] = cast<uint32_t>(cast<bool>(x)) + cast<uint32_t>(cast<bool>(v)) * 2u;
        fromU32[i] = cast<float>(v);
        fromI32[i] = cast<float>(cast<int32_t>(v));
        intBits[i] = cast<int32_t>(v);
        fromBool[i] = cast<float>(x > 0.0f);
    });
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const float inf = std::numeric_limits<float>::infinity();
    struct Case {
        float f;
        uint32_t u;
        int32_t toI32;
        uint32_t toU32;
    };
    const Case cases[] = {
        {1.9f, 16777217u, 1, 1},
        {-1.9f, 0xffffffffu, -1, 0},
        {-0.5f, 0u, 0, 0},
        {3e9f, 3000000000u, INT_MAX, 3000000000u},
        {-3e9f, 0x80000000u, INT_MIN, 0},
        {5e9f, 2u, INT_MAX, 0xffffffffu},
        {nan, 7u, 0, 0},
        {inf, 1u, INT_MAX, 0xffffffffu},
        {-inf, 0u, INT_MIN, 0},
        {-0.0f, 0x7fffffffu, 0, 0},
        {2147483520.0f, 16777219u, 2147483520, 2147483520u},
    };
    const uint32_t count = std::size(cases);
    Launch launch;
    launch.buffers.resize(9, std::vector<uint32_t>(count, kUntouched));
    for (uint32_t c = 0; c < count; ++c) {
        launch.buffers[0][c] = bitsOf(cases[c].f);
        launch.buffers[1][c] = cases[c].u;
    }
    launch.block[0] = count;
    run(k, launch);
    for (uint32_t c = 0; c < count; ++c) {
        const Case &e = cases[c];
        INFO("float " << e.f << ", u32 " << e.u);
        CHECK(asInt(launch.buffers[2][c]) == e.toI32);
        CHECK(launch.buffers[3][c] == e.toU32);
        CHECK(launch.buffers[4][c] == (e.f != 0.0f ? 1u : 0u) + (e.u != 0 ? 2u : 0u));
        CHECK(asFloat(launch.buffers[5][c]) == static_cast<float>(e.u)); // round to nearest
        CHECK(asFloat(launch.buffers[6][c]) == static_cast<float>(static_cast<int32_t>(e.u)));
        CHECK(launch.buffers[7][c] == e.u);
        CHECK(asFloat(launch.buffers[8][c]) == (e.f > 0.0f ? 1.0f : 0.0f));
    }
    CHECK(asFloat(launch.buffers[5][0]) == 16777216.0f); // 2^24 + 1 rounds to even
}

TEST_CASE("float arithmetic rounds a*b+c twice, fma once, and min / max ignore a NaN") {
    const Kernel k = kernel("floats", [](Builder &b) {
        auto in = b.input<float>();
        auto out = b.output<float>();
        Value<float> x = in[0u], y = in[1u], z = in[2u], q = in[3u];
        out[0u] = x * y + z;
        out[1u] = fma(x, y, z);
        out[2u] = min(q, 2.0f) + min(Value<float>(2.0f), q) * 10.0f;
        out[3u] = max(Value<float>(3.0f), q) + max(q, 3.0f) * 10.0f;
        out[4u] = sqrt(Value<float>(16.0f)) + floor(Value<float>(-1.5f)) + abs(Value<float>(-2.0f));
        out[5u] = x / 0.0f;
    });
    Launch launch;
    const float eps = std::ldexp(1.0f, -23);
    launch.buffers = {
        words<float>({1.0f + eps, 1.0f - eps, -1.0f, std::numeric_limits<float>::quiet_NaN()}),
        std::vector<uint32_t>(6, kUntouched)};
    run(k, launch);
    const auto &out = launch.buffers[1];
    CHECK(asFloat(out[0]) == 0.0f);                   // (1 - 2^-46) rounds to 1 first
    CHECK(asFloat(out[1]) == -std::ldexp(1.0f, -46)); // fused: exact
    CHECK(asFloat(out[2]) == 22.0f);                  // the NaN is ignored on either side
    CHECK(asFloat(out[3]) == 33.0f);
    CHECK(asFloat(out[4]) == 4.0f);
    CHECK(std::isinf(asFloat(out[5])));
}

TEST_CASE("out-of-range accesses load 0 and drop stores and atomics, in every memory") {
    const Kernel k = kernel("bounds", [](Builder &b) {
        auto in = b.input<uint32_t>();
        auto out = b.output<uint32_t>();
        auto small = b.output<uint32_t>();
        auto counter = b.inout<uint32_t>();
        auto olds = b.output<uint32_t>();
        auto missing = b.inout<uint32_t>(); // beyond buffer_count: length 0
        auto tile = b.shared<uint32_t>(4);
        auto mine = b.array<uint32_t>(2);
        auto i = b.localId().x;
        out[i] = in[i];
        small[i] = i + 1u;
        olds[i] = atomicAdd(counter[i], 5u);
        tile[i] = i + 10u;
        b.barrier();
        mine[i] = 5u;
        mine[7u] = 9u; // a uniform index out of range
        out[i + 8u] = tile[7u - i] + mine[i] * 100u + mine[7u] * 1000u;
        missing[i] = 1u;
        out[i + 16u] = missing[i] + atomicOr(missing[0u], 1u) + missing.length();
    });
    Launch launch;
    launch.buffers = {
        {1, 2, 3, 4, kUntouched, kUntouched, kUntouched, kUntouched}, // in: 4 elements visible
        std::vector<uint32_t>(24, kUntouched),                        // out
        std::vector<uint32_t>(8, kUntouched),                         // small: 4 visible
        {0, kUntouched},                                              // counter: 1 visible
        std::vector<uint32_t>(8, kUntouched),                         // olds
    };
    launch.sizes = {16, 96, 16, 4, 32};
    launch.block[0] = 8;
    run(k, launch);
    const auto &out = launch.buffers[1];
    for (uint32_t i = 0; i < 8; ++i) {
        INFO("lane " << i);
        CHECK(out[i] == (i < 4 ? i + 1 : 0u));
        CHECK(launch.buffers[2][i] == (i < 4 ? i + 1 : kUntouched));
        CHECK(launch.buffers[4][i] ==
              0u); // lane 0 saw 0 before adding; the others are out of range
        const uint32_t shared = 7 - i < 4 ? 7 - i + 10 : 0;
        CHECK(out[i + 8] == shared + (i < 2 ? 500u : 0u));
        CHECK(out[i + 16] == 0u);
    }
    CHECK(launch.buffers[3][0] == 5u);
    CHECK(launch.buffers[3][1] == kUntouched);
    CHECK(launch.buffers[0][4] == kUntouched);
}

TEST_CASE("lengths and scalars come from the context; scalars past scalar_size read 0") {
    const Kernel k = kernel("context", [](Builder &b) {
        auto in = b.input<uint32_t>();
        auto out = b.output<uint32_t>();
        auto first = b.scalar<float>();
        auto second = b.scalar<uint32_t>();
        out[0u] = in.length();
        out[1u] = out.length();
        out[2u] = cast<uint32_t>(first);
        out[3u] = second;
    });
    Launch launch;
    launch.buffers = {std::vector<uint32_t>(3, 0), std::vector<uint32_t>(5, kUntouched)};
    launch.scalars = {bitsOf(42.5f), 77u};
    run(k, launch);
    CHECK(launch.buffers[1][0] == 3u);
    CHECK(launch.buffers[1][1] == 5u);
    CHECK(launch.buffers[1][2] == 42u);
    CHECK(launch.buffers[1][3] == 77u);
    launch.scalarBytes = 6; // half of the second field: its missing bytes read as 0
    launch.scalars = {bitsOf(1.0f), 0x12345678u};
    run(k, launch);
    CHECK(launch.buffers[1][2] == 1u);
    CHECK(launch.buffers[1][3] == 0x5678u);
}

TEST_CASE("ids and sizes are the workgroup's; subgroups on the host are one lane wide") {
    const Kernel k = kernel("ids", [](Builder &b) {
        auto out = b.output<uint32_t>();
        auto g = b.globalId();
        auto stride = b.gridSize().x * b.groupSize().x;
        auto row = (g.z * (b.gridSize().y * b.groupSize().y) + g.y) * stride + g.x;
        auto l = b.localId(), w = b.groupId();
        auto slot = row * 4u;
        out[slot] = b.localIndex() | (l.x << 8u) | (l.y << 12u) | (l.z << 16u);
        out[slot + 1u] = w.x | (w.y << 8u) | (w.z << 16u);
        out[slot + 2u] = b.groupSize().x | (b.groupSize().y << 8u) | (b.gridSize().y << 16u);
        Value<uint32_t> x = row + 1u;
        out[slot + 3u] = b.subgroupSize() * 1000000u + b.subgroupLane() * 100000u + subgroupSum(x) +
                         subgroupMax(x) + shuffleXor(x, 1u) + broadcast(x, 0u) - 3u * x;
    });
    Launch launch;
    launch.grid[0] = 2;
    launch.grid[1] = 3;
    launch.grid[2] = 1;
    launch.block[0] = 4;
    launch.block[1] = 2;
    launch.block[2] = 2;
    launch.buffers = {std::vector<uint32_t>(2 * 3 * 1 * 16 * 4, kUntouched)};
    run(k, launch, 3);
    const auto &out = launch.buffers[0];
    for (uint32_t wz = 0; wz < 1; ++wz)
        for (uint32_t wy = 0; wy < 3; ++wy)
            for (uint32_t wx = 0; wx < 2; ++wx)
                for (uint32_t lz = 0; lz < 2; ++lz)
                    for (uint32_t ly = 0; ly < 2; ++ly)
                        for (uint32_t lx = 0; lx < 4; ++lx) {
                            const uint32_t gx = wx * 4 + lx, gy = wy * 2 + ly, gz = wz * 2 + lz;
                            const uint32_t row = (gz * 6 + gy) * 8 + gx;
                            const uint32_t index = (lz * 2 + ly) * 4 + lx;
                            INFO("global id " << gx << "," << gy << "," << gz);
                            CHECK(out[row * 4] == (index | lx << 8 | ly << 12 | lz << 16));
                            CHECK(out[row * 4 + 1] == (wx | wy << 8 | wz << 16));
                            CHECK(out[row * 4 + 2] == (4u | 2u << 8 | 3u << 16));
                            CHECK(out[row * 4 + 3] == 1000000u + row + 1);
                        }
}

TEST_CASE("atomics on a buffer add up across workgroups that run concurrently") {
    const Kernel k = kernel("atomics", [](Builder &b) {
        auto counters = b.inout<uint32_t>();
        auto signedCounters = b.inout<int32_t>();
        auto olds = b.output<uint32_t>();
        auto i = b.globalId().x;
        olds[i] = atomicAdd(counters[0u], 1u);
        b.For(0u, 64u, [&](Value<uint32_t>) { atomicAdd(counters[1u], 1u); });
        atomicMax(counters[2u], i);
        atomicOr(counters[3u], 1u << (i % 32u));
        atomicMin(signedCounters[0u], cast<int32_t>(i) - 100);
        atomicMax(signedCounters[1u], cast<int32_t>(i) - 100);
        atomicXor(counters[4u], i);
    });
    const uint32_t groups = 128, lanes = 64, total = groups * lanes;
    Launch launch;
    launch.buffers = {std::vector<uint32_t>(5, 0),
                      {bitsOf(INT_MAX), bitsOf(INT_MIN)},
                      std::vector<uint32_t>(total, kUntouched)};
    launch.grid[0] = groups;
    launch.block[0] = lanes;
    run(k, launch, 8);
    const auto &counters = launch.buffers[0];
    CHECK(counters[0] == total);
    CHECK(counters[1] == total * 64);
    CHECK(counters[2] == total - 1);
    CHECK(counters[3] == 0xffffffffu);
    uint32_t xorAll = 0;
    for (uint32_t i = 0; i < total; ++i)
        xorAll ^= i;
    CHECK(counters[4] == xorAll);
    CHECK(asInt(launch.buffers[1][0]) == -100);
    CHECK(asInt(launch.buffers[1][1]) == static_cast<int32_t>(total) - 101);
    // Each lane saw a distinct previous value; within a workgroup lanes apply in order.
    std::vector<uint32_t> olds = launch.buffers[2];
    for (uint32_t g = 0; g < groups; ++g)
        for (uint32_t l = 1; l < lanes; ++l)
            CHECK(olds[g * lanes + l] > olds[g * lanes + l - 1]);
    std::sort(olds.begin(), olds.end());
    for (uint32_t i = 0; i < total; ++i)
        REQUIRE(olds[i] == i);
}

TEST_CASE("a shared-memory reduction with barriers sums each workgroup") {
    const Kernel k = kernel("reduce", [](Builder &b) {
        auto in = b.input<uint32_t>();
        auto out = b.output<uint32_t>();
        auto viaLoop = b.output<uint32_t>();
        auto tile = b.shared<uint32_t>(256);
        auto l = b.localId().x;
        auto i = b.globalId().x;
        tile[l] = in[i];
        b.barrier();
        for (uint32_t s = 128; s > 0; s /= 2) { // unrolled while recording
            b.If(l < s, [&] { tile[l] = tile[l] + tile[l + s]; });
            b.barrier();
        }
        b.If(l == 0u, [&] { out[b.groupId().x] = tile[0u]; });
        b.barrier();
        // Again with a device loop over a uniform variable, and an atomic on shared memory.
        auto total = b.shared<uint32_t>(1);
        b.If(l == 0u, [&] { total[0u] = 0u; });
        tile[l] = in[i];
        b.barrier();
        auto s = b.var(128u);
        b.While([&] { return s > 0u; },
                [&] {
                    b.If(l < s, [&] { tile[l] = tile[l] + tile[l + s]; });
                    b.barrier();
                    s = s / 2u;
                });
        atomicAdd(total[0u], in[i]);
        b.barrier();
        b.If(l == 0u, [&] { viaLoop[b.groupId().x] = tile[0u] * 2u - total[0u]; });
    });
    const uint32_t groups = 6;
    Launch launch;
    launch.buffers = {std::vector<uint32_t>(groups * 256),
                      std::vector<uint32_t>(groups, kUntouched),
                      std::vector<uint32_t>(groups, kUntouched)};
    for (uint32_t i = 0; i < groups * 256; ++i)
        launch.buffers[0][i] = i * 7 + (i >> 3);
    launch.grid[0] = groups;
    launch.block[0] = 256;
    run(k, launch, 2);
    for (uint32_t g = 0; g < groups; ++g) {
        uint32_t sum = 0;
        for (uint32_t i = g * 256; i < (g + 1) * 256; ++i)
            sum += launch.buffers[0][i];
        INFO("workgroup " << g);
        CHECK(launch.buffers[1][g] == sum);
        CHECK(launch.buffers[2][g] == sum);
    }
}

TEST_CASE("values computed before loops keep their registers through every iteration") {
    // Register reuse must not hand a value's register to a temporary while a later iteration,
    // or a later sibling loop, still reads it.
    const Kernel k = kernel("liveness", [](Builder &b) {
        auto out = b.output<uint32_t>();
        auto i = b.globalId().x;
        Value<uint32_t> kept = i * 3u + 1u;
        Value<uint32_t> keptToo = i ^ 0x55u;
        auto acc = b.var(0u);
        b.For(0u, 4u, [&](Value<uint32_t> j) {
            std::vector<Value<uint32_t>> t{j * 2u}; // a chain of temporaries
            for (uint32_t u = 0; u < 6; ++u)
                t.push_back((t.back() + u) * 3u);
            acc = acc + kept + t.back();
        });
        b.For(0u, 3u, [&](Value<uint32_t> j) {
            // The last reads of kept and keptToo, then temporaries that could take their
            // registers if they were freed here instead of at the end of the loop.
            acc = acc * 7u + keptToo + kept;
            std::vector<Value<uint32_t>> t{j + 9u};
            for (uint32_t u = 0; u < 6; ++u)
                t.push_back((t.back() ^ u) + 5u);
            acc = acc + t.back();
        });
        out[i] = acc;
    });
    Launch launch;
    launch.buffers = {std::vector<uint32_t>(32, kUntouched)};
    launch.block[0] = 32;
    run(k, launch);
    for (uint32_t i = 0; i < 32; ++i) {
        const uint32_t kept = i * 3 + 1, keptToo = i ^ 0x55u;
        uint32_t acc = 0;
        for (uint32_t j = 0; j < 4; ++j) {
            uint32_t t = j * 2;
            for (uint32_t u = 0; u < 6; ++u)
                t = (t + u) * 3;
            acc = acc + kept + t;
        }
        for (uint32_t j = 0; j < 3; ++j) {
            acc = acc * 7 + keptToo + kept;
            uint32_t t = j + 9;
            for (uint32_t u = 0; u < 6; ++u)
                t = (t ^ u) + 5;
            acc = acc + t;
        }
        INFO("lane " << i);
        CHECK(launch.buffers[0][i] == acc);
    }
}

TEST_CASE("a tiled matmul with shared tiles and a private accumulator matches the reference") {
    constexpr uint32_t kTile = 8, kWork = 2; // each thread computes kWork columns
    const Kernel k = kernel("tiled_matmul", [&](Builder &b) {
        auto a = b.input<float>();
        auto bm = b.input<float>();
        auto c = b.output<float>();
        auto n = b.scalar<uint32_t>();
        auto tileA = b.shared<float>(kTile * kTile);
        auto tileB = b.shared<float>(kTile * kTile * kWork);
        auto acc = b.array<float>(kWork);
        auto tx = b.localId().x, ty = b.localId().y;
        auto row = b.groupId().y * kTile + ty;
        auto col0 = b.groupId().x * (kTile * kWork) + tx;
        for (uint32_t w = 0; w < kWork; ++w)
            acc[w] = 0.0f;
        b.For(0u, n, kTile, [&](Value<uint32_t> t) {
            tileA[ty * kTile + tx] = a[row * n + t + tx];
            for (uint32_t w = 0; w < kWork; ++w)
                tileB[ty * (kTile * kWork) + tx + w * kTile] = bm[(t + ty) * n + col0 + w * kTile];
            b.barrier();
            b.For(0u, kTile, [&](Value<uint32_t> kk) {
                Value<float> x = tileA[ty * kTile + kk];
                for (uint32_t w = 0; w < kWork; ++w)
                    acc[w] = acc[w] + x * tileB[kk * (kTile * kWork) + tx + w * kTile];
            });
            b.barrier();
        });
        for (uint32_t w = 0; w < kWork; ++w)
            c[row * n + col0 + w * kTile] = acc[w];
    });
    const uint32_t n = 32;
    Launch launch;
    launch.buffers = {std::vector<uint32_t>(n * n), std::vector<uint32_t>(n * n),
                      std::vector<uint32_t>(n * n, kUntouched)};
    for (uint32_t i = 0; i < n * n; ++i) {
        launch.buffers[0][i] = bitsOf(static_cast<float>(i % 7) - 3.0f);
        launch.buffers[1][i] = bitsOf(static_cast<float>(i % 5) * 0.5f);
    }
    launch.scalars = {n};
    launch.grid[0] = n / (kTile * kWork);
    launch.grid[1] = n / kTile;
    launch.block[0] = kTile;
    launch.block[1] = kTile;
    run(k, launch, 2);
    for (uint32_t r = 0; r < n; ++r)
        for (uint32_t col = 0; col < n; ++col) {
            float want = 0.0f;
            for (uint32_t j = 0; j < n; ++j)
                want +=
                    asFloat(launch.buffers[0][r * n + j]) * asFloat(launch.buffers[1][j * n + col]);
            INFO("row " << r << " column " << col);
            CHECK(asFloat(launch.buffers[2][r * n + col]) == want); // small integers: exact
        }
}

TEST_CASE("accesses along the rows of a 3-D block give each lane its own element") {
    // Indices that step by 1 or 0 along local x move whole rows at a time; rows partly out of
    // range, other steps and non-linear indices must give the same results as lane by lane.
    const Kernel k = kernel("rows", [](Builder &b) {
        auto in = b.input<uint32_t>();
        auto out = b.output<uint32_t>();
        auto rows = b.output<uint32_t>();
        auto shift = b.scalar<uint32_t>();
        auto tile = b.shared<uint32_t>(12);
        auto l = b.localId();
        auto g = b.globalId();
        auto lane = b.localIndex() + b.groupId().x * 24u;
        out[lane * 7u] = in[g.y * 8u + g.x];                // step 1, the last rows out of range
        out[lane * 7u + 1u] = in[l.y * 5u + 2u + l.z * 9u]; // step 0
        out[lane * 7u + 2u] = in[l.x * 2u + l.y];           // step 2
        out[lane * 7u + 3u] = in[l.z * 7u + 3u - l.x];      // step -1
        out[lane * 7u + 4u] = in[l.x * l.x + l.y];          // not linear
        tile[l.y * 4u + l.x] = g.x + 100u * l.z;            // z = 1 stores after z = 0
        b.barrier();
        out[lane * 7u + 5u] = tile[(l.y + 1u) % 3u * 4u + l.x] + tile[l.x * 4u] * 1000u;
        out[lane * 7u + 6u] = tile[l.y * 4u + l.x + 2u]; // the last row partly out of range
        rows[g.y * 8u + g.x + shift] = lane + 1u;        // rows partly out of range
    });
    Launch launch;
    std::vector<uint32_t> in(20);
    for (uint32_t i = 0; i < 20; ++i)
        in[i] = 1000 + i * 3;
    launch.buffers = {in, std::vector<uint32_t>(48 * 7, kUntouched),
                      std::vector<uint32_t>(40, kUntouched)};
    launch.scalars = {22u};
    launch.grid[0] = 2;
    launch.block[0] = 4;
    launch.block[1] = 3;
    launch.block[2] = 2;
    run(k, launch);
    auto read = [&](uint32_t i) { return i < 20 ? in[i] : 0u; };
    std::vector<uint32_t> rows(40, kUntouched);
    for (uint32_t wx = 0; wx < 2; ++wx)
        for (uint32_t lz = 0; lz < 2; ++lz)
            for (uint32_t ly = 0; ly < 3; ++ly)
                for (uint32_t lx = 0; lx < 4; ++lx) {
                    const uint32_t gx = wx * 4 + lx, gy = ly;
                    const uint32_t lane = lx + 4 * (ly + 3 * lz) + wx * 24;
                    const uint32_t *got = &launch.buffers[1][lane * 7];
                    INFO("group " << wx << ", local " << lx << "," << ly << "," << lz);
                    CHECK(got[0] == read(gy * 8 + gx));
                    CHECK(got[1] == read(ly * 5 + 2 + lz * 9));
                    CHECK(got[2] == read(lx * 2 + ly));
                    CHECK(got[3] == read(lz * 7 + 3 - lx));
                    CHECK(got[4] == read(lx * lx + ly));
                    const uint32_t next = (ly + 1) % 3 * 4 + lx; // tile[y * 4 + x] = group x + 100
                    const uint32_t first = lx < 3 ? wx * 4 + 100 : 0; // tile[lx * 4]: x = 0, y = lx
                    CHECK(got[5] == wx * 4 + next % 4 + 100 + first * 1000);
                    const uint32_t shifted = ly * 4 + lx + 2;
                    CHECK(got[6] == (shifted < 12 ? wx * 4 + shifted % 4 + 100 : 0u));
                    if (gy * 8 + gx + 22 < 40) rows[gy * 8 + gx + 22] = lane + 1; // lane order
                }
    CHECK(launch.buffers[2] == rows);
}

TEST_CASE("a uniform private index under a partial mask stores for the active lanes only") {
    const Kernel k = kernel("private_mask", [](Builder &b) {
        auto out = b.output<uint32_t>();
        auto i = b.localId().x;
        auto mine = b.array<uint32_t>(3);
        mine[0u] = 0u;
        mine[1u] = 0u;
        b.If(i < 3u, [&] { mine[1u] = i + 40u; });
        b.For(0u, 2u,
              [&](Value<uint32_t> j) { b.If(i % 2u == 0u, [&] { mine[j] = mine[j] + 1000u; }); });
        out[i] = mine[1u] + mine[0u];
    });
    Launch launch;
    launch.buffers = {std::vector<uint32_t>(8, kUntouched)};
    launch.block[0] = 8;
    run(k, launch);
    for (uint32_t i = 0; i < 8; ++i) {
        INFO("lane " << i);
        CHECK(launch.buffers[0][i] == (i < 3 ? i + 40 : 0u) + (i % 2 == 0 ? 2000u : 0u));
    }
}

TEST_CASE("values that differ between lanes are never taken for uniform ones") {
    // The recorder marks the load of v uniform (v holds 0 when it is recorded); the assignment
    // after it makes it per lane from the second iteration on. The second loop's trip count is
    // per lane.
    const Kernel k = kernel("per_lane", [](Builder &b) {
        auto out = b.output<uint32_t>();
        auto i = b.localId().x;
        auto mine = b.array<uint32_t>(8);
        for (uint32_t w = 0; w < 8; ++w)
            mine[w] = w * 10u;
        auto v = b.var(0u);
        b.For(0u, 2u, [&](Value<uint32_t> j) {
            Value<uint32_t> index = v;
            out[i * 3u + j] = mine[index];
            v = i % 8u;
        });
        auto acc = b.var(0u);
        b.For(0u, i % 4u, [&](Value<uint32_t> j) { acc = acc + j + 1u; });
        out[i * 3u + 2u] = acc;
    });
    Launch launch;
    launch.buffers = {std::vector<uint32_t>(16 * 3, kUntouched)};
    launch.block[0] = 16;
    run(k, launch);
    for (uint32_t i = 0; i < 16; ++i) {
        INFO("lane " << i);
        CHECK(launch.buffers[0][i * 3] == 0u);
        CHECK(launch.buffers[0][i * 3 + 1] == i % 8 * 10);
        const uint32_t n = i % 4;
        CHECK(launch.buffers[0][i * 3 + 2] == n * (n + 1) / 2);
    }
}

TEST_CASE("a loaded value keeps what it read when the memory is stored to afterwards") {
    // Loads read in place while nothing stores to their memory; these ones must not.
    const Kernel k = kernel("load_then_store", [](Builder &b) {
        auto out = b.output<uint32_t>();
        auto i = b.localId().x;
        auto v = b.var(i + 1u);
        auto mine = b.array<uint32_t>(2);
        mine[1u] = i * 2u;
        Value<uint32_t> before = v;
        Value<uint32_t> elementBefore = mine[1u];
        v = 100u;
        mine[1u] = 200u;
        out[i * 4u] = before + elementBefore * 1000u;
        // Read before a loop that stores to the variable: the value is read in every iteration.
        Value<uint32_t> outside = v;
        auto acc = b.var(0u);
        b.For(0u, 3u, [&](Value<uint32_t> j) {
            acc = acc + outside;
            v = v + j + 1u;
        });
        out[i * 4u + 1u] = acc;
        out[i * 4u + 2u] = v;
        // Identities share their operand's register; the cast still changes how it compares.
        Value<int32_t> negative = cast<int32_t>(Value<uint32_t>(0xfffffff0u) + i * 0u);
        out[i * 4u + 3u] = select(negative + 0 < 0, Value<uint32_t>(1u), Value<uint32_t>(0u)) +
                           (i + 0u) * 1u * 10u;
    });
    Launch launch;
    launch.buffers = {std::vector<uint32_t>(8 * 4, kUntouched)};
    launch.block[0] = 8;
    run(k, launch);
    for (uint32_t i = 0; i < 8; ++i) {
        INFO("lane " << i);
        CHECK(launch.buffers[0][i * 4] == i + 1 + i * 2 * 1000);
        CHECK(launch.buffers[0][i * 4 + 1] == 300u);
        CHECK(launch.buffers[0][i * 4 + 2] == 106u);
        CHECK(launch.buffers[0][i * 4 + 3] == 1 + i * 10);
    }
}

TEST_CASE("kernels called in turn on one thread each run their own program") {
    // A thread keeps the plan of the kernel it ran last, and what its leaf registers hold;
    // switching kernels, scalars or block shapes must not reuse either.
    const Kernel add = kernel("add_one", [](Builder &b) {
        auto out = b.inout<uint32_t>();
        auto i = b.localId().x + b.localId().y * 100u; // y is 0: ids of the current block shape
        out[i] = out[i] + 1u;
    });
    const Kernel scale = kernel("scale", [](Builder &b) {
        auto out = b.inout<uint32_t>();
        auto factor = b.scalar<uint32_t>();
        auto i = b.localIndex();
        auto twice = b.var(out[i] * factor);
        out[i] = twice + 0u;
    });
    // The same IR but for its constants: 3 and 3 share a register, 3 and 5 do not.
    auto affine = [](uint32_t times, uint32_t plus) {
        return kernel("affine", [=](Builder &b) {
            auto out = b.inout<uint32_t>();
            auto i = b.localIndex();
            out[i] = out[i] * times + plus;
        });
    };
    const Kernel threeThree = affine(3, 3), threeFive = affine(3, 5);
    Launch launch;
    launch.buffers = {std::vector<uint32_t>(8, 1u)};
    launch.scalars = {3u};
    launch.block[0] = 8;
    std::vector<uint32_t> want(8, 1u);
    for (int round = 0; round < 3; ++round) {
        run(add, launch);
        run(scale, launch);
        run(threeThree, launch);
        run(threeFive, launch);
        for (uint32_t l = 0; l < launch.block[0]; ++l)
            want[l] = ((want[l] + 1) * 3 * 3 + 3) * 3 + 5;
        launch.block[0] = round == 0 ? 4 : 8; // and a different block shape
    }
    CHECK(launch.buffers[0] == want);
}

TEST_CASE("the interpreter does nothing without a module or with a 1.1-sized context") {
    const Kernel k = kernel("fill", [](Builder &b) {
        auto out = b.output<uint32_t>();
        out[b.localIndex()] = 1u;
    });
    std::vector<uint32_t> out(4, kUntouched);
    void *pointers[] = {out.data()};
    const uint64_t sizes[] = {16};
    bp_host_kernel_context c{};
    c.struct_size = sizeof c;
    c.grid[0] = c.grid[1] = c.grid[2] = 1;
    c.block[0] = 4;
    c.block[1] = c.block[2] = 1;
    c.buffers = pointers;
    c.buffer_sizes = sizes;
    c.buffer_count = 1;
    ir::interpretWorkgroup(nullptr);
    ir::interpretWorkgroup(&c); // user_data NULL
    c.user_data = &k.module();
    c.struct_size = offsetof(bp_host_kernel_context, user_data); // a 1.1 plugin's context
    ir::interpretWorkgroup(&c);
    c.struct_size = sizeof c;
    c.block[0] = 0; // an empty workgroup
    ir::interpretWorkgroup(&c);
    c.buffer_count = 0; // no buffers at all: stores dropped
    c.block[0] = 4;
    ir::interpretWorkgroup(&c);
    CHECK(out == std::vector<uint32_t>(4, kUntouched));
    c.buffer_count = 1;
    ir::interpretWorkgroup(&c);
    CHECK(out == std::vector<uint32_t>(4, 1u));
}

TEST_CASE("a malformed module is not run") {
    // Hand-built IR that the recorder never makes: an operand out of range, a block cycle.
    ir::Module bad;
    bad.name = "bad";
    bad.bindings.push_back({Type::U32, ir::Access::Write, false});
    bad.blocks.resize(1);
    ir::Node index;
    index.op = ir::Op::Constant;
    ir::Node value;
    value.op = ir::Op::Add;
    value.a = 0;
    value.b = 99; // no such node
    bad.nodes = {index, value};
    ir::Stmt let;
    let.kind = ir::StmtKind::Let;
    let.node = 1;
    ir::Stmt store;
    store.kind = ir::StmtKind::Store;
    store.space = ir::Space::Buffer;
    store.index = 0;
    store.value = 0;
    bad.blocks[0].stmts = {store, let};

    std::vector<uint32_t> out(1, kUntouched);
    void *pointers[] = {out.data()};
    const uint64_t sizes[] = {4};
    bp_host_kernel_context c{};
    c.struct_size = sizeof c;
    c.grid[0] = c.grid[1] = c.grid[2] = 1;
    c.block[0] = c.block[1] = c.block[2] = 1;
    c.buffers = pointers;
    c.buffer_sizes = sizes;
    c.buffer_count = 1;
    c.user_data = &bad;
    ir::interpretWorkgroup(&c);
    CHECK(out[0] == kUntouched); // the valid store before the bad node did not run either

    ir::Stmt loop;
    loop.kind = ir::StmtKind::If;
    loop.node = 0;
    loop.body = 0; // the kernel body inside itself
    bad.blocks[0].stmts = {store, loop};
    ir::interpretWorkgroup(&c);
    CHECK(out[0] == kUntouched);

    bad.blocks[0].stmts = {store};
    ir::interpretWorkgroup(&c);
    CHECK(out[0] == 0u); // the same module, repaired, runs
}
