// Flash-decoding (Dao, Haziza, Massa, Sizov 2023) on FA2's pieces (05d_fa2_reordered.cuh): for few
// query rows, FA2's grid of (Q block, head, batch) has too few CTAs to fill the GPU, so the
// keys are split too. Two kernels:
//
//  1. split: one CTA per (batch b, KV head, block of packed rows, key range s). The rows are
//     the group = H / Hkv query heads that share the KV head, each with its Nq rows: contiguous
//     in Q and O ([B, H, Nq, d]), so Q_packed is one [group * Nq, d] matrix and K_j, V_j are
//     read once for all of them. The CTA runs FA2's loop (Algorithm 1, lines 6-10) over its
//     keys only and writes, per row, a partial O^(s) = O_i / l_i (fp32) and its logsumexp
//     L^(s) = m_i + log l_i to the workspace.
//  2. combine: one CTA (4 warps) per row merges the splits with rung 03's rescaling:
//        L = log sum_s e^(L^(s)),   O = sum_s e^(L^(s) - L) O^(s)
//     (each O^(s) is its split's softmax-weighted mean; e^(L^(s) - L) is the share of the
//     row's softmax mass its keys hold).
#pragma once

#include <cuda_runtime.h>

#include <climits>
#include <cmath>
#include <cstdint>
#include <string>

#include "05_fa2_reordered/fa2_decode.h"
#include "05_fa2_reordered/05d_fa2_reordered.cuh"
#include "common/device_math.cuh"

