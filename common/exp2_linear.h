// The FP8 softmax's 2^x on the integer ALU (exp2_linear in device_math.cuh) as plain
// arithmetic: its constants and its bit step, with no CUDA headers, so that the CPU tests
// check the same numbers the kernels use (tests/test_cpu.cpp, Exp2Linear).
//
// For x = i + f (0 <= f < 1) the float whose bits are 2^23 (x + 127) is 2^i (1 + f), the
// line through 2^i and 2^(i+1) (Schraudolph 1999): up to 6.1 % high. Taken at
// x - kExp2LinearShift, the error is -3.9 % .. +2.0 %, zero on average over f (RMS 1.8 %),
// so that entries taken this way carry no weight bias against the MUFU's.
//
// The caller forms z = x + exp2_linear_offset(0) (as its FFMA's addend: 2^(a b + c) is
// exp2_linear(fma(a, b, exp2_linear_offset(c)))) and clamps it at kExp2LinearFloor. The magic
// 1.5 * 2^10 has an ulp of 2^-13, so z's mantissa field is 2^22 + 2^13 x, and shifted left by
// 10 (2^22 falls off the top) it is 2^23 x; adding 127 << 23 gives 2^23 (x + 127). At the
// floor (x = -127), and so at a masked key's -inf, the result is +0; between -127 and -125
// it may be subnormal and less accurate (an e4m3 P is 0 there anyway).
#pragma once

#include <cstdint>

namespace attn {

constexpr float kExp2LinearMagic = 1536.f;
constexpr float kExp2LinearShift = 0.0575f;
constexpr float kExp2LinearFloor = kExp2LinearMagic - 127.f;  // z at x = -127

constexpr float exp2_linear_offset(float c) { return c - kExp2LinearShift + kExp2LinearMagic; }

// The bits of the clamped z -> the bits of 2^x.
constexpr uint32_t exp2_linear_bits(uint32_t z_bits) { return (z_bits << 10) + (127u << 23); }

}  // namespace attn
