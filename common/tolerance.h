// The accuracy bounds, in one place. Relative Frobenius error ||O - O_ref|| / ||O_ref||.
// Typical results are several times lower; a rung that drifts toward a bound has a bug.
#pragma once

#include <cmath>

#include "common/attention.h"

namespace attn {

inline double tolerance(DType t) {
  switch (t) {
    case DType::bf16: return 1e-2;
    case DType::fp16: return 3e-3;
    // FP8 (e4m3, 3 mantissa bits): each rounding (Q and K -> S, P, V) errs by up to 2^-4
    // relative, ~3.6% RMS; together ~5-6% on O on N(0,1) inputs, so the bound leaves about
    // 2x (FA3 Table 3 reports RMSE, not this relative error: bench/fp8_accuracy prints both).
    case DType::fp8_e4m3: return 1e-1;
    // e4m3 inputs: the caller's Q, K, V are exact, P and O still round (a bound as fp8's).
    case DType::e4m3: return 1e-1;
  }
  return 0;
}

inline bool is_fp8(DType t) { return t == DType::fp8_e4m3 || t == DType::e4m3; }

// Rung vs rung below. Two approximations each within tolerance() of the truth may differ by
// twice it (triangle inequality); the 16-bit rungs stay an order below their bound, so their
// chain keeps the bound itself, while two FP8 variants (different quantizations) get 2x.
inline double chain_tolerance(DType t) { return is_fp8(t) ? 2 * tolerance(t) : tolerance(t); }

// Logsumexp, natural log, absolute. 16-bit inputs: 2e-2 relative. e4m3 rounds each of Q and
// K by up to 2^-4 relative (RMS 2^-4/sqrt(3)), so a score s = scale * q.k errs by about
// 2^-4 * sqrt(2/3) = 0.05 (RMS) on N(0,1) inputs, independent of |s|; a row that sees one
// key has lse = s and keeps that whole error (many keys average it away): 6 sigma absolute.
inline double lse_tolerance(DType t, double ref) {
  return (is_fp8(t) ? 0.3 : 0.0) + 2e-2 * (1 + std::fabs(ref));
}

}  // namespace attn
