// The FP8 pre-kernel (FA3 §3.3): bf16 Q, K, V -> e4m3 plus one fp32 dequantization scale
// per block, written into the Stage workspace (layout: Fp8Workspace in fa3_fp8.h).
//
//   block quantization    scale = amax(block) / 448 for each Q block of 64 rows and each
//                         K/V block of B_c rows of one head (per-tensor option: one amax
//                         over the whole tensor, from a first pass);
//   incoherent processing Q and K rows times M = diag(s) H_d / sqrt(d), s a fixed random
//                         sign per column and H_d the Walsh-Hadamard matrix. M is
//                         orthogonal, so (Q M)(K M)ᵀ = Q Kᵀ exactly; an outlier column is
//                         spread over all d columns before rounding. O(d log d) per row:
//                         log2(d) butterfly stages, the first log2(d/32) in registers
//                         (1, 2 or 3 for d = 64, 128, 256), the last five across lanes;
//   V                     rounded as K is, without the Hadamard transform, and stored as
//                         rows: the attention kernel's producer transposes each block in
//                         shared memory (fp8h_fa3.cuh: transpose_v). For the ablation
//                         06_fp8_vt_hbm (Fp8VPath::in_hbm) the pre-kernel writes V̂ᵀ instead,
//                         [head][d][key], keys contiguous (QGMMA reads B K-major only), in
//                         wgmma_key_position's order inside every 32 keys, so that P, as the
//                         fp32 accumulator of Q Kᵀ leaves it in registers, is already the A
//                         operand of P V. V is loaded as K is (whole rows, coalesced) and
//                         turned around in shared memory.
//   loads                 a block's bf16 rows are contiguous: one bulk copy brings them into
//                         shared memory, two blocks ahead of the warps that transform them
//                         (quantize_rows).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cfloat>
#include <cstdint>

#include "06_fa3_hopper/fa3_fp8.h"
#include "06_fa3_hopper/hopper.cuh"
#include "common/check.h"

