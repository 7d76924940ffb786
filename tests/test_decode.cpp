// GPU tests of the decode stage (05_fa2_decode, fa2_decode.cuh) on decode shapes: few query
// rows, long and odd Nk (so ragged splits), GQA ratios 1, 4 and 8, both masks, both head dims,
// against fp64 and against 05_fa2_reordered, with O, lse and the split workspace poisoned.
// Without a GPU every test here skips with the reason.
#include <gtest/gtest.h>

#include <algorithm>
#include <sstream>

#include "bench/harness.h"
#include "common/check.h"
#include "common/tolerance.h"
#include "ladder/registry.h"
#include "tests/gpu_test_util.h"

using namespace attn;
using namespace attn::testing;

namespace {

struct DecodeShape {
  int B, H, Hkv, Nq, Nk, d;
  bool causal;
  DType dtype;
};

std::string name_of(const DecodeShape& s) {
  std::ostringstream os;
  os << dtype_name(s.dtype) << "_d" << s.d << "_B" << s.B << "H" << s.H << "kv" << s.Hkv << "_Nq" << s.Nq << "_Nk"
     << s.Nk << (s.causal ? "_causal" : "");
  return os.str();
}
void PrintTo(const DecodeShape& s, std::ostream* os) { *os << name_of(s); }

AttnProblem problem_of(const DecodeShape& s) {
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

// As run_rung, with the workspace poisoned too: a (row, split) partial the split kernel
// failed to write would reach O as NaN through the combine.
RungOutput run_poisoned(const Stage& s, const ProblemInputs& in, cudaStream_t stream) {
  const AttnProblem& p = in.p;
  validate_problem(s, p);
  RungOutput out;
  out.o = DeviceBuffer(p.o_elems() * dtype_bytes(storage_dtype(p.dtype)));
  out.lse = DeviceBuffer(p.lse_elems() * sizeof(float));
  out.workspace = DeviceBuffer(s.workspace(p));
  fill_poison(out.o.get(), out.o.bytes(), stream);
  fill_poison(out.lse.get(), out.lse.bytes(), stream);
  if (out.workspace.bytes()) fill_poison(out.workspace.get(), out.workspace.bytes(), stream);
  run_stage(s, p, out.tensors(in), stream);
  CUDA_CHECK(cudaStreamSynchronize(stream));
  return out;
}

// Decode vs fp64 (all rows, or sampled rows of large problems) and vs 05_fa2_reordered.
void check_decode(const AttnProblem& p, cudaStream_t stream, bool against_fa2 = true) {
  const Stage& decode = find_stage("05_fa2_decode");
  ASSERT_TRUE(runs_here(decode, p)) << p.describe();
  SCOPED_TRACE(p.describe());
  ProblemInputs in(p, 77 + p.Nq * 3 + p.Nk + p.d + p.Hkv, Fill::normal, 0.f, 1.f, stream, true);
  const double macs = double(p.B) * p.H * p.Nq * double(p.Nk) * p.d;
  std::vector<RowIndex> rows = macs <= 2e8 ? all_rows(p) : sampled_rows(p, 8);
  ReferenceRows ref = reference_rows(p, in.host, rows);
  RungOutput out = run_poisoned(decode, in, stream);
  expect_matches_reference(decode, out, in, rows, ref, stream);
  const Stage& fa2 = find_stage("05_fa2_reordered");
  if (against_fa2 && runs_here(fa2, p)) {
    RungOutput below = run_rung(fa2, in, stream);
    const double err = rel_frobenius_device(out.o.get(), below.o.get(), p.o_elems(), storage_dtype(p.dtype), stream);
    EXPECT_LE(err, chain_tolerance(p.dtype)) << "vs 05_fa2_reordered";
  }
}

class Decode : public Gpu, public ::testing::WithParamInterface<DecodeShape> {};

TEST_P(Decode, MatchesFp64AndFa2) { check_decode(problem_of(GetParam()), stream_); }

std::vector<DecodeShape> decode_shapes() {
  std::vector<DecodeShape> shapes;
  int k = 0;
  const int H = 8;
  for (int d : {64, 128})
    for (bool causal : {false, true})
      for (int Hkv : {H, H / 4, H / 8})  // GQA ratios 1, 4, 8
        for (int Nq : {1, 4, 17, 64})
          for (int Nk : {1, 17, 4097, 100003}) {
            const DType t = k++ % 2 ? DType::fp16 : DType::bf16;  // both dtypes, alternating
            shapes.push_back({1, H, Hkv, Nq, Nk, d, causal, t});
          }
  // A batch: CTAs from several (batch, KV head) pairs, fewer splits each.
  shapes.push_back({3, 32, 8, 1, 65536, 128, false, DType::bf16});
  shapes.push_back({5, 16, 2, 4, 8191, 128, true, DType::fp16});
  return shapes;
}

INSTANTIATE_TEST_SUITE_P(Shapes, Decode, ::testing::ValuesIn(decode_shapes()),
                         [](const auto& info) { return name_of(info.param); });

TEST_F(Gpu, DecodeRepeatedRunsAreBitIdentical) {
  const Stage& s = find_stage("05_fa2_decode");
  AttnProblem p;
  p.B = 2;
  p.H = 32;
  p.Hkv = 8;
  p.Nq = 4;
  p.Nk = 40000;
  p.d = 128;
  p.causal = true;
  ASSERT_TRUE(runs_here(s, p));
  ProblemInputs in(p, 9, Fill::normal, 0, 1, stream_, false);
  RungOutput a = run_poisoned(s, in, stream_), b = run_poisoned(s, in, stream_);
  std::vector<unsigned char> ha(a.o.bytes()), hb(b.o.bytes());
  CUDA_CHECK(cudaMemcpy(ha.data(), a.o.get(), ha.size(), cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(hb.data(), b.o.get(), hb.size(), cudaMemcpyDeviceToHost));
  EXPECT_TRUE(ha == hb) << "two runs on the same inputs differ: a race";
  EXPECT_EQ(count_nonfinite(a.o.get(), p.o_elems(), storage_dtype(p.dtype), stream_), 0)
      << "unwritten (poison) or non-finite elements";
}

// Small shapes for compute-sanitizer (scripts/reproduce.sh runs '*Sanitize*' under each
// tool): several splits with a ragged last one, rows that see no key, 2 row blocks.
TEST_F(Gpu, SanitizeDecodeShapes) {
  struct Case {
    int H, Hkv, Nq, Nk;
    bool causal;
  };
  for (Case c : {Case{8, 2, 1, 1000, false}, Case{8, 2, 17, 700, true}, Case{4, 4, 64, 17, true},
                 Case{8, 1, 16, 300, true}})
    for (int d : {64, 128}) {
      AttnProblem p;
      p.H = c.H;
      p.Hkv = c.Hkv;
      p.Nq = c.Nq;
      p.Nk = c.Nk;
      p.causal = c.causal;
      p.d = d;
      check_decode(p, stream_, /*against_fa2=*/false);
    }
}

}  // namespace
