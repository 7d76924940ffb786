// GPU tests of the backward passes (Stage::launch_backward: 04_fa1_tiled's Algorithm 4,
// 05_fa2_reordered's FlashAttention-2 backward, 05_fa2_dq_pass's with dQ in its own pass, the
// ablation 05_fa2_bwd_warps_own_keys, and on Hopper the steps 06e_bwd_wgmma (wgmma and TMA),
// 06f_bwd_dq_reduce, 06g_bwd_one_dq_add, 06h_bwd_dq_columns, 06i_bwd_shared_space,
// 06j_bwd_issue_order, 06k_bwd_tall_steps, 06l_bwd_tma_store, 06m_bwd_heavy_first,
// 06n_bwd_k_in_registers, 06o_bwd_tail_pieces, 06p_bwd_dq_writer, 06q_bwd_persistent and 06d_fa3's,
// the last step's): every rung that reports a backward,
// dQ, dK, dV against the fp64 reference
// (common/reference_backward.h) with the forward's bounds, on odd shapes (ragged tails, rows
// that see no key, Nq != Nk with the bottom-right causal mask, GQA), with dQ, dK, dV and the
// workspace poisoned before each run; 05 against 04 on the same inputs. Without a GPU every
// test here skips with the reason.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "bench/harness.h"
#include "common/check.h"
#include "common/tolerance.h"
#include "ladder/registry.h"
#include "tests/gpu_test_util.h"

using namespace attn;
using namespace attn::testing;

namespace {

struct BwdShape {
  int B, H, Hkv, Nq, Nk, d;
  bool causal;
  DType dtype;
};

std::string name_of(const BwdShape& s) {
  std::ostringstream os;
  os << dtype_name(s.dtype) << "_d" << s.d << "_B" << s.B << "H" << s.H << "kv" << s.Hkv << "_Nq" << s.Nq << "_Nk"
     << s.Nk << (s.causal ? "_causal" : "");
  return os.str();
}
void PrintTo(const BwdShape& s, std::ostream* os) { *os << name_of(s); }

AttnProblem problem_of(const BwdShape& s) {
  AttnProblem p;
  p.B = s.B;
  p.H = s.H;
  p.Hkv = s.Hkv;
  p.Nq = s.Nq;
  p.Nk = s.Nk;
  p.d = s.d;
  p.causal = s.causal;
  p.dtype = s.dtype;
  return p;
}

// The rungs with a backward, in ladder order.
std::vector<const Stage*> backward_stages() {
  std::vector<const Stage*> out;
  for (const Stage& s : registry())
    if (s.has_backward()) out.push_back(&s);
  return out;
}

// ||a - b|| / ||ref||, absolute where ref = 0: two rungs' gradients compared on the scale of
// the true one. (With one key, dQ and dK are exactly 0 and both rungs return rounding noise,
// which relative to each other is any size.)
double chain_error(const std::vector<double>& a, const std::vector<double>& b, const std::vector<double>& ref) {
  double diff = 0, norm = 0;
  for (size_t x = 0; x < ref.size(); ++x) {
    diff += (a[x] - b[x]) * (a[x] - b[x]);
    norm += ref[x] * ref[x];
  }
  return norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff);
}

// ATTN_TEST_PROGRESS set (scripts/reproduce.sh sets it under the sanitizers): a line on
// stderr before each rung's run, so that a run cut by a timeout says where it stood.
void progress(const Stage& s, const AttnProblem& p) {
  static const bool on = std::getenv("ATTN_TEST_PROGRESS") != nullptr;
  if (on) std::fprintf(stderr, "[progress] %s, %s\n", s.name.c_str(), p.describe().c_str());
}

