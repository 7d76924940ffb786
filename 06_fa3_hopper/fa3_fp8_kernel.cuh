// FlashAttention-3 FP8 forward (§3.3): the 06d pipeline (producer warpgroup + K/V ring,
// two consumer warpgroups (three at d = 64), ping-pong at d <= 128, intra-warpgroup
// overlap) on e4m3 tiles.
// It reuses 06's producer, block pipeline (overlapped_blocks), masking, turn-taking and
// epilogue (fa3_kernel.cuh); what a block does differs (Fp8Blocks):
//
//   - both GEMMs are QGMMA (wgmma ...k32.f32.e4m3.e4m3): 32 keys or dims per instruction;
//   - V arrives as Vᵀ (keys contiguous; QGMMA reads B K-major only), with its keys
//     permuted by the pre-kernel so that P needs no register shuffle (fp8_quantize.cuh);
//   - a Q̂ or K̂ row is d bytes: at d = 64 half a 128-byte swizzle row, so those tiles use
//     the 64-byte swizzle, while Vᵀ keeps 128-byte rows (Fp8Layout, fa3_fp8.h);
//   - S_ij is dequantized inside the softmax: scores = q_scale * k_scale_j * (Q̂_i K̂_jᵀ),
//     the product folded into the exponent's scale (no extra pass over S);
//   - P_ij is multiplied by 2^8 before rounding to e4m3 (FA3's max offset: the largest
//     P is 256, so small probabilities stay normal numbers); l_i carries the same factor;
//   - V's block scale: O_i is kept in units of the current block's v_scale_j, converted
//     with the rescale that the online softmax does anyway (alpha * v_scale_(j-1) / v_scale_j).
//   - at d = 64 and 128 the P V QGMMA also sums P's rows (Fp8Layout::kRowSumColumn: V̂ᵀ in
//     shared memory has a row of ones after its d rows), so the softmax adds no row sums;
//   - the row maxima on the integer ALU's three-input max (block_max in fa3_kernel.cuh);
//   - at d <= 128 6 of every 8 pairs of exponentials by exp2_e4m3_linear (common/exp2_linear.h:
//     2^x to within 4 % before e4m3's rounding, straight to P's e4m3 byte by an FFMA and a clamp,
//     which byte permutes put in place), the rest on the MUFU and converted (F2FP).
//
// Included only by the generated instance TUs (fa3_fp8.cu.in).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include "06_fa3_hopper/fa3_fp8.h"
#include "06_fa3_hopper/fa3_kernel.cuh"
#include "06_fa3_hopper/fp8_quantize.cuh"

namespace attn::fa3 {

using E4m3 = __nv_fp8_e4m3;

template <int D>
struct Fp8Config : Fp8Layout<D> {  // the tiles' swizzles and K steps: Fp8Layout (fa3_fp8.h)
  static constexpr bool kWarpSpecialized = true;
  // As 06d: ping-pong where the softmax is a large share of the work (d <= 128).
  static constexpr bool kPingpong = D <= 128;
  static constexpr int kWgThreads = 128;
  // Consumer warpgroups of 64 query rows each: three at d = 64 (O is 32 registers, so 160
  // per thread suffice and a third softmax hides under the others' GEMMs), else two.
  static constexpr int kConsumers = fp8_consumer_warpgroups(D);
  static constexpr int kThreads = kWgThreads * (kConsumers + 1);
  static constexpr int B_r = fp8_block_rows(D);  // query rows per CTA
  // B_c (fp8_block_cols, from Fp8Layout): keys per K/V block, 192 at d = 128 and 128 at
  // d = 64 and 256. S takes B_c/2 fp32 registers per thread beside O (d/2) and P (B_c/8
  // registers of four e4m3): 96 + 64 + 24 at d = 128.
  using Fp8Layout<D>::B_c;
  // K/V ring depth. An FP8 block computes in half the time of a bf16 one, so a third stage
  // hides the loads better (H100: +0-7 %); it fits at d = 256 too (224 KiB).
  static constexpr int kStages = 3;

