// Tile configurations of the FlashAttention-2 forward kernel, one per head dim, and the
// launch entry point that each generated translation unit instantiates.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/attention.h"

namespace attn::fa2 {

// Lazy rescaling (fa2_kernel.cuh: online_softmax): a warp rescales O_i only once some row
// max has grown by more than 8 in the exponent's log2 units, so P_ij <= 2^8.
constexpr float kRescaleLog2 = 8.f;

// How the warps of a CTA share one (Q_i, K_j) step.
enum class WarpSplit {
  q_rows,   // FA2: warp w owns B_r / warps rows of Q_i (and of S_ij, P_ij, O_i) and reads all of K_j, V_j
  kv_keys,  // FA1's "split-K": warp w takes B_c / warps keys of K_j, V_j for all B_r rows; the warps
            // agree on each block's row max and sum their partial O_i through shared memory
};

template <int kD_,       // head dim d: each row of Q, K, V, O is d elements
          int kBr_,      // B_r, Q rows per CTA: larger reuses each K_j/V_j more, costs O_i registers
          int kBc_,      // B_c, K/V rows per step: larger amortizes the softmax, costs S_ij registers and smem
          int kWarps_,   // warps per CTA: more warps, fewer rows (q_rows) or keys (kv_keys) and registers each
          int kStages_,  // (K, V) buffer pairs: 1 = FA2's split schedule (least smem), 2+ = a ring (one barrier per block)
          WarpSplit kSplit_ = WarpSplit::q_rows,  // kv_keys: every warp holds all B_r rows of O_i, so B_r must be small
          int kVAhead_ = 0,  // V_j fragments of P_ij V_j loaded before the softmax (0: none): less waiting, more registers
          bool kSwizzle_ = false>  // smem rows XOR-swizzled instead of padded: aligned copies, more address registers
struct Tile {
  static constexpr int kD = kD_;
  static constexpr int kBr = kBr_;
  static constexpr int kBc = kBc_;
  static constexpr int kWarps = kWarps_;
  static constexpr int kStages = kStages_;
  static constexpr bool kSplitKV = kSplit_ == WarpSplit::kv_keys;
  static constexpr int kVAhead = kVAhead_;  // the prefetch variant (fa2_kernel.cuh: pv_tile_prefetch)
  static constexpr bool kPrefetch = kVAhead > 0;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kWarpRows = kSplitKV ? kBr : kBr / kWarps;  // rows of S and O one warp holds
  static constexpr int kWarpKeys = kSplitKV ? kBc / kWarps : kBc;  // keys of each K_j, V_j one warp reads
  static constexpr int kElemBytes = 2;             // bf16 / fp16
  static constexpr bool kSwizzle = kSwizzle_;  // fa2_kernel.cuh: tile_offset
  static constexpr int kStride = kSwizzle ? kD : kD + 8;  // smem row: d elements, + one 16-byte pad chunk unless swizzled
  static constexpr int kSmemAlign = kSwizzle ? 128 : 0;  // swizzled tiles on 128-byte lines (the XOR stays inside them)
  // kv_keys only: fp32 [B_r][warps] per-warp row maxima of a block (then row sums) and [B_r] m_i.
  static constexpr int kStatsBytes = kSplitKV ? 4 * (kWarps + 1) * kBr : 0;
  // kv_keys only: the warps' partial O_i, fp32 [warps][B_r][d + 8], overlaying the K/V buffers after the loop.
  static constexpr int kPartialOStride = kD + 8;  // fp32 row pitch: a half-warp's float2 fragment stores hit 32 banks
  static constexpr int kPartialOBytes = kSplitKV ? 4 * kWarps * kBr * kPartialOStride : 0;
  // Q_i, (K_j, V_j) x stages, the split-K statistics, and room to align a swizzled first tile
  static constexpr int kSmemBytes = kElemBytes * kStride * (kBr + 2 * kStages * kBc) + kStatsBytes + kSmemAlign;