// Every rung with a backward on p: each gradient written and finite, within tolerance() of
// fp64, and within chain_tolerance() of the rung below with a backward. only: that rung alone,
// against fp64.
void check_backward(const AttnProblem& p, cudaStream_t stream, const char* only = nullptr) {
  SCOPED_TRACE(p.describe());
  const uint64_t seed = 101 + p.Nq * 7 + p.Nk * 3 + p.d + p.Hkv;
  ProblemInputs in(p, seed, Fill::normal, 0.f, 1.f, stream, true);
  GradInput g(p, seed + 3, Fill::normal, 0.f, 1.f, stream, true);
  const ReferenceGrads ref = reference_backward(p, in.host, g.host);
  const DType t = storage_dtype(p.dtype);
  const char* names[3] = {"dQ", "dK", "dV"};
  const std::vector<double>* want[3] = {&ref.dq, &ref.dk, &ref.dv};
  int ran = 0;
  std::vector<std::vector<double>> below;  // the last rung's dQ, dK, dV
  for (const Stage* s : backward_stages()) {
    if (!backward_runs_here(*s, p) || (only && s->name != only)) continue;
    SCOPED_TRACE(s->name);
    progress(*s, p);
    const RungGrads out = run_rung_backward(*s, in, g, stream);
    const DeviceBuffer* got[3] = {&out.dq, &out.dk, &out.dv};
    std::vector<std::vector<double>> grads;
    for (int x = 0; x < 3; ++x) {
      const int64_t n = int64_t(want[x]->size());
      EXPECT_EQ(count_nonfinite(got[x]->get(), n, t, stream), 0) << names[x] << ": unwritten (poison) or non-finite";
      grads.push_back(download_as_double(got[x]->get(), n, t));
      double max_abs = 0;
      const double err = rel_frobenius(grads.back(), *want[x], &max_abs);
      EXPECT_LE(err, tolerance(p.dtype)) << names[x] << " vs fp64, max abs error " << max_abs;
      if (!below.empty())  // vs the rung below with a backward
        EXPECT_LE(chain_error(grads.back(), below[x], *want[x]), chain_tolerance(p.dtype)) << names[x] << " vs below";
    }
    below = std::move(grads);
    ++ran;
  }
  if (only) {
    if (ran == 0) GTEST_SKIP() << only << " does not run here";
    return;
  }
  EXPECT_GE(ran, 2) << "04_fa1_tiled and 05_fa2_reordered both have a backward for this problem";
}

class Backward : public Gpu, public ::testing::WithParamInterface<BwdShape> {};

TEST_P(Backward, MatchesFp64AndTheRungBelow) { check_backward(problem_of(GetParam()), stream_); }

std::vector<BwdShape> backward_shapes() {
  std::vector<BwdShape> shapes;
  int k = 0;
  auto next_dtype = [&] { return k++ % 2 ? DType::fp16 : DType::bf16; };  // both dtypes, alternating
  const int H = 4;
  for (int d : {64, 128})
    for (bool causal : {false, true})
      for (int Hkv : {H, H / 4}) {  // GQA ratios 1 and 4
        for (int n : {1, 17, 64, 100, 113, 257, 1000}) shapes.push_back({1, H, Hkv, n, n, d, causal, next_dtype()});
        // Nq != Nk: with the mask, rows that see no key (Nq > Nk) and keys seen by few rows
        for (auto [nq, nk] : {std::pair{17, 100}, std::pair{100, 17}, std::pair{1, 257}, std::pair{257, 64}})
          shapes.push_back({1, H, Hkv, nq, nk, d, causal, next_dtype()});
      }
  // A batch: the (batch, head) indexing of every tensor and of the workspace
  shapes.push_back({3, 4, 2, 130, 130, 64, true, DType::bf16});
  shapes.push_back({2, 8, 2, 77, 200, 128, true, DType::fp16});
  shapes.push_back({2, 2, 1, 300, 129, 128, false, DType::bf16});
  // Long: many steps per CTA (every stage of a Q_i, dO_i ring wraps), ragged last blocks
  shapes.push_back({1, 2, 1, 4097, 4097, 64, true, DType::bf16});
  shapes.push_back({1, 1, 1, 4097, 4097, 128, false, DType::fp16});
  shapes.push_back({1, 2, 2, 1000, 4097, 128, true, DType::bf16});
  // More tiles than an H100's or H200's 132 SMs: several waves of CTAs, one or two steps each,
  // or ten with 06o's pieces in the last wave (no mask)
  shapes.push_back({2, 16, 16, 70, 1100, 64, true, DType::bf16});
  shapes.push_back({2, 16, 16, 70, 1100, 128, false, DType::fp16});
  shapes.push_back({4, 8, 4, 300, 1100, 128, false, DType::bf16});
  shapes.push_back({4, 8, 4, 300, 1100, 64, true, DType::fp16});
  // 200 tiles of 8 steps: on 132 SMs (H100 SXM, H200) 06o's tail_plan splits the 68 of the
  // last wave in pieces of two sizes, 44 tiles in 3 and 24 in 4
  shapes.push_back({2, 100, 100, 507, 125, 128, false, DType::bf16});
  shapes.push_back({2, 100, 100, 1019, 125, 64, false, DType::fp16});
  return shapes;
}

INSTANTIATE_TEST_SUITE_P(Shapes, Backward, ::testing::ValuesIn(backward_shapes()),
                         [](const auto& info) { return name_of(info.param); });

