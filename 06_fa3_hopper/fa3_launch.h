// The four steps of rung 06 and their tile sizes: host-side view (no device code), shared
// by stages.cu (registration, cost model) and the kernel instances.
#pragma once

#include <cuda_runtime.h>

#include "common/attention.h"

namespace attn::fa3 {

// Each step adds one idea to the one before; one kernel template, switched at compile time.
enum class Variant {
  tma_wgmma,         // 06a: TMA + mbarrier loads, wgmma SS (Q Kᵀ) and RS (P V); one warpgroup, synchronous
  warp_specialized,  // 06b: producer warpgroup streams K/V through a ring; two consumer warpgroups compute
  pingpong,          // 06c: named barriers alternate the consumers' GEMMs, so one's softmax hides the other's
  fa3,               // 06d: + intra-warpgroup overlap: S_(j+1) and P_j V_j in flight during the softmax
  fa3_cta_pairs,     // 06d built with the CTA pairs' code too (the ablation 06d_cta_pairs)
};

constexpr bool warp_specialized(Variant v) { return v != Variant::tma_wgmma; }
// 06d and its CTA-pairs build: one kernel, but for the pairs' code (Config::kMayPairCtas).
constexpr bool is_06d(Variant v) { return v == Variant::fa3 || v == Variant::fa3_cta_pairs; }
// Whether the kernel of variant v at head dim d carries the CTA pairs' code (the cluster
// rank, arrivals on the peer's empty barriers). 06d runs faster without it (README: What
// the compiler made of it), except at d = 256, where ptxas spills O without it (C7512).
constexpr bool has_pairs_code(Variant v, int d) {
  return v == Variant::fa3_cta_pairs || (v == Variant::fa3 && d == 256);
}
// The kernel instance that runs variant v at head dim d: where 06d's own instance carries
// the pairs' code, 06d_cta_pairs runs it instead of a copy of its own.
constexpr Variant instance_for(Variant v, int d) {
  return v == Variant::fa3_cta_pairs && has_pairs_code(Variant::fa3, d) ? Variant::fa3 : v;
}

// Query rows per wgmma (its fixed M) = rows per consumer warpgroup.
constexpr int kWarpgroupRows = 64;
// Consumer warpgroups per CTA (06b-d). More of them interleave more softmax with GEMMs but
// share the register file: three fit only where O and S are small (d = 64).
constexpr int consumer_warpgroups(Variant v, int d) { return !warp_specialized(v) ? 1 : d == 64 ? 3 : 2; }
// setmaxnreg budgets of a warp-specialized CTA (one producer warpgroup, `consumers`
// consumer warpgroups, one CTA per SM). ptxas gives every thread the most that 64K registers
// allow (168 with three warpgroups, 128 with four), and setmaxnreg.inc takes registers only
// from those that the CTA's own setmaxnreg.dec gave back: the producer must free at least
// what the consumers add, or the consumers wait for registers forever.
constexpr bool setmaxnreg_budgets_fit(int consumers, int producer_regs, int consumer_regs) {
  const int launch_regs = 65536 / (128 * (consumers + 1)) / 8 * 8;
  return producer_regs + consumers * consumer_regs <= (consumers + 1) * launch_regs;
}
// B_r: query rows per CTA, one block of 64 per consumer warpgroup.
constexpr int block_rows(Variant v, int d) { return kWarpgroupRows * consumer_warpgroups(v, d); }
// B_c: keys per K/V block. Larger amortises the per-block softmax and barrier work, but S
// (B_c/2 fp32 registers per thread) must fit next to O (d/2): 176 fits beside d = 128
// and 80 beside d = 256 (both as in FA3). 06a keeps 64 at d = 256, where a smaller tile
// lets two of its one-warpgroup CTAs share an SM.
constexpr int block_cols(Variant v, int d) {
  return d == 256 ? (warp_specialized(v) ? 80 : 64) : d == 128 ? 176 : 128;
}

// 06d's lazy rescaling (fa3_kernel.cuh: online_softmax): a row max may grow by up to 8 in
// the exponent's log2 units (a factor 2^8 in P) before O_i is rescaled, so P_ij <= 256
// (fine in bf16 and fp16, summed in fp32).
constexpr float kRescaleLog2 = 8.f;

// How tiles (B_r query rows of one head) map to CTAs. Every kernel walks its tiles in a
// loop, so the schedules run the same code; the grid and the hand-out differ.
enum class Schedule {
  one_tile_per_cta,  // grid = all tiles; the hardware starts a new CTA whenever one retires
  persistent,        // grid = as many CTAs as fit at once (one per SM here); CTA b starts on
                     // tile b, then takes b + G, b + 2G, ... (G CTAs) or, with a causal
                     // mask, the next tile not yet taken (a counter in the workspace): the
                     // producer loads the next tile's Q, K, V while the consumers finish
                     // the current one, and no CTA starts per tile
  persistent_cta_pairs,  // persistent, in clusters of two CTAs that take neighbouring Q blocks
                         // of one head (pair u, u + G, ...): each loads half of every K/V block into both (TMA
                         // multicast), halving L2 -> shared-memory traffic. Without a causal
                         // mask only (both tiles of a pair must read the same K/V blocks).
                         // The ablation 06d_cta_pairs; no faster than `persistent` (README).
};

// One instantiation per (variant, d, element type): fa3_<variant>.cu.in (instance_for above).
template <Variant V, int D, typename T>
// rescale_log2: 06d's lazy rescaling threshold (kRescaleLog2); -inf rescales O_i every block,
// as FA3 does (the ablation 06d_eager_rescale). 06a-c always do.
void launch(const AttnProblem& p, const AttnTensors& t, Schedule schedule, cudaStream_t stream, float rescale_log2);

}  // namespace attn::fa3
