// 04 backward: FlashAttention-1, Algorithm 4 of Dao et al. 2022 (Appendix B), as written,
// without dropout; ℓ and m are kept folded into L = m + log ℓ (as FA2 does); nothing N x N.
// The backward recomputes P_ij = diag(ℓ_i)⁻¹ exp(S_ij − m_i) = exp(S_ij − L_i) block by block:
//
//  7  for j = 1 … T_c:                                  (one CTA per j, batch, key/value head)
//  8    load K_j, V_j from HBM to SRAM
//  9    dK~_j = (0), dV~_j = (0) in SRAM
// 10    for i = 1 … T_r:                                (and, GQA, each query head of the group)
// 11      load Q_i, O_i, dO_i, L_i from HBM to SRAM
// 12      S_ij = τ Q_i K_jᵀ
// 13      S_ij = MASK(S_ij)
// 14      P_ij = exp(S_ij − L_i)
// 17      dV~_j ← dV~_j + P_ijᵀ dO_i
// 18      dP_ij = dO_i V_jᵀ
// 20      D_i = rowsum(dO_i ∘ O_i)
// 21      dS_ij = P_ij ∘ (dP_ij − D_i)
// 22      dQ_i ← dQ_i + τ dS_ij K_j                     → HBM (fp32 atomics: CTAs j run at once)
// 23      dK~_j ← dK~_j + τ dS_ijᵀ Q_i
// 25    write dK_j ← dK~_j, dV_j ← dV~_j to HBM
//
// (The paper loops over j inside one CTA per head and adds to dQ_i in HBM directly; here the
// j loop is the grid, so several CTAs add to the same dQ_i: an fp32 accumulator in the
// workspace, atomicAdd, and a last kernel that converts it, τ applied, to the output type.)
//
// The five products run on tensor cores (WMMA 16x16x16, fp32 accumulate) with the forward's
// gemm_tiles; the two with a transposed left operand (P_ijᵀ, dS_ijᵀ) read P_ij, dS_ij as
// column-major fragments. Elementwise steps stride over the CTA, as the forward's softmax.
#pragma once

#include <cuda_runtime.h>
#include <mma.h>

#include <algorithm>
#include <cmath>

#include "04_fa1_tiled/fa1_backward.h"
#include "04_fa1_tiled/fa1_tiled_kernel.cuh"

