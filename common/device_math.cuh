// Device helpers more than one rung uses: warp-group reductions, the fast 2^x, and packing
// two fp32 values into one register of 16-bit elements.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "common/exp2_linear.h"

namespace attn {

// Max / sum over aligned groups of `Lanes` consecutive lanes (a butterfly: every lane of the
// group ends with the result). Lanes = 32: the whole warp.
template <int Lanes = 32>
__device__ inline float group_max(float x) {
#pragma unroll
  for (int offset = Lanes / 2; offset > 0; offset /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  return x;
}

template <int Lanes = 32>
__device__ inline float group_sum(float x) {
#pragma unroll
  for (int offset = Lanes / 2; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

// 2^x on the special-function unit, one MUFU.EX2 (softmax works in base 2:
// exp(x) = 2^(x log2 e)). Plain exp2f adds a range fix-up for results below 2^-126, which
// a softmax weight that small does not need: it flushes to 0.
__device__ inline float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// 2^x straight to its e4m3 byte (common/exp2_linear.h): z = fma(s, 8 s_log2,
// e4m3_linear_offset(c)) clamped at the magic, the byte in its low 8 bits. Two instructions
// (FFMA, FMNMX), and the byte needs no conversion (the line as a float needed a LEA and F2FP).
__device__ inline float exp2_e4m3_linear(float z) { return fmaxf(z, kE4m3LinearMagic); }

// The m' nearest m with 8 (m' + shift) an integer, so that e4m3_linear_offset(p - m') is an
// exact integer for an integer p: round to nearest by the magic (four FMA-pipe
// instructions; -inf stays -inf). A grid point maps to itself, and m' is within 1/16 of m
// (below it, a row's largest P is up to 2^(8 + 1/16) < 448 with FP8's offset of 2^8).
__device__ inline float e4m3_linear_grid(float m) {
  const float k = fmaf(m + kExp2LinearShift, kE4m3LinearStep, kE4m3LinearMagic) - kE4m3LinearMagic;
  return fmaf(k, 1.f / kE4m3LinearStep, -kExp2LinearShift);
}

// log2(x) on the special-function unit, one MUFU.LG2 (log2(0) = -inf).
__device__ inline float log2_approx(float x) {
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Two fp32 values -> one register of two bf16 / fp16, lo in the low half (the lower column
// index, as mma and wgmma fragments expect).
template <typename T>
__device__ inline uint32_t pack2(float lo, float hi);
template <>
__device__ inline uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}
template <>
__device__ inline uint32_t pack2<__half>(float lo, float hi) {
  __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

}  // namespace attn