namespace attn::fa3 {

enum class QuantPass {
  amax_only,    // per-tensor scales, first pass: fold the block's amax into *tensor_amax
  block_amax,   // block scales: quantize with the block's own amax
  tensor_amax,  // per-tensor scales, second pass: quantize with *tensor_amax
};

struct QuantArgs {
  const __nv_bfloat16* src;  // [heads, N, D]
  uint8_t* dst;              // e4m3 [heads, N, D]; for V̂ᵀ (Fp8VPath::in_hbm): [heads, D, n_padded]
  float* scale;              // [heads, blocks]: the dequantization scale of each block
  float* tensor_amax;        // one float: written by amax_only, read by tensor_amax
  int heads;                 // B * H (Q) or B * Hkv (K, V)
  int N;                     // rows (tokens) per head
  int blocks;                // scale blocks per head
  int64_t n_padded;          // Vᵀ row length (whole B_c blocks); unused for Q and K
  bool hadamard;
};

// A CTA of 16 warps takes one block of R rows at a time, so that each warp's few rows (4 of
// a Q block, 8 of a K or V block of 128) stay in its registers between the amax and the
// quantization; a warp takes at most 8 rows (24 warps for the 192-row K/V blocks of
// d = 128).
template <int R>
constexpr int kRowWarps = R / 8 > 16 ? R / 8 : 16;
template <int R>
constexpr int kRowThreads = 32 * kRowWarps<R>;

// hadamard_sign(col) and wgmma_key_position(key) live in fa3_fp8.h (host and device).
// The key order: the fp32 accumulator gives thread (lane % 4 = t) keys {2t, 2t+1, 8+2t,
// 8+2t+1} (+16 for the second half), the e4m3 A operand wants that register to hold
// columns {4t .. 4t+3}; storing key 8a + 2t + b (+16h) of V at position 4t + 2a + b (+16h)
// of Vᵀ makes the two agree:
//
//   key       0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15
//   position  0 1 4 5 8 9 12 13 2 3 6  7  10 11 14 15   (keys 16-31 likewise, +16)

// The unsigned type of `Bytes` bytes: one load per lane.
template <int Bytes>
struct Vec;
template <>
struct Vec<4> {
  using type = uint32_t;
};
template <>
struct Vec<8> {
  using type = uint2;
};
template <>
struct Vec<16> {
  using type = uint4;
};

// E = D/32 consecutive bf16 of one row per lane (2, 4 or 8) -> fp32, zeros where !valid (a
// row past N: `row` is still readable, the stage's stale bytes), times M when `hadamard`:
// log2(E) butterfly stages inside the lane (one at d = 64), then five across. No branch
// before the shuffles: after one (an early return for rows past N, say) ptxas cannot tell
// that the warp is converged and puts a convergence check (BRA.DIV) before each row's
// shuffles, with a WARPSYNC/ENDCOLLECTIVE copy of them for a diverged warp; the rows then
// sit in separate basic blocks, and each row's load waited for the previous row's
// transform (one load in flight per warp instead of one per row).
template <int D>
__device__ void load_row(float (&x)[D / 32], const __nv_bfloat16* row, bool valid, bool hadamard) {
  constexpr int E = D / 32;
  const int lane = threadIdx.x % 32;
  using Load = typename Vec<2 * E>::type;  // 4, 8 or 16 bytes
  alignas(Load) __nv_bfloat16 raw[E];
  *reinterpret_cast<Load*>(raw) = *reinterpret_cast<const Load*>(row + lane * E);
#pragma unroll
  for (int e = 0; e < E; ++e) x[e] = valid ? __bfloat162float(raw[e]) : 0.f;
  if (!hadamard) return;
#pragma unroll
  for (int e = 0; e < E; ++e) x[e] *= hadamard_sign(lane * E + e);
#pragma unroll  // LAB:BEGIN fp8.hadamard
  for (int h = 1; h < E; h *= 2)  // butterflies inside the lane: column distance h
#pragma unroll
    for (int e = 0; e < E; ++e)
      if (!(e & h)) {
        const float a = x[e], b = x[e + h];
        x[e] = a + b;
        x[e + h] = a - b;
      }
#pragma unroll
  for (int lanes = 1; lanes < 32; lanes *= 2) {  // across lanes: column distance lanes * E
    // The lane with bit `lanes` clear takes x + other, its partner other - x: one FFMA
    // either way (a multiply by -1 or 1 is exact).
    const float sign = (lane & lanes) ? -1.f : 1.f;
#pragma unroll
    for (int e = 0; e < E; ++e) x[e] = fmaf(x[e], sign, __shfl_xor_sync(0xffffffffu, x[e], lanes));
  }  // LAB:END
  const float norm = rsqrtf(float(D));  // H_d / sqrt(d) is orthogonal
#pragma unroll
  for (int e = 0; e < E; ++e) x[e] *= norm;
}

// x * inv_scale -> E e4m3 bytes at dst, one 2-, 4- or 8-byte store per lane.
template <int E>
__device__ void store_e4m3(uint8_t* dst, const float (&x)[E], float inv_scale) {
  if constexpr (E == 2) {
    *reinterpret_cast<uint16_t*>(dst) = hopper::pack2_e4m3(x[0] * inv_scale, x[1] * inv_scale);
  } else {
    uint32_t packed[E / 4];
#pragma unroll
    for (int i = 0; i < E / 4; ++i)
      packed[i] = hopper::pack4_e4m3(x[4 * i] * inv_scale, x[4 * i + 1] * inv_scale, x[4 * i + 2] * inv_scale,
                                     x[4 * i + 3] * inv_scale);
    if constexpr (E == 4)
      *reinterpret_cast<uint32_t*>(dst) = packed[0];
    else
      *reinterpret_cast<uint2*>(dst) = make_uint2(packed[0], packed[1]);
  }
}

// Max over the CTA of Warps warps (every thread gets it), through `warp_max` in shared
// memory. Its __syncthreads also tells the caller that every warp is past what it did before.
template <int Warps>
__device__ inline float cta_max(float x, float (&warp_max)[Warps]) {
#pragma unroll
  for (int lanes = 16; lanes > 0; lanes /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, lanes));
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = x;
  __syncthreads();
  float m = warp_max[0];
#pragma unroll
  for (int w = 1; w < Warps; ++w) m = fmaxf(m, warp_max[w]);
  return m;
}

