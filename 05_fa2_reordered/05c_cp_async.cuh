// Step 05c of rung 05 (README.md, 05c.md): 05b with the K/V tiles copied by cp.async into a
// ring of kStages (K_j, V_j) buffers, so that block j + kStages - 1 is on its way from global
// memory while block j computes. Everything else is 05b: one CTA per (Q block i, head h,
// batch b), warps split Q_i's rows, O_i, m_i, l_i in registers, fragments by ldmatrix from
// the swizzled layout, O_i rescaled after every block, a plain grid order.
//
// cp.async (ptx.cuh) copies 16 bytes global -> shared without passing through registers;
// a thread groups its copies (commit) and later waits until at most n groups are in flight
// (wait_group n). With kStages = 2 the loop body is:
//
//   wait for block j's group; __syncthreads      (K_j, V_j landed; block j-1's buffers free)
//   issue block j+1's copies into the free buffer (in flight during the math below)
//   S_ij = Q_i K_j^T, softmax, O_i += P_ij V_j
//
// 05d (05d_fa2_reordered.cuh) adds the causal tile order and lazy rescaling.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "05_fa2_reordered/fa2_steps.h"
#include "05_fa2_reordered/ptx.cuh"
#include "common/check.h"
#include "common/smem_limit.h"
#include "common/stage.h"

