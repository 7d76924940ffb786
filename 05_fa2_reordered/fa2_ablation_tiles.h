// Tile configurations of the ablations (fa2_ablations.cuh): 05's tiles (fa2_tiles.h) with one
// FA2 choice switched off, and their launch entry point.
#pragma once

#include "05_fa2_reordered/fa2_tiles.h"

namespace attn::fa2 {

// 05's tile Cfg with padded rows.
template <class Cfg>
using Padded = Tile<Cfg::kD, Cfg::kBr, Cfg::kBc, Cfg::kWarps, Cfg::kStages, PaddedRows<Cfg::kD>>;

// How the warps of a CTA share one (Q_i, K_j) step.
enum class WarpSplit {
  q_rows,   // FA2: warp w owns B_r / warps rows of Q_i (and of S_ij, P_ij, O_i) and reads all of K_j, V_j
  kv_keys,  // FA1's "split-K": warp w takes B_c / warps keys of K_j, V_j for all B_r rows; the warps
            // agree on each block's row max and sum their partial O_i through shared memory
};

// A tile Base with the ablations' knobs: the warp split, and kVAhead V_j fragments of P_ij V_j
// loaded before the softmax (0: none; fa2_ablations.cuh: pv_tile_prefetch).
template <class Base, WarpSplit kSplit = WarpSplit::q_rows, int kVAhead_ = 0>
struct AblationTile : Base {
  static constexpr bool kSplitKV = kSplit == WarpSplit::kv_keys;
  static constexpr int kVAhead = kVAhead_;
  static constexpr bool kPrefetch = kVAhead > 0;
  static constexpr int kWarpRows = kSplitKV ? Base::kBr : Base::kBr / Base::kWarps;
  static constexpr int kWarpKeys = kSplitKV ? Base::kBc / Base::kWarps : Base::kBc;
  // kv_keys only: fp32 [B_r][warps] per-warp row maxima of a block (then row sums) and [B_r] m_i.
  static constexpr int kStatsBytes = kSplitKV ? 4 * (Base::kWarps + 1) * Base::kBr : 0;
  // kv_keys only: the warps' partial O_i, fp32 [warps][B_r][d + 8], overlaying the K/V buffers after the loop.
  static constexpr int kPartialOStride = Base::kD + 8;  // fp32 row pitch: a half-warp's float2 stores hit 32 banks
  static constexpr int kPartialOBytes = kSplitKV ? 4 * Base::kWarps * Base::kBr * kPartialOStride : 0;
  static constexpr int kSmemBytes = Base::kSmemBytes + kStatsBytes;
  static_assert(kPartialOBytes <= Base::kElemBytes * Base::kStride * 2 * Base::kStages * Base::kBc,
                "partial O_i fit in the K/V buffers");
};

// The registered ablations (stages.cu), one kernel each (fa2_ablations.cuh).
enum class Ablation {
  no_delay,          // O_i divided by l_i after every K/V block, as FA1
  one_cta_per_head,  // FA1's grid: one CTA per (batch, head) walks all its Q blocks
  warps_split_kv,    // FA1's warp split: warps split K_j, V_j instead of Q_i
  prefetch,          // P_ij V_j's first V_j fragments loaded before the softmax
  padded,            // padded shared-memory rows instead of the swizzle
};

// The tile ablation kA runs with at head dim kD: 05's tile with padded rows (swizzled, the
// registers of the no-delay, one-CTA, split-K and d = 128 prefetch kernels spill).
template <Ablation kA, int kD>
struct AblationTileFor : AblationTile<Padded<TileFor<kD>>> {};
// Split-K: every warp holds all B_r rows of O_i, so B_r = 05's rows per warp keeps O_i at
// 05's size (32 x 128 fp32 at d = 128, 128 registers per thread; B_r = 128 would need 512).
template <int kD>
struct AblationTileFor<Ablation::warps_split_kv, kD>
    : AblationTile<Tile<kD, TileFor<kD>::kWarpRows, TileFor<kD>::kBc, TileFor<kD>::kWarps, TileFor<kD>::kStages,
                        PaddedRows<kD>>,
                   WarpSplit::kv_keys> {};
// Prefetch: each fragment loaded ahead feeds 4 mma at d = 128, 2 at d = 256; 8 ahead, as at
// d = 256, would spill at d = 128.
template <>
struct AblationTileFor<Ablation::prefetch, 128>
    : AblationTile<Padded<TileFor<128>>, WarpSplit::q_rows, /*kVAhead=*/2> {};
template <>
struct AblationTileFor<Ablation::prefetch, 256> : AblationTile<TileFor<256>, WarpSplit::q_rows, /*kVAhead=*/8> {};

// Enqueue ablation kA for head dim kD. Defined in fa2_ablations.cuh, instantiated per (head
// dim, dtype) by the generated fa2_<ablation>_instance_d<d>_<dtype>.cu files.
template <Ablation kA, typename T, int kD>
void launch_ablation(const AttnProblem& p, const AttnTensors& t, cudaStream_t stream);

}  // namespace attn::fa2
