// Rung 03: (a) the online-normalizer softmax between two GEMMs (online_softmax_03a.cu) and
// (b) the fused kernel: each query row streams K and V once, no S or P in HBM.
#include <climits>
#include <string>

#include "03_online_softmax/fused_rowwise.cuh"
#include "03_online_softmax/online_softmax.h"
#include "03_online_softmax/online_softmax_03a.h"
#include "common/dtype.cuh"
#include "common/hbm_model.h"
#include "stage_head_dims.h"  // LADDER_HEAD_DIMS, generated from CMakeLists.txt

namespace attn {
namespace {

template <typename T>
void launch_fused(const AttnProblem& p, const AttnTensors& t, cudaStream_t stream) {
  switch (p.d) {
    case 64: return fused_rowwise_launch<T, 64>(p, t, stream);
    case 128: return fused_rowwise_launch<T, 128>(p, t, stream);
  }
  throw AttnError("03b_fused_online: no kernel for d = " + std::to_string(p.d));
}

Stage fused_online_stage() {
  Stage s;
  s.name = "03b_fused_online";
  s.prev = "03a_online_softmax";
  s.summary = "one fused kernel, a warp per query row: online softmax in registers, no N^2 memory";
  s.min_sm = 80;
  s.dtypes = {DType::bf16, DType::fp16};
  s.head_dims = {LADDER_HEAD_DIMS};  // stage_head_dims.h, from CMakeLists.txt
  s.gqa = true;
  s.writes_lse = true;
  s.compute_bound = true;
  s.refuse = [](const AttnProblem& p) -> std::string {
    const int64_t ctas = (int64_t(p.Nq) + kFusedRowsPerCta - 1) / kFusedRowsPerCta * p.B * p.H;
    if (ctas > INT_MAX)
      return "B*H*ceil(Nq/" + std::to_string(kFusedRowsPerCta) + ") = " + std::to_string(ctas) +
             " CTAs exceed the grid limit " + std::to_string(INT_MAX);
    return "";
  };
  s.launch = [](const AttnProblem& p, const AttnTensors& t, cudaStream_t stream) {
    if (p.dtype == DType::bf16) return launch_fused<__nv_bfloat16>(p, t, stream);
    return launch_fused<__half>(p, t, stream);
  };
  s.model_hbm_bytes = [](const AttnProblem& p) { return hbm::fused_rowwise_bytes(p); };
  return s;
}

}  // namespace

std::vector<Stage> online_softmax_stages() { return {online_softmax_03a_stage(), fused_online_stage()}; }

}  // namespace attn
