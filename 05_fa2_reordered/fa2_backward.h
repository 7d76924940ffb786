// The FlashAttention-2 backward (fa2_backward.cuh) on the host: its tiles, their shared
// memory, the workspace, the grid, and the launch entry point each generated translation unit
// instantiates. Plain constexpr arithmetic, so the CPU tests check what the kernel runs.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "05_fa2_reordered/fa2_tiles.h"
#include "common/attention.h"

namespace attn::fa2 {

// One backward CTA: B_c keys of one K/V block (the outer loop, fixed per CTA), and steps of
// B_r query rows (the inner loop). Warps split the keys, B_c / warps each (whole 16-row mma
// tiles); dK_j and dV_j of a warp's keys live in its registers for the whole CTA.
//
// It is the forward's Tile with the two loops' roles swapped: Tile's "rows" are this CTA's
// keys and its "keys" the query rows of a step. So the forward's fragment code serves as it
// is: qk_tile gives Sᵀ = K_j Q_iᵀ and dPᵀ = V_j dO_iᵀ (the warp's keys x the step's queries),
// pack_p and pv_tile give dV_j += Pᵀ dO_i and dK_j += dSᵀ Q_i.
template <int kD_,       // head dim d
          int kBc_,      // B_c, keys per CTA: more reuses each Q_i, dO_i more, costs dK, dV registers (warps)
          int kBr_,      // B_r, query rows per step: more amortizes each step's barriers and dQ loads
          int kPassQueries_,  // query rows whose Sᵀ, dPᵀ are in registers at once (a step takes B_r / this passes)
          int kWarps_,   // B_c / keys per warp: more keys per warp reuse each Q_i, dO_i fragment more, cost dK, dV registers
          int kMinCtasPerSm_>  // __launch_bounds__: CTAs an SM must hold (1: no cap below 255 registers)
struct BwdTile : Tile<kD_, kBc_, kBr_, kWarps_, 1> {
  static constexpr bool kTwoD = false;  // fa2_backward_kernel (Bwd2dTile: fa2_backward_2d_kernel)
  static constexpr int kKeys = kBc_;
  static constexpr int kQueries = kBr_;
  static constexpr int kMinCtasPerSm = kMinCtasPerSm_;
  // One pass of a step: the same Tile on kPassQueries query rows (Sᵀ, dPᵀ: kPassQueries / 2
  // registers each a thread).
  using Pass = Tile<kD_, kBc_, kPassQueries_, kWarps_, 1>;
  // Shared memory: K_j, V_j [B_c][d]; Q_i, dO_i [B_r][d] x 2 stages (step i + 1 loads while i
  // computes); dSᵀ [B_c][B_r] (dQ's operand); L_i, D_i [B_r] fp32 x 2 stages; room to align.
  static constexpr int kStepStages = 2;
  static constexpr int kSmemBytes = kElemBytes * (2 * kKeys * kD_ + 2 * kStepStages * kQueries * kD_ + kKeys * kQueries) +
                                    int(sizeof(float)) * 2 * kStepStages * kQueries + SwizzledRows<kD_>::kAlign;

