// Registers rung 06's four steps. The kernels live in fa3_kernel.cuh, instantiated once per
// (step, head dim, dtype) by the generated fa3_<step>_d<d>_<dtype>.cu files.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <iterator>

#include "06_fa3_hopper/fa3.h"
#include "06_fa3_hopper/fa3_fp8.h"
#include "06_fa3_hopper/fa3_launch.h"
#include "common/hbm_model.h"

namespace attn {
namespace {

using fa3::Schedule;
using fa3::Variant;
using LaunchFn = void (*)(const AttnProblem&, const AttnTensors&, Schedule, cudaStream_t, float);
using ScheduleFn = Schedule (*)(const AttnProblem&);

// 06a-c keep one tile per CTA, so that their steps measure only their own idea (06a has no
// producer to run ahead into a next tile; its kernel would walk a persistent grid correctly
// but serially). 06d and the FP8 path walk tiles persistently, handed out from a counter
// (fa3_kernel.cuh: next_unit), which with a causal mask balances the tiles' differing work
// as the hardware's hand-out of CTAs does, without a CTA start per tile.
Schedule one_tile(const AttnProblem&) { return Schedule::one_tile_per_cta; }
Schedule persistent(const AttnProblem&) { return Schedule::persistent; }
Schedule cta_pairs_unless_causal(const AttnProblem& p) {
  return p.causal ? Schedule::one_tile_per_cta : Schedule::persistent_cta_pairs;
}

template <Variant V, int D>
LaunchFn for_dtype(DType t) {
  return t == DType::bf16 ? fa3::launch<V, D, __nv_bfloat16> : fa3::launch<V, D, __half>;
}

// run_stage() validated d and dtype against the Stage's lists before this is reached.
template <Variant V>
LaunchFn kernel_for(const AttnProblem& p) {
  switch (p.d) {
    case 64: return for_dtype<fa3::instance_for(V, 64), 64>(p.dtype);
    case 128: return for_dtype<fa3::instance_for(V, 128), 128>(p.dtype);
    default: return for_dtype<fa3::instance_for(V, 256), 256>(p.dtype);
  }
}

// kEagerRescale: O_i rescaled every block (FA3 as published), not lazily (06d only).
template <Variant V, ScheduleFn kSchedule = one_tile, bool kEagerRescale = false>
Stage make_stage(std::string name, std::string prev, std::string summary) {
  Stage s;
  s.name = std::move(name);
  s.prev = std::move(prev);
  s.summary = std::move(summary);
  s.min_sm = 90;  // TMA, wgmma and setmaxnreg (built for sm_90a)
  s.dtypes = {DType::bf16, DType::fp16};
  s.head_dims = {64, 128, 256};  // keep in step with fa3_head_dims in CMakeLists.txt
  s.gqa = true;
  s.writes_lse = true;
  s.compute_bound = true;
  s.refuse = [](const AttnProblem& p) -> std::string {
    const long long rows = fa3::block_rows(V, p.d);
    const long long ctas = (p.Nq + rows - 1) / rows * p.B * p.H;
    if (ctas > INT_MAX) return "needs " + std::to_string(ctas) + " CTAs; the 1-D grid holds at most 2^31 - 1";
    return "";
  };
  if (kSchedule == persistent)  // its unit counter (fa3_kernel.cuh: next_unit); CTA pairs use none
    s.workspace_bytes = [](const AttnProblem&) { return sizeof(int); };
  s.launch = [](const AttnProblem& p, const AttnTensors& t, cudaStream_t stream) {
    kernel_for<V>(p)(p, t, kSchedule(p), stream, kEagerRescale ? -INFINITY : fa3::kRescaleLog2);
  };
  s.model_hbm_bytes = [](const AttnProblem& p) {
    return hbm::fa2_bytes(p, fa3::block_rows(V, p.d), fa3::block_cols(V, p.d));
  };
  return s;
}

// The FP8 path (fa3_fp8.h): one kernel pair per head dim; the four stages differ only in
// the pre-kernel's options (the ablation of FA3 Table 3).
Stage make_fp8_stage(std::string name, std::string prev, std::string summary, fa3::Fp8Options opt) {
  Stage s;
  s.name = std::move(name);
  s.prev = std::move(prev);
  s.summary = std::move(summary);
  s.min_sm = 90;
  s.dtypes = {DType::fp8_e4m3};
  s.head_dims.assign(std::begin(fa3::kFp8HeadDims), std::end(fa3::kFp8HeadDims));
  s.gqa = true;
  s.writes_lse = true;
  s.compute_bound = true;
  s.refuse = [](const AttnProblem& p) -> std::string {
    const fa3::Fp8Workspace ws(p);  // the pre-kernel numbers the scale blocks of Q, K or V with an int
    const long long blocks = std::max(ws.q_blocks * p.B * p.H, ws.kv_blocks * p.B * p.Hkv);
    if (blocks > INT_MAX) return "needs " + std::to_string(blocks) + " scale blocks; the pre-kernel counts at most 2^31 - 1";
    if (ws.nk_padded * p.d > INT_MAX) return "Nk too long for the transposed V tensor map";
    return "";
  };
  s.workspace_bytes = [](const AttnProblem& p) { return fa3::Fp8Workspace(p).total; };
  s.launch = [opt](const AttnProblem& p, const AttnTensors& t, cudaStream_t stream) {
    fa3::fp8_launch_for(p.d)(p, t, opt, persistent(p), stream);
  };
  // Attention kernel: FA2's traffic with e = 1 (e4m3 Q, K, V), plus one byte per element
  // of O (written as bf16); then the pre-kernel's reads and writes.
  s.model_hbm_bytes = [opt](const AttnProblem& p) {
    return hbm::fa2_bytes(p, fa3::fp8_block_rows(p.d), fa3::fp8_block_cols(p.d)) + double(p.o_elems()) +
           fa3::fp8_quantize_bytes(p, opt);
  };
  return s;
}

// The FP8 instance of head dim d among kFp8HeadDims (its launch or its pre-kernel); any
// other d throws, naming the built ones.
template <class Fn>
Fn fp8_instance(int d, Fn d64, Fn d128, Fn d256) {
  switch (d) {
    case 64: return d64;
    case 128: return d128;
    case 256: return d256;
  }
  std::string built;
  for (int k : fa3::kFp8HeadDims) built += (built.empty() ? "" : ", ") + std::to_string(k);
  throw AttnError("06_fa3_hopper fp8: no kernel for head dim d = " + std::to_string(d) + " (built: " + built + ")");
}

}  // namespace

namespace fa3 {

Fp8LaunchFn fp8_launch_for(int d) {
  return fp8_instance<Fp8LaunchFn>(d, launch_fp8<64>, launch_fp8<128>, launch_fp8<256>);
}

Fp8QuantizeFn fp8_quantize_for(int d) {
  return fp8_instance<Fp8QuantizeFn>(d, launch_fp8_quantize<64>, launch_fp8_quantize<128>, launch_fp8_quantize<256>);
}

Fp8AttentionFn fp8_attention_for(int d) {
  return fp8_instance<Fp8AttentionFn>(d, launch_fp8_attention<64>, launch_fp8_attention<128>,
                                      launch_fp8_attention<256>);
}

}  // namespace fa3

std::vector<Stage> fa3_stages() {
  return {
      make_stage<Variant::tma_wgmma>("06a_tma_wgmma", "05_fa2_reordered",
                                     "TMA loads on mbarriers, wgmma SS (QK^T) and RS (PV); one warpgroup"),
      make_stage<Variant::warp_specialized>("06b_warp_specialized", "06a_tma_wgmma",
                                            "producer warpgroup + K/V ring; two consumer warpgroups (setmaxnreg)"),
      make_stage<Variant::pingpong>("06c_pingpong", "06b_warp_specialized",
                                    "named barriers: one consumer's softmax under the other's GEMMs"),
      make_stage<Variant::fa3, persistent>(
          "06d_fa3", "06c_pingpong",
          "intra-warpgroup overlap: next QK^T and this PV issued together; lazy rescaling; persistent CTAs"),
      // Ablations of 06d's schedule: one tile per CTA, as 06a-c (same kernel); persistent
      // clusters of two CTAs that share each K/V block (TMA multicast; no faster, README),
      // whose kernel adds the pairs' code to 06d's (Variant::fa3_cta_pairs).
      make_stage<Variant::fa3, one_tile>("06d_one_tile_per_cta", "06d_fa3",
                                         "06d without persistent CTAs: one tile per CTA, no overlap across tiles"),
      make_stage<Variant::fa3_cta_pairs, cta_pairs_unless_causal>(
          "06d_cta_pairs", "06d_fa3", "06d in CTA pairs: each K/V block loaded once per pair of Q blocks (multicast)"),
      // Ablation of 06d's lazy rescaling: O_i rescaled after every block, as in FA3.
      make_stage<Variant::fa3, persistent, /*kEagerRescale=*/true>(
          "06d_eager_rescale", "06d_fa3", "06d rescaling O_i after every K/V block (no lazy rescaling), as FA3"),
      make_fp8_stage("06_fp8", "", "FP8 e4m3 (QGMMA): block quantization + Hadamard incoherent processing",
                     {/*block_scales=*/true, /*hadamard=*/true}),
      make_fp8_stage("06_fp8_no_hadamard", "06_fp8", "FP8 ablation: block scales, no incoherent processing",
                     {/*block_scales=*/true, /*hadamard=*/false}),
      make_fp8_stage("06_fp8_per_tensor_hadamard", "06_fp8", "FP8 ablation: one scale per tensor, with Hadamard",
                     {/*block_scales=*/false, /*hadamard=*/true}),
      make_fp8_stage("06_fp8_per_tensor", "06_fp8", "FP8 baseline: one scale per tensor, no Hadamard",
                     {/*block_scales=*/false, /*hadamard=*/false}),
  };
}

}  // namespace attn
