// Flash-decoding (fa2_decode.cuh) on the host: how the keys are split across CTAs and the
// workspace the partial results take. Plain C++, so the CPU tests check the heuristic.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "05_fa2_reordered/fa2_tiles.h"
#include "common/attention.h"

namespace attn::fa2 {

constexpr int kDecodeMaxNq = 64;          // query rows per head it takes (decode, speculative decoding)
constexpr int kDecodeBc = 64;             // keys per K/V block
constexpr int kDecodeMinSplitKeys = 256;  // fewer keys per split and the combine costs more than it saves
constexpr int kDecodeMaxWaves = 4;  // the split count's search stops at grids of this many waves
constexpr double kDecodeWaveFill = 0.95; // the fewest splits whose grid takes at most 1/0.95 of the best's time
// The latency of a load while the HBM streams near its peak (the model's one constant that no
// device property gives). Idle, a Hopper DRAM load takes well under a microsecond; at full
// bandwidth the requests queue and each waits longer. `attn_bench --inflight` measures it on
// the GPU at hand (the bytes in flight per SM at the curve's knee times SMs over bandwidth);
// ATTN_DECODE_LATENCY_NS overrides it with such a measurement.
constexpr double kDecodeLoadedLatencyNs = 2000;

// The two tiles of the split kernel. Both run 4 warps, and all 128 threads copy K and V.
//  - Narrow, R <= 16 packed rows (Nq = 1 up to 16 query heads per KV head; Nq = 4 at 4):
//    one 16-row mma tile holds them all, so the warps split each block's keys instead: warp w
//    computes all rows against keys 16w..16w+15 of every block, with its own online softmax
//    (m, l, O), and the four states are merged once, at the end, as the combine merges splits.
//    A ring of kStages K/V blocks (3 or 4, decode_split picks) keeps kStages - 1 blocks in
//    flight; Q takes 16 rows of shared memory, not 64.
//  - Wide, R > 16: FA2's tile, 16 rows per warp, all keys each, a 2-stage ring.
// WarpView is the tile one warp computes on (its rows and keys of a block); kKeyWarps the
// warps that split a block's keys.
template <int kD, int kStages>
struct DecodeTileNarrow : Tile<kD, 16, kDecodeBc, 1, kStages> {
  static constexpr int kThreads = 128;  // 4 warps copy, and compute a quarter of the keys each
  static constexpr int kKeyWarps = 4;
  using WarpView = Tile<kD, 16, kDecodeBc / kKeyWarps, 1, kStages>;
};
template <int kD>
struct DecodeTileWide : Tile<kD, 64, kDecodeBc, 4, 2> {
  static constexpr int kKeyWarps = 1;
  using WarpView = DecodeTileWide;  // FA2's split: each warp computes on the tile's own rows
};
constexpr int kDecodeNarrowRows = 16;
constexpr int kDecodeWideRows = 64;
constexpr int kDecodeNarrowStages[] = {3, 4};  // the ring depths instantiated for the narrow tile
constexpr int kDecodeWideStages = 2;

// Shared memory of a decode tile (Tile::kSmemBytes: swizzled rows of d elements, Q then the
// ring, plus room to align); the CPU model uses it, static_asserts in fa2_decode.cuh tie it
// to the tiles.
constexpr int decode_smem_bytes(int d, int rows, int stages) {
  return kElemBytes * d * (rows + 2 * stages * kDecodeBc) + SwizzledRows<64>::kAlign;
}

// What the split count and the ring depth are derived from: properties of the device (and
// one latency, above), never its name.
struct DecodeDevice {
  int sm_count = 132;
  double bandwidth = 3.35e12;            // bytes/s: 2 (double data rate) x memory clock x bus width / 8
  double latency_s = kDecodeLoadedLatencyNs * 1e-9;
  int smem_per_sm = 228 * 1024;          // cudaDevAttrMaxSharedMemoryPerMultiprocessor
  int smem_per_block = 227 * 1024;       // cudaDevAttrMaxSharedMemoryPerBlockOptin
  int smem_reserved_per_block = 1024;    // cudaDevAttrReservedSharedMemoryPerBlock

