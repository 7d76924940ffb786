// 04: FlashAttention-1, Algorithm 1 of Dao et al. 2022, as written.
//
// One CTA per (batch, head). The outer loop walks the K/V blocks j (K_j, V_j stay in
// shared memory); the inner loop walks every Q block i, and each step reads Q_i, O_i,
// l_i, m_i from HBM and writes O_i, l_i, m_i back. S_ij = tau Q_i K_jᵀ and P~_ij V_j run
// on tensor cores (WMMA 16x16x16, fp32 accumulate); the softmax runs on CUDA cores.
//
//              K_j, V_j (B_c rows)  ──────▶ j (outer)
//            ┌───────┬───────┬───────┐
//   Q_i  i   │ S_00  │ S_01  │ S_02  │   each (i, j) step: S_ij in shared memory,
//  (B_r  │   ├───────┼───────┼───────┤   O_i (fp32), l_i, m_i round-trip through HBM
//  rows) ▼   │ S_10  │ S_11  │ S_12  │
//            └───────┴───────┴───────┘
//
// Inside one step, warps take the 16x16 tiles of S_ij (then of P~_ij V_j) in turn; in the
// softmax, each row belongs to kRowLanes lanes that stride its columns. Algorithm 1's line 1
// (B_c = ceil(M / 4d), B_r = min(B_c, d)) runs on the host: choose_blocks() in stages.cu.
#pragma once

#include <cuda_runtime.h>
#include <mma.h>

#include <cmath>
#include <type_traits>

#include "04_fa1_tiled/fa1_tiled.cuh"
#include "common/check.h"
#include "common/smem_limit.h"
#include "common/device_math.cuh"
#include "common/dtype.cuh"