namespace attn::fa2 {

template <typename T>
struct DecodeParams {
  const T* q;       // [B, H, Nq, d] = [B * Hkv, R, d] packed
  const T* k;       // [B, Hkv, Nk, d]
  const T* v;       // [B, Hkv, Nk, d]
  T* o;             // [B, H, Nq, d]
  float* lse;       // [B, H, Nq] or null
  float* o_part;    // [B * H * Nq rows][splits][d]: each split's O^(s)
  float* lse_part;  // [B * H * Nq rows][splits]: each split's L^(s)
  int Nq, Nk;
  int R;               // packed rows per KV head: group * Nq
  int splits, keys_per_split;
  int first_masked;    // the first key block that needs a mask (ragged end of K or causal diagonal)
  bool causal;
  float scale, scale_log2, rescale_log2;
  // Paged cache only (k, v then point at k_cache, v_cache [num_pages, page_size, Hkv, d]):
  const int* block_table;  // [B, max_pages]
  const int* seq_lens;     // [B]
  int Hkv, num_pages, page_size, max_pages;
  int page_shift;          // log2(page_size) where page_size is a power of two, else -1
  int hkv_shift;           // log2(Hkv) where Hkv is a power of two, else -1
  PagedErrorWord* error;   // the workspace's head: [B][splits] fault records (fa2_decode.h)
};

// n / size, by a shift where size is a power of two (shift = log2(size) >= 0): the shift is one
// instruction, a division dozens of dependent ones.
template <typename I>
__device__ __forceinline__ I shift_or_divide(I n, int shift, int size) {
  return shift >= 0 ? n >> shift : n / size;
}

// Whether a block-table entry names a page of the cache, [0, num_pages).
template <typename T>
__device__ __forceinline__ bool is_page(const DecodeParams<T>& p, int entry) {
  return unsigned(entry) < unsigned(p.num_pages);
}

// S = -inf where a key is past what packed row r (query row r % Nq) sees: key >= Nk (this
// sequence's length), or,
// causal, key > r % Nq + Nk - Nq (bottom-right aligned).
template <typename T, class Cfg>
__device__ __forceinline__ void mask_decode_tile(float (&S_ij)[Frag<Cfg>::kM][Frag<Cfg>::kS][4],
                                                 const DecodeParams<T>& p, int Nk, int warp_row0, int key0,
                                                 int lane) {
#pragma unroll
  for (int mt = 0; mt < Frag<Cfg>::kM; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = warp_row0 + mt * 16 + lane / 4 + 8 * half;
      const int last_key = p.causal ? min(Nk - 1, r % p.Nq + (Nk - p.Nq)) : Nk - 1;
#pragma unroll
      for (int nt = 0; nt < Frag<Cfg>::kS; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e)
          if (key0 + nt * 8 + 2 * (lane % 4) + e > last_key) S_ij[mt][nt][2 * half + e] = -INFINITY;
    }
}

// What a thread's paged copies share across blocks, computed once per CTA (paged_copy): the
// byte address of its 16-byte chunk of this KV head's columns in page 0, slot 0 of each cache,
// and the bytes from one slot and one page to the next.
struct PagedCopy {
  const char* k;
  const char* v;
  int64_t slot_bytes;  // Hkv * d elements: one token's K (or V) row of the cache
  int64_t page_bytes;  // page_size slots
  int slot_mask;       // page_size - 1 (used where page_size is a power of two)
  bool whole_blocks;   // page_size a power-of-two multiple of kRows: each block in one page
};

template <class Cfg, int kRows, typename T>
__device__ __forceinline__ PagedCopy paged_copy(const DecodeParams<T>& p, int head) {
  constexpr int kChunksPerRow = Cfg::kD / kChunkElems;
  const int64_t column = (int64_t(head) * Cfg::kD + (threadIdx.x % kChunksPerRow) * kChunkElems) * int64_t(sizeof(T));
  PagedCopy c;
  c.k = reinterpret_cast<const char*>(p.k) + column;
  c.v = reinterpret_cast<const char*>(p.v) + column;
  c.slot_bytes = int64_t(p.Hkv) * Cfg::kD * int64_t(sizeof(T));
  c.page_bytes = c.slot_bytes * p.page_size;
  c.slot_mask = p.page_size - 1;
  c.whole_blocks = p.page_shift >= 0 && p.page_size % kRows == 0;
  return c;
}

// cp.async keys [first_key, first_key + kRows) of one KV head of one sequence of the paged
// cache into the K and V tiles, as load_tile does for a contiguous [Nk, d] matrix: key n at
// page pages[n / page_size], slot n % page_size. Keys at or past Nk, and keys whose table
// entry is not a page index, are zero-filled and never read: each copy checks its own page,
// so the copies need not wait for the CTA's check of the whole table.
//
// The address work is what the paged copy adds to the contiguous one, and where the grid
// puts one narrow CTA (one warp per scheduler) on an SM, no other warp hides its latency
// (decode.md measures what it costs, and what B = 1 loses besides). Hence the work shared by
// every block is done once (PagedCopy), and two paths. A block in one page (whole_blocks;
// first_key is a multiple of kRows): one table entry, one byte offset, then rows a fixed stride
// apart as in the contiguous copy. Otherwise a lookup per row, by shift and mask where
// page_size is a power of two (page_shift >= 0), by division where not.
template <class Cfg, int kRows, typename T>
__device__ __forceinline__ void load_paged_tiles(T* k_tile, T* v_tile, const DecodeParams<T>& p, const PagedCopy& c,
                                                 const int* pages, int first_key, int Nk) {
  constexpr int kChunksPerRow = Cfg::kD / kChunkElems;
  constexpr int kRowsPerPass = Cfg::kThreads / kChunksPerRow;
  static_assert(Cfg::kThreads % kChunksPerRow == 0 && kRows % kRowsPerPass == 0, "tile splits evenly over threads");
  static_assert((kRows & (kRows - 1)) == 0, "a block of kRows keys fits a power-of-two page");
  const int r0 = threadIdx.x / kChunksPerRow, chunk = threadIdx.x % kChunksPerRow;
  if (c.whole_blocks && first_key + kRows <= Nk) {
    const int page = __ldg(pages + (first_key >> p.page_shift));
    const bool valid = is_page(p, page);
    // page and slot are >= 0: zero-extended (unsigned), the products skip a sign extension each
    const unsigned slot = (first_key & c.slot_mask) + r0;
    const int64_t at = uint64_t(unsigned(valid ? page : 0)) * c.page_bytes + uint64_t(slot) * c.slot_bytes;
    const char* k = c.k + at;
    const char* v = c.v + at;
#pragma unroll
    for (int pass = 0; pass < kRows / kRowsPerPass; ++pass) {
      const int dst = tile_offset<Cfg>(r0 + pass * kRowsPerPass, chunk);
      ptx::cp_async_16(ptx::smem_u32(k_tile + dst), k + pass * kRowsPerPass * c.slot_bytes, valid);
      ptx::cp_async_16(ptx::smem_u32(v_tile + dst), v + pass * kRowsPerPass * c.slot_bytes, valid);
    }
    return;
  }
#pragma unroll
  for (int pass = 0; pass < kRows / kRowsPerPass; ++pass) {
    const int row = r0 + pass * kRowsPerPass, key = first_key + row;
    bool valid = key < Nk;
    int64_t at = 0;
    if (valid) {
      // shift_or_divide spelled out: through the helper ptxas emits six more instructions per
      // row here (cuobjdump, d = 128), and this path runs per row of every block.
      const int entry = p.page_shift >= 0 ? key >> p.page_shift : key / p.page_size;
      const int slot = key - entry * p.page_size, page = __ldg(pages + entry);
      valid = is_page(p, page);
      at = valid ? uint64_t(unsigned(page)) * c.page_bytes + uint64_t(unsigned(slot)) * c.slot_bytes : 0;
    }
    const int dst = tile_offset<Cfg>(row, chunk);
    ptx::cp_async_16(ptx::smem_u32(k_tile + dst), c.k + at, valid);
    ptx::cp_async_16(ptx::smem_u32(v_tile + dst), c.v + at, valid);
  }
}

// The narrow tile's S = Q K_j^T with Q's A fragments held in registers: its one 16-row tile is
// the same for every block, so each warp reads it from shared memory once (load_q_frags), not
// once per block as qk_tile does; only this warp's keys of K_j are read per block.
template <class W, typename T>
__device__ __forceinline__ void load_q_frags(uint32_t (&a)[W::kD / 16][4], const T* sQ, int lane) {
  const uint32_t q_base = lane_row<W>(sQ, lane % 16, lane / 16);  // as qk_tile's A
#pragma unroll
  for (int kk = 0; kk < W::kD / 16; ++kk) ptx::ldmatrix_x4(a[kk], frag_addr<W>(q_base, 0, kk));
}
template <class W, typename T>
__device__ __forceinline__ void qk_tile_q_regs(float (&S_ij)[1][Frag<W>::kS][4], const uint32_t (&a)[W::kD / 16][4],
                                               const T* sK, int lane) {
  static_assert(Frag<W>::kM == 1, "one 16-row tile");
  const uint32_t k_base = lane_row<W>(sK, lane % 8 + (lane / 16) * 8, (lane / 8) % 2);  // as qk_tile's B
#pragma unroll
  for (int nt = 0; nt < Frag<W>::kS; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) S_ij[0][nt][e] = 0.f;
#pragma unroll
  for (int kk = 0; kk < W::kD / 16; ++kk)
#pragma unroll
    for (int np = 0; np < W::kWarpKeys / 16; ++np) {
      uint32_t b[4];
      ptx::ldmatrix_x4(b, frag_addr<W>(k_base, np * 16, kk));
      ptx::mma_16816<T>(S_ij[0][2 * np], a[kk], b[0], b[1]);
      ptx::mma_16816<T>(S_ij[0][2 * np + 1], a[kk], b[2], b[3]);
    }
}

// The narrow tile's warps each ran the online softmax over their own keys of every block: one
// (m, l, O) per warp and row. Merged as the combine merges splits (rung 03's rescaling), with
// M = max_w m_w and f_w = e^(m_w - M):  l = sum_w f_w l_w,  O = sum_w f_w O_w  (unnormalized), into
// warp 0's registers, through `buf` (the K ring: every copy has landed and every warp left the
// loop). l_i: each row's whole sum over the warp's keys (the quad's lanes added), as is warp
// 0's merged l afterwards.
template <class W, int kKeyWarps>
__device__ __forceinline__ void merge_key_warps(float (&O_i)[Frag<W>::kM][Frag<W>::kO][4], float (&m_i)[Frag<W>::kM][2],
                                                float (&l_i)[Frag<W>::kM][2], float* buf, float scale_log2,
                                                int warp, int lane) {
  constexpr int kRows = 16 * Frag<W>::kM;
  constexpr int kValues = Frag<W>::kM * Frag<W>::kO * 4;  // O's floats per thread
  float* row_m = buf;                          // [kKeyWarps][kRows]
  float* row_l = buf + kKeyWarps * kRows;      // [kKeyWarps][kRows]
  float* o_sum = buf + 2 * kKeyWarps * kRows;  // [kKeyWarps - 1][kValues][32]: warps 1.. scaled O
  __syncthreads();  // every warp is done with the ring
#pragma unroll
  for (int mt = 0; mt < Frag<W>::kM; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = mt * 16 + lane / 4 + 8 * half;
      if (lane % 4 == 0) row_m[warp * kRows + r] = m_i[mt][half], row_l[warp * kRows + r] = l_i[mt][half];
    }
  __syncthreads();
#pragma unroll
  for (int mt = 0; mt < Frag<W>::kM; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = mt * 16 + lane / 4 + 8 * half;
      float M = -INFINITY;
#pragma unroll
      for (int w = 0; w < kKeyWarps; ++w) M = fmaxf(M, row_m[w * kRows + r]);
      // e^(m_w - M) in the exponent's units; 0 for a warp that saw no key of the row
      auto share = [&](float m) { return m == -INFINITY ? 0.f : exp2f((m - M) * scale_log2); };
      const float f = share(m_i[mt][half]);
#pragma unroll
      for (int dt = 0; dt < Frag<W>::kO; ++dt)
#pragma unroll
        for (int e = 0; e < 2; ++e) O_i[mt][dt][2 * half + e] *= f;
      if (warp == 0) {
        float l = 0.f;
#pragma unroll
        for (int w = 0; w < kKeyWarps; ++w) l += share(row_m[w * kRows + r]) * row_l[w * kRows + r];
        m_i[mt][half] = M, l_i[mt][half] = l;
      }
    }
  float* flat = &O_i[0][0][0];
  if (warp > 0)
#pragma unroll
    for (int i = 0; i < kValues; ++i) o_sum[((warp - 1) * kValues + i) * 32 + lane] = flat[i];
  __syncthreads();
  if (warp == 0)
#pragma unroll
    for (int w = 1; w < kKeyWarps; ++w)
#pragma unroll
      for (int i = 0; i < kValues; ++i) flat[i] += o_sum[((w - 1) * kValues + i) * 32 + lane];
}

// Kernel 1: FA2's loop over the key blocks of split blockIdx.z, for row block blockIdx.y of
// (batch, KV head) blockIdx.x. Paged: K and V from the paged cache, the keys of this
// sequence only (seq_lens[b]).
template <typename T, class Cfg, bool kPaged>
__global__ void __launch_bounds__(Cfg::kThreads) fa2_decode_split_kernel(const DecodeParams<T> p) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  constexpr int kAlign = Cfg::Layout::kAlign;
  const SmemTiles<T> sm = smem_tiles<T, Cfg>(smem_raw + (kAlign - ptx::smem_u32(smem_raw) % kAlign) % kAlign);
  constexpr int D = Cfg::kD, B_r = Cfg::kBr, B_c = Cfg::kBc, kStages = Cfg::kStages;
  constexpr int kTileKV = B_c * Cfg::kStride;
  static_assert(kStages >= 2, "the decode loop runs the ring schedule");
  const int bkv = blockIdx.x, row0 = blockIdx.y * B_r, split = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const T* Q = p.q + int64_t(bkv) * p.R * D;  // the group's packed rows
  const T* K = p.k + int64_t(bkv) * p.Nk * D;  // contiguous only
  const T* V = p.v + int64_t(bkv) * p.Nk * D;
  // Paged only: the sequence and KV head, before the table's load can be issued.
  const int b = shift_or_divide(bkv, p.hkv_shift, p.Hkv), head = bkv - b * p.Hkv;
  int Nk = p.Nk;  // this sequence's keys
  const int* pages = nullptr;
  const int key_begin = split * p.keys_per_split;
  bool bad = false, bad_length = false, mine = false;
  int len = 0, first_page = 0, end_page = 0;  // paged: seq_lens[b] as given; the split's table columns
  // Column c of the table, holding `entry`, is a fault: it holds one of the sequence's keys but
  // names no page. `&`, not `&&`: with a short circuit ptxas moves the entry's load under the
  // length's test, and the load then waits for len's. c < max_pages, so c * page_size is below
  // the capacity, which check_paged keeps within an int.
  auto fault = [&](int c, int entry) { return (c * p.page_size < len) & !is_page(p, entry); };
  if constexpr (kPaged) {
    // The check: the length, then every page index this CTA's keys use (entries past a
    // sequence's length may hold anything and are not faults). The entries' loads do not wait
    // for the length's: the loop runs over the split's columns below max_pages, which are
    // always in the table, and the length only decides which count. The copies do not wait for
    // the check's verdict either (each copy checks its own page, load_paged_tiles): the CTA's
    // barrier on it comes after the first blocks are requested, so one memory round trip, the
    // table's, comes before the first copy, and the barrier overlaps the copies' trip.
    pages = p.block_table + int64_t(b) * p.max_pages;
    len = p.seq_lens[b];
    const int64_t key_stop = int64_t(key_begin) + p.keys_per_split + p.page_size - 1;  // a page past the split's last key
    first_page = shift_or_divide(key_begin, p.page_shift, p.page_size);
    end_page = int(min(int64_t(p.max_pages), shift_or_divide(key_stop, p.page_shift, p.page_size)));
#pragma unroll 1  // a few columns per thread: unrolled, the loop's setup delays its first load
    for (int c = first_page + int(threadIdx.x); c < end_page; c += Cfg::kThreads) {
      const int entry = pages[c];
      mine |= fault(c, entry);
    }
    bad_length = len < 0 || len > p.max_pages * p.page_size;
    Nk = bad_length ? 0 : len;  // a bad length: no key is copied
  }
  const int key_end = min(Nk, key_begin + p.keys_per_split);
  const int j0 = key_begin / B_c;                     // keys_per_split is a multiple of B_c
  // Contiguous: >= 1, every split has a key. Paged: <= 0 for a split past a short sequence's
  // end (no keys: l = 0, so O^(s) = 0 and L^(s) = -inf); 0 after the prologue for a bad table
  // (NaN below).
  int T_c = (key_end - key_begin + B_c - 1) / B_c;
  // First block that needs a mask: the ragged end of K or, causal, past what query row 0
  // (the row that sees least: keys <= Nk - Nq) sees.
  const int first_masked =
      kPaged ? (p.causal ? min(Nk / B_c, max(0, Nk - p.Nq + 1) / B_c) : Nk / B_c) : p.first_masked;
  // What this warp computes (W: its rows and keys of a block). Narrow: all rows, keys
  // warp_key0.. of each block; wide: rows warp_rows.., every key.
  using W = typename Cfg::WarpView;
  constexpr int kKeyWarps = Cfg::kKeyWarps;
  static_assert(kKeyWarps == 1 || kKeyWarps * 32 == Cfg::kThreads,
                "every warp takes a share of the keys (fewer would need has_rows and merge_key_warps to skip the rest)");
  const int warp_rows = kKeyWarps > 1 ? 0 : warp_first_row<W>(warp);
  const int warp_key0 = (warp % kKeyWarps) * W::kWarpKeys;
  const int warp_row0 = row0 + warp_rows;
  // A warp whose 16-row tile holds no packed row (the last warps of the wide tile at small R)
  // copies K and V for the others and skips the math.
  const bool has_rows = warp_row0 < p.R;

