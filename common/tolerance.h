// The accuracy bounds, in one place. Relative Frobenius error ||O - O_ref|| / ||O_ref||.
// Typical results are several times lower; a rung that drifts toward a bound has a bug.
#pragma once

#include <algorithm>
#include <cmath>

#include "common/attention.h"

namespace attn {

// The standard deviation of the logits scale * q.k where the entries of Q and K are
// independent with standard deviation input_std: scale * sqrt(d) * input_std^2. 1 for
// N(0,1) inputs at the default scale 1/sqrt(d); 8 at scale 8/sqrt(d), a peaked softmax.
inline double logit_std(const AttnProblem& p, double input_std = 1) {
  return double(p.softmax_scale()) * std::sqrt(double(p.d)) * input_std * input_std;
}

// `logit_std` matters to FP8 alone (default 1: the tests' and benches' N(0,1) inputs).
inline double tolerance(DType t, double logit_std = 1) {
  switch (t) {
    case DType::bf16: return 1e-2;
    case DType::fp16: return 3e-3;
    // FP8 (e4m3, 3 mantissa bits), bf16 inputs quantized inside: each rounding errs by up to
    // 2^-4 relative, 2.65 % RMS on N(0,1) values. P's and V's give O ~4 %. Q's and K's put
    // noise on every logit, sqrt(2) * 2.65 % = 3.75 % of the logits' standard deviation
    // sigma_L (logit_std), which moves O only where a row's weight is shared between keys:
    // always while the softmax is flat (sigma_L <= 1: O errs ~5.5 %), in a share of rows
    // falling as 1/sigma_L once it concentrates, so O's squared error grows as sigma_L
    // (1.1e-1 at sigma_L = 8, 2.0e-1 at 32; tests/test_cpu.cpp, Fp8Model.PeakedSoftmax*).
    // 0.1 sqrt(sigma_L) leaves >= 1.75x at d = 64-256, N = 17-4097 (FA3 Table 3 reports RMSE,
    // not this relative error: bench/fp8_accuracy prints both).
    case DType::fp8_e4m3: return 1e-1 * std::sqrt(std::max(1.0, logit_std));
    // e4m3 inputs: the caller's Q, K, V are exact (the reference sees the same values), so
    // the logits carry no rounding noise; P and O still round (1e-2 at sigma_L = 8).
    case DType::e4m3: return 1e-1;
  }
  return 0;
}

inline bool is_fp8(DType t) { return t == DType::fp8_e4m3 || t == DType::e4m3; }

// Rung vs rung below. Two approximations each within tolerance() of the truth may differ by
// twice it (triangle inequality); the 16-bit rungs stay an order below their bound, so their
// chain keeps the bound itself, while two FP8 variants (different quantizations) get 2x.
inline double chain_tolerance(DType t, double logit_std = 1) {
  return (is_fp8(t) ? 2 : 1) * tolerance(t, logit_std);
}

// Logsumexp, natural log, absolute. 16-bit inputs: 2e-3 relative (fp32 scores and sums of
// the same rounded inputs as the reference; 2e-2 let an lse missing ~15 % of its mass
// pass at N = 1000). FP8 rounds each of Q and
// K by up to 2^-4 relative (RMS at most 2^-4/sqrt(3)), so a logit errs by at most about
// 2^-4 * sqrt(2/3) = 0.05 of the logits' standard deviation (RMS; 0.0375 measured); a row
// that sees one key has lse = its logit and keeps that whole error (many keys average it
// away): 6 sigma absolute. e4m3 inputs: Q and K are exact; the bound is fp8's at sigma_L = 1.
inline double lse_tolerance(DType t, double ref, double logit_std = 1) {
  const double scores = t == DType::fp8_e4m3 ? 0.3 * std::max(1.0, logit_std) : is_fp8(t) ? 0.3 : 0.0;
  return scores + (is_fp8(t) ? 2e-2 : 2e-3) * (1 + std::fabs(ref));
}

}  // namespace attn