  static constexpr uint32_t kQBytes = uint32_t(kConsumers) * kWarpgroupRows * D;
  static constexpr uint32_t kKVBytes = uint32_t(B_c) * D;  // K_j, and V_jᵀ

  static constexpr int kProducerRegs = 24;
  static constexpr int kConsumerRegs = kConsumers == 3 ? 160 : 240;
  static constexpr int kWarpsPerWg = kWgThreads / 32;
  static constexpr int kTurnBarrier = 1;
  static constexpr bool kMayPairCtas = false;  // one CTA per cluster (Fp8Params::cta_pairs)
  static constexpr int kPOffsetLog2 = 8;  // P = 2^8 exp(S - m): up to 256 of e4m3's 448
  // Where the softmax runs against the P V issued before it (overlapped_blocks), measured on
  // an H100 (README, FP8): all of it under the P V at d = 256 (slower at d = 128: Tried
  // (FP8)); all of it after the P V's wait at d = 128; at d = 64 where ptxas puts the wait,
  // after block_max's branch, so the row maxima under the P V and the exponentials after
  // (at d = 128 3 % slower than all after, at d = 64 2 % faster).
  static constexpr bool kSoftmaxUnderPv = D == 256;
  static constexpr bool kPvWaitFirst = D == 128;
  // V's scale ratio in Fp8Blocks::rescale by __fdividef (MUFU.RCP and a multiply) instead of
  // the IEEE division (a check and a branch to a slow path, between the softmax and O's
  // rescale): measured on an H100, 6-7 % faster at d = 64, 4-7 % slower at d = 128 and no
  // faster at d = 256 (README, FP8). __fdividef(x, y) is exact to 2 ulp for a normal y
  // below 2^126: the pre-kernel keeps every scale >= FLT_MIN, and a bf16 amax / 448 stays
  // below 2^120.
  static constexpr bool kFastScaleRatio = D == 64;
  // Most of the softmax's exponentials off the MUFU at d <= 128 (exp2_e4m3_linear: 2^x as
  // P's e4m3 byte, on the FMA pipe and the integer ALU; online_softmax, to_operand_fp8).
  // Measured on an H100 (README, Half the exponentials on the integer ALU): as a float
  // (exp2_linear, then F2FP) 4 of 8 at d = 64 gained 5 %, 5 of 8 at d = 128 4-5 %; as bytes,
  // in one call against that (medians of four passes, N = 8k / 16k), 6 of 8 at d = 128
  // +5 / +8 % (5 of 8 +2 / +2 %, 8 of 8 +4 / +4 %), at d = 64 +6 / +3 %; RMSE 9.14e-3 ->
  // 9.30e-3 at d = 128. At d = 256 l_i sums P in fp32 (no row-sum column): bytes cannot.
  static constexpr int kLinearExps = D <= 128 ? 6 : 0;  // pairs of every 8

