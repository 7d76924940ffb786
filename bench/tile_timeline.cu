// Where a persistent 06d CTA spends its time, tile by tile: 06d's d = 128 bf16 kernel built
// with FA3_TIMELINE, so that thread 0 of each warpgroup stamps the SM clock (clock64) at the
// events of fa3_kernel.cuh's Mark; then the medians over every CTA's tiles.
//
//   build/bench/tile_timeline [--n 4096] [--d 128]      (B = 16384 / N, H = 2048 / d, no mask,
//                                                        N(0,1) inputs)
//
// The kernel is compiled here, not taken from the library (whose build has no marks), and
// runs the same launch path as the 06d Stage (fa3::launch, Schedule::persistent). The marks
// cost a few instructions and stores per tile: compare its time with attn_bench's 06d row.
#define FA3_TIMELINE
#include "06_fa3_hopper/fa3_kernel.cuh"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common/device_buffer.h"
#include "common/harness.h"

namespace attn::fa3 {

constexpr int kMaxCtas = 1024, kMaxSeq = 64, kRoles = 4, kMarks = 6;  // roles: producer, consumers 1..3
__device__ long long g_marks[kMaxCtas][kMaxSeq][kRoles][kMarks];

__device__ void timeline_mark(int seq, Mark m) {
  const int role = threadIdx.x / 128;
  if (threadIdx.x % 128 == 0 && blockIdx.x < kMaxCtas && seq < kMaxSeq && role < kRoles)
    g_marks[blockIdx.x][seq][role][int(m)] = clock64();
}

template void launch<Variant::fa3, 128, __nv_bfloat16>(const AttnProblem&, const AttnTensors&, Schedule, cudaStream_t,
                                                        float);

}  // namespace attn::fa3

