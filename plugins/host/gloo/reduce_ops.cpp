// Element-wise reductions of the host plugin's collectives.
#include "reduce_ops.hpp"

#include <backplane/abi/plugin.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <type_traits>

namespace backplane::host {

float halfToFloat(uint16_t bits) noexcept {
    const uint32_t sign = uint32_t{bits & 0x8000u} << 16;
    const uint32_t exponent = (bits >> 10) & 0x1fu;
    const uint32_t mantissa = bits & 0x3ffu;
    if (exponent == 0) { // zero or subnormal: mantissa * 2^-24, exact in float
        const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
        return sign != 0 ? -magnitude : magnitude;
    }
    if (exponent == 31) return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
    return std::bit_cast<float>(sign | ((exponent - 15 + 127) << 23) | (mantissa << 13));
}

uint16_t floatToHalf(float value) noexcept {
    const uint32_t bits = std::bit_cast<uint32_t>(value);
    const auto sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
    const uint32_t magnitude = bits & 0x7fffffffu;
    if (magnitude > 0x7f800000u) // NaN: quiet, keeping the payload's top bits
        return static_cast<uint16_t>(sign | 0x7e00u | ((magnitude >> 13) & 0x3ffu));
    // 65520 is halfway between the largest half (65504) and the next power: ties go to even, inf.
    if (magnitude >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);
    if (magnitude >= 0x38800000u) { // normal in half precision (>= 2^-14)
        const uint32_t exponent = (magnitude >> 23) - 127 + 15;
        uint32_t half = (exponent << 10) | ((magnitude & 0x7fffffu) >> 13);
        const uint32_t rest = magnitude & 0x1fffu;
        if (rest > 0x1000u || (rest == 0x1000u && (half & 1u) != 0)) ++half; // may carry: fine
        return static_cast<uint16_t>(sign | half);
    }
    if (magnitude <= 0x33000000u) return sign; // <= 2^-25: half of the smallest subnormal, tie->0
    // Subnormal: the value in units of 2^-24 is mantissa * 2^(exponent - 126).
    const uint32_t exponent = magnitude >> 23;
    const uint32_t mantissa = (magnitude & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - exponent; // 14..24
    uint32_t half = mantissa >> shift;
    const uint32_t rest = mantissa & ((1u << shift) - 1);
    const uint32_t halfway = 1u << (shift - 1);
    if (rest > halfway || (rest == halfway && (half & 1u) != 0)) ++half;
    return static_cast<uint16_t>(sign | half);
}

float bfloat16ToFloat(uint16_t bits) noexcept {
    return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16);
}

uint16_t floatToBfloat16(float value) noexcept {
    const uint32_t bits = std::bit_cast<uint32_t>(value);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x0040u);
    // Round to nearest even; a carry into the exponent is the right result (up to infinity).
    return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

namespace {

// How one element type is stored and computed with. Integer arithmetic runs on the unsigned type
// of the same width, so sums and products wrap instead of overflowing (undefined for signed).
template <class T> struct IntegerElement {
    using Storage = T;
    using Value = T;
    static Value load(Storage s) noexcept { return s; }
    static Storage store(Value v) noexcept { return v; }
    static Value add(Value a, Value b) noexcept {
        using U = std::make_unsigned_t<T>;
        return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
    }
    static Value multiply(Value a, Value b) noexcept {
        using U = std::make_unsigned_t<T>;
        // Promote to at least unsigned int: uint8_t * uint8_t would multiply as (signed) int.
        using Wide = std::conditional_t<(sizeof(U) < sizeof(unsigned)), unsigned, U>;
        return static_cast<T>(static_cast<U>(static_cast<Wide>(static_cast<U>(a)) *
                                             static_cast<Wide>(static_cast<U>(b))));
    }
};

template <class T> struct FloatElement {
    using Storage = T;
    using Value = T;
    static Value load(Storage s) noexcept { return s; }
    static Storage store(Value v) noexcept { return v; }
    static Value add(Value a, Value b) noexcept { return a + b; }
    static Value multiply(Value a, Value b) noexcept { return a * b; }
};

// 16-bit floats: computed in float, rounded once per operation (float's 24 bits are more than
// twice the 11 (8) of half (bfloat16) plus 2, so the double rounding of +, *, / is exact).
template <float (*Load)(uint16_t), uint16_t (*Store)(float)> struct Float16Element {
    using Storage = uint16_t;
    using Value = float;
    static Value load(Storage s) noexcept { return Load(s); }
    static Storage store(Value v) noexcept { return Store(v); }
    static Value add(Value a, Value b) noexcept { return a + b; }
    static Value multiply(Value a, Value b) noexcept { return a * b; }
};
using HalfElement = Float16Element<halfToFloat, floatToHalf>;
using Bfloat16Element = Float16Element<bfloat16ToFloat, floatToBfloat16>;

struct Sum {
    template <class E> static typename E::Value apply(typename E::Value a, typename E::Value b) {
        return E::add(a, b);
    }
};
struct Product {
    template <class E> static typename E::Value apply(typename E::Value a, typename E::Value b) {
        return E::multiply(a, b);
    }
};
struct Minimum {
    template <class E> static typename E::Value apply(typename E::Value a, typename E::Value b) {
        if constexpr (std::is_floating_point_v<typename E::Value>)
            return std::fmin(a, b);
        else
            return std::min(a, b);
    }
};
struct Maximum {
    template <class E> static typename E::Value apply(typename E::Value a, typename E::Value b) {
        if constexpr (std::is_floating_point_v<typename E::Value>)
            return std::fmax(a, b);
        else
            return std::max(a, b);
    }
};

// Elements are read and written with memcpy: a collective's offsets need not be aligned.
template <class E, class Op> void reduce(void *out, const void *a, const void *b, size_t count) {
    using S = typename E::Storage;
    auto *o = static_cast<unsigned char *>(out);
    const auto *x = static_cast<const unsigned char *>(a);
    const auto *y = static_cast<const unsigned char *>(b);
    for (size_t i = 0; i < count; ++i) {
        S first;
        S second;
        std::memcpy(&first, x + i * sizeof(S), sizeof(S));
        std::memcpy(&second, y + i * sizeof(S), sizeof(S));
        const S result = E::store(Op::template apply<E>(E::load(first), E::load(second)));
        std::memcpy(o + i * sizeof(S), &result, sizeof(S));
    }
}

template <class E> ReduceFunction forOp(uint32_t op) noexcept {
    switch (op) {
    case BP_REDUCE_SUM:
    case BP_REDUCE_AVG:
        return reduce<E, Sum>;
    case BP_REDUCE_PROD:
        return reduce<E, Product>;
    case BP_REDUCE_MIN:
        return reduce<E, Minimum>;
    case BP_REDUCE_MAX:
        return reduce<E, Maximum>;
    default:
        return nullptr;
    }
}

template <class E> void divide(void *data, size_t count, uint32_t divisor) noexcept {
    using S = typename E::Storage;
    using V = typename E::Value;
    auto *bytes = static_cast<unsigned char *>(data);
    const auto by = static_cast<V>(divisor);
    for (size_t i = 0; i < count; ++i) {
        S element;
        std::memcpy(&element, bytes + i * sizeof(S), sizeof(S));
        element = E::store(static_cast<V>(E::load(element) / by));
        std::memcpy(bytes + i * sizeof(S), &element, sizeof(S));
    }
}

} // namespace

ReduceFunction reduceFunction(uint32_t type, uint32_t op) noexcept {
    switch (type) {
    case BP_DATA_I8:
        return forOp<IntegerElement<int8_t>>(op);
    case BP_DATA_U8:
        return forOp<IntegerElement<uint8_t>>(op);
    case BP_DATA_I32:
        return forOp<IntegerElement<int32_t>>(op);
    case BP_DATA_U32:
        return forOp<IntegerElement<uint32_t>>(op);
    case BP_DATA_I64:
        return forOp<IntegerElement<int64_t>>(op);
    case BP_DATA_U64:
        return forOp<IntegerElement<uint64_t>>(op);
    case BP_DATA_F16:
        return forOp<HalfElement>(op);
    case BP_DATA_BF16:
        return forOp<Bfloat16Element>(op);
    case BP_DATA_F32:
        return forOp<FloatElement<float>>(op);
    case BP_DATA_F64:
        return forOp<FloatElement<double>>(op);
    default:
        return nullptr;
    }
}

void divideElements(void *data, size_t count, uint32_t type, uint32_t divisor) noexcept {
    switch (type) {
    case BP_DATA_I8:
        return divide<IntegerElement<int8_t>>(data, count, divisor);
    case BP_DATA_U8:
        return divide<IntegerElement<uint8_t>>(data, count, divisor);
    case BP_DATA_I32:
        return divide<IntegerElement<int32_t>>(data, count, divisor);
    case BP_DATA_U32:
        return divide<IntegerElement<uint32_t>>(data, count, divisor);
    case BP_DATA_I64:
        return divide<IntegerElement<int64_t>>(data, count, divisor);
    case BP_DATA_U64:
        return divide<IntegerElement<uint64_t>>(data, count, divisor);
    case BP_DATA_F16:
        return divide<HalfElement>(data, count, divisor);
    case BP_DATA_BF16:
        return divide<Bfloat16Element>(data, count, divisor);
    case BP_DATA_F32:
        return divide<FloatElement<float>>(data, count, divisor);
    case BP_DATA_F64:
        return divide<FloatElement<double>>(data, count, divisor);
    default:
        return;
    }
}

} // namespace backplane::host
