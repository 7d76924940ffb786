// The FP8 (e4m3) forward path of rung 06 (FlashAttention-3 §3.3): host-side view, shared
// by stages.cu (registration, workspace, cost model) and the kernel instances.
//
// One launch = two steps on the stream:
//   1. the quantization pre-kernel (fp8_quantize.cuh): bf16 Q, K, V -> e4m3 Q̂, K̂, V̂ (rows,
//      as they are stored) plus fp32 scales, into the workspace;
//   2. the attention kernel (fp8h_fa3.cuh): 06d's kernel on e4m3 tiles, bf16 O. Its producer
//      transposes each V̂ block in shared memory (QGMMA reads V K-major only: V̂ᵀ).
// The ablation 06_fp8_vt_hbm keeps the earlier split: the pre-kernel writes V̂ᵀ to HBM.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "06_fa3_hopper/fa3_launch.h"
#include "06_fa3_hopper/swizzle.h"
#include "common/attention.h"

namespace attn::fa3 {

// Where V̂ᵀ, the K-major B operand of the P V QGMMA, is made, and in which key order
// (fp8h_fa3.cuh: transpose_v, to_operand):
//   in_kernel               the producer warpgroup turns each TMA-loaded V̂ block around in
//                           shared memory and writes its keys in wgmma_key_position's order,
//                           the order P's accumulator layout already has: no shuffle (FA3's
//                           path for V stored row-major, as here);
//   in_kernel_keys_in_order the same transpose, keys in order; P's registers are permuted
//                           across each quad (byte permutes and shuffles) to match (FA3's
//                           permute_Aregs_fp8, which FA3 runs for V stored column-major);
//   in_hbm                  the pre-kernel writes V̂ᵀ to HBM in in_kernel's order, read by TMA.
enum class Fp8VPath { in_kernel, in_kernel_keys_in_order, in_hbm };

// The two ideas of FA3 §3.3, each switchable for the ablation (FA3 Table 3).
struct Fp8Options {
  bool block_scales = true;  // one scale per Q block (64 rows) and per K/V block (B_c rows); else one per tensor
  bool hadamard = true;      // incoherent processing: Q and K times the same random-sign Hadamard matrix
  Fp8VPath v_path{};         // where V̂ᵀ is made (the ablations of fp8.md's "The layouts")
};

// The head dims with an FP8 kernel, kFp8HeadDims: fa3_head_dims.h, generated from
// CMakeLists.txt's list (included by fa3_launch.h).

// Tiles of the FP8 kernel (fp8h_fa3.cuh explains each choice).
constexpr int kFp8QBlockRows = 64;  // rows per Q scale = rows per consumer warpgroup
// B_c: keys per K/V block = rows per K and V scale. 192 at d = 128 (S then takes 96
// registers beside O's 64 and P's 24); 128 at d = 64, whose three consumer warpgroups have
// 160 registers each, and at d = 256, whose O takes 128.
constexpr int fp8_block_cols(int d) { return d == 128 ? 192 : 128; }
// Keys per row of a V̂ᵀ column chunk: one 128-byte swizzle row where B_c allows, else 64.
constexpr int fp8_vt_chunk_keys(int d) { return fp8_block_cols(d) % 128 == 0 ? 128 : 64; }
constexpr float kE4m3Max = 448.f;  // largest finite e4m3 value
// Consumer warpgroups of 64 query rows each: three at d = 64, where O is small and the
// softmax is a large share of the work (as 06d at d = 64), two at d = 128 and 256.
constexpr int fp8_consumer_warpgroups(int d) { return d == 64 ? 3 : 2; }
// B_r: query rows per CTA.
constexpr int fp8_block_rows(int d) { return kFp8QBlockRows * fp8_consumer_warpgroups(d); }

// Shared-memory layout of the e4m3 tiles (one byte per element), from d alone (swizzle.h):
//   Q̂_i, K̂_j  [rows][d], K-major operands of S = Q Kᵀ. A row is d bytes: at d = 64 one
//             64-byte swizzle row (Swizzle::b64, 512-byte atoms); at d >= 128, d/128 column
//             chunks of 128-byte rows (Swizzle::b128, 1024-byte atoms).
//   V̂_jᵀ     [d][B_c], the K-major B operand of O += P V: column chunks of [d][128 keys]
//             (Swizzle::b128) or, where 128 does not divide B_c, of [d][64 keys] (b64).
// Each QGMMA K step reads 32 bytes of every row: two steps per 64-byte row, four per 128.
template <int D>
struct Fp8Layout {
  static constexpr int B_c = fp8_block_cols(D);
  static constexpr hopper::Swizzle kSwizzle = hopper::swizzle_for_row(D);  // Q̂ and K̂
  static constexpr int kSwizzleRowBytes = hopper::row_bytes(kSwizzle);
  static constexpr int kChunkCols = kSwizzleRowBytes;  // e4m3 per swizzle row
  static constexpr int kChunks = D / kChunkCols;
  static constexpr int kAtomBytes = hopper::atom_bytes(kSwizzle);  // 512 or 1024
  static constexpr int kVtChunkKeys = fp8_vt_chunk_keys(D);
  static constexpr hopper::Swizzle kVtSwizzle = hopper::swizzle_for_row(kVtChunkKeys);
  static constexpr int kVtAtomBytes = hopper::atom_bytes(kVtSwizzle);  // 1024 or 512
  static constexpr int kVtChunks = B_c / kVtChunkKeys;
  static constexpr int kK = 32;  // QGMMA K: 32 e4m3 (32 bytes) per instruction
  // The row-sum column: V̂_jᵀ gets 8 more rows, row d all ones (e4m3 1.0) and the other
  // seven zero, so that the P V QGMMA (N = d + 8) also accumulates rowsum(P̂_ij) in O's
  // column d: l_i comes from the tensor core, and the softmax has no row sums to add up.
  // Where N = d + 8 is a QGMMA shape (N <= 256): d = 64 and 128.
  static constexpr bool kRowSumColumn = D + 8 <= 256;
  static constexpr int kPvCols = kRowSumColumn ? D + 8 : D;  // N of the P V QGMMA; V̂_jᵀ rows in shared memory

