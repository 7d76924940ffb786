// 01_naive: the textbook algorithm. S = scale · Q Kᵀ and O = P V are cuBLAS GEMMs (see
// score_pipeline.h); the softmax between them is the one from the textbook,
//
//   P_ij = exp(S_ij) / Σ_j exp(S_ij)
//
// with no max subtracted: exp overflows float once a score passes ~88.7, the row sum
// becomes inf and that row of O becomes NaN. That failure is this rung's lesson; 02 fixes it.
#include "01_naive/naive.h"
#include "01_naive/score_pipeline.h"
#include "01_naive/softmax_rows.cuh"
#include "common/check.h"

namespace attn {

using namespace softmax_rows;

namespace {

// Pass 1: l_i = Σ_j exp(S_ij) over the visible keys (masked ones read as -inf: exp = 0).
template <typename Walk>
__global__ void __launch_bounds__(Walk::Threads) row_sum_exp(ScoreRows rows, const float* S, float* row_sum) {
  for (int64_t r = first_row(); r < rows.count; r += row_stride()) {
    const float* S_i = S + r * rows.Nk;
    float l_i = 0.f;  // LAB:BEGIN 01.row_sum
    for_each_chunk<Walk>(S_i, rows.visible(r), [&](const float(&s)[Walk::Chunk]) {
#pragma unroll
      for (float S_ij : s) l_i += __expf(S_ij);  // inf once S_ij > ~88.7
    });
    l_i = group_sum(l_i);  // LAB:END
    if (lane() == 0) row_sum[r] = l_i;
  }
}

// Two passes over S: the row sums, then P = exp(S) / l (score_pipeline::normalize, m = 0).
void naive_softmax(const AttnProblem& p, const score_pipeline::Workspace& ws, float* lse, cudaStream_t stream) {
  const ScoreRows rows = score_rows(p);
  with_row_walk(p.Nk, [&](auto walk) {
    using Walk = decltype(walk);
    row_sum_exp<Walk><<<row_grid<Walk>(rows), Walk::Threads, 0, stream>>>(rows, ws.S, ws.row_sum);
    CUDA_CHECK_LAUNCH();
  });
  score_pipeline::normalize(p, ws, /*subtract_max=*/false, lse, stream);
}

}  // namespace

std::vector<Stage> naive_stages() {
  return {score_pipeline::make_stage("01_naive", "",
                                     "textbook: cuBLAS S = QKᵀ, softmax without max subtraction, cuBLAS O = PV",
                                     /*softmax_reads=*/2, naive_softmax)};
}

}  // namespace attn