namespace attn::fa2::step_c {

template <typename T>
struct Params {
  const T* q;   // [B, H, Nq, d]
  const T* k;   // [B, Hkv, Nk, d]
  const T* v;   // [B, Hkv, Nk, d]
  T* o;         // [B, H, Nq, d]
  float* lse;   // [B, H, Nq] or null
  int H, Hkv, group, Nq, Nk;
  int T_r;           // Q blocks per head
  bool causal;
  float scale;       // softmax scale
  float scale_log2;  // scale * log2(e): exp(scale * x) = exp2(scale_log2 * x)
};

constexpr unsigned kFullWarp = 0xffffffffu;

// One lane's ldmatrix row in a tile: the shared address of its 16-byte chunk (row, chunk),
// chunk 0 or 1, as stored. Every fragment the lane loads sits a multiple of 8 rows and of 16
// columns (2 chunks) away (fa2_tiles.h: frag_addr).
template <class Cfg, typename T>
__device__ __forceinline__ uint32_t lane_row(const T* tile, int row, int chunk) {
  return ptx::smem_u32(tile + tile_offset<Cfg>(row, chunk));
}

// cp.async rows [first_row, first_row + kRows) of a [n_rows, D] matrix into a tile;
// rows past n_rows are zero-filled and never read from global memory. Thread t copies chunk
// t % (D/8) of rows t / (D/8) + k * (threads / (D/8)), so a warp copies whole 128-byte pieces
// of rows.
template <class Cfg, int kRows, typename T>
__device__ __forceinline__ void load_tile(T* tile, const T* src, int first_row, int n_rows) {
  constexpr int kChunksPerRow = Cfg::kD / kChunkElems;
  constexpr int kRowsPerPass = Cfg::kThreads / kChunksPerRow;
  static_assert(Cfg::kThreads % kChunksPerRow == 0 && kRows % kRowsPerPass == 0, "tile splits evenly over threads");
  const int r0 = threadIdx.x / kChunksPerRow, chunk = threadIdx.x % kChunksPerRow;
  // One base plus constant offsets when a pass covers whole swizzle periods (the rows of a
  // thread keep their swizzle; 05c's tiles, d = 64 and 128, always do). The other branch is
  // 05d's, where d = 256's 4 rows per pass alternate between two swizzles.
  const uint32_t dst0 = ptx::smem_u32(tile + tile_offset<Cfg>(r0, chunk));
  auto dst = [&](int pass) {
    if constexpr (kRowsPerPass % Cfg::Layout::kRowPeriod != 0)
      return ptx::smem_u32(tile) + tile_offset<Cfg>(r0 + pass * kRowsPerPass, chunk) * Cfg::kElemBytes;
    return dst0 + pass * kRowsPerPass * Cfg::kStride * Cfg::kElemBytes;
  };
  if (first_row + kRows <= n_rows) {  // the whole tile is inside the matrix: no row checks
    const T* g = src + int64_t(first_row + r0) * Cfg::kD + chunk * kChunkElems;
#pragma unroll
    for (int pass = 0; pass < kRows / kRowsPerPass; ++pass)
      ptx::cp_async_16(dst(pass), g + pass * kRowsPerPass * Cfg::kD, true);
  } else {  // the ragged last tile
#pragma unroll
    for (int pass = 0; pass < kRows / kRowsPerPass; ++pass) {
      const int row = first_row + r0 + pass * kRowsPerPass;
      const bool valid = row < n_rows;
      ptx::cp_async_16(dst(pass), src + (valid ? int64_t(row) * Cfg::kD + chunk * kChunkElems : 0), valid);
    }
  }
}

// Per-warp register tiles: kM 16-row mma tiles of this warp's rows; S_ij has kWarpKeys / 8
// key tiles (all B_c keys), O_i d / 8 column tiles.
template <class Cfg>
struct Frag {
  static constexpr int kM = Cfg::kWarpRows / 16;
  static constexpr int kS = Cfg::kWarpKeys / 8;
  static constexpr int kO = Cfg::kD / 8;
  static_assert(Cfg::kWarpRows % 16 == 0, "each warp owns whole 16-row mma tiles");
  static_assert(Cfg::kWarpKeys % 16 == 0, "each warp reads whole 16-key mma steps of K_j, V_j");
};

// The first of warp w's kWarpRows rows of Q_i (and of S_ij, P_ij, O_i).
template <class Cfg>
__device__ __forceinline__ int warp_first_row(int warp) {
  return warp * Cfg::kWarpRows;
}

// S_ij = Q_i K_j^T for this warp's rows, from row warp_row0 of sQ, and its keys, the first
// kWarpKeys rows of sK (Algorithm 1, line 8), fp32 in C fragments.
template <typename T, class Cfg>
__device__ __forceinline__ void qk_tile(float (&S_ij)[Frag<Cfg>::kM][Frag<Cfg>::kS][4], const T* sQ, const T* sK,
                                        int warp_row0, int lane) {
  constexpr int D = Cfg::kD;
  // A = Q_i rows: matrices (rows 0-7 | 8-15) x (chunk 2kk | 2kk+1) -> lane row l % 16, chunk l / 16.
  const uint32_t q_base = lane_row<Cfg>(sQ, warp_row0 + lane % 16, lane / 16);
  // B = K_j^T: K_j rows are B's columns, so no transpose. Matrices (keys 0-7, chunk 2kk),
  // (keys 0-7, 2kk+1), (keys 8-15, 2kk), (keys 8-15, 2kk+1) -> key l % 8 + 8 (l / 16), chunk (l / 8) % 2.
  const uint32_t k_base = lane_row<Cfg>(sK, lane % 8 + (lane / 16) * 8, (lane / 8) % 2);
#pragma unroll
  for (int mt = 0; mt < Frag<Cfg>::kM; ++mt)
#pragma unroll
    for (int nt = 0; nt < Frag<Cfg>::kS; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) S_ij[mt][nt][e] = 0.f;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    // A = Q_i[16 rows, d 16kk..16kk+15], B = K_j^T[d 16kk..16kk+15, 16 keys]
    uint32_t a[Frag<Cfg>::kM][4];
#pragma unroll
    for (int mt = 0; mt < Frag<Cfg>::kM; ++mt) ptx::ldmatrix_x4(a[mt], frag_addr<Cfg>(q_base, mt * 16, kk));
#pragma unroll
    for (int np = 0; np < Cfg::kWarpKeys / 16; ++np) {
      uint32_t b[4];
      ptx::ldmatrix_x4(b, frag_addr<Cfg>(k_base, np * 16, kk));
#pragma unroll
      for (int mt = 0; mt < Frag<Cfg>::kM; ++mt) {
        ptx::mma_16816<T>(S_ij[mt][2 * np], a[mt], b[0], b[1]);
        ptx::mma_16816<T>(S_ij[mt][2 * np + 1], a[mt], b[2], b[3]);
      }
    }
  }
}

