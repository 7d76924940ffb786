// Tile configurations of the FlashAttention-2 forward kernel (05d_fa2_reordered.cuh), one per head
// dim, the shared-memory layout of their tiles, and the launch entry point that each
// generated translation unit instantiates. Plain constexpr arithmetic, so the CPU tests
// check the layout the kernel runs (tests/test_cpu.cpp, Fa2Layout.*).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/attention.h"

namespace attn::fa2 {

// Lazy rescaling (05d_fa2_reordered.cuh: online_softmax): a warp rescales O_i only once some row
// max has grown by more than 8 in the exponent's log2 units, so P_ij <= 2^8.
constexpr float kRescaleLog2 = 8.f;

constexpr int kElemBytes = 2;   // bf16 / fp16
constexpr int kChunkElems = 8;  // one 16-byte chunk = 8 elements: what cp.async and an ldmatrix row move

// Shared-memory rows of exactly d elements, 16-byte chunk c of row r stored at chunk
// c ^ (r % 8). An ldmatrix 8x8 matrix reads the same chunk of 8 consecutive rows; with rows
// a multiple of 128 bytes, unswizzled, all 8 would sit in the same 4 banks. Swizzled, chunk
// c of row r is in bank group (c ^ r) mod 8, so the 8 rows hit all 32 banks:
//
//   bank group (16 B):  0   1   2   3   4   5   6   7
//             row 0:   c0  c1  c2  c3  c4  c5  c6  c7
//             row 1:   c1  c0  c3  c2  c5  c4  c7  c6
//             row 2:   c2  c3  c0  c1  c6  c7  c4  c5
//
// The XOR permutes chunks only inside an aligned 128-byte line, so each 128-byte piece of a
// global row that cp.async copies lands in one line of shared memory.
template <int kD>
struct SwizzledRows {
  static constexpr int kStride = kD;   // elements per shared-memory row
  static constexpr int kAlign = 128;   // tiles start on 128-byte lines (the XOR stays inside them)
  static constexpr int kRowPeriod = 8;  // rows r and r + 8 share a swizzle
  static_assert(kD % 64 == 0, "the swizzle permutes the 8 chunks of each 128-byte piece of a row");

  // Element offset of chunk `chunk` of row `row`.
  static constexpr int offset(int row, int chunk) { return row * kStride + (chunk ^ (row % 8)) * kChunkElems; }

