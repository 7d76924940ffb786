// Rung 06q: 06p (06p_bwd_dq_writer.cuh) with persistent CTAs at d = 64. Until 06p a CTA does
// one K/V tile and exits: each tile pays a CTA's start, the wait for its K_j, V_j (TMA, a few
// thousand cycles before the first GEMM) and its dK, dV stores at the end, with nothing else
// on its SM meanwhile (one CTA per SM). With the mask most tiles are short (tile j walks the Q
// blocks from the diagonal on), so that fixed cost is a large share. 06q launches one CTA per
// SM; each walks tiles handed out by a counter in the grid's order (heaviest first, 06m),
// and gives its K_j, V_j a second buffer: the producer loads the next tile's while the
// consumers still run this one's last steps, the Q_i, dO_i ring runs on across tiles, and
// dK_j, dV_j are staged in the dSᵀ tile (free after the tile's last dQ_i) instead of the ring,
// so that the producer need not wait for the stores. At d = 128 a second K_j, V_j (64 KiB)
// does not fit beside 06p's 194 KiB: there 06q is 06p.
//
// 06p's outline, the persistent walk added (d = 64):
//
//   pre-pass: D = rowsum(dO ∘ O), dQ_acc = 0; the tail's dK, dV workspace and the tile counter = 0
//   one CTA per SM (d = 64) or per tile (d = 128); tiles (K/V block j of B_c = 128 keys, batch,
//   KV head) handed out heaviest first (cta_order): the CTA's own index, then the counter's;
//   a second grid: p or p + 1 CTAs per tile of the tail; 2 consumer warpgroups:
//     producer, per tile: the next tile from the counter; K_j, V_j -> buffer u mod 2 (once
//       the consumers released it: two tiles ago); then each step's Q_i, dO_i, L_i, D_i
//     consumers, per tile: wait for buffer u mod 2; d = 64: the warpgroup's rows of K_j -> registers
//     for each step n of the CTA's range (all of the tile's, or the piece's):
//       Sᵀ, dPᵀ, Pᵀ, dV += Pᵀ dO_i, dSᵀ -> shared memory
//       barrier: both dSᵀ halves stored, the last dQ add has read the dQ buffer
//       dQ_i = dS K_j (this warpgroup's half), dK += dSᵀ Q_i; dQ_i -> the buffer; barrier;
//       one bulk add (d = 64: the issuer; d = 128: 06p's writer warp)
//     a whole tile: release K_j, V_j's buffer; dK_j (× scale), dV_j -> the dSᵀ tile (d = 64)
//       or the ring's stages, swizzled; TMA store
//     a piece: dK_j (× scale), dV_j -> the ring's stages in fp32; bulk-added to the workspace
//   post-pass: dQ = scale · dQ_acc; the tail's dK, dV -> T (its first blocks, one launch)
//
// Included only by the generated instance files (06q_bwd_persistent.cu.in).
#pragma once

#include "05_fa2_reordered/fa2_backward.cuh"  // the pre- and post-pass, dQ_acc's layout
#include "06_fa3_hopper/fa3_common.cuh"

