// Step 05a of rung 05 (README.md, 05a.md): FlashAttention-2's loop order (Dao 2023,
// Algorithm 1). One CTA per (Q block i, head h, batch b); the CTA loops over the K/V blocks
// j, keeping O_i, m_i and l_i in registers, and divides by l_i once, after the loop. Tiles
// are loaded synchronously into one K and one V buffer of padded rows (d + 8 elements), and
// the mma fragments are read with plain 32-bit shared loads.
//
// Work split inside a CTA (B_r = 64, 4 warps: fa2_steps.h, StepTile): warp w owns B_r/4
// rows of Q_i, hence the same rows of S_ij, P_ij and O_i. It reads all of K_j and V_j from
// shared memory, so no warp ever needs another warp's partial results (no shared-memory
// reduction).
//
//            K_j^T (B_c keys)            V_j (d columns)
//          +----------------+          +----------------+
//   warp 0 | S_ij rows 0-15 |  -> P -> | O_i rows 0-15  |
//   warp 1 | rows 16-31     |          | rows 16-31     |
//   warp 2 | rows 32-47     |          | rows 32-47     |
//   warp 3 | rows 48-63     |          | rows 48-63     |
//          +----------------+          +----------------+
//
// mma.sync m16n8k16 fragments (g = lane / 4, t = lane % 4; each register holds two
// consecutive columns, the lower one in the low half):
//
//   A (16x16, Q or P)        B (16x8, K^T or V)       C (16x8 fp32, S or O)
//   a0: row g,   cols 2t..   b0: k 2t..,   col g      c0,c1: row g,   cols 2t, 2t+1
//   a1: row g+8, cols 2t..   b1: k 2t+8.., col g      c2,c3: row g+8, cols 2t, 2t+1
//   a2: row g,   cols 2t+8..
//   a3: row g+8, cols 2t+8..
//
// A register of Q_i (row g, d 2t, 2t+1) or of K_j^T (key g, d 2t, 2t+1) is two neighbours
// of one row: one 32-bit load. One of V_j (keys 2t, 2t+1, column g) is two rows apart: two
// 16-bit loads, packed. With rows of d + 8 elements, row r's 32-bit word w sits in bank
// (4r + w) mod 32 (d a multiple of 64), so the 8 rows x 4 words a warp reads hit 32 banks.
//
// Why P never leaves registers: the C fragments of two neighbouring 8-key tiles of S_ij
// (keys 16k..16k+7 and 16k+8..16k+15) hold exactly the elements that the A fragment of
// the 16-key step k of P_ij V_j needs, in the same lanes:
//
//   S tile 2k   : c0,c1 (row g, keys 2t..)  -> a0      c2,c3 (row g+8, keys 2t..) -> a1
//   S tile 2k+1 : c0,c1 (row g, keys 8+2t..) -> a2     c2,c3 (row g+8, keys 8+2t..) -> a3
//
// so P_ij becomes the A operand by packing pairs of fp32 into bf16x2/fp16x2 in place.
//
// 05b (05b_ldmatrix.cuh) reads the fragments with ldmatrix from XOR-swizzled rows.
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