  float O_i[Frag<W>::kM][Frag<W>::kO][4];
  float m_i[Frag<W>::kM][2], l_i[Frag<W>::kM][2];
  uint32_t q_frag[kKeyWarps > 1 ? D / 16 : 1][4];  // narrow: Q's A fragments, read at block 0
#pragma unroll
  for (int mt = 0; mt < Frag<W>::kM; ++mt) {
#pragma unroll
    for (int dt = 0; dt < Frag<W>::kO; ++dt)
#pragma unroll
      for (int e = 0; e < 4; ++e) O_i[mt][dt][e] = 0.f;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      m_i[mt][half] = -INFINITY;
      l_i[mt][half] = 0.f;
    }
  }

  PagedCopy copy{};
  if constexpr (kPaged) copy = paged_copy<Cfg, B_c>(p, head);
  // Rows past R and keys past Nk are zero-filled (load_tile); the mask drops those keys.
  auto load_kv = [&](int slot, int j) {  // K_j and V_j into ring slot `slot`
    if constexpr (kPaged) {
      load_paged_tiles<Cfg, B_c>(sm.sK + slot * kTileKV, sm.sV + slot * kTileKV, p, copy, pages, (j0 + j) * B_c, Nk);
    } else {
      load_tile<Cfg, B_c>(sm.sK + slot * kTileKV, K, (j0 + j) * B_c, p.Nk);
      load_tile<Cfg, B_c>(sm.sV + slot * kTileKV, V, (j0 + j) * B_c, p.Nk);
    }
  };
  load_tile<Cfg, B_r>(sm.sQ, Q, row0, p.R);
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < T_c) load_kv(s, s);
    ptx::cp_async_commit();
  }
  if constexpr (kPaged) {  // the check's verdict, while the first blocks are on their way
    bad = __syncthreads_or(mine) || bad_length;
    if (bad) T_c = 0;  // compute nothing; the copies in flight read only pages, and drain below
    if (threadIdx.x == 0 && head == 0 && blockIdx.y == 0) {  // this (b, split)'s record, fault or not
      PagedErrorWord e{0, b, -1, len};
      if (bad_length) {
        e.flags = len < 0 ? kBadLength : kLengthBeyondPages;
      } else if (bad) {  // rare: find the first bad column again
        for (int c = first_page; c < end_page; ++c)
          if (fault(c, pages[c])) {
            e = PagedErrorWord{kPageOutOfRange, b, c, pages[c]};
            break;
          }
      }
      p.error[int64_t(b) * p.splits + split] = e;
    }
  }
  for (int j = 0; j < T_c; ++j) {
    ptx::cp_async_wait<kStages - 2>();
    __syncthreads();  // block j landed for every thread's copies; block j - 1's buffers are free
    const int next = j + kStages - 1;
    if (next < T_c) load_kv(next % kStages, next);
    ptx::cp_async_commit();
    // this warp's keys of block j (whole 8-row swizzle periods: the layout is unchanged)
    const T* K_j = sm.sK + (j % kStages) * kTileKV + tile_offset<Cfg>(warp_key0, 0);
    const T* V_j = sm.sV + (j % kStages) * kTileKV + tile_offset<Cfg>(warp_key0, 0);

    if (!has_rows) continue;  // it copies K and V for the others, computes nothing

    float S_ij[Frag<W>::kM][Frag<W>::kS][4];
    if constexpr (kKeyWarps > 1) {  // narrow: Q's fragments once (block 0 landed with Q), then per block K_j only
      if (j == 0) load_q_frags<W>(q_frag, sm.sQ, lane);
      qk_tile_q_regs<W>(S_ij, q_frag, K_j, lane);
    } else {
      qk_tile<T, W>(S_ij, sm.sQ, K_j, warp_rows, lane);
    }
    if (j0 + j < first_masked) {
      online_softmax<W, false>(S_ij, O_i, m_i, l_i, p.scale_log2, p.rescale_log2);
    } else {
      mask_decode_tile<T, W>(S_ij, p, Nk, warp_row0, (j0 + j) * B_c + warp_key0, lane);
      online_softmax<W, true>(S_ij, O_i, m_i, l_i, p.scale_log2, p.rescale_log2);
    }
    uint32_t P_ij[Frag<W>::kM][W::kWarpKeys / 16][4];
    pack_p<T, W>(P_ij, S_ij);
    pv_tile<T, W>(O_i, P_ij, V_j, lane);
  }
  ptx::cp_async_wait<0>();  // no copy outlives the CTA (the last groups are empty)
  // The combine may be launched once every CTA is this far; it waits for the whole grid.
  ptx::griddep_launch_dependents();
