// Device building blocks of the softmax kernels of 01, 02 and 03a: one warp per row of S,
// the row streamed in chunks with 64 bytes of loads in flight per lane.
//
// A step of the walk over row S_i (Width = 4, Unroll = 4 shown):
//
//   columns  base ..                                               .. base + Step - 1
//            | u=0: lane0 lane1 .. lane31 | u=1: lane0 .. lane31 | u=2 .. | u=3 .. |
//              └ Width columns each, so every load instruction of the warp reads
//                32·Width contiguous floats (coalesced)
//
// Only the visible prefix [0, n) of a row is read: causal masking (bottom-right aligned)
// hides the keys j > i + (Nk - Nq), and a masked column reads as -inf, so exp() makes it 0.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>

#include "common/attention.h"
#include "common/device_math.cuh"

namespace attn::softmax_rows {

constexpr int kWarpSize = 32;
constexpr unsigned kFullWarp = 0xffffffffu;
constexpr int64_t kMaxBlocks = INT_MAX;  // grid.x limit; rows past it are walked grid-stride

// How a kernel walks its rows; every softmax kernel here takes one as a template parameter.
template <int Width_, int Unroll_, int WarpsPerBlock_>
struct RowWalk {
  static constexpr int Width = Width_;    // floats per load: 4 = one float4 (needs 16-byte aligned rows)
  static constexpr int Unroll = Unroll_;  // loads in flight per lane: more hides HBM latency, costs registers
  static constexpr int WarpsPerBlock = WarpsPerBlock_;  // rows per block: more = fewer blocks, coarser tail
  static constexpr int Threads = WarpsPerBlock * kWarpSize;
  static constexpr int Chunk = Width * Unroll;  // floats a lane holds per step
  static constexpr int Step = kWarpSize * Chunk;  // columns a warp covers per step
};
// Nk % 4 == 0: every row starts 16-byte aligned, so float4 loads; 64 bytes in flight per lane.
using VectorWalk = RowWalk<4, 4, 8>;
// Any Nk: one float per load, the same 64 bytes in flight per lane.
using ScalarWalk = RowWalk<1, 16, 8>;

// Calls launch(Walk{}) with the widest walk the rows' alignment allows.
template <typename F>
void with_row_walk(int Nk, F&& launch) {
  if (Nk % VectorWalk::Width == 0)
    launch(VectorWalk{});
  else
    launch(ScalarWalk{});
}

// The rows of S (and P) a softmax walks: B·H·Nq rows of Nk scores in [B, H, Nq, Nk] order,
// so row r is query row i = r mod Nq of its head.
struct ScoreRows {
  int64_t count = 0;
  int Nq = 1;
  int Nk = 1;
  bool causal = false;

  // Keys row r sees: the prefix [0, visible) (bottom-right aligned causal mask).
  __device__ int64_t visible(int64_t r) const {
    if (!causal) return Nk;
    const int64_t last = r % Nq + (int64_t(Nk) - Nq);  // of query row i = r mod Nq; <= Nk - 1 as i < Nq
    return last < 0 ? 0 : last + 1;
  }
};

inline ScoreRows score_rows(const AttnProblem& p) {
  return ScoreRows{int64_t(p.B) * p.H * p.Nq, p.Nq, p.Nk, p.causal};
}

template <typename Walk>
dim3 row_grid(const ScoreRows& rows) {
  return dim3(unsigned(std::min<int64_t>((rows.count + Walk::WarpsPerBlock - 1) / Walk::WarpsPerBlock, kMaxBlocks)));
}

// Warp w of the grid owns rows w, w + (warps in the grid), ...
__device__ inline int64_t first_row() { return (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / kWarpSize; }
__device__ inline int64_t row_stride() { return int64_t(gridDim.x) * blockDim.x / kWarpSize; }
__device__ inline int lane() { return threadIdx.x % kWarpSize; }

// Row reductions across the warp: group_max / group_sum (common/device_math.cuh).

// Width elements moved by one load or store instruction.
template <typename T, int Width>
struct alignas(Width * sizeof(T)) Vec {
  T v[Width];
};

// First column of the u-th vector this lane holds in the step starting at `base`.
template <typename Walk>
__device__ inline int64_t column(int64_t base, int u) {
  return base + int64_t(u * kWarpSize + lane()) * Walk::Width;
}

// This lane's chunk of S_i for the step at `base`; columns at or past n read as -inf and are
// never loaded. (With Width = 4, Nk % 4 == 0, so a vector that starts below n <= Nk ends
// inside the row.)
template <typename Walk>
__device__ inline void load_chunk(const float* S_i, int64_t base, int64_t n, float (&s)[Walk::Chunk]) {
#pragma unroll
  for (int u = 0; u < Walk::Unroll; ++u) {
    const int64_t c = column<Walk>(base, u);
    Vec<float, Walk::Width> S_ij{};
    if (c < n) S_ij = *reinterpret_cast<const Vec<float, Walk::Width>*>(S_i + c);
#pragma unroll
    for (int k = 0; k < Walk::Width; ++k) s[u * Walk::Width + k] = c + k < n ? S_ij.v[k] : -INFINITY;
  }
}

// Calls f(chunk) for every step over the visible prefix [0, n) of S_i.
template <typename Walk, typename F>
__device__ inline void for_each_chunk(const float* S_i, int64_t n, F&& f) {
  for (int64_t base = 0; base < n; base += Walk::Step) {
    float s[Walk::Chunk];
    load_chunk<Walk>(S_i, base, n, s);
    f(s);
  }
}

}  // namespace attn::softmax_rows
