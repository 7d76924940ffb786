// Rung 04: FlashAttention-1, Algorithm 1 as written (fa1_tiled_kernel.cuh), and its
// backward, Algorithm 4 (fa1_backward.cuh). This file picks B_r and B_c from the device's
// shared memory and registers the stage.
#include <climits>
#include <string>

#include "04_fa1_tiled/fa1.h"
#include "04_fa1_tiled/fa1_backward.h"
#include "04_fa1_tiled/fa1_tiled.cuh"
#include "common/check.h"
#include "common/dtype.cuh"
#include "common/hbm_model.h"
#include "stage_head_dims.h"  // LADDER_HEAD_DIMS, generated from CMakeLists.txt

namespace attn {
namespace fa1 {

Blocks choose_blocks(int d, int elem_bytes, size_t smem_bytes) {
  const int64_t M = int64_t(smem_bytes) / elem_bytes;  // on-chip memory, in elements
  const int64_t per_block = (M + 4 * d - 1) / (4 * d);  // ceil(M / 4d)
  Blocks b;
  b.Bc = int(per_block / kTile * kTile);
  b.Br = int(std::min<int64_t>(per_block, d) / kTile * kTile);
  while (b.Br >= kTile && b.Bc >= kTile && SmemLayout{b.Br, b.Bc, d, elem_bytes}.bytes() > smem_bytes) {
    if (b.Bc >= b.Br)
      b.Bc -= kTile;
    else
      b.Br -= kTile;
  }
  if (b.Br < kTile || b.Bc < kTile) return Blocks{};
  return b;
}

Blocks device_blocks(const AttnProblem& p) {
  int dev = 0, smem = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  const Blocks b = choose_blocks(p.d, int(dtype_bytes(p.dtype)), size_t(smem));
  if (b.Br == 0)
    throw AttnError("04_fa1_tiled: " + std::to_string(smem) + " bytes of shared memory per block hold no " +
                    std::to_string(kTile) + "x" + std::to_string(kTile) + " blocks at d = " + std::to_string(p.d));
  return b;
}

Blocks choose_bwd_blocks(int d, int elem_bytes, size_t smem_bytes) {
  Blocks b{kBwdMaxBlock, kBwdMaxBlock};
  while (b.Bc >= kTile && BwdSmemLayout{b.Br, b.Bc, d, elem_bytes}.bytes() > smem_bytes) {
    if (b.Br > kTile)
      b.Br -= kTile;
    else
      b.Bc -= kTile;
  }
  if (b.Bc < kTile) return Blocks{};
  return b;
}

// choose_bwd_blocks on the current device; throws AttnError when nothing fits.
Blocks device_bwd_blocks(const AttnProblem& p) {
  int dev = 0, smem = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  const Blocks b = choose_bwd_blocks(p.d, int(dtype_bytes(p.dtype)), size_t(smem));
  if (b.Br == 0)
    throw AttnError("04_fa1_tiled backward: " + std::to_string(smem) + " bytes of shared memory per block hold no " +
                    std::to_string(kTile) + "x" + std::to_string(kTile) + " blocks at d = " + std::to_string(p.d));
  return b;
}

}  // namespace fa1

namespace {

template <typename T>
void launch_fa1(const AttnProblem& p, const AttnTensors& t, cudaStream_t stream) {
  const fa1::Blocks blocks = fa1::device_blocks(p);
  switch (p.d) {
    case 64: return fa1::fa1_launch<T, 64>(p, t, blocks, stream);
    case 128: return fa1::fa1_launch<T, 128>(p, t, blocks, stream);
  }
  throw AttnError("04_fa1_tiled: no kernel for d = " + std::to_string(p.d));
}

// The head dims the backward has kernels for (CMakeLists.txt; none in a lab build).
template <int... Ds>
struct BackwardDims {};
using Fa1BackwardDims = BackwardDims<FA1_BACKWARD_HEAD_DIMS>;

// The backward for the problem's head dim, one of Ds (validate_backward_problem has checked
// it is one).
template <typename T, int... Ds>
void launch_fa1_backward(const AttnProblem& p, const AttnBwdTensors& t, BackwardDims<Ds...>, cudaStream_t stream) {
  const fa1::Blocks blocks = fa1::device_bwd_blocks(p);
  const bool found = ((p.d == Ds && (fa1::fa1_backward_launch<T, Ds>(p, t, blocks, stream), true)) || ...);
  if (!found) throw AttnError("04_fa1_tiled: no backward kernel for d = " + std::to_string(p.d));
}

// One CTA per (K/V block, batch, key/value head). B_c is at least one 16-key tile on any
// device (choose_bwd_blocks), so ceil(Nk / 16) * B * Hkv bounds the grid.
std::string refuse_backward_grid(const AttnProblem& p) {
  const int64_t ctas = (int64_t(p.Nk) + fa1::kTile - 1) / fa1::kTile * p.B * p.Hkv;
  if (ctas > INT_MAX)
    return "ceil(Nk / 16) * B * Hkv = " + std::to_string(ctas) + " thread blocks could exceed the grid limit " +
           std::to_string(INT_MAX);
  return "";
}

}  // namespace

std::vector<Stage> fa1_stages() {
  Stage s;
  s.name = "04_fa1_tiled";
  s.prev = "03b_fused_online";
  s.summary = "FlashAttention-1 Algorithm 1: K/V blocks outer, Q blocks inner, O/l/m through HBM, WMMA";
  s.min_sm = 80;
  s.dtypes = {DType::bf16, DType::fp16};
  s.head_dims = {LADDER_HEAD_DIMS};  // stage_head_dims.h, from CMakeLists.txt
  s.gqa = true;
  s.writes_lse = true;
  s.compute_bound = true;
  s.refuse = [](const AttnProblem& p) -> std::string {
    if (int64_t(p.B) * p.H > INT_MAX)
      return "B*H = " + std::to_string(int64_t(p.B) * p.H) + " CTAs exceed the grid limit " + std::to_string(INT_MAX);
    return "";
  };
  // O (fp32, [B,H,Nq,d]), l and m (fp32, [B,H,Nq] each)
  s.workspace_bytes = [](const AttnProblem& p) {
    return size_t(p.o_elems() + 2 * p.lse_elems()) * sizeof(float);
  };
  s.launch = [](const AttnProblem& p, const AttnTensors& t, cudaStream_t stream) {
    if (p.dtype == DType::bf16) return launch_fa1<__nv_bfloat16>(p, t, stream);
    return launch_fa1<__half>(p, t, stream);
  };
  s.model_hbm_bytes = [](const AttnProblem& p) {
    const fa1::Blocks b = fa1::device_blocks(p);
    return hbm::fa1_bytes(p, b.Br, b.Bc);
  };
  // The backward, Algorithm 4 (fa1_backward.cuh); none in a lab build (CMakeLists.txt).
  s.backward_head_dims = {FA1_BACKWARD_HEAD_DIMS};
  if (!s.backward_head_dims.empty()) {
    s.backward_refuse = refuse_backward_grid;
    s.backward_workspace_bytes = fa1::bwd_workspace_bytes;
    s.launch_backward = [](const AttnProblem& p, const AttnBwdTensors& t, cudaStream_t stream) {
      if (p.dtype == DType::bf16) return launch_fa1_backward<__nv_bfloat16>(p, t, Fa1BackwardDims{}, stream);
      return launch_fa1_backward<__half>(p, t, Fa1BackwardDims{}, stream);
    };
  }
  return {s};
}

}  // namespace attn
