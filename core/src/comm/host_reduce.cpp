// Host reductions for the staged collective path.
#include "comm/host_reduce.hpp"

#include <backplane/error.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <type_traits>

namespace backplane::detail {

float halfToFloat(uint16_t h) noexcept {
    const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
    const uint32_t exponent = (h >> 10) & 0x1fu;
    uint32_t mantissa = h & 0x3ffu;
    uint32_t bits;
    if (exponent == 0) {
        if (mantissa == 0) {
            bits = sign;
        } else { // subnormal: normalise
            int e = -1;
            do {
                ++e;
                mantissa <<= 1;
            } while ((mantissa & 0x400u) == 0);
            bits = sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (mantissa & 0x3ffu) << 13;
        }
    } else if (exponent == 0x1f) {
        bits = sign | 0x7f800000u | mantissa << 13;
    } else {
        bits = sign | (exponent + 127 - 15) << 23 | mantissa << 13;
    }
    return std::bit_cast<float>(bits);
}

uint16_t floatToHalf(float f) noexcept {
    const uint32_t bits = std::bit_cast<uint32_t>(f);
    const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
    const uint32_t abs = bits & 0x7fffffffu;
    if (abs >= 0x7f800000u) // inf or NaN
        return static_cast<uint16_t>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u));
    if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u); // rounds past max
    if (abs < 0x38800000u) { // subnormal or zero in half
        if (abs < 0x33000000u) return sign; // below half the smallest subnormal
        const uint32_t mantissa = (abs & 0x7fffffu) | 0x800000u;
        const int shift = 126 - static_cast<int>(abs >> 23); // 14..24
        const uint32_t rounded = mantissa >> shift;
        const uint32_t rest = mantissa & ((1u << shift) - 1);
        const uint32_t half = 1u << (shift - 1);
        uint32_t result = rounded;
        if (rest > half || (rest == half && (rounded & 1u) != 0)) ++result;
        return static_cast<uint16_t>(sign | result);
    }
    uint32_t value = abs - 0x38000000u; // rebias 127 -> 15
    const uint32_t rest = value & 0x1fffu;
    value >>= 13;
    if (rest > 0x1000u || (rest == 0x1000u && (value & 1u) != 0)) ++value;
    return static_cast<uint16_t>(sign | value);
}

float bf16ToFloat(uint16_t b) noexcept {
    return std::bit_cast<float>(static_cast<uint32_t>(b) << 16);
}

uint16_t floatToBf16(float f) noexcept {
    const uint32_t bits = std::bit_cast<uint32_t>(f);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);
    const uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
    return static_cast<uint16_t>((bits + rounding) >> 16);
}

