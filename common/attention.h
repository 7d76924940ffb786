// The problem every rung solves, and the tensors it reads and writes.
//
//   O = softmax(scale · Q Kᵀ + mask) V        per (batch b, head h)
//
// Layout: contiguous [B, H, N, d] (PyTorch SDPA order). Q and O have H heads, K and V
// have Hkv heads; query head h reads key/value head h / (H / Hkv) (grouped-query
// attention; Hkv = H is ordinary multi-head attention).
//
// Causal masking is aligned to the bottom-right corner (FlashAttention >= 2.1):
// query row i sees key column j iff j <= i + (Nk - Nq). With Nq = Nk that is the
// usual lower triangle. A query row that sees no key at all (possible when Nq > Nk)
// has O = 0 and logsumexp = -inf.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

namespace attn {

// fp8_e4m3 ("fp8"): bf16 Q, K, V that the FP8 path quantizes to e4m3 itself (its first
// kernel). e4m3: Q, K, V already in e4m3 (one byte each), with their descales
// (AttnTensors); O in bf16.
enum class DType { bf16, fp16, fp8_e4m3, e4m3 };

const char* dtype_name(DType t);
// The element type of O in memory, and of Q, K and V but for e4m3 (their e4m3 bytes). fp8
// problems store bf16.
inline DType storage_dtype(DType t) { return t == DType::fp8_e4m3 || t == DType::e4m3 ? DType::bf16 : t; }
DType parse_dtype(const std::string& s);  // "bf16" | "fp16" | "fp8" | "e4m3"; throws on anything else
size_t dtype_bytes(DType t);  // per element of Q, K, V as the attention kernel reads them: 1 for fp8 and e4m3

struct AttnProblem {
  int B = 1;       // batch
  int H = 1;       // query heads
  int Hkv = 1;     // key/value heads (divides H)
  int Nq = 1;      // query length
  int Nk = 1;      // key/value length
  int d = 64;      // head dimension
  bool causal = false;
  DType dtype = DType::bf16;
  float scale = 0.f;  // softmax scale; 0 means the default 1/sqrt(d)

  float softmax_scale() const { return scale > 0.f ? scale : 1.f / std::sqrt(float(d)); }
  int group() const { return H / Hkv; }  // query heads per key/value head

  int64_t q_elems() const { return int64_t(B) * H * Nq * d; }
  int64_t kv_elems() const { return int64_t(B) * Hkv * Nk * d; }  // K (and V, each)
  int64_t o_elems() const { return q_elems(); }
  int64_t lse_elems() const { return int64_t(B) * H * Nq; }
  int64_t score_elems() const { return int64_t(B) * H * Nq * Nk; }  // S or P

  // First key column a query row may see is 0; the last is this (causal only).
  // Negative means the row sees no key.
  int64_t last_visible_key(int64_t i) const { return i + (int64_t(Nk) - Nq); }

  std::string describe() const;  // "B=1 H=16 Hkv=16 Nq=4096 Nk=4096 d=128 causal bf16"
};

struct AttnTensors {
  const void* q = nullptr;  // [B, H,   Nq, d]
  const void* k = nullptr;  // [B, Hkv, Nk, d]
  const void* v = nullptr;  // [B, Hkv, Nk, d]
  void* o = nullptr;        // [B, H,   Nq, d]  (all four in storage_dtype(problem.dtype))
  float* lse = nullptr;     // [B, H, Nq] natural-log logsumexp; optional (may be null)
  void* workspace = nullptr;     // device scratch of Stage::workspace_bytes(problem)
  size_t workspace_bytes = 0;
  // e4m3 inputs only (DType::e4m3; required there): fp32 dequantization scales, one per block
  // of rows (Stage::descale_blocks): Q = q_descale * Q8 on each block of Q, and so for K, V.
  const float* q_descale = nullptr;  // [B, H,   ceil(Nq / q_rows)]
  const float* k_descale = nullptr;  // [B, Hkv, ceil(Nk / kv_rows)]
  const float* v_descale = nullptr;  // [B, Hkv, ceil(Nk / kv_rows)]
};

// The backward pass (Stage::launch_backward): given dO = dL/dO, the gradients of Q, K, V.
// With P = softmax(scale · Q Kᵀ + mask) recomputed from Q, K and the forward's lse:
//
//   dV = Pᵀ dO,   dP = dO Vᵀ,   dS = P ∘ (dP − D) with D = rowsum(dO ∘ O),
//   dQ = scale · dS K,   dK = scale · dSᵀ Q
//
// GQA: dK and dV of key/value head g sum the contributions of the query heads that read it.
// A query row that sees no key (lse = -inf) contributes nothing and gets dQ = 0.
struct AttnBwdTensors {
  const void* q = nullptr;     // [B, H,   Nq, d]
  const void* k = nullptr;     // [B, Hkv, Nk, d]
  const void* v = nullptr;     // [B, Hkv, Nk, d]
  const void* o = nullptr;     // [B, H,   Nq, d]  the forward's output
  const void* dout = nullptr;  // [B, H,   Nq, d]  dL/dO
  const float* lse = nullptr;  // [B, H, Nq] the forward's logsumexp (fp32, natural log)
  void* dq = nullptr;          // [B, H,   Nq, d]
  void* dk = nullptr;          // [B, Hkv, Nk, d]
  void* dv = nullptr;          // [B, Hkv, Nk, d]  (all seven in the problem's dtype: bf16 or fp16)
  void* workspace = nullptr;   // device scratch of Stage::backward_workspace(problem)
  size_t workspace_bytes = 0;
  // dO's strides in elements (batch, head, row), its d elements contiguous; all 0: contiguous
  // [B, H, Nq, d]. Other strides only for a rung whose Stage::backward_strided_dout is set: in
  // a training step dL/dO arrives as a [B, Nq, H, d] tensor's transpose, and copying it costs
  // more than reading it in place.
  int64_t dout_strides[3] = {0, 0, 0};
};

// dO's strides (batch, head, row) in elements, the zeros of a contiguous tensor filled in.
inline void dout_strides_of(const AttnProblem& p, const AttnBwdTensors& t, int64_t (&out)[3]) {
  const bool given = t.dout_strides[0] || t.dout_strides[1] || t.dout_strides[2];
  out[0] = given ? t.dout_strides[0] : int64_t(p.H) * p.Nq * p.d;
  out[1] = given ? t.dout_strides[1] : int64_t(p.Nq) * p.d;
  out[2] = given ? t.dout_strides[2] : p.d;
}

// Whether those strides are a contiguous [B, H, Nq, d] tensor's.
inline bool dout_strides_dense(const AttnProblem& p, const int64_t (&s)[3]) {
  return s[0] == int64_t(p.H) * p.Nq * p.d && s[1] == int64_t(p.Nq) * p.d && s[2] == p.d;
}

}  // namespace attn