  static_assert(D % 64 == 0 && D % kChunkCols == 0, "Q̂ and K̂ rows are whole swizzle rows");
  static_assert(kSwizzleRowBytes % kK == 0, "a K step stays inside one swizzle row");
  static_assert(hopper::row_bytes(kVtSwizzle) == kVtChunkKeys && B_c % kVtChunkKeys == 0,
                "a V̂ᵀ row of B_c keys is whole swizzle rows");
};

// Incoherent processing's fixed pseudo-random sign of column `col` (an integer hash; any
// fixed +-1 pattern shared by Q and K keeps Q Kᵀ exact). Host and device (the tests model
// the pre-kernel's Hadamard transform with it).
constexpr float hadamard_sign(int col) {
  constexpr uint32_t kMul1 = 0x9E3779B9u, kMul2 = 0x85EBCA6Bu;
  uint32_t h = uint32_t(col + 1) * kMul1;
  h = (h ^ (h >> 16)) * kMul2;
  return (h >> 31) ? -1.f : 1.f;
}

// Wgmma A-operand column -> key inside a group of 32 keys, where V̂ᵀ's keys are permuted
// (Fp8VPath::in_kernel, in_hbm; fp8h_fa3.cuh: to_operand): key 8a + 2t + b (+16h)
// of V is stored at position 4t + 2a + b (+16h) of V̂ᵀ.
constexpr int wgmma_key_position(int key) {
  const int half = key & 16, a = (key >> 3) & 1, t = (key >> 1) & 3, b = key & 1;
  return (key & ~31) | half | 4 * t | 2 * a | b;
}

// Where the pre-kernel puts its results in the Stage workspace. Each piece starts on a
// 256-byte boundary (TMA wants 16). V̂ is stored as V is, [heads, Nk, d] (the attention
// kernel transposes it), or with vt_in_hbm (Fp8VPath::in_hbm) as V̂ᵀ [heads, d, Nk padded].
struct Fp8Workspace {
  int block_cols;               // B_c of head dim d: fp8_block_cols(d)
  int64_t q_blocks, kv_blocks;  // scale blocks per head: ceil(Nq / 64), ceil(Nk / B_c)
  int64_t nk_padded;            // V̂ᵀ row length: Nk rounded up to whole B_c blocks
  size_t v8_bytes;              // V̂ or V̂ᵀ
  size_t q8, k8, v8, q_scale, k_scale, v_scale, amax, unit_counter, total;  // byte offsets; total = size