namespace attn::fa1 {

constexpr int kWarpSize = 32;
constexpr int kCopyBytes = 16;  // bytes per vector load/store between HBM and shared memory
constexpr int kFloatsPerCopy = kCopyBytes / sizeof(float);

// Warps per CTA: with one CTA per (batch, head) the CTA is all an SM gets, so it should be
// big enough to keep the tensor cores and the load units busy; more warps share the tiles.
constexpr int kWarps = 16;
constexpr int kThreads = kWarps * kWarpSize;
// HBM loads each thread issues before it uses the first: one CTA per SM has few threads,
// so each must keep several loads in flight to hide the latency; more costs registers.
constexpr int kLoadsInFlight = 8;
// Lanes that share one row of the softmax: fewer = more rows at once but longer serial
// scans over the row's B_c columns.
constexpr int kRowLanes = 8;

struct Args {
  int64_t Nq, Nk;
  int H, Hkv, group;  // query heads, key/value heads, query heads per key/value head
  int Br, Bc;         // block rows of Q (B_r) and of K, V (B_c)
  float tau;          // softmax scale
  bool causal;
};

// e^{m_from - m_to}, and 0 when m_from = -inf (a row that has not seen a key yet; then
// m_to may be -inf as well, and the plain formula would give NaN).
__device__ inline float rescale(float m_from, float m_to) {
  return m_from == -INFINITY ? 0.f : __expf(m_from - m_to);
}

// Keys [0, key_end) are visible to query row `row`: all of them, or (causal, aligned to the
// bottom-right corner) the keys j <= row + Nk - Nq.
__device__ inline int64_t key_end(const Args& a, int64_t row) {
  return a.causal ? min(max(row + a.Nk - a.Nq + 1, int64_t(0)), a.Nk) : a.Nk;
}

// For x in [0, n), strided over the CTA: value = load(x), then store(x, value); each thread
// issues kLoadsInFlight loads before the first store, so their latencies overlap.
template <typename Load, typename Store>
__device__ void copy_in_flight(int64_t n, Load load, Store store) {
  for (int64_t x0 = threadIdx.x; x0 < n; x0 += kLoadsInFlight * kThreads) {
    decltype(load(x0)) value[kLoadsInFlight];
#pragma unroll
    for (int b = 0; b < kLoadsInFlight; ++b)
      if (x0 + b * kThreads < n) value[b] = load(x0 + b * kThreads);
#pragma unroll
    for (int b = 0; b < kLoadsInFlight; ++b)
      if (x0 + b * kThreads < n) store(x0 + b * kThreads, value[b]);
  }
}

// Rows [row0, row0 + rows) of a [n][kHeadDim] matrix in HBM into shared memory (leading
// dimension ld). Rows at or past n are zero: a ragged block's tiles stay finite.
template <typename T, int kHeadDim>
__device__ void load_rows(T* dst, int ld, const T* src, int64_t row0, int rows, int64_t n) {
  constexpr int kVec = kCopyBytes / sizeof(T);  // elements per vector
  constexpr int kVecsPerRow = kHeadDim / kVec;
  copy_in_flight(
      int64_t(rows) * kVecsPerRow,
      [&](int64_t x) {
        const int64_t row = row0 + x / kVecsPerRow;
        return row < n ? *reinterpret_cast<const uint4*>(src + row * kHeadDim + x % kVecsPerRow * kVec)
                       : make_uint4(0, 0, 0, 0);
      },
      [&](int64_t x, uint4 v) { *reinterpret_cast<uint4*>(dst + x / kVecsPerRow * ld + x % kVecsPerRow * kVec) = v; });
}

// C = alpha A B on tensor cores, all operands in shared memory. A is [M][kdim] row-major;
// B is [kdim][N], row-major, or col-major = stored as [N][kdim] (K_j read as K_jᵀ). C is
// fp32 row-major. Warps take the 16x16 tiles of C in turn; M, N, kdim are multiples of 16.
template <typename T, typename LayoutB>
__device__ void gemm_tiles(const T* A, int lda, const T* B, int ldb, float* C, int ldc, int M, int N, int kdim,
                           float alpha) {
  using namespace nvcuda;
  const int warp = threadIdx.x / kWarpSize;
  const int tiles_n = N / kTile;
  for (int tile = warp; tile < M / kTile * tiles_n; tile += kWarps) {
    const int m0 = tile / tiles_n * kTile, n0 = tile % tiles_n * kTile;
    wmma::fragment<wmma::accumulator, kTile, kTile, kTile, float> c;
    wmma::fill_fragment(c, 0.f);
    for (int k0 = 0; k0 < kdim; k0 += kTile) {
      wmma::fragment<wmma::matrix_a, kTile, kTile, kTile, T, wmma::row_major> a;
      wmma::fragment<wmma::matrix_b, kTile, kTile, kTile, T, LayoutB> b;
      wmma::load_matrix_sync(a, A + m0 * lda + k0, lda);
      if constexpr (std::is_same_v<LayoutB, wmma::col_major>)
        wmma::load_matrix_sync(b, B + n0 * ldb + k0, ldb);
      else
        wmma::load_matrix_sync(b, B + k0 * ldb + n0, ldb);
      wmma::mma_sync(c, a, b, c);
    }
    for (int e = 0; e < c.num_elements; ++e) c.x[e] *= alpha;
    wmma::store_matrix_sync(C + m0 * ldc + n0, c, ldc, wmma::mem_row_major);
  }
}

// Lines 10, 11 and 13 (statistics) of Algorithm 1 for the rows of block (i, j), kRowLanes
// lanes per row:
//   m~_ij = rowmax(S_ij), P~_ij = exp(S_ij - m~_ij), l~_ij = rowsum(P~_ij)         (10)
//   m_new, l_new: the row's statistics over blocks 0 .. j, from (m_i, l_i) and (m~, l~)  (11)
//   m_i <- m_new, l_i <- l_new in HBM                                              (13)
// m_i, l_i come from shared memory (loaded with Q_i, line 8); line 12's two per-row weights,
// of O_i and of P~_ij V_j, go there too (update_O applies them).
// Masked entries (keys past Nk, causal) get P~ = 0; rows past Nq are all masked.
template <typename T>
__device__ void softmax_rows(const Args& a, int64_t i0, int64_t j0, const float* S_ij, int ld_s, T* P_ij, int ld_p,
                             const float* m_i, const float* l_i, float* m_hbm, float* l_hbm, float* old_weight,
                             float* new_weight) {
  constexpr int kRowsAtOnce = kThreads / kRowLanes;
  const int lane = threadIdx.x % kRowLanes;
  // every lane runs every pass (its row past B_r idle), so the shuffles see whole warps
  for (int r0 = 0; r0 < a.Br; r0 += kRowsAtOnce) {
    const int r = r0 + threadIdx.x / kRowLanes;
    const int64_t row = i0 + r;
    const bool live = r < a.Br && row < a.Nq;
    const int64_t visible = live ? min(max(key_end(a, row) - j0, int64_t(0)), int64_t(a.Bc)) : 0;
    const float* S_r = S_ij + r * ld_s;
    T* P_r = P_ij + r * ld_p;

    float m_tilde = -INFINITY;  // stays -inf when no column is visible
    for (int c = lane; c < visible; c += kRowLanes) m_tilde = fmaxf(m_tilde, S_r[c]);
    m_tilde = group_max<kRowLanes>(m_tilde);
    float l_tilde = 0.f;
    for (int c = lane; r < a.Br && c < a.Bc; c += kRowLanes) {
      const float p = c < visible ? __expf(S_r[c] - m_tilde) : 0.f;
      P_r[c] = from_float<T>(p);
      l_tilde += p;
    }
    l_tilde = group_sum<kRowLanes>(l_tilde);

    if (lane == 0 && live) {
      const float m_new = fmaxf(m_i[r], m_tilde);  // LAB:BEGIN 04.statistics
      const float e_old = rescale(m_i[r], m_new), e_new = rescale(m_tilde, m_new);
      const float l_new = e_old * l_i[r] + e_new * l_tilde;
      const float inv_l_new = l_new > 0.f ? 1.f / l_new : 0.f;  // 0: no key seen yet, O_i stays 0
      m_hbm[row] = m_new;
      l_hbm[row] = l_new;
      old_weight[r] = l_i[r] * e_old * inv_l_new;
      new_weight[r] = e_new * inv_l_new;  // LAB:END
    }
  }
}

// Line 12 of Algorithm 1 with softmax_rows' two weights per row: O_i read from HBM, updated
// with P~_ij V_j, written back.
template <int kHeadDim>
__device__ void update_O(float* O_i, int rows, const float* PV, int ld_pv, const float* old_weight,
                         const float* new_weight) {
  constexpr int kVecsPerRow = kHeadDim / kFloatsPerCopy;
  float4* O4 = reinterpret_cast<float4*>(O_i);
  copy_in_flight(
      int64_t(rows) * kVecsPerRow, [&](int64_t x) { return O4[x]; },
      [&](int64_t x, float4 o) {
        const int r = int(x / kVecsPerRow), c = int(x % kVecsPerRow) * kFloatsPerCopy;
        const float4 pv = *reinterpret_cast<const float4*>(PV + r * ld_pv + c);
        const float w_old = old_weight[r], w_new = new_weight[r];  // LAB:BEGIN 04.update_O
        O4[x] = make_float4(w_old * o.x + w_new * pv.x, w_old * o.y + w_new * pv.y, w_old * o.z + w_new * pv.z,
                            w_old * o.w + w_new * pv.w);  // LAB:END
      });
}

template <typename T, int kHeadDim>
__global__ void __launch_bounds__(kThreads, 1)
    fa1_kernel(const T* __restrict__ Q, const T* __restrict__ K, const T* __restrict__ V, T* __restrict__ O,
               float* __restrict__ lse, float* O_acc, float* l_acc, float* m_acc, Args a) {
  static_assert(kHeadDim % kTile == 0, "d is whole tensor-core tiles");
  constexpr int kVecsPerRow = kHeadDim / kFloatsPerCopy;  // float4s in a row of O

  const SmemLayout L{a.Br, a.Bc, kHeadDim, int(sizeof(T))};
  extern __shared__ __align__(kSmemAlign) unsigned char smem[];
  T* K_j = reinterpret_cast<T*>(smem + L.k_offset());
  T* V_j = reinterpret_cast<T*>(smem + L.v_offset());
  T* Q_i = reinterpret_cast<T*>(smem + L.q_offset());
  T* P_ij = reinterpret_cast<T*>(smem + L.p_offset());
  float* S_ij = reinterpret_cast<float*>(smem + L.s_offset());  // S_ij, later P~_ij V_j
  float* m_i = reinterpret_cast<float*>(smem + L.row_offset(0));
  float* l_i = reinterpret_cast<float*>(smem + L.row_offset(1));
  float* old_weight = reinterpret_cast<float*>(smem + L.row_offset(2));
  float* new_weight = reinterpret_cast<float*>(smem + L.row_offset(3));

  // this CTA's (batch, head); GQA: query head h reads key/value head h / group
  const int64_t bh = blockIdx.x;
  const int64_t bh_kv = bh / a.H * a.Hkv + bh % a.H / a.group;
  const T* Q_h = Q + bh * a.Nq * kHeadDim;
  const T* K_h = K + bh_kv * a.Nk * kHeadDim;
  const T* V_h = V + bh_kv * a.Nk * kHeadDim;
  float* O_hbm = O_acc + bh * a.Nq * kHeadDim;  // the fp32 O of Algorithm 1, in HBM
  float* l_hbm = l_acc + bh * a.Nq;
  float* m_hbm = m_acc + bh * a.Nq;

  // line 2: initialise O = (0), l = (0), m = (-inf) in HBM
  for (int64_t x = threadIdx.x; x < a.Nq * kVecsPerRow; x += kThreads)
    reinterpret_cast<float4*>(O_hbm)[x] = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int64_t r = threadIdx.x; r < a.Nq; r += kThreads) {
    l_hbm[r] = 0.f;
    m_hbm[r] = -INFINITY;
  }
  __syncthreads();