// Only for blocks that cross the causal diagonal or the ragged end of K: S = -inf where
// key > last visible key of the row (bottom-right aligned: row r sees keys <= r + Nk - Nq).
template <typename T, class Cfg>
__device__ __forceinline__ void mask_tile(float (&S_ij)[Frag<Cfg>::kM][Frag<Cfg>::kS][4], const Params<T>& p,
                                          int warp_row0, int key0, int lane) {
#pragma unroll
  for (int mt = 0; mt < Frag<Cfg>::kM; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = warp_row0 + mt * 16 + lane / 4 + 8 * half;
      const int last_key = p.causal ? min(p.Nk - 1, row + (p.Nk - p.Nq)) : p.Nk - 1;
#pragma unroll
      for (int nt = 0; nt < Frag<Cfg>::kS; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e)
          if (key0 + nt * 8 + 2 * (lane % 4) + e > last_key) S_ij[mt][nt][2 * half + e] = -INFINITY;
    }
}

// max(init, this warp's keys of row `half` of 16-row tile mt of S_ij): this thread's columns,
// then the 4 lanes that hold the row.
template <class Cfg>
__device__ __forceinline__ float quad_row_max(const float (&S_ij)[Frag<Cfg>::kM][Frag<Cfg>::kS][4], int mt, int half,
                                              float init) {
  float row_max = init;
#pragma unroll
  for (int nt = 0; nt < Frag<Cfg>::kS; ++nt)
    row_max = fmaxf(row_max, fmaxf(S_ij[mt][nt][2 * half], S_ij[mt][nt][2 * half + 1]));
  row_max = fmaxf(row_max, __shfl_xor_sync(kFullWarp, row_max, 1));  // the 4 lanes of a row
  return fmaxf(row_max, __shfl_xor_sync(kFullWarp, row_max, 2));
}

// m * scale_log2, the exponent's offset for a row whose max is m. In a masked block a row
// may have seen no key yet (m = -inf): 0 then, so that P = 0, not NaN. In an unmasked block
// every row sees every key, so m is finite.
template <bool kMasked>
__device__ __forceinline__ float scaled_max(float row_max, float scale_log2) {
  return (kMasked && row_max == -INFINITY) ? 0.f : row_max * scale_log2;
}

// P_ij = exp(S_ij - m_i) for row `half` of 16-row tile mt, in place, as exp2 with scale *
// log2(e) folded into one FFMA; returns this thread's part of rowsum(P_ij) (its 2 columns of
// each key tile).
template <class Cfg>
__device__ __forceinline__ float exp_row(float (&S_ij)[Frag<Cfg>::kM][Frag<Cfg>::kS][4], int mt, int half,
                                         float max_scaled, float scale_log2) {
  float row_sum = 0.f;
#pragma unroll
  for (int nt = 0; nt < Frag<Cfg>::kS; ++nt)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const float p = exp2_approx(fmaf(S_ij[mt][nt][2 * half + e], scale_log2, -max_scaled));
      S_ij[mt][nt][2 * half + e] = p;
      row_sum += p;
    }
  return row_sum;
}

// Algorithm 1, lines 9-10 for row `half` of 16-row tile mt, given m_i^(j) = row_max =
// max(m_i^(j-1), rowmax(S_ij)): P_ij = exp(S_ij - m_i^(j)),
// l_i^(j) = e^(m_i^(j-1) - m_i^(j)) l_i^(j-1) + rowsum(P_ij), O_i *= e^(m_i^(j-1) - m_i^(j)).
// P_ij overwrites S_ij. Delayed normalization: O_i is not divided by l_i here, and l_i is
// this thread's partial row sum; the 4 lanes of a row add theirs once, after the loop.
template <class Cfg, bool kMasked>
__device__ __forceinline__ void softmax_row(float (&S_ij)[Frag<Cfg>::kM][Frag<Cfg>::kS][4],
                                            float (&O_i)[Frag<Cfg>::kM][Frag<Cfg>::kO][4],
                                            float (&m_i)[Frag<Cfg>::kM][2], float (&l_i)[Frag<Cfg>::kM][2], int mt,
                                            int half, float row_max, float scale_log2, bool rescale_o) {
  const float max_scaled = scaled_max<kMasked>(row_max, scale_log2);
  // e^(m_old - m_new); 0 if m_old = -inf; 1 when no max of the warp moved
  const float alpha = rescale_o ? exp2_approx(m_i[mt][half] * scale_log2 - max_scaled) : 1.f;
  m_i[mt][half] = row_max;
  const float row_sum = exp_row<Cfg>(S_ij, mt, half, max_scaled, scale_log2);
  l_i[mt][half] = alpha * l_i[mt][half] + row_sum;
  if (rescale_o)
#pragma unroll
    for (int dt = 0; dt < Frag<Cfg>::kO; ++dt)
#pragma unroll
      for (int e = 0; e < 2; ++e) O_i[mt][dt][2 * half + e] *= alpha;
}