  explicit Fp8Workspace(const AttnProblem& p, bool vt_in_hbm = false) {
    block_cols = fp8_block_cols(p.d);
    q_blocks = (p.Nq + kFp8QBlockRows - 1) / kFp8QBlockRows;
    kv_blocks = (p.Nk + block_cols - 1) / block_cols;
    nk_padded = kv_blocks * block_cols;
    v8_bytes = vt_in_hbm ? size_t(p.B) * p.Hkv * p.d * nk_padded : size_t(p.kv_elems());
    size_t at = 0;
    auto take = [&at](size_t bytes) {
      const size_t start = at;
      at += (bytes + 255) / 256 * 256;
      return start;
    };
    q8 = take(size_t(p.q_elems()));
    k8 = take(size_t(p.kv_elems()));
    v8 = take(v8_bytes);
    q_scale = take(sizeof(float) * p.B * p.H * q_blocks);
    k_scale = take(sizeof(float) * p.B * p.Hkv * kv_blocks);
    v_scale = take(sizeof(float) * p.B * p.Hkv * kv_blocks);
    amax = take(sizeof(float) * 3);  // per-tensor amax of Q, K, V (per-tensor scales only)
    unit_counter = take(sizeof(int));  // the persistent schedule's (fa3_common.cuh: next_unit)
    total = at;
  }
};

// HBM bytes of the pre-kernel: reads bf16 Q, K, V (once with block scales: rows stay in
// registers between a block's amax and its rounding; twice with per-tensor scales, whose
// amax pass runs over the whole tensor first) and writes e4m3 Q̂, K̂, V̂ (V̂ᵀ, padded, for
// Fp8VPath::in_hbm). Scales are negligible.
inline double fp8_quantize_bytes(const AttnProblem& p, const Fp8Options& opt) {
  const double reads = opt.block_scales ? 1 : 2;
  const double bf16_in = 2.0 * (p.q_elems() + 2 * p.kv_elems());
  const double e4m3_out = double(p.q_elems()) + p.kv_elems() +
                          double(Fp8Workspace(p, opt.v_path == Fp8VPath::in_hbm).v8_bytes);
  return reads * bf16_in + e4m3_out;
}

// One instantiation per head dim in kFp8HeadDims: fp8_fa3.cu.in. launch_fp8 is the whole
// Stage launch: launch_fp8_quantize (the pre-kernel) then launch_fp8_attention (the
// attention kernel on the workspace the pre-kernel filled; opt.v_path picks its variant,
// launch_fp8_attention runs the default one); bench/fp8_accuracy --time times the two apart.
template <int D>
void launch_fp8(const AttnProblem& p, const AttnTensors& t, const Fp8Options& opt, Schedule schedule,
                cudaStream_t stream);
template <int D>
void launch_fp8_quantize(const AttnProblem& p, const AttnTensors& t, const Fp8Options& opt, cudaStream_t stream);
template <int D>
void launch_fp8_attention(const AttnProblem& p, const AttnTensors& t, Schedule schedule, cudaStream_t stream);

// The instance for head dim d (one of kFp8HeadDims; the Stage validated d before); any
// other d throws. Defined in stages.cu, so that a kernel TU instantiates only its own d.
using Fp8LaunchFn = void (*)(const AttnProblem&, const AttnTensors&, const Fp8Options&, Schedule, cudaStream_t);
using Fp8QuantizeFn = void (*)(const AttnProblem&, const AttnTensors&, const Fp8Options&, cudaStream_t);
using Fp8AttentionFn = void (*)(const AttnProblem&, const AttnTensors&, Schedule, cudaStream_t);
Fp8LaunchFn fp8_launch_for(int d);
Fp8QuantizeFn fp8_quantize_for(int d);
Fp8AttentionFn fp8_attention_for(int d);

// 2^x as the FP8 softmax takes most of its exponentials at d <= 128 (exp2_e4m3_linear in
// common/device_math.cuh, through the same FFMA, with s_log2 = 1), run on the current GPU
// (exp2_linear_check.cu), for the tests: the e4m3 byte of 2^(s[i] + c[i]), c[i] from a max on
// the grid; and e4m3_linear_grid of each m.
std::vector<uint8_t> exp2_e4m3_linear_on_gpu(const std::vector<float>& s, const std::vector<float>& c);
std::vector<float> e4m3_linear_grid_on_gpu(const std::vector<float>& m);

}  // namespace attn::fa3