namespace attn::fa3::step06q {

template <int D, typename T>
struct Config {
  static constexpr int kWgThreads = 128;
  static constexpr int kConsumers = 2;                       // warpgroups of 64 keys each
  static constexpr int kThreads = kWgThreads * (1 + kConsumers);  // + the producer warpgroup
  static constexpr int kWgKeys = kWarpgroupRows;             // 64: wgmma's M
  static constexpr int B_c = kWgKeys * kConsumers;           // keys per CTA
  // 128 rows at d = 64 (the warpgroups then split dQ_i by query halves, all columns each);
  // 64 at d = 128 (dQ_i split by column halves, as 06j). One rule with stages.cu's HBM model.
  static constexpr int B_r = step06k::rows_per_step(D);               // query rows per step
  static constexpr int kStages = 2;                          // ring of Q_i, dO_i, L_i, D_i
  static constexpr Swizzle kSwizzle = Swizzle::b128;
  static constexpr int kRowBytes = row_bytes(kSwizzle);              // 128
  static constexpr int kChunkCols = kRowBytes / int(sizeof(T));     // 64
  static constexpr int kChunks = D / kChunkCols;
  static constexpr int kAtomBytes = atom_bytes(kSwizzle);           // 1024
  static constexpr int kK = 16;                                      // wgmma K
  static constexpr uint32_t kStepBytes = 2u * B_r * D * sizeof(T);  // Q_i and dO_i
  static constexpr uint32_t kKVBytes = 2u * B_c * D * sizeof(T);    // K_j and V_j
  // setmaxnreg: 128 x 24 + 256 x 240 <= the launch's 384 x 168.
  static constexpr int kProducerRegs = 24;
  static constexpr int kConsumerRegs = 240;
  static_assert(setmaxnreg_budgets_fit(kConsumers, kProducerRegs, kConsumerRegs), "register budgets");
  static_assert(D % kChunkCols == 0, "d is whole 128-byte chunks");
  static constexpr int kDsChunks = B_r / kChunkCols;         // dSᵀ stored as chunks of 64 queries
  static constexpr int kDqN = kDsChunks == 2 ? D : D / 2;    // dQ_i's columns per warpgroup
  static_assert(B_r % kChunkCols == 0 && (kDsChunks == 1 || kDsChunks == kConsumers), "dSᵀ chunks");
  // dK_j, dV_j [B_c][d] in the ring's Q_i, dO_i stages once the steps are done
  static_assert(B_c * D <= kStages * B_r * D, "dK_j and dV_j fit the ring's stages");
  // K_j's rows as Sᵀ's A operand in registers: at d = 64 (128-row steps) only, see above
  static constexpr bool kKInRegisters = D == 64;
  // dQ_i added by the writer warp (64-row steps, d = 128); at d = 64 by 06o's issuer
  static constexpr bool kDqWriter = B_r == kChunkCols;
  static constexpr int kDsBuffers = kDqWriter ? 2 : 1;  // a warpgroup may be a step ahead
  static_assert(!kDqWriter || kStages == 2, "dSᵀ's buffer is the ring's stage: the step's parity");
  // Persistent CTAs with two K_j, V_j buffers where they fit (d = 64: 195 KiB; at d = 128 the
  // second 64 KiB would not): the whole tiles' grid then walks tiles, the pieces' does not.
  static constexpr bool kPersistent = D == 64;
  static constexpr int kKvBuffers = kPersistent ? 2 : 1;
  // the whole tiles' dK_j, dV_j staged in the dSᵀ tile (B_c x B_r elements each) by a walking CTA
  static_assert(!kPersistent || (!kDqWriter && kDsChunks == 2 && D == kChunkCols), "dK_j, dV_j as dSᵀ's two chunks");
};

template <class Cfg, typename T, int D>
struct alignas(1024) SharedStorage {
  T k[Cfg::kKvBuffers][Cfg::B_c * D];        // K_j: d/64 chunks of [B_c][64]; a walking CTA's tile u in u mod 2
  T v[Cfg::kKvBuffers][Cfg::B_c * D];        // V_j
  T q[Cfg::kStages][Cfg::B_r * D];           // Q_i: d/64 chunks of [B_r][64]
  T dout[Cfg::kStages][Cfg::B_r * D];        // dO_i
  T ds[Cfg::kDsBuffers][Cfg::B_c * Cfg::B_r];  // dSᵀ of the CTA, by step parity: B_r/64 chunks of [128 keys][64 queries], warpgroup w's rows 64w..
  float dq[Cfg::B_r * D];                    // dQ_i, in dQ_acc's 8 x 8 blocks; warpgroup w writes half w (columns or queries)
  float lse2[Cfg::kStages][Cfg::B_r];        // L_i log2(e); +inf past Nq or where L_i = -inf
  float dsum[Cfg::kStages][Cfg::B_r];        // D_i; 0 past Nq
  uint64_t kv_full[Cfg::kKvBuffers];
  uint64_t full[Cfg::kStages], empty[Cfg::kStages];
  uint64_t kv_empty[Cfg::kKvBuffers];        // a walking CTA: the consumers are done with the buffer
  int tile[Cfg::kKvBuffers];                 // a walking CTA: the tile whose K_j, V_j the buffer holds; -1: none left
};

template <typename T>
struct BwdParams {
  CUtensorMap q_map, do_map, k_map, v_map;  // do_map: 4-D, dO's own strides (make_tensor_map_4d)
  CUtensorMap dk_map, dv_map;  // boxes of 64 keys (a warpgroup's) x 64 columns
  const float* lse;  // [B, H, Nq] natural log (the forward's)
  const float* D;    // [B, H, Nq] (the pre-pass's)
  float* dq_acc;     // 05's workspace layout (fa2_backward.h: dq_acc_offset)
  float* dkv_tail;   // [tail tiles][dK, dV][B_c][d] fp32: the pieces' sums (tail_plan)
  int full_ctas;     // CTAs of whole tiles (the first grid)
  int pieces;        // the tail's grid: `pieces` CTAs per tile for its first long_tiles, then one more
  int long_tiles;
  int H, Hkv, group, Nq, Nk, T_c;
  uint64_t h_magic;  // bh / H = (bh · h_magic) >> h_shift: dO's 4-D coordinates without a division
  int h_shift;
  TileOrder order;   // the grid's hand-out (fa3_launch.h: cta_order, bwd_order)
  bool causal;
  float scale, scale_log2;
  int* tile_counter;  // the persistent grid's: tiles handed out past the first round (zeroed by the pre-pass)
};

// The CTA's K/V block and the steps it walks: every (query head of the KV head's group, Q
// block) whose queries may see one of its keys. Causal: Q blocks before first_i see none.
struct Work {
  int key0, bh_kv, bh0, first_i, T_r, steps;
  int n0;    // the tile's step this CTA starts at (0 but for a piece)
  int tail;  // a piece: its tile's index in the tail (dkv_tail's rows); -1: a whole tile
  // x: the CTA's index or (a walking CTA) the tile it was handed. pieces: a CTA of the tail's
  // grid (tail_plan: the long pieces first, p to a tile, then p + 1 to a tile); else tile x
  template <typename T>
  __device__ Work(const BwdParams<T>& p, int B_c, int B_r, bool pieces, int x) {
    int piece = 0, count = 1;
    tail = -1;
    if (pieces) {
      const TailPiece t = tail_piece(x, p.long_tiles, p.pieces);
      tail = t.tail, piece = t.piece, count = t.count;
      x = p.full_ctas + tail;
    }
    const TileCoord t = cta_order(p.order, x);
    const int j = t.m_block;
    bh_kv = t.bh;
    bh0 = bh_kv / p.Hkv * p.H + bh_kv % p.Hkv * p.group;
    key0 = j * B_c;
    const int off = p.Nk - p.Nq;  // bottom-right causal: query r sees keys <= r + off
    first_i = p.causal && key0 - off > 0 ? (key0 - off) / B_r : 0;
    T_r = (p.Nq + B_r - 1) / B_r;
    const int all = p.group * (T_r - first_i);
    n0 = int(int64_t(piece) * all / count);
    steps = int(int64_t(piece + 1) * all / count) - n0;
  }
  // step n0's query head and Q block
  __device__ int first_bh() const { return bh0 + n0 / (T_r - first_i); }
  __device__ int first_block() const { return first_i + n0 % (T_r - first_i); }
};

// Step n's query head and Q block, advanced one step at a time (no division in the loop).
struct Pos {
  int bh, block;
  __device__ Pos next(const Work& w) const { return block + 1 < w.T_r ? Pos{bh, block + 1} : Pos{bh + 1, w.first_i}; }
};

// ---------------------------------------------------------------------------------------
// The producer: K_j, V_j once, then each step's Q_i, dO_i (TMA, lane 0) and L_i, D_i (its
// 32 lanes, two rows each) into ring stage n mod kStages, once the consumers released it.
// The stage's "full" barrier takes 32 arrivals (each lane's arrival releases its own
// stores of L_i, D_i) and the TMA bytes.
// ---------------------------------------------------------------------------------------
// A walking CTA (Cfg::kPersistent) calls it per tile: K_j, V_j into buffer b, the steps from
// ring position g (the steps of its earlier tiles).
template <class Cfg, class Smem, typename T>
__device__ void produce(Smem& s, const BwdParams<T>& p, const Work& w, int b, int g) {
  constexpr int D = Cfg::kChunks * Cfg::kChunkCols;
  const int lane = threadIdx.x % 32;
  if (lane == 0) {
    mbarrier_arrive_expect_tx(&s.kv_full[b], Cfg::kKVBytes);
    for (int c = 0; c < Cfg::kChunks; ++c) {
      tma_load_3d(&s.k[b][c * Cfg::B_c * Cfg::kChunkCols], &p.k_map, c * Cfg::kChunkCols, w.key0, w.bh_kv, &s.kv_full[b]);
      tma_load_3d(&s.v[b][c * Cfg::B_c * Cfg::kChunkCols], &p.v_map, c * Cfg::kChunkCols, w.key0, w.bh_kv, &s.kv_full[b]);
    }
  }
  Pos at{w.first_bh(), w.first_block()};
  for (int n = 0; n < w.steps; ++n, at = at.next(w)) {
    const int stage = (g + n) % Cfg::kStages;
    mbarrier_wait(&s.empty[stage], (((g + n) / Cfg::kStages) & 1) ^ 1);  // first lap: passes at once
    const int row0 = at.block * Cfg::B_r;
#pragma unroll
    for (int h = 0; h < Cfg::B_r / 32; ++h) {
      const int r = lane + 32 * h, row = row0 + r;
      const size_t x = size_t(at.bh) * p.Nq + row;
      const float L = row < p.Nq ? p.lse[x] : -INFINITY;
      // A row that sees no key (L = -inf) or lies past Nq gets P = exp2(... - inf) = 0.
      s.lse2[stage][r] = L == -INFINITY ? INFINITY : L * float(M_LOG2E);
      s.dsum[stage][r] = row < p.Nq ? p.D[x] : 0.f;
    }
    if (lane == 0) {
      mbarrier_arrive_expect_tx(&s.full[stage], Cfg::kStepBytes);
      for (int c = 0; c < Cfg::kChunks; ++c) {
        const int col = c * Cfg::kChunkCols;
        tma_load_3d(&s.q[stage][c * Cfg::B_r * Cfg::kChunkCols], &p.q_map, col, row0, at.bh, &s.full[stage]);
        const int batch = int((uint64_t(unsigned(at.bh)) * p.h_magic) >> p.h_shift);
        tma_load_4d(&s.dout[stage][c * Cfg::B_r * Cfg::kChunkCols], &p.do_map, col, row0, at.bh - batch * p.H, batch,
                    &s.full[stage]);
      }
    } else {
      mbarrier_arrive(&s.full[stage]);
    }
  }
  (void)D;
}

// The producer of a walking CTA: tile u's K_j, V_j into buffer u mod 2 once the consumers
// released it (after tile u - 2), the buffer's tile index beside them, then tile u's steps.
// The next tile is taken from the counter only then, when this tile's last step is issued
// (about two steps before the consumers finish it): taken at the tile's start, it would wait
// a whole tile on this SM while another SM ran out of work. Past the last tile it hands the
// consumers index -1 (an arrival without bytes).
template <class Cfg, class Smem, typename T>
__device__ void produce_walk(Smem& s, const BwdParams<T>& p) {
  const int lane = threadIdx.x % 32;
  int x = int(blockIdx.x), g = 0;
  for (int u = 0;; ++u) {
    const int b = u % 2;
    if (u > 0) {
      int taken = 0;
      if (lane == 0) taken = atomicAdd(p.tile_counter, 1);
      x = int(gridDim.x) + __shfl_sync(0xffffffffu, taken, 0);
    }
    mbarrier_wait(&s.kv_empty[b], ((u / 2) & 1) ^ 1);  // first lap: passes at once
    if (x >= p.full_ctas) {
      if (lane == 0) {
        s.tile[b] = -1;
        mbarrier_arrive(&s.kv_full[b]);
      }
      return;
    }
    if (lane == 0) s.tile[b] = x;  // released by produce's arrival on kv_full[b]
    const Work w(p, Cfg::B_c, Cfg::B_r, false, x);
    produce<Cfg>(s, p, w, b, g);
    g += w.steps;
  }
}

// ---------------------------------------------------------------------------------------
// The GEMMs of one consumer warpgroup (its 64 keys).
// ---------------------------------------------------------------------------------------

// Xᵀ = A_wg Bᵀ (Sᵀ = K Q_iᵀ, dPᵀ = V dO_iᵀ): K-major A (this warpgroup's 64 rows of K_j or
// V_j, B_c rows per chunk) and K-major B (Q_i or dO_i, B_r rows per chunk); d/16 K steps, one
// commit group.
template <class Cfg, typename T>
__device__ void gemm_t(float (&X)[Cfg::B_r / 2], const T* A_wg, const T* B_i) {
  constexpr int D = Cfg::kChunks * Cfg::kChunkCols, kStepBytes = Cfg::kK * int(sizeof(T));
  const uint64_t a_desc = make_smem_desc(A_wg, /*unused*/ 16, Cfg::kAtomBytes, Cfg::kSwizzle);
  const uint64_t b_desc = make_smem_desc(B_i, /*unused*/ 16, Cfg::kAtomBytes, Cfg::kSwizzle);
  pin_registers(X);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < D / Cfg::kK; ++kk)
    Wgmma<T, Cfg::B_r>::ss(X, desc_advance(a_desc, kmajor_step_offset(kk, kStepBytes, Cfg::B_c, Cfg::kSwizzle)),
                           desc_advance(b_desc, kmajor_step_offset(kk, kStepBytes, Cfg::B_r, Cfg::kSwizzle)),
                           /*accumulate=*/kk > 0);
  wgmma_commit();
  pin_registers(X);
}