#pragma unroll
  for (int mt = 0; mt < Frag<W>::kM; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {  // each row's l: the 4 lanes' partial sums, added
      l_i[mt][half] += __shfl_xor_sync(kFullWarp, l_i[mt][half], 1);
      l_i[mt][half] += __shfl_xor_sync(kFullWarp, l_i[mt][half], 2);
    }
  if constexpr (kKeyWarps > 1) {  // narrow: the warps' states into warp 0, which writes the rows
    static_assert((2 * kKeyWarps * 16 * Frag<W>::kM + (kKeyWarps - 1) * 32 * Frag<W>::kM * Frag<W>::kO * 4) *
                          sizeof(float) <= sizeof(T) * kStages * kTileKV,
                  "the merge's buffer fits the K ring");
    merge_key_warps<W, kKeyWarps>(O_i, m_i, l_i, reinterpret_cast<float*>(sm.sK), p.scale_log2, warp, lane);
    if (warp != 0) return;
  }

  // This split's O^(s) = O_i / l_i and L^(s) = m_i + log l_i (natural log, -inf for a row that
  // saw none of these keys, whose O^(s) = 0). Packed row r of KV head bkv is row bkv * R + r
  // of [B, H, Nq]. With one split, O^(s) and L^(s) are the answer: straight to O and lse.
#pragma unroll
  for (int mt = 0; mt < Frag<W>::kM; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const float l = l_i[mt][half];
      const int r = warp_row0 + mt * 16 + lane / 4 + 8 * half;
      if (r >= p.R) continue;
      const int64_t row = int64_t(bkv) * p.R + r;
      // A bad paged table: NaN, never a plausible answer (the combine carries it to O).
      const float inv_l = bad ? NAN : l > 0.f ? 1.f / l : 0.f;
      const float L = bad ? NAN : l > 0.f ? m_i[mt][half] * p.scale + logf(l) : -INFINITY;
      if (p.splits == 1) {
        T* out = p.o + row * D + 2 * (lane % 4);
#pragma unroll
        for (int dt = 0; dt < Frag<W>::kO; ++dt)
          *reinterpret_cast<uint32_t*>(out + dt * 8) = pack2<T>(O_i[mt][dt][2 * half] * inv_l, O_i[mt][dt][2 * half + 1] * inv_l);
        if (p.lse && lane % 4 == 0) p.lse[row] = L;
        continue;
      }
      const int64_t slot = row * p.splits + split;
      float* out = p.o_part + slot * D + 2 * (lane % 4);
#pragma unroll
      for (int dt = 0; dt < Frag<W>::kO; ++dt)
        *reinterpret_cast<float2*>(out + dt * 8) =
            make_float2(O_i[mt][dt][2 * half] * inv_l, O_i[mt][dt][2 * half + 1] * inv_l);
      if (lane % 4 == 0) p.lse_part[slot] = L;
    }
}

