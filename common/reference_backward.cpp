#include "common/reference_backward.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <thread>

namespace attn {

namespace {

// fn(x) for x in [0, n), spread over the hardware threads.
template <class Fn>
void parallel_for(int64_t n, Fn fn) {
  const unsigned n_threads = std::max(1u, std::min<unsigned>(std::thread::hardware_concurrency(), 64));
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < n_threads; ++t)
    pool.emplace_back([&, t] {
      for (int64_t x = t; x < n; x += n_threads) fn(x);
    });
  for (auto& th : pool) th.join();
}

double dot(const float* a, const float* b, int d) {
  double s = 0;
  for (int c = 0; c < d; ++c) s += double(a[c]) * b[c];
  return s;
}

}  // namespace

ReferenceGrads reference_backward(const AttnProblem& p, const HostInputs& in, const std::vector<float>& dout) {
  const int d = p.d;
  const double scale = p.softmax_scale();
  const int64_t off = int64_t(p.Nk) - p.Nq;  // bottom-right causal: row i sees keys j <= i + off
  // Keys [0, end) visible to row i.
  auto key_end = [&](int64_t i) { return p.causal ? std::clamp<int64_t>(i + off + 1, 0, p.Nk) : int64_t(p.Nk); };
  auto q_row = [&](const std::vector<float>& t, int64_t bh, int64_t i) { return t.data() + (bh * p.Nq + i) * d; };
  auto kv_row = [&](const std::vector<float>& t, int64_t bh_kv, int64_t j) { return t.data() + (bh_kv * p.Nk + j) * d; };
  auto kv_head = [&](int64_t bh) { return bh / p.H * p.Hkv + bh % p.H / p.group(); };

  ReferenceGrads g;
  g.dq.assign(size_t(p.q_elems()), 0.0);
  g.dk.assign(size_t(p.kv_elems()), 0.0);
  g.dv.assign(size_t(p.kv_elems()), 0.0);
  // c_i = sum_k P_ik dP_ik per row: the softmax Jacobian's contraction, which pass 2 needs too.
  std::vector<double> lse(size_t(p.lse_elems())), c(size_t(p.lse_elems()));

  // Pass 1, one query row each: s_j, lse, P_ij, dP_ij = dO_i . v_j, and through the softmax's
  // Jacobian (dP_i . dP_i/ds_ij, written out) dS_ij = P_ij dP_ij - P_ij sum_k P_ik dP_ik;
  // dQ_i = scale sum_j dS_ij k_j. No shortcut for the sum: this is the ground truth.
  parallel_for(p.lse_elems(), [&](int64_t row) {
    const int64_t bh = row / p.Nq, i = row % p.Nq, bh_kv = kv_head(bh), end = key_end(i);
    const float* q = q_row(in.q, bh, i);
    const float* dO = q_row(dout, bh, i);
    if (end == 0) {  // sees no key: O = 0, no gradient
      lse[row] = -std::numeric_limits<double>::infinity();
      c[row] = 0;
      return;
    }
    std::vector<double> P(end), dP(end);
    double m = -std::numeric_limits<double>::infinity();
    for (int64_t j = 0; j < end; ++j) {
      P[j] = scale * dot(q, kv_row(in.k, bh_kv, j), d);
      m = std::max(m, P[j]);
    }
    double l = 0;
    for (int64_t j = 0; j < end; ++j) l += std::exp(P[j] - m);
    lse[row] = m + std::log(l);
    double ci = 0;
    for (int64_t j = 0; j < end; ++j) {
      P[j] = std::exp(P[j] - lse[row]);
      dP[j] = dot(dO, kv_row(in.v, bh_kv, j), d);
      ci += P[j] * dP[j];
    }
    c[row] = ci;
    double* dq = g.dq.data() + row * d;
    for (int64_t j = 0; j < end; ++j) {
      const double dS = P[j] * dP[j] - P[j] * ci;
      const float* k = kv_row(in.k, bh_kv, j);
      for (int cc = 0; cc < d; ++cc) dq[cc] += scale * dS * k[cc];
    }
  });

  // Pass 2, one key each: over the query heads of its group and the rows that see it,
  // dV_j = sum_i P_ij dO_i, dK_j = scale sum_i dS_ij q_i.
  parallel_for(p.kv_elems() / d, [&](int64_t key) {
    const int64_t bh_kv = key / p.Nk, j = key % p.Nk;
    const int64_t b = bh_kv / p.Hkv, h_kv = bh_kv % p.Hkv;
    const float* k = kv_row(in.k, bh_kv, j);
    const float* v = kv_row(in.v, bh_kv, j);
    double* dk = g.dk.data() + key * d;
    double* dv = g.dv.data() + key * d;
    const int64_t first_row = p.causal ? std::max<int64_t>(0, j - off) : 0;
    for (int64_t h = h_kv * p.group(); h < (h_kv + 1) * p.group(); ++h) {
      const int64_t bh = b * p.H + h;
      for (int64_t i = first_row; i < p.Nq; ++i) {
        const int64_t row = bh * p.Nq + i;
        const float* q = q_row(in.q, bh, i);
        const float* dO = q_row(dout, bh, i);
        const double P = std::exp(scale * dot(q, k, d) - lse[row]);
        const double dP = dot(dO, v, d);
        const double dS = P * dP - P * c[row];
        for (int cc = 0; cc < d; ++cc) {
          dv[cc] += P * dO[cc];
          dk[cc] += scale * dS * q[cc];
        }
      }
    }
  });
  return g;
}

}  // namespace attn
