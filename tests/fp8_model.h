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

// The line of common/exp2_linear.h as a float, 2^(x - kExp2LinearShift) to within 4 %: what
// exp2_e4m3_linear's bytes are the e4m3 rounding of (the kernels took it this way, then an
// F2FP, before they took the byte directly). z = x + offset with the magic 1.5 * 2^10 in the
// offset (ulp 2^-13: z's mantissa field is 2^22 + 2^13 x), clamped at x = -127; shifted left
// by 10 (2^22 falls off the top) the field is 2^23 x, and adding 127 << 23 gives the bits
// 2^23 (x + 127) of 2^i (1 + f), +0 at the clamp.
inline float exp2_linear_host(float x) {
  constexpr float kMagic = 1536.f, kFloor = kMagic - 127.f;
  const float z = std::fmax(std::fma(x, 1.f, kMagic - kExp2LinearShift), kFloor);
  uint32_t bits;
  std::memcpy(&bits, &z, sizeof bits);
  bits = (bits << 10) + (127u << 23);
  float y;
  std::memcpy(&y, &bits, sizeof y);
  return y;
}

// Where the line is checked: a fine grid of fractions in every unit from -125 to 9 (2^x
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

// y = 2^x as the line gives it, for the points above: relative error -3.9 % .. +2.0 %
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

// e4m3_linear_grid (device_math.cuh) on the host, step by step as the kernel takes it.
inline float e4m3_linear_grid_host(float m) {
  const float k = std::fma(m + kExp2LinearShift, kE4m3LinearStep, kE4m3LinearMagic) - kE4m3LinearMagic;
  return std::fma(k, 1.f / kE4m3LinearStep, -kExp2LinearShift);
}

// exp2_e4m3_linear (device_math.cuh) on the host, as online_softmax calls it for a score s:
// the e4m3 byte of 2^(s s_log2 + c), c = p - m with m on e4m3_linear_grid.
inline uint8_t exp2_e4m3_linear_host(float s, float s_log2, float c) {
  const float z = std::fmax(std::fma(s, kE4m3LinearStep * s_log2, e4m3_linear_offset(c)), kE4m3LinearMagic);
  uint32_t bits;
  std::memcpy(&bits, &z, sizeof bits);
  return uint8_t(bits & 0xffu);
}

// Where exp2_e4m3_linear is checked: rows whose running max m is one of a few values from
// -1000 to 1234 (on the grid, then c = 8 - m as FP8's offset of 2^8 makes it), scores s
// from m down to m - 24 in steps of 2^-9 (2^(s - m + 8) from 2^8 down past e4m3's range),
// then -inf.
struct Exp2E4m3Points {
  std::vector<float> s, c;
};
inline Exp2E4m3Points exp2_e4m3_linear_points() {
  Exp2E4m3Points p;
  for (float m : {-1000.3f, -17.2f, -1.f, 0.f, 0.03f, 3.7f, 12.5f, 99.99f, 1234.5f}) {
    const float g = e4m3_linear_grid_host(m), c = 8.f - g;
    for (int k = 0; k <= 24 * 512; ++k) {
      p.s.push_back(g - float(k) / 512.f);
      p.c.push_back(c);
    }
    p.s.push_back(-INFINITY);
    p.c.push_back(c);
  }
  return p;
}

// The bytes for the points above: where 2^(x - shift) (x = s + c) is an e4m3 normal number,
// exactly round(8 (x - shift) + 56) (ties to even, and off by one only where 8 (x - shift)
// lies within 2^-10 of a tie, which the float arithmetic may round either way), so within
// half an e4m3 step of the line as a float (exp2_linear_host): its e4m3 rounding; below, a
// byte of at most 2^-6; never above 2^8, and 0 at -inf.
inline void expect_exp2_e4m3_linear_bytes(const Exp2E4m3Points& p, const std::vector<uint8_t>& b) {
  ASSERT_EQ(b.size(), p.s.size());
  int checked_normal = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    if (p.s[i] == -INFINITY) {
      EXPECT_EQ(b[i], 0) << "2^-inf";
      continue;
    }
    const double y = (double(p.s[i]) + double(p.c[i]) - double(kExp2LinearShift)) * kE4m3LinearStep + 56.0;
    ASSERT_LE(b[i], 0x78) << "s " << p.s[i] << " c " << p.c[i] << ": above 2^8";
    if (y >= 8.0) {  // 2^(x - shift) >= 2^-6
      const double tie_distance = std::fabs(y - std::floor(y) - 0.5);
      if (tie_distance > 1.0 / 1024)
        ASSERT_EQ(b[i], uint8_t(std::nearbyint(y))) << "s " << p.s[i] << " c " << p.c[i];
      else
        ASSERT_LE(std::fabs(double(b[i]) - y), 0.5 + 1.0 / 1024) << "s " << p.s[i] << " c " << p.c[i];
      const double line = exp2_linear_host(p.s[i] + p.c[i]);
      ASSERT_LE(std::fabs(e4m3_value(b[i]) - line), std::ldexp(line, -4) * (1 + 1e-3))
          << "s " << p.s[i] << " c " << p.c[i] << ": not the line's e4m3 rounding";
      ++checked_normal;
    } else {
      ASSERT_LE(e4m3_value(b[i]), std::ldexp(1.0, -6)) << "s " << p.s[i] << " c " << p.c[i];
    }
  }
  EXPECT_GT(checked_normal, int(b.size() / 2));
}

}  // namespace attn::testing