  // Little's law: to stream at `bandwidth` when each load takes `latency_s`, the GPU must have
  // bandwidth x latency bytes requested and not yet arrived; each SM its share.
  double bytes_in_flight_per_sm() const { return bandwidth * latency_s / std::max(sm_count, 1); }
  // CTAs of `smem` bytes that fit one SM (0: not even one block fits).
  int ctas_per_sm(int smem) const {
    if (smem > smem_per_block) return 0;
    return smem_per_sm / (smem + smem_reserved_per_block);
  }
};

// The current device's model from its attributes (the defaults above, H100 SXM-like, without
// a GPU, so that a CPU caller gets an answer); the latency from ATTN_DECODE_LATENCY_NS when
// set. A few attribute reads: cheap enough for every launch, and a graph captures none.
inline DecodeDevice decode_device() {
  DecodeDevice dev;
  if (const char* ns = std::getenv("ATTN_DECODE_LATENCY_NS")) {
    const double v = std::atof(ns);
    if (v > 0) dev.latency_s = v * 1e-9;
  }
  int device = 0, sms = 0, mem_khz = 0, bus_bits = 0, smem_sm = 0, smem_block = 0, reserved = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&mem_khz, cudaDevAttrMemoryClockRate, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&smem_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&smem_block, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&reserved, cudaDevAttrReservedSharedMemoryPerBlock, device) != cudaSuccess) {
    cudaGetLastError();  // clear the error: no GPU is not a failure here
    return dev;
  }
  if (sms > 0) dev.sm_count = sms;
  if (mem_khz > 0 && bus_bits > 0) dev.bandwidth = 2.0 * mem_khz * 1e3 * bus_bits / 8;
  if (smem_sm > 0) dev.smem_per_sm = smem_sm;
  if (smem_block > 0) dev.smem_per_block = smem_block;
  dev.smem_reserved_per_block = reserved;
  return dev;
}

// The grid of one decode problem. Rows: the group = H / Hkv query heads sharing a KV head,
// each with its Nq rows, packed into R = group * Nq rows (contiguous in Q and O), taken
// B_r = 16 or 64 at a time (the narrow or wide tile). Keys: split into `splits` ranges of
// keys_per_split (a multiple of kDecodeBc, so that only the last range is ragged).
struct DecodeSplit {
  int rows;            // R = group * Nq
  bool narrow;         // R <= 16: the narrow tile
  int row_blocks;      // ceil(R / B_r)
  int stages;          // the K/V ring's depth: stages - 1 blocks in flight per CTA
  int ctas_per_sm;     // CTAs each SM must run at once to keep bytes_in_flight_per_sm requested
  int splits;          // key ranges per (batch, KV head, row block); 1: the split kernel writes O
  int keys_per_split;  // multiple of kDecodeBc
};

// The ring depth and CTAs per SM. A CTA keeps (stages - 1) K + V blocks of 2 * B_c * d
// elements requested ahead of the one it computes; c CTAs on an SM keep c times that. Take
// the shallowest ring (least shared memory), then the fewest CTAs per SM (fewest splits) that
// fit the SM and reach the device's bytes_in_flight_per_sm; more CTAs before a deeper ring,
// because each narrow CTA computes on one warp, and two CTAs overlap two warps' math as well
// as their copies. None reaching it: the most bytes in flight that fit.
inline void decode_pipeline(const DecodeDevice& dev, int d, bool narrow, int& stages, int& ctas_per_sm) {
  const double need = dev.bytes_in_flight_per_sm();
  const double block = 2.0 * kDecodeBc * d * kElemBytes;  // K_j and V_j
  const int rows = narrow ? kDecodeNarrowRows : kDecodeWideRows;
  double most = -1;
  auto consider = [&](int s) {  // true once ring depth s reaches `need`
    const int fit = dev.ctas_per_sm(decode_smem_bytes(d, rows, s));
    for (int c = 1; c <= fit; ++c) {
      const double in_flight = c * (s - 1) * block;
      if (in_flight >= need) {
        stages = s, ctas_per_sm = c;
        return true;
      }
      if (in_flight > most) most = in_flight, stages = s, ctas_per_sm = c;
    }
    return false;
  };
  stages = narrow ? kDecodeNarrowStages[0] : kDecodeWideStages, ctas_per_sm = 1;
  if (!narrow) {
    consider(kDecodeWideStages);
    return;
  }
  for (int s : kDecodeNarrowStages)
    if (consider(s)) return;
}

