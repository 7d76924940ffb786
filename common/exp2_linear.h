// The FP8 softmax's 2^x on the integer ALU (exp2_e4m3_linear in device_math.cuh) as plain
// arithmetic: its constants, with no CUDA headers, so that the CPU tests check the same
// numbers the kernels use (tests/test_cpu.cpp, Exp2Linear).
//
// For x = i + f (0 <= f < 1) the line through 2^i and 2^(i+1), 2^i (1 + f) (Schraudolph
// 1999), is up to 6.1 % above 2^x. Taken at x - kExp2LinearShift, the error is -3.9 % ..
// +2.0 %, zero on average over f (RMS 1.8 %), so that entries taken this way carry no weight
// bias against the MUFU's (tests/fp8_model.h has the line as a float, exp2_linear_host, and
// the CPU test bounds it).
#pragma once

namespace attn {

constexpr float kExp2LinearShift = 0.0575f;

// That line straight to an e4m3 byte (1 sign, 4 exponent bits with bias 7, 3 mantissa
// bits): for x = i + f the e4m3 byte 8 (i + 7) + 8 f is 2^i (1 + f), so the byte of
// 2^(x - shift) rounded to e4m3 is round(8 (x - shift) + 56), an integer an FFMA can round:
// with the magic 1.5 * 2^23 (ulp 1) added, z = magic + round(...) and the byte is z's low 8
// bits, with no conversion. The caller forms z = s * (8 s_log2) + e4m3_linear_offset(c) for
// x = s s_log2 + c and clamps z at the magic (byte 0: P = 0). The addend must be an exact
// integer, which takes 8 (c - shift) integer: the caller keeps m_i, c's varying part, on a
// grid of 1/8 (e4m3_linear_grid). The byte is then what the line as a float rounds to as an
// e4m3 normal number (2^(x - shift) >= 2^-6, x >= -5.94; one rounding where the float took
// two, so the two may differ next to a tie); below, the byte is a subnormal's (multiples of
// 2^-9), down to 0 at x < -6.94, where the float line rounds to e4m3 multiples of 2^-9 down
// to 2^-10.
constexpr float kE4m3LinearMagic = 12582912.f;  // 1.5 * 2^23
constexpr float kE4m3LinearStep = 8.f;          // e4m3 bytes per unit of x, at any power of two
constexpr float e4m3_linear_offset(float c) {
  return kE4m3LinearMagic + (56.f + kE4m3LinearStep * (c - kExp2LinearShift));
}

}  // namespace attn
