// 02_safe_softmax: the pipeline of 01 with the softmax made safe. Since
//
//   exp(S_ij) / Σ_j exp(S_ij) = exp(S_ij - m_i) / Σ_j exp(S_ij - m_i)   for any m_i,
//
// choosing m_i = max_j S_ij puts every exponent at <= 0: no overflow, and the largest term
// is exactly 1, so the sum cannot underflow to 0 either. It costs one more pass over S.
#include "01_naive/score_pipeline.h"
#include "01_naive/softmax_rows.cuh"
#include "02_safe_softmax/safe_softmax.h"
#include "common/check.h"

namespace attn {

using namespace softmax_rows;

namespace {

// Pass 1: m_i = max_j S_ij over the visible keys (-inf for a row that sees none).
template <typename Walk>
__global__ void __launch_bounds__(Walk::Threads) row_max(ScoreRows rows, const float* S, float* row_max) {
  for (int64_t r = first_row(); r < rows.count; r += row_stride()) {
    const float* S_i = S + r * rows.Nk;
    float m_i = -INFINITY;  // LAB:BEGIN 02.row_max
    for_each_chunk<Walk>(S_i, rows.visible(r), [&](const float(&s)[Walk::Chunk]) {
#pragma unroll
      for (float S_ij : s) m_i = fmaxf(m_i, S_ij);
    });
    m_i = group_max(m_i);  // LAB:END
    if (lane() == 0) row_max[r] = m_i;
  }
}

// Pass 2: l_i = Σ_j exp(S_ij - m_i) over the visible keys, m_i from pass 1.
template <typename Walk>
__global__ void __launch_bounds__(Walk::Threads)
    row_sum_exp(ScoreRows rows, const float* S, const float* row_max, float* row_sum) {
  for (int64_t r = first_row(); r < rows.count; r += row_stride()) {
    const float* S_i = S + r * rows.Nk;
    const float m_i = row_max[r];  // a row with no visible key runs no chunk, so -inf is never used
    float l_i = 0.f;  // LAB:BEGIN 02.shifted_sum
    for_each_chunk<Walk>(S_i, rows.visible(r), [&](const float(&s)[Walk::Chunk]) {
#pragma unroll
      for (float S_ij : s) l_i += __expf(S_ij - m_i);  // every exponent <= 0
    });
    l_i = group_sum(l_i);  // LAB:END
    if (lane() == 0) row_sum[r] = l_i;
  }
}

// Three passes over S: the row maxima, the shifted row sums, then P = exp(S - m) / l.
void safe_softmax(const AttnProblem& p, const score_pipeline::Workspace& ws, float* lse, cudaStream_t stream) {
  const ScoreRows rows = score_rows(p);
  with_row_walk(p.Nk, [&](auto walk) {
    using Walk = decltype(walk);
    row_max<Walk><<<row_grid<Walk>(rows), Walk::Threads, 0, stream>>>(rows, ws.S, ws.row_max);
    CUDA_CHECK_LAUNCH();
    row_sum_exp<Walk><<<row_grid<Walk>(rows), Walk::Threads, 0, stream>>>(rows, ws.S, ws.row_max, ws.row_sum);
    CUDA_CHECK_LAUNCH();
  });
  score_pipeline::normalize(p, ws, /*subtract_max=*/true, lse, stream);
}

}  // namespace

std::vector<Stage> safe_softmax_stages() {
  return {score_pipeline::make_stage("02_safe_softmax", "01_naive",
                                     "softmax subtracts the row max: 3 passes over S, no overflow",
                                     /*softmax_reads=*/3, safe_softmax)};
}

}  // namespace attn
