// Plumbing that every step of rung 06 runs the same way (06a_tma_wgmma.cuh ... 06d_fa3.cuh,
// fp8h_fa3.cuh), kept here once because no step changes it, so that a diff between two step
// files shows only what that step changes: the kernel parameters, how a CTA numbers its
// tiles, the accumulator's fragment layout, the masks, the output write and the tile
// timeline's hooks. The loads, GEMMs, softmax and loops are in the step files.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <climits>
#include <cmath>
#include <type_traits>

#include "06_fa3_hopper/fa3_launch.h"
#include "06_fa3_hopper/hopper.cuh"
#include "common/check.h"
#include "common/tile_order.h"

namespace attn::fa3 {

using namespace attn::hopper;

// ---------------------------------------------------------------------------------------
// Tile timeline: bench/tile_timeline.cu defines FA3_TIMELINE and a timeline_mark that
// stamps the SM clock at each of these events of a tile (06d and FP8 mark them); in every
// other build the marks compile to nothing. The first six are once per tile; the rest
// inside the loop over K/V blocks, for one block per tile (the middle one:
// timeline_mark_block). block_end stays last: the tool sizes its table by it.
// ---------------------------------------------------------------------------------------
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
// The same for a backward CTA (06k, 06l mark these; `tile_timeline --backward`): its start,
// K_j and V_j landed, the first ring stage full, the last step done, dK_j and dV_j stored,
// the last dQ add done. Marked by every consumer thread; the tool keeps one per CTA.
enum class BwdMark { cta_start, kv_ready, first_stage, steps_done, dkv_stored, cta_done };
#ifndef FA3_TIMELINE
__device__ inline void bwd_timeline_mark(BwdMark) {}
#else
__device__ void bwd_timeline_mark(BwdMark mark);  // defined by the including tool
#endif

// ---------------------------------------------------------------------------------------
// Kernel parameters (bf16 / fp16; the FP8 kernel has its own) and tile numbering.
// ---------------------------------------------------------------------------------------

template <typename T>
struct Params {
  CUtensorMap q_map, k_map, v_map;  // [B*H, Nq, d] and [B*Hkv, Nk, d], 128B-swizzled boxes
  T* o;
  float* lse;        // may be null
  const T *q, *k;    // the raw Q and K, read only by 06d's overflow path (recompute_scores)
  int Nq, Nk, H, Hkv, group, m_blocks, n_tiles;  // n_tiles = m_blocks * B * H
  int n_units;       // what the grid walks: the tiles, or with CTA pairs (06d) the pairs of tiles
  TileOrder order;   // which tile unit u is (common/tile_order.h: longest first with a causal mask)
  float scale_log2;  // softmax scale * log2(e), for exp2
  float rescale_log2;  // 06d's lazy rescaling: O_i is rescaled once a max grows by more
  float p_limit;       // 06d: 2^rescale_log2, the largest P a block keeps without moving m_i
  bool causal;
  bool cta_pairs;     // 06d, Schedule::persistent_cta_pairs: clusters of 2 CTAs share K/V loads
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

// The CTA's seq-th tile, Q block c.m_block of head c.bh, in tiles of B_r query rows and
// K/V blocks of B_c keys: its K/V blocks follow the `kv` blocks of the CTA's earlier tiles
// in the ring (kv advances past them). Every side that walks the CTA's tiles counts them
// this way, so all agree on each block's ring slot and each tile's Q phase.
template <int B_r, int B_c, class Prm>  // Prm: Params<T>, or the FP8 kernel's
__device__ Tile tile_in_sequence(const Prm& p, TileCoord c, int seq, int& kv) {
  Tile t;
  t.bh = c.bh;
  t.kv_head = (t.bh / p.H) * p.Hkv + (t.bh % p.H) / p.group;
  t.row0 = c.m_block * B_r;
  t.n_blocks = (p.Nk + B_c - 1) / B_c;
  if (p.causal) {  // keys [0, visible) are seen by the block's last real row
    const int visible = min(t.row0 + B_r, p.Nq) + (p.Nk - p.Nq);
    t.n_blocks = visible <= 0 ? 0 : min(t.n_blocks, (visible + B_c - 1) / B_c);
  }
  t.seq = seq;
  t.kv0 = kv;
  kv += t.n_blocks;
  return t;
}

// The seq-th unit of a warp-specialized CTA (06b on). The first is the CTA's own index (per
// cluster of ctas_per_unit CTAs). Schedule::persistent (06d) with a causal mask then hands out
// units from a counter, each to whichever CTA asks next: a greedy list schedule, as the hardware's
// own hand-out of CTAs is, which with the causal mask's longest-first order (tile_order.h)
// keeps the CTAs' total work within about one tile of each other. (Fixed rounds b, b + G,
// ... would give CTA 0 the longest tile of every round.) Past the last unit, the producer
// tells the consumers to stop.
//
// Called by a whole warp (produce_tiles), which gets the unit as a warp-uniform value: the
// tile's coordinates then live in uniform registers. Read by one thread, they would not fit
// the producer's 24 registers per thread (setmaxnreg) next to everything else.
template <class Prm>
__device__ int next_unit(const Prm& p, int seq, int ctas_per_unit = 1) {
  const int ctas = gridDim.x / ctas_per_unit, cta = blockIdx.x / ctas_per_unit;
  if (seq == 0 || !p.unit_counter)  // no mask, CTA pairs, one tile per CTA (its second unit: past the end)
    return seq * ctas + cta;
  int taken = 0;
  if (threadIdx.x % 32 == 0) taken = atomicAdd(p.unit_counter, 1);
  return ctas + __reduce_max_sync(0xffffffffu, taken);  // lane 0's, to every lane
}

// ---------------------------------------------------------------------------------------
// The wgmma accumulator layout. Thread (warp w, lane l) of a warpgroup owns rows
// r = 16w + l/4 (slot 0) and r + 8 (slot 1), columns 8i + 2(l%4) + {0,1}:
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

// The max over a row's four threads: of floats (fmaxf), or of ints (FP8: row_max_bits).
template <typename T>
__device__ inline T quad_max(T x) {
  x = max(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return max(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ inline float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
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

// ---------------------------------------------------------------------------------------
// The output: O_i = diag(l_i)^-1 O_i; lse_i = m_i + log(l_i) (FA2 Algorithm 1, lines 12-13).
// ---------------------------------------------------------------------------------------

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

// m_i comes in log2 units (the softmax's) and goes back to natural ones (times ln 2). Rows
// past Nq are never written; a row with no visible key gets O = 0 and lse = -inf.
//
// In the accumulator layout a lane holds 2 columns of every 8 (Fragment): stored as it is,
// that would take d/8 four-byte stores per row, each warp store touching 8 rows with 16
// bytes apiece, so the L1 splits it into 8 half-used sectors and the warps queue behind
// their own stores at the end of every tile. Instead the four lanes of a row swap words
// (quad_transpose) until each holds 8 consecutive columns of one 8-column group, and store
// them with one 16-byte store: a quarter of the instructions, whole sectors.
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

// The dynamic shared memory, aligned for the storage struct (TMA boxes want 128 B, the
// 128B-swizzled wgmma operands 1024 B); the launch asks for alignof(Smem) bytes extra.
template <class Smem>
__device__ inline Smem& aligned_shared(uint8_t* smem_raw) {
  return *reinterpret_cast<Smem*>((reinterpret_cast<uintptr_t>(smem_raw) + alignof(Smem) - 1) &
                                  ~uintptr_t(alignof(Smem) - 1));
}

// The same storage, reached by smem_raw plus a padding instead of an integer rounded up.
// Through the integer the compiler no longer knows that the pointer is in shared memory, so
// every load and store by it is a generic LD/ST: the address is translated at run time and
// the result waited for on the long scoreboard, as a global load is. From 06i_bwd_shared_space
// on, the backward's loads of L_i, D_i and stores of dSᵀ, dQ_i are LDS/STS. (The forward
// kernels reach shared memory almost only through TMA and wgmma descriptors; they keep
// aligned_shared: 06_fa3_hopper/EXPERIMENTS.md.)
template <class Smem>
__device__ inline Smem& shared_storage(uint8_t* smem_raw) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  return *reinterpret_cast<Smem*>(smem_raw + (alignof(Smem) - addr % alignof(Smem)) % alignof(Smem));
}

// ---------------------------------------------------------------------------------------
// Host
// ---------------------------------------------------------------------------------------

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

// The problem's sizes and scales as the kernels read them (Params<T> or FP8's), for tiles
// of B_r query rows.
template <int B_r, class Prm>
void set_problem(Prm& p, const AttnProblem& pr, size_t kv_elem_bytes) {
  p.Nq = pr.Nq;
  p.Nk = pr.Nk;
  p.H = pr.H;
  p.Hkv = pr.Hkv;
  p.group = pr.group();
  p.m_blocks = (pr.Nq + B_r - 1) / B_r;
  p.n_tiles = p.m_blocks * pr.B * pr.H;  // stages.cu refuses more than INT_MAX
  p.n_units = p.n_tiles;
  p.order = tile_order(pr, B_r, kv_elem_bytes);
  p.scale_log2 = pr.softmax_scale() * float(M_LOG2E);
  p.causal = pr.causal;
}

// The CUtensorMap element type of T.
template <typename T>
constexpr CUtensorMapDataType tensor_map_type() {
  return std::is_same_v<T, __nv_bfloat16> ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
}

}  // namespace attn::fa3
