// The host plugin's element-wise reductions and 16-bit float conversions (plugin internals:
// compiled from plugins/host/gloo/reduce_ops.cpp).
#include "reduce_ops.hpp"

#include <backplane/abi/plugin.h>

#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

using namespace backplane::host;

namespace {

uint16_t compilerHalf(float value) {
    const auto half = static_cast<_Float16>(value); // GCC's correctly rounded conversion
    uint16_t bits;
    std::memcpy(&bits, &half, 2);
    return bits;
}

/// The value of bfloat16 (float) bits as a double; infinity counts as 2^128, the next power of
/// two, as IEEE rounding does (a value at least half an ulp above the largest finite rounds up).
double boundaryValue(uint32_t floatBits) {
    if ((floatBits & 0x7fffffffu) == 0x7f800000u)
        return (floatBits >> 31) != 0 ? -std::ldexp(1.0, 128) : std::ldexp(1.0, 128);
    return std::bit_cast<float>(floatBits);
}

/// Nearest bfloat16 by comparing both neighbours (ties to even): independent of the bit trick.
uint16_t nearestBfloat16(float value) {
    const uint32_t bits = std::bit_cast<uint32_t>(value);
    const uint32_t down = bits & 0xffff0000u;
    const uint32_t up = down + 0x10000u;
    const double below = std::fabs(static_cast<double>(value) - boundaryValue(down));
    const double above = std::fabs(boundaryValue(up) - value);
    if (below != above) return static_cast<uint16_t>((below < above ? down : up) >> 16);
    return static_cast<uint16_t>((((down >> 16) & 1u) == 0 ? down : up) >> 16);
}

template <class T> T reduceOne(uint32_t type, uint32_t op, T a, T b) {
    T out{};
    reduceFunction(type, op)(&out, &a, &b, 1);
    return out;
}

} // namespace

TEST_CASE("every half value converts to float and back unchanged") {
    for (uint32_t bits = 0; bits < 0x10000; ++bits) {
        const float value = halfToFloat(static_cast<uint16_t>(bits));
        _Float16 reference;
        const auto h = static_cast<uint16_t>(bits);
        std::memcpy(&reference, &h, 2);
        if (std::isnan(value)) {
            CHECK(std::isnan(static_cast<float>(reference)));
            CHECK((floatToHalf(value) & 0x7c00u) == 0x7c00u);
            CHECK((floatToHalf(value) & 0x3ffu) != 0);
            continue;
        }
        CHECK(value == static_cast<float>(reference));
        CHECK(floatToHalf(value) == bits);
    }
}

TEST_CASE("float to half rounds to nearest even like the compiler, subnormals and overflow too") {
    std::vector<float> values = {0.0f,
                                 -0.0f,
                                 1.0f,
                                 65504.0f,
                                 65519.99f,
                                 65520.0f,
                                 -65520.0f,
                                 1e-8f,
                                 2.98e-8f,
                                 2.9802322e-8f /* 2^-25 */,
                                 3.0e-8f,
                                 6.0e-8f,
                                 6.1035156e-5f /* 2^-14 */,
                                 6.09e-5f,
                                 1.0009765625f /* tie */,
                                 1.00146484375f /* tie */,
                                 INFINITY,
                                 -INFINITY,
                                 1e10f};
    std::mt19937 random(13);
    for (int i = 0; i < 200000; ++i) {
        // Random bit patterns near half's range: exponents 2^-26 .. 2^17.
        const uint32_t exponent = 101 + random() % 43;
        const uint32_t bits = (random() & 0x80000000u) | (exponent << 23) | (random() & 0x7fffffu);
        values.push_back(std::bit_cast<float>(bits));
    }
    for (const float v : values) {
        CAPTURE(v);
        CHECK(floatToHalf(v) == compilerHalf(v));
    }
}

TEST_CASE("float to bfloat16 rounds to nearest even and keeps NaN a NaN") {
    std::mt19937 random(7);
    for (int i = 0; i < 200000; ++i) {
        const float v = std::bit_cast<float>(static_cast<uint32_t>(random()));
        if (std::isnan(v)) {
            CHECK(std::isnan(bfloat16ToFloat(floatToBfloat16(v))));
            continue;
        }
        if (std::isinf(v)) continue;
        CAPTURE(v);
        const uint16_t expected = nearestBfloat16(v);
        CHECK(floatToBfloat16(v) == expected);
    }
    CHECK(floatToBfloat16(std::bit_cast<float>(0x3f808000u)) == 0x3f80); // tie, even: down
    CHECK(floatToBfloat16(std::bit_cast<float>(0x3f818000u)) == 0x3f82); // tie, odd: up
    CHECK(std::isnan(bfloat16ToFloat(floatToBfloat16(std::bit_cast<float>(0x7f800001u)))));
}

TEST_CASE("integer reductions wrap around and averages truncate toward zero") {
    CHECK(reduceOne<int8_t>(BP_DATA_I8, BP_REDUCE_SUM, 127, 1) == -128);
    CHECK(reduceOne<uint8_t>(BP_DATA_U8, BP_REDUCE_PROD, 16, 16) == 0);
    CHECK(reduceOne<int32_t>(BP_DATA_I32, BP_REDUCE_PROD, INT32_MAX, 2) == -2);
    CHECK(reduceOne<int64_t>(BP_DATA_I64, BP_REDUCE_MIN, -5, 3) == -5);
    CHECK(reduceOne<uint64_t>(BP_DATA_U64, BP_REDUCE_MAX, UINT64_MAX, 3) == UINT64_MAX);
    int8_t values[] = {-7, 7, -1, 9};
    divideElements(values, 4, BP_DATA_I8, 4);
    CHECK(values[0] == -1);
    CHECK(values[1] == 1);
    CHECK(values[2] == 0);
    CHECK(values[3] == 2);
}

TEST_CASE("16-bit float reductions round once per operation, in place too") {
    const uint16_t one = floatToHalf(1.0f);
    const uint16_t tiny = floatToHalf(0.00048828125f); // 2^-11: half of one's ulp
    CHECK(reduceOne<uint16_t>(BP_DATA_F16, BP_REDUCE_SUM, one, tiny) == one); // tie to even
    std::vector<uint16_t> a = {floatToBfloat16(3.0f), floatToBfloat16(-2.0f)};
    const std::vector<uint16_t> b = {floatToBfloat16(5.0f), floatToBfloat16(7.0f)};
    reduceFunction(BP_DATA_BF16, BP_REDUCE_PROD)(a.data(), a.data(), b.data(), 2); // out == a
    CHECK(bfloat16ToFloat(a[0]) == 15.0f);
    CHECK(bfloat16ToFloat(a[1]) == -14.0f);
    uint16_t seven = floatToHalf(7.0f);
    divideElements(&seven, 1, BP_DATA_F16, 3);
    CHECK(seven == compilerHalf(7.0f / 3.0f));
    float unaligned[3] = {};
    unsigned char bytes[13] = {};
    const float x = 1.5f;
    const float y = 2.25f;
    std::memcpy(bytes + 1, &x, 4);
    std::memcpy(bytes + 5, &y, 4);
    reduceFunction(BP_DATA_F32, BP_REDUCE_SUM)(bytes + 9, bytes + 1, bytes + 5, 1);
    std::memcpy(&unaligned[0], bytes + 9, 4);
    CHECK(unaligned[0] == 3.75f);
}
