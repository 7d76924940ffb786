// Host model of rung 06's FP8 pre-kernel (06_fa3_hopper/fp8_quantize.cuh), in double:
// the random-sign Hadamard transform of a row and e4m3 decoding. The CPU tests check the
// model against its definition; the GPU test (test_fp8.cpp) checks the pre-kernel against
// the model at every FP8 head dim.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "06_fa3_hopper/fa3_fp8.h"

namespace attn::testing {

// y = x diag(s) H_d / sqrt(d) for one row of d values (d a power of two): the signs of
// fa3::hadamard_sign, then the fast Walsh-Hadamard transform in Sylvester order,
// H[i][j] = (-1)^popcount(i & j).
inline std::vector<double> hadamard_row(std::vector<double> x) {
  const size_t d = x.size();
  for (size_t c = 0; c < d; ++c) x[c] *= fa3::hadamard_sign(int(c));
  for (size_t h = 1; h < d; h *= 2)
    for (size_t c = 0; c < d; ++c)
      if (!(c & h)) {
        const double a = x[c], b = x[c + h];
        x[c] = a + b;
        x[c + h] = a - b;
      }
  for (double& v : x) v /= std::sqrt(double(d));
  return x;
}

// One e4m3 byte (1 sign, 4 exponent bits with bias 7, 3 mantissa bits; no infinities,
// S.1111.111 is NaN) -> its value.
inline double e4m3_value(uint8_t b) {
  const int sign = b >> 7, exponent = (b >> 3) & 15, mantissa = b & 7;
  if (exponent == 15 && mantissa == 7) return std::nan("");
  const double magnitude =
      exponent == 0 ? std::ldexp(mantissa, -9) : std::ldexp(1.0 + mantissa / 8.0, exponent - 7);
  return sign ? -magnitude : magnitude;
}

// The largest error of rounding y to e4m3 after dividing by `scale` (round to nearest):
// half a step, 2^-4 of y's power of two among normal numbers, 2^-10 among subnormals.
inline double e4m3_rounding_bound(double y, double scale) {
  return std::fmax(std::ldexp(std::fabs(y), -4), std::ldexp(scale, -10));
}

}  // namespace attn::testing
