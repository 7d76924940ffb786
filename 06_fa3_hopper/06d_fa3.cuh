// Rung 06d: FlashAttention-3's forward pass, the last of three steps from 06c:
//
//   06d_1_overlap.cuh         intra-warpgroup overlap: a consumer issues S_(i,j+1) =
//                             Q_i K_(j+1)ᵀ and O_i += P_ij V_j together, then runs the
//                             softmax of S_(i,j+1) while the P V is still on the tensor
//                             cores (overlapped_blocks):
//
//       S_i0 = Q_i K_0ᵀ; softmax                                   (block 0 alone)
//       for j = 1 .. T_c - 1:
//         issue S_ij = Q_i K_jᵀ and O_i += P_i(j-1) V_(j-1)   (in this warpgroup's turn)
//         wait for S_ij; softmax of S_ij                    (the P V still running)
//         wait for the P V; O_i *= alpha; P_ij -> operand
//       O_i += P_i(T_c-1) V_(T_c-1)
//
//                             ptxas would hoist the P V's wait above the softmax; a
//                             never-taken branch holds it below (hold_wait_below), and
//                             scripts/sass_order.py checks the SASS (CTest: sass_order);
//   06d_2_lazy_softmax.cuh    lazy rescaling: m_i moves only when a row's max grows by more
//                             than 8 in log2 units (kRescaleLog2), so most blocks skip
//                             O_i *= alpha; max last at d <= 128: P against the running m_i,
//                             the block's max only where a row sum of P passes 2^8
//                             (settle_speculation);
//   this file: the schedule   persistent CTAs: one CTA per SM walks tiles (causal: from a
//                             counter), its producer loading the next tile while the
//                             consumers finish; ping-pong only at d <= 128 (at d = 256 both
//                             GEMMs dominate the softmax and forced turns only add waiting,
//                             as in FA3), and the d = 256 instance (the steps have 64, 128).
//
// Ablations kept as hooks: kCtaPairs (06d_cta_pairs: clusters of two CTAs share each K/V
// block by TMA multicast), rescale_log2 = -inf (06d_eager_rescale), Schedule::
// one_tile_per_cta (06d_one_tile_per_cta); tile timeline marks (fa3_common.cuh: Mark)
// compile to nothing outside bench/tile_timeline.cu.
//
// Included only by 06d_fa3.cu.in, 06d_cta_pairs.cu.in and bench/tile_timeline.cu.
#pragma once

#include <algorithm>
#include <cfloat>

#include "06_fa3_hopper/fa3_common.cuh"

namespace attn::fa3::step06d {

// kCtaPairs: the kernel carries the CTA pairs' code (fa3_launch.h: cta_pairs_code_in_06d).
template <int D, typename T, bool kCtaPairs>
struct Config {
  // Ping-pong where the softmax is a large share of the work (d <= 128): at d = 256 the
  // GEMMs dominate and forced turns only add waiting (as FA3 does).
  static constexpr bool kPingpong = D <= 128;
  // The softmax of blocks 1, 2, ... exponentiates against the running max m_i and takes the
  // block's max from P afterwards, where needed at all (settle_speculation): at
  // d <= 128, where each warpgroup's softmax sits between its own P V and its next GEMMs.
  static constexpr bool kSpeculativeMax = D <= 128;
  static constexpr bool kMayPairCtas = kCtaPairs;  // Schedule::persistent_cta_pairs compiled in

  static constexpr int kWgThreads = 128;                     // threads per warpgroup
  static constexpr int kConsumers = consumer_warpgroups(D);  // consumer warpgroups (fa3_launch.h)
  static constexpr int kThreads = kWgThreads * (kConsumers + 1);  // + the producer warpgroup
  static constexpr int B_r = block_rows(D);  // query rows per CTA
  static constexpr int B_c = block_cols(D);  // keys per K/V block
  static constexpr int kStages = 2;  // K/V ring depth: deeper hides more load latency, costs smem

  // Shared-memory tiles are d/64 column chunks of [rows][64]: 128-byte rows, swizzled
  // (swizzle.h), as TMA writes them and wgmma reads them.
  static constexpr Swizzle kSwizzle = Swizzle::b128;
  static constexpr int kSwizzleRowBytes = row_bytes(kSwizzle);          // 128
  static constexpr int kChunkCols = kSwizzleRowBytes / int(sizeof(T));  // 64
  static constexpr int kChunks = D / kChunkCols;
  static constexpr int kAtomBytes = atom_bytes(kSwizzle);  // 8-row swizzle atom: 1024
  static constexpr int kK = 16;                            // wgmma K per instruction

