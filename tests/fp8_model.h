// Host model of rung 06's FP8 pre-kernel (06_fa3_hopper/fp8_quantize.cuh), in double:
// the random-sign Hadamard transform of a row and e4m3 decoding. The CPU tests check the
// model against its definition; the GPU test (test_fp8.cpp) checks the pre-kernel against
// the model at every FP8 head dim. Below them, the whole FP8 forward (fp8_forward_model),
// each rounding switchable: where O's error comes from.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "06_fa3_hopper/fa3_fp8.h"
#include "common/exp2_linear.h"
#include "common/reference.h"

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

// ---------------------------------------------------------------------------------------
// The whole FP8 forward on the host, step by step as the pre-kernel (fp8_quantize.cuh) and
// the attention kernel (fp8h_fa3.cuh) take it, in double, each rounding switchable: where
// O's error comes from (tests/test_cpu.cpp, Fp8Model.*; the GPU test
// Fp8PeakedSoftmaxIsTheModelsAndWithinItsBound compares the kernels with it). Not modelled:
// the QGMMA's accumulation, which keeps fewer bits than fp32 (far below e4m3's steps).

// x rounded to e4m3 as cvt.rn.satfinite does it: to nearest, ties to even, 3 mantissa bits
// (steps of 2^-9 below the smallest normal 2^-6), at most 448.
inline double e4m3_round(double x) {
  if (x == 0 || std::isnan(x)) return x;
  int e;
  std::frexp(std::fabs(x), &e);  // |x| in [2^(e-1), 2^e)
  const double step = std::ldexp(1.0, std::max(e - 1, -6) - 3);
  return std::copysign(std::min(std::nearbyint(std::fabs(x) / step) * step, double(fa3::kE4m3Max)), x);
}

// x as a bf16 (to nearest, ties to even): O as the kernel stores it.
inline double bf16_round(double x) {
  const float f = float(x);
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  bits = (bits + 0x7fffu + ((bits >> 16) & 1u)) & 0xffff0000u;
  float r;
  std::memcpy(&r, &bits, sizeof r);
  return r;
}

// Which roundings the model takes. Each FP8 stage is one setting (fp8_model_options); the
// others switch one rounding off to measure its share.
struct Fp8ModelOptions {
  bool hadamard = true;      // Q and K times M = diag(s) H_d / sqrt(d) (Fp8Options)
  bool block_scales = true;  // one scale per block (Q: 64 rows, K and V: B_c); else per tensor
  bool round_qk = true;      // Q̂ and K̂ rounded to e4m3 (off: Q M and K M as they are)
  bool round_v = true;       // V̂ rounded to e4m3
  bool round_p = true;       // P rounded to e4m3 as the softmax makes it (off: 2^x exact)
};

// The setting of FP8 stage `stage`. 06_fp8_e4m3 takes the caller's e4m3 values as they are
// (in.host holds them times their descales): only P is rounded.
inline Fp8ModelOptions fp8_model_options(const std::string& stage) {
  const bool e4m3_inputs = stage == "06_fp8_e4m3";
  Fp8ModelOptions o;  // 06_fp8's roundings, and those of its variants that quantize alike
  o.hadamard = !e4m3_inputs && stage != "06_fp8_no_hadamard" && stage != "06_fp8_per_tensor";
  o.block_scales = stage != "06_fp8_per_tensor_hadamard" && stage != "06_fp8_per_tensor";
  o.round_qk = o.round_v = !e4m3_inputs;
  return o;
}

// x [heads][N][d] as the attention kernel reads it: each block of block_rows rows of a head
// (or the whole tensor) times 1 / scale, scale = amax / 448 in float, rounded, times scale.
inline void quantize_model(std::vector<double>& x, int64_t heads, int64_t N, int d, int block_rows,
                           bool block_scales) {
  double tensor_amax = 0;
  for (double v : x) tensor_amax = std::max(tensor_amax, std::fabs(v));
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t r0 = 0; r0 < N; r0 += block_rows) {
      double* block = &x[(h * N + r0) * d];
      const int64_t n = std::min<int64_t>(block_rows, N - r0) * d;
      double amax = tensor_amax;
      if (block_scales) {
        amax = 0;
        for (int64_t e = 0; e < n; ++e) amax = std::max(amax, std::fabs(block[e]));
      }
      const float scale = amax > 0 ? std::max(float(amax) / fa3::kE4m3Max, FLT_MIN) : 1.f;
      const float inv_scale = 1.f / scale;
      for (int64_t e = 0; e < n; ++e) block[e] = e4m3_round(float(block[e]) * inv_scale) * scale;
    }
}

// Whether column `col` of a K/V block takes its 2^x by exp2_e4m3_linear at d <= 128
// (fp8h_fa3.cuh: linear_exp_pair with kLinearExps = 6, V̂ᵀ's keys permuted): column col is
// pair col / 8 of its thread's entries, and 6 of every 8 pairs go that way. (With the keys
// in order other pairs go, as many: the error is the same, not every P bit for bit.)
inline bool fp8_linear_exp_column(int col) {
  const int pair = col / 8, reg = pair / 2 % 4;
  return 2 * (reg % 2 * 2 + reg / 2) + pair % 2 < 6;
}

