// Flash-decoding (fa2_decode.cuh) on the host: how the keys are split across CTAs and the
// workspace the partial results take. Plain C++, so the CPU tests check the heuristic.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "05_fa2_reordered/fa2_tiles.h"
#include "common/attention.h"

namespace attn::fa2 {

constexpr int kDecodeMaxNq = 64;          // query rows per head it takes (decode, speculative decoding)
constexpr int kDecodeBc = 64;             // keys per K/V block
constexpr int kDecodeMinSplitKeys = 256;  // fewer keys per split and the combine costs more than it saves
constexpr int kDecodeMaxWaves = 4;  // the split count's search stops at grids of this many waves
constexpr double kDecodeWaveFill = 0.95; // the fewest splits within this share of the best wave efficiency

// The two tiles of the split kernel. Both run 4 warps, and all 128 threads copy K and V.
//  - Narrow, R <= 16 packed rows (Nq = 1 up to 16 query heads per KV head; Nq = 4 at 4):
//    one 16-row mma tile holds them all, so warp 0 computes and warps 1-3 only copy. A
//    3-stage ring keeps two K/V blocks in flight; Q takes 16 rows of shared memory, not 64.
//  - Wide, R > 16: FA2's tile, 16 rows per warp, a 2-stage ring.
template <int kD>
struct DecodeTileNarrow : Tile<kD, 16, kDecodeBc, 1, 3> {
  static constexpr int kThreads = 128;  // 4 warps copy; Tile's kWarps = 1 warp owns rows
};
template <int kD>
using DecodeTileWide = Tile<kD, 64, kDecodeBc, 4, 2>;
constexpr int kDecodeNarrowRows = 16;

// The grid of one decode problem. Rows: the group = H / Hkv query heads sharing a KV head,
// each with its Nq rows, packed into R = group * Nq rows (contiguous in Q and O), taken
// B_r = 16 or 64 at a time (the narrow or wide tile). Keys: split into `splits` ranges of
// keys_per_split (a multiple of kDecodeBc, so that only the last range is ragged).
struct DecodeSplit {
  int rows;            // R = group * Nq
  bool narrow;         // R <= 16: the narrow tile
  int row_blocks;      // ceil(R / B_r)
  int splits;          // key ranges per (batch, KV head, row block); 1: the split kernel writes O
  int keys_per_split;  // multiple of kDecodeBc
};

// The number of splits. The B * Hkv * row_blocks CTAs of an unsplit grid are far fewer than
// the SMs at decode (8 at B = 1, Hkv = 8). Every split multiplies them; CTAs of equal length
// run in waves, so a grid of 1.1 waves takes as long as 2. One CTA per SM already streams K
// and V as fast as two (its ring keeps blocks in flight) and needs half the splits, so a
// wave is sm_count CTAs. Among split counts that leave at least kDecodeMinSplitKeys keys per
// split, take the fewest (longest CTAs, least to combine) whose last wave is nearly as full
// as the best:
//   efficiency(s) = waves(s) / ceil(waves(s)),   waves(s) = CTAs(s) / sm_count
inline DecodeSplit decode_split(const AttnProblem& p, int sm_count) {
  auto ceil_div = [](int64_t a, int64_t b) { return (a + b - 1) / b; };
  DecodeSplit s{};
  s.rows = p.group() * p.Nq;
  s.narrow = s.rows <= kDecodeNarrowRows;
  s.row_blocks = int(ceil_div(s.rows, s.narrow ? kDecodeNarrowRows : DecodeTileWide<64>::kBr));
  const int64_t base = int64_t(p.B) * p.Hkv * s.row_blocks;  // CTAs without a split
  const double slots = std::max(sm_count, 1);  // a wave: one CTA per SM (the ring keeps it busy)
  // At most kDecodeMaxWaves waves: past them any count fills its grid to at least 4/5, and
  // shorter CTAs only add partials to combine. It also keeps this search, run on the host at
  // every launch, to a few dozen steps.
  const int64_t most = std::max<int64_t>(
      1, std::min<int64_t>(p.Nk / kDecodeMinSplitKeys, ceil_div(int64_t(kDecodeMaxWaves * slots), base)));
  auto keys_for = [&](int64_t n) { return ceil_div(ceil_div(p.Nk, n), kDecodeBc) * kDecodeBc; };
  auto efficiency = [&](int64_t splits) {
    const double waves = double(base * splits) / slots;
    return waves / std::ceil(waves);
  };
  double best = 0;
  for (int64_t n = 1; n <= most; ++n) best = std::max(best, efficiency(ceil_div(p.Nk, keys_for(n))));
  for (int64_t n = 1; n <= most; ++n) {
    const int64_t splits = ceil_div(p.Nk, keys_for(n));  // whole blocks per split may drop a few
    if (efficiency(splits) >= kDecodeWaveFill * best) {
      s.keys_per_split = int(keys_for(n));
      s.splits = int(splits);
      break;
    }
  }
  return s;
}

// Whether the current device has programmatic dependent launch (sm_90 on): the combine is
// launched beside the split kernel there, after it elsewhere.
inline bool decode_has_pdl() {
  int device = 0, major = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return major >= 9;
}

// The current device's SM count (132 without one, so that a CPU caller gets an answer).
inline int decode_sm_count() {
  int device = 0, sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess || sms <= 0) {
    cudaGetLastError();  // clear the error: no GPU is not a failure here
    return 132;
  }
  return sms;
}

// Workspace: per packed row and split, the partial O (d fp32, normalized by its own l) and
// its logsumexp (fp32).
inline size_t decode_workspace_bytes(const AttnProblem& p, const DecodeSplit& s) {
  if (s.splits == 1) return 0;  // the split kernel writes O itself
  const size_t rows = size_t(p.B) * p.H * p.Nq;
  return rows * size_t(s.splits) * (size_t(p.d) + 1) * sizeof(float);
}

// Enqueue the split kernel and the combine for head dim kD. Defined in fa2_decode.cuh,
// instantiated per (head dim, dtype) by the generated fa2_decode_instance_d<d>_<dtype>.cu.
template <typename T, int kD>
void launch_fa2_decode(const AttnProblem& p, const AttnTensors& t, cudaStream_t stream);

}  // namespace attn::fa2
