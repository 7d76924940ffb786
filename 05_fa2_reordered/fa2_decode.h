// Flash-decoding (fa2_decode.cuh) on the host: how the keys are split across CTAs and the
// workspace the partial results take. Plain C++, so the CPU tests check the heuristic.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "common/attention.h"

namespace attn::fa2 {

constexpr int kDecodeMaxNq = 64;        // query rows per head it takes (decode, speculative decoding)
constexpr int kDecodeBr = 64;           // packed rows (query heads x query rows) per CTA
constexpr int kDecodeBc = 64;           // keys per K/V block
constexpr int kDecodeCtasPerSm = 2;     // resident CTAs per SM its shared memory allows (d <= 128)
constexpr int kDecodeWaves = 2;         // CTAs wanted in flight: this many full waves
constexpr int kDecodeMinSplitKeys = 256;  // fewer keys per split and the combine costs more than it saves

// The grid of one decode problem. Rows: the group = H / Hkv query heads sharing a KV head,
// each with its Nq rows, packed into R = group * Nq rows (contiguous in Q and O), taken
// kDecodeBr at a time. Keys: split into `splits` ranges of keys_per_split (a multiple of
// kDecodeBc, so that only the last range is ragged).
struct DecodeSplit {
  int rows;            // R = group * Nq
  int row_blocks;      // ceil(R / kDecodeBr)
  int splits;          // key ranges per (batch, KV head, row block)
  int keys_per_split;  // multiple of kDecodeBc
};

// Enough splits for kDecodeWaves waves of CTAs over sm_count SMs, at least
// kDecodeMinSplitKeys keys in each.
inline DecodeSplit decode_split(const AttnProblem& p, int sm_count) {
  auto ceil_div = [](int64_t a, int64_t b) { return (a + b - 1) / b; };
  DecodeSplit s{};
  s.rows = p.group() * p.Nq;
  s.row_blocks = int(ceil_div(s.rows, kDecodeBr));
  const int64_t base = int64_t(p.B) * p.Hkv * s.row_blocks;  // CTAs without a split
  const int64_t want = ceil_div(int64_t(kDecodeWaves) * kDecodeCtasPerSm * std::max(sm_count, 1), base);
  const int64_t most = std::max<int64_t>(1, p.Nk / kDecodeMinSplitKeys);
  const int64_t splits = std::clamp<int64_t>(want, 1, most);
  s.keys_per_split = int(ceil_div(ceil_div(p.Nk, splits), kDecodeBc) * kDecodeBc);
  s.splits = int(ceil_div(p.Nk, s.keys_per_split));
  return s;
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
  const size_t rows = size_t(p.B) * p.H * p.Nq;
  return rows * size_t(s.splits) * (size_t(p.d) + 1) * sizeof(float);
}

// Enqueue the split kernel and the combine for head dim kD. Defined in fa2_decode.cuh,
// instantiated per (head dim, dtype) by the generated fa2_decode_instance_d<d>_<dtype>.cu.
template <typename T, int kD>
void launch_fa2_decode(const AttnProblem& p, const AttnTensors& t, cudaStream_t stream);

}  // namespace attn::fa2
