// GPU test of rung 06's FP8 path beyond the ladder tests (which run every fp8 stage against
// fp64 on the odd shapes, sanitize it and check repeat runs, in test_gpu.cpp): FA3 Table 3
// in small — on the paper's outlier inputs, block quantization with incoherent processing
// must beat one scale per tensor without it. bench/fp8_accuracy prints the whole table.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>

#include "tests/gpu_test_util.h"

using namespace attn;
using namespace attn::testing;

namespace {

double rmse(const std::vector<double>& a, const std::vector<double>& b) {
  double sum = 0;
  for (size_t i = 0; i < a.size(); ++i) sum += (a[i] - b[i]) * (a[i] - b[i]);
  return std::sqrt(sum / double(a.size()));
}

TEST_F(Gpu, Fp8FullVariantBeatsPerTensorBaselineOnOutliers) {
  AttnProblem p;
  p.H = p.Hkv = 4;
  p.Nq = p.Nk = 2048;
  p.d = 128;
  p.dtype = DType::fp8_e4m3;
  ProblemInputs in(p, 99, Fill::outliers, 0.f, 1.f, stream_, true);
  std::vector<RowIndex> rows = sampled_rows(p, 128);
  ReferenceRows ref = reference_rows(p, in.host, rows);
  std::map<std::string, double> err;
  for (const char* name : {"06_fp8", "06_fp8_per_tensor"}) {
    const Stage& s = find_stage(name);
    ASSERT_TRUE(runs_here(s, p)) << name << " refuses " << p.describe();
    err[name] = rmse(gather_o_rows(run_rung(s, in, stream_), p, rows), ref.o);
    std::printf("  %-20s RMSE %.3e\n", name, err[name]);
  }
  // FA3 reports 2.6x (9.1e-3 vs 2.4e-2); measured here on an H200: 8.9e-3 vs 1.75e-2 (2.0x).
  EXPECT_LT(err["06_fp8"], 0.75 * err["06_fp8_per_tensor"]) << "block scales + Hadamard must cut the error";
}

}  // namespace
