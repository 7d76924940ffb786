// Rung 06's FP8 forward on e4m3 inputs (fa3_fp8_e4m3.h): the caller's Q8, K8, V8 and
// descales, the attention kernel of fp8h_fa3.cuh unchanged, and nothing else: one launch.
// Its tensor maps read Q8, K8 and V8 in place (the [heads, N, d] layout of the bf16 path's
// Q̂, K̂ and V̂), its producer transposes each V8 block in shared memory as on that path
// (transpose_v), and its scales are the caller's descales.
//
// Included only by the FP8 instance files (fp8_fa3.cu.in): the kernel it launches is
// compiled there once for both paths.
#pragma once

#include <cstdint>

#include "06_fa3_hopper/fa3_fp8_e4m3.h"
#include "06_fa3_hopper/fp8h_fa3.cuh"

namespace attn::fa3 {

template <int D>
void launch_fp8_e4m3(const AttnProblem& pr, const AttnTensors& tensors, Schedule schedule, cudaStream_t stream) {
  const fp8::Inputs in{tensors.q, tensors.k, tensors.v, tensors.q_descale, tensors.k_descale, tensors.v_descale};
  fp8::launch<D, Fp8VPath::in_kernel>(pr, tensors, in, Fp8E4m3Workspace(pr).unit_counter, schedule, stream);
}

}  // namespace attn::fa3
