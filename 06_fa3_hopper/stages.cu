// Registers rung 06's steps: 06a_tma_wgmma.cuh, 06b_warp_specialized.cuh, 06c_pingpong.cuh,
// 06d_1_overlap.cuh, 06d_2_lazy_softmax.cuh, 06d_fa3.cuh (and its ablations) and the FP8 path (fp8h_fa3.cuh; on e4m3 inputs,
// fp8_e4m3_inputs.cuh), each kernel instantiated once per (head dim, dtype) by the generated
// instance files (CMakeLists.txt), for the head dims of the generated fa3_head_dims.h.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <iterator>
#include <type_traits>
#include <utility>
#include <vector>

#include "06_fa3_hopper/fa3.h"
#include "06_fa3_hopper/fa3_fp8.h"
#include "06_fa3_hopper/fa3_fp8_e4m3.h"
#include "06_fa3_hopper/fa3_launch.h"
#include "05_fa2_reordered/fa2_backward.h"  // bwd_workspace_bytes, bwd_ctas: 06e uses 05's workspace
#include "common/hbm_model.h"

namespace attn {
namespace {

using fa3::Schedule;

template <int D>
using Dim = std::integral_constant<int, D>;
template <class T>
struct Type {
  using type = T;
};

// The instance make(Dim<d>{}, Type<T>{}) for problem p: its head dim d among Ds (the built
// ones, fa3_head_dims.h) and its element type T (bf16 or fp16); run_stage() validated both
// against the Stage's lists, which are these lists.
template <class Fn, class Make, int... Ds>
Fn instance_for(const AttnProblem& p, std::integer_sequence<int, Ds...>, Make make) {
  Fn fn = nullptr;
  auto pick = [&](auto dim) {
    if (p.d == decltype(dim)::value)
      fn = p.dtype == DType::bf16 ? make(dim, Type<__nv_bfloat16>{}) : make(dim, Type<__half>{});
  };
  (pick(Dim<Ds>{}), ...);
  return fn;
}

// The fields of a bf16/fp16 step's Stage; rows(d) and cols(d) are its tiles (B_r, B_c).
Stage step_stage(std::string name, std::string prev, std::string summary, int (*rows)(int), int (*cols)(int)) {
  Stage s;
  s.name = std::move(name);
  s.prev = std::move(prev);
  s.summary = std::move(summary);
  s.min_sm = s.max_sm = 90;  // TMA, wgmma and setmaxnreg: built for sm_90a, which runs on 9.0 only
  s.dtypes = {DType::bf16, DType::fp16};
  s.head_dims.assign(std::begin(fa3::kHeadDims), std::end(fa3::kHeadDims));
  s.gqa = true;
  s.writes_lse = true;
  s.compute_bound = true;
  s.refuse = [rows](const AttnProblem& p) -> std::string {
    const long long r = rows(p.d);
    const long long ctas = (p.Nq + r - 1) / r * p.B * p.H;
    if (ctas > INT_MAX) return "needs " + std::to_string(ctas) + " CTAs; the 1-D grid holds at most 2^31 - 1";
    return "";
  };
  s.model_hbm_bytes = [rows, cols](const AttnProblem& p) { return hbm::fa2_bytes(p, rows(p.d), cols(p.d)); };
  return s;
}

int rows_06a(int) { return fa3::kWarpgroupRows; }

// 06a-c and 06d's steps 06d_1, 06d_2: one tile per CTA, so that each step measures only its
// own idea (06a has no producer to run ahead into a next tile). Dims: the built head dims
// (fa3::HeadDims; 06d's steps fa3::StepHeadDims).
template <int... Ds>
std::vector<int> dims_of(std::integer_sequence<int, Ds...>) {
  return {Ds...};
}

template <class Dims = fa3::HeadDims, class Make>
Stage one_tile_stage(std::string name, std::string prev, std::string summary, int (*rows)(int), int (*cols)(int),
                     Make make) {
  using LaunchFn = void (*)(const AttnProblem&, const AttnTensors&, cudaStream_t);
  Stage s = step_stage(std::move(name), std::move(prev), std::move(summary), rows, cols);
  s.head_dims = dims_of(Dims{});
  s.launch = [make](const AttnProblem& p, const AttnTensors& t, cudaStream_t stream) {
    instance_for<LaunchFn>(p, Dims{}, make)(p, t, stream);
  };
  return s;
}

// 06d and its ablations. It walks tiles persistently, handed out from a counter
// (fa3_common.cuh: next_unit), which with a causal mask balances the tiles' differing work
// as the hardware's hand-out of CTAs does, without a CTA start per tile. kCtaPairs: the
// instance with the CTA pairs' code; kEagerRescale: O_i rescaled every block (FA3 as
// published), not lazily.
using ScheduleFn = Schedule (*)(const AttnProblem&);
Schedule one_tile(const AttnProblem&) { return Schedule::one_tile_per_cta; }
Schedule persistent(const AttnProblem&) { return Schedule::persistent; }
Schedule cta_pairs_unless_causal(const AttnProblem& p) {
  return p.causal ? Schedule::one_tile_per_cta : Schedule::persistent_cta_pairs;
}

template <ScheduleFn kSchedule, bool kCtaPairs = false, bool kEagerRescale = false>
Stage stage_06d(std::string name, std::string prev, std::string summary) {
  using LaunchFn = void (*)(const AttnProblem&, const AttnTensors&, Schedule, cudaStream_t, float);
  Stage s = step_stage(std::move(name), std::move(prev), std::move(summary), fa3::block_rows, fa3::block_cols);
  if (kSchedule == persistent)  // its unit counter (fa3_common.cuh: next_unit); CTA pairs use none
    s.workspace_bytes = [](const AttnProblem&) { return sizeof(int); };
  s.launch = [](const AttnProblem& p, const AttnTensors& t, cudaStream_t stream) {
    const LaunchFn fn = instance_for<LaunchFn>(p, fa3::HeadDims{}, [](auto dim, auto type) {
      constexpr int D = decltype(dim)::value;
      return &fa3::step06d::launch<D, typename decltype(type)::type, kCtaPairs || fa3::cta_pairs_code_in_06d(D)>;
    });
    fn(p, t, kSchedule(p), stream, kEagerRescale ? -INFINITY : fa3::kRescaleLog2);
  };
  return s;
}

// The backward steps of 06d (06e_bwd_wgmma.cuh, 06f_bwd_dq_reduce.cuh, 06g_bwd_one_dq_add.cuh,
// 06h_bwd_dq_columns.cuh, 06i_bwd_shared_space.cuh, 06j_bwd_issue_order.cuh,
// 06k_bwd_tall_steps.cuh, 06l_bwd_tma_store.cuh, 06m_bwd_heavy_first.cuh,
// 06n_bwd_k_in_registers.cuh, 06o_bwd_tail_pieces.cuh, 06p_bwd_dq_writer.cuh,
// 06q_bwd_persistent.cuh) for the head dims they were built for (fa3::BwdHeadDims), with 05's
// workspace (dQ_acc, D); 06o-06q add the tail's dK, dV sums, 06q its tile counter.
// l_deterministic is not a step but 06l's ablation: dQ added in key-block order.
enum class BwdStep { e_atomics, f_bulk_per_warpgroup, g_bulk_per_cta, h_dq_columns, i_shared_space, j_issue_order, k_tall_steps,
                     l_tma_store, l_deterministic, m_heavy_first, n_k_in_registers, o_tail_pieces, p_dq_writer,
                     q_persistent };
// What autograd, training and the context-parallel ring run through 06d_fa3: the fastest step.
constexpr BwdStep kBackwardOf06d = BwdStep::q_persistent;
template <BwdStep kStep>
void add_backward_06(Stage& s) {
  s.backward_head_dims = dims_of(fa3::BwdHeadDims{});
  if (s.backward_head_dims.empty()) return;  // a lab build without them
  s.backward_strided_dout = kStep >= BwdStep::o_tail_pieces;  // dO by a 4-D tensor map (06o's launch, 06p's, 06q's)
  s.backward_refuse = [](const AttnProblem& p) -> std::string {
    const int64_t ctas = fa2::bwd_ctas(p, fa3::step06e::kBwdKeysPerCta);
    if (ctas > INT_MAX)
      return "ceil(Nk / 128) * B * Hkv = " + std::to_string(ctas) + " CTAs exceeds the grid limit 2^31 - 1";
    return "";
  };
  s.backward_workspace_bytes = [](const AttnProblem& p) {
    size_t extra = 0;
    if constexpr (kStep == BwdStep::l_deterministic) extra = fa3::step06l::dq_turn_bytes(p);
    else if constexpr (kStep == BwdStep::q_persistent)  // the tail's sums and the tile counter
      extra = fa3::step06q::workspace_bytes_after_05(fa3::step06o::tail_plan_for(p), p.d);
    else if constexpr (kStep >= BwdStep::o_tail_pieces)  // the tail's dK, dV sums (the launch's plan)
      extra = fa3::step06o::tail_workspace_bytes(fa3::step06o::tail_plan_for(p), p.d);
    return fa2::bwd_workspace_bytes(p, fa2::DqMode::atomics) + extra;
  };
  // 06e and 06f add two partials of dQ_i per step (one per consumer warpgroup), 06g-06q one.
  s.model_backward_hbm_bytes = [](const AttnProblem& p) {
    constexpr int kDqAdds = kStep == BwdStep::e_atomics || kStep == BwdStep::f_bulk_per_warpgroup ? 2 : 1;
    const int rows = kStep >= BwdStep::k_tall_steps ? fa3::step06k::rows_per_step(p.d) : fa3::step06e::kBwdRowsPerStep;
    return hbm::fa2_backward_bytes(p, rows, fa3::step06e::kBwdKeysPerCta, kDqAdds);
  };
  s.launch_backward = [](const AttnProblem& p, const AttnBwdTensors& t, cudaStream_t stream) {
    using LaunchFn = void (*)(const AttnProblem&, const AttnBwdTensors&, cudaStream_t);
    instance_for<LaunchFn>(p, fa3::BwdHeadDims{}, [](auto dim, auto type) {
      constexpr int D = decltype(dim)::value;
      using T = typename decltype(type)::type;
      if constexpr (kStep == BwdStep::q_persistent) return &fa3::step06q::launch_backward<D, T>;
      else if constexpr (kStep == BwdStep::p_dq_writer) return &fa3::step06p::launch_backward<D, T>;
      else if constexpr (kStep == BwdStep::o_tail_pieces) return &fa3::step06o::launch_backward<D, T>;
      else if constexpr (kStep == BwdStep::n_k_in_registers) return &fa3::step06n::launch_backward<D, T>;
      else if constexpr (kStep == BwdStep::m_heavy_first) return &fa3::step06m::launch_backward<D, T>;
      else if constexpr (kStep == BwdStep::l_deterministic) return &fa3::step06l::launch_backward<D, T, true>;
      else if constexpr (kStep == BwdStep::l_tma_store) return &fa3::step06l::launch_backward<D, T>;
      else if constexpr (kStep == BwdStep::k_tall_steps) return &fa3::step06k::launch_backward<D, T>;
      else if constexpr (kStep == BwdStep::j_issue_order) return &fa3::step06j::launch_backward<D, T>;
      else if constexpr (kStep == BwdStep::i_shared_space) return &fa3::step06i::launch_backward<D, T>;
      else if constexpr (kStep == BwdStep::h_dq_columns) return &fa3::step06h::launch_backward<D, T>;
      else if constexpr (kStep == BwdStep::g_bulk_per_cta) return &fa3::step06g::launch_backward<D, T>;
      else if constexpr (kStep == BwdStep::f_bulk_per_warpgroup) return &fa3::step06f::launch_backward<D, T>;
      else return &fa3::step06e::launch_backward<D, T>;
    })(p, t, stream);
  };
}

// A stage of 06d's forward with backward step kStep.
template <BwdStep kStep>
Stage with_backward(Stage s) {
  add_backward_06<kStep>(s);
  return s;
}

// The FP8 path (fa3_fp8.h): one pre-kernel and attention kernel per head dim; the stages
// differ in the pre-kernel's options (the ablation of FA3 Table 3) and in where V̂ᵀ is made
// (Fp8Options::v_path: the ablations of the in-kernel transpose).
Stage fp8_stage(std::string name, std::string prev, std::string summary, fa3::Fp8Options opt) {
  Stage s;
  s.name = std::move(name);
  s.prev = std::move(prev);
  s.summary = std::move(summary);
  s.min_sm = s.max_sm = 90;
  s.dtypes = {DType::fp8_e4m3};
  s.head_dims.assign(std::begin(fa3::kFp8HeadDims), std::end(fa3::kFp8HeadDims));
  s.gqa = true;
  s.writes_lse = true;
  s.compute_bound = true;
  const bool vt_in_hbm = opt.v_path == fa3::Fp8VPath::in_hbm;
  s.refuse = [vt_in_hbm](const AttnProblem& p) -> std::string {
    const fa3::Fp8Workspace ws(p);  // the pre-kernel numbers the scale blocks of Q, K or V with an int
    const long long blocks = std::max(ws.q_blocks * p.B * p.H, ws.kv_blocks * p.B * p.Hkv);
    if (blocks > INT_MAX) return "needs " + std::to_string(blocks) + " scale blocks; the pre-kernel counts at most 2^31 - 1";
    if (vt_in_hbm && ws.nk_padded * p.d > INT_MAX) return "Nk too long for the transposed V tensor map";
    return "";
  };
  s.workspace_bytes = [vt_in_hbm](const AttnProblem& p) { return fa3::Fp8Workspace(p, vt_in_hbm).total; };
  s.launch = [opt](const AttnProblem& p, const AttnTensors& t, cudaStream_t stream) {
    fa3::fp8_launch_for(p.d)(p, t, opt, Schedule::persistent, stream);
  };
  // Attention kernel: FA2's traffic with e = 1 (e4m3 Q, K, V), plus one byte per element
  // of O (written as bf16); then the pre-kernel's reads and writes.
  s.model_hbm_bytes = [opt](const AttnProblem& p) {
    return hbm::fa2_bytes(p, fa3::fp8_block_rows(p.d), fa3::fp8_block_cols(p.d)) + double(p.o_elems()) +
           fa3::fp8_quantize_bytes(p, opt);
  };
  return s;
}

// The FP8 attention kernel on the caller's e4m3 Q, K, V and descales (fa3_fp8_e4m3.h): the
// refusals of fp8_stage, no pre-kernel (the kernel transposes V itself).
Stage fp8_e4m3_stage() {
  Stage s = fp8_stage("06_fp8_e4m3", "06_fp8_no_hadamard",
                      "FP8 on the caller's e4m3 Q, K, V and block descales (FA3's interface)",
                      fa3::Fp8Options{});  // no pre-kernel options: launch and cost model replaced below
  s.dtypes = {DType::e4m3};
  s.workspace_bytes = [](const AttnProblem& p) { return fa3::Fp8E4m3Workspace(p).total; };
  s.launch = [](const AttnProblem& p, const AttnTensors& t, cudaStream_t stream) {
    fa3::fp8_e4m3_launch_for(p.d)(p, t, Schedule::persistent, stream);
  };
  s.model_hbm_bytes = [](const AttnProblem& p) {
    return hbm::fa2_bytes(p, fa3::fp8_block_rows(p.d), fa3::fp8_block_cols(p.d)) + double(p.o_elems());
  };
  s.descale_blocks = [](const AttnProblem& p) { return DescaleBlocks{fa3::kFp8QBlockRows, fa3::fp8_block_cols(p.d)}; };
  return s;
}

// The FP8 instance of head dim d among kFp8HeadDims (its launch, pre-kernel or attention
// kernel: make(Dim<d>{})); any other d throws, naming the built ones.
template <class Fn, class Make, int... Ds>
Fn fp8_instance(int d, std::integer_sequence<int, Ds...>, Make make) {
  Fn fn = nullptr;
  ((d == Ds ? (fn = make(Dim<Ds>{}), true) : false) || ...);
  if (fn) return fn;
  std::string built;
  for (int k : fa3::kFp8HeadDims) built += (built.empty() ? "" : ", ") + std::to_string(k);
  throw AttnError("06_fa3_hopper fp8: no kernel for head dim d = " + std::to_string(d) + " (built: " + built + ")");
}

}  // namespace

namespace fa3 {

Fp8LaunchFn fp8_launch_for(int d) {
  return fp8_instance<Fp8LaunchFn>(d, Fp8HeadDims{}, [](auto dim) { return &launch_fp8<decltype(dim)::value>; });
}

Fp8QuantizeFn fp8_quantize_for(int d) {
  return fp8_instance<Fp8QuantizeFn>(d, Fp8HeadDims{},
                                     [](auto dim) { return &launch_fp8_quantize<decltype(dim)::value>; });
}

Fp8AttentionFn fp8_attention_for(int d) {
  return fp8_instance<Fp8AttentionFn>(d, Fp8HeadDims{},
                                      [](auto dim) { return &launch_fp8_attention<decltype(dim)::value>; });
}

Fp8E4m3LaunchFn fp8_e4m3_launch_for(int d) {
  return fp8_instance<Fp8E4m3LaunchFn>(d, Fp8HeadDims{},
                                       [](auto dim) { return &launch_fp8_e4m3<decltype(dim)::value>; });
}

}  // namespace fa3

std::vector<Stage> fa3_stages() {
  // 06d_fa3's backward is the last backward step's kernel (kBackwardOf06d); the stages
  // 06e_bwd_wgmma, 06f_bwd_dq_reduce, 06g_bwd_one_dq_add, 06h_bwd_dq_columns,
  // 06i_bwd_shared_space, 06j_bwd_issue_order, 06k_bwd_tall_steps, 06l_bwd_tma_store,
  // 06m_bwd_heavy_first, 06n_bwd_k_in_registers, 06o_bwd_tail_pieces, 06p_bwd_dq_writer and
  // 06q_bwd_persistent run 06d's forward and their own backward, each checked against the step before it.
  auto launch_06a = [](auto dim, auto type) {
    return &fa3::step06a::launch<decltype(dim)::value, typename decltype(type)::type>;
  };
  auto launch_06b = [](auto dim, auto type) {
    return &fa3::step06b::launch<decltype(dim)::value, typename decltype(type)::type>;
  };
  auto launch_06c = [](auto dim, auto type) {
    return &fa3::step06c::launch<decltype(dim)::value, typename decltype(type)::type>;
  };
  auto launch_06d1 = [](auto dim, auto type) {
    return &fa3::step06d1::launch<decltype(dim)::value, typename decltype(type)::type>;
  };
  auto launch_06d2 = [](auto dim, auto type) {
    return &fa3::step06d2::launch<decltype(dim)::value, typename decltype(type)::type>;
  };
  return {
      one_tile_stage("06a_tma_wgmma", "05_fa2_reordered",
                     "TMA loads on mbarriers, wgmma SS (QK^T) and RS (PV); one warpgroup", rows_06a,
                     fa3::block_cols_06a, launch_06a),
      one_tile_stage("06b_warp_specialized", "06a_tma_wgmma",
                     "producer warpgroup + K/V ring; 2 consumer warpgroups, 3 at d = 64 (setmaxnreg)", fa3::block_rows,
                     fa3::block_cols, launch_06b),
      one_tile_stage("06c_pingpong", "06b_warp_specialized",
                     "named barriers: one consumer's softmax under the other's GEMMs", fa3::block_rows,
                     fa3::block_cols, launch_06c),
      // 06d in three steps: the overlap alone, then the shorter softmax, then the schedule.
      one_tile_stage<fa3::StepHeadDims>("06d1_overlap", "06c_pingpong",
                                        "intra-warpgroup overlap: next QK^T and this PV issued together",
                                        fa3::block_rows, fa3::block_cols, launch_06d1),
      one_tile_stage<fa3::StepHeadDims>("06d2_lazy_softmax", "06d1_overlap",
                                        "lazy rescaling of O_i; the block's row max taken last, from P",
                                        fa3::block_rows, fa3::block_cols, launch_06d2),
      with_backward<kBackwardOf06d>(
          stage_06d<persistent>("06d_fa3", "06d2_lazy_softmax",
                                "persistent CTAs: the producer loads the next tile while the consumers finish")),
      // The backward's steps, each with 06d's forward: 06e-06q.
      with_backward<BwdStep::e_atomics>(
          stage_06d<persistent>("06e_bwd_wgmma", "06d_fa3",
                                "06d whose backward is 06e's: the five GEMMs on wgmma, keys as M, dQ by atomics")),
      with_backward<BwdStep::f_bulk_per_warpgroup>(
          stage_06d<persistent>("06f_bwd_dq_reduce", "06e_bwd_wgmma",
                                "06d whose backward adds dQ by TMA bulk reductions (06f), not per-thread reds")),
      with_backward<BwdStep::g_bulk_per_cta>(
          stage_06d<persistent>("06g_bwd_one_dq_add", "06f_bwd_dq_reduce",
                                "06f with one dQ add per CTA and step: the warpgroups' halves summed in shared memory")),
      with_backward<BwdStep::h_dq_columns>(
          stage_06d<persistent>("06h_bwd_dq_columns", "06g_bwd_one_dq_add",
                                "06g with dQ split by columns between the warpgroups, over all 128 keys: no partial sums")),
      with_backward<BwdStep::i_shared_space>(
          stage_06d<persistent>("06i_bwd_shared_space", "06h_bwd_dq_columns",
                                "06h with its shared storage in the shared address space: LDS/STS, not generic LD/ST")),
      with_backward<BwdStep::j_issue_order>(
          stage_06d<persistent>("06j_bwd_issue_order", "06i_bwd_shared_space",
                                "06i with dV issued under dS's elementwise work and dK under the dQ stores")),
      with_backward<BwdStep::k_tall_steps>(
          stage_06d<persistent>("06k_bwd_tall_steps", "06j_bwd_issue_order",
                                "06j with 128-row steps at d = 64: dQ_i split by query halves, dV after dS")),
      with_backward<BwdStep::l_tma_store>(
          stage_06d<persistent>("06l_bwd_tma_store", "06k_bwd_tall_steps",
                                "06k with dK, dV stored through shared memory by TMA, not by per-thread stores")),
      with_backward<BwdStep::m_heavy_first>(
          stage_06d<persistent>("06m_bwd_heavy_first", "06l_bwd_tma_store",
                                "06l with the causal grid heaviest first, in sections of heads that fit L2")),
      with_backward<BwdStep::n_k_in_registers>(
          stage_06d<persistent>("06n_bwd_k_in_registers", "06m_bwd_heavy_first",
                                "06m with K_j's rows in registers at d = 64: S's A operand read once per CTA")),
      with_backward<BwdStep::o_tail_pieces>(
          stage_06d<persistent>("06o_bwd_tail_pieces", "06n_bwd_k_in_registers",
                                "06n with the grid's last partial wave split into pieces of steps (no mask)")),
      with_backward<BwdStep::p_dq_writer>(
          stage_06d<persistent>("06p_bwd_dq_writer", "06o_bwd_tail_pieces",
                                "06o with dQ added by a writer warp at d = 128: the consumers no longer wait for it")),
      with_backward<BwdStep::q_persistent>(
          stage_06d<persistent>("06q_bwd_persistent", "06p_bwd_dq_writer",
                                "06p with persistent CTAs at d = 64: the next tile's K, V load under this one")),
      // Ablation of 06l: dQ added in key-block order, bitwise reproducible (06l_bwd.md).
      with_backward<BwdStep::l_deterministic>(
          stage_06d<persistent>("06l_bwd_deterministic", "06l_bwd_tma_store",
                                "06l with dQ added in key-block order (a turn per Q block): the same bits every run")),
      // Ablations of 06d's schedule: one tile per CTA, as 06a-c (same kernel); persistent
      // clusters of two CTAs that share each K/V block (TMA multicast), whose kernel adds
      // the pairs' code to 06d's (kCtaPairs).
      stage_06d<one_tile>("06d_one_tile_per_cta", "06d_fa3",
                          "06d without persistent CTAs: one tile per CTA, no overlap across tiles"),
      stage_06d<cta_pairs_unless_causal, /*kCtaPairs=*/true>(
          "06d_cta_pairs", "06d_fa3", "06d in CTA pairs: each K/V block loaded once per pair of Q blocks (multicast)"),
      // Ablation of 06d's lazy rescaling: O_i rescaled after every block, as in FA3.
      stage_06d<persistent, false, /*kEagerRescale=*/true>(
          "06d_eager_rescale", "06d_fa3", "06d rescaling O_i after every K/V block (no lazy rescaling), as FA3"),
      fp8_stage("06_fp8", "", "FP8 e4m3 (QGMMA): block quantization + Hadamard incoherent processing",
                {/*block_scales=*/true, /*hadamard=*/true}),
      fp8_stage("06_fp8_no_hadamard", "06_fp8", "FP8 ablation: block scales, no incoherent processing",
                {/*block_scales=*/true, /*hadamard=*/false}),
      fp8_stage("06_fp8_per_tensor_hadamard", "06_fp8", "FP8 ablation: one scale per tensor, with Hadamard",
                {/*block_scales=*/false, /*hadamard=*/true}),
      fp8_stage("06_fp8_per_tensor", "06_fp8", "FP8 baseline: one scale per tensor, no Hadamard",
                {/*block_scales=*/false, /*hadamard=*/false}),
      // Ablations of the in-kernel V transpose: V̂ᵀ's keys in order, so P's registers are
      // permuted across each quad (FA3's permute for column-major V), and V̂ᵀ made by the
      // pre-kernel.
      fp8_stage("06_fp8_keys_in_order", "06_fp8",
                "FP8 ablation: V transposed in the kernel with its keys in order, so P is permuted across each quad",
                {/*block_scales=*/true, /*hadamard=*/true, fa3::Fp8VPath::in_kernel_keys_in_order}),
      fp8_stage("06_fp8_vt_hbm", "06_fp8",
                "FP8 ablation: V transposed by the pre-kernel, through HBM (keys permuted, no shuffle)",
                {/*block_scales=*/true, /*hadamard=*/true, fa3::Fp8VPath::in_hbm}),
      // The caller quantized: e4m3 inputs with their block descales, as FA3's interface takes.
      fp8_e4m3_stage(),
  };
}

}  // namespace attn
