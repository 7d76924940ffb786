// Rung 06's FP8 forward, step e (fp8.md): fp8d_block_scales.cuh with the softmax placed
// per head dim against the P V issued before it (scripts/step_diff.sh fp8d fp8e): 06d's
// consumer runs all of it under the P V, held there by a never-taken branch
// (hold_wait_below); here that holds only at d = 256 (kSoftmaxUnderPv, hopper.cuh's
// fence_schedule_after), at d = 128 the P V's wait comes first (kPvWaitFirst), and at d = 64
// ptxas places the wait.
//
// Not built: compiled for d = 128 by fp8_steps_check.cu; the stages run fp8h_fa3.cuh.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include "06_fa3_hopper/fa3_common.cuh"
#include "06_fa3_hopper/fa3_fp8.h"

namespace attn::fa3::fp8e {

using E4m3 = __nv_fp8_e4m3;

template <int D>
struct Config : Fp8Layout<D> {  // the tiles' swizzles and K steps: Fp8Layout (fa3_fp8.h)
  // As 06d: ping-pong where the softmax is a large share of the work (d <= 128).
  static constexpr bool kPingpong = D <= 128;
  // Where the softmax runs against the P V issued before it (overlapped_blocks): all of it
  // under the P V at d = 256; all of it after the P V's wait at d = 128; at d = 64 where
  // ptxas puts the wait.
  static constexpr bool kSoftmaxUnderPv = D == 256;
  static constexpr bool kPvWaitFirst = D == 128;
  static constexpr int kPOffsetLog2 = 8;  // P = 2^8 exp(S - m): up to 256 of e4m3's 448
  // No row-sum column yet (fp8h_fa3.cuh adds it): the P V's N is d, l_i sums P in fp32.
  static constexpr bool kRowSumColumn = false;
  static constexpr int kPvCols = D;

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
  // K̂_j and V̂_jᵀ arrive by TMA in rings of kStages: an FP8 block computes in half the time
  // of a bf16 one, so a third stage hides the loads better.
  static constexpr int kStages = 3;

  static constexpr uint32_t kQBytes = uint32_t(kConsumers) * kWarpgroupRows * D;
  static constexpr uint32_t kKVBytes = uint32_t(B_c) * D;  // K_j, and V_jᵀ

  static constexpr int kProducerRegs = 24;
  static constexpr int kConsumerRegs = kConsumers == 3 ? 160 : 240;
  static constexpr int kWarpsPerWg = kWgThreads / 32;
  static constexpr int kTurnBarrier = 1;

