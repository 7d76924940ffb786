// FlashAttention-2 forward (Dao 2023, Algorithm 1) for sm_80+: one CTA per (Q block i,
// head h, batch b); the CTA loops over the K/V blocks j, keeping O_i, m_i and l_i in
// registers, and divides by l_i once, after the loop.
//
// Work split inside a CTA (B_r = 128, 4 warps): warp w owns 32 rows of Q_i, hence the
// same rows of S_ij, P_ij and O_i. It reads all of K_j and V_j from shared memory, so no
// warp ever needs another warp's partial results (no shared-memory reduction).
//
//            K_j^T (B_c keys)            V_j (d columns)
//          +----------------+          +----------------+
//   warp 0 | S_ij rows 0-31 |  -> P -> | O_i rows 0-31  |
//   warp 1 | rows 32-63     |          | rows 32-63     |
//   warp 2 | rows 64-95     |          | rows 64-95     |
//   warp 3 | rows 96-127    |          | rows 96-127    |
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
// Why P never leaves registers: the C fragments of two neighbouring 8-key tiles of S_ij
// (keys 16k..16k+7 and 16k+8..16k+15) hold exactly the elements that the A fragment of
// the 16-key step k of P_ij V_j needs, in the same lanes:
//
//   S tile 2k   : c0,c1 (row g, keys 2t..)  -> a0      c2,c3 (row g+8, keys 2t..) -> a1
//   S tile 2k+1 : c0,c1 (row g, keys 8+2t..) -> a2     c2,c3 (row g+8, keys 8+2t..) -> a3
//
// so P_ij becomes the A operand by packing pairs of fp32 into bf16x2/fp16x2 in place.
//
// The warp-split ablation (Tile::kSplitKV, WarpSplit::kv_keys: FA1's "split-K", B_r = 32):
// warp w takes keys 16w..16w+15 of every K_j, V_j for all rows, so each warp holds S_ij,
// P_ij of every row for its keys and a partial O_i of every row:
//
//                    K_j^T and V_j (B_c = 64 keys)
//           +------------+------------+------------+------------+
//  Q_i,     |   warp 0   |   warp 1   |   warp 2   |   warp 3   |
//  all 32   | keys  0-15 | keys 16-31 | keys 32-47 | keys 48-63 |
//  rows     +------------+------------+------------+------------+
//             partial O_i  partial O_i  partial O_i  partial O_i   (32 x d each)
//
// Per block the warps agree on each row's max through shared memory (cta_row_max); after the
// loop the 4 partial O_i and l_i, all under that same m_i, are summed (write_output_split_kv).
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "05_fa2_reordered/fa2_tiles.h"
#include "05_fa2_reordered/ptx.cuh"
#include "common/check.h"
#include "common/stage.h"
#include "common/tile_order.h"