// Algorithm 1, lines 9-10 for all of this warp's rows: every row's max first, then each
// row's exponentials, sum and O_i rescale (softmax_row).
//
// O_i is rescaled after every block in which some row max of the warp moved, as FA2's
// Algorithm 1 does (where none moved, every alpha is 1: the warp skips the multiplies).
template <class Cfg, bool kMasked>
__device__ __forceinline__ void online_softmax(float (&S_ij)[Frag<Cfg>::kM][Frag<Cfg>::kS][4],
                                               float (&O_i)[Frag<Cfg>::kM][Frag<Cfg>::kO][4],
                                               float (&m_i)[Frag<Cfg>::kM][2], float (&l_i)[Frag<Cfg>::kM][2],
                                               float scale_log2) {
  float row_max[Frag<Cfg>::kM][2];  // max(m_i, rowmax(S_ij))
  bool grew = false;
#pragma unroll
  for (int mt = 0; mt < Frag<Cfg>::kM; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      row_max[mt][half] = quad_row_max<Cfg>(S_ij, mt, half, m_i[mt][half]);
      grew |= row_max[mt][half] > m_i[mt][half];  // -inf > -inf: false
    }
  const bool moved = __any_sync(kFullWarp, grew);
#pragma unroll
  for (int mt = 0; mt < Frag<Cfg>::kM; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half)
      softmax_row<Cfg, kMasked>(S_ij, O_i, m_i, l_i, mt, half, moved ? row_max[mt][half] : m_i[mt][half],
                                scale_log2, moved);
}

// P_ij (fp32, C fragments) -> bf16/fp16 A fragments of the PV product, one per 16-key step
// (see the fragment map above): the S_ij registers die here, halving what PV keeps live.
template <typename T, class Cfg>
__device__ __forceinline__ void pack_p(uint32_t (&P_ij)[Frag<Cfg>::kM][Cfg::kWarpKeys / 16][4],
                                       const float (&S_ij)[Frag<Cfg>::kM][Frag<Cfg>::kS][4]) {
#pragma unroll
  for (int mt = 0; mt < Frag<Cfg>::kM; ++mt)
#pragma unroll
    for (int kk = 0; kk < Cfg::kWarpKeys / 16; ++kk) {
      P_ij[mt][kk][0] = pack2<T>(S_ij[mt][2 * kk][0], S_ij[mt][2 * kk][1]);
      P_ij[mt][kk][1] = pack2<T>(S_ij[mt][2 * kk][2], S_ij[mt][2 * kk][3]);
      P_ij[mt][kk][2] = pack2<T>(S_ij[mt][2 * kk + 1][0], S_ij[mt][2 * kk + 1][1]);
      P_ij[mt][kk][3] = pack2<T>(S_ij[mt][2 * kk + 1][2], S_ij[mt][2 * kk + 1][3]);
    }
}

// O_i += P_ij V_j (Algorithm 1, line 10), P_ij from registers; this warp's keys are the
// first kWarpKeys rows of sV.
template <typename T, class Cfg>
__device__ __forceinline__ void pv_tile(float (&O_i)[Frag<Cfg>::kM][Frag<Cfg>::kO][4],
                                        const uint32_t (&P_ij)[Frag<Cfg>::kM][Cfg::kWarpKeys / 16][4], const T* sV,
                                        int lane) {
  constexpr int D = Cfg::kD;
  // V_j rows are B's k index, so transpose on load. Matrices (keys 0-7, chunk 2dp),
  // (keys 8-15, 2dp), (keys 0-7, 2dp+1), (keys 8-15, 2dp+1) -> key l % 16, chunk l / 16.
  const uint32_t v_base = lane_row<Cfg>(sV, lane % 16, lane / 16);
#pragma unroll
  for (int kk = 0; kk < Cfg::kWarpKeys / 16; ++kk)
#pragma unroll
    for (int dp = 0; dp < D / 16; ++dp) {
      uint32_t b[4];  // B = V_j[keys 16kk.., d 16dp..]
      ptx::ldmatrix_x4_trans(b, frag_addr<Cfg>(v_base, kk * 16, dp));
#pragma unroll
      for (int mt = 0; mt < Frag<Cfg>::kM; ++mt) {
        ptx::mma_16816<T>(O_i[mt][2 * dp], P_ij[mt][kk], b[0], b[1]);
        ptx::mma_16816<T>(O_i[mt][2 * dp + 1], P_ij[mt][kk], b[2], b[3]);
      }
    }
}

