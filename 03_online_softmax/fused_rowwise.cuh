// 03b: fused online-softmax attention, one warp per query row. What the stage code (and
// the one translation unit per (head dim, dtype)) needs to see: the launch and its tile.
#pragma once

#include <cuda_runtime.h>

#include "common/attention.h"

namespace attn {

// Query rows (one warp each) per CTA: more rows share each K/V chunk through L1; fewer
// leave a smaller idle tail when Nq is not a multiple.
constexpr int kFusedRowsPerCta = 4;

// Enqueues the fused kernel for one (element type, head dim); defined in
// fused_rowwise_kernel.cuh, instantiated by fused_rowwise.cu.in.
template <typename T, int kHeadDim>
void fused_rowwise_launch(const AttnProblem& p, const AttnTensors& t, cudaStream_t stream);

}  // namespace attn
