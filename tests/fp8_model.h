// Host model of rung 06's FP8 pre-kernel (06_fa3_hopper/fp8_quantize.cuh), in double:
// the random-sign Hadamard transform of a row and e4m3 decoding. The CPU tests check the
// model against its definition; the GPU test (test_fp8.cpp) checks the pre-kernel against
// the model at every FP8 head dim.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "06_fa3_hopper/fa3_fp8.h"
#include "common/exp2_linear.h"

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

// exp2_linear (common/exp2_linear.h, device_math.cuh) on the host, step by step as the
// kernel takes it: z = fma(x, 1, offset), clamped, then the bit step.
inline float exp2_linear_host(float x) {
  const float z = std::fmax(std::fma(x, 1.f, exp2_linear_offset(0.f)), kExp2LinearFloor);
  uint32_t bits;
  std::memcpy(&bits, &z, sizeof bits);
  bits = exp2_linear_bits(bits);
  float y;
  std::memcpy(&y, &bits, sizeof y);
  return y;
}

// Where exp2_linear is checked: a fine grid of fractions in every unit from -125 to 9 (2^x
// a normal float: nearer -127 the result may be subnormal), then points whose 2^x must be
// exactly 0 (x <= -127, -inf).
struct Exp2LinearPoints {
  std::vector<float> x;
  size_t n_grid = 0;  // x[0, n_grid): the grid; the rest: the zeros
};
inline Exp2LinearPoints exp2_linear_points() {
  Exp2LinearPoints p;
  constexpr int kPerUnit = 4096;
  for (int i = -125; i < 9; ++i)
    for (int k = 0; k < kPerUnit; ++k) p.x.push_back(float(i) + float(k) / kPerUnit);
  p.n_grid = p.x.size();
  for (float t : {-127.f, -127.5f, -300.f, -1e30f, -INFINITY}) p.x.push_back(t);
  return p;
}

// y = 2^x as exp2_linear gives it, for the points above: relative error -3.9 % .. +2.0 %
// over the grid, zero on average (so that the entries the FP8 softmax takes this way weigh
// as much as the MUFU's), and exactly 0 at the zeros.
inline void expect_exp2_linear_bounds(const Exp2LinearPoints& p, const std::vector<float>& y) {
  ASSERT_EQ(y.size(), p.x.size());
  double lo = 0, hi = 0, sum = 0;
  for (size_t i = 0; i < p.n_grid; ++i) {
    const double rel = double(y[i]) / std::exp2(double(p.x[i])) - 1.0;
    lo = std::min(lo, rel);
    hi = std::max(hi, rel);
    sum += rel;
  }
  EXPECT_GE(lo, -0.040) << "2^x too low somewhere";
  EXPECT_LE(hi, 0.021) << "2^x too high somewhere";
  EXPECT_NEAR(sum / double(p.n_grid), 0.0, 2e-3) << "biased against the MUFU's 2^x";
  for (size_t i = p.n_grid; i < p.x.size(); ++i) EXPECT_EQ(y[i], 0.f) << "2^" << p.x[i];
}

}  // namespace attn::testing
