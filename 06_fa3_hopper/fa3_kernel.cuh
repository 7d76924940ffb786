// FlashAttention-3 forward (Shah et al. 2024) for sm_90a, as one kernel template whose
// compile-time switches (fa3_launch.h: Variant) add the paper's ideas one at a time:
//
//   06a tma_wgmma         one warpgroup: TMA loads Q, K_j, V_j onto mbarriers; S = Q K_jᵀ by
//                         wgmma SS; softmax in registers; O += P V_j by wgmma RS. Synchronous.
//   06b warp_specialized  + a producer warpgroup (few registers) streams K_j, V_j through an
//                         s-stage ring (full/empty mbarriers); two consumer warpgroups
//                         (many registers) compute 64 query rows each.
//   06c pingpong          + named barriers take turns: one consumer's S GEMM is issued
//                         while the other runs its softmax.
//   06d fa3               + intra-warpgroup overlap: S_(j+1) = Q K_(j+1)ᵀ and O += P_j V_j
//                         are both in flight while the softmax of S_(j+1) runs; launched
//                         persistent without a mask (Schedule in fa3_launch.h).
//
// Included only by the generated instance TUs (fa3_<variant>.cu.in).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cfloat>
#include <climits>
#include <cmath>
#include <type_traits>

#include "06_fa3_hopper/fa3_launch.h"
#include "06_fa3_hopper/hopper.cuh"
#include "common/check.h"
#include "common/tile_order.h"

namespace attn::fa3 {

using namespace attn::hopper;

// Tile timeline: bench/tile_timeline.cu defines FA3_TIMELINE and a timeline_mark that
// stamps the SM clock at each of these events of a tile; in every other build the marks
// compile to nothing. The first six are once per tile; the rest inside the loop over K/V
// blocks, for one block per tile (the middle one: timeline_mark_block). block_end stays
// last: the tool sizes its table by it.
enum class Mark {
  q_issued, q_ready, block0_done, loop_done, last_pv_done, output_done,
  block_begin, k_ready, turn_taken, s_issued, gemms_issued, s_landed, pv_landed, block_end
};
#ifndef FA3_TIMELINE
__device__ inline void timeline_mark(int /*tile seq*/, Mark) {}
#else
__device__ void timeline_mark(int seq, Mark mark);  // defined by the including tool
#endif
__device__ inline void timeline_mark_block(int seq, int j, int n_blocks, Mark mark) {
  if (j == n_blocks / 2) timeline_mark(seq, mark);
}

template <Variant V, int D, typename T>
struct Config {
  static constexpr bool kWarpSpecialized = warp_specialized(V);
  // Ping-pong in 06c; 06d keeps it where the softmax is a large share of the work (d <= 128):
  // at d = 256 the P V GEMM dominates and forced turns only add waiting (as FA3 does).
  static constexpr bool kPingpong = V == Variant::pingpong || (is_06d(V) && D <= 128);
  static constexpr bool kIntraOverlap = is_06d(V);
  // Hold the wait for the in-flight P V until the softmax is done (overlapped_blocks), so
  // that the softmax really runs under it. Measured on an H100 (README): faster at d = 256
  // only. At d = 128 with the ping-pong, ptxas then spills O and serializes the wgmma
  // (C7512, set off by TurnTaking::finish's barrier after the tile loop); with the turns on
  // mbarriers it compiles, and at d <= 128 it is no faster (README, Tried).
  static constexpr bool kSoftmaxUnderPv = is_06d(V) && D == 256;
  static constexpr bool kPvWaitFirst = false;  // FP8 at d = 128 (Fp8Config)
  // 06d's softmax of blocks 1, 2, ... exponentiates against the running max m_i and takes the
  // block's max from P afterwards, off the softmax's critical path (settle_speculation): at
  // d <= 128, where each warpgroup's softmax sits between its own P V and its next GEMMs.
  static constexpr bool kSpeculativeMax = is_06d(V) && D <= 128;
  // Schedule::persistent_cta_pairs compiled in (has_pairs_code): 06d without it is 0-5 %
  // faster at d <= 128 (H100), its K/V releases no longer reading the cluster rank.
  static constexpr bool kMayPairCtas = has_pairs_code(V, D);

  static constexpr int kWgThreads = 128;                                      // threads per warpgroup
  static constexpr int kConsumers = consumer_warpgroups(V, D);                // consumer warpgroups
  static constexpr int kThreads = kWgThreads * (kConsumers + (kWarpSpecialized ? 1 : 0));
  static constexpr int B_r = block_rows(V, D);  // query rows per CTA
  static constexpr int B_c = block_cols(V, D);  // keys per K/V block
  static constexpr int kStages = kWarpSpecialized ? 2 : 1;  // K/V ring depth: deeper hides more load latency, costs smem

  // Shared-memory tiles are d/64 column chunks of [rows][64]: 128-byte rows, swizzled
  // (swizzle.h). The FP8 path (Fp8Config) fills the same names for its e4m3 Q and K tiles.
  static constexpr Swizzle kSwizzle = Swizzle::b128;
  static constexpr int kSwizzleRowBytes = row_bytes(kSwizzle);          // 128
  static constexpr int kChunkCols = kSwizzleRowBytes / int(sizeof(T));  // 64
  static constexpr int kChunks = D / kChunkCols;
  static constexpr int kAtomBytes = atom_bytes(kSwizzle);  // 8-row swizzle atom: 1024
  static constexpr int kK = 16;                            // wgmma K per instruction

  static constexpr uint32_t kQBytes = uint32_t(kConsumers) * kWarpgroupRows * D * sizeof(T);
  static constexpr uint32_t kKVBytes = uint32_t(B_c) * D * sizeof(T);

  // setmaxnreg budgets (64K registers / CTA): 128 x 24 + 256 x 240 (or 384 x 160) <= 65536.
  static constexpr int kProducerRegs = 24;
  static constexpr int kConsumerRegs = kConsumers == 3 ? 160 : 240;
  static constexpr int kWarpsPerWg = kWgThreads / 32;
  // Named barriers of the ping-pong, one per consumer warpgroup (0 is __syncthreads).
  static constexpr int kTurnBarrier = 1;