namespace {

using namespace attn;

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

int run(int N, int d) {
  if (d != 128) throw AttnError("only d = 128 is built (add an instantiation for others)");
  if (N < 128 || N > 16384) throw AttnError("N must be in [128, 16384] (B = 16384 / N)");
  AttnProblem p;
  p.d = d;
  p.Nq = p.Nk = N;
  p.B = std::max(1, 16384 / N);
  p.H = p.Hkv = 2048 / d;
  DeviceBuffer q(p.q_elems() * 2), k(p.kv_elems() * 2), v(p.kv_elems() * 2), o(p.o_elems() * 2),
      ws(sizeof(int));
  fill_random(q.get(), p.q_elems(), DType::bf16, 1, Fill::normal, 0, 1, nullptr);  // N(0,1), as attn_bench
  fill_random(k.get(), p.kv_elems(), DType::bf16, 2, Fill::normal, 0, 1, nullptr);
  fill_random(v.get(), p.kv_elems(), DType::bf16, 3, Fill::normal, 0, 1, nullptr);
  AttnTensors t;
  t.q = q.get();
  t.k = k.get();
  t.v = v.get();
  t.o = o.get();
  t.workspace = ws.get();
  t.workspace_bytes = ws.bytes();
  auto launch = [&] {
    fa3::launch<fa3::Variant::fa3, 128, __nv_bfloat16>(p, t, fa3::Schedule::persistent, nullptr, fa3::kRescaleLog2);
  };
  // attn_bench's protocol (common/harness.h: time_launch): 0.3 s of warm-up, under the
  // power cap the SM clock settles over tenths of a second; then one run after an L2
  // flush, whose marks are the ones read below.
  HarnessOptions opt;
  L2Flusher flusher;
  const double ms = time_launch(launch, flusher, nullptr, opt.warmup, /*repeats=*/1, opt.max_seconds_per_rung,
                                opt.warm_seconds, TimingMode::flushed)
                        .median_ms;

  using Cfg = fa3::Config<fa3::Variant::fa3, 128, __nv_bfloat16>;
  const int m_blocks = (N + Cfg::B_r - 1) / Cfg::B_r, tiles = m_blocks * p.B * p.H;
  const int ctas = int(fa3::grid_size(tiles, fa3::Schedule::persistent, /*ctas_per_sm=*/1));  // as the launch
  if (ctas > fa3::kMaxCtas) throw AttnError("more CTAs than the marks hold");
  const int n_blocks = (N + Cfg::B_c - 1) / Cfg::B_c;
  std::vector<long long> stamps(sizeof(fa3::g_marks) / sizeof(long long));
  CUDA_CHECK(cudaMemcpyFromSymbol(stamps.data(), fa3::g_marks, sizeof(fa3::g_marks)));
  using M = fa3::Mark;
  auto mark = [&](int cta, int seq, int role, M m) {  // cycles
    return double(stamps[((size_t(cta) * fa3::kMaxSeq + seq) * fa3::kRoles + role) * fa3::kMarks + int(m)]);
  };

  // Cycles per microsecond: CTA 0's span (its first Q issue to its last output) over the
  // kernel's time, a slight overestimate of the clock (the kernel also starts and drains).
  const int seqs0 = (tiles + ctas - 1) / ctas;  // CTA 0's tiles
  if (seqs0 > fa3::kMaxSeq) throw AttnError("more tiles per CTA than the marks hold");
  const double span = mark(0, seqs0 - 1, 1, M::output_done) - mark(0, 0, 0, M::q_issued);
  const double cyc_per_us = span / (ms * 1e3);

  enum { kQWait, kBlock0, kBlock, kLastPv, kOutput, kTile, kPhases };
  const char* names[kPhases] = {"end of last tile -> Q_i ready", "block 0 (Q K_0^T, softmax)",
                                "each of blocks 1 .. n-1",        "last P V",
                                "epilogue (O / l, stores)",       "whole tile"};
  std::vector<double> ph[kPhases];
  for (int c = 0; c < ctas; ++c)
    for (int seq = 0; seq < fa3::kMaxSeq && c + seq * ctas < tiles; ++seq)
      for (int role = 1; role <= Cfg::kConsumers; ++role) {
        auto at = [&](M m) { return mark(c, seq, role, m); };
        if (seq > 0) {
          const double prev_out = mark(c, seq - 1, role, M::output_done);
          ph[kQWait].push_back(at(M::q_ready) - prev_out);
          ph[kTile].push_back(at(M::output_done) - prev_out);
        }
        ph[kBlock0].push_back(at(M::block0_done) - at(M::q_ready));
        if (n_blocks > 1) ph[kBlock].push_back((at(M::loop_done) - at(M::block0_done)) / (n_blocks - 1));
        ph[kLastPv].push_back(at(M::last_pv_done) - at(M::loop_done));
        ph[kOutput].push_back(at(M::output_done) - at(M::last_pv_done));
      }
  std::printf("06d d = %d, N = %d (B = %d, H = %d), no mask: %d tiles of %d K/V blocks (B_c = %d) on %d CTAs\n", d, N,
              p.B, p.H, tiles, n_blocks, Cfg::B_c, ctas);
  std::printf("kernel %.3f ms (one launch after an L2 flush, after 0.3 s of launches); SM clock ~%.0f MHz (CTA 0's cycles over that time)\n", ms,
              cyc_per_us);
  std::printf("medians over every consumer warpgroup's tiles:\n");
  for (int i = 0; i < kPhases; ++i)
    std::printf("  %-32s %8.2f us  (%.0f cycles)\n", names[i], median(ph[i]) / cyc_per_us, median(ph[i]));
  const double blocks_us = n_blocks * median(ph[kBlock]) / cyc_per_us, tile_us = median(ph[kTile]) / cyc_per_us;
  std::printf("a tile beyond n x (one steady block): %.2f us of %.2f (%.1f %%)\n", tile_us - blocks_us, tile_us,
              100 * (tile_us - blocks_us) / tile_us);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int N = 4096, d = 128;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--n" && i + 1 < argc) N = std::atoi(argv[++i]);
    else if (a == "--d" && i + 1 < argc) d = std::atoi(argv[++i]);
    else {
      std::fprintf(stderr, "usage: tile_timeline [--n N] [--d 128]\n");
      return 2;
    }
  }
  try {
    return run(N, d);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tile_timeline: %s\n", e.what());
    return 1;
  }
}