// Kernel 2: one CTA per row of [B, H, Nq]. Each of its warps computes the row's L, then sums
// every kCombineWarps-th split's share, lane l owning columns [l * kD / 32, (l + 1) * kD / 32);
// the warps' sums meet in shared memory. Spreading the splits over warps puts more of the
// row's partials in flight at once: the combine waits on memory, not on arithmetic.
constexpr int kCombineWarps = 4;
template <typename T, int kD>
__global__ void __launch_bounds__(32 * kCombineWarps)
    fa2_decode_combine_kernel(const float* o_part, const float* lse_part, T* o, float* lse, int splits) {
  constexpr int kPer = kD / 32;
  static_assert(kPer == 2 || kPer == 4, "d = 64 or 128: a float2 or float4 per lane");
  __shared__ __align__(16) float warp_acc[kCombineWarps][kD];
  const int64_t row = blockIdx.x;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  ptx::griddep_wait();  // launched early (programmatic dependent launch): the partials first
  const float* L = lse_part + row * splits;
  float m = -INFINITY, nan = 0.f;
  for (int s = lane; s < splits; s += 32) {
    m = fmaxf(m, L[s]);
    nan = isnan(L[s]) ? 1.f : nan;  // a paged split that refused its table (fmaxf skips NaN)
  }
  m = group_max(m);
  nan = group_max(nan);
  float sum = 0.f;
  if (m != -INFINITY)
    for (int s = lane; s < splits; s += 32) sum += expf(L[s] - m);  // e^(-inf) = 0
  sum = group_sum(sum);
  const float row_lse = nan > 0.f ? NAN : m == -INFINITY ? -INFINITY : m + logf(sum);  // L = log sum_s e^(L^(s))
  float acc[kPer] = {};
  if (nan > 0.f)
    for (int i = 0; i < kPer; ++i) acc[i] = NAN;
  else if (m != -INFINITY)
#pragma unroll 4  // independent loads: several splits' partials in flight at once
    for (int s = warp; s < splits; s += kCombineWarps) {
      const float w = expf(L[s] - row_lse);  // e^(L^(s) - L): this split's share of the softmax mass
      const float* src = o_part + (row * splits + s) * kD + lane * kPer;
      if constexpr (kPer == 4) {
        const float4 x = *reinterpret_cast<const float4*>(src);
        acc[0] += w * x.x, acc[1] += w * x.y, acc[2] += w * x.z, acc[3] += w * x.w;
      } else {
        const float2 x = *reinterpret_cast<const float2*>(src);
        acc[0] += w * x.x, acc[1] += w * x.y;
      }
    }
#pragma unroll
  for (int i = 0; i < kPer; ++i) warp_acc[warp][lane * kPer + i] = acc[i];
  __syncthreads();
  if (warp != 0) return;
#pragma unroll
  for (int w = 1; w < kCombineWarps; ++w)
#pragma unroll
    for (int i = 0; i < kPer; ++i) acc[i] += warp_acc[w][lane * kPer + i];
  T* dst = o + row * kD + lane * kPer;
  if constexpr (kPer == 4)
    *reinterpret_cast<uint2*>(dst) = make_uint2(pack2<T>(acc[0], acc[1]), pack2<T>(acc[2], acc[3]));
  else
    *reinterpret_cast<uint32_t*>(dst) = pack2<T>(acc[0], acc[1]);
  if (lse && lane == 0) lse[row] = row_lse;
}