  static_assert(D % kChunkCols == 0 && B_c % kK == 0, "tiles are whole 128-byte chunks and wgmma K steps");
  static_assert(B_c * kSwizzleRowBytes % kAtomBytes == 0, "every chunk starts on a 1024-byte swizzle atom");
  static_assert(B_c / 2 * kSwizzleRowBytes % kAtomBytes == 0, "a CTA pair's half blocks start on swizzle atoms");
  static_assert(!kWarpSpecialized || setmaxnreg_budgets_fit(kConsumers, kProducerRegs, kConsumerRegs),
                "the consumers' registers must come from the producer's");
  static_assert(!kPingpong || kConsumers >= 2, "the ping-pong needs two or more consumer warpgroups");
};

template <class Cfg, typename T, int D>
struct alignas(1024) SharedStorage {  // 128-byte swizzle atoms need 1024-byte alignment
  T q[Cfg::kConsumers][kWarpgroupRows * D];  // Q_i, one 64-row block per consumer warpgroup
  T k[Cfg::kStages][Cfg::B_c * D];           // K_j ring
  T v[Cfg::kStages][Cfg::B_c * D];           // V_j ring
  uint64_t q_full, q_empty;
  uint64_t k_full[Cfg::kStages], k_empty[Cfg::kStages];
  uint64_t v_full[Cfg::kStages], v_empty[Cfg::kStages];
  int unit;  // the unit of the tile whose Q_i q_full announces (produce_tiles)
};

template <typename T>
struct Params {
  CUtensorMap q_map, k_map, v_map;  // [B*H, Nq, d] and [B*Hkv, Nk, d], 128B-swizzled boxes
  T* o;
  float* lse;        // may be null
  const T *q, *k;    // the raw Q and K, read only by the softmax's overflow path (recompute_scores)
  int Nq, Nk, H, Hkv, group, m_blocks, n_tiles;  // n_tiles = m_blocks * B * H
  int n_units;       // what the grid walks: the tiles, or with cta_pairs the pairs of tiles
  TileOrder order;   // which tile unit u is (common/tile_order.h: longest first with a causal mask)
  float scale_log2;  // softmax scale * log2(e), for exp2
  float rescale_log2;       // 06d's lazy rescaling: O_i is rescaled once a max grows by more (online_softmax)
  float p_limit;            // 2^rescale_log2: the largest P a block keeps without moving m_i (settle_speculation)
  bool causal;
  bool cta_pairs;     // Schedule::persistent_cta_pairs: clusters of 2 CTAs share K/V loads
  int* unit_counter;  // Schedule::persistent: units past the first round, handed out in turn
                      // (zeroed before each launch); null: the fixed rounds of next_unit
};

// One unit of work: query rows [row0, row0 + B_r) of head bh, against n_blocks K/V blocks.
// A CTA may do several (Schedule::persistent); `seq` and `kv0` say where this one falls in
// the CTA's sequence, which is what the barrier phases follow.
struct Tile {
  int bh;        // b * H + h
  int kv_head;   // b * Hkv + h / group
  int row0;      // first query row
  int n_blocks;  // K/V blocks left of the causal diagonal (all of them without causal)
  int seq;       // the CTA's tiles before this one: Q barrier phase = seq & 1
  int kv0;       // the CTA's K/V blocks before this one: block j uses ring slot kv0 + j
};

// A CTA's unit of work is one tile, or with CTA pairs one of a pair of neighbouring Q
// blocks of one head: the cluster's CTA of rank r takes block 2u + r of pair u (past the
// last block when a head has an odd count: rows past Nq, computed and never written, so
// that both CTAs load the same K/V).
template <class Cfg, class Prm>  // Prm: Params<T>, or the FP8 kernel's Fp8Params
__device__ Tile make_tile(const Prm& p, int unit) {
  Tile t;
  int m_block;
  if (Cfg::kMayPairCtas && p.cta_pairs) {
    const int m_pairs = (p.m_blocks + 1) / 2;
    t.bh = unit / m_pairs;
    m_block = 2 * (unit % m_pairs) + int(cluster_ctarank());
  } else {
    const TileCoord c = tile_at(p.order, unit);
    t.bh = c.bh;
    m_block = c.m_block;
  }
  t.kv_head = (t.bh / p.H) * p.Hkv + (t.bh % p.H) / p.group;
  t.row0 = m_block * Cfg::B_r;
  t.n_blocks = (p.Nk + Cfg::B_c - 1) / Cfg::B_c;
  if (p.causal) {  // keys [0, visible) are seen by the block's last real row
    const int visible = min(t.row0 + Cfg::B_r, p.Nq) + (p.Nk - p.Nq);
    t.n_blocks = visible <= 0 ? 0 : min(t.n_blocks, (visible + Cfg::B_c - 1) / Cfg::B_c);
  }
  return t;
}

// The CTA's seq-th tile, unit `unit`: its K/V blocks follow the `kv` blocks of the CTA's
// earlier tiles in the ring (kv advances past them). Every side that walks the CTA's tiles
// counts them this way, so all agree on each block's ring slot and each tile's Q phase.
template <class Cfg, class Prm>
__device__ Tile tile_in_sequence(const Prm& p, int unit, int seq, int& kv) {
  Tile t = make_tile<Cfg>(p, unit);
  t.seq = seq;
  t.kv0 = kv;
  kv += t.n_blocks;
  return t;
}

// The units of a CTA that does its own loads (06a, one tile per CTA): blockIdx.x,
// blockIdx.x + gridDim.x, ...
template <class Cfg, class Prm, class Body>
__device__ void for_each_tile(const Prm& p, Body&& body) {
  int seq = 0, kv = 0;
  for (int unit = blockIdx.x; unit < p.n_units; unit += gridDim.x, ++seq) body(tile_in_sequence<Cfg>(p, unit, seq, kv));
}

// The seq-th unit of a warp-specialized CTA. The first is the CTA's own index (per cluster
// with CTA pairs). Schedule::persistent then hands out units in turn from a counter, each
// to whichever CTA asks next: a greedy list schedule, as the hardware's own hand-out of
// CTAs is, which with the causal mask's longest-first order (tile_order.h) keeps the CTAs'
// total work within about one tile of each other. (Fixed rounds b, b + G, ... would give
// CTA 0 the longest tile of every round.) Past the last unit, the producer tells the
// consumers to stop.
//
// Called by a whole warp (produce_tiles), which gets the unit as a warp-uniform value: the
// tile's coordinates then live in uniform registers. Read by one thread, they would not fit
// the producer's 24 registers per thread (setmaxnreg) next to everything else.
template <class Cfg, class Prm>
__device__ int next_unit(const Prm& p, int seq) {
  const int ctas_per_unit = Cfg::kMayPairCtas && p.cta_pairs ? 2 : 1;
  const int ctas = gridDim.x / ctas_per_unit, cta = blockIdx.x / ctas_per_unit;
  if (seq == 0 || !p.unit_counter)  // CTA pairs, and one tile per CTA (whose second unit is past the end)
    return seq * ctas + cta;
  int taken = 0;
  if (threadIdx.x % 32 == 0) taken = atomicAdd(p.unit_counter, 1);
  return ctas + __reduce_max_sync(0xffffffffu, taken);  // lane 0's, to every lane
}

// Ring slot of the CTA's it-th K/V block: stage it mod s, and the parity of the lap.
template <class Cfg>
struct Slot {
  int stage;
  uint32_t phase;
  __device__ explicit Slot(int it) : stage(it % Cfg::kStages), phase(uint32_t(it / Cfg::kStages) & 1) {}
};

// ---------------------------------------------------------------------------------------
// Loads (the producer's side): TMA copies that complete on the stage's "full" barrier.
// ---------------------------------------------------------------------------------------

template <class Cfg, class Smem, class Prm>
__device__ void load_q(Smem& s, const Prm& p, const Tile& t) {
  mbarrier_arrive_expect_tx(&s.q_full, Cfg::kQBytes);
  for (int w = 0; w < Cfg::kConsumers; ++w)
    for (int c = 0; c < Cfg::kChunks; ++c)
      tma_load_3d(&s.q[w][c * kWarpgroupRows * Cfg::kChunkCols], &p.q_map, c * Cfg::kChunkCols,
                  t.row0 + w * kWarpgroupRows, t.bh, &s.q_full);
}

// One B_c x d block (K_j or V_j) into `tile`, completing on `full`. With CTA pairs each CTA
// copies half of the rows, into its own and its peer's `tile` at once (TMA multicast), so
// the pair reads each block from L2 once; each CTA's `full` still expects the whole block.
template <class Cfg, class Prm>
__device__ void load_kv(void* tile, const CUtensorMap* map, int j, int kv_head, uint64_t* full, const Prm& p) {
  mbarrier_arrive_expect_tx(full, Cfg::kKVBytes);
  char* chunk0 = static_cast<char*>(tile);
  constexpr int kChunkBytes = Cfg::B_c * Cfg::kSwizzleRowBytes;  // one 128-byte column chunk of the block
  if (!(Cfg::kMayPairCtas && p.cta_pairs)) {
    for (int c = 0; c < Cfg::kChunks; ++c)
      tma_load_3d(chunk0 + c * kChunkBytes, map, c * Cfg::kChunkCols, j * Cfg::B_c, kv_head, full);
  } else {
    constexpr int kHalf = Cfg::B_c / 2;  // rows per CTA (the tensor map's box)
    const int rank = int(cluster_ctarank());
    for (int c = 0; c < Cfg::kChunks; ++c)
      tma_load_3d_multicast(chunk0 + c * kChunkBytes + rank * kHalf * Cfg::kSwizzleRowBytes, map,
                            c * Cfg::kChunkCols, j * Cfg::B_c + rank * kHalf, kv_head, full, /*both CTAs*/ 0b11);
  }
}

// The producer (one warp; 06b-d and the FP8 kernel; its lane 0 issues every copy), tile
// after tile: Q_i once the consumers are done with the last tile's, then K_j and V_j into
// the ring, each stage reused once every consumer warp released it ("empty" barriers; on
// the first lap they pass at once). The unit of each tile goes to the consumers in shared
// memory, announced by Q_i's "full" barrier (its arrival releases the write; their wait
// acquires it), which after the last unit completes with no copy: the consumers' signal to
// stop (consume_tiles).
// `load_v(t, stage, j)` copies V_j (the FP8 path: V̂_jᵀ) and completes on v_full[stage].
template <class Cfg, class Smem, class Prm, class LoadV>
__device__ void produce_tiles(Smem& s, const Prm& p, LoadV&& load_v) {
  int kv = 0;
  for (int seq = 0;; ++seq) {
    // Asked for only once the last tile's loads are all issued, with the ring's last blocks
    // still ahead of the consumers: the CTA takes its next unit shortly before it is free.
    const int unit = next_unit<Cfg>(p, seq);
    mbarrier_wait(&s.q_empty, (seq & 1) ^ 1);  // the consumers read the last unit and are done with its Q_i
    const bool leader = threadIdx.x % 32 == 0;
    if (leader) s.unit = unit;
    if (unit >= p.n_units) {
      if (leader) mbarrier_arrive(&s.q_full);
      return;
    }
    const Tile t = tile_in_sequence<Cfg>(p, unit, seq, kv);
    if (leader) load_q<Cfg>(s, p, t);
    timeline_mark(seq, Mark::q_issued);
    for (int j = 0; j < t.n_blocks; ++j) {
      const Slot<Cfg> slot(t.kv0 + j);
      mbarrier_wait(&s.k_empty[slot.stage], slot.phase ^ 1);
      if (leader) load_kv<Cfg>(s.k[slot.stage], &p.k_map, j, t.kv_head, &s.k_full[slot.stage], p);
      mbarrier_wait(&s.v_empty[slot.stage], slot.phase ^ 1);
      if (leader) load_v(t, slot.stage, j);
    }
  }
}

// The consumers' side of produce_tiles: each tile's unit, read once its Q_i has arrived.
template <class Cfg, class Smem, class Prm, class Body>
__device__ void consume_tiles(Smem& s, const Prm& p, Body&& body) {
  int kv = 0;
  for (int seq = 0;; ++seq) {
    mbarrier_wait(&s.q_full, seq & 1);
    const int unit = __reduce_max_sync(0xffffffffu, ld_shared(&s.unit));  // the same in every lane: warp-uniform
    if (unit >= p.n_units) return;
    timeline_mark(seq, Mark::q_ready);
    body(tile_in_sequence<Cfg>(p, unit, seq, kv));
  }
}

// ---------------------------------------------------------------------------------------
// The two GEMMs of one warpgroup (64 query rows).
// ---------------------------------------------------------------------------------------

// S_ij = Q_i K_jᵀ: d/K wgmma SS (both operands K-major), one commit group. Each K step
// reads 32 bytes of every row (16 bf16 or 32 e4m3): the start address moves 32 B along
// the swizzle row, then on to the next column chunk (kmajor_step_offset, swizzle.h).
template <class Cfg, typename T>
__device__ void gemm_qk(float (&S)[Cfg::B_c / 2], const T* Q_i, const T* K_j) {
  constexpr int kSteps = Cfg::kChunks * Cfg::kChunkCols / Cfg::kK;  // d / K
  constexpr int kStepBytes = Cfg::kK * int(sizeof(T));
  static_assert(Cfg::kSwizzleRowBytes % kStepBytes == 0, "a K step stays inside one swizzle row");
  const uint64_t q_desc = make_smem_desc(Q_i, /*unused*/ 16, Cfg::kAtomBytes, Cfg::kSwizzle);
  const uint64_t k_desc = make_smem_desc(K_j, /*unused*/ 16, Cfg::kAtomBytes, Cfg::kSwizzle);
  pin_registers(S);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kSteps; ++kk)
    Wgmma<T, Cfg::B_c>::ss(S, desc_advance(q_desc, kmajor_step_offset(kk, kStepBytes, kWarpgroupRows, Cfg::kSwizzle)),
                           desc_advance(k_desc, kmajor_step_offset(kk, kStepBytes, Cfg::B_c, Cfg::kSwizzle)),
                           /*accumulate=*/kk > 0);
  wgmma_commit();
  pin_registers(S);
}

