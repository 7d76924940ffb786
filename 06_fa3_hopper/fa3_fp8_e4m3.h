// The FP8 path on e4m3 inputs (FlashAttention-3's interface), host-side view: the caller
// holds Q, K, V in e4m3 with their dequantization scales ("descales", AttnTensors) in the
// attention kernel's block layout, and this path runs that kernel (fp8h_fa3.cuh) on them
// unchanged. None of the bf16 path's pre-kernel (fp8_quantize.cuh) runs: the kernel's
// producer transposes V̂ in shared memory (fp8_e4m3_inputs.cuh). Shared by stages.cu (the stage
// 06_fp8_e4m3) and the kernel instances (fp8_fa3.cu.in).
//
// Descales, fp32, one per block, as Fp8Workspace's q_scale, k_scale and v_scale:
//   q_descale [B, H,   ceil(Nq / 64)]    one per 64 query rows (kFp8QBlockRows)
//   k_descale [B, Hkv, ceil(Nk / B_c)]   one per B_c keys (fp8_block_cols(d))
//   v_descale [B, Hkv, ceil(Nk / B_c)]
// Q = descale * Q8 on each block. A caller with per-tensor or per-head scales repeats them.
// Every descale must be a positive normal float below 2^126 (amax / 448 of bf16 values is):
// the kernel divides two v_descales (BlockScales::rescale). No Hadamard is applied inside:
// incoherent processing, as in FA3, is the caller's choice (Q and K times the same
// orthogonal matrix before quantization).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "06_fa3_hopper/fa3_fp8.h"
#include "06_fa3_hopper/fa3_launch.h"
#include "common/attention.h"

namespace attn::fa3 {

// The stage's workspace: only the persistent schedule's unit counter; Q8, K8 and V8 are the
// caller's tensors, read in place.
struct Fp8E4m3Workspace {
  size_t unit_counter, total;  // byte offsets; total = size
  explicit Fp8E4m3Workspace(const AttnProblem&) : unit_counter(0), total(sizeof(int)) {}
};

// The whole launch: the attention kernel on Q8, K8, V8 and the descales.
// One instantiation per head dim in kFp8HeadDims, in the FP8 instance files (fp8_fa3.cu.in),
// beside the kernel it launches.
template <int D>
void launch_fp8_e4m3(const AttnProblem& p, const AttnTensors& t, Schedule schedule, cudaStream_t stream);

// The instance for head dim d (one of kFp8HeadDims); any other d throws. Defined in stages.cu.
using Fp8E4m3LaunchFn = void (*)(const AttnProblem&, const AttnTensors&, Schedule, cudaStream_t);
Fp8E4m3LaunchFn fp8_e4m3_launch_for(int d);

}  // namespace attn::fa3
