// Element types on the device: conversions to and from fp32, usable from templates.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace attn {

__host__ __device__ inline float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__host__ __device__ inline float to_float(__half x) { return __half2float(x); }
__host__ __device__ inline float to_float(float x) { return x; }

template <typename T>
__host__ __device__ inline T from_float(float x);
template <>
__host__ __device__ inline __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16(x); }
template <>
__host__ __device__ inline __half from_float<__half>(float x) { return __float2half(x); }
template <>
__host__ __device__ inline float from_float<float>(float x) { return x; }

}  // namespace attn