// O_i += P_ij V_j: B_c/16 wgmma RS (P from registers, V N-major), one commit group.
template <class Cfg, typename T, int D>
__device__ void gemm_pv(float (&O)[D / 2], const uint32_t (&P)[Cfg::B_c / Cfg::kK][4], const T* V_j) {
  // N-major V: 8-row atoms 1024 B apart along K (keys), 64-column chunks B_c*128 B apart along N.
  const uint64_t v_desc = make_smem_desc(V_j, Cfg::B_c * Cfg::kSwizzleRowBytes, Cfg::kAtomBytes, Cfg::kSwizzle);
  pin_registers(O);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < Cfg::B_c / Cfg::kK; ++kk)
    Wgmma<T, D>::rs(O, P[kk], desc_advance(v_desc, kk * Cfg::kK * Cfg::kSwizzleRowBytes), /*accumulate=*/1);
  wgmma_commit();
  pin_registers(O);
}

// ---------------------------------------------------------------------------------------
// Softmax on the wgmma accumulator layout. Thread (warp w, lane l) of a warpgroup owns
// rows r = 16w + l/4 (slot 0) and r + 8 (slot 1), columns 8i + 2(l%4) + {0,1}:
//
//            cols 0-1  2-3  4-5  6-7 | 8-9 ...
//   row 0      T0   T1   T2   T3     | T0  ...     S[4i + 0..1] -> row r
//   row 8      T0   T1   T2   T3     | T0  ...     S[4i + 2..3] -> row r + 8
//
// so a row's values live in 4 neighbouring lanes: row reductions are two shuffles.
// ---------------------------------------------------------------------------------------

struct Fragment {
  int row[2];    // this thread's two rows, relative to the warpgroup's first row
  int col_base;  // first column of this thread inside each 8-column group
  __device__ Fragment() {
    const int lane = threadIdx.x % 32, warp = (threadIdx.x / 32) % 4;
    row[0] = 16 * warp + lane / 4;
    row[1] = row[0] + 8;
    col_base = 2 * (lane % 4);
  }
};

