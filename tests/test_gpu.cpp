// GPU tests: every registered rung against the fp64 reference and the rung below, on odd
// shapes, both masks, both dtypes, Nq != Nk and GQA; the overflow lesson of 01; refusals
// before any launch; determinism; very long sequences; measured HBM bytes.
// Without a GPU every test here skips with the reason.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <sstream>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "ladder/c_api.h"
#include "common/check.h"
#include "bench/harness.h"
#include "common/hbm_model.h"
#include "common/tolerance.h"
#include "tests/gpu_test_util.h"

using namespace attn;
using namespace attn::testing;

namespace {

struct Shape {
  int B, H, Hkv, Nq, Nk, d;
  bool causal;
  DType dtype;
};

std::string name_of(const Shape& s) {
  std::ostringstream os;
  os << dtype_name(s.dtype) << "_d" << s.d << "_B" << s.B << "H" << s.H << "kv" << s.Hkv << "_Nq" << s.Nq << "_Nk"
     << s.Nk << (s.causal ? "_causal" : "");
  return os.str();
}

// gtest prints parameters in test listings (and ctest names): say the shape, not its bytes.
void PrintTo(const Shape& s, std::ostream* os) { *os << name_of(s); }

// A device buffer's bytes, on the host (bit-for-bit comparisons of outputs).
std::vector<unsigned char> device_bytes(const DeviceBuffer& b) {
  std::vector<unsigned char> host(b.bytes());
  CUDA_CHECK(cudaMemcpy(host.data(), b.get(), host.size(), cudaMemcpyDeviceToHost));
  return host;
}

AttnProblem problem_of(const Shape& s) {
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

// ---------------------------------------------------------------- the ladder vs fp64

class Ladder : public Gpu, public ::testing::WithParamInterface<Shape> {};

TEST_P(Ladder, EveryRungMatchesFp64AndTheRungBelow) {
  AttnProblem p = problem_of(GetParam());
  ProblemInputs in(p, 1234 + p.Nq * 7 + p.Nk + p.d, Fill::normal, 0.f, 1.f, stream_, true);
  double macs = double(p.B) * p.H * p.Nq * double(p.Nk) * p.d;
  std::vector<RowIndex> rows = macs <= 4e9 ? all_rows(p) : sampled_rows(p, 64);
  ReferenceRows ref = reference_rows(p, in.host, rows);
  std::map<std::string, RungOutput> done;
  int ran = 0;
  for (const Stage& s : registry()) {
    if (!runs_here(s, p)) continue;
    SCOPED_TRACE(s.name + " on " + p.describe());
    RungOutput out = run_rung(s, in, stream_);
    ++ran;
    expect_matches_reference(s, out, in, rows, ref, stream_);
    for (std::string below = s.prev; !below.empty(); below = find_stage(below).prev)
      if (done.count(below)) {
        double err = rel_frobenius_device(out.o.get(), done[below].o.get(), p.o_elems(), storage_dtype(p.dtype), stream_);
        EXPECT_LE(err, chain_tolerance(p.dtype)) << "chain check vs " << below;
        break;
      }
    out.workspace = DeviceBuffer();
    done.emplace(s.name, std::move(out));
  }
  EXPECT_GT(ran, 0) << "no rung supports " << p.describe();
}

std::vector<Shape> ladder_shapes() {
  std::vector<Shape> shapes;
  for (DType t : {DType::bf16, DType::fp16})
    for (int d : {64, 128, 256})
      for (bool causal : {false, true}) {
        for (int n : {1, 17, 113, 1000}) shapes.push_back({1, 4, 2, n, n, d, causal, t});  // GQA group 2
        shapes.push_back({1, 1, 1, 4097, 4097, d, causal, t});
        // Nq != Nk both ways; with causal and Nq > Nk the first rows see no key.
        shapes.push_back({2, 2, 2, 17, 1000, d, causal, t});
        shapes.push_back({1, 2, 1, 1000, 113, d, causal, t});
        shapes.push_back({1, 1, 1, 4097, 113, d, causal, t});
      }
  // The FP8 path (rung 06, d = 64, 128 and 256): same shapes, bf16 tensors quantized inside.
  for (const Shape& s : std::vector<Shape>(shapes))
    if (s.dtype == DType::bf16) {
      Shape f = s;
      f.dtype = DType::fp8_e4m3;
      shapes.push_back(f);
    }
  return shapes;
}

INSTANTIATE_TEST_SUITE_P(Shapes, Ladder, ::testing::ValuesIn(ladder_shapes()),
                         [](const auto& info) { return name_of(info.param); });

// ---------------------------------------------------------------- lessons and refusals

TEST_F(Gpu, NaiveSoftmaxOverflowsAndSafeSoftmaxDoesNot) {
  // All scores = 100 (q = k = c with c^2 * d * scale = 100): exp(100) overflows fp32.
  AttnProblem p;
  p.H = p.Hkv = 1;
  p.Nq = p.Nk = 64;
  p.d = 64;
  float c = std::sqrt(100.f / (p.d * p.softmax_scale()));
  ProblemInputs in(p, 5, Fill::normal, c, 0.f, stream_, true);
  // V random (the harness filled it with c): refill so the expected mean is informative.
  fill_random(in.v.get(), p.kv_elems(), p.dtype, 77, Fill::normal, 0.f, 1.f, stream_);
  std::vector<uint16_t> raw(p.kv_elems());
  CUDA_CHECK(cudaMemcpy(raw.data(), in.v.get(), raw.size() * 2, cudaMemcpyDeviceToHost));
  in.host.v = to_float(raw, p.dtype);
  std::vector<RowIndex> rows = all_rows(p);
  ReferenceRows ref = reference_rows(p, in.host, rows);
  for (const Stage& s : registry()) {
    if (!runs_here(s, p)) continue;
    SCOPED_TRACE(s.name);
    RungOutput out = run_rung(s, in, stream_);
    int64_t bad = count_nonfinite(out.o.get(), p.o_elems(), p.dtype, stream_);
    if (s.name == "01_naive") {
      EXPECT_GT(bad, 0) << "01 subtracts no max: exp(100) must overflow to Inf and give NaN";
    } else {
      expect_matches_reference(s, out, in, rows, ref, stream_);
    }
  }
}

// Q = 1 and row j of K = score(j) / (scale d) (+ the random fill / 50), so that query i and
// key j meet with a score of about score(j) nats, and row j of V (random) times
// value_scale(j); every rung except 01 (which subtracts no max) against fp64, both dtypes,
// both masks, every head dim, Nk not a multiple of a tile, GQA, and Nq not a multiple of a
// query tile.
template <class ScoreOfKey>
void expect_key_scores_handled(cudaStream_t stream, ScoreOfKey score,
                               std::initializer_list<DType> dtypes = {DType::bf16, DType::fp16},
                               double (*value_scale)(int) = nullptr) {
  for (DType t : dtypes)
    for (int d : {64, 128, 256})
      for (bool causal : {false, true}) {
        AttnProblem p;
        p.dtype = t;
        p.B = 1;
        p.H = 2;
        p.Hkv = 1;
        p.Nq = 300;
        p.Nk = 1000;
        p.d = d;
        p.causal = causal;
        ProblemInputs in(p, 31 + d, Fill::normal, 0.f, 1.f, stream, true);
        const DType stored = storage_dtype(t);  // FP8 problems hold bf16 tensors
        auto to_raw = [&](float x) {
          return stored == DType::bf16 ? __bfloat16_as_ushort(__float2bfloat16(x)) : __half_as_ushort(__float2half(x));
        };
        std::vector<uint16_t> q(p.q_elems(), to_raw(1.f)), k(p.kv_elems());
        for (int64_t e = 0; e < p.kv_elems(); ++e) {  // in.host.k: the random fill, kept on the host
          const int j = int(e / d % p.Nk);
          k[e] = to_raw(float(score(j)) / (p.softmax_scale() * d) + in.host.k[e] / 50.f);
        }
        CUDA_CHECK(cudaMemcpy(in.q.get(), q.data(), q.size() * 2, cudaMemcpyHostToDevice));
        CUDA_CHECK(cudaMemcpy(in.k.get(), k.data(), k.size() * 2, cudaMemcpyHostToDevice));
        in.host.q = to_float(q, stored);
        in.host.k = to_float(k, stored);
        if (value_scale) {
          std::vector<uint16_t> v(p.kv_elems());
          for (int64_t e = 0; e < p.kv_elems(); ++e) v[e] = to_raw(float(value_scale(int(e / d % p.Nk))) * in.host.v[e]);
          CUDA_CHECK(cudaMemcpy(in.v.get(), v.data(), v.size() * 2, cudaMemcpyHostToDevice));
          in.host.v = to_float(v, stored);
        }
        std::vector<RowIndex> rows = all_rows(p);
        ReferenceRows ref = reference_rows(p, in.host, rows);
        for (const Stage& s : registry()) {
          if (!runs_here(s, p) || s.name == "01_naive") continue;
          SCOPED_TRACE(s.name + " on " + p.describe());
          expect_matches_reference(s, run_rung(s, in, stream), in, rows, ref, stream);
        }
      }
}

// Lazy rescaling (05, 06d): a warp keeps its running max m_i, and skips the rescale of O_i,
// until some row max has grown by more than 8 in log2 units (P by 2^8). Random inputs
// rarely move the max after the first blocks; here the scores climb along the keys
// (3 sqrt(j) nats, a fresh jump of 10-25 nats per block early on and of 3-5 late), so
// blocks alternate between "keep m_i" (P up to 2^8: an fp16 overflow if the bound were
// wrong) and "rescale".
TEST_F(Gpu, ScoresClimbingAlongTheKeysRescaleExactly) {
  expect_key_scores_handled(stream_, [](int j) { return 3.0 * std::sqrt(double(j)); });
}

// 06d at d <= 128 exponentiates a block against the running max before it knows the
// block's max (06d_fa3.cuh: settle_speculation). Scores that jump by 100 nats (144 in
// log2 units) at keys 400 and 800 overflow those P to inf: the warp must recompute its
// scores and take the exact path, twice per row. A jump of 87 nats (125.5 in log2 units)
// leaves each P finite, but a thread's sum of the ~30 jumped P of its row overflows: the
// same path, found from the sum.
TEST_F(Gpu, ScoresJumpingPastTheRunningMaxRecomputeExactly) {
  expect_key_scores_handled(stream_, [](int j) { return 100.0 * ((j >= 400) + (j >= 800)); });
  expect_key_scores_handled(stream_, [](int j) { return 87.0 * ((j >= 400) + (j >= 800)); });
}

// Rows whose scores are all negative, in every block: the FP8 kernel takes a block's row max
// on the integer ALU (fp8h_fa3.cuh: block_max), which is exact only where a row has a
// score >= 0 or a running max >= 0 already; here the float max must be taken instead. With
// the integer one a row's max would be its least score, and in FP8 (small scores only: e4m3
// keeps a score to ~6 %) the keys more than 0.56 nats above it would saturate P at 448. The
// 16-bit rungs keep the float tree; their case (keys 200 nats above the least score, which
// would overflow P to inf) holds them to it should the integer max reach them.
TEST_F(Gpu, NegativeScoresTakeTheFloatMax) {
  expect_key_scores_handled(stream_, [](int j) { return j % 2 ? -100.0 : -300.0; });
  expect_key_scores_handled(stream_, [](int j) { return -1.0 - 3.0 * std::fmod(0.618034 * j, 1.0); },
                            {DType::fp8_e4m3});
}

// V's block scales in FP8: O_i is kept in units of the last V block's scale and moved to
// V_j's with each block's rescale (alpha * v_scale_(j-1) / v_scale_j, fp8h_fa3.cuh:
// BlockScales::rescale). Here V's rows swing by 2^+-2 along the keys (sin(j / 60)), so
// neighbouring blocks' scales differ by 2^0.3 to 2^2.6 either way, while the scores climb
// 2.6 nats over the 1000 keys (every block moves each row's max a little). A ratio applied
// the wrong way round, to the wrong block or not at all weights whole blocks wrong, which
// shows against fp64; every FP8 variant, both masks, every d.
TEST_F(Gpu, Fp8ValueScalesSwingingAcrossBlocks) {
  expect_key_scores_handled(
      stream_, [](int j) { return 2.6 * j / 1000.0; }, {DType::fp8_e4m3},
      [](int j) { return std::exp2(2.0 * std::sin(j / 60.0)); });
}

TEST_F(Gpu, RefusedProblemsLaunchNothing) {
  for (const Stage& s : registry()) {
    SCOPED_TRACE(s.name);
    AttnProblem p;
    p.Nq = p.Nk = 17;
    p.d = s.head_dims.front();
    p.dtype = s.dtypes.front();
    ProblemInputs in(p, 3, Fill::normal, 0, 1, stream_, false);
    DeviceBuffer o(p.o_elems() * 2), ws(std::max<size_t>(s.workspace(p), 1));
    fill_poison(o.get(), o.bytes(), stream_);
    AttnTensors t{in.q.get(), in.k.get(), in.v.get(), o.get(), nullptr, ws.get(), ws.bytes()};
    AttnProblem bad_d = p;
    bad_d.d = 80;
    EXPECT_THROW(run_stage(s, bad_d, t, stream_), AttnError);
    AttnProblem bad_heads = p;
    bad_heads.H = 3;
    bad_heads.Hkv = 2;
    EXPECT_THROW(run_stage(s, bad_heads, t, stream_), AttnError);
    AttnTensors null_k = t;
    null_k.k = nullptr;
    EXPECT_THROW(run_stage(s, p, null_k, stream_), AttnError);
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    for (unsigned char b : device_bytes(o)) ASSERT_EQ(b, 0xFF) << "a refused problem wrote to O";
  }
}

TEST_F(Gpu, QuadraticRungsRefuseWhatDoesNotFitWithTheBytesNeeded) {
  AttnProblem p;
  p.H = p.Hkv = 16;
  p.Nq = p.Nk = 1 << 20;  // S alone would be 16 * 2^40 * 4 bytes
  p.d = 64;
  int checked = 0;
  for (const Stage& s : registry()) {
    // Only the rungs whose workspace holds S or P (N^2); 04's O/l/m workspace is linear.
    if (s.workspace(p) < size_t(p.score_elems()) || !runs_here(s, p)) continue;
    ++checked;
    try {
      ProblemInputs in(p, 1, Fill::normal, 0, 1, stream_, false);
      run_rung(s, in, stream_);
      ADD_FAILURE() << s.name << " accepted a problem needing " << s.workspace(p) << " bytes";
    } catch (const AttnError& e) {
      EXPECT_NE(std::string(e.what()).find("bytes"), std::string::npos) << e.what();
    }
  }
  // And through the C API: an error code and the message, no crash.
  attn_problem_t cp{1, 16, 16, 1 << 20, 1 << 20, 64, 0, 0, 0.f};
  char err[512] = {0};
  int dummy;
  EXPECT_EQ(attn_run("01_naive", &cp, &dummy, &dummy, &dummy, &dummy, nullptr, nullptr, err, sizeof err),
            ATTN_INVALID_INPUT);
  EXPECT_NE(std::string(err).find("bytes"), std::string::npos) << err;
  EXPECT_GT(checked, 0);
}

TEST_F(Gpu, CApiRunsAndReportsErrors) {
  AttnProblem p;
  p.H = p.Hkv = 2;
  p.Nq = p.Nk = 113;
  p.d = 64;
  ProblemInputs in(p, 11, Fill::normal, 0, 1, stream_, true);
  std::vector<RowIndex> rows = all_rows(p);
  ReferenceRows ref = reference_rows(p, in.host, rows);
  attn_problem_t cp{p.B, p.H, p.Hkv, p.Nq, p.Nk, p.d, 0, 0, 0.f};
  for (int i = 0; i < attn_num_rungs(); ++i) {
    const Stage& s = find_stage(attn_rung_name(i));
    if (!runs_here(s, p)) continue;
    RungOutput out;
    out.o = DeviceBuffer(p.o_elems() * 2);
    fill_poison(out.o.get(), out.o.bytes(), stream_);
    char err[512] = {0};
    ASSERT_EQ(attn_run(s.name.c_str(), &cp, in.q.get(), in.k.get(), in.v.get(), out.o.get(), nullptr, stream_, err,
                       sizeof err),
              ATTN_OK)
        << s.name << ": " << err;
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    EXPECT_LE(rel_frobenius(gather_o_rows(out, p, rows), ref.o), tolerance(p.dtype)) << s.name;
  }
  char err[512] = {0};
  attn_problem_t bad = cp;
  bad.d = 80;
  EXPECT_EQ(attn_run(attn_rung_name(0), &bad, in.q.get(), in.k.get(), in.v.get(), in.q.get(), nullptr, stream_, err,
                     sizeof err),
            ATTN_INVALID_INPUT);
  EXPECT_NE(std::string(err).find("d = 80"), std::string::npos) << err;
  EXPECT_EQ(attn_run("no_such_rung", &cp, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, err, sizeof err),
            ATTN_UNKNOWN_RUNG);
}

// ---------------------------------------------------------------- races and long sequences

TEST_F(Gpu, RepeatedRunsAreBitIdentical) {
  for (DType t : {DType::bf16, DType::fp8_e4m3})
    for (int d : {64, 128})
      for (bool causal : {false, true}) {
        AttnProblem p;
        p.dtype = t;
        p.B = 2;
        p.H = 4;
        p.Hkv = 2;
        p.Nq = p.Nk = 1000;
        p.d = d;
        p.causal = causal;
        ProblemInputs in(p, 21, Fill::normal, 0, 1, stream_, false);
        for (const Stage& s : registry()) {
          if (!runs_here(s, p)) continue;
          SCOPED_TRACE(s.name + (causal ? " causal " : " ") + dtype_name(t) + " d = " + std::to_string(d));
          RungOutput a = run_rung(s, in, stream_);
          RungOutput b = run_rung(s, in, stream_);
          EXPECT_TRUE(device_bytes(a.o) == device_bytes(b.o)) << "two runs on the same inputs differ: a race";
          // Two runs that left the same elements unwritten (poison) would also agree.
          EXPECT_EQ(count_nonfinite(a.o.get(), p.o_elems(), storage_dtype(p.dtype), stream_), 0)
              << "unwritten (poison) or non-finite elements";
        }
      }
}

// 06d walks several tiles per CTA (Schedule::persistent: fixed rounds without a mask, tiles
// handed out from a counter with one); its ablations run the same kernel in clusters of two
// CTAs sharing K/V loads (06d_cta_pairs, Schedule::persistent_cta_pairs; one tile per CTA
// with a mask) and with one tile per CTA (06d_one_tile_per_cta). Each tile's arithmetic is
// the same in all three, so the outputs must agree bit for bit, and match fp64. The shapes
// have several times more tiles than an H100/H200 has SMs, ragged ends and GQA; Nq = 300 and
// 400 give heads an odd number of Q blocks (d = 128 / 256 and d = 64), where the last pair's
// second CTA computes rows past Nq and must write none.
TEST_F(Gpu, PersistentCtasMatchOneTilePerCta) {
  const Stage& pairs = find_stage("06d_cta_pairs");
  const Stage& persistent = find_stage("06d_fa3");
  const Stage& one_tile = find_stage("06d_one_tile_per_cta");
  int checked = 0;
  for (bool causal : {false, true})
    for (int d : pairs.head_dims)
      for (DType t : pairs.dtypes)
        for (auto [Nq, Nk] : {std::pair{700, 700}, std::pair{700, 333}, std::pair{250, 1100}, std::pair{300, 500},
                              std::pair{400, 777}}) {
          AttnProblem p;
          p.causal = causal;
          p.B = 3;
          p.H = 20;
          p.Hkv = 5;
          p.Nq = Nq;
          p.Nk = Nk;
          p.d = d;
          p.dtype = t;
          if (!runs_here(pairs, p)) continue;
          ++checked;
          SCOPED_TRACE(p.describe());
          ProblemInputs in(p, 61 + d + Nk, Fill::normal, 0, 1, stream_, true);
          RungOutput a = run_rung(pairs, in, stream_), b = run_rung(one_tile, in, stream_);
          const std::vector<unsigned char> hb = device_bytes(b.o);
          EXPECT_TRUE(device_bytes(a.o) == hb) << "CTA pairs and one-tile-per-CTA outputs differ";
          if (runs_here(persistent, p))
            EXPECT_TRUE(device_bytes(run_rung(persistent, in, stream_).o) == hb)
                << "persistent and one-tile-per-CTA outputs differ";
          std::vector<RowIndex> rows = sampled_rows(p, 64);
          expect_matches_reference(pairs, std::move(a), in, rows, reference_rows(p, in.host, rows), stream_);
        }
  if (checked == 0) GTEST_SKIP() << "06d runs on no problem here (it needs sm_90a)";
}

TEST_F(Gpu, LongSequenceRunsWithoutQuadraticMemory) {
  // N = 131072, d = 128: S alone is 64 GiB. Fused rungs must run it; the rungs that keep S
  // and P run it where the GPU has the memory and otherwise refuse with the bytes needed.
  AttnProblem p;
  p.Nq = p.Nk = 131072;
  p.d = 128;
  ProblemInputs in(p, 31, Fill::normal, 0, 1, stream_, true);
  std::vector<RowIndex> rows = sampled_rows(p, 64);
  ReferenceRows ref = reference_rows(p, in.host, rows);
  int fused = 0;
  for (const Stage& s : registry()) {
    if (!runs_here(s, p)) continue;
    SCOPED_TRACE(s.name);
    bool quadratic = s.workspace(p) >= size_t(p.score_elems());
    try {
      RungOutput out = run_rung(s, in, stream_);
      expect_matches_reference(s, out, in, rows, ref, stream_);
      fused += !quadratic;
    } catch (const AttnError& e) {
      EXPECT_TRUE(quadratic) << "only rungs that keep S or P may refuse: " << e.what();
      EXPECT_NE(std::string(e.what()).find("bytes"), std::string::npos) << e.what();
    }
  }
  EXPECT_GT(fused, 0);
}

// ---------------------------------------------------------------- sanitizer subset
// Small shapes for compute-sanitizer (memcheck, racecheck, synccheck): scripts/reproduce.sh
// runs gpu_tests --gtest_filter='*Sanitize*' under each tool.

TEST_F(Gpu, SanitizeSmallShapes) {
  struct Case {
    int Nq, Nk;
    bool causal;
  };
  // A ragged square, a ragged Nq < Nk and Nq > Nk with rows that see no key.
  for (Case c : {Case{113, 113, true}, Case{65, 200, false}, Case{200, 65, true}})
    for (const Stage& s : registry()) {
      AttnProblem p;
      p.H = 2;
      p.Hkv = 1;
      p.Nq = c.Nq;
      p.Nk = c.Nk;
      p.causal = c.causal;
      p.d = s.head_dims.back();
      p.dtype = s.dtypes.front();
      if (runs_here(s, p)) expect_rung_matches_fp64(s, p, 41, all_rows(p), stream_);
    }
}

// More tiles than SMs, so that persistent CTAs (06d, fp8) walk several: the ring and Q
// barriers change phase from one tile to the next, which the shapes above never reach.
// Every head dim: each has its own tiles (B_r, B_c, consumer warpgroups, swizzles).
TEST_F(Gpu, SanitizeManyTilesPerCta) {
  int checked = 0;
  for (const Stage& s : registry())
    for (int d : s.head_dims)
      for (bool causal : {false, true}) {  // with a mask, 06d and FP8 hand tiles out from a counter
        AttnProblem p;
        p.causal = causal;
        p.B = 2;
        p.H = 100;
        p.Hkv = 20;
        p.Nq = 130;
        p.Nk = 300;
        p.d = d;
        p.dtype = s.dtypes.front();
        if (s.min_sm < 90 || !runs_here(s, p)) continue;  // the Hopper rungs: their CTAs may walk several tiles
        ++checked;
        expect_rung_matches_fp64(s, p, 43, sampled_rows(p, 32), stream_);
      }
  if (checked == 0) GTEST_SKIP() << "no persistent (Hopper) rung runs here";
}

// A softmax scale other than 1/sqrt(d) (here 2/sqrt(d): peakier rows), on every 16-bit rung
// with a mask, GQA and ragged lengths: a kernel that ignored p.scale would pass every other
// test, whose problems all take the default. (FP8: test_fp8.cpp's peaked-softmax cases.)
TEST_F(Gpu, CustomScaleMatchesFp64) {
  int checked = 0;
  for (const Stage& s : registry())
    for (DType t : s.dtypes) {
      if (is_fp8(t)) continue;
      AttnProblem p;
      p.H = 4;
      p.Hkv = 2;
      p.Nq = 61;
      p.Nk = 257;
      p.d = s.head_dims.front();
      p.dtype = t;
      p.causal = true;
      p.scale = 2.f / std::sqrt(float(p.d));
      if (!runs_here(s, p)) continue;
      ++checked;
      expect_rung_matches_fp64(s, p, 77, sampled_rows(p, 64), stream_);
    }
  if (checked == 0) GTEST_SKIP() << "no 16-bit rung runs here";
}

// ---------------------------------------------------------------- measured HBM bytes

TEST_F(Gpu, MeasuredBytesAgreeWithTheModel) {
  HbmCounter counter;
  if (!counter.available()) GTEST_SKIP() << "measured bytes unavailable: " << counter.reason();
  AttnProblem p;
  p.H = p.Hkv = 16;
  p.Nq = p.Nk = 8192;
  p.d = 128;
  ProblemInputs in(p, 51, Fill::normal, 0, 1, stream_, false);
  for (const Stage& s : registry()) {
    if (!runs_here(s, p)) continue;
    RungOutput out = run_rung(s, in, stream_);
    AttnTensors t = out.tensors(in);
    DramBytes b = counter.measure([&] { s.launch(p, t, stream_); }, stream_);
    double measured = b.read + b.write, model = s.model_hbm_bytes(p), floor = hbm::min_bytes(p);
    std::printf("  %-24s model %8.3f GB  measured %8.3f GB (read %.3f, write %.3f)  min %.3f GB\n", s.name.c_str(),
                model / 1e9, measured / 1e9, b.read / 1e9, b.write / 1e9, floor / 1e9);
    if (s.workspace(p) >= size_t(p.score_elems())) {
      // S and P are far larger than L2: the model must hold within 15%.
      EXPECT_NEAR(measured / model, 1.0, 0.15) << s.name;
    } else {
      // Fused rungs: the model counts re-reads that L2 may absorb; never below the minimum.
      EXPECT_GE(measured, 0.85 * floor) << s.name;
      EXPECT_LE(measured, 1.15 * model) << s.name;
    }
  }
}

}  // namespace