namespace attn::fa2 {

template <typename T>
struct Params {
  const T* q;   // [B, H, Nq, d]
  const T* k;   // [B, Hkv, Nk, d]
  const T* v;   // [B, Hkv, Nk, d]
  T* o;         // [B, H, Nq, d]
  float* lse;   // [B, H, Nq] or null
  int H, Hkv, group, Nq, Nk;
  int T_r;           // Q blocks per head
  TileOrder order;   // which (head, Q block) CTA blockIdx.x takes (common/tile_order.h)
  bool causal;
  float scale;       // softmax scale
  float scale_log2;  // scale * log2(e): exp(scale * x) = exp2(scale_log2 * x)
  float rescale_log2;  // lazy rescaling: O_i is rescaled once a row max grows by more (online_softmax)
};

constexpr unsigned kFullWarp = 0xffffffffu;

// Shared-memory tiles are row-major, d elements per row, laid out so that an ldmatrix 8x8
// matrix (the same 16-byte chunk of 8 consecutive rows) reads all 32 banks: with rows of a
// multiple of 128 bytes, unchanged, all 8 would sit in the same 4 banks. Two layouts
// (Tile::kSwizzle):
//
//  - swizzled (05, every d): rows of exactly d elements, chunk c of row r stored at chunk
//    c ^ (r % 8): bank group (c ^ r) mod 8.
//  - padded (the ablation 05_fa2_padded, and the d = 128 ablations whose registers the
//    swizzle would spill): each row is followed by one spare 16-byte chunk (Tile::kStride =
//    d + 8), shifting row r by 16 r bytes: chunk c sits in bank group (r + c) mod 8.
//
//   bank group (16 B):  0   1   2   3   4   5   6   7          0   1   2   3   4   5   6   7
//   swizzled  row 0:   c0  c1  c2  c3  c4  c5  c6  c7  padded   c0  c1  c2  c3  c4  c5  c6  c7
//             row 1:   c1  c0  c3  c2  c5  c4  c7  c6           c7  c0  c1  c2  c3  c4  c5  c6
//             row 2:   c2  c3  c0  c1  c6  c7  c4  c5           c6  c7  c0  c1  c2  c3  c4  c5
//
// The swizzle permutes chunks only inside an aligned 128-byte line, so each 128-byte piece of
// a row that cp.async copies lands in one line of shared memory; padded, every piece
// straddles two lines, and the copies cost 1.5x the L2 sectors (README, Shared-memory
// layout). In the padded tile every fragment address is a lane's base plus a compile-time
// offset; swizzled, one of four XORs of it plus an offset (fa2_tiles.h: frag_addr).
// (tile_offset and frag_addr are in fa2_tiles.h so that the CPU tests check them: Fa2Layout.*)

// One lane's ldmatrix row in a tile: the shared address of its 16-byte chunk (row, chunk),
// chunk 0 or 1, as stored (swizzled or not). Every fragment the lane loads sits a multiple of
// 8 rows and of 16 columns (2 chunks) away (fa2_tiles.h: frag_addr).
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
  // One base plus constant offsets, padded or when a pass covers whole 8-row groups (the rows
  // of a thread keep their swizzle). At d = 256, 4 rows per pass, a thread's rows alternate
  // between two swizzles: the offset of each pass's row.
  const uint32_t dst0 = ptx::smem_u32(tile + tile_offset<Cfg>(r0, chunk));
  auto dst = [&](int pass) {
    if constexpr (Cfg::kSwizzle && kRowsPerPass % 8 != 0)
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

// Per-warp register tiles: kM 16-row mma tiles of rows; S_ij has kWarpKeys / 8 key tiles (all
// B_c keys, or B_c / warps with split-K), O_i d / 8.
template <class Cfg>
struct Frag {
  static constexpr int kM = Cfg::kWarpRows / 16;
  static constexpr int kS = Cfg::kWarpKeys / 8;
  static constexpr int kO = Cfg::kD / 8;
};

// This warp's part of every S_ij (fa2_tiles.h, WarpSplit): kWarpRows rows of Q_i from
// warp_first_row, kWarpKeys keys of K_j, V_j from warp_first_key.
template <class Cfg>
__device__ __forceinline__ int warp_first_row(int warp) {
  return Cfg::kSplitKV ? 0 : warp * Cfg::kWarpRows;
}
template <class Cfg>
__device__ __forceinline__ int warp_first_key(int warp) {
  return Cfg::kSplitKV ? warp * Cfg::kWarpKeys : 0;
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

// Split-K only: each warp has seen B_c / warps keys of the block, so the warps exchange their
// row maxima through shared memory (s_row_max, fp32 [B_r][warps]) and all continue with the max
// over the whole block: one barrier per block. The next block's writes come after its top
// barrier, which every warp reaches only once it has read these.
template <class Cfg>
__device__ __forceinline__ void cta_row_max(float (&row_max)[Frag<Cfg>::kM][2], float* s_row_max, int lane) {
  static_assert(Cfg::kWarps == 4, "one float4 of warp maxima per row");
  const int warp = threadIdx.x / 32;
#pragma unroll
  for (int mt = 0; mt < Frag<Cfg>::kM; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half)
      if (lane % 4 == 0) s_row_max[(mt * 16 + lane / 4 + 8 * half) * Cfg::kWarps + warp] = row_max[mt][half];
  __syncthreads();
#pragma unroll
  for (int mt = 0; mt < Frag<Cfg>::kM; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const float4 w = *reinterpret_cast<const float4*>(s_row_max + (mt * 16 + lane / 4 + 8 * half) * Cfg::kWarps);
      row_max[mt][half] = fmaxf(fmaxf(w.x, w.y), fmaxf(w.z, w.w));
    }
}

// Algorithm 1, lines 9-10 for row `half` of 16-row tile mt, given m_i^(j) = row_max =
// max(m_i^(j-1), rowmax(S_ij)): P_ij = exp(S_ij - m_i^(j)),
// l_i^(j) = e^(m_i^(j-1) - m_i^(j)) l_i^(j-1) + rowsum(P_ij), O_i *= e^(m_i^(j-1) - m_i^(j)).
// P_ij overwrites S_ij. Exponentials are exp2 with scale * log2(e) folded into one FFMA.
// With kDelayedNorm, l_i is this thread's partial row sum (its 2 columns of each tile):
// the 4 lanes of a row (and with split-K the warps) add theirs once, after the loop. Without
// it (the FA1-style ablation), O_i and P_ij are divided by the full l_i at every step.
template <typename T, class Cfg, bool kDelayedNorm, bool kMasked>
__device__ __forceinline__ void softmax_row(float (&S_ij)[Frag<Cfg>::kM][Frag<Cfg>::kS][4],
                                            float (&O_i)[Frag<Cfg>::kM][Frag<Cfg>::kO][4],
                                            float (&m_i)[Frag<Cfg>::kM][2], float (&l_i)[Frag<Cfg>::kM][2], int mt,
                                            int half, float row_max, float scale_log2, bool rescale_o) {
  // In a masked block a row may have seen no key yet (m = -inf): subtract 0 so that P = 0,
  // not NaN. In an unmasked block every row sees every key, so m is finite.
  const float max_scaled = (kMasked && row_max == -INFINITY) ? 0.f : row_max * scale_log2;
  // e^(m_old - m_new); 0 if m_old = -inf; 1 when the warp keeps its m_i (lazy rescaling)
  const float alpha = rescale_o ? exp2_approx(m_i[mt][half] * scale_log2 - max_scaled) : 1.f;
  m_i[mt][half] = row_max;
  float row_sum = 0.f;
#pragma unroll
  for (int nt = 0; nt < Frag<Cfg>::kS; ++nt)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const float p = exp2_approx(fmaf(S_ij[mt][nt][2 * half + e], scale_log2, -max_scaled));
      S_ij[mt][nt][2 * half + e] = p;
      row_sum += p;
    }
  float o_scale = alpha;
  if constexpr (kDelayedNorm) {
    l_i[mt][half] = alpha * l_i[mt][half] + row_sum;
  } else {
    row_sum += __shfl_xor_sync(kFullWarp, row_sum, 1);
    row_sum += __shfl_xor_sync(kFullWarp, row_sum, 2);
    const float l_new = alpha * l_i[mt][half] + row_sum;
    const float inv_l = l_new > 0.f ? 1.f / l_new : 0.f;
    o_scale = alpha * l_i[mt][half] * inv_l;  // O_i = diag(l_new)^-1 (diag(l_old) e^(m_old - m_new) O_i + P V)
    l_i[mt][half] = l_new;
#pragma unroll
    for (int nt = 0; nt < Frag<Cfg>::kS; ++nt)
#pragma unroll
      for (int e = 0; e < 2; ++e) S_ij[mt][nt][2 * half + e] *= inv_l;
  }
  if (rescale_o)
#pragma unroll
    for (int dt = 0; dt < Frag<Cfg>::kO; ++dt)
#pragma unroll
      for (int e = 0; e < 2; ++e) O_i[mt][dt][2 * half + e] *= o_scale;
}

// Algorithm 1, lines 9-10 for all of this warp's rows: every row's max first (FA2: complete
// within the warp; split-K: the warps agree on it through shared memory, cta_row_max), then
// each row's exponentials, sum and O_i rescale (softmax_row).
template <typename T, class Cfg, bool kDelayedNorm, bool kMasked, bool kLazy>
__device__ __forceinline__ void online_softmax(float (&S_ij)[Frag<Cfg>::kM][Frag<Cfg>::kS][4],
                                               float (&O_i)[Frag<Cfg>::kM][Frag<Cfg>::kO][4],
                                               float (&m_i)[Frag<Cfg>::kM][2], float (&l_i)[Frag<Cfg>::kM][2],
                                               float scale_log2, float rescale_log2, float* s_row_max, int lane) {
  static_assert(!Cfg::kSplitKV || kDelayedNorm, "split-K sums the warps' l_i after the loop");
  // Lazy rescaling (kLazy): the warp keeps its m_i, and skips the multiplies of O_i, unless
  // some row max grew by more than rescale_log2 in the exponent's log2 units. P_ij <=
  // 2^rescale_log2 then, and l_i, O_i still refer to the same m_i: exact. Not with split-K,
  // whose warps see only part of each row before cta_row_max.
  static_assert(!kLazy || (kDelayedNorm && !Cfg::kSplitKV), "lazy rescaling keeps l_i and O_i in the same units");
  float row_max[Frag<Cfg>::kM][2];  // max(m_i, rowmax(S_ij))
  bool grew = false;
#pragma unroll
  for (int mt = 0; mt < Frag<Cfg>::kM; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      row_max[mt][half] = quad_row_max<Cfg>(S_ij, mt, half, m_i[mt][half]);
      grew |= (row_max[mt][half] - m_i[mt][half]) * scale_log2 > rescale_log2;  // -inf - (-inf): false
    }
  if constexpr (Cfg::kSplitKV) cta_row_max<Cfg>(row_max, s_row_max, lane);
  const bool moved = !kLazy || __any_sync(kFullWarp, grew);
#pragma unroll
  for (int mt = 0; mt < Frag<Cfg>::kM; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half)
      softmax_row<T, Cfg, kDelayedNorm, kMasked>(S_ij, O_i, m_i, l_i, mt, half,
                                                 moved ? row_max[mt][half] : m_i[mt][half], scale_log2, moved);
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

// The prefetch variant (Tile::kVAhead > 0): V_j fragments in registers before the softmax.
//
// pv_tile issues each ldmatrix of V_j next to the mma that consume it, and ptxas schedules
// them: inside one basic block it hoists loads as far as registers allow (in the unrolled
// k-loops of qk_tile and pv_tile, on average ~12 and ~24 mma lie between a fragment's load and
// its use at d = 256; writing those loops with double-buffered fragment registers, FA2's order,
// compiles to the same SASS). What
// it does not do is move loads into an earlier basic block: the softmax (masked or not) is a
// branch, so pv_tile's first mma wait for its first ldmatrix (short scoreboard) after every
// softmax. The variant loads the first kVAhead steps of P_ij V_j right after the barrier that
// proves V_j landed, before the softmax, and continues as a ring of register buffers:
//
//   V_j landed (barrier)  load f[0] <- step 0 .. f[A-1] <- step A-1        (A = kVAhead)
//   softmax               (the loads complete meanwhile)
//   step 0:               load f[A] <- step A        mma(f[0])
//   step 1:               load f[0] <- step A+1      mma(f[1])            (ring of A + 1)
//   ...
//   step s:               load f[(s+A) % (A+1)]      mma(f[s % (A+1)])
//
// A step is one ldmatrix of V_j (keys 16kk.., d 16dp..; pv_tile's order) and the mma it feeds.
// The loops are unrolled, so f[s % (A+1)] names registers (no copies, no local memory).

template <class Cfg, typename T>
__device__ __forceinline__ uint32_t v_lane_base(const T* sV, int lane) {
  return lane_row<Cfg>(sV, lane % 16, lane / 16);  // as in pv_tile
}
// Step s of P_ij V_j: B = V_j[keys 16kk.., d 16dp..], kk = s / (d / 16), dp = s % (d / 16).
template <class Cfg>
__device__ __forceinline__ void load_v_step(uint32_t (&b)[4], uint32_t v_base, int s) {
  constexpr int kDSteps = Cfg::kD / 16;
  ptx::ldmatrix_x4_trans(b, frag_addr<Cfg>(v_base, (s / kDSteps) * 16, s % kDSteps));
}

// Steps 0 .. kVAhead - 1, issued once V_j has landed and before the softmax.
template <class Cfg, typename T>
__device__ __forceinline__ void load_v_head(uint32_t (&v_frags)[Cfg::kVAhead + 1][4], const T* sV, int lane) {
  const uint32_t v_base = v_lane_base<Cfg>(sV, lane);
#pragma unroll
  for (int s = 0; s < Cfg::kVAhead; ++s) load_v_step<Cfg>(v_frags[s], v_base, s);
}

// O_i += P_ij V_j as pv_tile, with v_frags holding steps 0 .. kVAhead - 1 (load_v_head); step
// s + kVAhead goes into the slot that step s - 1 has just freed.
template <typename T, class Cfg>
__device__ __forceinline__ void pv_tile_prefetch(float (&O_i)[Frag<Cfg>::kM][Frag<Cfg>::kO][4],
                                                 const uint32_t (&P_ij)[Frag<Cfg>::kM][Cfg::kWarpKeys / 16][4],
                                                 uint32_t (&v_frags)[Cfg::kVAhead + 1][4], const T* sV, int lane) {
  constexpr int kDSteps = Cfg::kD / 16, kSteps = Cfg::kWarpKeys / 16 * kDSteps, kRing = Cfg::kVAhead + 1;
  static_assert(kSteps > Cfg::kVAhead, "fewer steps than fragments loaded ahead");
  const uint32_t v_base = v_lane_base<Cfg>(sV, lane);
#pragma unroll
  for (int s = 0; s < kSteps; ++s) {
    if (s + Cfg::kVAhead < kSteps) load_v_step<Cfg>(v_frags[(s + Cfg::kVAhead) % kRing], v_base, s + Cfg::kVAhead);
    const int kk = s / kDSteps, dp = s % kDSteps;
    const uint32_t(&b)[4] = v_frags[s % kRing];
#pragma unroll
    for (int mt = 0; mt < Frag<Cfg>::kM; ++mt) {
      ptx::mma_16816<T>(O_i[mt][2 * dp], P_ij[mt][kk], b[0], b[1]);
      ptx::mma_16816<T>(O_i[mt][2 * dp + 1], P_ij[mt][kk], b[2], b[3]);
    }
  }
}

// Algorithm 1, lines 12-15: O_i = diag(l_i)^-1 O_i, L_i = m_i + log(l_i); write both.
// O_i goes through this warp's own rows of sQ (no other warp reads them) so that global
// stores are whole 16-byte chunks of a row.
template <typename T, class Cfg, bool kDelayedNorm>
__device__ __forceinline__ void write_output(float (&O_i)[Frag<Cfg>::kM][Frag<Cfg>::kO][4],
                                             const float (&m_i)[Frag<Cfg>::kM][2], float (&l_i)[Frag<Cfg>::kM][2],
                                             T* sQ, const Params<T>& p, int bh, int row0, int warp_row0, int lane) {
  constexpr int D = Cfg::kD;
  T* O = p.o + int64_t(bh) * p.Nq * D;  // this head's [Nq, D] output
  float* L = p.lse ? p.lse + int64_t(bh) * p.Nq : nullptr;
#pragma unroll
  for (int mt = 0; mt < Frag<Cfg>::kM; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float l = l_i[mt][half];
      if constexpr (kDelayedNorm) {
        l += __shfl_xor_sync(kFullWarp, l, 1);  // the 4 lanes' partial sums of the row
        l += __shfl_xor_sync(kFullWarp, l, 2);
      }
      const int row = row0 + warp_row0 + mt * 16 + lane / 4 + 8 * half;
      if (L && lane % 4 == 0 && row < p.Nq) L[row] = l > 0.f ? m_i[mt][half] * p.scale + logf(l) : -INFINITY;
      if constexpr (kDelayedNorm) {
        const float inv_l = l > 0.f ? 1.f / l : 0.f;  // a row that sees no key: O = 0
#pragma unroll
        for (int dt = 0; dt < Frag<Cfg>::kO; ++dt)
#pragma unroll
          for (int e = 0; e < 2; ++e) O_i[mt][dt][2 * half + e] *= inv_l;
      }
    }
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

// Split-K, lines 12-15: each warp holds a partial O_i and l_i over its keys, all under the
// same m_i (cta_row_max), so they add without rescaling. Every warp writes its partials to
// shared memory (fp32, over the K/V buffers, free after the loop); then warp w sums the
// kWarps partials of rows w, w + kWarps, ..., divides by l_i and writes O_i and L_i, lane l
// columns 4l..4l+3 of every 128 (16-byte shared loads, 8-byte global stores).
template <typename T, class Cfg>
__device__ __forceinline__ void write_output_split_kv(const float (&O_i)[Frag<Cfg>::kM][Frag<Cfg>::kO][4],
                                                      const float (&m_i)[Frag<Cfg>::kM][2],
                                                      const float (&l_i)[Frag<Cfg>::kM][2], float* s_partial_o,
                                                      float* s_stats, const Params<T>& p, int bh, int row0, int lane) {
  constexpr int D = Cfg::kD, B_r = Cfg::kBr, kWarps = Cfg::kWarps, kPitch = Cfg::kPartialOStride;
  constexpr int kLaneCols = 4, kPassCols = 32 * kLaneCols;  // one float4 per lane: a warp covers 128 columns
  static_assert(D % kPassCols == 0, "a warp covers a row in whole passes");
  const int warp = threadIdx.x / 32;
  float* s_row_sum = s_stats;          // [B_r][warps], where the row maxima were
  float* s_m = s_stats + B_r * kWarps;  // [B_r]
  __syncthreads();  // every warp is done with K_j, V_j (overwritten below) and the row maxima
#pragma unroll
  for (int mt = 0; mt < Frag<Cfg>::kM; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float l = l_i[mt][half];
      l += __shfl_xor_sync(kFullWarp, l, 1);  // the 4 lanes' partial sums: this warp's keys of the row
      l += __shfl_xor_sync(kFullWarp, l, 2);
      const int r = mt * 16 + lane / 4 + 8 * half;
      if (lane % 4 == 0) {
        s_row_sum[r * kWarps + warp] = l;
        if (warp == 0) s_m[r] = m_i[mt][half];  // the same in every warp
      }
#pragma unroll
      for (int dt = 0; dt < Frag<Cfg>::kO; ++dt)
        *reinterpret_cast<float2*>(s_partial_o + (warp * B_r + r) * kPitch + dt * 8 + 2 * (lane % 4)) =
            make_float2(O_i[mt][dt][2 * half], O_i[mt][dt][2 * half + 1]);
    }
  __syncthreads();
  T* O = p.o + int64_t(bh) * p.Nq * D;  // this head's [Nq, D] output
  for (int r = warp; r < B_r && row0 + r < p.Nq; r += kWarps) {
    float l = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) l += s_row_sum[r * kWarps + w];
    const float inv_l = l > 0.f ? 1.f / l : 0.f;  // a row that sees no key: O = 0
#pragma unroll
    for (int c = kLaneCols * lane; c < D; c += kPassCols) {
      float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
      for (int w = 0; w < kWarps; ++w) {
        const float4 part = *reinterpret_cast<const float4*>(s_partial_o + (w * B_r + r) * kPitch + c);
        o.x += part.x;
        o.y += part.y;
        o.z += part.z;
        o.w += part.w;
      }
      *reinterpret_cast<uint2*>(O + int64_t(row0 + r) * D + c) =
          make_uint2(pack2<T>(o.x * inv_l, o.y * inv_l), pack2<T>(o.z * inv_l, o.w * inv_l));
    }
    if (p.lse && lane == 0) p.lse[int64_t(bh) * p.Nq + row0 + r] = l > 0.f ? s_m[r] * p.scale + logf(l) : -INFINITY;
  }
}

// One Q block i of head bh: Algorithm 1, lines 4-15. s_stats: split-K only.
template <typename T, class Cfg, bool kDelayedNorm, bool kLazy>
__device__ __forceinline__ void attend_q_block(const Params<T>& p, T* sQ, T* sK, T* sV, float* s_stats, int bh,
                                               int i) {
  constexpr int D = Cfg::kD, B_r = Cfg::kBr, B_c = Cfg::kBc, kStages = Cfg::kStages;
  constexpr int kTileKV = B_c * Cfg::kStride;  // elements per K or V tile
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int b = bh / p.H, h = bh % p.H, h_kv = h / p.group;
  const T* Q = p.q + int64_t(bh) * p.Nq * D;
  const T* K = p.k + (int64_t(b) * p.Hkv + h_kv) * p.Nk * D;
  const T* V = p.v + (int64_t(b) * p.Hkv + h_kv) * p.Nk * D;

  // Which K/V blocks this Q block needs. Causal: row r sees keys <= r + (Nk - Nq), so the
  // last row bounds the loop (later blocks are skipped) and the first row says which
  // blocks are fully visible (no elementwise mask needed).
  const int row0 = i * B_r;
  const int last_row = min(row0 + B_r, p.Nq) - 1;
  int keys = p.Nk;
  int unmasked_blocks = p.Nk / B_c;  // blocks wholly inside [0, Nk)
  if (p.causal) {
    keys = max(0, min(p.Nk, last_row + (p.Nk - p.Nq) + 1));
    unmasked_blocks = min(unmasked_blocks, max(0, row0 + (p.Nk - p.Nq) + 1) / B_c);
  }
  const int T_c = (keys + B_c - 1) / B_c;

  float O_i[Frag<Cfg>::kM][Frag<Cfg>::kO][4];  // Algorithm 1, line 6: O_i = 0, l_i = 0, m_i = -inf
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

  // Two load schedules (kStages):
  //  >= 2: a ring of (K, V) buffers; block j + kStages - 1 is loaded while block j computes.
  //  == 1: FlashAttention-2's own: one K and one V buffer; V_j is loaded while S_ij = Q_i K_j^T
  //        runs, K_{j+1} while the softmax and P_ij V_j run. Two barriers per block, but
  //        half the shared memory, which can buy a second CTA per SM.
  auto load_kv = [&](T* dst, const T* src, int block) { load_tile<Cfg, B_c>(dst, src, block * B_c, p.Nk); };
  if (T_c > 0) {  // line 4: load Q_i; and the first blocks of K, V
    load_tile<Cfg, B_r>(sQ, Q, row0, p.Nq);
    if constexpr (kStages == 1) {
      load_kv(sK, K, 0);
      ptx::cp_async_commit();
    } else {
#pragma unroll
      for (int s = 0; s < kStages - 1; ++s) {
        if (s < T_c) {
          load_kv(sK + s * kTileKV, K, s);
          load_kv(sV + s * kTileKV, V, s);
        }
        ptx::cp_async_commit();
      }
    }
  }

  for (int j = 0; j < T_c; ++j) {  // line 7: for j = 1 .. T_c
    ptx::cp_async_wait<kStages == 1 ? 0 : kStages - 2>();
    __syncthreads();  // K_j (and V_j) landed for every thread's copies; block j-1's buffers are free
    if constexpr (kStages == 1) {
      load_kv(sV, V, j);  // V_j, while S_ij is computed
    } else {
      const int next = j + kStages - 1;
      if (next < T_c) {  // K, V of block next, while block j computes
        load_kv(sK + (next % kStages) * kTileKV, K, next);
        load_kv(sV + (next % kStages) * kTileKV, V, next);
      }
    }
    ptx::cp_async_commit();
    const T* K_j = sK + (j % kStages) * kTileKV + warp_first_key<Cfg>(warp) * Cfg::kStride;  // this warp's keys
    const T* V_j = sV + (j % kStages) * kTileKV + warp_first_key<Cfg>(warp) * Cfg::kStride;

    float S_ij[Frag<Cfg>::kM][Frag<Cfg>::kS][4];
    qk_tile<T, Cfg>(S_ij, sQ, K_j, warp_first_row<Cfg>(warp), lane);  // line 8: S_ij = Q_i K_j^T
    if constexpr (kStages == 1) {
      ptx::cp_async_wait<0>();
      __syncthreads();  // V_j landed; every warp is done reading K_j
      if (j + 1 < T_c) load_kv(sK, K, j + 1);  // K_{j+1}, while the softmax and P_ij V_j run
      ptx::cp_async_commit();
    }
    uint32_t v_frags[Cfg::kVAhead + 1][4];  // the prefetch variant: P_ij V_j's first V_j fragments
    if constexpr (Cfg::kPrefetch) load_v_head<Cfg>(v_frags, V_j, lane);  // V_j has landed (a barrier above)
    if (j < unmasked_blocks) {
      online_softmax<T, Cfg, kDelayedNorm, false, kLazy>(S_ij, O_i, m_i, l_i, p.scale_log2, p.rescale_log2,
                                                         s_stats, lane);  // lines 9-10
    } else {  // block crosses the causal diagonal or the end of K
      mask_tile<T, Cfg>(S_ij, p, row0 + warp_first_row<Cfg>(warp), j * B_c + warp_first_key<Cfg>(warp), lane);
      online_softmax<T, Cfg, kDelayedNorm, true, kLazy>(S_ij, O_i, m_i, l_i, p.scale_log2, p.rescale_log2,
                                                        s_stats, lane);
    }
    uint32_t P_ij[Frag<Cfg>::kM][Cfg::kWarpKeys / 16][4];
    pack_p<T, Cfg>(P_ij, S_ij);
    if constexpr (Cfg::kPrefetch)  // line 10: O_i += P_ij V_j
      pv_tile_prefetch<T, Cfg>(O_i, P_ij, v_frags, V_j, lane);
    else
      pv_tile<T, Cfg>(O_i, P_ij, V_j, lane);
  }

  if constexpr (Cfg::kSplitKV)  // lines 12-15
    write_output_split_kv<T, Cfg>(O_i, m_i, l_i, reinterpret_cast<float*>(sK), s_stats, p, bh, row0, lane);
  else
    write_output<T, Cfg, kDelayedNorm>(O_i, m_i, l_i, sQ, p, bh, row0, warp_first_row<Cfg>(warp), lane);
}

template <typename T, class Cfg, bool kDelayedNorm, bool kOneCtaPerHead>
__global__ void __launch_bounds__(Cfg::kThreads) fa2_forward_kernel(const Params<T> p) {
  extern __shared__ __align__(16) unsigned char smem_raw[];  // cp.async and ldmatrix move 16-byte chunks
  // Swizzled tiles start on 128-byte boundaries (tile_offset); kSmemBytes has room for the shift.
  unsigned char* smem = smem_raw;
  if constexpr (Cfg::kSwizzle) smem += (Cfg::kSmemAlign - ptx::smem_u32(smem_raw) % Cfg::kSmemAlign) % Cfg::kSmemAlign;
  T* sQ = reinterpret_cast<T*>(smem);    // [B_r, kStride]
  T* sK = sQ + Cfg::kBr * Cfg::kStride;  // kStages x [B_c, kStride]
  T* sV = sK + Cfg::kStages * Cfg::kBc * Cfg::kStride;  // kStages x [B_c, kStride]
  float* s_stats = reinterpret_cast<float*>(sV + Cfg::kStages * Cfg::kBc * Cfg::kStride);  // split-K: kStatsBytes
  if constexpr (!kOneCtaPerHead) {
    // One CTA per (head, Q block): the grid over the sequence that FA2's loop order makes
    // possible. The CTAs of a few heads are adjacent (their K, V stay in L2), and with a
    // causal mask the longest Q blocks come first (tile_at).
    const TileCoord tile = tile_at(p.order, int(blockIdx.x));
    // Lazy rescaling where it fits: not in the FA1-style ablation, not with split-K (online_softmax),
    // not in the prefetch variant (its registers then spill at d = 128).
    constexpr bool kLazy = kDelayedNorm && !Cfg::kSplitKV && !Cfg::kPrefetch;
    attend_q_block<T, Cfg, kDelayedNorm, kLazy>(p, sQ, sK, sV, s_stats, tile.bh, tile.m_block);
  } else {
    // Ablation: FA1's grid, one CTA per (batch, head), the Q blocks one after another.
    for (int q_block = 0; q_block < p.T_r; ++q_block) {
      attend_q_block<T, Cfg, kDelayedNorm, false>(p, sQ, sK, sV, s_stats, blockIdx.x, q_block);
      __syncthreads();  // every warp has written its O rows from sQ before the next Q_i lands there
    }
  }
}

template <typename T, class Cfg, bool kDelayedNorm, bool kOneCtaPerHead>
void launch_fa2(const AttnProblem& p, const AttnTensors& t, cudaStream_t stream, float rescale_log2) {
  for (const void* ptr : {t.q, t.k, t.v, static_cast<const void*>(t.o)})
    if (reinterpret_cast<uintptr_t>(ptr) % 16 != 0)
      throw AttnError("05_fa2_reordered: Q, K, V and O must be 16-byte aligned (cp.async copies 16-byte chunks)");
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
  prm.order = tile_order(p, Cfg::kBr, sizeof(T));
  prm.causal = p.causal;
  prm.scale = p.softmax_scale();
  prm.scale_log2 = prm.scale * static_cast<float>(M_LOG2E);
  prm.rescale_log2 = rescale_log2;

  int device = 0, smem_optin = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  if (Cfg::kSmemBytes > smem_optin)
    throw AttnError("05_fa2_reordered: the d = " + std::to_string(Cfg::kD) + " tile needs " +
                    std::to_string(Cfg::kSmemBytes) + " bytes of shared memory per block; this GPU allows " +
                    std::to_string(smem_optin));

  const int64_t ctas = int64_t(p.B) * p.H * (kOneCtaPerHead ? 1 : prm.T_r);  // Stage::refuse: <= INT_MAX
  auto kernel = fa2_forward_kernel<T, Cfg, kDelayedNorm, kOneCtaPerHead>;
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes));
  kernel<<<static_cast<unsigned>(ctas), Cfg::kThreads, Cfg::kSmemBytes, stream>>>(prm);
  CUDA_CHECK_LAUNCH();
}

}  // namespace attn::fa2