// The max over a row's four threads: of floats (fmaxf), or of ints (row_max_bits).
template <typename T>
__device__ inline T quad_max(T x) {
  x = max(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return max(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ inline float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// Row `slot`'s max over block S: a tree over the thread's B_c/4 values (log2 deep, where
// a running max would be a chain of B_c/4 dependent instructions on the softmax's critical
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

// Row `slot`'s max over block S as bits: a float's bits read as a signed int order the
// floats >= 0 correctly and put every negative float below them, so where the row has a
// score >= 0 this is the bits of its float max, on the integer ALU's three-input max
// (VIMNMX3): half the instructions of row_max's tree. Where every score is negative it is
// a negative int and says only that.
template <class Cfg>
__device__ int row_max_bits(const float (&S)[Cfg::B_c / 2], int slot) {
  constexpr int kN = Cfg::B_c / 4;  // this thread's entries of the row
  int v[kN];
#pragma unroll
  for (int i = 0; i < kN; ++i) v[i] = __float_as_int(S[4 * (i / 2) + 2 * slot + i % 2]);
#pragma unroll
  for (int w = 1; w < kN; w *= 3)
#pragma unroll
    for (int i = 0; i + w < kN; i += 3 * w)
      v[i] = i + 2 * w < kN ? max(max(v[i], v[i + w]), v[i + 2 * w]) : max(v[i], v[i + w]);
  return quad_max(v[0]);
}

// Both rows' m_blk = max(m_i, rowmax(S_ij) * s_log2), the running max m_i in the
// exponent's units (s_log2 > 0). From row_max_bits where that is exact: a row with a score
// >= 0, or any row whose m_i >= 0 already (its scores' max, negative, cannot pass m_i).
// Otherwise (a row with no score >= 0 yet: all keys masked, or negative scores only) the
// warp takes row_max's float tree.
template <class Cfg>
__device__ void block_max(const float (&S)[Cfg::B_c / 2], const float (&m)[2], float s_log2, float (&m_blk)[2]) {
  int bits[2];
  bool exact = true;
#pragma unroll
  for (int slot = 0; slot < 2; ++slot) {
    bits[slot] = row_max_bits<Cfg>(S, slot);
    exact &= bits[slot] >= 0 || m[slot] >= 0.f;
  }
  if (__all_sync(0xffffffffu, exact)) {
#pragma unroll
    for (int slot = 0; slot < 2; ++slot) m_blk[slot] = fmaxf(m[slot], __int_as_float(bits[slot]) * s_log2);
  } else {
#pragma unroll
    for (int slot = 0; slot < 2; ++slot) m_blk[slot] = fmaxf(m[slot], row_max<Cfg>(S, slot) * s_log2);
  }
}

// Keys past Nk (TMA read zeros there) and, causal, keys right of the diagonal get -inf.
template <class Cfg, class Prm>
__device__ void mask_block(float (&S)[Cfg::B_c / 2], int j, int wg_row0, const Prm& p) {
  const Fragment f;
#pragma unroll
  for (int slot = 0; slot < 2; ++slot) {
    const int last_key = p.causal ? min(p.Nk - 1, wg_row0 + f.row[slot] + (p.Nk - p.Nq)) : p.Nk - 1;
#pragma unroll
    for (int i = 0; i < Cfg::B_c / 8; ++i)
#pragma unroll
      for (int e = 0; e < 2; ++e)
        if (j * Cfg::B_c + 8 * i + f.col_base + e > last_key) S[4 * i + 2 * slot + e] = -INFINITY;
  }
}

template <class Cfg, class Prm>
__device__ bool block_needs_mask(int j, int wg_row0, const Prm& p) {
  const int key_end = (j + 1) * Cfg::B_c;  // one past the block's last key
  return key_end > p.Nk || (p.causal && key_end - 1 > wg_row0 + (p.Nk - p.Nq));
}

// online_softmax's kLinearExps: whether pair `pair` (entries 2 pair, 2 pair + 1) of a row is
// among the k of every 8 pairs whose exponentials exp2_e4m3_linear takes. P's operand
// registers hold two pairs each (to_operand_fp8): two converted pairs cost 2 instructions
// (F2FP, F2FP merging), two pairs of bytes 3 (PRMT), one of each 3, so whole registers go
// first, the 4 of every 8 in the order 0, 2, 1, 3, then for an odd k one pair alone.
constexpr bool linear_exp_pair(int pair, int k) {
  const int reg = pair / 2 % 4;
  return 2 * (reg % 2 * 2 + reg / 2) + pair % 2 < k;
}

// f(n, S[x]) for each of this thread's entries of row `slot` (Fragment), in column order;
// n = 0, 1, ..., B_c/4 - 1 is the entry's place among them (a constant once unrolled), so a
// caller may keep two accumulator chains (n % 2) or treat every k-th entry apart.
template <class Cfg, class F>
__device__ void for_each_in_row(float (&S)[Cfg::B_c / 2], int slot, F&& f) {
#pragma unroll
  for (int i = 0; i < Cfg::B_c / 8; ++i)
#pragma unroll
    for (int e = 0; e < 2; ++e) f(2 * i + e, S[4 * i + 2 * slot + e]);
}

// Online softmax of one block (FA2 Algorithm 1, lines 8-10), base 2:
//   m_i^new = max(m_i, rowmax(S_ij));  P_ij = exp(S_ij - m_i^new) (in place in S);
//   alpha = exp(m_i - m_i^new);  l_i = alpha l_i + rowsum(P_ij)   (l_i: this thread's part).
// The caller rescales O_i by alpha (06d: later, once the in-flight P V has landed).
// s_log2 takes a raw score to the exponent's log2 units (softmax scale * log2(e); the FP8
// kernel folds its dequantization scales in, per block), and m_i is kept in those units;
// P_ij carries a factor 2^p_offset_log2 (FP8: 2^8, FA3's max offset), so does l_i.
//
// kLazy (06d): a row's m_i moves only when its max has grown by more than rescale_log2 in
// the exponent's log2 units; otherwise the block is exponentiated against the old m_i, so
// P_ij <= 2^rescale_log2, and alpha = 1. Exact in exact arithmetic (l_i and O_i always
// refer to the same m_i); after the first blocks a max rarely grows that much, so most
// blocks skip the d/2 multiplies of O_i that otherwise sit between a block's P V and the
// next one's GEMMs. Returns whether either of the thread's rows moved (the four threads of
// a row agree). The decision is per row, not per warp: a warp vote would make every
// exponential wait for both rows' maxima and the vote, which the 06d schedule, with the
// softmax on its critical path, pays for (measured: 5-8 % at d <= 128).
// kRowSums = false (the FP8 kernel's row-sum column, where the P V GEMM sums P's rows): l_i
// is left alone. kIntMax (FP8): the row maxima on the integer ALU (block_max).
// kLinearExps (FP8): the exponentials of that many of every 8 pairs of a row's entries
// (linear_exp_pair) by exp2_e4m3_linear, straight to P's e4m3 bytes (an FFMA and an FMNMX,
// the line through the powers of two, within 4 % before e4m3's rounding) instead of the
// MUFU; such an entry holds its byte in its low 8 bits, for to_operand_fp8, so the row sums
// must come from elsewhere (the row-sum column), and m_i is kept on e4m3_linear_grid.
template <class Cfg, bool kLazy, bool kRowSums = true, bool kIntMax = false, int kLinearExps = 0>
__device__ bool online_softmax(float (&S)[Cfg::B_c / 2], float (&m)[2], float (&l)[2], float (&alpha)[2],
                               float s_log2, float rescale_log2, float p_offset_log2 = 0.f) {
  static_assert(kLinearExps == 0 || !kRowSums, "an entry left as an e4m3 byte cannot be summed");
  const float s_log2_e4m3 = kE4m3LinearStep * s_log2;
  bool any_moved = false;
  float m_blks[2];  // kIntMax: both rows' max(m_i, rowmax(S_ij)) at once (one vote)
  if constexpr (kIntMax) block_max<Cfg>(S, m, s_log2, m_blks);
#pragma unroll
  for (int slot = 0; slot < 2; ++slot) {
    // max(m_i, rowmax(S_ij))
    const float m_blk = kIntMax ? m_blks[slot] : fmaxf(m[slot], row_max<Cfg>(S, slot) * s_log2);
    const bool moved = !kLazy || m_blk - m[slot] > rescale_log2;  // -inf - (-inf): false
    any_moved |= moved;
    float m_new = moved ? m_blk : m[slot];
    if constexpr (kLinearExps > 0) m_new = e4m3_linear_grid(m_new);
    // A row that has seen only masked keys keeps m = -inf; exponentiate against 0 so
    // that exp(-inf - (-inf)) never appears: its P is 0 and alpha is 0.
    const float m_base = m_new == -INFINITY ? 0.f : m_new;
    alpha[slot] = moved ? exp2_approx(m[slot] - m_base) : 1.f;
    m[slot] = m_new;
    const float shift = p_offset_log2 - m_base;
    const float offset_e4m3 = e4m3_linear_offset(shift);
    float row_sum = 0.f;
    for_each_in_row<Cfg>(S, slot, [&](int n, float& s_ij) {
      if (linear_exp_pair(n / 2, kLinearExps))
        s_ij = exp2_e4m3_linear(fmaf(s_ij, s_log2_e4m3, offset_e4m3));
      else
        s_ij = exp2_approx(fmaf(s_ij, s_log2, shift));
      if constexpr (kRowSums) row_sum += s_ij;
    });
    if constexpr (kRowSums) l[slot] = alpha[slot] * l[slot] + row_sum;
  }
  return any_moved;
}

template <int D>
__device__ void rescale(float (&O)[D / 2], const float (&alpha)[2]) {
#pragma unroll
  for (int i = 0; i < D / 8; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) O[4 * i + e] *= alpha[e / 2];
}

// P (fp32 accumulator layout) -> the wgmma A-operand layout in bf16/fp16 registers. For
// each K step kk of 16 keys the two layouts coincide, so it is a pairwise convert:
//   P_op[kk][r] = {P[8kk + 2r], P[8kk + 2r + 1]}.
template <class Cfg, typename T>
__device__ void to_operand(const float (&P)[Cfg::B_c / 2], uint32_t (&P_op)[Cfg::B_c / Cfg::kK][4]) {
#pragma unroll
  for (int kk = 0; kk < Cfg::B_c / Cfg::kK; ++kk)
#pragma unroll
    for (int r = 0; r < 4; ++r) P_op[kk][r] = pack2<T>(P[8 * kk + 2 * r], P[8 * kk + 2 * r + 1]);
}

// ---------------------------------------------------------------------------------------
// 06d's softmax of blocks j >= 1, max last (kSpeculativeMax). online_softmax takes the
// block's row max first: ~90 dependent FMNMX and shuffles before the first
// exponential, on the critical path from the warpgroup's P V landing to its next GEMMs.
// With lazy rescaling the max almost never moves m_i, so the block is exponentiated against
// the running max right away, P_ij = 2^(S_ij s_log2 - m_i), and the max of P_ij is taken as
// the exponentials come out (FMNMX in the gaps of the MUFU stream). Only where a row's P
// exceeds p_limit = 2^rescale_log2 (its max grew by more than the lazy rule allows) is there
// more to do, and it is exact arithmetic: m_new = m_i + log2(max P_ij), then P_ij and
// rowsum(P_ij) times 2^(m_i - m_new). A score past the running max by ~128 in log2 units
// (less where several such keys add up) overflows P or its row sum to inf; then the warp
// recomputes its scores from Q and K in global memory and takes online_softmax's path.
// ---------------------------------------------------------------------------------------

struct Speculation {
  float base[2];     // the exponent base of the block's P: m_i, or 0 for a row with no key yet
  float row_sum[2];  // this thread's part of rowsum(P_ij), against base
  float p_max[2];    // this thread's max of P_ij
};

template <class Cfg>
__device__ void exps_against_running_max(float (&S)[Cfg::B_c / 2], const float (&m)[2], float s_log2,
                                         Speculation& sp) {
#pragma unroll
  for (int slot = 0; slot < 2; ++slot) {
    sp.base[slot] = m[slot] == -INFINITY ? 0.f : m[slot];
    const float shift = -sp.base[slot];
    float sum[2] = {0.f, 0.f}, mx[2] = {0.f, 0.f};  // two chains each, half as long
    for_each_in_row<Cfg>(S, slot, [&](int n, float& s_ij) {  // online_softmax's exponentials
      s_ij = exp2_approx(fmaf(s_ij, s_log2, shift));
      sum[n % 2] += s_ij;
      mx[n % 2] = fmaxf(mx[n % 2], s_ij);
    });
    sp.row_sum[slot] = sum[0] + sum[1];
    sp.p_max[slot] = fmaxf(mx[0], mx[1]);
  }
}

// The sum of products of the 8 elements (bf16 or fp16) in 16 bytes of a and of b, fp32.
template <typename T>
__device__ inline float dot8(const uint4& a, const uint4& b) {
  const uint32_t wa[4] = {a.x, a.y, a.z, a.w}, wb[4] = {b.x, b.y, b.z, b.w};
  float dot = 0.f;
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    float2 x, y;
    if constexpr (std::is_same_v<T, __nv_bfloat16>) {
      x = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&wa[w]));
      y = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&wb[w]));
    } else {
      x = __half22float2(*reinterpret_cast<const __half2*>(&wa[w]));
      y = __half22float2(*reinterpret_cast<const __half2*>(&wb[w]));
    }
    dot = fmaf(x.x, y.x, fmaf(x.y, y.y, dot));
  }
  return dot;
}

