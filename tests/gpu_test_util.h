// Shared by the GPU test files: the skip-without-GPU fixture, "does this rung run this
// problem here", and the check of one output against the fp64 reference.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "common/check.h"
#include "bench/harness.h"
#include "common/tolerance.h"

namespace attn::testing {

class Gpu : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!cuda_device_available(&why)) GTEST_SKIP() << "no GPU: " << why;
    CUDA_CHECK(cudaStreamCreate(&stream_));
  }
  void TearDown() override {
    if (stream_) cudaStreamDestroy(stream_);
  }
  cudaStream_t stream_ = nullptr;
};

// Whether the stage (its backward pass with `backward`) takes the problem on this device.
inline bool runs_here(const Stage& s, const AttnProblem& p, bool backward = false) {
  try {
    if (backward)
      validate_backward_problem(s, p);  // includes validate_problem
    else
      validate_problem(s, p);
    validate_device(s);
    return true;
  } catch (const AttnError&) {
    return false;
  }
}
inline bool backward_runs_here(const Stage& s, const AttnProblem& p) { return runs_here(s, p, true); }

// Every element written and finite, relative error within the dtype's bound, lse where the
// rung writes it (-inf for rows that see no key).
inline void expect_matches_reference(const Stage& s, const RungOutput& out, const ProblemInputs& in,
                                     const std::vector<RowIndex>& rows, const ReferenceRows& ref,
                                     cudaStream_t stream) {
  const AttnProblem& p = in.p;
  EXPECT_EQ(count_nonfinite(out.o.get(), p.o_elems(), storage_dtype(p.dtype), stream), 0)
      << "unwritten (poison) or non-finite O";
  double max_abs = 0;
  double err = rel_frobenius(gather_o_rows(out, p, rows), ref.o, &max_abs);
  EXPECT_LE(err, tolerance(p.dtype)) << "vs fp64, max abs error " << max_abs;
  if (!s.writes_lse) return;
  std::vector<double> lse = gather_lse(out, p, rows);
  for (size_t r = 0; r < rows.size(); ++r) {
    if (std::isinf(ref.lse[r])) {
      EXPECT_TRUE(std::isinf(lse[r]) && lse[r] < 0) << "row " << rows[r].i << " sees no key: lse " << lse[r];
    } else {
      ASSERT_NEAR(lse[r], ref.lse[r], lse_tolerance(p.dtype, ref.lse[r])) << "lse of row " << rows[r].i;
    }
  }
}

// The stage on fresh N(0,1) inputs (`seed`; O poisoned first), its `rows` against fp64.
inline void expect_rung_matches_fp64(const Stage& s, const AttnProblem& p, uint64_t seed,
                                     const std::vector<RowIndex>& rows, cudaStream_t stream) {
  SCOPED_TRACE(s.name + " " + p.describe());
  ProblemInputs in(p, seed, Fill::normal, 0, 1, stream, true);
  expect_matches_reference(s, run_rung(s, in, stream), in, rows, reference_rows(p, in.host, rows), stream);
}

}  // namespace attn::testing
