#include "05_fa2_reordered/fa2.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <climits>
#include <cmath>
#include <string>

#include "05_fa2_reordered/fa2_tiles.h"
#include "common/hbm_model.h"

namespace attn {

namespace {

struct TileShape {
  int Br, Bc;
};

// The B_r x B_c tile that head dim d runs with (fa2_tiles.h).
TileShape tile_shape(int d) {
  switch (d) {
    case 64: return {fa2::Tile64::kBr, fa2::Tile64::kBc};
    case 128: return {fa2::Tile128::kBr, fa2::Tile128::kBc};
    default: return {fa2::Tile256::kBr, fa2::Tile256::kBc};
  }
}

// One CTA per (Q block, head, batch), all in grid.x.
std::string refuse_grid(const AttnProblem& p, int64_t Br) {
  const int64_t ctas = int64_t(p.B) * p.H * ((p.Nq + Br - 1) / Br);
  if (ctas > INT_MAX)
    return "B * H * ceil(Nq / B_r) = " + std::to_string(ctas) + " thread blocks exceeds the grid limit " +
           std::to_string(INT_MAX);
  return "";
}

std::string refuse_fa2_grid(const AttnProblem& p) { return refuse_grid(p, tile_shape(p.d).Br); }
double model_bytes(const AttnProblem& p) { return hbm::fa2_bytes(p, tile_shape(p.d).Br, tile_shape(p.d).Bc); }

template <typename T>
void launch_delayed(const AttnProblem& p, const AttnTensors& t, cudaStream_t stream, float rescale_log2) {
  switch (p.d) {
    case 64: return fa2::launch_fa2<T, fa2::Tile64, true>(p, t, stream, rescale_log2);
    case 128: return fa2::launch_fa2<T, fa2::Tile128, true>(p, t, stream, rescale_log2);
    default: return fa2::launch_fa2<T, fa2::Tile256, true>(p, t, stream, rescale_log2);
  }
}

// kEagerRescale: O_i rescaled after every K/V block (rescale_log2 = -inf), as FA2 does; the
// ablation of lazy rescaling.
template <bool kEagerRescale = false>
void launch_fa2_stage(const AttnProblem& p, const AttnTensors& t, cudaStream_t stream) {
  const float rescale_log2 = kEagerRescale ? -INFINITY : fa2::kRescaleLog2;
  if (p.dtype == DType::bf16) return launch_delayed<__nv_bfloat16>(p, t, stream, rescale_log2);
  return launch_delayed<__half>(p, t, stream, rescale_log2);
}

// The d = 128 ablations: one FA2 change switched off (fa2_tiles.h: launch_fa2).
template <class Cfg, bool kDelayedNorm, bool kOneCtaPerHead>
void launch_ablation(const AttnProblem& p, const AttnTensors& t, cudaStream_t stream) {
  if (p.dtype == DType::bf16) return fa2::launch_fa2<__nv_bfloat16, Cfg, kDelayedNorm, kOneCtaPerHead>(p, t, stream);
  return fa2::launch_fa2<__half, Cfg, kDelayedNorm, kOneCtaPerHead>(p, t, stream);
}

// The prefetch variant: 05's tiles with kVAhead > 0 (fa2_tiles.h), d = 128 and 256.
template <typename T>
void launch_prefetch_typed(const AttnProblem& p, const AttnTensors& t, cudaStream_t stream) {
  if (p.d == 128) return fa2::launch_fa2<T, fa2::Tile128Prefetch, true>(p, t, stream);
  return fa2::launch_fa2<T, fa2::Tile256Prefetch, true>(p, t, stream);
}

void launch_prefetch(const AttnProblem& p, const AttnTensors& t, cudaStream_t stream) {
  if (p.dtype == DType::bf16) return launch_prefetch_typed<__nv_bfloat16>(p, t, stream);
  return launch_prefetch_typed<__half>(p, t, stream);
}

// The layout ablation: 05's tiles, padded (fa2_tiles.h), d = 64 and 128.
template <typename T>
void launch_padded_typed(const AttnProblem& p, const AttnTensors& t, cudaStream_t stream) {
  if (p.d == 64) return fa2::launch_fa2<T, fa2::Tile64Padded, true>(p, t, stream);
  return fa2::launch_fa2<T, fa2::Tile128Padded, true>(p, t, stream);
}

void launch_padded(const AttnProblem& p, const AttnTensors& t, cudaStream_t stream) {
  if (p.dtype == DType::bf16) return launch_padded_typed<__nv_bfloat16>(p, t, stream);
  return launch_padded_typed<__half>(p, t, stream);
}

}  // namespace

std::vector<Stage> fa2_stages() {
  Stage fa2;
  fa2.name = "05_fa2_reordered";
  fa2.prev = "04_fa1_tiled";
  fa2.summary = "FlashAttention-2: Q-block outer loop, O in registers, delayed normalization, mma.sync";
  fa2.min_sm = 80;
  fa2.dtypes = {DType::bf16, DType::fp16};
  fa2.head_dims = {64, 128, 256};
  fa2.gqa = true;
  fa2.writes_lse = true;
  fa2.compute_bound = true;
  fa2.refuse = refuse_fa2_grid;
  fa2.launch = launch_fa2_stage<>;
  fa2.model_hbm_bytes = model_bytes;

  // Ablation: the same kernel dividing O_i by l_i at every step, as FlashAttention-1.
  Stage no_delay = fa2;
  no_delay.name = "05_fa2_no_delay";
  no_delay.prev = "05_fa2_reordered";
  no_delay.summary = "05 without delayed normalization (O_i rescaled by 1/l_i every K/V block)";
  no_delay.head_dims = {128};
  no_delay.launch = launch_ablation<fa2::Tile128Padded, /*kDelayedNorm=*/false, /*kOneCtaPerHead=*/false>;

  // Ablation: FA1's grid (one CTA per batch and head) with FA2's loop order inside it, so
  // the grid over the sequence is measured on its own.
  Stage one_cta = fa2;
  one_cta.name = "05_fa2_one_cta_per_head";
  one_cta.prev = "05_fa2_reordered";
  one_cta.summary = "05 on FA1's grid: one CTA per (batch, head) walks all Q blocks (no sequence parallelism)";
  one_cta.head_dims = {128};
  one_cta.refuse = [](const AttnProblem&) { return std::string(); };  // B * H CTAs always fit the grid
  one_cta.launch = launch_ablation<fa2::Tile128Padded, /*kDelayedNorm=*/true, /*kOneCtaPerHead=*/true>;

  // Ablation: FA1's warp split ("split-K"). The warps of a CTA split the keys of each K/V
  // block instead of the rows of Q_i, so they exchange row maxima every block and sum their
  // partial O_i at the end; every warp then holds all B_r rows of O_i, hence B_r = 32.
  using SplitKV = fa2::Tile128SplitKV;
  Stage split_kv = fa2;
  split_kv.name = "05_fa2_warps_split_kv";
  split_kv.prev = "05_fa2_reordered";
  split_kv.summary = "05 with FA1's warp split: warps split each K/V block (B_r = 32) and combine through smem";
  split_kv.head_dims = {128};
  split_kv.refuse = [](const AttnProblem& p) { return refuse_grid(p, SplitKV::kBr); };
  split_kv.launch = launch_ablation<SplitKV, /*kDelayedNorm=*/true, /*kOneCtaPerHead=*/false>;
  split_kv.model_hbm_bytes = [](const AttnProblem& p) { return hbm::fa2_bytes(p, SplitKV::kBr, SplitKV::kBc); };

  // Variant: 05 with the first V_j fragments of P_ij V_j loaded into registers before the
  // softmax (Tile::kVAhead), so that the first mma of P_ij V_j need not wait for ldmatrix.
  Stage prefetch = fa2;
  prefetch.name = "05_fa2_prefetch";
  prefetch.prev = "05_fa2_reordered";
  prefetch.summary = "05 with P_ij V_j's first V_j fragments loaded (ldmatrix) before the softmax";
  prefetch.head_dims = {128, 256};
  prefetch.launch = launch_prefetch;

  // Ablation of the shared-memory layout at d = 64 and 128: rows padded by one 16-byte chunk
  // instead of XOR-swizzled (fa2_kernel.cuh draws both).
  Stage padded = fa2;
  padded.name = "05_fa2_padded";
  padded.prev = "05_fa2_reordered";
  padded.summary = "05 with padded shared-memory rows (d + 8 elements) instead of the XOR swizzle";
  padded.head_dims = {64, 128};
  padded.launch = launch_padded;

  // Ablation (not an FA2 change, but one 05 makes): lazy rescaling switched off, so that
  // O_i is rescaled after every K/V block, as in FA2.
  Stage eager = fa2;
  eager.name = "05_fa2_eager_rescale";
  eager.prev = "05_fa2_reordered";
  eager.summary = "05 rescaling O_i after every K/V block (no lazy rescaling), as FA2";
  eager.launch = launch_fa2_stage</*kEagerRescale=*/true>;
  return {fa2, no_delay, one_cta, split_kv, prefetch, eager, padded};
}

}  // namespace attn