// S = Q_i K_jᵀ for this thread's entries of block j, from global memory on the CUDA cores
// (q: [B*H, Nq, D], k: [B*Hkv, Nk, D]; fp32 sums of the bf16/fp16 products, as the wgmma's).
// Rows past Nq and keys past Nk get 0, as TMA's zero fill gives them. Only the overflow path
// runs it: slow and small.
template <class Cfg, int D, typename T>
__device__ void recompute_scores(float (&S)[Cfg::B_c / 2], const Params<T>& p, const Tile& t, int wg_row0, int j) {
  const Fragment f;
#pragma unroll 1
  for (int idx = 0; idx < Cfg::B_c / 2; ++idx) {  // S[idx], idx = 4i + 2 slot + e
    const int i = idx / 4, slot = idx / 2 % 2, e = idx % 2;
    const int row = wg_row0 + f.row[0] + 8 * slot, key = j * Cfg::B_c + 8 * i + f.col_base + e;
    float dot = 0.f;
    if (row < p.Nq && key < p.Nk) {
      const uint4* q_row = reinterpret_cast<const uint4*>(p.q + (size_t(t.bh) * p.Nq + row) * D);
      const uint4* k_row = reinterpret_cast<const uint4*>(p.k + (size_t(t.kv_head) * p.Nk + key) * D);
#pragma unroll 1
      for (int c = 0; c < D / 8; ++c) dot += dot8<T>(q_row[c], k_row[c]);
    }
#pragma unroll
    for (int x = 0; x < Cfg::B_c / 2; ++x)  // S stays in registers: constant indices only
      if (x == idx) S[x] = dot;
  }
}

// After exps_against_running_max and the speculative to_operand: settle l_i, m_i and alpha
// (as online_softmax leaves them); returns whether O_i must be rescaled by alpha (1 for a
// row whose m_i stayed). Rows whose P stayed <= p_limit are done (one vote per warp).
template <class Cfg, int D, typename T>
__device__ bool settle_speculation(float (&S)[Cfg::B_c / 2], uint32_t (&P_op)[Cfg::B_c / Cfg::kK][4], float (&m)[2],
                                   float (&l)[2], float (&alpha)[2], const Speculation& sp, const Params<T>& p,
                                   const Tile& t, int wg_row0, int j) {
  // A row with no visible key yet (m_i = -inf) took base 0: any P > 0 must set its m_i.
  const bool grew = sp.p_max[0] > (m[0] == -INFINITY ? 0.f : p.p_limit) ||
                    sp.p_max[1] > (m[1] == -INFINITY ? 0.f : p.p_limit);
  if (!__any_sync(0xffffffffu, grew)) {
    l[0] += sp.row_sum[0];
    l[1] += sp.row_sum[1];
    return false;
  }
  // P, or this thread's sum of it, overflowed (P >= 0, so a finite sum means finite P): a
  // P of 2^125 is still a number, but 44 of them sum to inf.
  if (__any_sync(0xffffffffu, !(sp.row_sum[0] <= FLT_MAX && sp.row_sum[1] <= FLT_MAX))) {
    recompute_scores<Cfg, D>(S, p, t, wg_row0, j);
    if (block_needs_mask<Cfg>(j, wg_row0, p)) mask_block<Cfg>(S, j, wg_row0, p);
    const bool rescale_o = online_softmax<Cfg, /*kLazy=*/true>(S, m, l, alpha, p.scale_log2, p.rescale_log2);
    to_operand<Cfg, T>(S, P_op);
    return rescale_o;
  }
  bool any_moved = false;
#pragma unroll
  for (int slot = 0; slot < 2; ++slot) {
    // The row's max in the exponent's units (log2 of 0 is -inf: a row of masked keys).
    const float m_blk = fmaxf(m[slot], sp.base[slot] + log2_approx(quad_max(sp.p_max[slot])));
    const bool moved = m_blk - m[slot] > p.rescale_log2;  // the same for the row's four threads
    float row_sum = sp.row_sum[slot];
    alpha[slot] = 1.f;
    if (moved) {
      const float to_new = exp2_approx(sp.base[slot] - m_blk);
      for_each_in_row<Cfg>(S, slot, [&](int, float& p_ij) { p_ij *= to_new; });
      row_sum *= to_new;
      alpha[slot] = exp2_approx(m[slot] - m_blk);  // 0 from m_i = -inf
      m[slot] = m_blk;
    }
    l[slot] = alpha[slot] * l[slot] + row_sum;
    any_moved |= moved;
  }
  to_operand<Cfg, T>(S, P_op);
  return any_moved;
}

// Transpose a 4 x 4 block of 32-bit words across the quad of lanes that shares a row:
// lane q holds a[k] = M[q][k] and gets back a[j] = M[j][q]. Two butterfly steps, each
// swapping one bit of the lane with the same bit of k: 4 shuffles and a few selects.
__device__ inline void quad_transpose(uint32_t (&a)[4]) {
  const int q = threadIdx.x % 4;
#pragma unroll
  for (int bit = 2; bit >= 1; bit /= 2) {
    const bool high = q & bit;  // this lane keeps the words whose k has the bit set
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      if (k & bit) continue;  // visit each pair (k, k + bit) once
      const uint32_t sent = high ? a[k] : a[k + bit];
      const uint32_t got = __shfl_xor_sync(0xffffffffu, sent, bit);
      if (high) a[k] = got;
      else a[k + bit] = got;
    }
  }
}

// O_i = diag(l_i)^-1 O_i; lse_i = m_i + log(l_i) (FA2 Algorithm 1, lines 12-13), with m_i
// from log2 units (online_softmax) back to natural ones (times ln 2). Rows past
// Nq are never written; a row with no visible key gets O = 0 and lse = -inf.
//
// In the accumulator layout a lane holds 2 columns of every 8 (Fragment), so storing it
// as it is takes d/8 four-byte stores per row, each warp store touching 8 rows with 16
// bytes apiece: the L1 splits it into 8 half-used sectors, and at the end of every tile
// the warps queue behind their own stores (measured on an H100 at d = 128: 1.0-2.7 us of a
// 54 us tile, with no GEMM running under it; bench/tile_timeline). Instead the four lanes of a row swap words
// (quad_transpose) until each holds 8 consecutive columns of one 8-column group, and
// stores them with one 16-byte store: a quarter of the instructions, whole sectors.
constexpr float kLn2 = 0.693147180559945f;

template <int D, typename T, class Prm>
__device__ void write_output(const float (&O)[D / 2], const float (&m)[2], const float (&l)[2], int bh, int wg_row0,
                             const Prm& p) {
  const Fragment f;
  const int q = threadIdx.x % 4;
  const float l_row[2] = {quad_sum(l[0]), quad_sum(l[1])};  // whole-row sums (all lanes shuffle)
#pragma unroll
  for (int slot = 0; slot < 2; ++slot) {
    const int row = wg_row0 + f.row[slot];
    const float inv_l = l_row[slot] > 0.f ? 1.f / l_row[slot] : 0.f;
    T* o_row = p.o + (size_t(bh) * p.Nq + row) * D;
#pragma unroll
    for (int g = 0; g < D / 32; ++g) {  // 8-column groups 4g .. 4g + 3
      uint32_t w[4];                    // w[k]: this lane's 2 columns of group 4g + k
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const int i = 4 * g + k;
        w[k] = pack2<T>(O[4 * i + 2 * slot] * inv_l, O[4 * i + 2 * slot + 1] * inv_l);
      }
      quad_transpose(w);  // now w[j]: lane j's 2 columns of group 4g + q, i.e. columns 8(4g + q) + 2j, +1
      if (row < p.Nq)     // after the shuffles, which every lane of the warp must join
        *reinterpret_cast<uint4*>(o_row + 8 * (4 * g + q)) = make_uint4(w[0], w[1], w[2], w[3]);
    }
    if (p.lse && q == 0 && row < p.Nq)
      p.lse[size_t(bh) * p.Nq + row] = l_row[slot] > 0.f ? m[slot] * kLn2 + logf(l_row[slot]) : -INFINITY;
  }
}

