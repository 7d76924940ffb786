// Rung 06c: 06b with ping-pong scheduling between the consumer warpgroups. Each
// warpgroup's block is two GEMMs with a softmax between them; the tensor cores idle
// during a softmax unless another warpgroup's GEMM is queued. Named barriers make the
// consumers take turns issuing their S GEMM (0, 1, .., 0, 1, ..): one warpgroup's
// S_ij = Q_i K_jᵀ is issued while the other runs its softmax.
//
//   consumer warpgroup w, block j:
//     wait for the turn (bar.sync 1 + w); issue S_ij = Q_i K_jᵀ; hand the turn on
//     (bar.arrive 1 + (w + 1) mod n); softmax; O_i += P_ij V_j
//
// Everything else is 06b: a producer warpgroup streams K_j, V_j through a ring of
// full/empty mbarriers, the consumers take the producer's registers (setmaxnreg).
//
// Included only by the generated instance files (06c_pingpong.cu.in).
#pragma once

#include "06_fa3_hopper/fa3_common.cuh"

namespace attn::fa3::step06c {

template <int D, typename T>
struct Config {
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
  static_assert(kConsumers >= 2, "the ping-pong needs two or more consumer warpgroups");
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

// Ring slot of the CTA's it-th K/V block: its stage, and the parity its barrier waits test.
template <class Cfg>
struct Slot {
  int stage;
  uint32_t phase;
  __device__ explicit Slot(int it) : stage(it % Cfg::kStages), phase(uint32_t(it / Cfg::kStages) & 1) {}  // LAB:BEGIN 06.slot LAB:END
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

// One B_c x d block (K_j or V_j) into `tile`, completing on `full`.
template <class Cfg>
__device__ void load_kv(void* tile, const CUtensorMap* map, int j, int kv_head, uint64_t* full) {
  mbarrier_arrive_expect_tx(full, Cfg::kKVBytes);  // LAB:BEGIN 06.load_kv
  char* chunk0 = static_cast<char*>(tile);
  constexpr int kChunkBytes = Cfg::B_c * Cfg::kSwizzleRowBytes;  // one 128-byte column chunk of the block
  for (int c = 0; c < Cfg::kChunks; ++c)
    tma_load_3d(chunk0 + c * kChunkBytes, map, c * Cfg::kChunkCols, j * Cfg::B_c, kv_head, full);  // LAB:END
}

// The CTA's seq-th tile, unit `unit` (fa3_common.cuh: tile_in_sequence).
template <class Cfg, typename T>
__device__ Tile tile_of_unit(const Params<T>& p, int unit, int seq, int& kv) {
  return tile_in_sequence<Cfg::B_r, Cfg::B_c>(p, tile_at(p.order, unit), seq, kv);
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
    for (int j = 0; j < t.n_blocks; ++j) {
      const Slot<Cfg> slot(t.kv0 + j);
      mbarrier_wait(&s.k_empty[slot.stage], slot.phase ^ 1);
      if (leader) load_kv<Cfg>(s.k[slot.stage], &p.k_map, j, t.kv_head, &s.k_full[slot.stage]);
      mbarrier_wait(&s.v_empty[slot.stage], slot.phase ^ 1);
      if (leader) load_kv<Cfg>(s.v[slot.stage], &p.v_map, j, t.kv_head, &s.v_full[slot.stage]);
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
// is kept in those units. The caller rescales O_i by alpha.
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
    const float shift = 0.f - m_base;
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
// Ping-pong: consumer warpgroups take turns (0, 1, .., 0, 1, ..) issuing their S GEMM;
// issuing hands the turn on, and the next one's S GEMM runs under this one's softmax.
// ---------------------------------------------------------------------------------------

template <class Cfg>
struct TurnTaking {
  static constexpr int kThreads = 2 * Cfg::kWgThreads;  // the waiting and the handing-over warpgroup
  int wg;
  __device__ void start() const {  // warpgroup 0 goes first: the last one hands it the turn; LAB:BEGIN 06.turns
    if (wg == Cfg::kConsumers - 1) named_barrier_arrive(Cfg::kTurnBarrier + 0, kThreads);
  }
  __device__ void wait_turn() const { named_barrier_sync(Cfg::kTurnBarrier + wg, kThreads); }
  __device__ void pass_turn() const {
    named_barrier_arrive(Cfg::kTurnBarrier + (wg + 1) % Cfg::kConsumers, kThreads);
  }
  __device__ void finish() const {  // take the last hand-over, so every arrival is matched
    if (wg == 0) named_barrier_sync(Cfg::kTurnBarrier + 0, kThreads);
  }  // LAB:END
};

// ---------------------------------------------------------------------------------------
// Consumer warpgroup turn.wg: FA2's inner loop over K/V blocks for its 64 rows of Q_i.
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

  release_q_after(s, t, -1);  // a tile with no visible K/V block never reads Q_i

  for (int j = 0; j < t.n_blocks; ++j) {
    const Slot<Cfg> slot(t.kv0 + j);
    // S_ij = Q_i K_jᵀ
    mbarrier_wait(&s.k_full[slot.stage], slot.phase);
    turn.wait_turn();
    gemm_qk<Cfg>(S, Q_i, s.k[slot.stage]);
    turn.pass_turn();
    wgmma_wait<0>();
    pin_registers(S);
    release_kv(&s.k_empty[slot.stage]);
    release_q_after(s, t, j);
    // m_i, P_ij, l_i; O_i *= exp(m_old - m_new)
    if (block_needs_mask<Cfg>(j, wg_row0, p)) mask_block<Cfg>(S, j, wg_row0, p);
    online_softmax<Cfg>(S, m, l, alpha, p.scale_log2);
    rescale<D>(O, alpha);
    to_operand<Cfg, T>(S, P_op);
    // O_i += P_ij V_j
    mbarrier_wait(&s.v_full[slot.stage], slot.phase);
    gemm_pv<Cfg, T, D>(O, P_op, s.v[slot.stage]);
    wgmma_wait<0>();
    pin_registers(O);
    release_kv(&s.v_empty[slot.stage]);
  }
  write_output<D, T>(O, m, l, t.bh, wg_row0, p);
}

// ---------------------------------------------------------------------------------------
// The kernel: each CTA takes one tile (the producer asks next_unit for more: past the end).
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

template <int D, typename T>
__global__ void __launch_bounds__(Config<D, T>::kThreads, 1) fa3_forward(const __grid_constant__ Params<T> p) {
  using Cfg = Config<D, T>;
  using Smem = SharedStorage<Cfg, T, D>;
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

template <int D, typename T>
void launch(const AttnProblem& pr, const AttnTensors& tensors, cudaStream_t stream) {
  using Cfg = Config<D, T>;
  constexpr size_t kSmemBytes = sizeof(SharedStorage<Cfg, T, D>) + alignof(SharedStorage<Cfg, T, D>);
  configure_kernel<fa3_forward<D, T>>(Cfg::kThreads, kSmemBytes);

  constexpr CUtensorMapDataType kType = tensor_map_type<T>();
  constexpr int kBytes = int(sizeof(T));
  Params<T> p{};
  p.q_map = make_tensor_map_3d(tensors.q, kType, pr.B * pr.H, pr.Nq, D, kWarpgroupRows, kBytes, Cfg::kSwizzle);
  p.k_map = make_tensor_map_3d(tensors.k, kType, pr.B * pr.Hkv, pr.Nk, D, Cfg::B_c, kBytes, Cfg::kSwizzle);
  p.v_map = make_tensor_map_3d(tensors.v, kType, pr.B * pr.Hkv, pr.Nk, D, Cfg::B_c, kBytes, Cfg::kSwizzle);
  p.o = static_cast<T*>(tensors.o);
  p.lse = tensors.lse;
  set_problem<Cfg::B_r>(p, pr, sizeof(T));
  fa3_forward<D, T><<<unsigned(p.n_tiles), Cfg::kThreads, kSmemBytes, stream>>>(p);
  CUDA_CHECK_LAUNCH();
}

}  // namespace attn::fa3::step06c
