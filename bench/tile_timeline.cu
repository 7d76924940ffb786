// Where a persistent 06d CTA spends its time, tile by tile: 06d's d = 128 kernel (bf16, or
// with --fp8 the FP8 attention kernel) built with FA3_TIMELINE, so that thread 0 of each
// warpgroup stamps the SM clock (clock64) at the events of fa3_common.cuh's Mark; then the
// medians over every CTA's tiles, and, for the middle K/V block of each tile, where the
// block's time goes (the steps of overlapped_blocks). A clock read is not a scheduling
// fence, so the steps are named in the order the SASS has them: the wait for P V_j-1
// follows the softmax of S_ij (06d1.md; scripts/sass_order.py checks it), and the mark
// written after that wait closes one step, "softmax of S_ij, P V_j-1 lands" (cuobjdump
// -sass build/bench/tile_timeline: the CS2R ... SR_CLOCKLO). A mark between the softmax
// and the wait would hold the softmax there (measured: that order is another kernel), so
// there is none.
//
//   build/bench/tile_timeline [--n 4096] [--fp8]      (B = 16384 / N, H = 16, d = 128, no
//                                                     mask, N(0,1) inputs)
//
// The kernel is compiled here, not taken from the library (whose build has no marks), and
// runs the same launch path as the 06d and 06_fp8 Stages (Schedule::persistent; for FP8 the
// attention kernel alone, after one run of the pre-kernel). The marks cost a few
// instructions and stores per tile: compare its time with attn_bench's row.
//
//   build/bench/tile_timeline --backward [--n 2048]   (the same shapes, d = 128 and 64)
//
// Where a backward CTA of 06k and of 06l spends its time (fa3_common.cuh's BwdMark, stamped
// by the first consumer thread): its start, K_j and V_j landed, the first ring stage, the
// steps, the epilogue (dK_j, dV_j stored), the last dQ add; and the gap between two CTAs on
// one SM (the next CTA's start after the last one's end, on the SM's own clock). 06l_bwd.md
// quotes it.
#define FA3_TIMELINE
#include "06_fa3_hopper/06d_fa3.cuh"
#include "06_fa3_hopper/06k_bwd_tall_steps.cuh"
#include "06_fa3_hopper/06l_bwd_tma_store.cuh"
#include "06_fa3_hopper/fp8h_fa3.cuh"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common/device_buffer.h"
#include "bench/harness.h"

namespace attn::fa3 {

constexpr int kMaxCtas = 1024, kMaxSeq = 64, kRoles = 4;  // roles: producer, consumers 1..3
constexpr int kMarks = int(Mark::block_end) + 1;             // every Mark, block_end the last
__device__ long long g_marks[kMaxCtas][kMaxSeq][kRoles][kMarks];

__device__ void timeline_mark(int seq, Mark m) {
  const int role = threadIdx.x / 128;
  if (threadIdx.x % 128 == 0 && blockIdx.x < kMaxCtas && seq < kMaxSeq && role < kRoles)
    g_marks[blockIdx.x][seq][role][int(m)] = clock64();
}

// 06d's d = 128 instance, as the library has it (no CTA pairs' code at d = 128).
constexpr bool kPairs128 = cta_pairs_code_in_06d(128);
template void step06d::launch<128, __nv_bfloat16, kPairs128>(const AttnProblem&, const AttnTensors&, Schedule,
                                                              cudaStream_t, float);
template void launch_fp8_quantize<128>(const AttnProblem&, const AttnTensors&, const Fp8Options&, cudaStream_t);
template void launch_fp8_attention<128>(const AttnProblem&, const AttnTensors&, Schedule, cudaStream_t);

constexpr int kMaxBwdCtas = 1 << 13, kBwdMarks = int(BwdMark::cta_done) + 1;
__device__ long long g_bwd_marks[kMaxBwdCtas][kBwdMarks];
__device__ unsigned g_bwd_sm[kMaxBwdCtas];

__device__ void bwd_timeline_mark(BwdMark m) {
  if (threadIdx.x != 128 || blockIdx.x >= kMaxBwdCtas) return;  // consumer warpgroup 0's first thread
  g_bwd_marks[blockIdx.x][int(m)] = clock64();
  if (m == BwdMark::cta_start) {
    unsigned sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    g_bwd_sm[blockIdx.x] = sm;
  }
}

// The backward steps 06k and 06l at both head dims, as the library has them.
template void step06k::launch_backward<64, __nv_bfloat16>(const AttnProblem&, const AttnBwdTensors&, cudaStream_t);
template void step06k::launch_backward<128, __nv_bfloat16>(const AttnProblem&, const AttnBwdTensors&, cudaStream_t);
template void step06l::launch_backward<64, __nv_bfloat16>(const AttnProblem&, const AttnBwdTensors&, cudaStream_t);
template void step06l::launch_backward<128, __nv_bfloat16>(const AttnProblem&, const AttnBwdTensors&, cudaStream_t);

}  // namespace attn::fa3