// ---------------------------------------------------------------------------------------
// 06c/06d ping-pong: consumer warpgroups take turns (0, 1, .., 0, 1, ..) issuing their
// GEMMs; issuing hands the turn on, and the next one's GEMMs run under this one's softmax.
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

// A consumer warp is done with a K/V ring stage (06b-d): one arrival per warp. Under CTA
// pairs the peer's producer also fills the stage, so its "empty" barrier hears from this
// CTA's warps too.
template <class Cfg, class Prm>
__device__ inline void release_kv(uint64_t* empty, const Prm& p) {
  if (threadIdx.x % 32 == 0) {
    mbarrier_arrive(empty);
    if (Cfg::kMayPairCtas && p.cta_pairs) mbarrier_arrive_remote(empty, cluster_ctarank() ^ 1);
  }
}

// 06b-d and FP8: once the tile's last Q K_jᵀ has landed (j = n_blocks - 1; j = -1 for a tile
// with no visible K/V block, which never reads Q_i), Q_i's buffer may take the next tile's Q,
// and the unit slot the next unit (produce_tiles). Every consumer thread arrives: each read
// the unit slot itself (consume_tiles), and its arrival orders that read before the write.
template <class Cfg, class Smem>
__device__ inline void release_q_after(Smem& s, const Tile& t, int j) {
  if constexpr (Cfg::kWarpSpecialized)
    if (j == t.n_blocks - 1) mbarrier_arrive(&s.q_empty);
}

// S_ij = Q_i K_jᵀ alone: issued in this warpgroup's turn and waited for; then K_j's ring
// stage (and after the tile's last block, Q_i) is released. 06a-c do this every block,
// 06d for block 0.
template <class Cfg, class Smem, class Prm, typename T>
__device__ void qk_and_wait(float (&S)[Cfg::B_c / 2], Smem& s, const Prm& p, const Tile& t,
                            const TurnTaking<Cfg>& turn, const T* Q_i, const Slot<Cfg>& slot, int j) {
  mbarrier_wait(&s.k_full[slot.stage], slot.phase);
  turn.wait_turn();
  gemm_qk<Cfg>(S, Q_i, s.k[slot.stage]);
  turn.pass_turn();
  wgmma_wait<0>();
  pin_registers(S);
  if constexpr (Cfg::kWarpSpecialized) release_kv<Cfg>(&s.k_empty[slot.stage], p);
  release_q_after<Cfg>(s, t, j);
}

// ---------------------------------------------------------------------------------------
// 06d's software pipeline over one tile's K/V blocks, shared by the bf16/fp16 kernel and
// the FP8 kernel. What differs between them is what a block does, supplied by `Blocks`:
//   begin(j)                    before block j's S GEMM is issued (the FP8 path reads
//                               its scales here, so their loads overlap the waits)
//   softmax(S, m, l, alpha)     online softmax of block j's scores, in place; returns
//                               whether O_i must be rescaled by alpha
//   rescale(O, alpha)           O_i *= alpha, once the P V has landed (the FP8 path also
//                               moves O_i into the units of V_j's scale)
//   to_operand(S, P_op)         P_ij as the A operand of the P V wgmma
//   pv(O, P_op, stage)          issue O_i += P V of the block in ring stage `stage`
// kOCols: columns of the O_i accumulator, d (FP8: d + 8 with the row-sum column).
// ---------------------------------------------------------------------------------------

template <class Cfg, int kOCols, class Smem, class Prm, class Blocks>
__device__ void overlapped_blocks(Smem& s, const Prm& p, const Tile& t, const TurnTaking<Cfg>& turn, int wg_row0,
                                  float (&O)[kOCols / 2], uint32_t (&P_op)[Cfg::B_c / Cfg::kK][4], float (&m)[2],
                                  float (&l)[2], Blocks& blocks) {
  static_assert(!(Cfg::kSoftmaxUnderPv && Cfg::kPvWaitFirst), "the softmax runs under the P V or after it, not both");
  const auto* Q_i = s.q[turn.wg];
  float S[Cfg::B_c / 2];  // S_ij, then P_ij in place
  float alpha[2];         // exp(m_old - m_new), rescales O_i
  // Block 0: S_i0 and its softmax alone.
  blocks.begin(0);
  qk_and_wait<Cfg>(S, s, p, t, turn, Q_i, Slot<Cfg>(t.kv0), 0);
  if (block_needs_mask<Cfg>(0, wg_row0, p)) mask_block<Cfg>(S, 0, wg_row0, p);
  blocks.first_softmax(S, m, l, alpha);  // O_i is still 0: nothing to rescale
  blocks.to_operand(S, P_op);
  timeline_mark(t.seq, Mark::block0_done);
  for (int j = 1; j < t.n_blocks; ++j) {
    const Slot<Cfg> cur(t.kv0 + j), prev(t.kv0 + j - 1);
    timeline_mark_block(t.seq, j, t.n_blocks, Mark::block_begin);
    blocks.begin(j);
    // Issue S_ij = Q_i K_jᵀ and O_i += P_i(j-1) V_(j-1), meant to run during the softmax
    // below (the P V only where the fence holds it there: kSoftmaxUnderPv).
    mbarrier_wait(&s.k_full[cur.stage], cur.phase);
    timeline_mark_block(t.seq, j, t.n_blocks, Mark::k_ready);
    turn.wait_turn();
    timeline_mark_block(t.seq, j, t.n_blocks, Mark::turn_taken);
    gemm_qk<Cfg>(S, Q_i, s.k[cur.stage]);
    timeline_mark_block(t.seq, j, t.n_blocks, Mark::s_issued);
    mbarrier_wait(&s.v_full[prev.stage], prev.phase);
    blocks.pv(O, P_op, prev.stage);
    turn.pass_turn();
    timeline_mark_block(t.seq, j, t.n_blocks, Mark::gemms_issued);
    wgmma_wait<1>();  // S_ij has landed; the P V is still running
    pin_registers(S);
    timeline_mark_block(t.seq, j, t.n_blocks, Mark::s_landed);
    release_kv<Cfg>(&s.k_empty[cur.stage], p);
    release_q_after<Cfg>(s, t, j);
    if (block_needs_mask<Cfg>(j, wg_row0, p)) mask_block<Cfg>(S, j, wg_row0, p);
    if constexpr (Cfg::kPvWaitFirst) wgmma_wait<0>();  // the softmax after the P V, all of it
    bool rescale_o = blocks.softmax(S, m, l, alpha);  // kSpeculative: P against m_i, nothing settled yet
    // ptxas schedules the wait below as early as it may, at the top of the softmax's basic
    // block (so above the whole softmax, or in FP8 below block_max's branch), and the rest
    // of the softmax then runs after the P V instead of under it; the fence keeps it first.
    if constexpr (Cfg::kSoftmaxUnderPv) fence_schedule_after(l[0] + l[1]);
    wgmma_wait<0>();  // P_i(j-1) V_(j-1) has landed: O_i and P_op are free again
    pin_registers(O);
    timeline_mark_block(t.seq, j, t.n_blocks, Mark::pv_landed);
    release_kv<Cfg>(&s.v_empty[prev.stage], p);
    if constexpr (Blocks::kSpeculative) {
      blocks.to_operand(S, P_op);  // as if no row max grew; settle redoes it where one did
      rescale_o = blocks.settle(S, P_op, m, l, alpha, j);
    }
    if (rescale_o) blocks.rescale(O, alpha);
    if constexpr (!Blocks::kSpeculative) blocks.to_operand(S, P_op);
    timeline_mark_block(t.seq, j, t.n_blocks, Mark::block_end);
  }
  // The last block's O_i += P V.
  const Slot<Cfg> last(t.kv0 + t.n_blocks - 1);
  timeline_mark(t.seq, Mark::loop_done);
  mbarrier_wait(&s.v_full[last.stage], last.phase);
  blocks.pv(O, P_op, last.stage);
  wgmma_wait<0>();
  pin_registers(O);
  timeline_mark(t.seq, Mark::last_pv_done);
  release_kv<Cfg>(&s.v_empty[last.stage], p);
}

