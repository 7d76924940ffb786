// The FP8 (e4m3) forward path of rung 06 (FlashAttention-3 §3.3): host-side view, shared
// by stages.cu (registration, workspace, cost model) and the kernel instances.
//
// One launch = two steps on the stream:
//   1. the quantization pre-kernel (fp8_quantize.cuh): bf16 Q, K, V -> e4m3 Q, K and
//      Vᵀ (key-contiguous, so P V can use QGMMA) plus fp32 scales, into the workspace;
//   2. the attention kernel (fa3_fp8_kernel.cuh): the 06d pipeline on e4m3 tiles, bf16 O.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "06_fa3_hopper/fa3_launch.h"
#include "common/attention.h"

namespace attn::fa3 {

// The two ideas of FA3 §3.3, each switchable for the ablation (FA3 Table 3).
struct Fp8Options {
  bool block_scales = true;  // one scale per Q block (64 rows) and per K/V block (B_c rows); else one per tensor
  bool hadamard = true;      // incoherent processing: Q and K times the same random-sign Hadamard matrix
};

// Tiles of the FP8 kernel (fa3_fp8_kernel.cuh explains each choice).
constexpr int kFp8QBlockRows = 64;   // rows per Q scale = rows per consumer warpgroup
constexpr int kFp8BlockRows = 128;   // B_r: two consumer warpgroups of 64 rows
constexpr int kFp8BlockCols = 128;   // B_c: keys per K/V block = rows per K and V scale
constexpr float kE4m3Max = 448.f;    // largest finite e4m3 value

// Where the pre-kernel puts its results in the Stage workspace. Each piece starts on a
// 256-byte boundary (TMA wants 16).
struct Fp8Workspace {
  int64_t q_blocks, kv_blocks;  // scale blocks per head: ceil(Nq / 64), ceil(Nk / B_c)
  int64_t nk_padded;            // Vᵀ row length: Nk rounded up to whole B_c blocks
  size_t q8, k8, vt8, q_scale, k_scale, v_scale, amax, total;  // byte offsets; total = size

  explicit Fp8Workspace(const AttnProblem& p) {
    q_blocks = (p.Nq + kFp8QBlockRows - 1) / kFp8QBlockRows;
    kv_blocks = (p.Nk + kFp8BlockCols - 1) / kFp8BlockCols;
    nk_padded = kv_blocks * kFp8BlockCols;
    size_t at = 0;
    auto take = [&at](size_t bytes) {
      const size_t start = at;
      at += (bytes + 255) / 256 * 256;
      return start;
    };
    q8 = take(size_t(p.q_elems()));
    k8 = take(size_t(p.kv_elems()));
    vt8 = take(size_t(p.B) * p.Hkv * p.d * nk_padded);
    q_scale = take(sizeof(float) * p.B * p.H * q_blocks);
    k_scale = take(sizeof(float) * p.B * p.Hkv * kv_blocks);
    v_scale = take(sizeof(float) * p.B * p.Hkv * kv_blocks);
    amax = take(sizeof(float) * 3);  // per-tensor amax of Q, K, V (per-tensor scales only)
    total = at;
  }
};

// HBM bytes of the pre-kernel: reads bf16 Q, K, V (once with block scales, where the
// second read of a block for quantizing hits L2; twice with per-tensor scales, whose amax
// pass runs over the whole tensor first) and writes e4m3 Q, K, Vᵀ. Scales are negligible.
inline double fp8_quantize_bytes(const AttnProblem& p, const Fp8Options& opt) {
  const double reads = opt.block_scales ? 1 : 2;
  const double bf16_in = 2.0 * (p.q_elems() + 2 * p.kv_elems());
  const double e4m3_out = double(p.q_elems()) + p.kv_elems() + double(p.B) * p.Hkv * p.d * Fp8Workspace(p).nk_padded;
  return reads * bf16_in + e4m3_out;
}

// One instantiation per head dim: fa3_fp8.cu.in. launch_fp8 is the whole Stage launch;
// launch_fp8_quantize only its pre-kernel (bench/fp8_accuracy --time times it alone).
template <int D>
void launch_fp8(const AttnProblem& p, const AttnTensors& t, const Fp8Options& opt, Schedule schedule,
                cudaStream_t stream);
template <int D>
void launch_fp8_quantize(const AttnProblem& p, const AttnTensors& t, const Fp8Options& opt, cudaStream_t stream);

}  // namespace attn::fa3