// Algorithm 1, lines 12, 13 and 15: l_i = the 4 lanes' partial sums, O_i = diag(l_i)^-1 O_i,
// L_i = m_i + log(l_i), written for this warp's rows (from warp_row0 of Q block row0).
template <typename T, class Cfg>
__device__ __forceinline__ void normalize_output(float (&O_i)[Frag<Cfg>::kM][Frag<Cfg>::kO][4],
                                                 const float (&m_i)[Frag<Cfg>::kM][2],
                                                 const float (&l_i)[Frag<Cfg>::kM][2], const Params<T>& p, int bh,
                                                 int row0, int warp_row0, int lane) {
  float* L = p.lse ? p.lse + int64_t(bh) * p.Nq : nullptr;
#pragma unroll
  for (int mt = 0; mt < Frag<Cfg>::kM; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float l = l_i[mt][half];
      l += __shfl_xor_sync(kFullWarp, l, 1);  // the 4 lanes' partial sums of the row
      l += __shfl_xor_sync(kFullWarp, l, 2);
      const int row = row0 + warp_row0 + mt * 16 + lane / 4 + 8 * half;
      if (L && lane % 4 == 0 && row < p.Nq) L[row] = l > 0.f ? m_i[mt][half] * p.scale + logf(l) : -INFINITY;
      const float inv_l = l > 0.f ? 1.f / l : 0.f;  // a row that sees no key: O = 0
#pragma unroll
      for (int dt = 0; dt < Frag<Cfg>::kO; ++dt)
#pragma unroll
        for (int e = 0; e < 2; ++e) O_i[mt][dt][2 * half + e] *= inv_l;
    }
}

// Algorithm 1, line 14: write this warp's rows of O_i. They go through the warp's own rows
// of sQ (no other warp reads them) so that global stores are whole 16-byte chunks of a row.
template <typename T, class Cfg>
__device__ __forceinline__ void store_output(const float (&O_i)[Frag<Cfg>::kM][Frag<Cfg>::kO][4], T* sQ,
                                             const Params<T>& p, int bh, int row0, int warp_row0, int lane) {
  constexpr int D = Cfg::kD;
  T* O = p.o + int64_t(bh) * p.Nq * D;  // this head's [Nq, D] output
  __syncwarp();  // every lane's last ldmatrix of its Q rows is done before they are overwritten
#pragma unroll
  for (int mt = 0; mt < Frag<Cfg>::kM; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half)
#pragma unroll
      for (int dt = 0; dt < Frag<Cfg>::kO; ++dt) {
        const int r = warp_row0 + mt * 16 + lane / 4 + 8 * half;
        *reinterpret_cast<uint32_t*>(sQ + tile_offset<Cfg>(r, dt) + 2 * (lane % 4)) =
            pack2<T>(O_i[mt][dt][2 * half], O_i[mt][dt][2 * half + 1]);
      }
  __syncwarp();
  constexpr int kChunksPerRow = D / kChunkElems;
  constexpr int kRowsPerPass = 32 / kChunksPerRow;
  const int chunk = lane % kChunksPerRow;
#pragma unroll
  for (int pass = 0; pass < Cfg::kWarpRows / kRowsPerPass; ++pass) {
    const int r = warp_row0 + lane / kChunksPerRow + pass * kRowsPerPass;
    if (row0 + r < p.Nq)
      *reinterpret_cast<uint4*>(O + int64_t(row0 + r) * D + chunk * kChunkElems) =
          *reinterpret_cast<const uint4*>(sQ + tile_offset<Cfg>(r, chunk));
  }
}

// The K/V blocks Q block i needs, [0, T_c), and how many of them, from the first, need no
// mask. Causal: row r sees keys <= r + (Nk - Nq), so the last row bounds the loop (later
// blocks are skipped) and the first row says which blocks are fully visible.
struct KvRange {
  int T_c;
  int unmasked_blocks;
};
template <int B_r, int B_c, class P>  // P: Params, or the backward's BwdParams (its dQ pass)
__device__ __forceinline__ KvRange kv_range(const P& p, int row0) {
  const int last_row = min(row0 + B_r, p.Nq) - 1;
  int keys = p.Nk;
  int unmasked_blocks = p.Nk / B_c;  // blocks wholly inside [0, Nk)
  if (p.causal) {
    keys = max(0, min(p.Nk, last_row + (p.Nk - p.Nq) + 1));
    unmasked_blocks = min(unmasked_blocks, max(0, row0 + (p.Nk - p.Nq) + 1) / B_c);
  }
  return {(keys + B_c - 1) / B_c, unmasked_blocks};
}