// The warpgroup's 64 rows of K_j as wgmma A fragments, one ldmatrix.x4 per K step of 16
// columns: lane l addresses row (l % 8) + 8 (m % 2), columns 8 (m / 2).. of its warp's 16 x 16
// block, m = l / 8; matrix m then lands in register m, the A layout (a0: rows 0-7, columns
// 0-7; a1: rows 8-15; a2, a3: columns 8-15). K_j is stored as TMA wrote it (128-byte rows,
// 16-byte piece c of row r at c ^ r % 8).
template <class Cfg, typename T>
__device__ void load_k_operand(uint32_t (&a)[Cfg::kChunks * Cfg::kChunkCols / Cfg::kK][4], const T* K_wg) {
  const int lane = threadIdx.x % 32, warp = (threadIdx.x / 32) % 4, m = lane / 8;
  const int row = 16 * warp + lane % 8 + 8 * (m % 2);
#pragma unroll
  for (int kk = 0; kk < Cfg::kChunks * Cfg::kChunkCols / Cfg::kK; ++kk) {
    const int col = Cfg::kK * kk;
    const char* chunk = reinterpret_cast<const char*>(K_wg + col / Cfg::kChunkCols * Cfg::B_c * Cfg::kChunkCols);
    const int piece = col % Cfg::kChunkCols / 8 + m / 2;
    fa2::ptx::ldmatrix_x4(a[kk], smem_addr(chunk + row * Cfg::kRowBytes + (piece ^ row % 8) * 16));
  }
}

// Sᵀ = K_wg Q_iᵀ with K_wg from registers (load_k_operand); B = Q_i, K-major, as gemm_t's.
template <class Cfg, typename T>
__device__ void gemm_t_rs(float (&X)[Cfg::B_r / 2], const uint32_t (&K_op)[Cfg::kChunks * Cfg::kChunkCols / Cfg::kK][4],
                          const T* B_i) {
  constexpr int D = Cfg::kChunks * Cfg::kChunkCols, kStepBytes = Cfg::kK * int(sizeof(T));
  const uint64_t b_desc = make_smem_desc(B_i, /*unused*/ 16, Cfg::kAtomBytes, Cfg::kSwizzle);
  pin_registers(X);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < D / Cfg::kK; ++kk)
    Wgmma<T, Cfg::B_r>::rs_k(X, K_op[kk], desc_advance(b_desc, kmajor_step_offset(kk, kStepBytes, Cfg::B_r, Cfg::kSwizzle)),
                             /*accumulate=*/kk > 0);
  wgmma_commit();
  pin_registers(X);
}

// Acc += Xᵀ B_i (dV += Pᵀ dO_i, dK += dSᵀ Q_i): A from registers (B_r/16 K steps over the
// step's queries), B = dO_i or Q_i as stored, [queries][d]: N-major, B_r rows per chunk
// (the forward's V_j in O += P V_j). Issued without a commit: the caller closes the group.
template <class Cfg, typename T, int D>
__device__ void gemm_acc(float (&Acc)[D / 2], const uint32_t (&X)[Cfg::B_r / Cfg::kK][4], const T* B_i) {
  const uint64_t b_desc = make_smem_desc(B_i, Cfg::B_r * Cfg::kRowBytes, Cfg::kAtomBytes, Cfg::kSwizzle);
#pragma unroll
  for (int kk = 0; kk < Cfg::B_r / Cfg::kK; ++kk)
    Wgmma<T, D>::rs(Acc, X[kk], desc_advance(b_desc, kk * Cfg::kK * Cfg::kRowBytes), /*accumulate=*/1);
}

// kDqN columns of 64 queries of dQ_i = dS K_j over all B_c keys: A = a 64-query chunk of the
// CTA's dSᵀ [keys][queries] in shared memory, M-major (queries contiguous; one 128-byte row
// per key); B = those columns of K_j, [keys][d], N-major, from K_cols (row 0 of column c0).
// At B_r = 64: columns [c0, c0 + d/2) of the one chunk; at 128: all d = 64 columns of chunk
// w. B_c/16 K steps, each 16 rows of both further; one commit group.
template <class Cfg, typename T, int D>
__device__ void gemm_dq(float (&dQ)[Cfg::kDqN / 2], const T* dST, const T* K_cols) {
  const uint64_t a_desc = make_smem_desc(dST, Cfg::B_c * Cfg::kRowBytes, Cfg::kAtomBytes, Cfg::kSwizzle);
  const uint64_t b_desc = make_smem_desc(K_cols, Cfg::B_c * Cfg::kRowBytes, Cfg::kAtomBytes, Cfg::kSwizzle);
  pin_registers(dQ);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < Cfg::B_c / Cfg::kK; ++kk)
    Wgmma<T, Cfg::kDqN>::ss_mn(dQ, desc_advance(a_desc, kk * Cfg::kK * Cfg::kRowBytes),
                           desc_advance(b_desc, kk * Cfg::kK * Cfg::kRowBytes), /*accumulate=*/kk > 0);
  wgmma_commit();
  pin_registers(dQ);
}

