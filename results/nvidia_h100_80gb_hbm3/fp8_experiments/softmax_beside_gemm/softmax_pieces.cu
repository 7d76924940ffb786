// Pieces of the FP8 d = 128 softmax, in a loop on registers: cycles per block per warp.
#include <cstdio>
#include "06_fa3_hopper/fa3_fp8_kernel.cuh"
using namespace attn::fa3;
using namespace attn;
using Cfg = Fp8Config<128>;
constexpr int kIters = 256;
// MODE bits: 1 max, 2 exps, 4 row sums, 8 to_operand, 16 rescale O
template <int MODE>
__global__ void k(float* out, long long* cyc, float seed) {
  float S[Cfg::B_c / 2], O[64], m[2] = {0.f, 0.f}, l[2] = {0, 0}, alpha[2] = {0.5f, 0.25f};
  uint32_t P_op[Cfg::B_c / Cfg::kK][4] = {};
  for (int i = 0; i < 64; ++i) O[i] = seed * i;
  for (int i = 0; i < Cfg::B_c / 2; ++i) S[i] = seed * float((i * 37 + threadIdx.x) & 255);
  long long t0 = clock64();
  for (int it = 0; it < kIters; ++it) {
    pin_registers(S);
#pragma unroll
    for (int slot = 0; slot < 2; ++slot) {
      float mx = m[slot];
      if (MODE & 1) mx = fmaxf(m[slot], row_max<Cfg>(S, slot) * 0.1f);
      alpha[slot] = exp2_approx(m[slot] - mx);
      m[slot] = mx;
      const float shift = 8.f - mx;
      float row_sum = 0.f;
      for_each_in_row<Cfg>(S, slot, [&](int, float& s) {
        if (MODE & 2) s = exp2_approx(fmaf(s, 0.1f, shift));
        else s = fmaf(s, 0.1f, shift);
        if (MODE & 4) row_sum += s;
      });
      l[slot] = alpha[slot] * l[slot] + row_sum;
    }
    if (MODE & 8) to_operand_fp8<Cfg>(S, P_op);
    if (MODE & 16) rescale<128>(O, alpha);
    pin_registers(O);
#pragma unroll
    for (int i = 0; i < Cfg::B_c / Cfg::kK; ++i)
#pragma unroll
      for (int q = 0; q < 4; ++q) asm volatile("" : "+r"(P_op[i][q]));
  }
  long long t1 = clock64();
  float s = l[0] + l[1];
  for (int i = 0; i < 64; ++i) s += O[i];
  for (int i = 0; i < Cfg::B_c / 2; ++i) s += S[i];
  for (int i = 0; i < Cfg::B_c / Cfg::kK; ++i) s += P_op[i][0];
  out[blockIdx.x * blockDim.x + threadIdx.x] = s;
  if (threadIdx.x == 0) cyc[blockIdx.x] = t1 - t0;
}
template <int MODE> void run(int warps) {
  float* out; long long* cyc; cudaMalloc(&out, 132 * 1024 * 4); cudaMalloc(&cyc, 132 * 8);
  k<MODE><<<132, 32 * warps>>>(out, cyc, 1e-3f); cudaDeviceSynchronize();
  k<MODE><<<132, 32 * warps>>>(out, cyc, 1e-3f);
  long long h; cudaMemcpy(&h, cyc, 8, cudaMemcpyDeviceToHost);
  printf("mode %2d (%s%s%s%s%s) warps/SMSP %d: %5.0f cycles per block per warp\n", MODE, MODE & 1 ? "max " : "",
         MODE & 2 ? "exp " : "", MODE & 4 ? "sum " : "", MODE & 8 ? "cvt " : "", MODE & 16 ? "rescale" : "", warps / 4,
         double(h) / kIters);
  cudaFree(out); cudaFree(cyc);
}
int main() {
  for (int w : {4, 8}) {
    run<31>(w); run<30>(w); run<29>(w); run<27>(w); run<23>(w); run<15>(w);
    run<2>(w); run<1>(w); run<8>(w); run<4>(w); run<16>(w); run<10>(w); run<3>(w);
  }
}
