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

// 2^x to within 4 % on the integer ALU, for a value about to be rounded to e4m3 (3 mantissa
// bits: a step of 6-12 %): z = x + exp2_linear_offset(0), clamped, and a shift and an add
// of its bits (common/exp2_linear.h explains the constants). Three instructions (FFMA,
// FMNMX, LEA) where the MUFU's 2^x is two (FFMA, MUFU.EX2), none of them the MUFU's.
__device__ inline float exp2_linear(float z) {
  return __uint_as_float(exp2_linear_bits(__float_as_uint(fmaxf(z, kExp2LinearFloor))));
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