// ---------------------------------------------------------------------------------------
// Elementwise work on the accumulator layout (Fragment, fa3_common.cuh): row = key (of the
// warpgroup's 64), column = query (of the step's B_r).
// ---------------------------------------------------------------------------------------

// Pᵀ = exp2(Sᵀ scale log2e − L_i log2e) in place. kMasked: keys past Nk and, causal, keys
// right of the diagonal (key > query + Nk − Nq) are 0. Queries past Nq need no test: their
// L is +inf (produce).
template <class Cfg, bool kMasked, typename T>
__device__ void probs_t(float (&S)[Cfg::B_r / 2], const float* L2, const BwdParams<T>& p, int wg_key0, int query0) {
  const Fragment f;
#pragma unroll
  for (int i = 0; i < Cfg::B_r / 8; ++i)
#pragma unroll
    for (int slot = 0; slot < 2; ++slot)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int col = 8 * i + f.col_base + e;
        float& s = S[4 * i + 2 * slot + e];
        const float pv = exp2_approx(fmaf(s, p.scale_log2, -L2[col]));
        if constexpr (kMasked) {
          const int key = wg_key0 + f.row[slot], query = query0 + col;
          s = key < p.Nk && (!p.causal || key <= query + (p.Nk - p.Nq)) ? pv : 0.f;
        } else {
          s = pv;
        }
      }
}

// fp32 accumulator -> A-operand registers (06a's to_operand on B_r columns).
template <class Cfg, typename T>
__device__ void to_operand(const float (&X)[Cfg::B_r / 2], uint32_t (&op)[Cfg::B_r / Cfg::kK][4]) {
#pragma unroll
  for (int kk = 0; kk < Cfg::B_r / Cfg::kK; ++kk)
#pragma unroll
    for (int r = 0; r < 4; ++r) op[kk][r] = pack2<T>(X[8 * kk + 2 * r], X[8 * kk + 2 * r + 1]);
}

// dSᵀ = Pᵀ ∘ (dPᵀ − D_i) in place in dP, from Pᵀ's fp32 values.
template <class Cfg>
__device__ void ds_t(float (&dP)[Cfg::B_r / 2], const float (&P)[Cfg::B_r / 2], const float* Dsum) {
  const Fragment f;
#pragma unroll
  for (int x = 0; x < Cfg::B_r / 2; x += 2) {  // x = 4i + 2 slot: columns 8i + col_base, + 1
    const int col = 8 * (x / 4) + f.col_base;
    dP[x] = P[x] * (dP[x] - Dsum[col]);
    dP[x + 1] = P[x + 1] * (dP[x + 1] - Dsum[col + 1]);
  }
}

// dSᵀ (operand registers) -> shared memory: this warpgroup's 64 keys of each 64-query chunk
// [B_c keys][64 queries], 128-byte swizzled rows as TMA would write them (16-byte piece c of
// row r at c ^ r % 8), which the M-major descriptor of gemm_dq reads.
template <class Cfg, typename T>
__device__ void store_ds_t(T* dST, const uint32_t (&dS)[Cfg::B_r / Cfg::kK][4]) {
  const Fragment f;
#pragma unroll
  for (int kk = 0; kk < Cfg::B_r / Cfg::kK; ++kk)
#pragma unroll
    for (int r = 0; r < 4; ++r) {  // entries 8kk + 2r, + 1: i = 2kk + r / 2, slot r % 2
      // chunk kk / 4 holds queries 64 (kk / 4) ..: [B_c keys][64 queries] each
      char* base = reinterpret_cast<char*>(dST + kk / 4 * Cfg::B_c * Cfg::kChunkCols);
      const int row = f.row[r % 2], col = 8 * (2 * (kk % 4) + r / 2) + f.col_base;
      const int byte = col * int(sizeof(T));
      *reinterpret_cast<uint32_t*>(base + row * Cfg::kRowBytes + ((byte / 16) ^ (row % 8)) * 16 + byte % 16) =
          dS[kk][r];
    }
}

// This warpgroup's half of dQ_i (complete sums: kDqN columns of 64 queries) into the buffer,
// laid out as dQ_acc (fa2_backward.h: dq_acc_offset) for the Q block's B_r rows;
// half = buf + offset(q0, c0) (multiples of 8: whole 8 x 8 blocks). A warp's 8-byte stores of one (i, slot) are
// one 8 x 8 block (rows 16w + l/4 + 8 slot, columns c0 + 8i + 2 (l % 4)): 256 consecutive
// bytes, no bank conflict.
template <class Cfg, int D>
__device__ void store_dq(float* half, const float (&dQ)[Cfg::kDqN / 2]) {
  const Fragment f;
#pragma unroll
  for (int slot = 0; slot < 2; ++slot)
#pragma unroll
    for (int i = 0; i < Cfg::kDqN / 8; ++i)
      *reinterpret_cast<float2*>(half + fa2::dq_acc_offset<D>(f.row[slot], 8 * i + f.col_base)) =
          make_float2(dQ[4 * i + 2 * slot], dQ[4 * i + 2 * slot + 1]);
}

// The buffer's rows that exist in dQ_acc (whose rows per head are Nq rounded up to 8), added
// there by one bulk reduction: query0 is a multiple of 64, so they are one contiguous range.
template <int D, typename T>
__device__ void reduce_dq(const float* buf, const BwdParams<T>& p, int bh, int query0, int rows) {
  const int live = min(rows, int(fa2::dq_acc_rows(p.Nq)) - query0);  // a multiple of 8
  bulk_reduce_add_f32(p.dq_acc + fa2::dq_acc_index<D>(bh, query0, 0, p.Nq), buf, uint32_t(live) * D * sizeof(float));
  bulk_commit_group();
}

// dK_j (× scale) or dV_j of this warpgroup's 64 keys -> shared memory at `tile` (d/64 chunks
// of [B_c keys][64 columns], this warpgroup's rows 64 wg..), 128-byte swizzled rows as TMA
// reads them (16-byte piece c of row r at c ^ r % 8). A warp's 4-byte stores of one (i, slot)
// are 8 rows x 16 bytes in 8 different pieces: every bank once.
template <class Cfg, int D, typename T>
__device__ void stage_dkv(T* tile, const float (&X)[D / 2], float scale) {
  const Fragment f;
#pragma unroll
  for (int slot = 0; slot < 2; ++slot)
#pragma unroll
    for (int i = 0; i < D / 8; ++i) {
      const int col = 8 * i + f.col_base, row = f.row[slot];
      char* chunk = reinterpret_cast<char*>(tile + col / Cfg::kChunkCols * Cfg::B_c * Cfg::kChunkCols);
      const int byte = col % Cfg::kChunkCols * int(sizeof(T));
      *reinterpret_cast<uint32_t*>(chunk + row * Cfg::kRowBytes + ((byte / 16) ^ (row % 8)) * 16 + byte % 16) =
          pack2<T>(scale * X[4 * i + 2 * slot], scale * X[4 * i + 2 * slot + 1]);
    }
}

// A piece's part of dK_j (× scale) or dV_j, this warpgroup's 64 keys, into `buf` in dQ_acc's
// 8 x 8 blocks (as store_dq: a warp's stores of one (i, slot) are 256 consecutive bytes), the
// layout of the tail's sums, so that one bulk reduction adds the 64 rows.
template <class Cfg, int D>
__device__ void stage_sums(float* buf, const float (&X)[D / 2], float scale) {
  const Fragment f;
#pragma unroll
  for (int slot = 0; slot < 2; ++slot)
#pragma unroll
    for (int i = 0; i < D / 8; ++i)
      *reinterpret_cast<float2*>(buf + fa2::dq_acc_offset<D>(f.row[slot], 8 * i + f.col_base)) =
          make_float2(scale * X[4 * i + 2 * slot], scale * X[4 * i + 2 * slot + 1]);
}