  static_assert(B_r == kConsumers * kWarpgroupRows, "one 64-row block of Q per consumer warpgroup");
  static_assert(kWarpgroupRows * D % 1024 == 0 && B_c * D % 1024 == 0, "every tile starts on a whole swizzle atom");
  static_assert(kPvCols * Fp8Layout<D>::kVtChunkKeys % Fp8Layout<D>::kVtAtomBytes == 0,
                "every V̂ᵀ column chunk starts on a whole swizzle atom");
  static_assert(kWgThreads == 128 && setmaxnreg_budgets_fit(kConsumers, kProducerRegs, kConsumerRegs),
                "the consumers' registers must come from the producer's");
};

// Every tile starts on a whole swizzle atom (512 B for the 64-byte swizzle, 1024 B for the
// 128-byte one): every array below is a whole number of atoms (static_asserts in Config).
template <int D>
struct alignas(1024) SharedStorage {
  using Cfg = Config<D>;
  E4m3 q[Cfg::kConsumers][kWarpgroupRows * D];       // Q̂_i, one 64-row block per consumer
  E4m3 k[Cfg::kStages][Cfg::B_c * D];                // K̂_j ring
  E4m3 vt[Cfg::kStages][Cfg::kPvCols * Cfg::B_c];   // V̂_jᵀ ring: column chunks of [kPvCols][kVtChunkKeys]
  uint64_t q_full, q_empty;
  uint64_t k_full[Cfg::kStages], k_empty[Cfg::kStages];
  uint64_t v_full[Cfg::kStages], v_empty[Cfg::kStages];  // the TMA ring of V̂_jᵀ
  int unit;  // the unit of the tile whose Q̂_i q_full announces (produce_tiles)
};

struct Params {
  // e4m3 [B*H, Nq, d], [B*Hkv, Nk, d], and V̂ᵀ [B*Hkv, d, Nk padded]
  CUtensorMap q_map, k_map, v_map;
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
  int* unit_counter;  // as in fa3_common.cuh's Params
};

// Ring slot of the CTA's it-th K/V block in a ring of `Stages`: stage it mod s, and the
// parity of the lap. Slot: the K̂ and V̂ᵀ rings.
template <int Stages>
struct RingSlot {
  int stage;
  uint32_t phase;
  __device__ explicit RingSlot(int it) : stage(it % Stages), phase(uint32_t(it / Stages) & 1) {}
};
template <class Cfg>
using Slot = RingSlot<Cfg::kStages>;

// ---------------------------------------------------------------------------------------
// Loads (the producer's side): TMA copies that complete on the stage's "full" barrier.
// ---------------------------------------------------------------------------------------

template <class Cfg, class Smem>
__device__ void load_q(Smem& s, const Params& p, const Tile& t) {
  mbarrier_arrive_expect_tx(&s.q_full, Cfg::kQBytes);
  for (int w = 0; w < Cfg::kConsumers; ++w)
    for (int c = 0; c < Cfg::kChunks; ++c)
      tma_load_3d(&s.q[w][c * kWarpgroupRows * Cfg::kChunkCols], &p.q_map, c * Cfg::kChunkCols,
                  t.row0 + w * kWarpgroupRows, t.bh, &s.q_full);
}

// One B_c x d block K̂_j into `tile`, completing on `full`.
template <class Cfg>
__device__ void load_k(void* tile, const CUtensorMap* map, int j, int kv_head, uint64_t* full) {
  mbarrier_arrive_expect_tx(full, Cfg::kKVBytes);
  char* chunk0 = static_cast<char*>(tile);
  constexpr int kChunkBytes = Cfg::B_c * Cfg::kSwizzleRowBytes;  // one column chunk of the block
  for (int c = 0; c < Cfg::kChunks; ++c)
    tma_load_3d(chunk0 + c * kChunkBytes, map, c * Cfg::kChunkCols, j * Cfg::B_c, kv_head, full);
}

// The pre-kernel's V̂_jᵀ into ring stage `stage`, one box of d rows x kVtChunkKeys keys
// per column chunk.
template <class Cfg, class Smem>
__device__ void load_v(Smem& s, const Params& p, const Tile& t, int stage, int j) {
  mbarrier_arrive_expect_tx(&s.v_full[stage], Cfg::kKVBytes);
  for (int c = 0; c < Cfg::kVtChunks; ++c)
    tma_load_3d(&s.vt[stage][c * Cfg::kPvCols * Cfg::kVtChunkKeys], &p.v_map, j * Cfg::B_c + c * Cfg::kVtChunkKeys, 0,
                t.kv_head, &s.v_full[stage]);
}

// The CTA's seq-th tile, unit `unit` (fa3_common.cuh: tile_in_sequence).
template <class Cfg>
__device__ Tile tile_of_unit(const Params& p, int unit, int seq, int& kv) {
  return tile_in_sequence<Cfg::B_r, Cfg::B_c>(p, tile_at(p.order, unit), seq, kv);
}

// The producer's loads (warp 0; its lane 0 issues every copy), tile after tile: Q_i once
// the consumers are done with the last tile's, then K_j and V_j into the rings, each stage
// reused once every consumer warp released it ("empty" barriers; on the first lap they
// pass at once). The unit of each tile goes to the consumers in shared memory, announced
// by Q_i's "full" barrier (its arrival releases the write; their wait acquires it), which
// after the last unit completes with no copy: the consumers' signal to stop
// (consume_tiles).
template <class Cfg, class Smem>
__device__ void produce_tiles(Smem& s, const Params& p) {
  int kv = 0;
  for (int seq = 0;; ++seq) {
    // Asked for only once the last tile's loads are all issued, with the ring's last blocks
    // still ahead of the consumers: the CTA takes its next unit shortly before it is free.
    const int unit = next_unit(p, seq);
    mbarrier_wait(&s.q_empty, (seq & 1) ^ 1);  // the consumers read the last unit and are done with its Q_i
    const bool leader = threadIdx.x % 32 == 0;
    if (leader) s.unit = unit;
    if (unit >= p.n_units) {
      if (leader) mbarrier_arrive(&s.q_full);
      return;
    }
    const Tile t = tile_of_unit<Cfg>(p, unit, seq, kv);
    if (leader) load_q<Cfg>(s, p, t);
    timeline_mark(seq, Mark::q_issued);
    for (int j = 0; j < t.n_blocks; ++j) {
      const Slot<Cfg> slot(t.kv0 + j);
      mbarrier_wait(&s.k_empty[slot.stage], slot.phase ^ 1);
      if (leader) load_k<Cfg>(s.k[slot.stage], &p.k_map, j, t.kv_head, &s.k_full[slot.stage]);
      mbarrier_wait(&s.v_empty[slot.stage], slot.phase ^ 1);
      if (leader) load_v<Cfg>(s, p, t, slot.stage, j);
    }
  }
}

// The consumers' side of produce_tiles: each tile's unit, read once its Q_i has arrived.
template <class Cfg, class Smem, class Body>
__device__ void consume_tiles(Smem& s, const Params& p, Body&& body) {
  int kv = 0;
  for (int seq = 0;; ++seq) {
    mbarrier_wait(&s.q_full, seq & 1);
    const int unit = __reduce_max_sync(0xffffffffu, ld_shared(&s.unit));  // the same in every lane: warp-uniform
    if (unit >= p.n_units) return;
    timeline_mark(seq, Mark::q_ready);
    body(tile_of_unit<Cfg>(p, unit, seq, kv));
  }
}

// A consumer warp is done with a K/V ring stage: one arrival per warp.
__device__ inline void release_kv(uint64_t* empty) {
  if (threadIdx.x % 32 == 0) mbarrier_arrive(empty);
}

// Once the tile's last Q K_jᵀ has landed (j = n_blocks - 1; j = -1 for a tile with no
// visible K/V block, which never reads Q_i), Q_i's buffer may take the next tile's Q, and
// the unit slot the next unit (produce_tiles). Every consumer thread arrives: each read the
// unit slot itself (consume_tiles), and its arrival orders that read before the write.
template <class Smem>
__device__ inline void release_q_after(Smem& s, const Tile& t, int j) {
  if (j == t.n_blocks - 1) mbarrier_arrive(&s.q_empty);
}

// ---------------------------------------------------------------------------------------
// The two GEMMs of one warpgroup (64 query rows).
// ---------------------------------------------------------------------------------------

// S_ij = Q̂_i K̂_jᵀ: d/32 QGMMA SS (both operands K-major), one commit group. Each K step
// reads 32 bytes of every row: the start address moves 32 B along the swizzle row, then on
// to the next column chunk (kmajor_step_offset, swizzle.h).
template <class Cfg>
__device__ void gemm_qk(float (&S)[Cfg::B_c / 2], const E4m3* Q_i, const E4m3* K_j) {
  constexpr int kSteps = Cfg::kChunks * Cfg::kChunkCols / Cfg::kK;  // d / K
  constexpr int kStepBytes = Cfg::kK * int(sizeof(E4m3));
  static_assert(Cfg::kSwizzleRowBytes % kStepBytes == 0, "a K step stays inside one swizzle row");
  const uint64_t q_desc = make_smem_desc(Q_i, /*unused*/ 16, Cfg::kAtomBytes, Cfg::kSwizzle);
  const uint64_t k_desc = make_smem_desc(K_j, /*unused*/ 16, Cfg::kAtomBytes, Cfg::kSwizzle);
  pin_registers(S);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kSteps; ++kk)
    Wgmma<E4m3, Cfg::B_c>::ss(S, desc_advance(q_desc, kmajor_step_offset(kk, kStepBytes, kWarpgroupRows, Cfg::kSwizzle)),
                              desc_advance(k_desc, kmajor_step_offset(kk, kStepBytes, Cfg::B_c, Cfg::kSwizzle)),
                              /*accumulate=*/kk > 0);
  wgmma_commit();
  pin_registers(S);
}