// The number of splits. The B * Hkv * row_blocks CTAs of an unsplit grid are far fewer than
// the SMs at decode (8 at B = 1, Hkv = 8). Every split multiplies them; CTAs run in waves, so
// a grid of 1.1 waves takes as long as 2, and each wave as long as its longest CTA: a split of
// keys_per_split keys (the last split may be shorter, never longer). A wave is ctas_per_sm x
// SMs CTAs (decode_pipeline: what keeps each SM's share of bytes in flight). Among split counts
// that leave at least kDecodeMinSplitKeys keys per split, take the fewest (longest CTAs, least
// to combine) whose grid takes nearly as little time as the best:
//   time(s) ~ ceil(CTAs(s) / (ctas_per_sm * sm_count)) * keys_per_split(s)
inline DecodeSplit decode_split(const AttnProblem& p, const DecodeDevice& dev) {
  auto ceil_div = [](int64_t a, int64_t b) { return (a + b - 1) / b; };
  DecodeSplit s{};
  s.rows = p.group() * p.Nq;
  s.narrow = s.rows <= kDecodeNarrowRows;
  s.row_blocks = int(ceil_div(s.rows, s.narrow ? kDecodeNarrowRows : kDecodeWideRows));
  decode_pipeline(dev, p.d, s.narrow, s.stages, s.ctas_per_sm);
  const int64_t base = int64_t(p.B) * p.Hkv * s.row_blocks;  // CTAs without a split
  const double slots = double(std::max(dev.sm_count, 1)) * s.ctas_per_sm;  // a wave
  // At most kDecodeMaxWaves waves: past them any count fills its grid to at least 4/5, and
  // shorter CTAs only add partials to combine. It also keeps this search, run on the host at
  // every launch, to a few dozen steps.
  const int64_t most = std::max<int64_t>(
      1, std::min<int64_t>(p.Nk / kDecodeMinSplitKeys, ceil_div(int64_t(kDecodeMaxWaves * slots), base)));
  auto keys_for = [&](int64_t n) { return ceil_div(ceil_div(p.Nk, n), kDecodeBc) * kDecodeBc; };
  auto time = [&](int64_t n) {  // in keys streamed by one CTA: waves x the longest CTA's keys
    const int64_t splits = ceil_div(p.Nk, keys_for(n));
    return double(ceil_div(base * splits, int64_t(slots))) * double(keys_for(n));
  };
  double best = time(1);
  for (int64_t n = 2; n <= most; ++n) best = std::min(best, time(n));
  for (int64_t n = 1; n <= most; ++n) {
    const int64_t splits = ceil_div(p.Nk, keys_for(n));  // whole blocks per split may drop a few
    if (kDecodeWaveFill * time(n) <= best) {
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

// Workspace: per packed row and split, the partial O (d fp32, normalized by its own l) and
// its logsumexp (fp32).
inline size_t decode_workspace_bytes(const AttnProblem& p, const DecodeSplit& s) {
  if (s.splits == 1) return 0;  // the split kernel writes O itself
  const size_t rows = size_t(p.B) * p.H * p.Nq;
  return rows * size_t(s.splits) * (size_t(p.d) + 1) * sizeof(float);
}

// ---- the paged KV cache ----
//
// K and V live in pages of page_size tokens shared by every sequence:
//   k_cache, v_cache [num_pages, page_size, Hkv, d]     (vLLM's and FlashAttention's layout)
//   block_table      [B, max_pages] int32: sequence b's token n is in page block_table[b][n / page_size],
//                                          slot n % page_size
//   seq_lens         [B] int32: sequence b's length Nk_b, 0 <= Nk_b <= max_pages * page_size
// One token's Hkv * d elements are contiguous, so a KV head's row is d contiguous elements
// (256 bytes at d = 128, bf16: whole 128-byte lines, as the contiguous cache's rows) strided
// Hkv * d apart; a page may hold any sequence's tokens. The block table and the lengths live
// on the device (a CUDA graph replays with new ones), so the host sizes the grid for the
// capacity max_pages * page_size and CTAs past a sequence's end write an empty partial.
struct PagedKV {
  const void* k_cache = nullptr;
  const void* v_cache = nullptr;
  const int* block_table = nullptr;
  const int* seq_lens = nullptr;
  int num_pages = 0, page_size = 0, max_pages = 0;
};
constexpr int kPageSizeMin = 1;  // any page size works (each row looks its page up); 16-256 is the usual range
constexpr int kPageSizeMax = 1 << 16;

// log2(n) where n > 0 is a power of two, else -1: the page size's and H_kv's shifts, which the
// kernel takes instead of a division where they are >= 0 (fa2_decode.cuh: shift_or_divide).
inline int shift_for(int n) { return n > 0 && (n & (n - 1)) == 0 ? __builtin_ctz(unsigned(n)) : -1; }

// Bad tables and lengths are found on the device (the host cannot read them without a
// synchronization a CUDA graph forbids). Each CTA checks its sequence's length and every page
// index its keys use, and each copy checks its own page: a bad one is never dereferenced, and
// the CTA writes NaN (O and lse). The faults land in records at the head of the workspace, one
// per (sequence b, split s), each written by the first CTA of that pair (KV head 0, row block
// 0) whether it found a fault or not. So the launch zeroes nothing: a memset before the kernel
// would be one more node in a graph, about a microsecond and a half of a short step.
// decode_paged_check reads the records after the work is done and reports the first fault
// (lowest b, then lowest column).
enum PagedError : int { kBadLength = 1, kLengthBeyondPages = 2, kPageOutOfRange = 4 };
struct PagedErrorWord {
  int flags;     // one PagedError bit, or 0: no fault
  int sequence;  // b
  int position;  // its block-table column (kPageOutOfRange), or -1
  int value;     // the bad length or page index
};
// The records of B sequences by `splits`, padded so the partials after them stay aligned.
inline size_t paged_header_bytes(int B, int splits) {
  const size_t bytes = size_t(B) * size_t(splits) * sizeof(PagedErrorWord);
  return (bytes + 255) / 256 * 256;
}

// The paged problem as AttnProblem: Nk is the capacity max_pages * page_size (the grid's keys).
inline size_t decode_paged_workspace_bytes(const AttnProblem& p, const DecodeSplit& s) {
  return paged_header_bytes(p.B, s.splits) + decode_workspace_bytes(p, s);
}

// The first fault among n records in (b, split) order (flags == 0: none).
inline PagedErrorWord first_paged_error(const PagedErrorWord* records, size_t n) {
  for (size_t i = 0; i < n; ++i)
    if (records[i].flags != 0) return records[i];
  return PagedErrorWord{0, 0, 0, 0};
}

// A fault record's message ("" when flags == 0).
inline std::string paged_error_message(const PagedErrorWord& e, int page_size, int max_pages, int num_pages) {
  if (e.flags == 0) return "";
  std::string what;
  if (e.flags & kBadLength) what = "seq_lens[" + std::to_string(e.sequence) + "] = " + std::to_string(e.value) +
                                   " is negative";
  else if (e.flags & kLengthBeyondPages)
    what = "seq_lens[" + std::to_string(e.sequence) + "] = " + std::to_string(e.value) + " is beyond the " +
           std::to_string(max_pages) + " pages of " + std::to_string(page_size) + " tokens the block table gives (" +
           std::to_string(int64_t(max_pages) * page_size) + " tokens)";
  else
    what = "block_table[" + std::to_string(e.sequence) + "][" + std::to_string(e.position) + "] = " +
           std::to_string(e.value) + " is not a page index in [0, " + std::to_string(num_pages) + ")";
  return "bad paged KV cache: " + what + "; its outputs were set to NaN and no page outside the cache was read";
}

// Enqueue the split kernel and the combine for head dim kD. Defined in fa2_decode.cuh,
// instantiated per (head dim, dtype) by the generated fa2_decode_instance_d<d>_<dtype>.cu.
template <typename T, int kD>
void launch_fa2_decode(const AttnProblem& p, const AttnTensors& t, cudaStream_t stream);
// The same on a paged cache (t.k, t.v unused; t.workspace of decode_paged_workspace_bytes).
template <typename T, int kD>
void launch_fa2_decode_paged(const AttnProblem& p, const PagedKV& kv, const AttnTensors& t, cudaStream_t stream);

// The paged decode, validated and dispatched (stages.cu): refuses, with AttnError, what the
// host can see (shapes, page size, dtype, head dim, pointers) before any launch.
void run_decode_paged(const AttnProblem& p, const PagedKV& kv, const AttnTensors& t, cudaStream_t stream);
size_t decode_paged_workspace(const AttnProblem& p);  // validates too
// The fault records' count in the workspace's head: B x the split count of this device.
size_t decode_paged_records(const AttnProblem& p);

}  // namespace attn::fa2