// Named barriers of both consumer warpgroups (256 threads), each synced once per step; with
// the writer (kDqWriter) kDsStored and kDqStored count its warp too.
constexpr int kDsStored = 1;  // the CTA's dSᵀ tile is complete; the dQ buffer is free
constexpr int kDqStored = 2;  // dQ_i's two halves are in the buffer
constexpr int kRingFree = 3;  // both warpgroups are past their last step: the ring is free
constexpr int kDkvStaged = 4;  // + wg: this warpgroup's dK_j, dV_j rows are in shared memory
template <class Cfg>
constexpr int kAtDsAndDq = 2 * Cfg::kWgThreads + (Cfg::kDqWriter ? 32 : 0);

// ---------------------------------------------------------------------------------------
// The dQ writer (kDqWriter), warp 1 of the producer warpgroup: each step it waits until both
// halves of dQ_i are in the buffer (kDqStored: the consumers arrive, it syncs), lane 0 adds
// them by one bulk reduction and waits until the copy engine has read them, and the warp
// arrives at the next step's kDsStored: the consumers store dQ_{i+1} only after it.
// ---------------------------------------------------------------------------------------
template <class Cfg, int D, typename T, class Smem>
__device__ void write_dq(Smem& s, const BwdParams<T>& p, const Work& w) {
  constexpr int kCount = kAtDsAndDq<Cfg>;
  if (w.steps > 0) named_barrier_arrive(kDsStored, kCount);  // step 0's: the buffer starts free
  Pos at{w.first_bh(), w.first_block()};
  for (int n = 0; n < w.steps; ++n, at = at.next(w)) {
    named_barrier_sync(kDqStored, kCount);
    if (threadIdx.x % 32 == 0) {
      reduce_dq<D>(s.dq, p, at.bh, at.block * Cfg::B_r, Cfg::B_r);
      bulk_wait_group_read<0>();
    }
    __syncwarp();
    if (n + 1 < w.steps) named_barrier_arrive(kDsStored, kCount);
  }
  if (threadIdx.x % 32 == 0) bulk_wait_group<0>();  // the adds are done before shared memory goes
}