  static_assert(B_r == kConsumers * kWarpgroupRows, "one 64-row block of Q per consumer warpgroup");
  static_assert(kWarpgroupRows * D % 1024 == 0 && B_c * D % 1024 == 0, "every tile starts on a whole swizzle atom");
  static_assert(Fp8Layout<D>::kPvCols * Fp8Layout<D>::kVtChunkKeys % Fp8Layout<D>::kVtAtomBytes == 0,
                "every V̂ᵀ column chunk, with the row-sum column's rows, starts on a whole swizzle atom");
  static_assert(kWgThreads == 128 && setmaxnreg_budgets_fit(kConsumers, kProducerRegs, kConsumerRegs),
                "the consumers' registers must come from the producer's");
};

// Every tile starts on a whole swizzle atom (512 B for the 64-byte swizzle, 1024 B for the
// 128-byte one): every array below is a whole number of atoms (static_asserts in Fp8Config).
template <int D>
struct alignas(1024) Fp8SharedStorage {
  using Cfg = Fp8Config<D>;
  E4m3 q[Cfg::kConsumers][kWarpgroupRows * D];  // Q̂_i, one 64-row block per consumer
  E4m3 k[Cfg::kStages][Cfg::B_c * D];           // K̂_j ring
  E4m3 vt[Cfg::kStages][Cfg::kPvCols * Cfg::B_c];  // V̂_jᵀ ring: column chunks of [kPvCols][kVtChunkKeys]
  uint64_t q_full, q_empty;
  uint64_t k_full[Cfg::kStages], k_empty[Cfg::kStages];
  uint64_t v_full[Cfg::kStages], v_empty[Cfg::kStages];
  int unit;  // as in SharedStorage
};

struct Fp8Params {
  CUtensorMap q_map, k_map, vt_map;  // e4m3 [B*H, Nq, d], [B*Hkv, Nk, d], [B*Hkv, d, Nk padded]
  __nv_bfloat16* o;
  float* lse;  // may be null
  const float* q_scale;  // [B*H, q_blocks]
  const float* k_scale;  // [B*Hkv, kv_blocks]
  const float* v_scale;  // [B*Hkv, kv_blocks]
  int q_blocks, kv_blocks;
  int Nq, Nk, H, Hkv, group, m_blocks, n_tiles, n_units;
  TileOrder order;
  float scale_log2;
  bool causal;
  bool cta_pairs = false;  // the FP8 path keeps one CTA per cluster (fa3_kernel.cuh: Schedule)
  int* unit_counter;       // as in Params
};

// V̂_jᵀ into ring stage `stage` (the producer's V copy, fa3_kernel.cuh: produce): one box of
// d rows x kVtChunkKeys keys per column chunk (whose rows d .. d + 7, with the row-sum
// column, hold init_row_sum_rows's constants and are never loaded).
template <class Cfg, int D, class Smem>
__device__ void load_vt(Smem& s, const Fp8Params& p, const Tile& t, int stage, int j) {
  mbarrier_arrive_expect_tx(&s.v_full[stage], Cfg::kKVBytes);
  for (int c = 0; c < Cfg::kVtChunks; ++c)
    tma_load_3d(&s.vt[stage][c * Cfg::kPvCols * Cfg::kVtChunkKeys], &p.vt_map, j * Cfg::B_c + c * Cfg::kVtChunkKeys, 0,
                t.kv_head, &s.v_full[stage]);
}

// O_i += P_ij V_j: B_c/32 QGMMA RS, P from registers, V_jᵀ K-major ([kPvCols rows][B_c keys]:
// its own swizzle, not Q̂'s and K̂'s); each K step moves 32 B along the row. With the
// row-sum column (kPvCols = d + 8) the same instructions also add rowsum(P̂_ij) to O_i's
// column d.
template <class Cfg>
__device__ void gemm_pv_fp8(float (&O)[Cfg::kPvCols / 2], const uint32_t (&P)[Cfg::B_c / Cfg::kK][4],
                            const E4m3* Vt_j) {
  const uint64_t vt_desc = make_smem_desc(Vt_j, /*unused*/ 16, Cfg::kVtAtomBytes, Cfg::kVtSwizzle);
  pin_registers(O);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < Cfg::B_c / Cfg::kK; ++kk)
    Wgmma<E4m3, Cfg::kPvCols>::rs(
        O, P[kk], desc_advance(vt_desc, kmajor_step_offset(kk, Cfg::kK, Cfg::kPvCols, Cfg::kVtSwizzle)),
        /*accumulate=*/1);
  wgmma_commit();
  pin_registers(O);
}

