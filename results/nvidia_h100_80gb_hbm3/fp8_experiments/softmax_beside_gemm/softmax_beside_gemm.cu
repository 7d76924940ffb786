// Does a running QGMMA of another warpgroup slow the FP8 softmax? WG 0 runs the d = 128 softmax
// (softmax_pieces.cu, mode 31) in a loop and times it; WG 1 issues QGMMA SS 64xNx32 x4
// (accumulators in its registers) back to back until WG 0 is done. Usage: softmax_beside_gemm N (0: alone).
// N = 1192: the same QGMMA as N = 192 with f16 accumulators (half the accumulator bytes).
// N = -192 / -1192: WG 0 only waits (as long as the softmax alone takes) while WG 1 issues:
// the GEMM groups' own time.
#include <cstdio>
#include <cstdlib>
#include "06_fa3_hopper/fa3_fp8_kernel.cuh"
using namespace attn::fa3;
using namespace attn;
using Cfg = Fp8Config<128>;
constexpr int kIters = 256;
// QGMMA SS m64n192k32 with f16 accumulators: 64 x 192 halves, 48 registers per thread (two
// neighbouring columns of a row in each), half the accumulator bytes of the f32 form.
__device__ void qgmma_f16_192(uint32_t (&d)[48], uint64_t a, uint64_t b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %50, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n192k32.f16.e4m3.e4m3 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47}, %48, %49, p, 1, 1;\n}\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]), "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15]), "+r"(d[16]), "+r"(d[17]), "+r"(d[18]), "+r"(d[19]), "+r"(d[20]), "+r"(d[21]), "+r"(d[22]), "+r"(d[23]), "+r"(d[24]), "+r"(d[25]), "+r"(d[26]), "+r"(d[27]), "+r"(d[28]), "+r"(d[29]), "+r"(d[30]), "+r"(d[31]), "+r"(d[32]), "+r"(d[33]), "+r"(d[34]), "+r"(d[35]), "+r"(d[36]), "+r"(d[37]), "+r"(d[38]), "+r"(d[39]), "+r"(d[40]), "+r"(d[41]), "+r"(d[42]), "+r"(d[43]), "+r"(d[44]), "+r"(d[45]), "+r"(d[46]), "+r"(d[47])
      : "l"(a), "l"(b), "r"(accumulate));
}