constexpr float kFp8POffsetLog2 = 8;  // P = 2^8 exp(S - m): fp8h_fa3.cuh, Config::kPOffsetLog2

struct Fp8ModelOutput {
  std::vector<double> o;    // [B, H, Nq, d]
  std::vector<double> lse;  // [B, H, Nq], natural log (-inf where a row sees no key)
};

// The FP8 forward of problem p on `in` (bf16 values; for 06_fp8_e4m3 the e4m3 values times
// their descales), block by block as one consumer row runs it: m_i (on e4m3_linear_grid at
// d <= 128), P = 2^(8 + s - m_i) rounded to e4m3 (by the line's byte in 6 of every 8 pairs
// at d <= 128, else 2^x then the rounding), l_i the sum of the rounded P (the row-sum column,
// d <= 128) or of 2^x before rounding (d = 256), O_i = sum of P V̂ over l_i, stored as bf16.
inline Fp8ModelOutput fp8_forward_model(const AttnProblem& p, const HostInputs& in, const Fp8ModelOptions& opt) {
  const int d = p.d, B_c = fa3::fp8_block_cols(d);
  const bool linear_exps = d <= 128, row_sum_column = d + 8 <= 256;
  auto kernel_view = [&](const std::vector<float>& src, int64_t heads, int64_t N, int block_rows, bool hadamard,
                         bool round) {
    std::vector<double> x(src.begin(), src.end());
    if (hadamard)
      for (int64_t r = 0; r < heads * N; ++r) {
        const std::vector<double> row = hadamard_row(std::vector<double>(x.begin() + r * d, x.begin() + (r + 1) * d));
        std::copy(row.begin(), row.end(), x.begin() + r * d);
      }
    if (round) quantize_model(x, heads, N, d, block_rows, opt.block_scales);
    return x;
  };
  const std::vector<double> q = kernel_view(in.q, int64_t(p.B) * p.H, p.Nq, fa3::kFp8QBlockRows, opt.hadamard,
                                            opt.round_qk);
  const std::vector<double> k = kernel_view(in.k, int64_t(p.B) * p.Hkv, p.Nk, B_c, opt.hadamard, opt.round_qk);
  const std::vector<double> v = kernel_view(in.v, int64_t(p.B) * p.Hkv, p.Nk, B_c, false, opt.round_v);
  const float s_log2 = float(double(p.softmax_scale()) * M_LOG2E);
  Fp8ModelOutput out{std::vector<double>(size_t(p.o_elems()), 0.0),
                     std::vector<double>(size_t(p.B) * p.H * p.Nq, -INFINITY)};
  std::vector<double> s(static_cast<size_t>(B_c)), o(static_cast<size_t>(d));
  for (int64_t bh = 0; bh < int64_t(p.B) * p.H; ++bh) {
    const int64_t kv_head = bh / p.H * p.Hkv + bh % p.H / (p.H / p.Hkv);
    for (int64_t i = 0; i < p.Nq; ++i) {
      const double* q_i = &q[(bh * p.Nq + i) * d];
      const int64_t keys = p.causal ? std::min<int64_t>(p.Nk, i + 1 + p.Nk - p.Nq) : p.Nk;  // bottom-right
      float m = -INFINITY;
      double l = 0;
      std::fill(o.begin(), o.end(), 0.0);
      for (int64_t j0 = 0; j0 < keys; j0 += B_c) {
        const int n = int(std::min<int64_t>(B_c, keys - j0));
        float m_new = m;
        for (int c = 0; c < n; ++c) {
          const double* k_j = &k[(kv_head * p.Nk + j0 + c) * d];
          double dot = 0;
          for (int e = 0; e < d; ++e) dot += q_i[e] * k_j[e];
          s[c] = dot;
          m_new = std::max(m_new, float(dot) * s_log2);
        }
        if (linear_exps) m_new = e4m3_linear_grid_host(m_new);
        const double alpha = m == -INFINITY ? 0.0 : std::exp2(double(m) - m_new);
        m = m_new;
        for (double& x : o) x *= alpha;
        l *= alpha;
        for (int c = 0; c < n; ++c) {
          const double exact = std::exp2(s[c] * s_log2 + kFp8POffsetLog2 - m_new);
          double p_ij = exact;
          if (opt.round_p)
            p_ij = linear_exps && fp8_linear_exp_column(c)
                       ? e4m3_value(exp2_e4m3_linear_host(float(s[c]), s_log2, kFp8POffsetLog2 - m_new))
                       : e4m3_round(exact);
          l += row_sum_column ? p_ij : exact;
          const double* v_j = &v[(kv_head * p.Nk + j0 + c) * d];
          for (int e = 0; e < d; ++e) o[e] += p_ij * v_j[e];
        }
      }
      if (keys <= 0) continue;  // a row that sees no key: O = 0, lse = -inf
      for (int e = 0; e < d; ++e) out.o[size_t((bh * p.Nq + i) * d + e)] = bf16_round(o[e] / l);
      out.lse[size_t(bh * p.Nq + i)] = double(m) * M_LN2 + std::log(l) - kFp8POffsetLog2 * M_LN2;
    }
  }
  return out;
}

}  // namespace attn::testing