// The row-sum column's constant rows of every V̂ᵀ ring stage and column chunk, once per CTA:
// row d all e4m3 1.0 (0x38), rows d + 1 .. d + 7 zero. Row d starts an 8-row swizzle atom,
// so the swizzle only permutes 16-byte pieces inside each of these rows, all alike. Every
// thread of the CTA takes a share; the fence hands the writes to the wgmma (async proxy),
// and init_barriers' __syncthreads to every warp.
template <class Cfg, int D, class Smem>
__device__ void init_row_sum_rows(Smem& s) {
  if constexpr (Cfg::kRowSumColumn) {
    constexpr int kPiecesPerRow = Cfg::kVtChunkKeys / 16;  // 16-byte pieces
    constexpr int kPiecesPerChunk = 8 * kPiecesPerRow;
    constexpr int kPieces = Cfg::kStages * Cfg::kVtChunks * kPiecesPerChunk;
    constexpr uint32_t kOnes = 0x38383838u;  // four e4m3 1.0
    for (int i = threadIdx.x; i < kPieces; i += blockDim.x) {
      const int chunk = i / kPiecesPerChunk, piece = i % kPiecesPerChunk;
      E4m3* rows = &s.vt[chunk / Cfg::kVtChunks][((chunk % Cfg::kVtChunks) * Cfg::kPvCols + D) * Cfg::kVtChunkKeys];
      const uint32_t w = piece < kPiecesPerRow ? kOnes : 0u;
      reinterpret_cast<uint4*>(rows)[piece] = make_uint4(w, w, w, w);
    }
    fence_proxy_async_shared();
  }
}

// P (fp32 accumulator layout) -> the e4m3 A operand of the P V QGMMA. Per K step of 32 keys
// the thread holds, for row r (slot 0) and r + 8 (slot 1), keys {2t, 2t+1, 8+2t, 8+2t+1}
// and the same + 16; register q of the operand is rows r / r+8 (q % 2), keys +0 / +16
// (q / 2), four bytes. Vᵀ's key order matches (wgmma_key_position), so no shuffle:
//   P_op[kk][q] = e4m3 {P[4g + 2s], P[4g + 2s + 1], P[4g + 4 + 2s], P[4g + 4 + 2s + 1]},
//   g = 4 kk + 2 (q / 2), s = q % 2.
template <class Cfg>
__device__ void to_operand_fp8(const float (&P)[Cfg::B_c / 2], uint32_t (&P_op)[Cfg::B_c / Cfg::kK][4]) {
  // A pair that exp2_e4m3_linear took (linear_exp_pair) holds its two bytes in the low 8
  // bits of its two floats: a byte permute moves them where the register wants them.
  auto bytes = [](float lo, float hi, uint32_t selector) {
    return __byte_perm(__float_as_uint(lo), __float_as_uint(hi), selector);
  };
#pragma unroll
  for (int kk = 0; kk < Cfg::B_c / Cfg::kK; ++kk)
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int g = 4 * kk + 2 * (q / 2), s = q % 2;
      const float a = P[4 * g + 2 * s], b = P[4 * g + 2 * s + 1], c = P[4 * g + 4 + 2 * s], d = P[4 * g + 4 + 2 * s + 1];
      const bool lo_bytes = linear_exp_pair(g, Cfg::kLinearExps), hi_bytes = linear_exp_pair(g + 1, Cfg::kLinearExps);
      if (!lo_bytes && !hi_bytes) {
        P_op[kk][q] = pack4_e4m3(a, b, c, d);
      } else {  // each pair's two bytes in the low half of a register, then the halves joined
        const uint32_t lo = lo_bytes ? bytes(a, b, 0x0040) : pack2_e4m3_u32(a, b);
        const uint32_t hi = hi_bytes ? bytes(c, d, 0x0040) : pack2_e4m3_u32(c, d);
        P_op[kk][q] = __byte_perm(lo, hi, 0x5410);
      }
    }
}

// O_i's first d columns, as write_output and rescale take them (the accumulator may have the
// row-sum column's 8 more).
template <int D, int N>
__device__ inline float (&o_columns(float (&O)[N]))[D / 2] {
  static_assert(N >= D / 2);
  return *reinterpret_cast<float(*)[D / 2]>(&O[0]);
}