struct alignas(1024) Sm { E4m3 q[64 * 128]; E4m3 k[192 * 128]; E4m3 v[136 * 192]; int done; };
template <int MODE>
__global__ void __launch_bounds__(256, 1) k(float* out, long long* cyc, long long* gemms, float seed) {
  extern __shared__ uint8_t raw[];
  Sm& s = *reinterpret_cast<Sm*>((reinterpret_cast<uintptr_t>(raw) + 1023) & ~uintptr_t(1023));
  for (int i = threadIdx.x; i < int(sizeof(Sm)) / 4; i += blockDim.x) reinterpret_cast<uint32_t*>(&s)[i] = 0x30303030u;
  if (threadIdx.x == 0) s.done = 0;
  fence_proxy_async_shared();
  __syncthreads();
  if (threadIdx.x < 128) {
    float S[Cfg::B_c / 2], O[64], m[2] = {0.f, 0.f}, l[2] = {0, 0}, alpha[2] = {0.5f, 0.25f};
    uint32_t P_op[Cfg::B_c / Cfg::kK][4] = {};
    for (int i = 0; i < 64; ++i) O[i] = seed * i;
    for (int i = 0; i < Cfg::B_c / 2; ++i) S[i] = seed * float((i * 37 + threadIdx.x) & 255);
    long long t0 = clock64();
    if constexpr (MODE < 0) {  // no softmax: wait as long as one takes alone (1199 cycles per block)
      while (clock64() - t0 < 1199LL * kIters) {
      }
    } else
    for (int it = 0; it < kIters; ++it) {
      pin_registers(S);
      online_softmax<Cfg, false>(S, m, l, alpha, 0.1f, 0.f, 8.f);
      to_operand_fp8<Cfg>(S, P_op);
      rescale<128>(O, alpha);
      pin_registers(O);
#pragma unroll
      for (int i = 0; i < Cfg::B_c / Cfg::kK; ++i)
#pragma unroll
        for (int q = 0; q < 4; ++q) asm volatile("" : "+r"(P_op[i][q]));
    }
    long long t1 = clock64();
    float r = l[0] + l[1];
    for (int i = 0; i < 64; ++i) r += O[i];
    for (int i = 0; i < Cfg::B_c / 2; ++i) r += S[i];
    for (int i = 0; i < Cfg::B_c / Cfg::kK; ++i) r += P_op[i][0];
    out[blockIdx.x * blockDim.x + threadIdx.x] = r;
    if (threadIdx.x == 0) { cyc[blockIdx.x] = t1 - t0; atomicExch(&s.done, 1); }
  } else if constexpr (MODE == 1192 || MODE == -1192) {
    uint32_t A[48];
    for (int i = 0; i < 48; ++i) A[i] = 0u;
    long long n = 0;
    const uint64_t q_desc = make_smem_desc(s.q, 16, 1024, Swizzle::b128);
    const uint64_t k_desc = make_smem_desc(s.k, 16, 1024, Swizzle::b128);
    while (*reinterpret_cast<volatile int*>(&s.done) == 0) {
      for (int i = 0; i < 48; ++i) asm volatile("" : "+r"(A[i]));
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) qgmma_f16_192(A, desc_advance(q_desc, 32 * kk), desc_advance(k_desc, 32 * kk), kk > 0);
      wgmma_commit();
      wgmma_wait<0>();
      for (int i = 0; i < 48; ++i) asm volatile("" : "+r"(A[i]));
      ++n;
    }
    uint32_t r = 0; for (int i = 0; i < 48; ++i) r ^= A[i];
    out[blockIdx.x * blockDim.x + threadIdx.x] = float(r & 0xffff);
    if (threadIdx.x == 128) gemms[blockIdx.x] = n;
  } else if constexpr (MODE != 0) {
    constexpr int N = MODE < 0 ? -MODE : MODE;
    float A[N / 2];
    for (int i = 0; i < N / 2; ++i) A[i] = 0.f;
    long long n = 0;
    const uint64_t q_desc = make_smem_desc(s.q, 16, 1024, Swizzle::b128);
    const uint64_t k_desc = make_smem_desc(s.k, 16, 1024, Swizzle::b128);
    while (*reinterpret_cast<volatile int*>(&s.done) == 0) {
      if (true) {
        pin_registers(A);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
          Wgmma<E4m3, N>::ss(A, desc_advance(q_desc, 32 * kk), desc_advance(k_desc, 32 * kk), kk > 0);
        wgmma_commit();
        wgmma_wait<0>();
        pin_registers(A);
      }
      ++n;
    }
    float r = 0; for (int i = 0; i < N / 2; ++i) r += A[i];
    out[blockIdx.x * blockDim.x + threadIdx.x] = r;
    if (threadIdx.x == 128) gemms[blockIdx.x] = n;
  }
}
template <int MODE> void run(const char* name) {
  float* out; long long *cyc, *gm; cudaMalloc(&out, 132 * 1024 * 4); cudaMalloc(&cyc, 132 * 8); cudaMalloc(&gm, 132 * 8);
  cudaMemset(gm, 0, 132 * 8);
  const int smem = sizeof(Sm) + 1024;
  cudaFuncSetAttribute(k<MODE>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  k<MODE><<<132, 256, smem>>>(out, cyc, gm, 1e-3f); cudaDeviceSynchronize();
  k<MODE><<<132, 256, smem>>>(out, cyc, gm, 1e-3f);
  cudaError_t e = cudaDeviceSynchronize();
  long long h, g; cudaMemcpy(&h, cyc, 8, cudaMemcpyDeviceToHost); cudaMemcpy(&g, gm, 8, cudaMemcpyDeviceToHost);
  printf("%-44s softmax %5.0f cycles per block; other WG's GEMM groups meanwhile %lld (%.0f cycles each) %s\n", name,
         double(h) / kIters, g, g ? double(h) / g : 0.0, e ? cudaGetErrorString(e) : "");
}
int main(int argc, char** argv) {
  const int n = argc > 1 ? atoi(argv[1]) : 0;
  if (n == 0) run<0>("softmax alone (other WG idle)");
  if (n == 64) run<64>("beside QGMMA SS 64x64x32 x4");
  if (n == 128) run<128>("beside QGMMA SS 64x128x32 x4");
  if (n == 192) run<192>("beside QGMMA SS 64x192x32 x4");
  if (n == 256) run<256>("beside QGMMA SS 64x256x32 x4");
  if (n == 1192) run<1192>("beside QGMMA SS 64x192x32 x4, f16 accum.");
  if (n == -192) run<-192>("QGMMA SS 64x192x32 x4 alone (WG 0 waits)");
  if (n == -1192) run<-1192>("QGMMA SS 64x192x32 x4, f16 accum., alone");
}
