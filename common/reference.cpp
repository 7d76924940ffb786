#include "common/reference.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <thread>

namespace attn {

namespace {

// The visible keys of row i: [0, end). Without masking end = Nk.
int64_t visible_end(const AttnProblem& p, int64_t i) {
  if (!p.causal) return p.Nk;
  return std::clamp<int64_t>(p.last_visible_key(i) + 1, 0, p.Nk);
}

const float* q_row(const AttnProblem& p, const HostInputs& in, const RowIndex& r) {
  return in.q.data() + ((int64_t(r.b) * p.H + r.h) * p.Nq + r.i) * p.d;
}
const float* kv_head(const AttnProblem& p, const std::vector<float>& t, const RowIndex& r) {
  int hkv = r.h / p.group();
  return t.data() + (int64_t(r.b) * p.Hkv + hkv) * p.Nk * p.d;
}

// Scores s_j = scale * q·k_j for the visible keys; returns their max.
double scores(const AttnProblem& p, const HostInputs& in, const RowIndex& r, std::vector<double>& s) {
  const float* q = q_row(p, in, r);
  const float* K = kv_head(p, in.k, r);
  int64_t end = visible_end(p, r.i);
  s.assign(end, 0.0);
  double m = -std::numeric_limits<double>::infinity();
  for (int64_t j = 0; j < end; ++j) {
    double dot = 0;
    for (int c = 0; c < p.d; ++c) dot += double(q[c]) * K[j * p.d + c];
    s[j] = double(p.softmax_scale()) * dot;
    m = std::max(m, s[j]);
  }
  return m;
}

void one_row(const AttnProblem& p, const HostInputs& in, const RowIndex& r, double* o, double* lse,
             std::vector<double>& s) {
  double m = scores(p, in, r, s);
  std::fill(o, o + p.d, 0.0);
  if (s.empty()) {
    *lse = -std::numeric_limits<double>::infinity();
    return;
  }
  const float* V = kv_head(p, in.v, r);
  double l = 0;
  for (size_t j = 0; j < s.size(); ++j) {
    double w = std::exp(s[j] - m);
    l += w;
    for (int c = 0; c < p.d; ++c) o[c] += w * V[j * p.d + c];
  }
  for (int c = 0; c < p.d; ++c) o[c] /= l;
  *lse = m + std::log(l);
}

}  // namespace

ReferenceRows reference_rows(const AttnProblem& p, const HostInputs& in, const std::vector<RowIndex>& rows) {
  ReferenceRows out;
  out.o.resize(rows.size() * p.d);
  out.lse.resize(rows.size());
  unsigned n_threads = std::max(1u, std::min<unsigned>(std::thread::hardware_concurrency(), 64));
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < n_threads; ++t)
    pool.emplace_back([&, t] {
      std::vector<double> s;
      for (size_t r = t; r < rows.size(); r += n_threads) one_row(p, in, rows[r], &out.o[r * p.d], &out.lse[r], s);
    });
  for (auto& th : pool) th.join();
  return out;
}

std::vector<double> reference_probs(const AttnProblem& p, const HostInputs& in, const RowIndex& row) {
  std::vector<double> s;
  double m = scores(p, in, row, s);
  std::vector<double> probs(p.Nk, 0.0);
  double l = 0;
  for (size_t j = 0; j < s.size(); ++j) l += std::exp(s[j] - m);
  for (size_t j = 0; j < s.size(); ++j) probs[j] = std::exp(s[j] - m) / l;
  return probs;
}

std::vector<RowIndex> all_rows(const AttnProblem& p) {
  std::vector<RowIndex> rows;
  rows.reserve(size_t(p.lse_elems()));
  for (int b = 0; b < p.B; ++b)
    for (int h = 0; h < p.H; ++h)
      for (int64_t i = 0; i < p.Nq; ++i) rows.push_back({b, h, i});
  return rows;
}

std::vector<RowIndex> sampled_rows(const AttnProblem& p, int per_head) {
  if (per_head >= p.Nq) return all_rows(p);
  std::vector<RowIndex> rows;
  for (int b = 0; b < p.B; ++b)
    for (int h = 0; h < p.H; ++h)
      for (int k = 0; k < per_head; ++k) {
        // Spread over [0, Nq-1], both ends included; offset by head so heads differ.
        int64_t i = per_head == 1 ? 0 : (int64_t(k) * (p.Nq - 1)) / (per_head - 1);
        if (k > 0 && k < per_head - 1) i = std::min<int64_t>(p.Nq - 2, i + (b * 7 + h * 13) % 5);
        rows.push_back({b, h, i});
      }
  return rows;
}

float bf16_to_float(uint16_t x) {
  uint32_t bits = uint32_t(x) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

float fp16_to_float(uint16_t x) {
  int sign = (x >> 15) & 1, exp = (x >> 10) & 0x1f, mant = x & 0x3ff;
  float v;
  if (exp == 0) v = std::ldexp(float(mant), -24);                       // subnormal
  else if (exp == 31) v = mant ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
  else v = std::ldexp(float(mant | 0x400), exp - 25);
  return sign ? -v : v;
}

std::vector<float> to_float(const std::vector<uint16_t>& raw, DType t) {
  std::vector<float> out(raw.size());
  for (size_t i = 0; i < raw.size(); ++i) out[i] = t == DType::bf16 ? bf16_to_float(raw[i]) : fp16_to_float(raw[i]);
  return out;
}

double rel_frobenius(const std::vector<double>& a, const std::vector<double>& b, double* max_abs) {
  double diff = 0, ref = 0, mx = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    double e = a[i] - b[i];
    if (std::isnan(e)) e = std::numeric_limits<double>::infinity();
    diff += e * e;
    ref += b[i] * b[i];
    mx = std::max(mx, std::fabs(e));
  }
  if (max_abs) *max_abs = mx;
  return ref > 0 ? std::sqrt(diff / ref) : std::sqrt(diff);
}

}  // namespace attn
