// The steps that build rung 05 up (README.md): each a kernel file of its own, each adding one
// idea to the step below. Their tiles and launch entry points, instantiated per (head dim,
// dtype) by the generated fa2_step_<x>_instance_d<d>_<dtype>.cu files (CMakeLists.txt).
//
//   05a_q_outer.cuh   step_a  FA2's loop order: Q blocks outer, warps split Q_i's rows, O_i in
//                             registers, mma.sync; synchronous loads, padded rows, 32-bit loads
//   05b_ldmatrix.cuh  step_b  + fragments by ldmatrix from XOR-swizzled rows
//   05c_cp_async.cuh  step_c  + a cp.async ring of kStages (K_j, V_j) buffers
//   05d_fa2_reordered.cuh     + causal tile order and lazy rescaling: the rung (namespace fa2)
//
// 05a and 05b run one tile, StepTile: 05's B_c and 4 warps, one K and one V buffer, and
// B_r = 64, so that each warp owns one 16-row mma tile of Q_i. At 05's B_r = 128 (two 16-row
// tiles per warp) a thread holds twice the O_i and S_ij fragments and the kernel needs all
// 255 registers: 05a spills at both d, 05b at d = 128. 05c and 05d run 05's own tiles.
#pragma once

#include "05_fa2_reordered/fa2_tiles.h"

namespace attn::fa2 {

template <int kD, class Layout>
struct StepTile : Tile<kD, /*B_r=*/64, fa2::TileFor<kD>::kBc, fa2::TileFor<kD>::kWarps, /*stages=*/1, Layout> {};

namespace step_a {
// One K and one V buffer, loaded synchronously; rows padded to d + 8 (fa2_tiles.h: PaddedRows).
template <int kD>
struct TileFor : StepTile<kD, PaddedRows<kD>> {};
template <typename T, int kD>
void launch_fa2(const AttnProblem& p, const AttnTensors& t, cudaStream_t stream);
}  // namespace step_a

namespace step_b {
// As step_a, rows XOR-swizzled (fa2_tiles.h: SwizzledRows) for ldmatrix.
template <int kD>
struct TileFor : StepTile<kD, SwizzledRows<kD>> {};
template <typename T, int kD>
void launch_fa2(const AttnProblem& p, const AttnTensors& t, cudaStream_t stream);
}  // namespace step_b

namespace step_c {
// 05's own tiles (B_r = 128): a ring of kStages (K_j, V_j) buffers (2 at d = 64 and 128).
template <int kD>
struct TileFor : fa2::TileFor<kD> {
  static_assert(fa2::TileFor<kD>::kStages >= 2, "05c is the ring schedule; d = 256's one-buffer schedule is 05d's");
};
template <typename T, int kD>
void launch_fa2(const AttnProblem& p, const AttnTensors& t, cudaStream_t stream);
}  // namespace step_c

}  // namespace attn::fa2