// What a block does in FP8 (overlapped_blocks in fa3_kernel.cuh): the softmax dequantizes
// Ŝ_ij with q_scale * k_scale_j, and O_i is kept in units of the scale of the last V_j whose
// P V was issued, moved to V_j's units with the rescale the softmax does anyway
// (alpha * v_scale_(j-1) / v_scale_j).
template <class Cfg, int D, class Smem>
struct Fp8Blocks {
  Smem& s;
  const Fp8Params& p;  // the kernel's parameters: read in place, no registers
  int kv_base;         // the head's first K/V block in k_scale and v_scale
  float q_log2;        // this warpgroup's q_scale times the softmax scale times log2(e)
  float s_log2 = 0.f, v_scale_next = 0.f;  // block j's, read by begin(j)
  float v_scale_cur;                       // the units O_i is kept in
  // With the row-sum column: l_i up to the last P V that has landed, in fp32 registers. Each
  // P V's column d holds one block's rowsum(P̂) and is moved here and zeroed once it lands
  // (rescale): the QGMMA's accumulation keeps fewer bits than fp32 (measured: l_i summed over
  // all blocks in the accumulator raised the RMSE at d = 128 from 9.06e-3 to 1.33e-2).
  float l_landed[2] = {0.f, 0.f};
  __device__ Fp8Blocks(Smem& s_, const Fp8Params& p_, int kv_base_, float q_scale)
      : s(s_), p(p_), kv_base(kv_base_), q_log2(q_scale * p_.scale_log2), v_scale_cur(p_.v_scale[kv_base_]) {}
  __device__ void begin(int j) {
    s_log2 = q_log2 * p.k_scale[kv_base + j];
    v_scale_next = p.v_scale[kv_base + j];
  }
  // The max first in every block (taking it last, as 06d does, was slower here: 06 README,
  // Tried (FP8)).
  static constexpr bool kSpeculative = false;
  __device__ bool first_softmax(float (&S)[Cfg::B_c / 2], float (&m)[2], float (&l)[2], float (&alpha)[2]) {
    return softmax(S, m, l, alpha);
  }
  // O_i changes units every block (V's block scales), so it is rescaled every block.
  __device__ bool softmax(float (&S)[Cfg::B_c / 2], float (&m)[2], float (&l)[2], float (&alpha)[2]) {
    // Scores dequantized by q_scale * k_scale_j, folded into s_log2; P_ij times 2^8. With
    // the row-sum column, l_i comes from the P V (rescale, final_row_sums), not from here.
    online_softmax<Cfg, /*kLazy=*/false, /*kRowSums=*/!Cfg::kRowSumColumn, /*kIntMax=*/true, Cfg::kLinearExps>(
        S, m, l, alpha, s_log2, 0.f, Cfg::kPOffsetLog2);
    return true;
  }
  // O_i *= alpha, and into V_j's units: alpha * v_scale_(j-1) / v_scale_j. The row-sum
  // column's block sum joins l_i, which takes alpha alone, and the column starts again at 0.
  __device__ void rescale(float (&O)[Cfg::kPvCols / 2], const float (&alpha)[2]) {
    const float to_next = Cfg::kFastScaleRatio ? __fdividef(v_scale_cur, v_scale_next) : v_scale_cur / v_scale_next;
    v_scale_cur = v_scale_next;
    const float o_factor[2] = {alpha[0] * to_next, alpha[1] * to_next};
    fa3::rescale<D>(o_columns<D>(O), o_factor);
    if constexpr (Cfg::kRowSumColumn) {
#pragma unroll
      for (int slot = 0; slot < 2; ++slot) {
        l_landed[slot] = alpha[slot] * (l_landed[slot] + O[D / 2 + 2 * slot]);
        O[D / 2 + 2 * slot] *= 0.f;  // (an assignment of 0 makes ptxas spill)
      }
    }
  }
  // After the last P V: l_i, this thread's part (zero but in the first lane of each quad).
  __device__ void final_row_sums(const float (&O)[Cfg::kPvCols / 2], float (&l)[2]) const {
    if constexpr (Cfg::kRowSumColumn) {
      l[0] = l_landed[0] + O[D / 2];
      l[1] = l_landed[1] + O[D / 2 + 2];
    }
  }
  __device__ void to_operand(const float (&S)[Cfg::B_c / 2], uint32_t (&P_op)[Cfg::B_c / Cfg::kK][4]) {
    to_operand_fp8<Cfg>(S, P_op);
  }
  __device__ void pv(float (&O)[Cfg::kPvCols / 2], const uint32_t (&P_op)[Cfg::B_c / Cfg::kK][4], int stage) {
    gemm_pv_fp8<Cfg>(O, P_op, s.vt[stage]);
  }
};