  static constexpr uint32_t kQBytes = uint32_t(kConsumers) * kWarpgroupRows * D * sizeof(T);
  static constexpr uint32_t kKVBytes = uint32_t(B_c) * D * sizeof(T);

  // setmaxnreg budgets: 128 x 24 + 256 x 240 (or 384 x 160) <= the launch's 384 x 168 (512 x 128).
  static constexpr int kProducerRegs = 24;
  static constexpr int kConsumerRegs = kConsumers == 3 ? 160 : 240;
  static constexpr int kWarpsPerWg = kWgThreads / 32;
  // Named barriers of the ping-pong, one per consumer warpgroup (0 is __syncthreads).
  static constexpr int kTurnBarrier = 1;

  static_assert(D % kChunkCols == 0 && B_c % kK == 0, "tiles are whole 128-byte chunks and wgmma K steps");
  static_assert(B_c * kSwizzleRowBytes % kAtomBytes == 0, "every chunk starts on a 1024-byte swizzle atom");
  static_assert(setmaxnreg_budgets_fit(kConsumers, kProducerRegs, kConsumerRegs),
                "the consumers' registers must come from the producer's");
  static_assert(B_c / 2 * kSwizzleRowBytes % kAtomBytes == 0, "a CTA pair's half blocks start on swizzle atoms");
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

template <class Cfg, class Smem, typename T>
__device__ void load_q(Smem& s, const Params<T>& p, const Tile& t) {
  mbarrier_arrive_expect_tx(&s.q_full, Cfg::kQBytes);
  for (int w = 0; w < Cfg::kConsumers; ++w)
    for (int c = 0; c < Cfg::kChunks; ++c)
      tma_load_3d(&s.q[w][c * kWarpgroupRows * Cfg::kChunkCols], &p.q_map, c * Cfg::kChunkCols,
                  t.row0 + w * kWarpgroupRows, t.bh, &s.q_full);
}

// One B_c x d block (K_j or V_j) into `tile`, completing on `full`. With CTA pairs each CTA
// copies half of the rows, into its own and its peer's `tile` at once (TMA multicast), so
// the pair reads each block from L2 once; each CTA's `full` still expects the whole block.
template <class Cfg, typename T>
__device__ void load_kv(void* tile, const CUtensorMap* map, int j, int kv_head, uint64_t* full, const Params<T>& p) {
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

// The CTA's seq-th tile, unit `unit` (fa3_common.cuh: tile_in_sequence). With CTA pairs a
// unit is a pair of neighbouring Q blocks of one head: the cluster's CTA of rank r takes
// block 2u + r of pair u (past the last block when a head has an odd count: rows past Nq,
// computed and never written, so that both CTAs load the same K/V).
template <class Cfg, typename T>
__device__ Tile tile_of_unit(const Params<T>& p, int unit, int seq, int& kv) {
  TileCoord c;
  if (Cfg::kMayPairCtas && p.cta_pairs) {
    const int m_pairs = (p.m_blocks + 1) / 2;
    c.bh = unit / m_pairs;
    c.m_block = 2 * (unit % m_pairs) + int(cluster_ctarank());
  } else {
    c = tile_at(p.order, unit);
  }
  return tile_in_sequence<Cfg::B_r, Cfg::B_c>(p, c, seq, kv);
}

// The producer (one warp; its lane 0 issues every copy), tile after tile: Q_i once the
// consumers are done with the last tile's, then K_j and V_j into the ring, each stage
// reused once every consumer warp released it ("empty" barriers; on the first lap they
// pass at once). The unit of each tile goes to the consumers in shared memory, announced
// by Q_i's "full" barrier (its arrival releases the write; their wait acquires it), which
// after the last unit completes with no copy: the consumers' signal to stop
// (consume_tiles).
template <class Cfg, class Smem, typename T>
__device__ void produce_tiles(Smem& s, const Params<T>& p) {
  int kv = 0;
  for (int seq = 0;; ++seq) {
    // Asked for only once the last tile's loads are all issued, with the ring's last blocks
    // still ahead of the consumers: the CTA takes its next unit shortly before it is free.
    const int unit = next_unit(p, seq, Cfg::kMayPairCtas && p.cta_pairs ? 2 : 1);
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
      if (leader) load_kv<Cfg>(s.k[slot.stage], &p.k_map, j, t.kv_head, &s.k_full[slot.stage], p);
      mbarrier_wait(&s.v_empty[slot.stage], slot.phase ^ 1);
      if (leader) load_kv<Cfg>(s.v[slot.stage], &p.v_map, j, t.kv_head, &s.v_full[slot.stage], p);
    }
  }
}

// The consumers' side of produce_tiles: each tile's unit, read once its Q_i has arrived.
template <class Cfg, class Smem, typename T, class Body>
__device__ void consume_tiles(Smem& s, const Params<T>& p, Body&& body) {
  int kv = 0;
  for (int seq = 0;; ++seq) {
    mbarrier_wait(&s.q_full, seq & 1);
    const int unit = __reduce_max_sync(0xffffffffu, ld_shared(&s.unit));  // the same in every lane: warp-uniform
    if (unit >= p.n_units) return;
    timeline_mark(seq, Mark::q_ready);
    body(tile_of_unit<Cfg>(p, unit, seq, kv));
  }
}

// A consumer warp is done with a K/V ring stage: one arrival per warp. Under CTA pairs the
// peer's producer also fills the stage, so its "empty" barrier hears from this CTA's warps
// too.
template <class Cfg, typename T>
__device__ inline void release_kv(uint64_t* empty, const Params<T>& p) {
  if (threadIdx.x % 32 == 0) {
    mbarrier_arrive(empty);
    if (Cfg::kMayPairCtas && p.cta_pairs) mbarrier_arrive_remote(empty, cluster_ctarank() ^ 1);
  }
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

// S_ij = Q_i K_jᵀ: d/K wgmma SS (both operands K-major), one commit group. Each K step reads
// 32 bytes of every row: the start address moves 32 B along the swizzle row, then on to the
// next column chunk (kmajor_step_offset, swizzle.h).
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
//   m_i^new = max(m_i, rowmax(S_ij));  P_ij = exp(S_ij - m_i^new) (in place in S);
//   alpha = exp(m_i - m_i^new);  l_i = alpha l_i + rowsum(P_ij)   (l_i: this thread's part).
// s_log2 takes a raw score to the exponent's log2 units (softmax scale * log2(e)), and m_i
// is kept in those units. The caller rescales O_i by alpha, once the in-flight P V has
// landed.
//
// Lazily: a row's m_i moves only when its max has grown by more than rescale_log2 in the
// exponent's log2 units; otherwise the block is exponentiated against the old m_i, so
// P_ij <= 2^rescale_log2, and alpha = 1. Exact in exact arithmetic (l_i and O_i always
// refer to the same m_i); after the first blocks a max rarely grows that much, so most
// blocks skip the d/2 multiplies of O_i that otherwise sit between a block's P V and the
// next one's GEMMs. Returns whether either of the thread's rows moved (the four threads of
// a row agree). The decision is per row, not per warp: a warp vote would make every
// exponential wait for both rows' maxima and the vote, on the softmax's critical path.
template <class Cfg>
__device__ bool online_softmax(float (&S)[Cfg::B_c / 2], float (&m)[2], float (&l)[2], float (&alpha)[2],
                               float s_log2, float rescale_log2) {
  bool any_moved = false;
#pragma unroll
  for (int slot = 0; slot < 2; ++slot) {
    const float m_blk = fmaxf(m[slot], row_max<Cfg>(S, slot) * s_log2);
    const bool moved = m_blk - m[slot] > rescale_log2;  // -inf - (-inf): false
    any_moved |= moved;
    const float m_new = moved ? m_blk : m[slot];
    // A row that has seen only masked keys keeps m = -inf; exponentiate against 0 so
    // that exp(-inf - (-inf)) never appears: its P is 0 and alpha is 0.
    const float m_base = m_new == -INFINITY ? 0.f : m_new;
    alpha[slot] = moved ? exp2_approx(m[slot] - m_base) : 1.f;
    m[slot] = m_new;
    const float shift = 0.f - m_base;
    float row_sum = 0.f;
    for_each_in_row<Cfg>(S, slot, [&](int, float& s_ij) {
      s_ij = exp2_approx(fmaf(s_ij, s_log2, shift));
      row_sum += s_ij;
    });
    l[slot] = alpha[slot] * l[slot] + row_sum;
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
// The softmax of blocks j >= 1, max last (kSpeculativeMax). online_softmax takes the
// block's row max first: ~90 dependent FMNMX and shuffles before the first exponential, on
// the critical path from the warpgroup's P V landing to its next GEMMs. With lazy
// rescaling the max almost never moves m_i, so the block is exponentiated against the
// running max right away, P_ij = 2^(S_ij s_log2 - m_i), with its row sums. Only where a
// row's P exceeds p_limit = 2^rescale_log2 (its max grew by more than the lazy rule allows)
// is there more to do, and it is exact arithmetic: m_new = m_i + log2(max P_ij), then P_ij
// and rowsum(P_ij) times 2^(m_i - m_new). The max of P is taken only where that may be so:
// P >= 0, so a row sum <= p_limit bounds every P in it, and the common block takes no max
// at all. A score past the running max by ~128 in log2 units (less where several such keys
// add up) overflows P or its row sum to inf; then the warp recomputes its scores from Q
// and K in global memory and takes online_softmax's path.
// ---------------------------------------------------------------------------------------

template <typename T>
struct Speculation {
  const Params<T>& p;  // with t and wg_row0: where the overflow path recomputes the scores
  const Tile& t;
  int wg_row0;
  float base[2];     // the exponent base of the block's P: m_i, or 0 for a row with no key yet
  float row_sum[2];  // this thread's part of rowsum(P_ij), against base
};

template <class Cfg, typename T>
__device__ void exps_against_running_max(float (&S)[Cfg::B_c / 2], const float (&m)[2], float s_log2,
                                         Speculation<T>& sp) {
#pragma unroll
  for (int slot = 0; slot < 2; ++slot) {
    sp.base[slot] = m[slot] == -INFINITY ? 0.f : m[slot];
    const float shift = -sp.base[slot];
    float sum[2] = {0.f, 0.f};  // two chains, half as long
    for_each_in_row<Cfg>(S, slot, [&](int n, float& s_ij) {  // online_softmax's exponentials
      s_ij = exp2_approx(fmaf(s_ij, s_log2, shift));
      sum[n % 2] += s_ij;
    });
    sp.row_sum[slot] = sum[0] + sum[1];
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
// row whose m_i stayed). Rows whose sum of P stayed <= p_limit are done (one vote per warp).
template <class Cfg, int D, typename T>
__device__ bool settle_speculation(float (&S)[Cfg::B_c / 2], uint32_t (&P_op)[Cfg::B_c / Cfg::kK][4], float (&m)[2],
                                   float (&l)[2], float (&alpha)[2], const Speculation<T>& sp, int j) {
  const Params<T>& p = sp.p;
  // A row with no visible key yet (m_i = -inf) took base 0: any P > 0 must set its m_i.
  // Elsewhere a P > p_limit must move m_i, and can only be where rowsum(P) > p_limit.
  const bool may_have_grown = sp.row_sum[0] > (m[0] == -INFINITY ? 0.f : p.p_limit) ||
                              sp.row_sum[1] > (m[1] == -INFINITY ? 0.f : p.p_limit);
  if (!__any_sync(0xffffffffu, may_have_grown)) {
    l[0] += sp.row_sum[0];
    l[1] += sp.row_sum[1];
    return false;
  }
  // P, or this thread's sum of it, overflowed (P >= 0, so a finite sum means finite P): a
  // P of 2^125 is still a number, but 44 of them sum to inf.
  if (__any_sync(0xffffffffu, !(sp.row_sum[0] <= FLT_MAX && sp.row_sum[1] <= FLT_MAX))) {
    recompute_scores<Cfg, D>(S, p, sp.t, sp.wg_row0, j);
    if (block_needs_mask<Cfg>(j, sp.wg_row0, p)) mask_block<Cfg>(S, j, sp.wg_row0, p);
    const bool rescale_o = online_softmax<Cfg>(S, m, l, alpha, p.scale_log2, p.rescale_log2);
    to_operand<Cfg, T>(S, P_op);
    return rescale_o;
  }
  bool any_moved = false;
#pragma unroll
  for (int slot = 0; slot < 2; ++slot) {
    // The row's max in the exponent's units (log2 of 0 is -inf: a row of masked keys).
    const float m_blk = fmaxf(m[slot], sp.base[slot] + log2_approx(row_max<Cfg>(S, slot)));
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

// S_ij = Q_i K_jᵀ alone: issued in this warpgroup's turn and waited for; then K_j's ring
// stage (and after the tile's last block, Q_i) is released. 06d does this for block 0.
template <class Cfg, class Smem, typename T>
__device__ void qk_and_wait(float (&S)[Cfg::B_c / 2], Smem& s, const Params<T>& p, const Tile& t,
                            const TurnTaking<Cfg>& turn, const T* Q_i, const Slot<Cfg>& slot, int j) {
  mbarrier_wait(&s.k_full[slot.stage], slot.phase);
  turn.wait_turn();
  gemm_qk<Cfg>(S, Q_i, s.k[slot.stage]);
  turn.pass_turn();
  wgmma_wait<0>();
  pin_registers(S);
  release_kv<Cfg>(&s.k_empty[slot.stage], p);
  release_q_after(s, t, j);
}

// ---------------------------------------------------------------------------------------
// The software pipeline over one tile's K/V blocks (intra-warpgroup overlap).
// ---------------------------------------------------------------------------------------

// Keeps the wgmma wait that follows below the instructions that compute `after`: the
// softmax's results (what they leave out may sink below the wait). ptxas schedules a wgmma
// wait as early as its basic block allows, above the whole softmax it is meant to overlap,
// so that every exponential ran after the P V; it does not hoist one above a branch. This
// one ends the softmax's block on a warp vote that is never true (no float operation
// yields the bits 0xffffffff; the GPU's NaN is 0x7fffffff). hopper.cuh's
// fence_schedule_after branches to a trap instead: at d <= 128 ptxas then allocated the
// loop within the launch bound's registers (168, d = 64: 128), not setmaxnreg's, spilled O
// and serialized the wgmma (C7512).
__device__ inline void hold_wait_below(float after) {
  if (__any_sync(0xffffffffu, __float_as_uint(after) == 0xffffffffu)) asm volatile("nanosleep.u32 0;");
}

template <class Cfg, int D, typename T, class Smem>
__device__ void overlapped_blocks(Smem& s, const Params<T>& p, const Tile& t, const TurnTaking<Cfg>& turn,
                                  int wg_row0, float (&O)[D / 2], uint32_t (&P_op)[Cfg::B_c / Cfg::kK][4],
                                  float (&m)[2], float (&l)[2]) {
  const T* Q_i = s.q[turn.wg];
  float S[Cfg::B_c / 2];  // S_ij, then P_ij in place
  float alpha[2];         // 2^(m_old - m_new), rescales O_i
  Speculation<T> sp{p, t, wg_row0};  // kSpeculativeMax: exps_against_running_max -> settle_speculation
  // Block 0: S_i0 and its softmax alone.
  qk_and_wait<Cfg>(S, s, p, t, turn, Q_i, Slot<Cfg>(t.kv0), 0);
  if (block_needs_mask<Cfg>(0, wg_row0, p)) mask_block<Cfg>(S, 0, wg_row0, p);
  online_softmax<Cfg>(S, m, l, alpha, p.scale_log2, p.rescale_log2);  // O_i is still 0: nothing to rescale
  to_operand<Cfg, T>(S, P_op);
  timeline_mark(t.seq, Mark::block0_done);
  for (int j = 1; j < t.n_blocks; ++j) {
    const Slot<Cfg> cur(t.kv0 + j), prev(t.kv0 + j - 1);
    timeline_mark_block(t.seq, j, t.n_blocks, Mark::block_begin);
    // Issue S_ij = Q_i K_jᵀ and O_i += P_i(j-1) V_(j-1); the P V runs during the softmax
    // below.
    mbarrier_wait(&s.k_full[cur.stage], cur.phase);
    timeline_mark_block(t.seq, j, t.n_blocks, Mark::k_ready);
    turn.wait_turn();
    timeline_mark_block(t.seq, j, t.n_blocks, Mark::turn_taken);
    gemm_qk<Cfg>(S, Q_i, s.k[cur.stage]);
    timeline_mark_block(t.seq, j, t.n_blocks, Mark::s_issued);
    mbarrier_wait(&s.v_full[prev.stage], prev.phase);
    gemm_pv<Cfg, T, D>(O, P_op, s.v[prev.stage]);
    turn.pass_turn();
    timeline_mark_block(t.seq, j, t.n_blocks, Mark::gemms_issued);
    wgmma_wait<1>();  // S_ij has landed; the P V is still running
    pin_registers(S);
    timeline_mark_block(t.seq, j, t.n_blocks, Mark::s_landed);
    release_kv<Cfg>(&s.k_empty[cur.stage], p);
    release_q_after(s, t, j);
    if (block_needs_mask<Cfg>(j, wg_row0, p)) mask_block<Cfg>(S, j, wg_row0, p);
    // The softmax of S_ij, under the P V: it reads and writes S only (O_i and P_op belong
    // to the wgmma until the wait), and the wait stays below its exponentials.
    bool rescale_o = false;
    if constexpr (Cfg::kSpeculativeMax) {
      exps_against_running_max<Cfg>(S, m, p.scale_log2, sp);  // P against m_i, nothing settled yet
      hold_wait_below(sp.row_sum[0] + sp.row_sum[1]);
    } else {
      rescale_o = online_softmax<Cfg>(S, m, l, alpha, p.scale_log2, p.rescale_log2);
      hold_wait_below(l[0] + l[1]);
    }
    wgmma_wait<0>();  // P_i(j-1) V_(j-1) has landed: O_i and P_op are free again
    pin_registers(O);
    timeline_mark_block(t.seq, j, t.n_blocks, Mark::pv_landed);
    release_kv<Cfg>(&s.v_empty[prev.stage], p);
    if constexpr (Cfg::kSpeculativeMax) {
      to_operand<Cfg, T>(S, P_op);  // as if no row max grew; settle redoes it where one did
      rescale_o = settle_speculation<Cfg, D>(S, P_op, m, l, alpha, sp, j);
    }
    if (rescale_o) rescale<D>(O, alpha);
    if constexpr (!Cfg::kSpeculativeMax) to_operand<Cfg, T>(S, P_op);
    timeline_mark_block(t.seq, j, t.n_blocks, Mark::block_end);
  }
  // The last block's O_i += P V.
  const Slot<Cfg> last(t.kv0 + t.n_blocks - 1);
  timeline_mark(t.seq, Mark::loop_done);
  mbarrier_wait(&s.v_full[last.stage], last.phase);
  gemm_pv<Cfg, T, D>(O, P_op, s.v[last.stage]);
  wgmma_wait<0>();
  pin_registers(O);
  timeline_mark(t.seq, Mark::last_pv_done);
  release_kv<Cfg>(&s.v_empty[last.stage], p);
}

// ---------------------------------------------------------------------------------------
// Consumer warpgroup turn.wg: the pipeline above for its 64 rows of Q_i.
// ---------------------------------------------------------------------------------------

template <class Cfg, int D, typename T, class Smem>
__device__ void consume(Smem& s, const Params<T>& p, const Tile& t, const TurnTaking<Cfg>& turn) {
  constexpr int B_c = Cfg::B_c;
  const int wg_row0 = t.row0 + turn.wg * kWarpgroupRows;

  float O[D / 2];                       // O_i accumulator (fp32, wgmma layout)
  uint32_t P_op[B_c / Cfg::kK][4];      // P_ij as the A operand of the P V wgmma
  float m[2] = {-INFINITY, -INFINITY};  // m_i: running row max (scaled scores, log2 units)
  float l[2] = {0.f, 0.f};              // l_i: running row sum, this thread's columns
#pragma unroll
  for (int i = 0; i < D / 2; ++i) O[i] = 0.f;

  release_q_after(s, t, -1);  // a tile with no visible K/V block never reads Q_i
  if (t.n_blocks > 0) overlapped_blocks<Cfg, D>(s, p, t, turn, wg_row0, O, P_op, m, l);
  write_output<D, T>(O, m, l, t.bh, wg_row0, p);
  timeline_mark(t.seq, Mark::output_done);
}

// ---------------------------------------------------------------------------------------
// The kernel: each CTA walks its tiles (B_r query rows, head, batch); see Schedule.
// ---------------------------------------------------------------------------------------

// Thread 0 sets up the Q barrier and the K/V ring's full/empty barriers; everyone waits.
// With CTA pairs a ring stage is free once the consumer warps of both CTAs released it, and
// the whole cluster waits, so that no remote arrival or multicast meets an unset barrier.
template <class Cfg, class Smem>
__device__ inline void init_barriers(Smem& s, bool cta_pairs) {
  if (threadIdx.x == 0) {
    constexpr uint32_t kConsumerWarps = Cfg::kConsumers * Cfg::kWarpsPerWg;
    mbarrier_init(&s.q_full, 1);
    mbarrier_init(&s.q_empty, kConsumerWarps * 32);  // every consumer thread (release_q_after)
    for (int i = 0; i < Cfg::kStages; ++i) {
      mbarrier_init(&s.k_full[i], 1);  // the producer's arrive.expect_tx; then the bytes
      mbarrier_init(&s.v_full[i], 1);
      mbarrier_init(&s.k_empty[i], kConsumerWarps * (cta_pairs ? 2 : 1));  // one arrival per consumer warp
      mbarrier_init(&s.v_empty[i], kConsumerWarps * (cta_pairs ? 2 : 1));
    }
    fence_barrier_init();
  }
  __syncthreads();
  if (cta_pairs) cluster_sync();
}

template <int D, typename T, bool kCtaPairs>
__global__ void __launch_bounds__(Config<D, T, kCtaPairs>::kThreads, 1)
    fa3_forward(const __grid_constant__ Params<T> p) {
  using Cfg = Config<D, T, kCtaPairs>;
  using Smem = SharedStorage<Cfg, T, D>;
  extern __shared__ uint8_t smem_raw[];
  Smem& s = aligned_shared<Smem>(smem_raw);
  init_barriers<Cfg>(s, Cfg::kMayPairCtas && p.cta_pairs);
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

template <int D, typename T, bool kCtaPairs>
void launch(const AttnProblem& pr, const AttnTensors& tensors, Schedule schedule, cudaStream_t stream,
            float rescale_log2) {
  using Cfg = Config<D, T, kCtaPairs>;
  constexpr auto kKernel = fa3_forward<D, T, kCtaPairs>;
  constexpr size_t kSmemBytes = sizeof(SharedStorage<Cfg, T, D>) + alignof(SharedStorage<Cfg, T, D>);
  const int ctas_per_sm = configure_kernel<kKernel>(Cfg::kThreads, kSmemBytes);

  constexpr CUtensorMapDataType kType = tensor_map_type<T>();
  constexpr int kBytes = int(sizeof(T));
  Params<T> p{};
  p.q_map = make_tensor_map_3d(tensors.q, kType, pr.B * pr.H, pr.Nq, D, kWarpgroupRows, kBytes, Cfg::kSwizzle);
  // CTA pairs share every K/V block, so both tiles of a pair must read the same blocks: a
  // causal mask (different diagonal per Q block) runs without them.
  if (schedule == Schedule::persistent_cta_pairs && !kCtaPairs)
    throw AttnError("06_fa3_hopper: this kernel instance has no CTA pairs' code (06d_cta_pairs' has)");
  p.cta_pairs = schedule == Schedule::persistent_cta_pairs && !pr.causal;
  const int kv_box_rows = p.cta_pairs ? Cfg::B_c / 2 : Cfg::B_c;  // each CTA of a pair loads half
  p.k_map = make_tensor_map_3d(tensors.k, kType, pr.B * pr.Hkv, pr.Nk, D, kv_box_rows, kBytes, Cfg::kSwizzle);
  p.v_map = make_tensor_map_3d(tensors.v, kType, pr.B * pr.Hkv, pr.Nk, D, kv_box_rows, kBytes, Cfg::kSwizzle);
  p.o = static_cast<T*>(tensors.o);
  p.lse = tensors.lse;
  p.q = static_cast<const T*>(tensors.q);
  p.k = static_cast<const T*>(tensors.k);
  set_problem<Cfg::B_r>(p, pr, sizeof(T));
  p.rescale_log2 = rescale_log2;
  p.p_limit = std::exp2(rescale_log2);

  if (!p.cta_pairs) {
    const unsigned grid = grid_size(p.n_tiles, schedule, ctas_per_sm);
    p.unit_counter = unit_counter(tensors, 0, schedule, pr.causal, stream);
    kKernel<<<grid, Cfg::kThreads, kSmemBytes, stream>>>(p);
    CUDA_CHECK_LAUNCH();
    return;
  }
  p.n_units = pr.B * pr.H * ((p.m_blocks + 1) / 2);  // pairs of Q blocks
  const int pairs = std::min(p.n_units, max_cta_pairs<kKernel>(Cfg::kThreads, kSmemBytes));
  const PairLaunch launch(unsigned(2 * pairs), Cfg::kThreads, kSmemBytes, stream);
  CUDA_CHECK(cudaLaunchKernelEx(&launch.config, kKernel, p));
}

}  // namespace attn::fa3::step06d
