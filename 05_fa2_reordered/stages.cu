#include "05_fa2_reordered/fa2.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <climits>
#include <cmath>
#include <string>
#include <type_traits>

#include "05_fa2_reordered/fa2_ablation_tiles.h"
#include "05_fa2_reordered/fa2_backward.h"
#include "05_fa2_reordered/fa2_decode.h"
#include "05_fa2_reordered/fa2_steps.h"
#include "common/hbm_model.h"

// FA2_*_HEAD_DIMS: the head dims each stage has kernels for, generated in the build tree
// from the lists in CMakeLists.txt.
#include "stage_head_dims.h"

namespace attn {

namespace {

template <int... Ds>
struct HeadDims {
  static std::vector<int> list() { return {Ds...}; }
};

// Calls launch(element, std::integral_constant<int, d>) for the problem's dtype and head dim,
// one of the listed Ds (validate_problem has checked it is).
template <int... Ds, class Launch>
void dispatch(const AttnProblem& p, HeadDims<Ds...>, Launch&& launch) {
  auto with_dtype = [&](auto element) {
    const bool found = ((p.d == Ds && (launch(element, std::integral_constant<int, Ds>{}), true)) || ...);
    if (!found) throw AttnError("05_fa2_reordered: no kernel for d = " + std::to_string(p.d));
  };
  if (p.dtype == DType::bf16) return with_dtype(__nv_bfloat16{});
  with_dtype(__half{});
}

// B_r and B_c of the tile Cfg<d> that head dim d runs with.
struct TileShape {
  int Br, Bc;
};
template <template <int> class Cfg, int... Ds>
TileShape tile_shape(int d, HeadDims<Ds...>) {
  TileShape shape{0, 0};
  const bool found = ((d == Ds && (shape = {Cfg<Ds>::kBr, Cfg<Ds>::kBc}, true)) || ...);
  if (!found) throw AttnError("05_fa2_reordered: no tile for d = " + std::to_string(d));
  return shape;
}

// One CTA per (Q block, head, batch), all in grid.x.
std::string refuse_grid(const AttnProblem& p, int64_t Br) {
  const int64_t ctas = int64_t(p.B) * p.H * ((p.Nq + Br - 1) / Br);
  if (ctas > INT_MAX)
    return "B * H * ceil(Nq / B_r) = " + std::to_string(ctas) + " thread blocks exceeds the grid limit " +
           std::to_string(INT_MAX);
  return "";
}

// A stage's refuse and model_hbm_bytes for the tiles Cfg<d> over head dims Dims.
template <template <int> class Cfg, class Dims>
std::string refuse_tiles(const AttnProblem& p) {
  return refuse_grid(p, tile_shape<Cfg>(p.d, Dims{}).Br);
}
template <template <int> class Cfg, class Dims>
double model_bytes(const AttnProblem& p) {
  const TileShape shape = tile_shape<Cfg>(p.d, Dims{});
  return hbm::fa2_bytes(p, shape.Br, shape.Bc);
}

using Fa2Dims = HeadDims<FA2_HEAD_DIMS>;

// rescale_log2 = -inf: O_i rescaled after every K/V block (no lazy rescaling), as FA2 does.
template <bool kEagerRescale = false>
void launch_fa2_stage(const AttnProblem& p, const AttnTensors& t, cudaStream_t stream) {
  const float rescale_log2 = kEagerRescale ? -INFINITY : fa2::kRescaleLog2;
  dispatch(p, Fa2Dims{}, [&](auto element, auto d) {
    fa2::launch_fa2<decltype(element), decltype(d)::value>(p, t, stream, rescale_log2);
  });
}

// A step below 05d (fa2_steps.h); Launch is StepA, StepB or StepC below.
template <class Launch, class Dims>
void launch_step(const AttnProblem& p, const AttnTensors& t, cudaStream_t stream) {
  dispatch(p, Dims{}, [&](auto element, auto d) {
    Launch::template run<decltype(element), decltype(d)::value>(p, t, stream);
  });
}
struct StepA {
  template <typename T, int kD>
  static void run(const AttnProblem& p, const AttnTensors& t, cudaStream_t s) { fa2::step_a::launch_fa2<T, kD>(p, t, s); }
  template <int kD>
  using Tile = fa2::step_a::TileFor<kD>;
};
struct StepB {
  template <typename T, int kD>
  static void run(const AttnProblem& p, const AttnTensors& t, cudaStream_t s) { fa2::step_b::launch_fa2<T, kD>(p, t, s); }
  template <int kD>
  using Tile = fa2::step_b::TileFor<kD>;
};
struct StepC {
  template <typename T, int kD>
  static void run(const AttnProblem& p, const AttnTensors& t, cudaStream_t s) { fa2::step_c::launch_fa2<T, kD>(p, t, s); }
  template <int kD>
  using Tile = fa2::step_c::TileFor<kD>;
};

// The stage of step Launch over head dims Dims, chain-checked against `prev`: 05's record
// (dtypes, GQA, L) with its own kernel, tiles and summary, forward only.
template <class Launch, class Dims>
Stage step(const Stage& fa2, const char* name, const char* prev, const char* summary) {
  Stage s = fa2;
  s.name = name;
  s.prev = prev;
  s.summary = summary;
  s.head_dims = Dims::list();
  s.launch = launch_step<Launch, Dims>;
  s.refuse = refuse_tiles<Launch::template Tile, Dims>;
  s.model_hbm_bytes = model_bytes<Launch::template Tile, Dims>;
  return s;
}

// An ablation (fa2_ablations.cuh) over its head dims.
template <fa2::Ablation kA, class Dims>
void launch_ablation_stage(const AttnProblem& p, const AttnTensors& t, cudaStream_t stream) {
  dispatch(p, Dims{}, [&](auto element, auto d) {
    fa2::launch_ablation<kA, decltype(element), decltype(d)::value>(p, t, stream);
  });
}

template <fa2::Ablation kA>
struct AblationTile {
  template <int kD>
  using For = fa2::AblationTileFor<kA, kD>;
};

// A stage for ablation kA of stage `base`, over head dims Dims.
template <fa2::Ablation kA, class Dims>
Stage ablation(const Stage& base, const char* name, const char* summary) {
  Stage s = base;
  s.name = name;
  s.prev = base.name;
  s.summary = summary;
  s.head_dims = Dims::list();
  s.launch = launch_ablation_stage<kA, Dims>;
  s.refuse = refuse_tiles<AblationTile<kA>::template For, Dims>;
  s.model_hbm_bytes = model_bytes<AblationTile<kA>::template For, Dims>;
  return s;
}

// Flash-decoding (fa2_decode.cuh): split keys, packed GQA rows, a combine kernel.
using DecodeDims = HeadDims<FA2_DECODE_HEAD_DIMS>;

void launch_decode_stage(const AttnProblem& p, const AttnTensors& t, cudaStream_t stream) {
  dispatch(p, DecodeDims{}, [&](auto element, auto d) {
    fa2::launch_fa2_decode<decltype(element), decltype(d)::value>(p, t, stream);
  });
}

std::string refuse_decode(const AttnProblem& p) {
  if (p.Nq > fa2::kDecodeMaxNq)
    return "Nq = " + std::to_string(p.Nq) + " query rows: a decode stage takes at most " +
           std::to_string(fa2::kDecodeMaxNq) + " per head; use 05_fa2_reordered";
  if (int64_t(p.B) * p.Hkv > INT_MAX)
    return "B * Hkv = " + std::to_string(int64_t(p.B) * p.Hkv) + " exceeds the grid limit " + std::to_string(INT_MAX);
  if (int64_t(p.B) * p.H * p.Nq > INT_MAX)  // the combine's grid: one CTA per query row
    return "B * H * Nq = " + std::to_string(int64_t(p.B) * p.H * p.Nq) + " rows exceed the grid limit " +
           std::to_string(INT_MAX);
  return "";
}

// A problem the decode stage runs (workspace_bytes may be asked about any other: 0 then).
bool decode_shape_ok(const AttnProblem& p) {
  return p.B >= 1 && p.Hkv >= 1 && p.H >= p.Hkv && p.H % p.Hkv == 0 && p.Nq >= 1 && p.Nq <= fa2::kDecodeMaxNq &&
         p.Nk >= 1 && p.d >= 1;
}

Stage decode_stage(const Stage& fa2) {
  Stage s = fa2;
  s.name = "05_fa2_decode";
  s.prev = fa2.name;
  s.summary = "05 for decoding (Nq <= 64): keys split over CTAs, GQA heads packed, a combine kernel";
  s.head_dims = DecodeDims::list();
  s.compute_bound = false;  // reading K and V is the cost: % of copy bandwidth
  s.refuse = refuse_decode;
  s.launch = launch_decode_stage;
  s.workspace_bytes = [](const AttnProblem& p) -> size_t {
    if (!decode_shape_ok(p)) return 0;
    return fa2::decode_workspace_bytes(p, fa2::decode_split(p, fa2::decode_device()));
  };
  s.model_hbm_bytes = [](const AttnProblem& p) {
    if (!decode_shape_ok(p)) return 0.0;
    const fa2::DecodeSplit split = fa2::decode_split(p, fa2::decode_device());
    return hbm::decode_bytes(p, split.splits, split.row_blocks);
  };
  return s;
}

// The backward (fa2_backward.cuh): dQ by atomics on the main stage, by its own pass on
// 05_fa2_dq_pass.
using BackwardDims = HeadDims<FA2_BACKWARD_HEAD_DIMS>;

template <fa2::DqMode kMode>
void launch_backward_stage(const AttnProblem& p, const AttnBwdTensors& t, cudaStream_t stream) {
  dispatch(p, BackwardDims{}, [&](auto element, auto d) {
    fa2::launch_fa2_backward<decltype(element), decltype(d)::value, kMode>(p, t, stream);
  });
}

// The main backward kernel's grid, one CTA per (K/V block of `keys`, batch, KV head), within
// the grid limit.
std::string refuse_bwd_grid(const AttnProblem& p, int keys) {
  const int64_t ctas = fa2::bwd_ctas(p, keys);
  if (ctas > INT_MAX)
    return "ceil(Nk / B_c) * B * Hkv = " + std::to_string(ctas) + " thread blocks exceeds the grid limit " +
           std::to_string(INT_MAX);
  return "";
}

template <fa2::DqMode kMode>
void add_backward(Stage& s) {
  s.backward_head_dims = BackwardDims::list();
  if (s.backward_head_dims.empty()) return;  // a lab build compiles no backward
  s.backward_refuse = [](const AttnProblem& p) -> std::string {
    const int keys = p.d <= 64 ? fa2::BwdTileFor<64, kMode>::kKeys : fa2::BwdTileFor<128, kMode>::kKeys;
    if (std::string why = refuse_bwd_grid(p, keys); !why.empty()) return why;
    const int64_t dq_ctas =
        fa2::bwd_dq_ctas(p, p.d <= 64 ? fa2::DqTileFor<64>::kBr : fa2::DqTileFor<128>::kBr);
    if (kMode == fa2::DqMode::separate_pass && dq_ctas > INT_MAX)
      return "the dQ pass's ceil(Nq / B_r) * B * H = " + std::to_string(dq_ctas) +
             " thread blocks exceeds the grid limit " + std::to_string(INT_MAX);
    return "";
  };
  s.backward_workspace_bytes = [](const AttnProblem& p) { return fa2::bwd_workspace_bytes(p, kMode); };
  s.launch_backward = launch_backward_stage<kMode>;
  if constexpr (kMode == fa2::DqMode::atomics)  // the dQ pass recomputes: its own model, not written
    s.model_backward_hbm_bytes = [](const AttnProblem& p) {
      using T64 = fa2::BwdTileFor<64, kMode>;
      using T128 = fa2::BwdTileFor<128, kMode>;
      return p.d <= 64 ? hbm::fa2_backward_bytes(p, T64::kQueries, T64::kKeys)
                       : hbm::fa2_backward_bytes(p, T128::kQueries, T128::kKeys);
    };
}

// The ablation of the d = 128 backward's warp grids: each warp owns 16 keys (BwdOwnKeysTile).
using BwdOwnKeysDims = HeadDims<FA2_BWD_OWN_KEYS_HEAD_DIMS>;

void launch_bwd_own_keys(const AttnProblem& p, const AttnBwdTensors& t, cudaStream_t stream) {
  dispatch(p, BwdOwnKeysDims{}, [&](auto element, auto d) {
    constexpr int kD = decltype(d)::value;
    fa2::launch_fa2_backward<decltype(element), kD, fa2::DqMode::atomics, fa2::BwdOwnKeysTile<kD>>(p, t, stream);
  });
}

}  // namespace

std::vector<Stage> fa2_stages() {
  using fa2::Ablation;
  Stage fa2;
  fa2.name = "05_fa2_reordered";
  fa2.prev = "05c_cp_async";
  fa2.summary = "FlashAttention-2: Q-block outer loop, O in registers, delayed normalization, mma.sync";
  fa2.min_sm = 80;
  fa2.dtypes = {DType::bf16, DType::fp16};
  fa2.head_dims = Fa2Dims::list();
  fa2.gqa = true;
  fa2.writes_lse = true;
  fa2.compute_bound = true;
  fa2.refuse = refuse_tiles<fa2::TileFor, Fa2Dims>;
  fa2.launch = launch_fa2_stage<>;
  fa2.model_hbm_bytes = model_bytes<fa2::TileFor, Fa2Dims>;

  // The ablations: one FA2 choice undone each (fa2_ablations.cuh).
  Stage no_delay = ablation<Ablation::no_delay, HeadDims<FA2_NO_DELAY_HEAD_DIMS>>(
      fa2, "05_fa2_no_delay", "05 without delayed normalization (O_i rescaled by 1/l_i every K/V block)");
  // FA1's grid with FA2's loop order inside it, so the grid over the sequence is measured on its own.
  Stage one_cta = ablation<Ablation::one_cta_per_head, HeadDims<FA2_ONE_CTA_HEAD_DIMS>>(
      fa2, "05_fa2_one_cta_per_head",
      "05 on FA1's grid: one CTA per (batch, head) walks all Q blocks (no sequence parallelism)");
  one_cta.refuse = [](const AttnProblem&) { return std::string(); };  // B * H CTAs always fit the grid
  // FA1's warp split ("split-K"): the warps split the keys of each K/V block instead of the rows of Q_i.
  Stage split_kv = ablation<Ablation::warps_split_kv, HeadDims<FA2_SPLIT_KV_HEAD_DIMS>>(
      fa2, "05_fa2_warps_split_kv",
      "05 with FA1's warp split: warps split each K/V block (B_r = 32) and combine through smem");
  Stage prefetch = ablation<Ablation::prefetch, HeadDims<FA2_PREFETCH_HEAD_DIMS>>(
      fa2, "05_fa2_prefetch", "05 with P_ij V_j's first V_j fragments loaded (ldmatrix) before the softmax");
  Stage padded = ablation<Ablation::padded, HeadDims<FA2_PADDED_HEAD_DIMS>>(
      fa2, "05_fa2_padded", "05 with padded shared-memory rows (d + 8 elements) instead of the XOR swizzle");
  // Not an FA2 change, but one 05 makes: lazy rescaling switched off, as in FA2.
  Stage eager = fa2;
  eager.name = "05_fa2_eager_rescale";
  eager.prev = "05_fa2_reordered";
  eager.summary = "05 rescaling O_i after every K/V block (no lazy rescaling), as FA2";
  eager.launch = launch_fa2_stage</*kEagerRescale=*/true>;
  // The backward's choice for dQ (fa2_backward.h: DqMode): its own pass instead of atomics.
  Stage dq_pass = fa2;
  dq_pass.name = "05_fa2_dq_pass";
  dq_pass.prev = "05_fa2_reordered";
  dq_pass.summary = "05 whose backward sums dQ in a second pass over K/V instead of atomics (deterministic)";
  add_backward<fa2::DqMode::separate_pass>(dq_pass);
  // The steps that build 05 up, 04 -> 05a -> 05b -> 05c -> 05 (fa2_steps.h), before 05 in
  // the list so that each runs before the step above it (the chain checks compare in order).
  Stage step_a = step<StepA, HeadDims<FA2_STEP_A_HEAD_DIMS>>(
      fa2, "05a_q_outer", "04_fa1_tiled",
      "05 step a: Q blocks outer, warps split Q_i, O_i in registers, mma.sync; synchronous loads, padded rows");
  Stage step_b = step<StepB, HeadDims<FA2_STEP_B_HEAD_DIMS>>(
      fa2, "05b_ldmatrix", "05a_q_outer", "05 step b: 05a with mma fragments by ldmatrix from XOR-swizzled rows");
  Stage step_c = step<StepC, HeadDims<FA2_STEP_C_HEAD_DIMS>>(
      fa2, "05c_cp_async", "05b_ldmatrix", "05 step c: 05b with a cp.async ring: block j+1 loads while block j computes");
  std::vector<Stage> stages = {step_a, step_b, step_c, fa2, no_delay, one_cta, split_kv, prefetch, eager, padded, decode_stage(fa2)};
  // The d = 128 backward without FA2's warp grids.
  Stage own_keys = fa2;
  own_keys.name = "05_fa2_bwd_warps_own_keys";
  own_keys.prev = "05_fa2_reordered";
  own_keys.summary = "05 whose d = 128 backward keeps P, dS in registers: a warp owns 16 keys, reads all of Q_i, dO_i";
  add_backward<fa2::DqMode::atomics>(own_keys);
  own_keys.backward_head_dims = BwdOwnKeysDims::list();
  own_keys.backward_refuse = [](const AttnProblem& p) { return refuse_bwd_grid(p, fa2::BwdOwnKeysTile<128>::kKeys); };
  own_keys.launch_backward = launch_bwd_own_keys;
  for (Stage* s : {&dq_pass, &own_keys})  // a lab build compiles no backward
    if (s->has_backward() && !s->backward_head_dims.empty()) stages.push_back(*s);
  for (Stage& s : stages)  // the other copies (steps, ablations, decode) stay forward only
    if (s.name == fa2.name) add_backward<fa2::DqMode::atomics>(s);
  return stages;
}


namespace fa2 {

// The checks the host can make of a paged call (the rest, the table's entries and the
// lengths, the kernel makes): sizes, the capacity as p.Nk, pointers, alignment, workspace.
static void check_paged(const AttnProblem& p, const PagedKV& kv, const AttnTensors& t) {
  auto refuse = [](const std::string& why) { throw AttnError("05_fa2_decode (paged): " + why); };
  if (kv.page_size < kPageSizeMin || kv.page_size > kPageSizeMax)
    refuse("page_size = " + std::to_string(kv.page_size) + " is not in [" + std::to_string(kPageSizeMin) + ", " +
           std::to_string(kPageSizeMax) + "]");
  if (kv.num_pages < 1) refuse("num_pages = " + std::to_string(kv.num_pages) + ": the cache needs a page");
  if (kv.max_pages < 1) refuse("max_pages = " + std::to_string(kv.max_pages) + ": the block table needs a column");
  const int64_t capacity = int64_t(kv.max_pages) * kv.page_size;
  if (capacity > INT_MAX)
    refuse("max_pages * page_size = " + std::to_string(capacity) + " tokens exceed 2^31 - 1");
  if (p.Nk != capacity)
    refuse("Nk = " + std::to_string(p.Nk) + " must be the block table's capacity max_pages * page_size = " +
           std::to_string(capacity));
  const std::pair<const char*, const void*> named[] = {{"q", t.q}, {"k_cache", kv.k_cache}, {"v_cache", kv.v_cache},
                                                       {"o", t.o}, {"block_table", kv.block_table},
                                                       {"seq_lens", kv.seq_lens}, {"workspace", t.workspace}};
  for (const auto& [name, ptr] : named) {
    if (!ptr) refuse(std::string(name) + " is a null pointer");
    const size_t align = std::string(name) == "block_table" || std::string(name) == "seq_lens" ? 4 : 16;
    if (reinterpret_cast<uintptr_t>(ptr) % align)
      refuse(std::string(name) + " is not " + std::to_string(align) + "-byte aligned");
  }
  const size_t need = decode_paged_workspace(p);
  if (t.workspace_bytes < need)
    refuse("workspace of " + std::to_string(t.workspace_bytes) + " bytes; it needs " + std::to_string(need));
}

size_t decode_paged_workspace(const AttnProblem& p) {
  return decode_paged_workspace_bytes(p, decode_split(p, decode_device()));
}

size_t decode_paged_records(const AttnProblem& p) {
  return size_t(p.B) * size_t(decode_split(p, decode_device()).splits);
}

void run_decode_paged(const AttnProblem& p, const PagedKV& kv, const AttnTensors& t, cudaStream_t stream) {
  check_paged(p, kv, t);
  dispatch(p, DecodeDims{}, [&](auto element, auto d) {
    launch_fa2_decode_paged<decltype(element), decltype(d)::value>(p, kv, t, stream);
  });
}

}  // namespace fa2

}  // namespace attn