// ---------------------------------------------------------------------------------------
// A consumer warpgroup (wg = 0, 1): keys key0 + 64 wg ..., every step of the CTA's tile or
// piece. kWalk: one tile of a walking CTA, K_j, V_j in buffer b (its arrival already waited
// for), the steps from ring position g.
// ---------------------------------------------------------------------------------------
template <class Cfg, int D, bool kPieces, bool kWalk, typename T, class Smem>
__device__ void consume(Smem& s, const BwdParams<T>& p, const Work& w, int wg, int b, int g) {
  constexpr int kOps = Cfg::B_r / Cfg::kK;
  const int wg_key0 = w.key0 + wg * Cfg::kWgKeys;
  const T* K_wg = s.k[b] + wg * Cfg::kWgKeys * Cfg::kChunkCols;  // row 64 wg of chunk 0
  const T* V_wg = s.v[b] + wg * Cfg::kWgKeys * Cfg::kChunkCols;
  const int ds_rows = wg * Cfg::kWgKeys * Cfg::kChunkCols;  // this warpgroup's 64 rows of each dSᵀ chunk
  // dQ_i: by column halves (B_r = 64) or by query halves (B_r = 128, all columns)
  const int c0 = Cfg::kDsChunks == 1 ? wg * Cfg::kDqN : 0;
  const int q0 = Cfg::kDsChunks == 1 ? 0 : wg * Cfg::kChunkCols;
  // without the writer (d = 64): adds dQ_i by the CTA's bulk reduction (a piece's sums: `lead`)
  const bool lead = threadIdx.x % Cfg::kWgThreads == 0;  // the warpgroup's bulk copies
  const bool issuer = wg == 0 && lead;
  const bool keys_ragged = wg_key0 + Cfg::kWgKeys > p.Nk;

  float dK[D / 2], dV[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) dK[i] = dV[i] = 0.f;

  bwd_timeline_mark(BwdMark::cta_start);  // tile_timeline --backward; nothing otherwise
  if constexpr (!kWalk) mbarrier_wait(&s.kv_full[0], 0);
  bwd_timeline_mark(BwdMark::kv_ready);
  uint32_t K_op[D / Cfg::kK][4];  // d = 64: this warpgroup's rows of K_j, read once
  if constexpr (Cfg::kKInRegisters) load_k_operand<Cfg, T>(K_op, K_wg);
  Pos at{w.first_bh(), w.first_block()};
  for (int n = 0; n < w.steps; ++n, at = at.next(w)) {
    const int stage = (g + n) % Cfg::kStages;
    const int query0 = at.block * Cfg::B_r;
    mbarrier_wait(&s.full[stage], ((g + n) / Cfg::kStages) & 1);
    if (n == 0) bwd_timeline_mark(BwdMark::first_stage);
    const T* Q_i = s.q[stage];
    const T* dO_i = s.dout[stage];

    uint32_t P[kOps][4], dS_op[kOps][4];
    float dQ[Cfg::kDqN / 2];
    {
      float S[Cfg::B_r / 2], dP[Cfg::B_r / 2];
      if constexpr (Cfg::kKInRegisters)
        gemm_t_rs<Cfg, T>(S, K_op, Q_i);  // line 9:  Sᵀ = K_j Q_iᵀ
      else
        gemm_t<Cfg>(S, K_wg, Q_i);
      gemm_t<Cfg>(dP, V_wg, dO_i);  // line 12: dPᵀ = V_j dO_iᵀ
      if constexpr (Cfg::kDsChunks == 1) {  // 06j's order: dV issued under dSᵀ's work
        wgmma_wait<1>();
        pin_registers(S);
        // line 10: Pᵀ, masked where a key is past Nk or (causal) right of a query's diagonal
        if (keys_ragged || (p.causal && wg_key0 + Cfg::kWgKeys - 1 > query0 + (p.Nk - p.Nq)))
          probs_t<Cfg, true>(S, s.lse2[stage], p, wg_key0, query0);
        else
          probs_t<Cfg, false>(S, s.lse2[stage], p, wg_key0, query0);
        to_operand<Cfg, T>(S, P);
        // line 11: dV_j += Pᵀ dO_i, issued at once: the tensor cores run it under dSᵀ's
        // elementwise work below.
        pin_registers(dV);
        wgmma_fence();
        gemm_acc<Cfg, T, D>(dV, P, dO_i);
        wgmma_commit();
        pin_registers(dV);
        wgmma_wait<1>();  // dPᵀ done; dV may still run
        pin_registers(dP);
        // line 13: dSᵀ = Pᵀ ∘ (dPᵀ − D_i), Pᵀ from its fp32 copy: the operand registers belong
        // to dV's wgmma until it is waited for.
        ds_t<Cfg>(dP, S, s.dsum[stage]);
        to_operand<Cfg, T>(dP, dS_op);
      } else {  // 128 rows: Pᵀ's fp32 copy and its operand do not fit beside dPᵀ; dV after dSᵀ
        wgmma_wait<0>();
        pin_registers(S);
        pin_registers(dP);
        if (keys_ragged || (p.causal && wg_key0 + Cfg::kWgKeys - 1 > query0 + (p.Nk - p.Nq)))
          probs_t<Cfg, true>(S, s.lse2[stage], p, wg_key0, query0);
        else
          probs_t<Cfg, false>(S, s.lse2[stage], p, wg_key0, query0);
        ds_t<Cfg>(dP, S, s.dsum[stage]);  // line 13, then both operands
        to_operand<Cfg, T>(S, P);
        to_operand<Cfg, T>(dP, dS_op);
        pin_registers(dV);  // line 11: dV_j += Pᵀ dO_i, under the dSᵀ stores and the barrier
        wgmma_fence();
        gemm_acc<Cfg, T, D>(dV, P, dO_i);
        wgmma_commit();
        pin_registers(dV);
      }
    }
    // line 14: dQ_i = dS_ij K_j. This warpgroup's dSᵀ into the CTA's tile, visible to wgmma
    // (async proxy). The tile's last reader: without the writer both warpgroups passed
    // kDqStored of step n - 1 after their dQ wgmma; with it, step n - 2's, whose buffer
    // this is (the other warpgroup arrived at kDsStored n - 1 after its step n - 2). The
    // barrier: both halves stored, and the last bulk add (the issuer's, or the writer's,
    // which arrives) has read the dQ buffer.
    T* dST = s.ds[Cfg::kDqWriter ? stage : 0];  // stage = n mod 2 (kStages = 2)
    if (kWalk && n == 0) {  // the last tile's dK_j, dV_j (staged in these rows) are read out
      if (lead) bulk_wait_group_read<0>();
      named_barrier_sync(kDkvStaged + wg, Cfg::kWgThreads);
    }
    store_ds_t<Cfg, T>(dST + ds_rows, dS_op);
    fence_proxy_async_shared();
    if (!Cfg::kDqWriter && issuer) bulk_wait_group_read<0>();
    named_barrier_sync(kDsStored, kAtDsAndDq<Cfg>);
#pragma unroll
    for (int i = 0; i < Cfg::kDqN / 2; ++i) dQ[i] = 0.f;
    // columns c0.. over all 128 keys: K_j's chunk of column c0, c0 % 64 columns in; then
    // line 15, dK_j += dSᵀ Q_i, queued behind it: the tensor cores run dK under the dQ stores.
    gemm_dq<Cfg, T, D>(dQ, dST + q0 / Cfg::kChunkCols * Cfg::B_c * Cfg::kChunkCols,
                       s.k[b] + c0 / Cfg::kChunkCols * Cfg::B_c * Cfg::kChunkCols + c0 % Cfg::kChunkCols);
    pin_registers(dK);
    wgmma_fence();
    gemm_acc<Cfg, T, D>(dK, dS_op, Q_i);
    wgmma_commit();
    pin_registers(dK);
    wgmma_wait<1>();  // dV and dQ_i done; dK may still run
    pin_registers(dQ);
    pin_registers(dV);
    // line 14's add: both halves in the buffer, visible to the copy engine, one bulk add, by
    // the writer (this warpgroup only arrives and goes on) or the issuer after both.
    store_dq<Cfg, D>(s.dq + fa2::dq_acc_offset<D>(q0, c0), dQ);
    fence_proxy_async_shared();
    if constexpr (Cfg::kDqWriter) {
      named_barrier_arrive(kDqStored, kAtDsAndDq<Cfg>);
    } else {
      named_barrier_sync(kDqStored, kAtDsAndDq<Cfg>);
      if (issuer) reduce_dq<D>(s.dq, p, at.bh, query0, Cfg::B_r);
    }
    wgmma_wait<0>();  // dK done: Q_i, dO_i (and L_i, D_i, read above) are free
    pin_registers(dK);
    // Every consumer thread arrives: each releases its own reads of L_i and D_i, which the
    // producer's lanes overwrite with plain stores on the next lap (compute-sanitizer's
    // racecheck flagged one arrival per warp after __syncwarp).
    mbarrier_arrive(&s.empty[stage]);
  }
  bwd_timeline_mark(BwdMark::steps_done);
  if constexpr (kWalk) {
    // K_j, V_j were last read by this warpgroup's last dQ_i and dPᵀ, both waited for: the
    // buffer may take tile u + 2. dK_j (× scale), dV_j go to this warpgroup's rows of the dSᵀ
    // tile (chunk 0, chunk 1), which both warpgroups' last dQ_i read before the last dQ
    // barrier; their TMA stores are waited for before the next tile's first dSᵀ stores.
    mbarrier_arrive(&s.kv_empty[b]);
    T* dK_tile = s.ds[0] + wg * Cfg::kWgKeys * Cfg::kChunkCols;
    T* dV_tile = s.ds[0] + Cfg::B_c * Cfg::kChunkCols + wg * Cfg::kWgKeys * Cfg::kChunkCols;
    stage_dkv<Cfg, D>(dK_tile, dK, p.scale);
    stage_dkv<Cfg, D>(dV_tile, dV, 1.f);
    fence_proxy_async_shared();
    named_barrier_sync(kDkvStaged + wg, Cfg::kWgThreads);
    if (lead && wg_key0 < p.Nk) {  // rows past Nk are not written; a box wholly past it is not issued
      tma_store_3d(&p.dk_map, dK_tile, 0, wg_key0, w.bh_kv);
      tma_store_3d(&p.dv_map, dV_tile, 0, wg_key0, w.bh_kv);
    }
    if (lead) bulk_commit_group();
    return;
  } else if constexpr (kPieces) {  // a piece: its sums added to the tail's workspace, converted after the grid
    // The ring is free (as below); this warpgroup's half of it (32 KiB) holds its 64 rows of
    // dK_j, then of dV_j, in fp32, each added by one bulk reduction of the leading thread.
    named_barrier_sync(kRingFree, 2 * Cfg::kWgThreads);
    float* buf = reinterpret_cast<float*>(wg == 0 ? s.q[0] : s.dout[0]);
    float* rows = p.dkv_tail + (int64_t(w.tail) * 2 * Cfg::B_c + wg * Cfg::kWgKeys) * D;  // of dK's sums
    constexpr uint32_t kBytes = Cfg::kWgKeys * D * sizeof(float);
    static_assert(kBytes <= sizeof(s.q), "a warpgroup's fp32 rows fit its half of the ring");
    stage_sums<Cfg, D>(buf, dK, p.scale);
    fence_proxy_async_shared();
    named_barrier_sync(kDkvStaged + wg, Cfg::kWgThreads);
    if (lead) {
      bulk_reduce_add_f32(rows, buf, kBytes);
      bulk_commit_group();
      bulk_wait_group_read<0>();  // buf may be overwritten
    }
    named_barrier_sync(kDkvStaged + wg, Cfg::kWgThreads);
    stage_sums<Cfg, D>(buf, dV, 1.f);
    fence_proxy_async_shared();
    named_barrier_sync(kDkvStaged + wg, Cfg::kWgThreads);
    if (lead) {
      bulk_reduce_add_f32(rows + Cfg::B_c * D, buf, kBytes);
      bulk_commit_group();
      bulk_wait_group<0>();  // this piece's sums (and without the writer the dQ adds) are done
    }
    return;
  }
  // line 17: dK_j (× scale), dV_j through the ring's stages (every stage was consumed and each
  // warpgroup waited for its last wgmma; the barrier waits for the other's) and TMA stores.
  named_barrier_sync(kRingFree, 2 * Cfg::kWgThreads);
  T* dK_tile = s.q[0] + wg * Cfg::kWgKeys * Cfg::kChunkCols;  // row 64 wg of chunk 0
  T* dV_tile = s.dout[0] + wg * Cfg::kWgKeys * Cfg::kChunkCols;
  stage_dkv<Cfg, D>(dK_tile, dK, p.scale);
  stage_dkv<Cfg, D>(dV_tile, dV, 1.f);
  fence_proxy_async_shared();  // visible to the copy engine
  named_barrier_sync(kDkvStaged + wg, Cfg::kWgThreads);
  if (threadIdx.x % Cfg::kWgThreads == 0) {
    if (wg_key0 < p.Nk)  // rows past Nk are not written; a box wholly past it is not issued
      for (int c = 0; c < Cfg::kChunks; ++c) {
        tma_store_3d(&p.dk_map, dK_tile + c * Cfg::B_c * Cfg::kChunkCols, c * Cfg::kChunkCols, wg_key0, w.bh_kv);
        tma_store_3d(&p.dv_map, dV_tile + c * Cfg::B_c * Cfg::kChunkCols, c * Cfg::kChunkCols, wg_key0, w.bh_kv);
      }
    bulk_commit_group();
    bulk_wait_group_read<0>();  // the stores have read shared memory
  }
  bwd_timeline_mark(BwdMark::dkv_stored);
  if (!Cfg::kDqWriter && issuer) bulk_wait_group<0>();  // the dQ adds are done before the CTA's shared memory goes
  bwd_timeline_mark(BwdMark::cta_done);
}