// What a block does in bf16/fp16 (overlapped_blocks): FA2's online softmax, O_i in real units;
// at d <= 128 blocks 1, 2, ... take their max last (kSpeculativeMax, settle_speculation).
template <class Cfg, int D, typename T, class Smem>
struct HalfBlocks {
  static constexpr bool kSpeculative = Cfg::kSpeculativeMax;
  Smem& s;
  const Params<T>& p;
  const Tile& t;
  int wg_row0;
  Speculation sp;  // kSpeculative: softmax -> settle
  __device__ void begin(int) {}
  __device__ bool first_softmax(float (&S)[Cfg::B_c / 2], float (&m)[2], float (&l)[2], float (&alpha)[2]) {
    return online_softmax<Cfg, /*kLazy=*/true>(S, m, l, alpha, p.scale_log2, p.rescale_log2);
  }
  __device__ bool softmax(float (&S)[Cfg::B_c / 2], float (&m)[2], float (&l)[2], float (&alpha)[2]) {
    if constexpr (kSpeculative) {
      exps_against_running_max<Cfg>(S, m, p.scale_log2, sp);
      return false;
    } else {
      return first_softmax(S, m, l, alpha);
    }
  }
  __device__ bool settle(float (&S)[Cfg::B_c / 2], uint32_t (&P_op)[Cfg::B_c / Cfg::kK][4], float (&m)[2],
                         float (&l)[2], float (&alpha)[2], int j) {
    return settle_speculation<Cfg, D>(S, P_op, m, l, alpha, sp, p, t, wg_row0, j);
  }
  __device__ void rescale(float (&O)[D / 2], const float (&alpha)[2]) { fa3::rescale<D>(O, alpha); }
  __device__ void to_operand(const float (&S)[Cfg::B_c / 2], uint32_t (&P_op)[Cfg::B_c / Cfg::kK][4]) {
    fa3::to_operand<Cfg, T>(S, P_op);
  }
  __device__ void pv(float (&O)[D / 2], const uint32_t (&P_op)[Cfg::B_c / Cfg::kK][4], int stage) {
    gemm_pv<Cfg, T, D>(O, P_op, s.v[stage]);
  }
};

// ---------------------------------------------------------------------------------------
// Consumer warpgroup: FA2's inner loop over K/V blocks for its 64 rows of Q_i.
// ---------------------------------------------------------------------------------------

template <class Cfg, int D, typename T, class Smem>
__device__ void consume(Smem& s, const Params<T>& p, const Tile& t, const TurnTaking<Cfg>& turn) {
  constexpr int B_c = Cfg::B_c;
  const int wg_row0 = t.row0 + turn.wg * kWarpgroupRows;
  const T* Q_i = s.q[turn.wg];

  float O[D / 2];                       // O_i accumulator (fp32, wgmma layout)
  float S[B_c / 2];                     // S_ij, then P_ij in place
  uint32_t P_op[B_c / Cfg::kK][4];      // P_ij as the A operand of the P V wgmma
  float m[2] = {-INFINITY, -INFINITY};  // m_i: running row max (scaled scores, log2 units)
  float l[2] = {0.f, 0.f};              // l_i: running row sum, this thread's columns
  float alpha[2];                       // exp(m_old - m_new), rescales O_i
#pragma unroll
  for (int i = 0; i < D / 2; ++i) O[i] = 0.f;

  if constexpr (!Cfg::kWarpSpecialized) {  // 06a: the one warpgroup fetches for itself
    if (threadIdx.x == 0) load_q<Cfg>(s, p, t);
    mbarrier_wait(&s.q_full, t.seq & 1);
  }  // (06b-d: consume_tiles waited for Q_i)
  release_q_after<Cfg>(s, t, -1);  // a tile with no visible K/V block never reads Q_i

  if constexpr (!Cfg::kIntraOverlap) {
    // 06a-c: S = Q K_jᵀ, softmax, O += P V_j, each waited for before the next.
    for (int j = 0; j < t.n_blocks; ++j) {
      const Slot<Cfg> slot(t.kv0 + j);
      if constexpr (!Cfg::kWarpSpecialized)
        if (threadIdx.x == 0) {
          load_kv<Cfg>(s.k[slot.stage], &p.k_map, j, t.kv_head, &s.k_full[slot.stage], p);
          load_kv<Cfg>(s.v[slot.stage], &p.v_map, j, t.kv_head, &s.v_full[slot.stage], p);
        }
      qk_and_wait<Cfg>(S, s, p, t, turn, Q_i, slot, j);  // S_ij = Q_i K_jᵀ
      // m_i, P_ij, l_i; O_i *= exp(m_old - m_new)
      if (block_needs_mask<Cfg>(j, wg_row0, p)) mask_block<Cfg>(S, j, wg_row0, p);
      online_softmax<Cfg, /*kLazy=*/false>(S, m, l, alpha, p.scale_log2, 0.f);
      rescale<D>(O, alpha);
      to_operand<Cfg, T>(S, P_op);
      // O_i += P_ij V_j
      mbarrier_wait(&s.v_full[slot.stage], slot.phase);
      gemm_pv<Cfg, T, D>(O, P_op, s.v[slot.stage]);
      wgmma_wait<0>();
      pin_registers(O);
      if constexpr (Cfg::kWarpSpecialized)
        release_kv<Cfg>(&s.v_empty[slot.stage], p);
      else
        __syncthreads();  // 06a: all reads of K_j, V_j done before thread 0 overwrites them
    }
    if constexpr (!Cfg::kWarpSpecialized)
      __syncthreads();  // 06a: every thread saw this tile's Q_i arrive before thread 0 loads the next
  } else if (t.n_blocks > 0) {
    HalfBlocks<Cfg, D, T, Smem> blocks{s, p, t, wg_row0};
    overlapped_blocks<Cfg, D>(s, p, t, turn, wg_row0, O, P_op, m, l, blocks);
  }
  write_output<D, T>(O, m, l, t.bh, wg_row0, p);
  timeline_mark(t.seq, Mark::output_done);
}

// The dynamic shared memory, aligned for the storage struct (TMA boxes want 128 B, the
// 128B-swizzled wgmma operands 1024 B); the launch asks for alignof(Smem) bytes extra.
template <class Smem>
__device__ inline Smem& aligned_shared(uint8_t* smem_raw) {
  return *reinterpret_cast<Smem*>((reinterpret_cast<uintptr_t>(smem_raw) + alignof(Smem) - 1) &
                                  ~uintptr_t(alignof(Smem) - 1));
}

// Thread 0 sets up the Q barrier and the K/V ring's full/empty barriers; everyone waits.
// With CTA pairs a ring stage is free once the consumer warps of both CTAs released it, and
// the whole cluster waits, so that no remote arrival or multicast meets an unset barrier.
template <class Cfg, class Smem>
__device__ inline void init_barriers(Smem& s, bool cta_pairs = false) {
  if (threadIdx.x == 0) {
    constexpr uint32_t kConsumerWarps = Cfg::kConsumers * Cfg::kWarpsPerWg;
    mbarrier_init(&s.q_full, 1);
    mbarrier_init(&s.q_empty, kConsumerWarps * 32);  // every consumer thread (release_q_after)
    for (int i = 0; i < Cfg::kStages; ++i) {
      mbarrier_init(&s.k_full[i], 1);  // the loader's arrive.expect_tx; then the bytes
      mbarrier_init(&s.v_full[i], 1);
      mbarrier_init(&s.k_empty[i], kConsumerWarps * (cta_pairs ? 2 : 1));  // one arrival per consumer warp
      mbarrier_init(&s.v_empty[i], kConsumerWarps * (cta_pairs ? 2 : 1));
    }
    fence_barrier_init();
  }
  __syncthreads();
  if (cta_pairs) cluster_sync();
}

// ---------------------------------------------------------------------------------------
// The kernel: each CTA walks its tiles (B_r query rows, head, batch); see Schedule.
// ---------------------------------------------------------------------------------------

// A warp-specialized CTA (06b-d and the FP8 kernel): warpgroup 0 gives registers back and
// its first warp issues every copy, tile by tile (produce_tiles); the consumer
// warpgroups take the registers and compute each tile, taking turns that run on from one
// tile to the next.
template <class Cfg, class Smem, class Prm, class LoadV, class Consume>
__device__ void warp_specialized_cta(Smem& s, const Prm& p, LoadV&& load_v, Consume&& consume_tile) {
  const int wg = threadIdx.x / Cfg::kWgThreads;
  if (wg == 0) {
    setmaxnreg_dec<Cfg::kProducerRegs>();
    if (threadIdx.x < 32) produce_tiles<Cfg>(s, p, load_v);
  } else {
    setmaxnreg_inc<Cfg::kConsumerRegs>();
    const TurnTaking<Cfg> turn{wg - 1};
    turn.start();
    consume_tiles<Cfg>(s, p, [&](const Tile& t) { consume_tile(t, turn); });
    turn.finish();
  }
}