// Forward-only rungs say so before any launch; the backward's own limits are refusals too.
TEST_F(Gpu, BackwardRefusals) {
  AttnProblem p;
  p.H = p.Hkv = 2;
  p.Nq = p.Nk = 64;
  ProblemInputs in(p, 5, Fill::normal, 0, 1, stream_, false);
  GradInput g(p, 6, Fill::normal, 0, 1, stream_, false);
  for (const Stage& s : registry()) {
    if (s.has_backward() || !runs_here(s, p)) continue;
    try {
      run_rung_backward(s, in, g, stream_);
      ADD_FAILURE() << s.name << ": a forward-only rung ran a backward";
    } catch (const AttnError& e) {
      EXPECT_NE(std::string(e.what()).find("no backward pass"), std::string::npos) << e.what();
    }
  }
  AttnProblem wide = p;
  wide.d = 256;  // 05 runs d = 256 forward, not backward
  const Stage& fa2 = find_stage("05_fa2_reordered");
  ASSERT_TRUE(runs_here(fa2, wide));
  ProblemInputs in256(wide, 7, Fill::normal, 0, 1, stream_, false);
  GradInput g256(wide, 8, Fill::normal, 0, 1, stream_, false);
  EXPECT_THROW(run_rung_backward(fa2, in256, g256, stream_), AttnError);
}

// 05_fa2_dq_pass sums dQ in registers, without atomics, and 06l_bwd_deterministic adds it in
// key-block order: two runs on the same inputs give the same bits (dK, dV always do: a CTA
// owns its keys and walks the query heads in order). The shape gives each dQ row many K/V
// blocks (CTAs) to sum over: GQA, causal, several blocks.
void expect_bitwise_reproducible(const char* name, cudaStream_t stream_) {
  const Stage& s = find_stage(name);
  for (int d : {64, 128}) {
    AttnProblem p;
    p.B = 2;
    p.H = 8;
    p.Hkv = 2;
    p.Nq = p.Nk = 1000;
    p.causal = true;
    p.d = d;
    SCOPED_TRACE(p.describe());
    if (!backward_runs_here(s, p)) GTEST_SKIP() << s.name << " does not run here";
    ProblemInputs in(p, 11, Fill::normal, 0, 1, stream_, false);
    GradInput g(p, 12, Fill::normal, 0, 1, stream_, false);
    const RungGrads a = run_rung_backward(s, in, g, stream_);  // each run poisons dQ, dK, dV first
    const RungGrads b = run_rung_backward(s, in, g, stream_);
    const DType t = storage_dtype(p.dtype);
    const int64_t q = p.q_elems(), kv = p.kv_elems();
    EXPECT_EQ(download_as_double(a.dq.get(), q, t), download_as_double(b.dq.get(), q, t)) << "dQ";
    EXPECT_EQ(download_as_double(a.dk.get(), kv, t), download_as_double(b.dk.get(), kv, t)) << "dK";
    EXPECT_EQ(download_as_double(a.dv.get(), kv, t), download_as_double(b.dv.get(), kv, t)) << "dV";
    EXPECT_EQ(count_nonfinite(a.dq.get(), q, t, stream_), 0);
  }
}
TEST_F(Gpu, BackwardDqPassIsBitwiseReproducible) { expect_bitwise_reproducible("05_fa2_dq_pass", stream_); }
TEST_F(Gpu, BackwardDeterministicDqIsBitwiseReproducible) {
  expect_bitwise_reproducible("06l_bwd_deterministic", stream_);
}

// Small shapes for compute-sanitizer (scripts/reproduce.sh runs '*Sanitize*' under each
// tool): ragged K/V and Q blocks, the causal mask with Nq != Nk both ways, GQA, several
// steps per CTA (the two-stage Q_i, dO_i ring), 06o's pieces (no mask, fewer tiles than SMs),
// both head dims.
TEST_F(Gpu, SanitizeBackwardShapes) {
  struct Case {
    int B, H, Hkv, Nq, Nk;
    bool causal;
  };
  // The last: an odd count of lse rows, so 06o's tail sums start past a 4-byte boundary.
  // (Pieces of two sizes need 67 tiles of 8 steps at least, on 132 SMs: twenty times these
  // shapes' work under racecheck; they are among the fp64 shapes, and tail_piece's CPU test
  // checks that their CTAs cover every step once.)
  for (Case c : {Case{1, 4, 1, 17, 100, true}, Case{1, 2, 2, 150, 70, true}, Case{2, 2, 1, 130, 200, false},
                 Case{1, 3, 1, 77, 300, false}})
    for (int d : {64, 128}) {
      AttnProblem p;
      p.B = c.B;
      p.H = c.H;
      p.Hkv = c.Hkv;
      p.Nq = c.Nq;
      p.Nk = c.Nk;
      p.causal = c.causal;
      p.d = d;
      check_backward(p, stream_);
    }
}

// 06q's CTAs walk tiles (d = 64) and take a second one only where there are more tiles than
// SMs: 200 of two steps each (a GQA group of 2, one Q block), the ring and both K_j, V_j
// buffers wrapping across tiles. 06q alone: every rung on it would take minutes under racecheck.
TEST_F(Gpu, SanitizeBackwardWalkingCtas) {
  AttnProblem p;
  p.H = 2;
  p.Hkv = 1;
  p.Nq = 40;
  p.Nk = 200 * 128 - 50;
  p.causal = true;
  p.d = 64;
  check_backward(p, stream_, "06q_bwd_persistent");
}

}  // namespace
