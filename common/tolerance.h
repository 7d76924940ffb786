// The accuracy bounds, in one place. Relative Frobenius error ||O - O_ref|| / ||O_ref||.
// Typical results are several times lower; a rung that drifts toward a bound has a bug.
#pragma once

#include "common/attention.h"

namespace attn {

inline double tolerance(DType t) {
  switch (t) {
    case DType::bf16: return 1e-2;
    case DType::fp16: return 3e-3;
    case DType::fp8_e4m3: return 1.2e-2;  // RMSE-style bound for the FP8 path (FA3 Table 3)
  }
  return 0;
}

}  // namespace attn