  static_assert(kStages >= 1, "at least one K and one V buffer");
  static_assert(kWarpRows % 16 == 0, "each warp owns whole 16-row mma tiles");
  static_assert(kWarpKeys % 16 == 0, "each warp reads whole 16-key mma steps of K_j, V_j");
  static_assert(kD % 16 == 0, "d is a whole number of 16-wide mma steps");
  static_assert(kPartialOBytes <= kElemBytes * kStride * 2 * kStages * kBc, "partial O_i fit in the K/V buffers");
  static_assert(!kSwizzle || kD % 64 == 0, "the swizzle permutes the 8 chunks of each 128-byte piece of a row");
};

constexpr int kChunkElems = 8;  // one 16-byte chunk = 8 bf16/fp16 elements

// Element offset of 16-byte chunk `chunk` of row `row` in a shared-memory tile (fa2_kernel.cuh
// draws both layouts): padded, chunk c of row r at r * (d + 8) + 8 c; swizzled, at
// r * d + 8 (c ^ (r % 8)).
template <class Cfg>
constexpr int tile_offset(int row, int chunk) {
  return row * Cfg::kStride + (Cfg::kSwizzle ? chunk ^ (row % 8) : chunk) * kChunkElems;
}

// The shared address (or byte offset in a tile) of the ldmatrix fragment `rows` rows (a
// multiple of 8) and 16 k16 columns (2 k16 chunks) past a lane's chunk, from that chunk's
// address `lane` (chunk 0 or 1 of its row, as stored). Padded: a constant offset. Swizzled: moving by whole 8-row groups keeps the
// row's swizzle, and the chunk c + 2 k16 splits into its 128-byte line, k16 / 4 (an offset),
// and its place in the line, (c ^ r % 8) ^ 2 (k16 % 4): the lane's offset XORed with one of
// four constants, and an offset that ldmatrix encodes (tiles start on 128-byte lines).
template <class Cfg>
constexpr uint32_t frag_addr(uint32_t lane, int rows, int k16) {
  constexpr int kBytes = Cfg::kElemBytes;
  if (Cfg::kSwizzle)
    return (lane ^ uint32_t(k16 % 4 * 2 * kChunkElems * kBytes)) + (rows * Cfg::kStride + k16 / 4 * 8 * kChunkElems) * kBytes;
  return lane + (rows * Cfg::kStride + 2 * k16 * kChunkElems) * kBytes;
}

// One configuration per head dim (at d = 128 and 256, the tiles FlashAttention-2's own
// forward runs on Hopper).
using Tile64 = Tile<64, 128, 128, 4, 2, WarpSplit::q_rows, 0, /*kSwizzle=*/true>;   // 80 KiB smem: 2 CTAs per SM
using Tile128 = Tile<128, 128, 64, 4, 2, WarpSplit::q_rows, 0, /*kSwizzle=*/true>;  // 96 KiB smem: 2 CTAs per SM
// The layout ablation (05_fa2_padded): the same tiles with padded rows. The d = 128 ablations
// and variant below are padded too: swizzled, their registers spill.
using Tile64Padded = Tile<64, 128, 128, 4, 2>;    // 90 KiB smem: 2 CTAs per SM
using Tile128Padded = Tile<128, 128, 64, 4, 2>;  // 102 KiB smem: 2 CTAs per SM
using Tile256 = Tile<256, 64, 64, 4, 1, WarpSplit::q_rows, 0, /*kSwizzle=*/true>;  // 96 KiB smem: 2 CTAs per SM
// The warp-split ablation at d = 128: 05's B_c, warps and ring, but each of the 4 warps takes
// 16 keys of every K/V block for all rows. B_r = 32 keeps a warp's O_i at 05's 32 x 128 fp32
// (128 registers per thread); B_r = 64 would need 256.
using Tile128SplitKV = Tile<128, 32, 64, 4, 2, WarpSplit::kv_keys>;  // 77 KiB smem: 2 CTAs per SM
// The prefetch variant: 05's tiles, with the first V_j fragments of P_ij V_j loaded before the
// softmax (each feeds 2 mma at d = 256, 4 at d = 128; 8 more at d = 128 would spill).
using Tile128Prefetch = Tile<128, 128, 64, 4, 2, WarpSplit::q_rows, /*kVAhead=*/2>;  // 254 registers
using Tile256Prefetch = Tile<256, 64, 64, 4, 1, WarpSplit::q_rows, /*kVAhead=*/8, /*kSwizzle=*/true>;

// Enqueue the forward kernel. Three ablations and a variant: kDelayedNorm = false divides O_i by l_i at
// every step, as FlashAttention-1 does; kOneCtaPerHead launches FA1's grid (B * H CTAs,
// each walking its head's Q blocks) instead of one CTA per Q block; a TileCfg with
// WarpSplit::kv_keys splits K_j, V_j across the warps instead of Q_i (FA1's split-K); a TileCfg
// with kVAhead > 0 loads P_ij V_j's first V_j fragments before the softmax (the variant). Defined in
// fa2_kernel.cuh, instantiated per (head dim, dtype) by the generated
// fa2_*instance_d<d>_<dtype>.cu files.
// rescale_log2: lazy rescaling's threshold (kRescaleLog2); -inf rescales O_i every block, as
// FA2 does (the ablation 05_fa2_eager_rescale).
template <typename T, class TileCfg, bool kDelayedNorm, bool kOneCtaPerHead = false>
void launch_fa2(const AttnProblem& p, const AttnTensors& t, cudaStream_t stream, float rescale_log2 = kRescaleLog2);

}  // namespace attn::fa2