// One Q block i of head bh: Algorithm 1, lines 4-15.
template <typename T, class Cfg>
__device__ __forceinline__ void attend_q_block(const Params<T>& p, T* sQ, T* sK, T* sV, int bh, int i) {
  constexpr int D = Cfg::kD, B_r = Cfg::kBr, B_c = Cfg::kBc, kStages = Cfg::kStages;
  constexpr int kTileKV = B_c * Cfg::kStride;  // elements per K or V tile
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int b = bh / p.H, h = bh % p.H, h_kv = h / p.group;
  const T* Q = p.q + int64_t(bh) * p.Nq * D;
  const T* K = p.k + (int64_t(b) * p.Hkv + h_kv) * p.Nk * D;
  const T* V = p.v + (int64_t(b) * p.Hkv + h_kv) * p.Nk * D;
  const int row0 = i * B_r;
  const KvRange kv = kv_range<B_r, B_c>(p, row0);

  float O_i[Frag<Cfg>::kM][Frag<Cfg>::kO][4];  // Algorithm 1, line 5: O_i = 0, l_i = 0, m_i = -inf
  float m_i[Frag<Cfg>::kM][2], l_i[Frag<Cfg>::kM][2];  // rows g and g + 8 of each 16-row tile
#pragma unroll
  for (int mt = 0; mt < Frag<Cfg>::kM; ++mt) {
#pragma unroll
    for (int dt = 0; dt < Frag<Cfg>::kO; ++dt)
#pragma unroll
      for (int e = 0; e < 4; ++e) O_i[mt][dt][e] = 0.f;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      m_i[mt][half] = -INFINITY;
      l_i[mt][half] = 0.f;
    }
  }

  // A ring of kStages (K, V) buffers: block j + kStages - 1 is loaded while block j computes.
  // Each block's copies are one cp.async group; the first kStages - 1 are issued here.
  auto load_kv = [&](T* dst, const T* src, int block) { load_tile<Cfg, B_c>(dst, src, block * B_c, p.Nk); };
  if (kv.T_c > 0) {  // line 4: load Q_i; and the first blocks of K, V
    load_tile<Cfg, B_r>(sQ, Q, row0, p.Nq);
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      if (s < kv.T_c) {
        load_kv(sK + s * kTileKV, K, s);
        load_kv(sV + s * kTileKV, V, s);
      }
      ptx::cp_async_commit();  // an empty group past T_c keeps the count that wait_group expects
    }
  }

  for (int j = 0; j < kv.T_c; ++j) {  // line 6: for j = 1 .. T_c
    ptx::cp_async_wait<kStages - 2>();  // line 7: wait for K_j, V_j (later blocks may still fly)
    __syncthreads();  // K_j, V_j landed for every thread's copies; block j-1's buffers are free
    const int next = j + kStages - 1;
    if (next < kv.T_c) {  // K, V of block next, while block j computes
      load_kv(sK + (next % kStages) * kTileKV, K, next);
      load_kv(sV + (next % kStages) * kTileKV, V, next);
    }
    ptx::cp_async_commit();
    const T* K_j = sK + (j % kStages) * kTileKV;
    const T* V_j = sV + (j % kStages) * kTileKV;

    float S_ij[Frag<Cfg>::kM][Frag<Cfg>::kS][4];
    qk_tile<T, Cfg>(S_ij, sQ, K_j, warp_first_row<Cfg>(warp), lane);  // line 8: S_ij = Q_i K_j^T
    if (j < kv.unmasked_blocks) {  // lines 9-10: m_i, P_ij, l_i, O_i rescaled
      online_softmax<Cfg, false>(S_ij, O_i, m_i, l_i, p.scale_log2);
    } else {  // block crosses the causal diagonal or the end of K
      mask_tile<T, Cfg>(S_ij, p, row0 + warp_first_row<Cfg>(warp), j * B_c, lane);
      online_softmax<Cfg, true>(S_ij, O_i, m_i, l_i, p.scale_log2);
    }
    uint32_t P_ij[Frag<Cfg>::kM][Cfg::kWarpKeys / 16][4];
    pack_p<T, Cfg>(P_ij, S_ij);
    pv_tile<T, Cfg>(O_i, P_ij, V_j, lane);  // line 10: O_i += P_ij V_j
  }

  normalize_output<T, Cfg>(O_i, m_i, l_i, p, bh, row0, warp_first_row<Cfg>(warp), lane);  // lines 12, 13, 15
  store_output<T, Cfg>(O_i, sQ, p, bh, row0, warp_first_row<Cfg>(warp), lane);            // line 14
}