  static_assert(kKeys % (16 * kWarps_) == 0, "each warp owns whole 16-key mma tiles");
  static_assert(kQueries % 64 == 0, "dSᵀ rows are swizzled 128-byte lines: B_r a multiple of 64");
  static_assert(kQueries % kPassQueries_ == 0 && kPassQueries_ % 16 == 0, "whole 16-query mma steps per pass");
};

// FlashAttention-2's own split of a backward CTA (fa2_backward_2d_kernel), for d = 128:
// B_c = 128 keys, B_r = 64 query rows per step, 8 warps, P_ij and dS_ij through shared
// memory, 1 CTA per SM. Each product gets its own 2-D warp grid, so no warp reads all of a
// tile:
//   S_ij, dP_ij (64 x 128):    2 query halves x 4 key quarters, 32 x 32 a warp
//   dV_j, dK_j (128 x d):      4 key quarters x 2 halves of d, 32 x 64 a warp (registers)
//   dQ_i (64 x d):             2 query halves x 4 quarters of d, 32 x 32 a warp (atomics)
template <int kD_>
struct Bwd2dTile {
  static constexpr bool kTwoD = true;
  static constexpr int kD = kD_;
  static constexpr int kKeys = 128, kQueries = 64, kWarps = 8, kThreads = 32 * kWarps;
  static constexpr int kMinCtasPerSm = 1;
  static constexpr int kElemBytes = fa2::kElemBytes;
  using Layout = SwizzledRows<kD_>;
  static constexpr int kStride = Layout::kStride;
  static constexpr int kStepStages = 2;
  using PsLayout = SwizzledRows<kKeys>;  // P_ij, dS_ij: [B_r][B_c], rows of B_c keys
  // K_j, V_j; Q_i, dO_i x 2 stages; P_ij, dS_ij; L_i, D_i x 2 stages; room to align.
  static constexpr int kSmemBytes =
      kElemBytes * (2 * kKeys * kD_ + 2 * kStepStages * kQueries * kD_ + 2 * kQueries * kKeys) +
      int(sizeof(float)) * 2 * kStepStages * kQueries + Layout::kAlign;
  // S_ij's warp tile as the forward's Tile, for 05d_fa2_reordered.cuh's qk_tile: 32 rows x 32 keys.
  using Sdp = Tile<kD_, 2 * 32, 32, 2, 1>;
  static_assert(kD_ == 128, "the warp grids above are laid out for d = 128");
};

// How dQ_i = Σ_j dS_ij K_j is summed over the K/V blocks, which run in different CTAs:
//  atomics:       each CTA adds its dS_ij K_j to an fp32 dQ_acc in HBM (FA2's choice); the
//                 order of the adds varies from run to run, so dQ's last bits do too.
//  separate_pass: a second kernel, one CTA per Q block as the forward, recomputes S_ij, P_ij,
//                 dP_ij, dS_ij and sums dS_ij K_j in registers: 3 more GEMMs of the 5, no
//                 atomics, no fp32 dQ buffer, and the same bits every run (deterministic).
enum class DqMode { atomics, separate_pass };

// The tile head dim d runs with. d = 64: fa2_backward_kernel, 4 warps of 32 keys (128 per
// CTA, 81 KiB of shared memory, 2 CTAs per SM), B_r = 64 query rows per step in two passes
// of 32 (all 64 at once, Sᵀ and dPᵀ spill; without dQ's atomics passes of 32 spill too, as
// ptxas schedules that loop differently, so that kernel takes passes of 16). dK, dV take 128
// of the 255 registers; each Q_i, dO_i fragment serves the warp's two 16-key tiles.
// d = 128: dK, dV of 32 keys would need 256 registers, and a warp of 16 keys reads all of
// Q_i and dO_i for 16 keys' work; FA2's warp grids (Bwd2dTile) read less shared memory per
// FLOP. BwdOwnKeysTile<128> is that 16-key kernel (the ablation 05_fa2_bwd_warps_own_keys).
template <int kD, DqMode kMode = DqMode::atomics>
struct BwdTileFor;
template <DqMode kMode>
struct BwdTileFor<64, kMode> : BwdTile<64, 128, 64, kMode == DqMode::atomics ? 32 : 16, 4, 1> {};
template <DqMode kMode>
struct BwdTileFor<128, kMode> : Bwd2dTile<128> {};
template <int kD>
struct BwdOwnKeysTile : BwdTile<kD, 64, 64, 32, 4, 1> {};

// The dQ pass's tile (separate_pass): the forward's Tile, B_r query rows per CTA split over
// the warps, B_c keys per step, a ring of K/V buffers; shared memory holds dO_i besides.
template <int kD_, int kBr_, int kBc_, int kWarps_, int kStages_>
struct DqTile : Tile<kD_, kBr_, kBc_, kWarps_, kStages_> {
  using Base = Tile<kD_, kBr_, kBc_, kWarps_, kStages_>;
  static constexpr int kSmemBytes = Base::kSmemBytes + Base::kElemBytes * Base::kStride * kBr_;  // + dO_i
};
// Each warp holds dQ for its 16 rows (d / 2 registers) and S_ij, dP_ij for 64 keys (32 each).
template <int kD>
using DqTileFor = DqTile<kD, 64, 64, 4, 2>;

// dQ_acc, the fp32 sum of dQ over the CTAs of all K/V blocks (DqMode::atomics), stored in
// 8 x 8 blocks, [B, H, ⌈Nq / 8⌉, d / 8, 8, 8]: the block of rows 8r .. 8r + 7 and columns
// 8c .. 8c + 7 is 64 consecutive floats, row-major. That block is what one warp's 8-byte red
// adds: rows g (or g + 8) of a 16 x 8 mma C tile, lane l's pair at 2 l. So the red covers 256
// contiguous bytes, 2 cache lines; in row-major [Nq, d] the same red touches 8 lines, and the
// waits on those reds, ncu showed, were the d = 128 kernel's largest stall. Rows are padded to
// a multiple of 8 per head (never written, never read).
constexpr int64_t dq_acc_rows(int Nq) { return (int64_t(Nq) + 7) / 8 * 8; }
// Offset of (row, col) in one head's dQ_acc, d = kD. Moving by whole 8 x 8 blocks adds a
// constant: offset(r + 8a, c + 8b) = offset(r, c) + offset(8a, 8b), so a lane computes its base
// once and reaches its other C tiles by immediates (row-major r·d + c has the same property).
template <int kD>
constexpr int64_t dq_acc_offset(int row, int col) {
  return int64_t(row / 8) * 8 * kD + col / 8 * 64 + row % 8 * 8 + col % 8;
}
// Index of (row, col) of head bh (batch · H + head) in the whole dQ_acc, Nq rows per head.
template <int kD>
constexpr int64_t dq_acc_index(int64_t bh, int row, int col, int Nq) {
  return bh * dq_acc_rows(Nq) * kD + dq_acc_offset<kD>(row, col);
}

// Floats of the whole dQ_acc: B * H padded heads.
inline int64_t dq_acc_elems(const AttnProblem& p) { return int64_t(p.B) * p.H * dq_acc_rows(p.Nq) * p.d; }

// The workspace: D = rowsum(dO ∘ O), fp32 [B, H, Nq]; with atomics first dQ_acc (above).
inline size_t bwd_workspace_bytes(const AttnProblem& p, DqMode mode = DqMode::atomics) {
  return size_t((mode == DqMode::atomics ? dq_acc_elems(p) : 0) + p.lse_elems()) * sizeof(float);
}

// CTAs of the main kernel: one per (K/V block, batch, key/value head).
inline int64_t bwd_ctas(const AttnProblem& p, int keys_per_cta) {
  return (int64_t(p.Nk) + keys_per_cta - 1) / keys_per_cta * p.B * p.Hkv;
}

// CTAs of the dQ pass (separate_pass): one per (Q block, batch, head).
inline int64_t bwd_dq_ctas(const AttnProblem& p, int rows_per_cta) {
  return (int64_t(p.Nq) + rows_per_cta - 1) / rows_per_cta * p.B * p.H;
}

// Enqueue the backward for head dim kD (fa2_backward.cuh; instantiated per (head dim, dtype,
// mode) by the generated fa2_backward_instance_d<d>_<dtype>.cu files): the D pre-pass, the
// main kernel (dK, dV), then with atomics the dQ conversion (the pre-pass zeroed dQ_acc),
// with separate_pass the dQ kernel.
template <typename T, int kD, DqMode kMode, class Cfg = BwdTileFor<kD, kMode>>
void launch_fa2_backward(const AttnProblem& p, const AttnBwdTensors& t, cudaStream_t stream);

}  // namespace attn::fa2