// Consumer warpgroup: 06d's software pipeline (overlapped_blocks) for its 64 rows of Q̂_i.
template <class Cfg, int D, class Smem>
__device__ void consume_fp8(Smem& s, const Fp8Params& p, const Tile& t, const TurnTaking<Cfg>& turn) {
  constexpr float kPOffset = float(1 << Cfg::kPOffsetLog2);  // removed from l_i and O_i at the end
  const int wg_row0 = t.row0 + turn.wg * kWarpgroupRows;
  // Dequantization scales of this warpgroup's Q block and of the head's K/V blocks. A
  // warpgroup whose rows all lie past Nq computes on zeros and writes nothing.
  Fp8Blocks<Cfg, D, Smem> blocks(s, p, t.kv_head * p.kv_blocks,
                                 p.q_scale[int64_t(t.bh) * p.q_blocks + min(wg_row0 / kWarpgroupRows, p.q_blocks - 1)]);

  float O[Cfg::kPvCols / 2];          // O_i accumulator, in units of blocks.v_scale_cur (+ row sums)
  uint32_t P_op[Cfg::B_c / Cfg::kK][4];  // P_ij as the e4m3 A operand
  float m[2] = {-INFINITY, -INFINITY};
  float l[2] = {0.f, 0.f};
#pragma unroll
  for (int i = 0; i < Cfg::kPvCols / 2; ++i) O[i] = 0.f;

  if (t.n_blocks == 0)
    release_q_after<Cfg>(s, t, -1);  // a tile with no visible K/V block never reads Q̂_i
  else
    overlapped_blocks<Cfg, Cfg::kPvCols>(s, p, t, turn, wg_row0, O, P_op, m, l, blocks);
  // With the row-sum column, l_i: the first lane of each quad holds it (column d of rows r
  // and r + 8), the other three columns d + 2 .. d + 7, zero, so write_output's quad sum
  // adds zeros to it.
  blocks.final_row_sums(O, l);
  float (&O_d)[D / 2] = o_columns<D>(O);
  // Back to real units: O_i times the last v_scale, and the 2^8 of P out of O_i and l_i
  // (exact: a power of two), so that write_output's O / l and lse = m + log l hold.
  const float o_units[2] = {blocks.v_scale_cur / kPOffset, blocks.v_scale_cur / kPOffset};
  rescale<D>(O_d, o_units);
  l[0] /= kPOffset;
  l[1] /= kPOffset;
  write_output<D, __nv_bfloat16>(O_d, m, l, t.bh, wg_row0, p);
  timeline_mark(t.seq, Mark::output_done);
}