// The split kernel on tile Cfg, then the combine (none with one split). kv: the paged cache,
// or null for the contiguous t.k, t.v.
template <typename T, int kD, class Cfg>
void launch_decode_tile(const AttnProblem& p, const AttnTensors& t, const PagedKV* kv, const DecodeSplit& split,
                        cudaStream_t stream) {
  static_assert(Cfg::kSmemBytes == decode_smem_bytes(kD, Cfg::kBr, Cfg::kStages),
                "decode_smem_bytes (the CPU model's) is the tile's shared memory");
  const int64_t rows = int64_t(p.B) * p.H * p.Nq;
  DecodeParams<T> prm{};
  prm.q = static_cast<const T*>(t.q);
  prm.k = static_cast<const T*>(kv ? kv->k_cache : t.k);
  prm.v = static_cast<const T*>(kv ? kv->v_cache : t.v);
  prm.o = static_cast<T*>(t.o);
  prm.lse = t.lse;
  unsigned char* partials = static_cast<unsigned char*>(t.workspace) + (kv ? paged_header_bytes(p.B, split.splits) : 0);
  prm.o_part = split.splits > 1 ? reinterpret_cast<float*>(partials) : nullptr;
  prm.lse_part = split.splits > 1 ? prm.o_part + rows * split.splits * kD : nullptr;
  prm.Nq = p.Nq;
  prm.Nk = p.Nk;
  prm.R = split.rows;
  prm.splits = split.splits;
  prm.keys_per_split = split.keys_per_split;
  // Blocks before this one are inside [0, Nk) and, causal, wholly visible to query row 0
  // (the row that sees least: keys <= Nk - Nq). Paged: per sequence, in the kernel.
  prm.first_masked = p.Nk / Cfg::kBc;
  if (p.causal) prm.first_masked = min(prm.first_masked, max(0, p.Nk - p.Nq + 1) / Cfg::kBc);
  prm.causal = p.causal;
  prm.scale = p.softmax_scale();
  prm.scale_log2 = prm.scale * static_cast<float>(M_LOG2E);
  prm.rescale_log2 = kRescaleLog2;
  prm.Hkv = p.Hkv;
  prm.hkv_shift = shift_for(p.Hkv);
  if (kv) {
    prm.block_table = kv->block_table;
    prm.seq_lens = kv->seq_lens;
    prm.num_pages = kv->num_pages;
    prm.page_size = kv->page_size;
    prm.page_shift = shift_for(kv->page_size);
    prm.max_pages = kv->max_pages;
    prm.error = static_cast<PagedErrorWord*>(t.workspace);  // every record rewritten: nothing to zero
  }

  auto split_kernel = kv ? fa2_decode_split_kernel<T, Cfg, true> : fa2_decode_split_kernel<T, Cfg, false>;
  allow_smem<Cfg>(split_kernel);
  const dim3 grid(unsigned(int64_t(p.B) * p.Hkv), unsigned(split.row_blocks), unsigned(split.splits));
  split_kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(prm);
  CUDA_CHECK_LAUNCH();
  if (split.splits == 1) return;
  // Launched while the split kernel's last CTAs finish (programmatic dependent launch): its
  // CTAs are resident and waiting when the partials land, not a launch latency later.
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(unsigned(rows));
  cfg.blockDim = dim3(32 * kCombineWarps);
  cfg.stream = stream;
  cudaLaunchAttribute early;
  early.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  early.val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = &early;
  cfg.numAttrs = decode_has_pdl() ? 1 : 0;
  CUDA_CHECK(cudaLaunchKernelEx(&cfg, fa2_decode_combine_kernel<T, kD>, static_cast<const float*>(prm.o_part),
                                static_cast<const float*>(prm.lse_part), prm.o, prm.lse, split.splits));
  CUDA_CHECK_LAUNCH();
}

// The tile and ring depth decode_split chose.
template <typename T, int kD>
void launch_decode(const AttnProblem& p, const AttnTensors& t, const PagedKV* kv, cudaStream_t stream) {
  const DecodeSplit split = decode_split(p, decode_device());
  if (!split.narrow)
    launch_decode_tile<T, kD, DecodeTileWide<kD>>(p, t, kv, split, stream);
  else if (split.stages == kDecodeNarrowStages[0])
    launch_decode_tile<T, kD, DecodeTileNarrow<kD, kDecodeNarrowStages[0]>>(p, t, kv, split, stream);
  else
    launch_decode_tile<T, kD, DecodeTileNarrow<kD, kDecodeNarrowStages[1]>>(p, t, kv, split, stream);
}

template <typename T, int kD>
void launch_fa2_decode(const AttnProblem& p, const AttnTensors& t, cudaStream_t stream) {
  launch_decode<T, kD>(p, t, nullptr, stream);
}

template <typename T, int kD>
void launch_fa2_decode_paged(const AttnProblem& p, const PagedKV& kv, const AttnTensors& t, cudaStream_t stream) {
  launch_decode<T, kD>(p, t, &kv, stream);
}

}  // namespace attn::fa2