namespace {

using namespace attn;

const char* mark_name(attn::fa3::Mark m) {
  using M = attn::fa3::Mark;
  switch (m) {
    case M::block_begin: return "block_begin";
    case M::k_ready: return "k_ready";
    case M::turn_taken: return "turn_taken";
    case M::s_issued: return "s_issued";
    case M::gemms_issued: return "gemms_issued";
    case M::s_landed: return "s_landed";
    case M::pv_landed: return "pv_landed";
    case M::block_end: return "block_end";
    default: return "?";
  }
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

// attn_bench's protocol (bench/harness.h: time_launch): 0.3 s of warm-up, under the power
// cap the SM clock settles over tenths of a second; then one run after an L2 flush, whose
// marks are the ones read afterwards. Its time in ms.
template <class Launch>
double time_marked_launch(Launch&& launch) {
  HarnessOptions opt;
  L2Flusher flusher;
  return time_launch(launch, flusher, nullptr, opt.warmup, /*repeats=*/1, opt.max_seconds_per_rung, opt.warm_seconds,
                     TimingMode::flushed)
      .median_ms;
}

// The timeline of one kernel: Cfg its tile configuration, `launch` one launch of it.
template <class Cfg, class Launch>
int report(const char* name, const AttnProblem& p, Launch&& launch) {
  const double ms = time_marked_launch(launch);

  const int N = p.Nq, m_blocks = (N + Cfg::B_r - 1) / Cfg::B_r, tiles = m_blocks * p.B * p.H;
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
  // kernel's time, a slight underestimate of the clock (the kernel also starts and drains), so
  // the microseconds below run a little long; the cycles are what the lessons quote.
  const int seqs0 = (tiles + ctas - 1) / ctas;  // CTA 0's tiles
  if (seqs0 > fa3::kMaxSeq) throw AttnError("more tiles per CTA than the marks hold");
  const double span = mark(0, seqs0 - 1, 1, M::output_done) - mark(0, 0, 0, M::q_issued);
  const double cyc_per_us = span / (ms * 1e3);

  // Per tile, then inside its middle K/V block (overlapped_blocks' steps, in SASS order).
  struct Phase {
    const char* name;
    M from, to;
    bool previous_tile;  // `from` is the previous tile's mark
  };
  const Phase tile_phases[] = {
      {"end of last tile -> Q_i ready", M::output_done, M::q_ready, true},
      {"block 0 (Q K_0^T, softmax)", M::q_ready, M::block0_done, false},
      {"last P V", M::loop_done, M::last_pv_done, false},
      {"epilogue (O / l, stores)", M::last_pv_done, M::output_done, false},
      {"whole tile", M::output_done, M::output_done, true},
  };
  const Phase& whole_tile = tile_phases[4];
  const Phase block_phases[] = {
      {"K_j ready", M::block_begin, M::k_ready, false},
      {"the turn", M::k_ready, M::turn_taken, false},
      {"issue S_ij", M::turn_taken, M::s_issued, false},
      {"V_j-1 ready, issue P V_j-1", M::s_issued, M::gemms_issued, false},
      {"S_ij = Q_i K_j^T lands", M::gemms_issued, M::s_landed, false},
      {"softmax of S_ij, P V_j-1 lands", M::s_landed, M::pv_landed, false},
      {"rescale O_i, P_ij -> operand", M::pv_landed, M::block_end, false},
      {"the whole block", M::block_begin, M::block_end, false},
  };
  // Every consumer warpgroup's every tile (no mask: CTA c's seq-th tile is unit c + seq * ctas).
  auto each_tile = [&](auto&& f) {
    for (int c = 0; c < ctas; ++c)
      for (int seq = 0; seq < fa3::kMaxSeq && c + seq * ctas < tiles; ++seq)
        for (int role = 1; role <= Cfg::kConsumers; ++role) f(c, seq, role);
  };
  auto medians = [&](const Phase& ph) {
    std::vector<double> v;
    each_tile([&](int c, int seq, int role) {
      if (!ph.previous_tile || seq > 0)
        v.push_back(mark(c, seq, role, ph.to) - mark(c, seq - (ph.previous_tile ? 1 : 0), role, ph.from));
    });
    return median(v);
  };
  std::vector<double> steady;  // cycles per block, blocks 1 .. n-1
  if (n_blocks > 1)
    each_tile([&](int c, int seq, int role) {
      steady.push_back((mark(c, seq, role, M::loop_done) - mark(c, seq, role, M::block0_done)) / (n_blocks - 1));
    });

  std::printf("%s d = %d, N = %d (B = %d, H = %d), no mask: %d tiles of %d K/V blocks (B_c = %d) on %d CTAs\n", name,
              p.d, N, p.B, p.H, tiles, n_blocks, Cfg::B_c, ctas);
  std::printf("kernel %.3f ms (one launch after an L2 flush, after 0.3 s of launches); SM clock ~%.0f MHz (CTA 0's "
              "cycles over that time)\n",
              ms, cyc_per_us);
  std::printf("medians over every consumer warpgroup's tiles:\n");
  auto line = [&](const char* what, double cycles) {
    std::printf("  %-34s %8.2f us  (%.0f cycles)\n", what, cycles / cyc_per_us, cycles);
  };
  for (const Phase& ph : tile_phases) line(ph.name, medians(ph));
  line("each of blocks 1 .. n-1", median(steady));
  std::printf("the middle K/V block (j = %d), step by step:\n", n_blocks / 2);
  for (const Phase& ph : block_phases) line(ph.name, medians(ph));
  // Where the other consumer warpgroup is: consumer 2's marks of the middle block, relative
  // to consumer 1's block_begin.
  if (Cfg::kConsumers >= 2) {
    std::printf("consumer 2's marks of the middle block, cycles after consumer 1's block_begin:\n");
    for (M m : {M::block_begin, M::k_ready, M::turn_taken, M::s_issued, M::gemms_issued, M::s_landed, M::pv_landed,
                M::block_end}) {
      std::vector<double> v;
      each_tile([&](int c, int seq, int role) {
        if (role == 1) v.push_back(mark(c, seq, 2, m) - mark(c, seq, 1, M::block_begin));
      });
      std::printf("  %-14s %8.0f\n", mark_name(m), median(v));
    }
  }
  const double blocks_us = n_blocks * median(steady) / cyc_per_us, tile_us = medians(whole_tile) / cyc_per_us;
  std::printf("a tile beyond n x (one steady block): %.2f us of %.2f (%.1f %%)\n", tile_us - blocks_us, tile_us,
              100 * (tile_us - blocks_us) / tile_us);
  return 0;
}

// One backward step's CTAs: the medians of their phases, in cycles of their SM's clock.
template <class Launch>
int report_backward(const char* name, const AttnProblem& p, int rows_per_step, Launch&& launch) {
  const double ms = time_marked_launch(launch);
  constexpr int kKeysPerCta = fa3::step06e::kBwdKeysPerCta;  // B_c of every backward step
  const int ctas = (p.Nk + kKeysPerCta - 1) / kKeysPerCta * p.B * p.Hkv;
  if (ctas > fa3::kMaxBwdCtas) throw AttnError("more CTAs than the backward marks hold");
  const int steps = p.group() * ((p.Nq + rows_per_step - 1) / rows_per_step);
  std::vector<long long> m(size_t(fa3::kMaxBwdCtas) * fa3::kBwdMarks);
  std::vector<unsigned> sm(fa3::kMaxBwdCtas);
  CUDA_CHECK(cudaMemcpyFromSymbol(m.data(), fa3::g_bwd_marks, m.size() * sizeof(long long)));
  CUDA_CHECK(cudaMemcpyFromSymbol(sm.data(), fa3::g_bwd_sm, sm.size() * sizeof(unsigned)));
  using B = fa3::BwdMark;
  auto at = [&](int c, B k) { return double(m[size_t(c) * fa3::kBwdMarks + int(k)]); };
  struct Phase {
    const char* name;
    B from, to;
  };
  const Phase phases[] = {
      {"start -> K_j, V_j landed", B::cta_start, B::kv_ready},
      {"-> first ring stage full", B::kv_ready, B::first_stage},
      {"the steps", B::first_stage, B::steps_done},
      {"epilogue: dK_j, dV_j stored", B::steps_done, B::dkv_stored},
      {"-> last dQ add done", B::dkv_stored, B::cta_done},
      {"whole CTA", B::cta_start, B::cta_done},
  };
  std::printf("%s backward d = %d, N = %d (B = %d, H = %d), no mask: %d CTAs of %d steps (B_r = %d, B_c = %d)\n", name,
              p.d, p.Nq, p.B, p.H, ctas, steps, rows_per_step, kKeysPerCta);
  std::printf("kernels %.3f ms (pre-pass, main, post-pass; one launch after an L2 flush, after 0.3 s of launches)\n",
              ms);
  std::printf("medians over every CTA, cycles of its SM's clock:\n");
  constexpr int kPhases = int(sizeof(phases) / sizeof(phases[0]));
  double med[kPhases];
  for (int k = 0; k < kPhases; ++k) {
    std::vector<double> v(ctas);
    for (int c = 0; c < ctas; ++c) v[c] = at(c, phases[k].to) - at(c, phases[k].from);
    med[k] = median(v);
    std::printf("  %-30s %10.0f\n", phases[k].name, med[k]);
  }
  const double stepped = med[2], whole = med[kPhases - 1];  // "the steps", "whole CTA"
  std::printf("  %-30s %10.0f\n", "each step", stepped / steps);
  // Two CTAs in a row on one SM: the next one's start after this one's end.
  std::vector<int> order(ctas);
  for (int c = 0; c < ctas; ++c) order[c] = c;
  std::sort(order.begin(), order.end(), [&](int a, int b) {
    return sm[a] != sm[b] ? sm[a] < sm[b] : at(a, B::cta_start) < at(b, B::cta_start);
  });
  std::vector<double> gaps;
  for (int i = 0; i + 1 < ctas; ++i)
    if (sm[order[i]] == sm[order[i + 1]]) gaps.push_back(at(order[i + 1], B::cta_start) - at(order[i], B::cta_done));
  std::printf("  %-30s %10.0f\n", "between two CTAs on one SM", median(gaps));
  std::printf("outside the steps: %.0f cycles of %.0f per CTA (%.1f %%)\n", whole - stepped, whole,
              100 * (whole - stepped) / whole);
  return 0;
}

template <int D>
int run_backward_dim(int N) {
  AttnProblem p;
  p.d = D;
  p.Nq = p.Nk = N;
  p.B = std::max(1, 16384 / N);
  p.H = p.Hkv = 2048 / p.d;
  DeviceBuffer q(p.q_elems() * 2), k(p.kv_elems() * 2), v(p.kv_elems() * 2), o(p.o_elems() * 2), dout(p.o_elems() * 2);
  DeviceBuffer lse(p.lse_elems() * sizeof(float)), dq(p.q_elems() * 2), dk(p.kv_elems() * 2), dv(p.kv_elems() * 2);
  DeviceBuffer ws(fa2::bwd_workspace_bytes(p));
  fill_random(q.get(), p.q_elems(), DType::bf16, 1, Fill::normal, 0, 1, nullptr);
  fill_random(k.get(), p.kv_elems(), DType::bf16, 2, Fill::normal, 0, 1, nullptr);
  fill_random(v.get(), p.kv_elems(), DType::bf16, 3, Fill::normal, 0, 1, nullptr);
  fill_random(o.get(), p.o_elems(), DType::bf16, 4, Fill::normal, 0, 1, nullptr);
  fill_random(dout.get(), p.o_elems(), DType::bf16, 5, Fill::normal, 0, 1, nullptr);
  // lse = log N: the size of a row's sum for scores of order 1 (the times do not depend on it)
  std::vector<float> lse_host(size_t(p.lse_elems()), std::log(float(N)));
  CUDA_CHECK(cudaMemcpy(lse.get(), lse_host.data(), lse.bytes(), cudaMemcpyHostToDevice));
  AttnBwdTensors t;
  t.q = q.get();
  t.k = k.get();
  t.v = v.get();
  t.o = o.get();
  t.dout = dout.get();
  t.lse = static_cast<const float*>(lse.get());
  t.dq = dq.get();
  t.dk = dk.get();
  t.dv = dv.get();
  t.workspace = ws.get();
  t.workspace_bytes = ws.bytes();
  const int rows = fa3::step06k::rows_per_step(D);
  report_backward("06k", p, rows, [&] { fa3::step06k::launch_backward<D, __nv_bfloat16>(p, t, nullptr); });
  std::printf("\n");
  report_backward("06l", p, rows, [&] { fa3::step06l::launch_backward<D, __nv_bfloat16>(p, t, nullptr); });
  return 0;
}

int run_backward(int N) {
  if (N < 128 || N > 16384) throw AttnError("N must be in [128, 16384] (B = 16384 / N)");
  run_backward_dim<128>(N);
  std::printf("\n");
  return run_backward_dim<64>(N);
}

int run(int N, bool fp8) {
  if (N < 128 || N > 16384) throw AttnError("N must be in [128, 16384] (B = 16384 / N)");
  AttnProblem p;
  p.d = 128;
  p.Nq = p.Nk = N;
  p.B = std::max(1, 16384 / N);
  p.H = p.Hkv = 2048 / p.d;
  p.dtype = fp8 ? DType::fp8_e4m3 : DType::bf16;  // the inputs are bf16 either way
  const size_t ws_bytes = fp8 ? fa3::Fp8Workspace(p).total : sizeof(int);
  DeviceBuffer q(p.q_elems() * 2), k(p.kv_elems() * 2), v(p.kv_elems() * 2), o(p.o_elems() * 2), ws(ws_bytes);
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
  if (fp8) {
    fa3::launch_fp8_quantize<128>(p, t, fa3::Fp8Options{}, nullptr);  // the full variant's workspace
    return report<fa3::fp8::Config<128>>("06_fp8 (attention kernel)", p, [&] {
      fa3::launch_fp8_attention<128>(p, t, fa3::Schedule::persistent, nullptr);
    });
  }
  return report<fa3::step06d::Config<128, __nv_bfloat16, fa3::kPairs128>>("06d", p, [&] {
    fa3::step06d::launch<128, __nv_bfloat16, fa3::kPairs128>(p, t, fa3::Schedule::persistent, nullptr,
                                                             fa3::kRescaleLog2);
  });
}

}  // namespace

int main(int argc, char** argv) {
  int N = 4096;
  bool fp8 = false, backward = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--n" && i + 1 < argc) N = std::atoi(argv[++i]);
    else if (a == "--fp8") fp8 = true;
    else if (a == "--backward") backward = true;
    else {
      std::fprintf(stderr, "usage: tile_timeline [--n N] [--fp8 | --backward]\n");
      return 2;
    }
  }
  try {
    return backward ? run_backward(N) : run(N, fp8);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tile_timeline: %s\n", e.what());
    return 1;
  }
}