// Block `block`'s scale from its amax `block_amax` (or the tensor's). Returns 1/scale, or
// 0 after an amax_only pass, which quantizes nothing.
__device__ inline float block_inv_scale(QuantPass pass, float block_amax, const QuantArgs& a, int block) {
  if (pass == QuantPass::amax_only) {
    if (threadIdx.x == 0) atomicMax(reinterpret_cast<int*>(a.tensor_amax), __float_as_int(block_amax));  // >= 0
    return 0.f;
  }
  const float amax = pass == QuantPass::tensor_amax ? *a.tensor_amax : block_amax;  // LAB:BEGIN fp8.block_scale
  // An all-zero block keeps scale 1; no scale is subnormal (the attention kernel divides two
  // of them with __fdividef at d = 64: fp8h_fa3.cuh, Config::kFastScaleRatio).
  const float scale = amax > 0.f ? fmaxf(amax / kE4m3Max, FLT_MIN) : 1.f;
  if (threadIdx.x == 0) a.scale[block] = scale;
  return 1.f / scale;  // LAB:END
}

// V̂ᵀ from a quantized V block in shared memory ([R keys][d], row-major): thread t takes
// dim t % d and every (threads/d)-th group of 16 keys, reads the group's 16 bytes down the
// tile's column (a warp reads 32 neighbouring bytes of a row at a time: no bank conflict)
// in wgmma_key_position's order, and writes them as one 16-byte store along V̂ᵀ's row.
template <int D, int R>
__device__ void store_transposed(const uint8_t (&tile)[R][D], const QuantArgs& a, int head, int key0) {
  constexpr int kThreads = kRowThreads<R>;
  constexpr int kGroups = R / 16, kGroupsAtOnce = kThreads / D;
  static_assert(kThreads % D == 0 && (kGroupsAtOnce >= kGroups || kGroups % kGroupsAtOnce == 0),
                "whole key groups per thread");
  const int dim = threadIdx.x % D;
  uint8_t* row = a.dst + (size_t(head) * D + dim) * a.n_padded + key0;
  // The key at each position of a group: wgmma_key_position's inverse, key 8a + 2t + b at
  // position 4t + 2a + b.
  auto key_at = [](int pos) { return 8 * ((pos >> 1) & 1) + 2 * (pos >> 2) + (pos & 1); };
#pragma unroll
  for (int g = threadIdx.x / D; g < kGroups; g += kGroupsAtOnce) {
    uint32_t w[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      w[q] = 0;
#pragma unroll
      for (int b = 0; b < 4; ++b) w[q] |= uint32_t(tile[16 * g + key_at(4 * q + b)][dim]) << (8 * b);
    }
    *reinterpret_cast<uint4*>(row + 16 * g) = make_uint4(w[0], w[1], w[2], w[3]);
  }
}

// Bulk copies in flight per CTA: while a block is transformed, the next ones stream in.
constexpr int kQuantStages = 2;

// The pre-kernel CTA's shared memory: the bf16 rows of its next kQuantStages blocks, as the
// copy engine brings them (rows past N are not copied: stale, never read), and for V the
// block quantized, before its transpose.
template <int D, int R, bool kTransposed>
struct QuantSmem {
  __nv_bfloat16 rows[kQuantStages][R * D];
  alignas(16) uint8_t tile[kTransposed ? R : 1][D];
  float warp_max[2][kRowWarps<R>];  // cta_max's, alternating between blocks
  uint64_t full[kQuantStages];
};