namespace attn::fa2::step_a {

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

// The two elements `rows` rows and `cols` columns past a lane's element `lane` of a tile of
// padded rows (its columns c, c + 1), as one 32-bit register, the lower column in the low
// half as mma expects. Every fragment of a lane is its own element plus such an offset, a
// compile-time constant in the unrolled loops.
template <class Cfg, typename T>
__device__ __forceinline__ uint32_t ld_pair(const T* lane, int rows, int cols) {
  return *reinterpret_cast<const uint32_t*>(lane + rows * Cfg::kStride + cols);
}
// The same column of two neighbouring rows (`rows` and rows + 1 past the lane's), packed the
// same way: a register of V_j's B fragment.
template <class Cfg, typename T>
__device__ __forceinline__ uint32_t ld_column_pair(const T* lane, int rows, int cols) {
  const uint32_t lo = *reinterpret_cast<const uint16_t*>(lane + rows * Cfg::kStride + cols);
  const uint32_t hi = *reinterpret_cast<const uint16_t*>(lane + (rows + 1) * Cfg::kStride + cols);
  return lo | hi << 16;
}

// Copy rows [first_row, first_row + kRows) of a [n_rows, D] matrix into a tile, through
// registers: a 16-byte global load, then a 16-byte shared store, per pass. Rows past n_rows
// are zero-filled and never read from global memory. Thread t copies chunk t % (D/8) of rows
// t / (D/8) + k * (threads / (D/8)), so a warp copies whole 128-byte pieces of rows. The
// caller's __syncthreads makes the tile visible to the other warps.
template <class Cfg, int kRows, typename T>
__device__ __forceinline__ void load_tile(T* tile, const T* src, int first_row, int n_rows) {
  constexpr int kChunksPerRow = Cfg::kD / kChunkElems;
  constexpr int kRowsPerPass = Cfg::kThreads / kChunksPerRow;
  static_assert(Cfg::kThreads % kChunksPerRow == 0 && kRows % kRowsPerPass == 0, "tile splits evenly over threads");
  const int r0 = threadIdx.x / kChunksPerRow, chunk = threadIdx.x % kChunksPerRow;
#pragma unroll
  for (int pass = 0; pass < kRows / kRowsPerPass; ++pass) {
    const int row = first_row + r0 + pass * kRowsPerPass;
    *reinterpret_cast<uint4*>(tile + tile_offset<Cfg>(r0 + pass * kRowsPerPass, chunk)) =
        row < n_rows ? *reinterpret_cast<const uint4*>(src + int64_t(row) * Cfg::kD + chunk * kChunkElems)
                     : make_uint4(0, 0, 0, 0);
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
  // A = Q_i: lane (g, t) starts at row g, column 2t of this warp's rows; B = K_j^T: at key g, d 2t.
  const T* q_lane = sQ + (warp_row0 + lane / 4) * Cfg::kStride + 2 * (lane % 4);
  const T* k_lane = sK + (lane / 4) * Cfg::kStride + 2 * (lane % 4);
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
    for (int mt = 0; mt < Frag<Cfg>::kM; ++mt) {
      a[mt][0] = ld_pair<Cfg>(q_lane, mt * 16, kk * 16);          // row g,   cols 2t..
      a[mt][1] = ld_pair<Cfg>(q_lane, mt * 16 + 8, kk * 16);      // row g+8, cols 2t..
      a[mt][2] = ld_pair<Cfg>(q_lane, mt * 16, kk * 16 + 8);      // row g,   cols 2t+8..
      a[mt][3] = ld_pair<Cfg>(q_lane, mt * 16 + 8, kk * 16 + 8);  // row g+8, cols 2t+8..
    }
#pragma unroll
    for (int np = 0; np < Cfg::kWarpKeys / 16; ++np) {
      // B = K_j^T: K_j's rows are B's columns (key g), its columns B's k (d 2t..): no transpose.
      // b[0], b[1]: keys 16np + g, for k 2t.. and 2t+8..; b[2], b[3]: keys 16np + 8 + g.
      uint32_t b[4];
      b[0] = ld_pair<Cfg>(k_lane, np * 16, kk * 16);
      b[1] = ld_pair<Cfg>(k_lane, np * 16, kk * 16 + 8);
      b[2] = ld_pair<Cfg>(k_lane, np * 16 + 8, kk * 16);
      b[3] = ld_pair<Cfg>(k_lane, np * 16 + 8, kk * 16 + 8);
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
  const T* v_lane = sV + 2 * (lane % 4) * Cfg::kStride + lane / 4;  // key 2t, column g
#pragma unroll
  for (int kk = 0; kk < Cfg::kWarpKeys / 16; ++kk)
#pragma unroll
    for (int dp = 0; dp < D / 16; ++dp) {
      // B = V_j[keys 16kk.., d 16dp..]: V_j's rows are B's k index, so a register holds two
      // rows (keys 2t, 2t+1) of one column. b[0], b[1]: column 16dp + g, keys 2t.. and 2t+8..;
      // b[2], b[3]: column 16dp + 8 + g.
      uint32_t b[4];
      b[0] = ld_column_pair<Cfg>(v_lane, kk * 16, dp * 16);
      b[1] = ld_column_pair<Cfg>(v_lane, kk * 16 + 8, dp * 16);
      b[2] = ld_column_pair<Cfg>(v_lane, kk * 16, dp * 16 + 8);
      b[3] = ld_column_pair<Cfg>(v_lane, kk * 16 + 8, dp * 16 + 8);
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
  __syncwarp();  // every lane's last load of its Q rows is done before they are overwritten
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
  constexpr int D = Cfg::kD, B_r = Cfg::kBr, B_c = Cfg::kBc;
  static_assert(Cfg::kStages == 1, "one K and one V buffer");
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

  // One K and one V buffer, loaded synchronously: the warps wait for the loads of every
  // block, and the loads wait for the slowest warp's last P_ij V_j (two barriers per block).
  auto load_kv = [&](T* dst, const T* src, int block) { load_tile<Cfg, B_c>(dst, src, block * B_c, p.Nk); };
  if (kv.T_c > 0) load_tile<Cfg, B_r>(sQ, Q, row0, p.Nq);  // line 4: load Q_i

  for (int j = 0; j < kv.T_c; ++j) {  // line 6: for j = 1 .. T_c
    __syncthreads();  // every warp is done with K_{j-1}, V_{j-1}: the buffers are free
    load_kv(sK, K, j);  // line 7: load K_j, V_j
    load_kv(sV, V, j);
    __syncthreads();  // K_j, V_j (and Q_i) are in shared memory for every warp
    const T* K_j = sK;
    const T* V_j = sV;

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

// The tiles in dynamic shared memory, from `smem`: Q_i [B_r, kStride], then K_j and V_j
// [B_c, kStride].
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
  extern __shared__ __align__(16) unsigned char smem_raw[];  // the loads move 16-byte chunks
  const SmemTiles<T> s = smem_tiles<T, Cfg>(smem_raw);  // padded rows need no more alignment
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
  allow_dynamic_smem(kernel, Cfg::kSmemBytes, "05a_q_outer: the d = " + std::to_string(Cfg::kD) + " tile");
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

}  // namespace attn::fa2::step_a
