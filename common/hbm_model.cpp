#include "common/hbm_model.h"

#include <algorithm>

namespace attn::hbm {

namespace {
double heads(const AttnProblem& p) { return double(p.B) * p.H; }
double e(const AttnProblem& p) { return double(dtype_bytes(p.dtype)); }
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
}  // namespace

double visible_pairs(const AttnProblem& p) {
  if (!p.causal) return double(p.Nq) * p.Nk;
  double pairs = 0;
  for (int64_t i = 0; i < p.Nq; ++i) pairs += double(std::clamp<int64_t>(p.last_visible_key(i) + 1, 0, p.Nk));
  return pairs;
}

int64_t keys_loaded(const AttnProblem& p, int64_t row_begin, int64_t row_end, int block_cols) {
  if (!p.causal) return p.Nk;
  int64_t visible = std::clamp<int64_t>(p.last_visible_key(row_end - 1) + 1, 0, p.Nk);
  return std::min<int64_t>(p.Nk, ceil_div(visible, block_cols) * block_cols);
}

double flops(const AttnProblem& p) { return 4.0 * p.d * visible_pairs(p) * heads(p); }

double min_bytes(const AttnProblem& p) {
  // Q, K, V read once as the launch takes them (bf16 for the FP8 rung that quantizes them
  // itself, e4m3 for 06_fp8_e4m3), O written once in its storage type.
  const double in = p.dtype == DType::e4m3 ? 1.0 : double(dtype_bytes(storage_dtype(p.dtype)));
  const double out = double(dtype_bytes(storage_dtype(p.dtype)));
  return in * (double(p.q_elems()) + 2.0 * p.kv_elems()) + out * p.q_elems();
}

double score_pipeline_bytes(const AttnProblem& p, int softmax_reads) {
  double S = double(p.score_elems());
  double qo = 2.0 * p.q_elems();                  // Q read by GEMM 1, O written by GEMM 2
  double kv = 2.0 * heads(p) * p.Nk * p.d;        // K read by GEMM 1, V by GEMM 2 (per query head)
  double gemms = e(p) * (qo + kv) + 4.0 * S /* S written */ + e(p) * S /* P read */;
  return gemms + softmax_bytes(p, softmax_reads);
}

double softmax_bytes(const AttnProblem& p, int softmax_reads) {
  // Each pass reads only the visible part of a row of S; P is written in full (zeros
  // where masked) because the PV GEMM reads all of it.
  double visible = visible_pairs(p) * heads(p);
  return 4.0 * visible * softmax_reads + e(p) * double(p.score_elems());
}

double fused_rowwise_bytes(const AttnProblem& p) {
  return e(p) * (2.0 * p.q_elems() + 2.0 * p.d * visible_pairs(p) * heads(p));
}

double fa1_bytes(const AttnProblem& p, int Br, int Bc) {
  // Per (batch, head). Row statistics and the O accumulator are fp32.
  double per_row_step = e(p) * p.d /* Q_i */ + 2.0 * 4 * p.d /* O_i read+write */ + 2.0 * 2 * 4 /* l_i, m_i */;
  double inner = 0;  // sum over visible (i, j) block pairs of the rows in block i
  for (int64_t j0 = 0; j0 < p.Nk; j0 += Bc)
    for (int64_t i0 = 0; i0 < p.Nq; i0 += Br) {
      int64_t i1 = std::min<int64_t>(i0 + Br, p.Nq);
      if (keys_loaded(p, i0, i1, Bc) > j0) inner += double(i1 - i0);
    }
  double kv = 2.0 * e(p) * p.Nk * p.d;                            // K_j, V_j once
  double init = p.Nq * (4.0 * p.d + 2 * 4);                       // O = 0, l = 0, m = -inf
  double finish = p.Nq * (4.0 * p.d /* read O */ + 8 /* m, l */ + 4 /* lse */ + e(p) * p.d /* write O */);
  return heads(p) * (inner * per_row_step + kv + init + finish);
}

double fa2_bytes(const AttnProblem& p, int Br, int Bc) {
  double kv_rows = 0;
  for (int64_t i0 = 0; i0 < p.Nq; i0 += Br)
    kv_rows += double(keys_loaded(p, i0, std::min<int64_t>(i0 + Br, p.Nq), Bc));
  double per_head = e(p) * 2.0 * p.Nq * p.d /* Q, O */ + 4.0 * p.Nq /* lse */ + 2.0 * e(p) * p.d * kv_rows;
  return heads(p) * per_head;
}

double fa2_backward_bytes(const AttnProblem& p, int Br, int Bc, int dq_adds) {
  const double E = e(p), d = p.d;
  double step_rows = 0;  // per query head: rows of every visible (Q block, K/V block) pair
  for (int64_t i0 = 0; i0 < p.Nq; i0 += Br) {
    const int64_t i1 = std::min<int64_t>(i0 + Br, p.Nq);
    step_rows += double(i1 - i0) * double(ceil_div(keys_loaded(p, i0, i1, Bc), Bc));
  }
  const double kv_heads = double(p.B) * p.Hkv;
  const double pre = heads(p) * p.Nq * (2.0 * E * d /* O, dO */ + 4.0 /* D */ + 4.0 * d /* dQ_acc = 0 */);
  const double kv = kv_heads * p.Nk * d * E * 4.0;  // K_j, V_j read, dK_j, dV_j written, once each
  const double steps = heads(p) * step_rows * (2.0 * E * d /* Q_i, dO_i */ + 8.0 /* L_i, D_i */ + 8.0 * d * dq_adds /* dQ_acc += */);
  const double post = heads(p) * p.Nq * d * (4.0 + E);  // dQ_acc read, dQ written
  return pre + kv + steps + post;
}

double decode_bytes(const AttnProblem& p, int splits, int row_blocks) {
  const double rows = heads(p) * p.Nq;
  const double kv = 2.0 * e(p) * double(p.kv_elems()) * row_blocks;  // K and V, once per KV head and row block
  // O^(s) and L^(s): written, read back by the combine (one split writes O directly)
  const double partials = splits > 1 ? 2.0 * 4.0 * rows * splits * (p.d + 1) : 0.0;
  return e(p) * 2.0 * p.q_elems() /* Q, O */ + kv + partials + 4.0 * rows /* lse */;
}

}  // namespace attn::hbm
