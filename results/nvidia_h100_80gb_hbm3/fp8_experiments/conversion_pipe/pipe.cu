// Which pipe does F2FP (fp32 pair -> e4m3x2) use, and at what rate, next to MUFU.EX2?
// One warp per SMSP (128 threads, one CTA per SM); cycles per warp instruction.
#include <cstdio>
#include <cstdint>
constexpr int kIters = 4096;
constexpr int kChains = 16;
__device__ __forceinline__ float ex2(float x) { float y; asm volatile("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x)); return y; }
__device__ __forceinline__ uint32_t cvt8(float a, float b) { uint16_t h; asm volatile("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(h) : "f"(a), "f"(b)); return h; }
__device__ __forceinline__ uint32_t ex2h2(uint32_t x) { uint32_t y; asm volatile("ex2.approx.f16x2 %0, %1;" : "=r"(y) : "r"(x)); return y; }
__device__ __forceinline__ uint32_t cvt8h2(uint32_t x) { uint16_t h; asm volatile("cvt.rn.satfinite.e4m3x2.f16x2 %0, %1;" : "=h"(h) : "r"(x)); return h; }
__device__ __forceinline__ uint32_t cvt16(float a, float b) { uint32_t h; asm volatile("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(h) : "f"(a), "f"(b)); return h; }
template <int kMode>
__global__ void bench(float* out, long long* cyc) {
  float v[kChains];
  uint32_t acc = 0;
  for (int i = 0; i < kChains; ++i) v[i] = 0.001f * (threadIdx.x + i);
  __syncthreads();
  long long t0 = clock64();
  for (int it = 0; it < kIters; ++it) {
#pragma unroll
    for (int i = 0; i < kChains; i += 2) {
      if (kMode == 0) { v[i] = ex2(v[i]); v[i + 1] = ex2(v[i + 1]); }                       // 2 MUFU
      if (kMode == 1) { acc += cvt8(v[i], v[i + 1]); v[i] += 1e-7f; }                        // 1 F2FP e4m3 (+FADD, IADD)
      if (kMode == 2) { v[i] = ex2(v[i]); v[i + 1] = ex2(v[i + 1]); acc += cvt8(v[i], v[i + 1]); }  // 2 MUFU + 1 F2FP
      if (kMode == 3) { acc += cvt16(v[i], v[i + 1]); v[i] += 1e-7f; }                       // 1 F2FP f16
      if (kMode == 4) { v[i] = ex2(v[i]); v[i + 1] = ex2(v[i + 1]); acc += cvt16(v[i], v[i + 1]); }  // 2 MUFU + 1 F2FP f16
      if (kMode == 6) { uint32_t h = __float_as_uint(v[i]); h = ex2h2(h); v[i] = __uint_as_float(h); }  // ex2.approx.f16x2 (2 values)
      if (kMode == 7) { uint32_t h = __float_as_uint(v[i]); h = ex2h2(h); acc += cvt8h2(h); v[i] = __uint_as_float(h); }  // + F2FP e4m3x2 from f16x2
      if (kMode == 5) { v[i] += 1e-7f; v[i + 1] += 1e-7f; }                                   // FADD only (loop overhead)
    }
  }
  long long t1 = clock64();
  float s = 0;
  for (int i = 0; i < kChains; ++i) s += v[i];
  out[blockIdx.x * blockDim.x + threadIdx.x] = s + acc;
  if (threadIdx.x == 0 && blockIdx.x == 0) *cyc = t1 - t0;
}
int main() {
  float* out; long long* cyc; cudaMalloc(&out, 1 << 22); cudaMallocManaged(&cyc, 8);
  const char* names[] = {"2 MUFU.EX2", "1 F2FP e4m3 (+FADD+IADD)", "2 MUFU + 1 F2FP e4m3", "1 F2FP f16 (+FADD+IADD)", "2 MUFU + 1 F2FP f16", "FADD only", "ex2.approx.f16x2 (2 values)", "ex2 f16x2 + F2FP e4m3 from f16x2"};
  void (*k[])(float*, long long*) = {bench<0>, bench<1>, bench<2>, bench<3>, bench<4>, bench<5>, bench<6>, bench<7>};
  for (int w : {4, 8})
    for (int m = 0; m < 8; ++m) {
      k[m]<<<132, 32 * w>>>(out, cyc); cudaDeviceSynchronize();
      k[m]<<<132, 32 * w>>>(out, cyc); cudaDeviceSynchronize();
      double per_group = double(*cyc) / (kIters * (kChains / 2));
      std::printf("warps/SMSP %d  %-28s %6.2f cycles per group of 2 values  (%s)\n", w / 4, names[m], per_group, cudaGetErrorString(cudaGetLastError()));
    }
}