// CTA c takes blocks c, c + G, c + 2G, ... (G CTAs; block = head * blocks + block of R
// rows in the head; a persistent grid at d >= 128, one CTA per block at d = 64:
// launch_quantize_rows). One thread copies each block's rows (contiguous in
// [heads, N, d]) into a stage of shared memory with one bulk copy, kQuantStages blocks ahead,
// so the loads stream while the CTA transforms, instead of every warp waiting on its own
// rows from global memory. Warp w takes rows w, w + kRowWarps, ... of a block: each row
// read from the stage (lane l holds columns E l .. E l + E - 1), transformed once and kept
// in registers for both the block's amax and its quantization. Q and K are stored as they are; V (kTransposed) goes through `tile` to
// V̂ᵀ (store_transposed), the keys past Nk as zeros.
template <int D, int R, bool kTransposed>
__global__ void __launch_bounds__(kRowThreads<R>) quantize_rows(const QuantArgs a, QuantPass pass) {
  constexpr int E = D / 32;
  constexpr int kWarps = kRowWarps<R>;
  constexpr int kRows = R / kWarps;  // rows per warp
  static_assert(E == 2 || E == 4 || E == 8, "one 4-, 8- or 16-byte load per lane: d = 64, 128 or 256");
  static_assert(R % kWarps == 0, "whole rows per warp");
  static_assert(!kTransposed || R == fp8_block_cols(D), "V̂ᵀ blocks are B_c keys");
  using Smem = QuantSmem<D, R, kTransposed>;
  extern __shared__ __align__(128) uint8_t quant_smem_raw[];
  Smem& sm = *reinterpret_cast<Smem*>(quant_smem_raw);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int total = a.heads * a.blocks;
  // The next tensor's launch may start as this grid's CTAs leave their SMs
  // (launch_quantize_rows): it reads and writes other tensors.
  grid_dependents_may_launch();

  // Block `block`'s rows into stage `stage`: one bulk copy of its rows below N.
  auto fetch = [&](int block, int stage) {
    const int head = block / a.blocks, row0 = (block % a.blocks) * R;
    const uint32_t bytes = uint32_t(min(R, a.N - row0)) * D * sizeof(__nv_bfloat16);
    mbarrier_arrive_expect_tx(&sm.full[stage], bytes);
    bulk_load(sm.rows[stage], a.src + (size_t(head) * a.N + row0) * D, bytes, &sm.full[stage]);
  };
  if (threadIdx.x == 0) {
    for (int st = 0; st < kQuantStages; ++st) mbarrier_init(&sm.full[st], 1);
    fence_barrier_init();
    for (int st = 0; st < kQuantStages && blockIdx.x + 1LL * st * gridDim.x < total; ++st)
      fetch(int(blockIdx.x + st * gridDim.x), st);
  }
  __syncthreads();

  for (int it = 0; blockIdx.x + 1LL * it * gridDim.x < total; ++it) {
    const int block = int(blockIdx.x + it * gridDim.x), stage = it % kQuantStages;
    const int head = block / a.blocks, row0 = (block % a.blocks) * R;
    mbarrier_wait(&sm.full[stage], (it / kQuantStages) % 2);
    float x[kRows][E];
    float amax = 0.f;
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      const int r = warp + i * kWarps;
      load_row<D>(x[i], &sm.rows[stage][r * D], row0 + r < a.N, a.hadamard);
#pragma unroll
      for (int e = 0; e < E; ++e) amax = fmaxf(amax, fabsf(x[i][e]));
    }
    // Past cta_max's barrier every warp has read the stage: it takes the block kQuantStages on.
    const float block_amax = cta_max<kWarps>(amax, sm.warp_max[it % 2]);
    const long long ahead = block + 1LL * kQuantStages * gridDim.x;
    if (threadIdx.x == 0 && ahead < total) fetch(int(ahead), stage);
    const float inv_scale = block_inv_scale(pass, block_amax, a, block);
    if (pass == QuantPass::amax_only) continue;

    if constexpr (kTransposed) {
      // (The previous block's transpose read `tile` before cta_max's barrier above.)
#pragma unroll
      for (int i = 0; i < kRows; ++i) store_e4m3<E>(&sm.tile[warp + i * kWarps][lane * E], x[i], inv_scale);
      __syncthreads();
      store_transposed<D, R>(sm.tile, a, head, row0);
    } else {
#pragma unroll
      for (int i = 0; i < kRows; ++i) {
        const int r = warp + i * kWarps;
        if (row0 + r < a.N) store_e4m3<E>(a.dst + (size_t(head) * a.N + row0 + r) * D + lane * E, x[i], inv_scale);
      }
    }
  }
  // Launched beside the previous tensor's grid: finish only after it, so that the stream's
  // next ordinary launch (the attention kernel, or the second per-tensor pass) finds every
  // tensor done.
  grid_dependency_wait();
}