  // line 3: T_r = ceil(Nq / B_r) blocks of Q (and O, l, m), T_c = ceil(Nk / B_c) of K, V
  const int64_t T_r = (a.Nq + a.Br - 1) / a.Br, T_c = (a.Nk + a.Bc - 1) / a.Bc;
  for (int64_t j = 0; j < T_c; ++j) {  // line 5
    const int64_t j0 = j * a.Bc;
    // line 6: load K_j, V_j from HBM to on-chip SRAM
    load_rows<T, kHeadDim>(K_j, L.ld_qkv(), K_h, j0, a.Bc, a.Nk);
    load_rows<T, kHeadDim>(V_j, L.ld_qkv(), V_h, j0, a.Bc, a.Nk);
    __syncthreads();

    for (int64_t i = 0; i < T_r; ++i) {  // line 7
      const int64_t i0 = i * a.Br;
      const int rows = int(min(int64_t(a.Br), a.Nq - i0));  // rows of Q_i inside Nq
      if (key_end(a, i0 + rows - 1) <= j0) continue;        // causal: even the last row sees no key of K_j

      // line 8: load Q_i, l_i, m_i from HBM (O_i is read where line 12 uses it)
      load_rows<T, kHeadDim>(Q_i, L.ld_qkv(), Q_h, i0, a.Br, a.Nq);
      for (int r = threadIdx.x; r < rows; r += kThreads) {
        m_i[r] = m_hbm[i0 + r];
        l_i[r] = l_hbm[i0 + r];
      }
      __syncthreads();

      // line 9: S_ij = tau Q_i K_jᵀ
      gemm_tiles<T, nvcuda::wmma::col_major>(Q_i, L.ld_qkv(), K_j, L.ld_qkv(), S_ij, L.ld_s(), a.Br, a.Bc, kHeadDim,
                                              a.tau);
      __syncthreads();

      // lines 10, 11, 13: m~_ij, P~_ij, l~_ij; m_new, l_new; l_i, m_i written back
      softmax_rows(a, i0, j0, S_ij, L.ld_s(), P_ij, L.ld_p(), m_i, l_i, m_hbm, l_hbm, old_weight, new_weight);
      __syncthreads();

      // line 12, the product: P~_ij V_j, into the buffer that held S_ij
      gemm_tiles<T, nvcuda::wmma::row_major>(P_ij, L.ld_p(), V_j, L.ld_qkv(), S_ij, L.ld_s(), a.Br, kHeadDim, a.Bc,
                                              1.f);
      __syncthreads();

      // line 12, the update: O_i read, rescaled, written back to HBM
      update_O<kHeadDim>(O_hbm + i0 * kHeadDim, rows, S_ij, L.ld_s(), old_weight, new_weight);
      __syncthreads();
    }
  }