// O_i += P_ij V_j: B_c/32 QGMMA RS, P from registers, V_jᵀ K-major ([kPvCols rows][B_c keys]:
// its own swizzle, not Q̂'s and K̂'s); each K step moves 32 B along the row.
template <class Cfg>
__device__ void gemm_pv(float (&O)[Cfg::kPvCols / 2], const uint32_t (&P)[Cfg::B_c / Cfg::kK][4], const E4m3* Vt_j) {
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

// ---------------------------------------------------------------------------------------
// Online softmax on the accumulator layout (Fragment, fa3_common.cuh).
// ---------------------------------------------------------------------------------------

// Row `slot`'s max over block S: a tree over the thread's B_c/4 values (log2 deep, where a
// running max would be a chain of B_c/4 dependent instructions on the softmax's critical
// path), then over the four threads of the row.
template <class Cfg>
__device__ float row_max(const float (&S)[Cfg::B_c / 2], int slot) {
  constexpr int kPairs = Cfg::B_c / 8;
  float v[kPairs];
#pragma unroll
  for (int i = 0; i < kPairs; ++i) v[i] = fmaxf(S[4 * i + 2 * slot], S[4 * i + 2 * slot + 1]);
#pragma unroll
  for (int w = 1; w < kPairs; w *= 2)
#pragma unroll
    for (int i = 0; i + w < kPairs; i += 2 * w) v[i] = fmaxf(v[i], v[i + w]);
  return quad_max(v[0]);
}

// f(n, S[x]) for each of this thread's entries of row `slot` (Fragment), in column order;
// n = 0, 1, ..., B_c/4 - 1 is the entry's place among them.
template <class Cfg, class F>
__device__ void for_each_in_row(float (&S)[Cfg::B_c / 2], int slot, F&& f) {
#pragma unroll
  for (int i = 0; i < Cfg::B_c / 8; ++i)
#pragma unroll
    for (int e = 0; e < 2; ++e) f(2 * i + e, S[4 * i + 2 * slot + e]);
}

// Online softmax of one block (FA2 Algorithm 1, lines 8-10), base 2:
//   m_i^new = max(m_i, rowmax(S_ij));  P_ij = 2^8 exp(S_ij - m_i^new) (in place in S);
//   alpha = exp(m_i - m_i^new);  l_i = alpha l_i + rowsum(P_ij)   (l_i: this thread's part).
// s_log2 takes a raw score Q̂ K̂ᵀ to the exponent's log2 units: the softmax scale * log2(e)
// times the block's dequantization scales q_scale * k_scale_j (BlockScales); m_i is kept in
// those units. P_ij and l_i carry the factor 2^8 (kPOffsetLog2). The caller rescales O_i by
// alpha (and by V's scale ratio), once the in-flight P V has landed.
template <class Cfg>
__device__ void online_softmax(float (&S)[Cfg::B_c / 2], float (&m)[2], float (&l)[2], float (&alpha)[2],
                               float s_log2) {
#pragma unroll
  for (int slot = 0; slot < 2; ++slot) {
    const float m_new = fmaxf(m[slot], row_max<Cfg>(S, slot) * s_log2);
    // A row that has seen only masked keys keeps m = -inf; exponentiate against 0 so
    // that exp(-inf - (-inf)) never appears: its P is 0 and alpha is 0.
    const float m_base = m_new == -INFINITY ? 0.f : m_new;
    alpha[slot] = exp2_approx(m[slot] - m_base);
    m[slot] = m_new;
    const float shift = float(Cfg::kPOffsetLog2) - m_base;
    float row_sum = 0.f;
    for_each_in_row<Cfg>(S, slot, [&](int, float& s_ij) {
      s_ij = exp2_approx(fmaf(s_ij, s_log2, shift));
      row_sum += s_ij;
    });
    l[slot] = alpha[slot] * l[slot] + row_sum;
  }
}

template <int D>
__device__ void rescale(float (&O)[D / 2], const float (&alpha)[2]) {
#pragma unroll
  for (int i = 0; i < D / 8; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) O[4 * i + e] *= alpha[e / 2];
}

// P (fp32 accumulator layout) -> the e4m3 A operand of the P V QGMMA. Per K step kk of 32
// keys the thread holds, for row r (slot s = 0) and r + 8 (s = 1), the pair of keys
// {2t, 2t+1} of each of the four 8-key groups g = 4 kk .. 4 kk + 3: P[4g + 2s], P[4g + 2s + 1]
// (t = lane % 4). Register q of the operand is row q % 2 and keys 16 (q / 2) + {4t .. 4t+3}
// of the step, in V̂ᵀ's key order (wgmma_key_position): V̂ᵀ's position 16h + 4t + {0..3}
// holds keys 16h + {2t, 2t+1, 8+2t, 9+2t}, the thread's own: register q = groups 2 (q / 2)
// and 2 (q / 2) + 1 of row q % 2, no shuffle.
template <class Cfg>
__device__ void to_operand(const float (&P)[Cfg::B_c / 2], uint32_t (&P_op)[Cfg::B_c / Cfg::kK][4]) {
  // The pairs of groups g0 and g1 of row s as one register of four e4m3 (g0's pair low).
  auto pack = [&](int g0, int g1, int s) {
    return pack4_e4m3(P[4 * g0 + 2 * s], P[4 * g0 + 2 * s + 1], P[4 * g1 + 2 * s], P[4 * g1 + 2 * s + 1]);
  };
#pragma unroll
  for (int kk = 0; kk < Cfg::B_c / Cfg::kK; ++kk)
#pragma unroll
    for (int s = 0; s < 2; ++s) {
      const int g = 4 * kk;
      P_op[kk][s] = pack(g, g + 1, s);
      P_op[kk][2 + s] = pack(g + 2, g + 3, s);
    }
}

// ---------------------------------------------------------------------------------------
// Ping-pong: consumer warpgroups take turns (0, 1, .., 0, 1, ..) issuing their GEMMs;
// issuing hands the turn on, and the next one's GEMMs run under this one's softmax. Where
// kPingpong is off (d = 256) every call is empty.
// ---------------------------------------------------------------------------------------

template <class Cfg>
struct TurnTaking {
  static constexpr int kThreads = 2 * Cfg::kWgThreads;  // the waiting and the handing-over warpgroup
  int wg;
  __device__ void start() const {  // warpgroup 0 goes first: the last one hands it the turn
    if constexpr (Cfg::kPingpong)
      if (wg == Cfg::kConsumers - 1) named_barrier_arrive(Cfg::kTurnBarrier + 0, kThreads);
  }
  __device__ void wait_turn() const {
    if constexpr (Cfg::kPingpong) named_barrier_sync(Cfg::kTurnBarrier + wg, kThreads);
  }
  __device__ void pass_turn() const {
    if constexpr (Cfg::kPingpong) named_barrier_arrive(Cfg::kTurnBarrier + (wg + 1) % Cfg::kConsumers, kThreads);
  }
  __device__ void finish() const {  // take the last hand-over, so every arrival is matched
    if constexpr (Cfg::kPingpong)
      if (wg == 0) named_barrier_sync(Cfg::kTurnBarrier + 0, kThreads);
  }
};

// S_ij = Q̂_i K̂_jᵀ alone: issued in this warpgroup's turn and waited for; then K̂_j's ring
// stage (and after the tile's last block, Q̂_i) is released. For block 0.
template <class Cfg, class Smem>
__device__ void qk_and_wait(float (&S)[Cfg::B_c / 2], Smem& s, const Tile& t, const TurnTaking<Cfg>& turn,
                            const E4m3* Q_i, const Slot<Cfg>& slot, int j) {
  mbarrier_wait(&s.k_full[slot.stage], slot.phase);
  turn.wait_turn();
  gemm_qk<Cfg>(S, Q_i, s.k[slot.stage]);
  turn.pass_turn();
  wgmma_wait<0>();
  pin_registers(S);
  release_kv(&s.k_empty[slot.stage]);
  release_q_after(s, t, j);
}

// ---------------------------------------------------------------------------------------
// The software pipeline over one tile's K/V blocks (intra-warpgroup overlap), with the
// dequantization scales.
// ---------------------------------------------------------------------------------------

// A warpgroup's dequantization scales: S_ij comes out of the QGMMA in units of q_scale *
// k_scale_j, folded into the softmax's s_log2; O_i is kept in units of the scale of the
// last V_j whose P V was issued, moved to V_j's units with the rescale the softmax does
// anyway (alpha * v_scale_(j-1) / v_scale_j).
template <class Cfg, int D>
struct BlockScales {
  const Params& p;  // the kernel's parameters: read in place, no registers
  int kv_base;      // the head's first K/V block in k_scale and v_scale
  float q_log2;     // this warpgroup's q_scale times the softmax scale times log2(e)
  float s_log2 = 0.f, v_scale_next = 0.f;  // block j's, read by begin(j)
  float v_scale_cur;                       // the units O_i is kept in
  __device__ BlockScales(const Params& p_, int kv_base_, float q_scale)
      : p(p_), kv_base(kv_base_), q_log2(q_scale * p_.scale_log2), v_scale_cur(p_.v_scale[kv_base_]) {}
  // Block j's scales, read before its S GEMM is issued (so that the loads overlap the waits).
  __device__ void begin(int j) {
    s_log2 = q_log2 * p.k_scale[kv_base + j];
    v_scale_next = p.v_scale[kv_base + j];
  }
  // O_i *= alpha, and into V_j's units: alpha * v_scale_(j-1) / v_scale_j.
  __device__ void rescale(float (&O)[D / 2], const float (&alpha)[2]) {
    const float to_next = v_scale_cur / v_scale_next;
    v_scale_cur = v_scale_next;
    const float o_factor[2] = {alpha[0] * to_next, alpha[1] * to_next};
    fp8e::rescale<D>(O, o_factor);
  }
};

template <class Cfg, int D, class Smem>
__device__ void overlapped_blocks(Smem& s, const Params& p, const Tile& t, const TurnTaking<Cfg>& turn, int wg_row0,
                                  float (&O)[Cfg::kPvCols / 2], uint32_t (&P_op)[Cfg::B_c / Cfg::kK][4],
                                  float (&m)[2], float (&l)[2], BlockScales<Cfg, D>& scales) {
  static_assert(!(Cfg::kSoftmaxUnderPv && Cfg::kPvWaitFirst), "the softmax runs under the P V or after it, not both");
  const E4m3* Q_i = s.q[turn.wg];
  float S[Cfg::B_c / 2];  // S_ij, then P_ij in place
  float alpha[2];         // exp(m_old - m_new), rescales O_i
  // Block 0: S_i0 and its softmax alone.
  scales.begin(0);
  qk_and_wait<Cfg>(S, s, t, turn, Q_i, Slot<Cfg>(t.kv0), 0);
  if (block_needs_mask<Cfg>(0, wg_row0, p)) mask_block<Cfg>(S, 0, wg_row0, p);
  online_softmax<Cfg>(S, m, l, alpha, scales.s_log2);  // O_i is still 0: nothing to rescale
  to_operand<Cfg>(S, P_op);
  timeline_mark(t.seq, Mark::block0_done);
  for (int j = 1; j < t.n_blocks; ++j) {
    const Slot<Cfg> cur(t.kv0 + j);
    timeline_mark_block(t.seq, j, t.n_blocks, Mark::block_begin);
    scales.begin(j);
    // Issue S_ij = Q̂_i K̂_jᵀ and O_i += P_i(j-1) V_(j-1), meant to run during the softmax
    // below (the P V only where the fence holds it there: kSoftmaxUnderPv).
    mbarrier_wait(&s.k_full[cur.stage], cur.phase);
    timeline_mark_block(t.seq, j, t.n_blocks, Mark::k_ready);
    turn.wait_turn();
    timeline_mark_block(t.seq, j, t.n_blocks, Mark::turn_taken);
    gemm_qk<Cfg>(S, Q_i, s.k[cur.stage]);
    timeline_mark_block(t.seq, j, t.n_blocks, Mark::s_issued);
    const Slot<Cfg> prev(t.kv0 + j - 1);
    mbarrier_wait(&s.v_full[prev.stage], prev.phase);
    gemm_pv<Cfg>(O, P_op, s.vt[prev.stage]);
    turn.pass_turn();
    timeline_mark_block(t.seq, j, t.n_blocks, Mark::gemms_issued);
    wgmma_wait<1>();  // S_ij has landed; the P V is still running
    pin_registers(S);
    timeline_mark_block(t.seq, j, t.n_blocks, Mark::s_landed);
    release_kv(&s.k_empty[cur.stage]);
    release_q_after(s, t, j);
    if (block_needs_mask<Cfg>(j, wg_row0, p)) mask_block<Cfg>(S, j, wg_row0, p);
    if constexpr (Cfg::kPvWaitFirst) wgmma_wait<0>();  // the softmax after the P V, all of it
    online_softmax<Cfg>(S, m, l, alpha, scales.s_log2);
    // ptxas schedules the wait below as early as it may, at the top of the softmax's basic
    // block, and the rest of the softmax then runs after the P V instead of under it; the
    // fence keeps the softmax first.
    if constexpr (Cfg::kSoftmaxUnderPv) fence_schedule_after(l[0] + l[1]);
    wgmma_wait<0>();  // P_i(j-1) V_(j-1) has landed: O_i and P_op are free again
    pin_registers(O);
    timeline_mark_block(t.seq, j, t.n_blocks, Mark::pv_landed);
    release_kv(&s.v_empty[prev.stage]);
    scales.rescale(O, alpha);  // V_j's units differ from V_(j-1)'s: O_i is rescaled every block
    to_operand<Cfg>(S, P_op);
    timeline_mark_block(t.seq, j, t.n_blocks, Mark::block_end);
  }
  // The last block's O_i += P V.
  const Slot<Cfg> last(t.kv0 + t.n_blocks - 1);
  timeline_mark(t.seq, Mark::loop_done);
  mbarrier_wait(&s.v_full[last.stage], last.phase);
  gemm_pv<Cfg>(O, P_op, s.vt[last.stage]);
  wgmma_wait<0>();
  pin_registers(O);
  timeline_mark(t.seq, Mark::last_pv_done);
  release_kv(&s.v_empty[last.stage]);
}

// ---------------------------------------------------------------------------------------
// Consumer warpgroup turn.wg: the pipeline above for its 64 rows of Q̂_i.
// ---------------------------------------------------------------------------------------

template <class Cfg, int D, class Smem>
__device__ void consume(Smem& s, const Params& p, const Tile& t, const TurnTaking<Cfg>& turn) {
  constexpr float kPOffset = float(1 << Cfg::kPOffsetLog2);  // removed from l_i and O_i at the end
  const int wg_row0 = t.row0 + turn.wg * kWarpgroupRows;
  // Dequantization scales of this warpgroup's Q block and of the head's K/V blocks. A
  // warpgroup whose rows all lie past Nq computes on zeros and writes nothing.
  BlockScales<Cfg, D> scales(p, t.kv_head * p.kv_blocks,
                             p.q_scale[int64_t(t.bh) * p.q_blocks + min(wg_row0 / kWarpgroupRows, p.q_blocks - 1)]);

  float O[Cfg::kPvCols / 2];             // O_i accumulator, in units of scales.v_scale_cur
  uint32_t P_op[Cfg::B_c / Cfg::kK][4];  // P_ij as the e4m3 A operand
  float m[2] = {-INFINITY, -INFINITY};   // m_i: running row max (scaled scores, log2 units)
  float l[2] = {0.f, 0.f};               // l_i: running row sum, this thread's columns
#pragma unroll
  for (int i = 0; i < Cfg::kPvCols / 2; ++i) O[i] = 0.f;

  if (t.n_blocks == 0)
    release_q_after(s, t, -1);  // a tile with no visible K/V block never reads Q̂_i
  else
    overlapped_blocks<Cfg, D>(s, p, t, turn, wg_row0, O, P_op, m, l, scales);
  // Back to real units: O_i times the last v_scale, and the 2^8 of P out of O_i and l_i
  // (exact: a power of two), so that write_output's O / l and lse = m + log l hold.
  const float o_units[2] = {scales.v_scale_cur / kPOffset, scales.v_scale_cur / kPOffset};
  rescale<D>(O, o_units);
  l[0] /= kPOffset;
  l[1] /= kPOffset;
  write_output<D, __nv_bfloat16>(O, m, l, t.bh, wg_row0, p);
  timeline_mark(t.seq, Mark::output_done);
}

// ---------------------------------------------------------------------------------------
// The kernel: each CTA walks its tiles (B_r query rows, head, batch); see Schedule.
// ---------------------------------------------------------------------------------------

// Thread 0 sets up the Q barrier and the K/V ring's full/empty barriers; everyone waits.
template <class Cfg, class Smem>
__device__ inline void init_barriers(Smem& s) {
  if (threadIdx.x == 0) {
    constexpr uint32_t kConsumerWarps = Cfg::kConsumers * Cfg::kWarpsPerWg;
    mbarrier_init(&s.q_full, 1);
    mbarrier_init(&s.q_empty, kConsumerWarps * 32);  // every consumer thread (release_q_after)
    for (int i = 0; i < Cfg::kStages; ++i) {
      mbarrier_init(&s.k_full[i], 1);  // the producer's arrive.expect_tx; then the bytes
      mbarrier_init(&s.v_full[i], 1);
      mbarrier_init(&s.k_empty[i], kConsumerWarps);  // one arrival per consumer warp (release_kv)
      mbarrier_init(&s.v_empty[i], kConsumerWarps);
    }
    fence_barrier_init();
  }
  __syncthreads();
}

template <int D>
__global__ void __launch_bounds__(Config<D>::kThreads, 1) fa3_forward(const __grid_constant__ Params p) {
  using Cfg = Config<D>;
  using Smem = SharedStorage<D>;
  extern __shared__ uint8_t smem_raw[];
  Smem& s = aligned_shared<Smem>(smem_raw);
  init_barriers<Cfg>(s);
  const int wg = threadIdx.x / Cfg::kWgThreads;
  if (wg == 0) {  // the producer gives registers back; its first warp issues every copy
    setmaxnreg_dec<Cfg::kProducerRegs>();
    if (threadIdx.x < 32) produce_tiles<Cfg>(s, p);
  } else {  // the consumers take them, and take turns that run on from one tile to the next
    setmaxnreg_inc<Cfg::kConsumerRegs>();
    const TurnTaking<Cfg> turn{wg - 1};
    turn.start();
    consume_tiles<Cfg>(s, p, [&](const Tile& t) { consume<Cfg, D>(s, p, t, turn); });
    turn.finish();
  }
}

// e4m3 Q̂, K̂, V̂ᵀ [B*Hkv, d, Nk padded] and their dequantization scales, in the block
// layout of Fp8Workspace: the pre-kernel's workspace, or a caller's e4m3 tensors.
struct Inputs {
  const void *q8, *k8, *v8;
  const float *q_scale, *k_scale, *v_scale;
};

// The attention kernel on `in`; its unit counter at `counter_offset` of the workspace.
template <int D>
void launch(const AttnProblem& pr, const AttnTensors& tensors, const Inputs& in, size_t counter_offset,
            Schedule schedule, cudaStream_t stream) {
  using Cfg = Config<D>;
  constexpr auto kKernel = fa3_forward<D>;
  constexpr size_t kSmemBytes = sizeof(SharedStorage<D>) + alignof(SharedStorage<D>);
  static_assert(kSmemBytes <= 227 * 1024, "more shared memory than a Hopper CTA may have");
  const int ctas_per_sm = configure_kernel<kKernel>(Cfg::kThreads, kSmemBytes);

  const Fp8Workspace blocks(pr, /*vt_in_hbm=*/true);  // scale blocks, and V̂ᵀ's padded row length
  constexpr CUtensorMapDataType kType = CU_TENSOR_MAP_DATA_TYPE_UINT8;  // e4m3 bytes
  constexpr int kE4m3Bytes = 1;
  Params p{};
  p.q_map = make_tensor_map_3d(in.q8, kType, pr.B * pr.H, pr.Nq, D, kWarpgroupRows, kE4m3Bytes, Cfg::kSwizzle);
  p.k_map = make_tensor_map_3d(in.k8, kType, pr.B * pr.Hkv, pr.Nk, D, Cfg::B_c, kE4m3Bytes, Cfg::kSwizzle);
  // V̂ᵀ: rows are the d dims, columns the (padded) keys; one box = all d rows x one chunk of keys
  p.v_map = make_tensor_map_3d(in.v8, kType, pr.B * pr.Hkv, D, int(blocks.nk_padded), D, kE4m3Bytes,
                               Cfg::kVtSwizzle);
  p.o = static_cast<__nv_bfloat16*>(tensors.o);
  p.lse = tensors.lse;
  p.q_scale = in.q_scale;
  p.k_scale = in.k_scale;
  p.v_scale = in.v_scale;
  p.q_blocks = int(blocks.q_blocks);
  p.kv_blocks = int(blocks.kv_blocks);
  set_problem<Cfg::B_r>(p, pr, sizeof(E4m3));

  const unsigned grid = grid_size(p.n_tiles, schedule, ctas_per_sm);
  p.unit_counter = unit_counter(tensors, counter_offset, schedule, pr.causal, stream);
  kKernel<<<grid, Cfg::kThreads, kSmemBytes, stream>>>(p);
  CUDA_CHECK_LAUNCH();
}

// The attention kernel on the workspace the pre-kernel filled (Fp8Workspace, V̂ᵀ in HBM).
template <int D>
void launch_on_workspace(const AttnProblem& pr, const AttnTensors& tensors, Schedule schedule, cudaStream_t stream) {
  const Fp8Workspace ws(pr, /*vt_in_hbm=*/true);
  const char* base = static_cast<const char*>(tensors.workspace);
  const Inputs in{base + ws.q8,
                  base + ws.k8,
                  base + ws.v8,
                  reinterpret_cast<const float*>(base + ws.q_scale),
                  reinterpret_cast<const float*>(base + ws.k_scale),
                  reinterpret_cast<const float*>(base + ws.v_scale)};
  launch<D>(pr, tensors, in, ws.unit_counter, schedule, stream);
}

}  // namespace attn::fa3::fp8e