namespace {

template <class T> T combine(T a, T b, ReduceOp op) {
    if constexpr (std::is_integral_v<T>) {
        using U = std::make_unsigned_t<T>;
        switch (op) {
        case ReduceOp::Sum:
        case ReduceOp::Avg: return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
        case ReduceOp::Prod:
            // Unsigned arithmetic wraps; promote small types past int to avoid signed overflow.
            return static_cast<T>(static_cast<uint64_t>(static_cast<U>(a)) *
                                  static_cast<uint64_t>(static_cast<U>(b)));
        case ReduceOp::Min: return std::min(a, b);
        case ReduceOp::Max: return std::max(a, b);
        }
    } else {
        switch (op) {
        case ReduceOp::Sum:
        case ReduceOp::Avg: return a + b;
        case ReduceOp::Prod: return a * b;
        case ReduceOp::Min: return std::fmin(a, b);
        case ReduceOp::Max: return std::fmax(a, b);
        }
    }
    return a;
}

template <class T> void reduceTyped(std::byte *acc, const std::byte *other, size_t n, ReduceOp op) {
    for (size_t i = 0; i < n; ++i) {
        T a, b;
        std::memcpy(&a, acc + i * sizeof(T), sizeof(T));
        std::memcpy(&b, other + i * sizeof(T), sizeof(T));
        a = combine(a, b, op);
        std::memcpy(acc + i * sizeof(T), &a, sizeof(T));
    }
}

template <float (*ToFloat)(uint16_t), uint16_t (*FromFloat)(float)>
void reduceHalf(std::byte *acc, const std::byte *other, size_t n, ReduceOp op) {
    for (size_t i = 0; i < n; ++i) {
        uint16_t a, b;
        std::memcpy(&a, acc + i * 2, 2);
        std::memcpy(&b, other + i * 2, 2);
        a = FromFloat(combine(ToFloat(a), ToFloat(b), op));
        std::memcpy(acc + i * 2, &a, 2);
    }
}

template <class T> void divideTyped(std::byte *values, size_t n, uint32_t by) {
    for (size_t i = 0; i < n; ++i) {
        T v;
        std::memcpy(&v, values + i * sizeof(T), sizeof(T));
        if constexpr (std::is_integral_v<T> && std::is_signed_v<T>)
            v = static_cast<T>(static_cast<int64_t>(v) / static_cast<int64_t>(by));
        else if constexpr (std::is_integral_v<T>)
            v = static_cast<T>(static_cast<uint64_t>(v) / by);
        else
            v = static_cast<T>(v / static_cast<T>(by));
        std::memcpy(values + i * sizeof(T), &v, sizeof(T));
    }
}

template <float (*ToFloat)(uint16_t), uint16_t (*FromFloat)(float)>
void divideHalf(std::byte *values, size_t n, uint32_t by) {
    for (size_t i = 0; i < n; ++i) {
        uint16_t v;
        std::memcpy(&v, values + i * 2, 2);
        v = FromFloat(ToFloat(v) / static_cast<float>(by));
        std::memcpy(values + i * 2, &v, 2);
    }
}

} // namespace

void reduceInto(std::vector<std::byte> &acc, const std::vector<std::byte> &other, DataType type,
                ReduceOp op) {
    if (acc.size() != other.size())
        throw Error(ErrorCode::Internal, "reduceInto: operands of different sizes");
    const size_t n = acc.size() / sizeOf(type);
    std::byte *a = acc.data();
    const std::byte *b = other.data();
    switch (type) {
    case DataType::I8: return reduceTyped<int8_t>(a, b, n, op);
    case DataType::U8: return reduceTyped<uint8_t>(a, b, n, op);
    case DataType::I32: return reduceTyped<int32_t>(a, b, n, op);
    case DataType::U32: return reduceTyped<uint32_t>(a, b, n, op);
    case DataType::I64: return reduceTyped<int64_t>(a, b, n, op);
    case DataType::U64: return reduceTyped<uint64_t>(a, b, n, op);
    case DataType::F16: return reduceHalf<halfToFloat, floatToHalf>(a, b, n, op);
    case DataType::BF16: return reduceHalf<bf16ToFloat, floatToBf16>(a, b, n, op);
    case DataType::F32: return reduceTyped<float>(a, b, n, op);
    case DataType::F64: return reduceTyped<double>(a, b, n, op);
    }
}

void divideBy(std::vector<std::byte> &values, DataType type, uint32_t by) {
    const size_t n = values.size() / sizeOf(type);
    std::byte *v = values.data();
    switch (type) {
    case DataType::I8: return divideTyped<int8_t>(v, n, by);
    case DataType::U8: return divideTyped<uint8_t>(v, n, by);
    case DataType::I32: return divideTyped<int32_t>(v, n, by);
    case DataType::U32: return divideTyped<uint32_t>(v, n, by);
    case DataType::I64: return divideTyped<int64_t>(v, n, by);
    case DataType::U64: return divideTyped<uint64_t>(v, n, by);
    case DataType::F16: return divideHalf<halfToFloat, floatToHalf>(v, n, by);
    case DataType::BF16: return divideHalf<bf16ToFloat, floatToBf16>(v, n, by);
    case DataType::F32: return divideTyped<float>(v, n, by);
    case DataType::F64: return divideTyped<double>(v, n, by);
    }
}

} // namespace backplane::detail