  // After the loops: O (normalised by line 12 at every step) in the output dtype, and the
  // logsumexp m + log l; a row that saw no key has l = 0: lse = -inf (O stayed 0).
  T* O_h = O + bh * a.Nq * kHeadDim;
  copy_in_flight(
      a.Nq * kVecsPerRow, [&](int64_t x) { return reinterpret_cast<const float4*>(O_hbm)[x]; },
      [&](int64_t x, float4 o) {
        T* out = O_h + x * kFloatsPerCopy;
        out[0] = from_float<T>(o.x);
        out[1] = from_float<T>(o.y);
        out[2] = from_float<T>(o.z);
        out[3] = from_float<T>(o.w);
      });
  if (lse != nullptr) {
    float* lse_h = lse + bh * a.Nq;
    for (int64_t r = threadIdx.x; r < a.Nq; r += kThreads)
      lse_h[r] = l_hbm[r] > 0.f ? m_hbm[r] + logf(l_hbm[r]) : -INFINITY;
  }
}

template <typename T, int kHeadDim>
void fa1_launch(const AttnProblem& p, const AttnTensors& t, Blocks blocks, cudaStream_t stream) {
  Args a;
  a.Nq = p.Nq;
  a.Nk = p.Nk;
  a.H = p.H;
  a.Hkv = p.Hkv;
  a.group = p.group();
  a.Br = blocks.Br;
  a.Bc = blocks.Bc;
  a.tau = p.softmax_scale();
  a.causal = p.causal;

  const size_t smem = SmemLayout{a.Br, a.Bc, kHeadDim, int(sizeof(T))}.bytes();
  auto kernel = fa1_kernel<T, kHeadDim>;
  allow_dynamic_smem(kernel, smem, "04_fa1_tiled (d = " + std::to_string(kHeadDim) + ", B_r = " +
                                       std::to_string(a.Br) + ", B_c = " + std::to_string(a.Bc) + ")");

  // workspace: O (fp32, [B,H,Nq,d]), then l, then m (fp32, [B,H,Nq])
  float* O_acc = static_cast<float*>(t.workspace);
  float* l_acc = O_acc + p.o_elems();
  float* m_acc = l_acc + p.lse_elems();
  const int64_t ctas = int64_t(p.B) * p.H;  // refuse() keeps this <= INT_MAX
  kernel<<<unsigned(ctas), kThreads, smem, stream>>>(static_cast<const T*>(t.q), static_cast<const T*>(t.k),
                                                     static_cast<const T*>(t.v), static_cast<T*>(t.o), t.lse, O_acc,
                                                     l_acc, m_acc, a);
  CUDA_CHECK_LAUNCH();
}

}  // namespace attn::fa1