// The tiles in dynamic shared memory, from `smem`: Q_i [B_r, kStride], then kStages x K_j
// and kStages x V_j [B_c, kStride].
template <typename T>
struct SmemTiles {
  T* sQ;
  T* sK;
  T* sV;
};
template <typename T, class Cfg>
__device__ __forceinline__ SmemTiles<T> smem_tiles(unsigned char* smem) {
  T* sQ = reinterpret_cast<T*>(smem);
  T* sK = sQ + Cfg::kBr * Cfg::kStride;
  T* sV = sK + Cfg::kStages * Cfg::kBc * Cfg::kStride;
  return {sQ, sK, sV};
}

template <typename T, class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads) fa2_forward_kernel(const Params<T> p) {
  extern __shared__ __align__(16) unsigned char smem_raw[];  // cp.async and ldmatrix move 16-byte chunks
  // Swizzled tiles start on 128-byte lines (tile_offset); kSmemBytes has room for the shift.
  constexpr int kAlign = Cfg::Layout::kAlign;
  const SmemTiles<T> s = smem_tiles<T, Cfg>(smem_raw + (kAlign - ptx::smem_u32(smem_raw) % kAlign) % kAlign);
  // One CTA per (head, Q block): the grid over the sequence that FA2's loop order makes
  // possible, in plain order: CTA x takes Q block x % T_r of head x / T_r.
  const int bh = int(blockIdx.x) / p.T_r, i = int(blockIdx.x) % p.T_r;
  attend_q_block<T, Cfg>(p, s.sQ, s.sK, s.sV, bh, i);
}

// The kernel's parameters for problem p (pointers 16-byte aligned: validate_tensors).
template <typename T, class Cfg>
Params<T> make_params(const AttnProblem& p, const AttnTensors& t) {
  Params<T> prm;
  prm.q = static_cast<const T*>(t.q);
  prm.k = static_cast<const T*>(t.k);
  prm.v = static_cast<const T*>(t.v);
  prm.o = static_cast<T*>(t.o);
  prm.lse = t.lse;
  prm.H = p.H;
  prm.Hkv = p.Hkv;
  prm.group = p.group();
  prm.Nq = p.Nq;
  prm.Nk = p.Nk;
  prm.T_r = static_cast<int>((int64_t(p.Nq) + Cfg::kBr - 1) / Cfg::kBr);
  prm.causal = p.causal;
  prm.scale = p.softmax_scale();
  prm.scale_log2 = prm.scale * static_cast<float>(M_LOG2E);
  return prm;
}

// Lets `kernel` use Cfg's shared memory; throws, naming both numbers, where this GPU has
// less per block (common/smem_limit.h).
template <class Cfg, class Kernel>
void allow_smem(Kernel kernel) {
  allow_dynamic_smem(kernel, Cfg::kSmemBytes, "05c_cp_async: the d = " + std::to_string(Cfg::kD) + " tile");
}

template <typename T, int kD>
void launch_fa2(const AttnProblem& p, const AttnTensors& t, cudaStream_t stream) {
  using Cfg = TileFor<kD>;
  const Params<T> prm = make_params<T, Cfg>(p, t);
  auto kernel = fa2_forward_kernel<T, Cfg>;
  allow_smem<Cfg>(kernel);
  const int64_t ctas = int64_t(p.B) * p.H * prm.T_r;  // Stage::refuse: <= INT_MAX
  kernel<<<static_cast<unsigned>(ctas), Cfg::kThreads, Cfg::kSmemBytes, stream>>>(prm);
  CUDA_CHECK_LAUNCH();
}

}  // namespace attn::fa2::step_c
