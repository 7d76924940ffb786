// 03a_online_softmax: 02's softmax with its first two passes fused into one. Each lane keeps
// a running max m and a running sum l of exp(S_ij - m); when a larger score arrives, the
// sum so far is rescaled to the new max (Milakov & Gimelshein 2018, Algorithm 3):
//
//   m = the largest score seen so far,   l = Σ exp(S_ij - m) over the scores seen so far,
//   so the sum must follow m each time m grows
//
// Partial (m, l) pairs from different lanes merge with the same rule, so the order of the
// scores does not matter: m_i and l_i come out of one pass over S instead of two.
#include "01_naive/score_pipeline.h"
#include "01_naive/softmax_rows.cuh"
#include "03_online_softmax/online_softmax_03a.h"
#include "common/check.h"

namespace attn {

using namespace softmax_rows;

namespace {

// (m, l) ⊕ (m', l'): the pair of the union of both lanes' scores, over the warp by butterfly.
// A lane that saw no visible score holds (-inf, 0) and contributes 0.
__device__ inline void warp_merge(float& m, float& l) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    const float m_other = __shfl_xor_sync(kFullWarp, m, offset);
    const float l_other = __shfl_xor_sync(kFullWarp, l, offset);
    const float m_new = fmaxf(m, m_other);  // LAB:BEGIN 03a.merge
    if (m_new == -INFINITY) continue;  // both empty: stay (-inf, 0), avoid exp(-inf + inf)
    l = l * __expf(m - m_new) + l_other * __expf(m_other - m_new);
    m = m_new;  // LAB:END
  }
}

// The one statistics pass: m_i and l_i together, each lane online over its chunks.
template <typename Walk>
__global__ void __launch_bounds__(Walk::Threads)
    online_row_stats(ScoreRows rows, const float* S, float* row_max, float* row_sum) {
  for (int64_t r = first_row(); r < rows.count; r += row_stride()) {
    const float* S_i = S + r * rows.Nk;
    float m_i = -INFINITY, l_i = 0.f;
    for_each_chunk<Walk>(S_i, rows.visible(r), [&](const float(&s)[Walk::Chunk]) {
      float m_new = m_i;  // the max over the chunk first: one rescale per chunk, not per score
#pragma unroll
      for (float S_ij : s) m_new = fmaxf(m_new, S_ij);
      if (m_new == -INFINITY) return;  // nothing visible in this lane yet
      float l_new = l_i * __expf(m_i - m_new);  // rescale the sum so far to the new max; LAB:BEGIN 03a.rescale
#pragma unroll
      for (float S_ij : s) l_new += __expf(S_ij - m_new);  // LAB:END
      m_i = m_new;
      l_i = l_new;
    });
    warp_merge(m_i, l_i);
    if (lane() == 0) {
      row_max[r] = m_i;
      row_sum[r] = l_i;
    }
  }
}

// Two passes over S: (m, l) online, then P = exp(S - m) / l.
void online_softmax(const AttnProblem& p, const score_pipeline::Workspace& ws, float* lse, cudaStream_t stream) {
  const ScoreRows rows = score_rows(p);
  with_row_walk(p.Nk, [&](auto walk) {
    using Walk = decltype(walk);
    online_row_stats<Walk><<<row_grid<Walk>(rows), Walk::Threads, 0, stream>>>(rows, ws.S, ws.row_max, ws.row_sum);
    CUDA_CHECK_LAUNCH();
  });
  score_pipeline::normalize(p, ws, /*subtract_max=*/true, lse, stream);
}

}  // namespace

Stage online_softmax_03a_stage() {
  return score_pipeline::make_stage("03a_online_softmax", "02_safe_softmax",
                                    "online-normalizer softmax: running max and rescaled sum, 2 passes over S",
                                    /*softmax_reads=*/2, online_softmax);
}

}  // namespace attn