namespace attn::fa1 {

struct BwdArgs {
  int Nq, Nk;
  int H, Hkv, group;  // query heads, key/value heads, query heads per key/value head
  int Br, Bc;         // block rows of Q (B_r) and of K, V (B_c)
  int T_c;            // K/V blocks per head
  float tau;          // softmax scale
  bool causal;
};

// C += Aᵀ B on tensor cores: A stored [kdim][M] row-major (so Aᵀ is read as a column-major
// M x kdim matrix), B [kdim][N] row-major, C fp32 [M][N] row-major, read and written back.
// Warps take the 16x16 tiles of C in turn, as gemm_tiles.
template <typename T>
__device__ void gemm_tiles_at_acc(const T* A, int lda, const T* B, int ldb, float* C, int ldc, int M, int N,
                                  int kdim) {
  using namespace nvcuda;
  const int warp = threadIdx.x / kWarpSize;
  const int tiles_n = N / kTile;
  for (int tile = warp; tile < M / kTile * tiles_n; tile += kWarps) {
    const int m0 = tile / tiles_n * kTile, n0 = tile % tiles_n * kTile;
    wmma::fragment<wmma::accumulator, kTile, kTile, kTile, float> c;
    wmma::load_matrix_sync(c, C + m0 * ldc + n0, ldc, wmma::mem_row_major);
    for (int k0 = 0; k0 < kdim; k0 += kTile) {
      wmma::fragment<wmma::matrix_a, kTile, kTile, kTile, T, wmma::col_major> a;
      wmma::fragment<wmma::matrix_b, kTile, kTile, kTile, T, wmma::row_major> b;
      wmma::load_matrix_sync(a, A + k0 * lda + m0, lda);
      wmma::load_matrix_sync(b, B + k0 * ldb + n0, ldb);
      wmma::mma_sync(c, a, b, c);
    }
    wmma::store_matrix_sync(C + m0 * ldc + n0, c, ldc, wmma::mem_row_major);
  }
}

// dst[0..3] += v in HBM: one vector atomic on sm_90, four scalar ones before it.
__device__ inline void atomic_add4(float* dst, float4 v) {
#if __CUDA_ARCH__ >= 900
  atomicAdd(reinterpret_cast<float4*>(dst), v);
#else
  atomicAdd(dst + 0, v.x);
  atomicAdd(dst + 1, v.y);
  atomicAdd(dst + 2, v.z);
  atomicAdd(dst + 3, v.w);
#endif
}

template <typename T, int kHeadDim>
__global__ void __launch_bounds__(kThreads, 1)
    fa1_backward_kernel(const T* __restrict__ Q, const T* __restrict__ K, const T* __restrict__ V,
                        const T* __restrict__ O, const T* __restrict__ dO, const float* __restrict__ lse,
                        float* __restrict__ dQ_acc, T* __restrict__ dK, T* __restrict__ dV, BwdArgs a) {
  static_assert(kHeadDim % kTile == 0, "d is whole tensor-core tiles");
  constexpr int kVecsPerRow = kHeadDim / kFloatsPerCopy;  // float4s in a row of dQ_i

  const BwdSmemLayout L{a.Br, a.Bc, kHeadDim, int(sizeof(T))};
  extern __shared__ __align__(kSmemAlign) unsigned char smem[];
  T* K_j = reinterpret_cast<T*>(smem + L.k_offset());
  T* V_j = reinterpret_cast<T*>(smem + L.v_offset());
  T* Q_i = reinterpret_cast<T*>(smem + L.q_offset());
  T* dO_i = reinterpret_cast<T*>(smem + L.do_offset());
  T* P_ij = reinterpret_cast<T*>(smem + L.p_offset());
  T* dS_ij = reinterpret_cast<T*>(smem + L.ds_offset());
  float* S_ij = reinterpret_cast<float*>(smem + L.s_offset());
  float* dP_ij = reinterpret_cast<float*>(smem + L.dp_offset());  // later dS_ij K_j
  float* dK_j = reinterpret_cast<float*>(smem + L.dk_offset());
  float* dV_j = reinterpret_cast<float*>(smem + L.dv_offset());
  float* L_i = reinterpret_cast<float*>(smem + L.lse_offset());
  float* D_i = reinterpret_cast<float*>(smem + L.d_offset());

  // This CTA's K/V block j of key/value head (b, h_kv); it serves query heads
  // h_kv * group ... (h_kv + 1) * group - 1.
  const int j = blockIdx.x % a.T_c;
  const int64_t bh_kv = blockIdx.x / a.T_c;
  const int b = int(bh_kv / a.Hkv), h_kv = int(bh_kv % a.Hkv);
  const int j0 = j * a.Bc;
  const int off = a.Nk - a.Nq;  // causal, bottom-right: row r sees keys c <= r + off

  // lines 8, 9: K_j, V_j into SRAM (rows past Nk zero), dK~_j = dV~_j = 0
  load_rows<T, kHeadDim>(K_j, L.ld_qkv(), K + bh_kv * a.Nk * kHeadDim, j0, a.Bc, a.Nk);
  load_rows<T, kHeadDim>(V_j, L.ld_qkv(), V + bh_kv * a.Nk * kHeadDim, j0, a.Bc, a.Nk);
  for (int x = threadIdx.x; x < a.Bc * L.ld_acc(); x += kThreads) dK_j[x] = dV_j[x] = 0.f;

  // Causal: Q blocks whose last row sees no key of K_j are skipped (the last row of Q_i sees
  // key j0 iff i0 + B_r - 1 + off >= j0).
  const int T_r = (a.Nq + a.Br - 1) / a.Br;
  const int first_i = a.causal && j0 - off > 0 ? (j0 - off) / a.Br : 0;

  for (int h = h_kv * a.group; h < (h_kv + 1) * a.group; ++h) {  // GQA: the heads reading K_j, V_j
    const int64_t bh = int64_t(b) * a.H + h;
    for (int i = first_i; i < T_r; ++i) {  // line 10
      const int i0 = i * a.Br;
      const int rows = min(a.Br, a.Nq - i0);  // rows of Q_i inside Nq

      // line 11: Q_i, dO_i into SRAM (rows past Nq zero); L_i (O_i is read where line 20 uses it)
      load_rows<T, kHeadDim>(Q_i, L.ld_qkv(), Q + bh * a.Nq * kHeadDim, i0, a.Br, a.Nq);
      load_rows<T, kHeadDim>(dO_i, L.ld_qkv(), dO + bh * a.Nq * kHeadDim, i0, a.Br, a.Nq);
      __syncthreads();  // Q_i, dO_i (and, first time, K_j, V_j, the zeroed accumulators) are in

      // line 20, D_i = rowsum(dO_i ∘ O_i), kRowLanes lanes per row; L_i beside it
      constexpr int kRowsAtOnce = kThreads / kRowLanes;
      for (int r0 = 0; r0 < a.Br; r0 += kRowsAtOnce) {  // every lane runs every pass (shuffles)
        const int r = r0 + int(threadIdx.x) / kRowLanes, lane = threadIdx.x % kRowLanes;
        const bool live = r < rows;
        const T* O_r = O + (bh * a.Nq + i0 + r) * kHeadDim;
        float dot = 0.f;
        for (int c = lane; live && c < kHeadDim; c += kRowLanes)
          dot += to_float(dO_i[r * L.ld_qkv() + c]) * to_float(O_r[c]);
        dot = group_sum<kRowLanes>(dot);
        if (lane == 0 && r < a.Br) {
          D_i[r] = live ? dot : 0.f;
          L_i[r] = live ? lse[bh * a.Nq + i0 + r] : 0.f;  // rows past Nq are masked below
        }
      }
      // line 12: S_ij = τ Q_i K_jᵀ;  line 18: dP_ij = dO_i V_jᵀ
      gemm_tiles<T, nvcuda::wmma::col_major>(Q_i, L.ld_qkv(), K_j, L.ld_qkv(), S_ij, L.ld_s(), a.Br, a.Bc, kHeadDim,
                                              a.tau);
      gemm_tiles<T, nvcuda::wmma::col_major>(dO_i, L.ld_qkv(), V_j, L.ld_qkv(), dP_ij, L.ld_dp(), a.Br, a.Bc,
                                              kHeadDim, 1.f);
      __syncthreads();

      // lines 13, 14, 21: P_ij = exp(MASK(S_ij) − L_i), dS_ij = P_ij ∘ (dP_ij − D_i). Masked:
      // keys past Nk, rows past Nq and, causal, keys c > r + off (P = 0, whatever L_i is).
      for (int x = threadIdx.x; x < a.Br * a.Bc; x += kThreads) {
        const int r = x / a.Bc, c = x % a.Bc;
        const int row = i0 + r, key = j0 + c;
        const bool visible = row < a.Nq && key < a.Nk && (!a.causal || key <= row + off);
        const float p = visible ? __expf(S_ij[r * L.ld_s() + c] - L_i[r]) : 0.f;
        const float ds = p * (dP_ij[r * L.ld_dp() + c] - D_i[r]);
        P_ij[r * L.ld_p() + c] = from_float<T>(p);
        dS_ij[r * L.ld_p() + c] = from_float<T>(ds);
      }
      __syncthreads();

      // line 17: dV~_j += P_ijᵀ dO_i;  line 23: dK~_j += dS_ijᵀ Q_i (τ applied once, at line 25);
      // line 22's product dS_ij K_j into the dP_ij buffer (τ applied with the conversion)
      gemm_tiles_at_acc<T>(P_ij, L.ld_p(), dO_i, L.ld_qkv(), dV_j, L.ld_acc(), a.Bc, kHeadDim, a.Br);
      gemm_tiles_at_acc<T>(dS_ij, L.ld_p(), Q_i, L.ld_qkv(), dK_j, L.ld_acc(), a.Bc, kHeadDim, a.Br);
      gemm_tiles<T, nvcuda::wmma::row_major>(dS_ij, L.ld_p(), K_j, L.ld_qkv(), dP_ij, L.ld_dp(), a.Br, kHeadDim, a.Bc,
                                              1.f);
      __syncthreads();

      // line 22: dQ_i += dS_ij K_j in HBM, the rows inside Nq
      float* dQ_rows = dQ_acc + (bh * a.Nq + i0) * kHeadDim;
      for (int x = threadIdx.x; x < rows * kVecsPerRow; x += kThreads) {
        const int r = x / kVecsPerRow, c = x % kVecsPerRow * kFloatsPerCopy;
        atomic_add4(dQ_rows + r * kHeadDim + c, *reinterpret_cast<const float4*>(dP_ij + r * L.ld_dp() + c));
      }
    }
  }
  __syncthreads();  // the accumulators' last products are in (and the zeroing, for any thread's rows)

  // line 25: dK_j = τ dK~_j, dV_j = dV~_j, the rows inside Nk, in the output type
  const int keys = min(a.Bc, a.Nk - j0);
  T* dK_h = dK + (bh_kv * a.Nk + j0) * kHeadDim;
  T* dV_h = dV + (bh_kv * a.Nk + j0) * kHeadDim;
  for (int x = threadIdx.x; x < keys * kHeadDim; x += kThreads) {
    const int r = x / kHeadDim, c = x % kHeadDim;
    dK_h[x] = from_float<T>(a.tau * dK_j[r * L.ld_acc() + c]);
    dV_h[x] = from_float<T>(dV_j[r * L.ld_acc() + c]);
  }
}

// dQ = τ dQ_acc in the output type (the accumulator holds sum_j dS_ij K_j).
template <typename T>
__global__ void fa1_convert_dq_kernel(const float* __restrict__ dQ_acc, T* __restrict__ dQ, int64_t n, float tau) {
  for (int64_t x = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; x < n; x += int64_t(gridDim.x) * blockDim.x)
    dQ[x] = from_float<T>(tau * dQ_acc[x]);
}

template <typename T, int kHeadDim>
void fa1_backward_launch(const AttnProblem& p, const AttnBwdTensors& t, Blocks blocks, cudaStream_t stream) {
  BwdArgs a;
  a.Nq = p.Nq;
  a.Nk = p.Nk;
  a.H = p.H;
  a.Hkv = p.Hkv;
  a.group = p.group();
  a.Br = blocks.Br;
  a.Bc = blocks.Bc;
  a.T_c = (p.Nk + a.Bc - 1) / a.Bc;
  a.tau = p.softmax_scale();
  a.causal = p.causal;

  const size_t smem = BwdSmemLayout{a.Br, a.Bc, kHeadDim, int(sizeof(T))}.bytes();
  auto kernel = fa1_backward_kernel<T, kHeadDim>;
  allow_dynamic_smem(kernel, smem, "04_fa1_tiled backward (d = " + std::to_string(kHeadDim) + ", B_r = " +
                                       std::to_string(a.Br) + ", B_c = " + std::to_string(a.Bc) + ")");

  float* dQ_acc = static_cast<float*>(t.workspace);  // line 6: dQ = (0)
  CUDA_CHECK(cudaMemsetAsync(dQ_acc, 0, size_t(p.q_elems()) * sizeof(float), stream));
  const int64_t ctas = int64_t(a.T_c) * p.B * p.Hkv;  // backward_refuse keeps this <= INT_MAX
  kernel<<<unsigned(ctas), kThreads, smem, stream>>>(
      static_cast<const T*>(t.q), static_cast<const T*>(t.k), static_cast<const T*>(t.v), static_cast<const T*>(t.o),
      static_cast<const T*>(t.dout), t.lse, dQ_acc, static_cast<T*>(t.dk), static_cast<T*>(t.dv), a);
  CUDA_CHECK_LAUNCH();
  constexpr int kConvertThreads = 256, kConvertMaxBlocks = 4096;
  const int64_t convert_blocks = std::min<int64_t>((p.q_elems() + kConvertThreads - 1) / kConvertThreads,
                                                   kConvertMaxBlocks);
  fa1_convert_dq_kernel<T><<<unsigned(convert_blocks), kConvertThreads, 0, stream>>>(dQ_acc, static_cast<T*>(t.dq),
                                                                                      p.q_elems(), a.tau);
  CUDA_CHECK_LAUNCH();
}

}  // namespace attn::fa1