template <Variant V, int D, typename T>
__global__ void __launch_bounds__(Config<V, D, T>::kThreads, 1) fa3_forward(const __grid_constant__ Params<T> p) {
  using Cfg = Config<V, D, T>;
  using Smem = SharedStorage<Cfg, T, D>;
  extern __shared__ uint8_t smem_raw[];
  Smem& s = aligned_shared<Smem>(smem_raw);
  init_barriers<Cfg>(s, Cfg::kMayPairCtas && p.cta_pairs);

  if constexpr (Cfg::kWarpSpecialized) {
    warp_specialized_cta<Cfg>(
        s, p,
        [&](const Tile& t, int stage, int j) {
          load_kv<Cfg>(s.v[stage], &p.v_map, j, t.kv_head, &s.v_full[stage], p);
        },
        [&](const Tile& t, const TurnTaking<Cfg>& turn) { consume<Cfg, D>(s, p, t, turn); });
  } else {
    const TurnTaking<Cfg> turn{0};  // no ping-pong: every call is empty
    for_each_tile<Cfg>(p, [&](const Tile& t) { consume<Cfg, D>(s, p, t, turn); });
  }
  // CTA pairs: stay until the peer is done, since its copies and arrivals reach this CTA's
  // shared memory.
  if (Cfg::kMayPairCtas && p.cta_pairs) {
    __syncwarp();  // the producer warp's idle lanes wait for thread 0
    cluster_sync();
  }
}

// A launch configuration of `ctas` CTAs in clusters of two (Schedule::persistent_cta_pairs).
struct PairLaunch {
  cudaLaunchAttribute cluster{};
  cudaLaunchConfig_t config{};
  PairLaunch(unsigned ctas, int threads, size_t smem_bytes, cudaStream_t stream) {
    cluster.id = cudaLaunchAttributeClusterDimension;
    cluster.val.clusterDim.x = 2;
    cluster.val.clusterDim.y = cluster.val.clusterDim.z = 1;
    config.gridDim = dim3(ctas);
    config.blockDim = dim3(unsigned(threads));
    config.dynamicSmemBytes = smem_bytes;
    config.stream = stream;
    config.attrs = &cluster;
    config.numAttrs = 1;
  }
  PairLaunch(const PairLaunch&) = delete;  // config points at cluster
  PairLaunch& operator=(const PairLaunch&) = delete;
};

// Once per kernel: how many clusters of two of its CTAs the GPU runs at once (a cluster is
// placed within one GPC, so this can be fewer than half the CTAs that fit).
template <auto kKernel>
int max_cta_pairs(int threads, size_t smem_bytes) {
  static const int pairs = [=] {
    const PairLaunch launch(2, threads, smem_bytes, nullptr);
    int n = 0;
    CUDA_CHECK(cudaOccupancyMaxActiveClusters(&n, kKernel, &launch.config));
    if (n < 1) throw AttnError("06_fa3_hopper: the GPU cannot run a cluster of two CTAs of this kernel");
    return n;
  }();
  return pairs;
}

// Grid size for a schedule: every tile, or as many CTAs as fit on the GPU at once.
inline unsigned grid_size(long long tiles, Schedule schedule, int ctas_per_sm) {
  if (schedule == Schedule::one_tile_per_cta) return unsigned(tiles);
  return persistent_grid(tiles, ctas_per_sm);
}

// Schedule::persistent with a causal mask hands out units from a counter (next_unit): an
// int in the Stage's workspace, zeroed on the stream before each launch. Without a mask
// every tile costs the same, and the fixed rounds b, b + G, ... are as balanced as a greedy
// hand-out, with no atomics; other schedules need no counter either.
inline int* unit_counter(const AttnTensors& tensors, size_t offset, Schedule schedule, bool causal,
                         cudaStream_t stream) {
  if (schedule != Schedule::persistent || !causal) return nullptr;
  if (!tensors.workspace || tensors.workspace_bytes < offset + sizeof(int))
    throw AttnError("06_fa3_hopper: the persistent schedule needs the Stage's workspace (its unit counter)");
  int* counter = reinterpret_cast<int*>(static_cast<char*>(tensors.workspace) + offset);
  CUDA_CHECK(cudaMemsetAsync(counter, 0, sizeof(int), stream));
  return counter;
}

// The problem's sizes and scales as the kernels read them (Params<T> or Fp8Params).
template <class Cfg, class Prm>
void set_problem(Prm& p, const AttnProblem& pr, size_t kv_elem_bytes) {
  p.Nq = pr.Nq;
  p.Nk = pr.Nk;
  p.H = pr.H;
  p.Hkv = pr.Hkv;
  p.group = pr.group();
  p.m_blocks = (pr.Nq + Cfg::B_r - 1) / Cfg::B_r;
  p.n_tiles = p.m_blocks * pr.B * pr.H;  // stages.cu refuses more than INT_MAX
  p.n_units = p.n_tiles;
  p.order = tile_order(pr, Cfg::B_r, kv_elem_bytes);
  p.scale_log2 = pr.softmax_scale() * float(M_LOG2E);
  p.causal = pr.causal;
}

template <Variant V, int D, typename T>
void launch(const AttnProblem& pr, const AttnTensors& tensors, Schedule schedule, cudaStream_t stream,
            float rescale_log2) {
  using Cfg = Config<V, D, T>;
  constexpr size_t kSmemBytes = sizeof(SharedStorage<Cfg, T, D>) + alignof(SharedStorage<Cfg, T, D>);
  const int ctas_per_sm = configure_kernel<fa3_forward<V, D, T>>(Cfg::kThreads, kSmemBytes);

  for (const void* ptr : {tensors.q, tensors.k, tensors.v, static_cast<const void*>(tensors.o)})
    if (reinterpret_cast<uintptr_t>(ptr) % 16 != 0)
      throw AttnError("06_fa3_hopper: Q, K, V and O must be 16-byte aligned (TMA)");

  constexpr CUtensorMapDataType kType =
      std::is_same_v<T, __nv_bfloat16> ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  Params<T> p{};
  constexpr int kBytes = int(sizeof(T));
  p.q_map = make_tensor_map_3d(tensors.q, kType, pr.B * pr.H, pr.Nq, D, kWarpgroupRows, kBytes, Cfg::kSwizzle);
  // CTA pairs share every K/V block, so both tiles of a pair must read the same blocks: a
  // causal mask (different diagonal per Q block) runs without them.
  if (schedule == Schedule::persistent_cta_pairs && !Cfg::kMayPairCtas)
    throw AttnError("06_fa3_hopper: this kernel instance has no CTA pairs' code (Variant::fa3_cta_pairs has)");
  p.cta_pairs = schedule == Schedule::persistent_cta_pairs && !pr.causal;
  const int kv_box_rows = p.cta_pairs ? Cfg::B_c / 2 : Cfg::B_c;  // each CTA of a pair loads half
  p.k_map = make_tensor_map_3d(tensors.k, kType, pr.B * pr.Hkv, pr.Nk, D, kv_box_rows, kBytes, Cfg::kSwizzle);
  p.v_map = make_tensor_map_3d(tensors.v, kType, pr.B * pr.Hkv, pr.Nk, D, kv_box_rows, kBytes, Cfg::kSwizzle);
  p.o = static_cast<T*>(tensors.o);
  p.lse = tensors.lse;
  p.q = static_cast<const T*>(tensors.q);
  p.k = static_cast<const T*>(tensors.k);
  set_problem<Cfg>(p, pr, sizeof(T));
  p.rescale_log2 = rescale_log2;
  p.p_limit = std::exp2(rescale_log2);

  if (!p.cta_pairs) {
    const unsigned grid = grid_size(p.n_tiles, schedule, ctas_per_sm);
    p.unit_counter = unit_counter(tensors, 0, schedule, pr.causal, stream);
    fa3_forward<V, D, T><<<grid, Cfg::kThreads, kSmemBytes, stream>>>(p);
    CUDA_CHECK_LAUNCH();
    return;
  }
  p.n_units = pr.B * pr.H * ((p.m_blocks + 1) / 2);  // pairs of Q blocks
  const int pairs = std::min(p.n_units, max_cta_pairs<fa3_forward<V, D, T>>(Cfg::kThreads, kSmemBytes));
  const PairLaunch launch(unsigned(2 * pairs), Cfg::kThreads, kSmemBytes, stream);
  CUDA_CHECK(cudaLaunchKernelEx(&launch.config, fa3_forward<V, D, T>, p));
}

}  // namespace attn::fa3