// One launch of quantize_rows over the tensor's `a.heads * a.blocks` blocks: as many CTAs
// as fit on the GPU at once, fewer if there are fewer blocks. At d = 64 one CTA per block
// instead (the loop runs once; the hardware hands out the next CTA), which is faster there
// and slower at d = 128 and 256.
//
// beside_previous: a programmatic dependent launch (the stream's previous kernel, the
// pre-kernel of another tensor, lets it start as its own CTAs finish: quantize_rows), so
// that this grid's first blocks fill the SMs the previous grid's last round leaves idle.
template <int D, int R, bool kTransposed>
void launch_quantize_rows(const QuantArgs& a, QuantPass pass, bool beside_previous, cudaStream_t stream) {
  constexpr auto kKernel = quantize_rows<D, R, kTransposed>;
  constexpr size_t kSmemBytes = sizeof(QuantSmem<D, R, kTransposed>);
  constexpr bool kPersistent = D > 64;
  const int ctas_per_sm = configure_kernel<kKernel>(kRowThreads<R>, kSmemBytes);
  const long long total = 1LL * a.heads * a.blocks;
  launch_beside_previous(kKernel, dim3(kPersistent ? persistent_grid(total, ctas_per_sm) : unsigned(total)),
                         dim3(kRowThreads<R>), kSmemBytes, stream, beside_previous, a, pass);
}

// The whole pre-kernel: Q, K, V of `t` -> the workspace (ws laid out for opt.v_path). Keys
// past Nk are zero in V̂ᵀ.
template <int D>
void quantize_inputs(const AttnProblem& p, const AttnTensors& t, const Fp8Options& opt, const Fp8Workspace& ws,
                     cudaStream_t stream) {
  char* base = static_cast<char*>(t.workspace);
  float* amax = reinterpret_cast<float*>(base + ws.amax);
  auto args = [&](const void* src, size_t dst, size_t scale, int tensor, int heads, int n, int64_t blocks,
                  bool hadamard) {
    return QuantArgs{static_cast<const __nv_bfloat16*>(src), reinterpret_cast<uint8_t*>(base + dst),
                     reinterpret_cast<float*>(base + scale), amax + tensor, heads, n, int(blocks), ws.nk_padded,
                     hadamard};
  };
  // stages.cu refuses problems whose block counts pass INT_MAX.
  const QuantArgs q = args(t.q, ws.q8, ws.q_scale, 0, p.B * p.H, p.Nq, ws.q_blocks, opt.hadamard);
  const QuantArgs k = args(t.k, ws.k8, ws.k_scale, 1, p.B * p.Hkv, p.Nk, ws.kv_blocks, opt.hadamard);
  const QuantArgs v = args(t.v, ws.v8, ws.v_scale, 2, p.B * p.Hkv, p.Nk, ws.kv_blocks, false);
  constexpr int B_c = fp8_block_cols(D);
  // Q after whatever came before in the stream; K and V beside the tensor before them.
  auto run = [&](QuantPass pass) {
    launch_quantize_rows<D, kFp8QBlockRows, false>(q, pass, /*beside_previous=*/false, stream);
    launch_quantize_rows<D, B_c, false>(k, pass, /*beside_previous=*/true, stream);
    if (opt.v_path == Fp8VPath::in_hbm)
      launch_quantize_rows<D, B_c, true>(v, pass, /*beside_previous=*/true, stream);
    else
      launch_quantize_rows<D, B_c, false>(v, pass, /*beside_previous=*/true, stream);
  };
  if (opt.block_scales) {
    run(QuantPass::block_amax);
  } else {
    CUDA_CHECK(cudaMemsetAsync(amax, 0, 3 * sizeof(float), stream));
    run(QuantPass::amax_only);
    run(QuantPass::tensor_amax);
  }
}

}  // namespace attn::fa3
