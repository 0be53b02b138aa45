// Element-wise reductions of the host plugin's collectives, for every bp_data_type and
// bp_reduce_op.
#pragma once

#include <cstddef>
#include <cstdint>

namespace backplane::host {

/// One element-wise reduction as Gloo calls it: out[i] = a[i] op b[i] for `count` elements.
/// `out` may be `a` or `b` (Gloo reduces in place).
using ReduceFunction = void (*)(void *out, const void *a, const void *b, size_t count);

/// The reduction of `op` (a bp_reduce_op value) over elements of `type` (a bp_data_type value);
/// both must be valid (the caller checked them). BP_REDUCE_AVG reduces like BP_REDUCE_SUM: finish
/// it with divideElements. Integer sums and products wrap around, as two's complement; f16 and
/// bf16 are computed in float and rounded to nearest even.
ReduceFunction reduceFunction(uint32_t type, uint32_t op) noexcept;

/// Divides `count` elements of `type` in place by `divisor` (> 0), the last step of AVG:
/// integers truncate toward zero, floating-point types round to nearest even.
void divideElements(void *data, size_t count, uint32_t type, uint32_t divisor) noexcept;

/// IEEE 754 binary16 <-> binary32. floatToHalf rounds to nearest even; NaN stays NaN (quiet).
float halfToFloat(uint16_t bits) noexcept;
uint16_t floatToHalf(float value) noexcept;

/// bfloat16 <-> binary32. floatToBfloat16 rounds to nearest even; NaN stays NaN (quiet).
float bfloat16ToFloat(uint16_t bits) noexcept;
uint16_t floatToBfloat16(float value) noexcept;

} // namespace backplane::host