template <int D>
__global__ void __launch_bounds__(Fp8Config<D>::kThreads, 1) fa3_fp8_forward(const __grid_constant__ Fp8Params p) {
  using Cfg = Fp8Config<D>;
  using Smem = Fp8SharedStorage<D>;
  extern __shared__ uint8_t smem_raw[];
  Smem& s = aligned_shared<Smem>(smem_raw);
  init_row_sum_rows<Cfg, D>(s);
  init_barriers<Cfg>(s);

  warp_specialized_cta<Cfg>(
      s, p, [&](const Tile& t, int stage, int j) { load_vt<Cfg, D>(s, p, t, stage, j); },
      [&](const Tile& t, const TurnTaking<Cfg>& turn) { consume_fp8<Cfg, D>(s, p, t, turn); });
}

template <int D>
void launch_fp8_quantize(const AttnProblem& p, const AttnTensors& t, const Fp8Options& opt, cudaStream_t stream) {
  quantize_inputs<D>(p, t, opt, Fp8Workspace(p), stream);
}

template <int D>
void launch_fp8_attention(const AttnProblem& pr, const AttnTensors& tensors, Schedule schedule, cudaStream_t stream) {
  using Cfg = Fp8Config<D>;
  constexpr size_t kSmemBytes = sizeof(Fp8SharedStorage<D>) + alignof(Fp8SharedStorage<D>);
  const int ctas_per_sm = configure_kernel<fa3_fp8_forward<D>>(Cfg::kThreads, kSmemBytes);

  const Fp8Workspace ws(pr);
  char* base = static_cast<char*>(tensors.workspace);
  constexpr CUtensorMapDataType kType = CU_TENSOR_MAP_DATA_TYPE_UINT8;  // e4m3 bytes
  constexpr int kE4m3Bytes = 1;
  Fp8Params p{};
  p.q_map = make_tensor_map_3d(base + ws.q8, kType, pr.B * pr.H, pr.Nq, D, kWarpgroupRows, kE4m3Bytes, Cfg::kSwizzle);
  p.k_map = make_tensor_map_3d(base + ws.k8, kType, pr.B * pr.Hkv, pr.Nk, D, Cfg::B_c, kE4m3Bytes, Cfg::kSwizzle);
  // Vᵀ: rows are the d dims, columns the (padded) keys; one box = all d rows x one chunk of keys.
  p.vt_map = make_tensor_map_3d(base + ws.vt8, kType, pr.B * pr.Hkv, D, int(ws.nk_padded), D, kE4m3Bytes,
                                Cfg::kVtSwizzle);
  p.o = static_cast<__nv_bfloat16*>(tensors.o);
  p.lse = tensors.lse;
  p.q_scale = reinterpret_cast<const float*>(base + ws.q_scale);
  p.k_scale = reinterpret_cast<const float*>(base + ws.k_scale);
  p.v_scale = reinterpret_cast<const float*>(base + ws.v_scale);
  p.q_blocks = int(ws.q_blocks);
  p.kv_blocks = int(ws.kv_blocks);
  set_problem<Cfg>(p, pr, sizeof(E4m3));

  const unsigned grid = grid_size(p.n_tiles, schedule, ctas_per_sm);
  p.unit_counter = unit_counter(tensors, ws.unit_counter, schedule, pr.causal, stream);
  fa3_fp8_forward<D><<<grid, Cfg::kThreads, kSmemBytes, stream>>>(p);
  CUDA_CHECK_LAUNCH();
}

template <int D>
void launch_fp8(const AttnProblem& pr, const AttnTensors& tensors, const Fp8Options& opt, Schedule schedule,
                cudaStream_t stream) {
  for (const void* ptr : {tensors.q, tensors.k, tensors.v, static_cast<const void*>(tensors.o),
                          static_cast<const void*>(tensors.workspace)})
    if (reinterpret_cast<uintptr_t>(ptr) % 16 != 0)
      throw AttnError("06_fa3_hopper fp8: Q, K, V, O and the workspace must be 16-byte aligned");
  quantize_inputs<D>(pr, tensors, opt, Fp8Workspace(pr), stream);
  launch_fp8_attention<D>(pr, tensors, schedule, stream);
}

}  // namespace attn::fa3
