// Reductions of collective elements in host memory, for the staged path.
#pragma once

#include <backplane/communicator.hpp>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace backplane::detail {

/// acc[i] = acc[i] (op) other[i] for every element of `type` (acc and other of equal size).
/// Integers wrap (two's complement) on overflow; f16 and bf16 reduce in float and round to
/// nearest even. Avg is not a reduction here: reduce with Sum, then divideBy.
void reduceInto(std::vector<std::byte> &acc, const std::vector<std::byte> &other, DataType type,
                ReduceOp op);
/// Every element divided by `n` (integers truncate toward zero).
void divideBy(std::vector<std::byte> &values, DataType type, uint32_t n);

/// IEEE half and bfloat16 conversions (round to nearest even; NaN stays NaN).
float halfToFloat(uint16_t h) noexcept;
uint16_t floatToHalf(float f) noexcept;
float bf16ToFloat(uint16_t b) noexcept;
uint16_t floatToBf16(float f) noexcept;

} // namespace backplane::detail