// The consumers of a walking CTA: tile after tile as the producer hands them out (buffer u mod
// 2), until it hands out -1.
template <class Cfg, int D, typename T, class Smem>
__device__ void consume_walk(Smem& s, const BwdParams<T>& p, int wg) {
  int g = 0;
  for (int u = 0;; ++u) {
    const int b = u % 2;
    mbarrier_wait(&s.kv_full[b], (u / 2) & 1);
    const int x = s.tile[b];
    if (x < 0) break;
    const Work w(p, Cfg::B_c, Cfg::B_r, false, x);
    consume<Cfg, D, false, true>(s, p, w, wg, b, g);
    g += w.steps;
  }
  if (threadIdx.x % Cfg::kWgThreads == 0) bulk_wait_group<0>();  // the stores and dQ adds, before shared memory goes
}

// kPieces = false: the whole tiles, 06n's kernel instruction for instruction (a piece's
// epilogue in the same kernel costs the steps' schedule 0.5-1 %: 06o_bwd.md). true: the
// tail's pieces, a second grid launched beside the first's last wave.
template <int D, typename T, bool kPieces>
__global__ void __launch_bounds__(Config<D, T>::kThreads, 1) fa3_backward(const __grid_constant__ BwdParams<T> p) {
  using Cfg = Config<D, T>;
  using Smem = SharedStorage<Cfg, T, D>;
  extern __shared__ uint8_t smem_raw[];
  Smem& s = shared_storage<Smem>(smem_raw);  // LDS/STS, not LD/ST
  if (threadIdx.x == 0) {
    for (int i = 0; i < Cfg::kKvBuffers; ++i) {
      mbarrier_init(&s.kv_full[i], 1);  // the producer (+ TMA bytes)
      if (Cfg::kPersistent) mbarrier_init(&s.kv_empty[i], Cfg::kConsumers * Cfg::kWgThreads);  // every consumer thread
    }
    for (int i = 0; i < Cfg::kStages; ++i) {
      mbarrier_init(&s.full[i], 32);                          // the producer warp's lanes (+ TMA bytes)
      mbarrier_init(&s.empty[i], Cfg::kConsumers * Cfg::kWgThreads);  // every consumer thread
    }
    fence_barrier_init();
  }
  __syncthreads();
  // The whole tiles' grid lets the pieces' grid start once its last wave has (each piece
  // then takes an SM as soon as one is free, not after the slowest CTA and a launch).
  if constexpr (!kPieces) grid_dependents_may_launch();
  if constexpr (Cfg::kPersistent && !kPieces) {  // a walking CTA (d = 64)
    const int wg = threadIdx.x / Cfg::kWgThreads;
    if (wg == 0) {
      setmaxnreg_dec<Cfg::kProducerRegs>();
      if (threadIdx.x < 32) produce_walk<Cfg>(s, p);
    } else {
      setmaxnreg_inc<Cfg::kConsumerRegs>();
      consume_walk<Cfg, D>(s, p, wg - 1);
    }
  } else {
    const Work w(p, Cfg::B_c, Cfg::B_r, kPieces, int(blockIdx.x));
    const int wg = threadIdx.x / Cfg::kWgThreads;
    if (wg == 0) {
      setmaxnreg_dec<Cfg::kProducerRegs>();
      if (threadIdx.x < 32) produce<Cfg>(s, p, w, 0, 0);
      else if (Cfg::kDqWriter && threadIdx.x < 64) write_dq<Cfg, D>(s, p, w);
    } else {
      setmaxnreg_inc<Cfg::kConsumerRegs>();
      consume<Cfg, D, kPieces, false>(s, p, w, wg - 1, 0, 0);
    }
  }
  // A piece needs nothing the whole tiles write (dQ's adds commute), but the post-pass, an
  // ordinary launch after this grid, reads both grids' sums: this grid ends after the other.
  if constexpr (kPieces) grid_dependency_wait();
}

// 05's pre-pass, and the tail's dK, dV sums zeroed by the same grid: no launch of its own.
template <int D, typename T>
__global__ void __launch_bounds__(fa2::kPrepassThreads)
    prepass_and_tail(const fa2::BwdParams<T> f, fa2::DoutStrides dout, int64_t rows, float4* dkv_tail, int64_t tail4) {
  fa2::prepass<T, D>(f, rows, dout);
  fa2::zero_by_grid(dkv_tail, tail4);
}

// The tail's dK, dV (fp32 sums of its pieces in dQ_acc's 8 x 8 blocks, × scale already) -> T,
// rows past Nk left alone: one block per tile of the tail, 16-byte stores of 8 columns.
template <int D, typename T>
__device__ __forceinline__ void convert_tail_tile(const float* dkv_tail, T* dk, T* dv, TileOrder order, int full_ctas,
                                                  int Nk, int tail) {
  constexpr int B_c = step06e::kBwdKeysPerCta;
  const TileCoord c = cta_order(order, full_ctas + tail);
  const int key0 = c.m_block * B_c;
  for (int e = int(threadIdx.x); e < 2 * B_c * D / 8; e += int(blockDim.x)) {
    const int which = e / (B_c * D / 8), r = e / (D / 8) % B_c, col = e % (D / 8) * 8;
    if (key0 + r >= Nk) continue;
    const float4* src = reinterpret_cast<const float4*>(dkv_tail + (int64_t(tail) * 2 + which) * B_c * D +
                                                        fa2::dq_acc_offset<D>(r, col));
    const float4 a = src[0], b = src[1];
    const uint4 packed{pack2<T>(a.x, a.y), pack2<T>(a.z, a.w), pack2<T>(b.x, b.y), pack2<T>(b.z, b.w)};
    T* out = which == 0 ? dk : dv;
    *reinterpret_cast<uint4*>(out + (int64_t(c.bh) * Nk + key0 + r) * D + col) = packed;
  }
}

// The post-pass in one launch: blocks [0, tail tiles) convert the tail's dK, dV, the rest run
// 05's dQ conversion (dQ = scale · dQ_acc).
struct PostPass {
  const float* dq_acc;
  int64_t chunks;  // of dQ's 8 elements
  int Nq;
  float scale;
  const float* dkv_tail;
  TileOrder order;
  int full_ctas;
  int tail_tiles;
  int Nk;
};

