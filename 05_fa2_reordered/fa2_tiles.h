// Tile configurations of the FlashAttention-2 forward kernel, one per head dim, and the
// launch entry point that each generated translation unit instantiates.
#pragma once

#include <cuda_runtime.h>

#include "common/attention.h"

namespace attn::fa2 {

template <int kD_,       // head dim d: each row of Q, K, V, O is d elements
          int kBr_,      // B_r, Q rows per CTA: larger reuses each K_j/V_j more, costs O_i registers
          int kBc_,      // B_c, K/V rows per step: larger amortizes the softmax, costs S_ij registers and smem
          int kWarps_,   // warps per CTA, each owning B_r/kWarps rows: more warps, fewer rows (registers) each
          int kStages_>  // (K, V) buffer pairs: 1 = FA2's split schedule (least smem), 2+ = a ring (one barrier per block)
struct Tile {
  static constexpr int kD = kD_;
  static constexpr int kBr = kBr_;
  static constexpr int kBc = kBc_;
  static constexpr int kWarps = kWarps_;
  static constexpr int kStages = kStages_;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kWarpRows = kBr / kWarps;  // rows of S and O one warp owns
  static constexpr int kElemBytes = 2;             // bf16 / fp16
  static constexpr int kStride = kD + 8;           // smem row: d elements + one 16-byte pad chunk (no ldmatrix bank conflicts)
  static constexpr int kSmemBytes = kElemBytes * kStride * (kBr + 2 * kStages * kBc);  // Q_i + (K_j, V_j) x stages

  static_assert(kStages >= 1, "at least one K and one V buffer");
  static_assert(kWarpRows % 16 == 0, "each warp owns whole 16-row mma tiles");
  static_assert(kBc % 16 == 0, "B_c is a whole number of 16-key mma steps");
  static_assert(kD % 16 == 0, "d is a whole number of 16-wide mma steps");
};

// One configuration per head dim (at d = 128 and 256, the tiles FlashAttention-2's own
// forward runs on Hopper).
using Tile64 = Tile<64, 128, 128, 4, 2>;   // 90 KiB smem: 2 CTAs per SM
using Tile128 = Tile<128, 128, 64, 4, 2>;  // 102 KiB smem: 2 CTAs per SM
using Tile256 = Tile<256, 64, 64, 4, 1>;   // 99 KiB smem: 2 CTAs per SM

// Enqueue the forward kernel. Two ablations: kDelayedNorm = false divides O_i by l_i at
// every step, as FlashAttention-1 does; kOneCtaPerHead launches FA1's grid (B * H CTAs,
// each walking its head's Q blocks) instead of one CTA per Q block. Defined in
// fa2_kernel.cuh, instantiated per (head dim, dtype) by the generated
// fa2_*instance_d<d>_<dtype>.cu files.
template <typename T, class TileCfg, bool kDelayedNorm, bool kOneCtaPerHead = false>
void launch_fa2(const AttnProblem& p, const AttnTensors& t, cudaStream_t stream);

}  // namespace attn::fa2
