// Rung 06's FP8 forward on e4m3 inputs (fa3_fp8_e4m3.h): the caller's Q8, K8, V8 and
// descales, the attention kernel of fp8_fa3.cuh unchanged. Two launches on the stream:
//
//   1. transpose_v: V8 [heads, Nk, d] -> V̂ᵀ [heads, d, Nk padded] in the workspace, the
//      layout the P V QGMMA reads (keys contiguous, permuted inside every 32 by
//      wgmma_key_position, zero past Nk). Bytes are moved, never rounded: the bf16 path's
//      own transpose (store_transposed, fp8_quantize.cuh) on a block loaded as it is.
//   2. the attention kernel, fp8::fa3_forward, with its tensor maps on the caller's Q8 and
//      K8 in place (the [heads, N, d] layout of the workspace's Q̂ and K̂) and its scales
//      the caller's descales.
//
// Included only by the FP8 instance files (fp8_fa3.cu.in): the kernel it launches is
// compiled there once for both paths.
#pragma once

#include <cstdint>

#include "06_fa3_hopper/fa3_fp8_e4m3.h"
#include "06_fa3_hopper/fp8_fa3.cuh"

namespace attn::fa3 {
namespace fp8_inputs {

struct TransposeArgs {
  const uint8_t* v8;  // e4m3 [heads, N, D]
  uint8_t* vt8;       // e4m3 [heads, D, n_padded]
  int N;              // keys per head
  int blocks;         // B_c-key blocks per head
  int64_t n_padded;   // blocks * B_c
};

// One CTA per block of B_c keys of one head, with store_transposed's threads: the block's
// rows (R * D contiguous bytes of V8) into shared memory with 16-byte loads, zeros for the
// keys past N, then store_transposed writes them to V̂ᵀ in wgmma_key_position's order.
template <int D>
__global__ void __launch_bounds__(kRowThreads<fp8_block_cols(D)>) transpose_v(const TransposeArgs a) {
  constexpr int R = fp8_block_cols(D);
  constexpr int kVectors = R * D / 16;
  __shared__ __align__(16) uint8_t tile[R][D];
  const int head = int(blockIdx.x) / a.blocks, key0 = (int(blockIdx.x) % a.blocks) * R;
  const int valid = min(R, a.N - key0) * D / 16;  // 16-byte vectors of real keys
  const uint4* src = reinterpret_cast<const uint4*>(a.v8 + (size_t(head) * a.N + key0) * D);
  uint4* dst = reinterpret_cast<uint4*>(&tile[0][0]);
  for (int i = threadIdx.x; i < kVectors; i += blockDim.x) dst[i] = i < valid ? src[i] : make_uint4(0, 0, 0, 0);
  __syncthreads();
  // store_transposed reads only the destination and its row length.
  const QuantArgs out{nullptr, a.vt8, nullptr, nullptr, 0, a.N, a.blocks, a.n_padded, false};
  store_transposed<D, R>(tile, out, head, key0);
}

}  // namespace fp8_inputs

template <int D>
void launch_fp8_e4m3(const AttnProblem& pr, const AttnTensors& tensors, Schedule schedule, cudaStream_t stream) {
  using Cfg = fp8::Config<D>;
  using fp8::E4m3;
  for (const void* ptr : {tensors.q, tensors.k, tensors.v, static_cast<const void*>(tensors.o),
                          static_cast<const void*>(tensors.workspace)})
    if (reinterpret_cast<uintptr_t>(ptr) % 16 != 0)
      throw AttnError("06_fa3_hopper fp8 e4m3: Q, K, V, O and the workspace must be 16-byte aligned (TMA)");
  const Fp8Workspace blocks(pr);  // block counts and V̂ᵀ's row length; its offsets are the bf16 path's
  const Fp8E4m3Workspace ws(pr);
  char* base = static_cast<char*>(tensors.workspace);

  // 1. V̂ᵀ (stages.cu refuses more blocks than an int holds).
  const fp8_inputs::TransposeArgs ta{static_cast<const uint8_t*>(tensors.v), reinterpret_cast<uint8_t*>(base + ws.vt8),
                                     pr.Nk, int(blocks.kv_blocks), blocks.nk_padded};
  fp8_inputs::transpose_v<D><<<unsigned(int64_t(pr.B) * pr.Hkv * blocks.kv_blocks), kRowThreads<Cfg::B_c>, 0,
                               stream>>>(ta);
  CUDA_CHECK_LAUNCH();

  // 2. The attention kernel, as fp8::launch sets it up, on the caller's tensors.
  constexpr auto kKernel = fp8::fa3_forward<D>;
  constexpr size_t kSmemBytes = sizeof(fp8::SharedStorage<D>) + alignof(fp8::SharedStorage<D>);
  const int ctas_per_sm = configure_kernel<kKernel>(Cfg::kThreads, kSmemBytes);
  constexpr CUtensorMapDataType kType = CU_TENSOR_MAP_DATA_TYPE_UINT8;  // e4m3 bytes
  constexpr int kE4m3Bytes = 1;
  fp8::Params p{};
  p.q_map = make_tensor_map_3d(tensors.q, kType, pr.B * pr.H, pr.Nq, D, kWarpgroupRows, kE4m3Bytes, Cfg::kSwizzle);
  p.k_map = make_tensor_map_3d(tensors.k, kType, pr.B * pr.Hkv, pr.Nk, D, Cfg::B_c, kE4m3Bytes, Cfg::kSwizzle);
  p.vt_map = make_tensor_map_3d(base + ws.vt8, kType, pr.B * pr.Hkv, D, int(blocks.nk_padded), D, kE4m3Bytes,
                                Cfg::kVtSwizzle);
  p.o = static_cast<__nv_bfloat16*>(tensors.o);
  p.lse = tensors.lse;
  p.q_scale = tensors.q_descale;
  p.k_scale = tensors.k_descale;
  p.v_scale = tensors.v_descale;
  p.q_blocks = int(blocks.q_blocks);
  p.kv_blocks = int(blocks.kv_blocks);
  set_problem<Cfg::B_r>(p, pr, sizeof(E4m3));

  const unsigned grid = grid_size(p.n_tiles, schedule, ctas_per_sm);
  p.unit_counter = unit_counter(tensors, ws.unit_counter, schedule, pr.causal, stream);
  kKernel<<<grid, Cfg::kThreads, kSmemBytes, stream>>>(p);
  CUDA_CHECK_LAUNCH();
}

}  // namespace attn::fa3
