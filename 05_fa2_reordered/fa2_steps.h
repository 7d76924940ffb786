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
// The steps share 05's tile shapes (B_r, B_c, warps), so that only the named idea changes;
// 05a alone runs half of 05's B_c (see step_a::TileFor).
#pragma once

#include "05_fa2_reordered/fa2_tiles.h"

namespace attn::fa2 {

namespace step_a {
// One K and one V buffer, loaded synchronously; rows padded to d + 8 (fa2_tiles.h: PaddedRows).
// B_c is half of 05's: ptxas issues the many 32-bit fragment loads early, and their registers
// on top of S_ij's (B_c / 8 x 4 per 16 rows) would spill at 05's B_c. 05b returns to it.
template <int kD>
struct TileFor : Tile<kD, fa2::TileFor<kD>::kBr, fa2::TileFor<kD>::kBc / 2, fa2::TileFor<kD>::kWarps, 1,
                      PaddedRows<kD>> {};
template <typename T, int kD>
void launch_fa2(const AttnProblem& p, const AttnTensors& t, cudaStream_t stream);
}  // namespace step_a

namespace step_b {
// As step_a, rows XOR-swizzled (fa2_tiles.h: SwizzledRows) for ldmatrix.
template <int kD>
struct TileFor : Tile<kD, fa2::TileFor<kD>::kBr, fa2::TileFor<kD>::kBc, fa2::TileFor<kD>::kWarps, 1> {};
template <typename T, int kD>
void launch_fa2(const AttnProblem& p, const AttnTensors& t, cudaStream_t stream);
}  // namespace step_b

namespace step_c {
// 05's own tiles: a ring of kStages (K_j, V_j) buffers (2 at d = 64 and 128).
template <int kD>
struct TileFor : fa2::TileFor<kD> {
  static_assert(fa2::TileFor<kD>::kStages >= 2, "05c is the ring schedule; d = 256's one-buffer schedule is 05d's");
};
template <typename T, int kD>
void launch_fa2(const AttnProblem& p, const AttnTensors& t, cudaStream_t stream);
}  // namespace step_c

}  // namespace attn::fa2