template <int D, typename T>
__global__ void convert_dq_and_tail(const __grid_constant__ PostPass pp, T* dq, T* dk, T* dv) {
  const int b = int(blockIdx.x);
  if (b < pp.tail_tiles) {
    convert_tail_tile<D, T>(pp.dkv_tail, dk, dv, pp.order, pp.full_ctas, pp.Nk, b);
    return;
  }
  const int64_t first = int64_t(b - pp.tail_tiles) * blockDim.x + threadIdx.x;
  fa2::convert_dq<T, D>(pp.dq_acc, dq, pp.chunks, pp.Nq, pp.scale, first, int64_t(gridDim.x - pp.tail_tiles) * blockDim.x);
}

template <int D, typename T>
void launch_backward(const AttnProblem& pr, const AttnBwdTensors& t, cudaStream_t stream) {
  using Cfg = Config<D, T>;
  static_assert(Cfg::B_r == step06k::rows_per_step(D), "stages.cu's HBM model counts these Q blocks");
  static_assert(Cfg::B_c == step06e::kBwdKeysPerCta, "the grid and refusals of stages.cu count 06e's blocks");
  constexpr size_t kSmemBytes = sizeof(SharedStorage<Cfg, T, D>) + alignof(SharedStorage<Cfg, T, D>);
  configure_kernel<fa3_backward<D, T, false>>(Cfg::kThreads, kSmemBytes);
  configure_kernel<fa3_backward<D, T, true>>(Cfg::kThreads, kSmemBytes);

  // The pre-pass (D, dQ_acc = 0) and the post-pass (dQ) are 05's: the same workspace.
  fa2::BwdParams<T> f{};
  f.o = static_cast<const T*>(t.o);
  f.dout = static_cast<const T*>(t.dout);
  float* ws = static_cast<float*>(t.workspace);
  f.dq_acc = ws;
  f.D = ws + fa2::dq_acc_elems(pr);
  f.Nq = pr.Nq;
  f.H = pr.H;
  int64_t dout_strides[3];  // dL/dO read where it lies (AttnBwdTensors::dout_strides): no copy
  dout_strides_of(pr, t, dout_strides);
  fa2::DoutStrides dout;  // row = 0: the pre-pass's contiguous path
  if (!dout_strides_dense(pr, dout_strides)) dout = {dout_strides[0], dout_strides[1], dout_strides[2]};
  // The tail's pieces (tail_plan, fa3_launch.h), their dK, dV sums after 05's workspace.
  const TailPlan plan = tail_plan_for(pr);
  const uintptr_t after = reinterpret_cast<uintptr_t>(t.workspace) + fa2::bwd_workspace_bytes(pr);
  float* dkv_tail = reinterpret_cast<float*>((after + kTailAlign - 1) / kTailAlign * kTailAlign);
  const int64_t rows = pr.lse_elems();
  constexpr int kMaxBlocks = 8192, kRowsPerBlock = fa2::kPrepassThreads / fa2::kPrepassLanes<D>;
  const int64_t prepass_blocks = std::min<int64_t>((rows + kRowsPerBlock - 1) / kRowsPerBlock, kMaxBlocks);
  // the walking grid's tile counter: the float4 after the sums, zeroed with them
  static_assert(kTileCounterBytes == sizeof(float4), "the pre-pass zeroes float4s");
  int* tile_counter = reinterpret_cast<int*>(reinterpret_cast<char*>(dkv_tail) + tail_sums_bytes(plan, D));
  const int64_t tail4 = int64_t((tail_sums_bytes(plan, D) + (Cfg::kPersistent ? kTileCounterBytes : 0)) / sizeof(float4));
  prepass_and_tail<D, T><<<unsigned(prepass_blocks), fa2::kPrepassThreads, 0, stream>>>(
      f, dout, rows, reinterpret_cast<float4*>(dkv_tail), tail4);
  CUDA_CHECK_LAUNCH();

  constexpr CUtensorMapDataType kType = tensor_map_type<T>();
  constexpr int kBytes = int(sizeof(T));
  BwdParams<T> p{};
  p.q_map = make_tensor_map_3d(t.q, kType, pr.B * pr.H, pr.Nq, D, Cfg::B_r, kBytes, Cfg::kSwizzle);
  p.do_map = make_tensor_map_4d(t.dout, kType, pr.B, pr.H, pr.Nq, D, dout_strides, Cfg::B_r, kBytes, Cfg::kSwizzle);
  p.k_map = make_tensor_map_3d(t.k, kType, pr.B * pr.Hkv, pr.Nk, D, Cfg::B_c, kBytes, Cfg::kSwizzle);
  p.v_map = make_tensor_map_3d(t.v, kType, pr.B * pr.Hkv, pr.Nk, D, Cfg::B_c, kBytes, Cfg::kSwizzle);
  p.dk_map = make_tensor_map_3d(t.dk, kType, pr.B * pr.Hkv, pr.Nk, D, Cfg::kWgKeys, kBytes, Cfg::kSwizzle);
  p.dv_map = make_tensor_map_3d(t.dv, kType, pr.B * pr.Hkv, pr.Nk, D, Cfg::kWgKeys, kBytes, Cfg::kSwizzle);
  p.lse = t.lse;
  p.D = f.D;
  p.dq_acc = f.dq_acc;
  p.H = pr.H;
  const HeadDivisor h_div = head_divisor(pr.H);
  p.h_magic = h_div.magic;
  p.h_shift = h_div.shift;
  p.Hkv = pr.Hkv;
  p.group = pr.group();
  p.Nq = pr.Nq;
  p.Nk = pr.Nk;
  p.T_c = (pr.Nk + Cfg::B_c - 1) / Cfg::B_c;
  p.dkv_tail = dkv_tail;
  p.full_ctas = int(plan.full_ctas);
  p.pieces = plan.pieces;
  p.long_tiles = int(plan.long_tiles);
  p.causal = pr.causal;
  p.scale = pr.softmax_scale();
  p.scale_log2 = p.scale * float(M_LOG2E);
  p.order = bwd_order(pr, p.T_c, pr.causal ? l2_cache_bytes() : 0);  // no device query without the mask
  p.tile_counter = tile_counter;
  if (plan.full_ctas > 0) {  // the whole tiles (every tile with the mask or one piece): walked by one CTA per SM at d = 64
    const unsigned grid = Cfg::kPersistent ? persistent_grid(plan.full_ctas, 1) : unsigned(plan.full_ctas);
    fa3_backward<D, T, false><<<grid, Cfg::kThreads, kSmemBytes, stream>>>(p);
    CUDA_CHECK_LAUNCH();
  }
  if (plan.tail_tiles > 0) {  // the tail's pieces: beside the whole tiles' last wave
    launch_beside_previous(fa3_backward<D, T, true>, dim3(unsigned(plan.tail_ctas())),
                           dim3(Cfg::kThreads), kSmemBytes, stream,
                           plan.full_ctas > 0 /* else after the pre-pass, whose D it reads */, p);
    CUDA_CHECK_LAUNCH();
  }

  PostPass pp{};
  pp.dq_acc = f.dq_acc;
  pp.chunks = pr.q_elems() / fa2::kChunkElems;
  pp.Nq = pr.Nq;
  pp.scale = p.scale;
  pp.dkv_tail = dkv_tail;
  pp.order = p.order;
  pp.full_ctas = p.full_ctas;
  pp.tail_tiles = int(plan.tail_tiles);
  pp.Nk = pr.Nk;
  constexpr int kConvertThreads = 256;
  const int64_t convert_blocks = std::min<int64_t>((pp.chunks + kConvertThreads - 1) / kConvertThreads, kMaxBlocks);
  convert_dq_and_tail<D, T><<<unsigned(pp.tail_tiles + convert_blocks), kConvertThreads, 0, stream>>>(
      pp, static_cast<T*>(t.dq), static_cast<T*>(t.dk), static_cast<T*>(t.dv));
  CUDA_CHECK_LAUNCH();
}

}  // namespace attn::fa3::step06q