  // The shared address of the ldmatrix fragment `rows` rows (a multiple of 8) and 16 k16
  // columns (2 k16 chunks) past a lane's chunk, from that chunk's address `lane` (chunk 0 or
  // 1 of its row, as stored). Whole 8-row groups keep the row's swizzle, and chunk c + 2 k16
  // splits into its 128-byte line, k16 / 4 (an offset), and its place in the line,
  // (c ^ r % 8) ^ 2 (k16 % 4): the lane's address XORed with one of four constants, plus an
  // offset that ldmatrix encodes.
  static constexpr uint32_t frag(uint32_t lane, int rows, int k16) {
    return (lane ^ uint32_t(k16 % 4 * 2 * kChunkElems * kElemBytes)) +
           (rows * kStride + k16 / 4 * 8 * kChunkElems) * kElemBytes;
  }
};

// Rows padded by one spare 16-byte chunk (kStride = d + 8) instead of swizzled: row r is
// shifted by 16 r bytes, so chunk c sits in bank group (r + c) mod 8, also free of ldmatrix
// bank conflicts (step 05a reads it with 32-bit loads: row r's word w in bank (4r + w) mod 32). Every fragment is a lane's address plus a compile-time offset, but each
// 128-byte piece of a global row straddles two lines of shared memory.
//
//   bank group (16 B):  0   1   2   3   4   5   6   7
//             row 0:   c0  c1  c2  c3  c4  c5  c6  c7
//             row 1:   c7  c0  c1  c2  c3  c4  c5  c6
//             row 2:   c6  c7  c0  c1  c2  c3  c4  c5
template <int kD>
struct PaddedRows {
  static constexpr int kStride = kD + 8;
  static constexpr int kAlign = 0;      // 16-byte alignment is enough
  static constexpr int kRowPeriod = 1;  // every row: one base plus a constant offset
  static constexpr int offset(int row, int chunk) { return row * kStride + chunk * kChunkElems; }
  static constexpr uint32_t frag(uint32_t lane, int rows, int k16) {
    return lane + (rows * kStride + 2 * k16 * kChunkElems) * kElemBytes;
  }
};

template <int kD_,       // head dim d: each row of Q, K, V, O is d elements
          int kBr_,      // B_r, Q rows per CTA: larger reuses each K_j/V_j more, costs O_i registers
          int kBc_,      // B_c, K/V rows per step: larger amortizes the softmax, costs S_ij registers and smem
          int kWarps_,   // warps per CTA: more warps, fewer rows of Q_i and registers each
          int kStages_,  // (K, V) buffer pairs: 1 = FA2's split schedule (least smem), 2+ = a ring (one barrier per block)
          class Layout_ = SwizzledRows<kD_>>  // how a row's chunks sit in shared memory
struct Tile {
  static constexpr int kD = kD_;
  static constexpr int kBr = kBr_;
  static constexpr int kBc = kBc_;
  static constexpr int kWarps = kWarps_;
  static constexpr int kStages = kStages_;
  using Layout = Layout_;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kWarpRows = kBr / kWarps;  // rows of Q_i (and of S_ij, P_ij, O_i) one warp owns
  static constexpr int kWarpKeys = kBc;           // keys of K_j, V_j one warp reads: all of them
  static constexpr int kElemBytes = fa2::kElemBytes;
  static constexpr int kStride = Layout::kStride;
  // Q_i, (K_j, V_j) x stages, and room to align the first tile
  static constexpr int kSmemBytes = kElemBytes * kStride * (kBr + 2 * kStages * kBc) + Layout::kAlign;

  static_assert(kStages >= 1, "at least one K and one V buffer");
  static_assert(kD % 16 == 0, "d is a whole number of 16-wide mma steps");
};

// Element offset of chunk `chunk` of row `row` in a shared-memory tile of Cfg.
template <class Cfg>
constexpr int tile_offset(int row, int chunk) {
  return Cfg::Layout::offset(row, chunk);
}
// The ldmatrix fragment `rows` rows and 16 k16 columns past a lane's chunk address `lane`.
template <class Cfg>
constexpr uint32_t frag_addr(uint32_t lane, int rows, int k16) {
  return Cfg::Layout::frag(lane, rows, k16);
}

// The tile head dim d runs with (at d = 128 and 256, the tiles FlashAttention-2's own forward
// runs on Hopper). CMakeLists.txt lists the head dims that get a kernel.
template <int kD>
struct TileFor;
template <>
struct TileFor<64> : Tile<64, 128, 128, 4, 2> {};  // 80 KiB smem: 2 CTAs per SM
template <>
struct TileFor<128> : Tile<128, 128, 64, 4, 2> {};  // 96 KiB smem: 2 CTAs per SM
template <>
struct TileFor<256> : Tile<256, 64, 64, 4, 1> {};  // 96 KiB smem: 2 CTAs per SM

// Enqueue the forward kernel for head dim kD. Defined in 05d_fa2_reordered.cuh, instantiated per
// (head dim, dtype) by the generated fa2_instance_d<d>_<dtype>.cu files.
// rescale_log2: lazy rescaling's threshold; -inf rescales O_i after every K/V block, as FA2
// does (the ablation 05_fa2_eager_rescale).
template <typename T, int kD>
void launch_fa2(const AttnProblem& p, const AttnTensors& t, cudaStream_t stream, float rescale_log2 = kRescaleLog2);

}  // namespace attn::fa2
