// The PyTorch operators attn_ladder::attention, attention_backward, attention_e4m3 and
// decode_paged, registered from C++ (libattn_ladder_torch.so, built when CMake finds torch; loaded by
// python/attn_ladder/ops.py with torch.ops.load_library).
//
// Why C++: a call then crosses from Python into C++ once (the dispatcher), and everything
// after it (the checks, the output and workspace allocations from PyTorch's caching
// allocator, the stream, the C API's launch, autograd's node) runs in C++, as SDPA's call
// does. The same operators defined in Python (ops.py's fallback, torch.library.custom_op
// over the ctypes binding) enter Python two or three times per call.
//
// Same schemas, checks and messages as the Python fallback: bad tensors raise ValueError
// (TORCH_CHECK_VALUE); a refusal of the C API raises RuntimeError "attn_ladder '<rung>'
// failed (<what>): <message>", which attn_ladder.attention() turns into AttnLadderError. The
// fake (meta) implementations stay in Python (ops.py, torch.library.register_fake).
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/DeviceGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/autograd.h>
#include <torch/csrc/autograd/autograd_not_implemented_fallback.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "ladder/c_api.h"

namespace {

using at::Tensor;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr size_t kErrLen = 2048;  // the C API's error message buffer
constexpr int kFp8 = 2, kE4m3 = 3;  // attn_problem_t.dtype codes (ladder/c_api.h)

// ---- messages in Python's spelling (the tests and users match them) ----

std::string dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "torch.float32";
    case at::kDouble: return "torch.float64";
    case at::kHalf: return "torch.float16";
    case at::kBFloat16: return "torch.bfloat16";
    case at::kFloat8_e4m3fn: return "torch.float8_e4m3fn";
    case at::kInt: return "torch.int32";
    case at::kLong: return "torch.int64";
    case at::kByte: return "torch.uint8";
    case at::kBool: return "torch.bool";
    default: return std::string("torch.") + c10::toString(t);
  }
}

template <class Sizes>
std::string shape_str(const Sizes& s) {  // a Python tuple: (2, 4, 113, 64), (5,)
  std::ostringstream os;
  os << "(";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << (s.size() == 1 ? ",)" : ")");
  return os.str();
}

std::string list_str(const std::vector<int>& v) {  // a Python list: [64, 128]
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
  os << "]";
  return os.str();
}

// ---- what the library says about its rungs, asked once ----

struct RungFacts {
  std::string name;
  bool writes_lse = false;
  std::vector<int> backward_dims;
  bool strided_dout = false;  // its backward reads dout with its own strides
};

const std::vector<RungFacts>& rung_facts() {
  static const std::vector<RungFacts> facts = [] {
    std::vector<RungFacts> all;
    char err[kErrLen];
    for (int i = 0; i < attn_num_rungs(); ++i) {
      RungFacts f;
      f.name = attn_rung_name(i);
      attn_rung_info_t info{};
      if (attn_rung_info(f.name.c_str(), &info, err, kErrLen) == ATTN_OK) f.writes_lse = info.writes_lse != 0;
      int dims[ATTN_MAX_HEAD_DIMS] = {}, count = 0;
      if (attn_backward_info(f.name.c_str(), dims, &count, err, kErrLen) == ATTN_OK)
        f.backward_dims.assign(dims, dims + count);
      int strided = 0;
      if (attn_backward_strided_dout(f.name.c_str(), &strided, err, kErrLen) == ATTN_OK) f.strided_dout = strided != 0;
      all.push_back(std::move(f));
    }
    return all;
  }();
  return facts;
}

const RungFacts* find_rung(c10::string_view name) {
  for (const RungFacts& f : rung_facts())
    if (name == f.name) return &f;
  return nullptr;  // unknown: the C API refuses it with the list of rungs
}

// dout as `rung`'s backward reads it (_capi.py's dout_for): as it lies where the rung takes
// strides and its rows are 16-byte aligned (dL/dO of a [B, N, H, d] activation's transpose),
// else a contiguous copy. On real tensors only: attention_backward's CUDA kernel, not the
// autograd function that torch.compile traces with fake ones.
Tensor dout_for(const std::string& rung, const Tensor& dout) {
  if (dout.is_contiguous()) return dout;
  const RungFacts* f = find_rung(rung);
  const int64_t per16 = 16 / int64_t(dout.element_size());
  bool fits = f && f->strided_dout && dout.dim() == 4 && dout.stride(3) == 1 &&
              reinterpret_cast<uintptr_t>(dout.data_ptr()) % 16 == 0;
  for (int i = 0; fits && i < 3; ++i) fits = dout.stride(i) > 0 && dout.stride(i) % per16 == 0;
  return fits ? dout : dout.contiguous();
}

// ops.py's _no_backward_message, word for word.
std::string no_backward_message(const std::string& rung, int64_t d, bool fp8) {
  const RungFacts* f = find_rung(rung);
  const std::vector<int> dims = fp8 || !f ? std::vector<int>{} : f->backward_dims;
  std::string why = !dims.empty() ? "has a backward pass for d in " + list_str(dims) + " only, not d = " +
                                        std::to_string(d)
                    : fp8         ? "has no backward pass (the FP8 path is forward only)"
                                  : "has no backward pass";
  std::string with_backward;
  for (const RungFacts& r : rung_facts())
    if (!r.backward_dims.empty()) with_backward += (with_backward.empty() ? "" : ", ") + r.name;
  return "attn_ladder: rung '" + rung + "' " + why + "; differentiate through one that has (" + with_backward +
         "), or run it under torch.no_grad() / on tensors that do not require grad";
}

// ---- checks (python/attn_ladder/_capi.py's, same order and words) ----

void check_inputs(const Tensor& q, const Tensor& k, const Tensor& v) {
  const std::pair<const char*, const Tensor*> named[] = {{"q", &q}, {"k", &k}, {"v", &v}};
  for (const auto& [name, t] : named) {
    TORCH_CHECK_VALUE(t->dim() == 4, name, " must be 4-D [B, H, N, d], got shape ", shape_str(t->sizes()));
    TORCH_CHECK_VALUE(t->is_cuda(), name, " must be on a CUDA device, got ", t->device());
    const at::ScalarType s = t->scalar_type();
    TORCH_CHECK_VALUE(s == at::kBFloat16 || s == at::kHalf || s == at::kFloat8_e4m3fn, name,
                      " must be bfloat16, float16 or float8_e4m3fn, got ", dtype_name(s));
    TORCH_CHECK_VALUE(t->is_contiguous(), name, " must be contiguous [B, H, N, d] (call .contiguous())");
    for (int64_t n : t->sizes())
      TORCH_CHECK_VALUE(n <= std::numeric_limits<int>::max(), name, " has a dimension above 2^31 - 1: ",
                        shape_str(t->sizes()));
  }
  TORCH_CHECK_VALUE(q.scalar_type() == k.scalar_type() && k.scalar_type() == v.scalar_type(),
                    "q, k, v must share one dtype, got ", dtype_name(q.scalar_type()), ", ",
                    dtype_name(k.scalar_type()), ", ", dtype_name(v.scalar_type()));
  TORCH_CHECK_VALUE(q.device() == k.device() && k.device() == v.device(), "q, k, v must be on one device, got ",
                    q.device(), ", ", k.device(), ", ", v.device());
  TORCH_CHECK_VALUE(k.sizes() == v.sizes(), "k and v must have the same shape, got ", shape_str(k.sizes()), " and ",
                    shape_str(v.sizes()));
  TORCH_CHECK_VALUE(k.size(0) == q.size(0), "batch sizes differ: q has B=", q.size(0), ", k/v have B=", k.size(0));
  TORCH_CHECK_VALUE(k.size(3) == q.size(3), "head dims differ: q has d=", q.size(3), ", k/v have d=", k.size(3));
  TORCH_CHECK_VALUE(k.size(1) >= 1 && q.size(1) % k.size(1) == 0, "k/v heads (Hkv=", k.size(1),
                    ") must divide q heads (H=", q.size(1), ")");
}

// A positive scale that stays positive and finite in fp32: the C API reads 0 as "the default".
void check_scale(double scale) {
  // Compared in double first: converting a double past FLT_MAX to float is undefined.
  const bool in_range = scale > 0 && scale <= double(std::numeric_limits<float>::max());
  TORCH_CHECK_VALUE(in_range && static_cast<float>(scale) > 0.f,
                    "scale must be positive and finite in fp32 (None means 1/sqrt(d)), got ", scale);
}

attn_problem_t problem(const Tensor& q, const Tensor& k, bool causal, int dtype, double scale) {
  return attn_problem_t{int(q.size(0)), int(q.size(1)), int(k.size(1)), int(q.size(2)), int(k.size(2)),
                        int(q.size(3)), causal ? 1 : 0, dtype, static_cast<float>(scale)};
}

[[noreturn]] void fail(int rc, const std::string& rung, const char* err) {
  const char* what = rc == ATTN_INVALID_INPUT ? "invalid input"
                     : rc == ATTN_CUDA_ERROR  ? "CUDA error"
                     : rc == ATTN_UNKNOWN_RUNG ? "unknown rung"
                                               : nullptr;
  const std::string code = what ? what : "code " + std::to_string(rc);
  TORCH_CHECK(false, "attn_ladder '", rung, "' failed (", code, "): ", err[0] ? err : "(no message)");
}

void* stream_of(const Tensor& t) { return c10::cuda::getCurrentCUDAStream(t.device().index()).stream(); }

// The workspace of `bytes` from PyTorch's caching allocator (kept alive by the caller until
// the launch is enqueued; the allocator's stream semantics keep it until the work is done).
Tensor workspace(size_t bytes, const Tensor& like) {
  return bytes ? at::empty({int64_t(bytes)}, like.options().dtype(at::kByte)) : Tensor();
}

void* ptr(const Tensor& t) { return t.defined() ? t.data_ptr() : nullptr; }

// (o, lse): o like q (bf16 for e4m3 inputs), lse fp32 [B, H, Nq], NaN for a rung that
// writes none.
std::pair<Tensor, Tensor> outputs(const Tensor& q, const RungFacts* rung, bool e4m3) {
  Tensor o = e4m3 ? at::empty(q.sizes(), q.options().dtype(at::kBFloat16)) : at::empty_like(q);
  const auto lse_opts = q.options().dtype(at::kFloat);
  Tensor lse = !rung || rung->writes_lse ? at::empty({q.size(0), q.size(1), q.size(2)}, lse_opts)
                                         : at::full({q.size(0), q.size(1), q.size(2)}, NAN, lse_opts);
  return {o, lse};
}

// ---- the kernels ----

std::tuple<Tensor, Tensor> attention(const Tensor& q, const Tensor& k, const Tensor& v, c10::string_view rung,
                                     bool causal, double scale, bool fp8) {
  check_inputs(q, k, v);
  const std::string name(rung);
  TORCH_CHECK_VALUE(q.scalar_type() != at::kFloat8_e4m3fn,
                    "float8_e4m3fn q, k, v take descale=(q_descale, k_descale, v_descale), fp32 tensors of one "
                    "scale per block of rows (attn_ladder.descale_blocks('",
                    name, "', q, k))");
  TORCH_CHECK_VALUE(!fp8 || q.scalar_type() == at::kBFloat16,
                    "fp8=True takes bfloat16 q, k, v (quantized to e4m3 by the rung), got ", dtype_name(q.scalar_type()));
  check_scale(scale);
  const attn_problem_t p = problem(q, k, causal, fp8 ? kFp8 : q.scalar_type() == at::kBFloat16 ? 0 : 1, scale);
  c10::DeviceGuard guard(q.device());  // the library runs on the current device (sizes too)
  char err[kErrLen] = "";
  size_t need = 0;
  int rc = attn_workspace_bytes(name.c_str(), &p, &need, err, kErrLen);
  if (rc != ATTN_OK) fail(rc, name, err);
  auto [o, lse] = outputs(q, find_rung(name), false);
  const Tensor ws = workspace(need, q);
  rc = attn_run_async(name.c_str(), &p, q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(),
                      lse.data_ptr<float>(), ptr(ws), need, stream_of(q), err, kErrLen);
  if (rc != ATTN_OK) fail(rc, name, err);
  return {o, lse};
}

std::tuple<Tensor, Tensor> attention_e4m3(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& q_descale,
                                          const Tensor& k_descale, const Tensor& v_descale, c10::string_view rung,
                                          bool causal, double scale) {
  check_inputs(q, k, v);
  const std::string name(rung);
  TORCH_CHECK_VALUE(q.scalar_type() == at::kFloat8_e4m3fn, "descale goes with float8_e4m3fn q, k, v, got ",
                    dtype_name(q.scalar_type()));
  check_scale(scale);
  const attn_problem_t p = problem(q, k, causal, kE4m3, scale);
  char err[kErrLen] = "";
  int q_rows = 0, kv_rows = 0;
  int rc = attn_descale_blocks(name.c_str(), &p, &q_rows, &kv_rows, err, kErrLen);
  if (rc != ATTN_OK) fail(rc, name, err);
  const int64_t B = q.size(0), H = q.size(1), Hkv = k.size(1);
  const std::vector<int64_t> q_shape{B, H, (q.size(2) + q_rows - 1) / q_rows};
  const std::vector<int64_t> kv_shape{B, Hkv, (k.size(2) + kv_rows - 1) / kv_rows};
  const std::tuple<const char*, const Tensor*, const std::vector<int64_t>*> named[] = {
      {"q_descale", &q_descale, &q_shape}, {"k_descale", &k_descale, &kv_shape}, {"v_descale", &v_descale, &kv_shape}};
  for (const auto& [label, t, shape] : named) {
    TORCH_CHECK_VALUE(t->scalar_type() == at::kFloat, label, " must be a float32 tensor, got ",
                      dtype_name(t->scalar_type()));
    TORCH_CHECK_VALUE(t->sizes() == c10::IntArrayRef(*shape), label, " must have shape ", shape_str(*shape),
                      " (one scale per block of rows for '", name, "'; repeat a per-tensor or per-head scale), got ",
                      shape_str(t->sizes()));
    TORCH_CHECK_VALUE(t->device() == q.device() && t->is_contiguous(), label, " must be contiguous on ", q.device(),
                      ", got ", t->device(), t->is_contiguous() ? "" : ", not contiguous");
  }
  c10::DeviceGuard guard(q.device());
  size_t need = 0;
  rc = attn_workspace_bytes(name.c_str(), &p, &need, err, kErrLen);
  if (rc != ATTN_OK) fail(rc, name, err);
  auto [o, lse] = outputs(q, find_rung(name), true);
  const Tensor ws = workspace(need, q);
  rc = attn_run_fp8_async(name.c_str(), &p, q.data_ptr(), k.data_ptr(), v.data_ptr(), q_descale.data_ptr<float>(),
                          k_descale.data_ptr<float>(), v_descale.data_ptr<float>(), o.data_ptr(),
                          lse.data_ptr<float>(), ptr(ws), need, stream_of(q), err, kErrLen);
  if (rc != ATTN_OK) fail(rc, name, err);
  return {o, lse};
}

std::tuple<Tensor, Tensor, Tensor> attention_backward(const Tensor& q, const Tensor& k, const Tensor& v,
                                                      const Tensor& o, const Tensor& lse, const Tensor& dout,
                                                      c10::string_view rung, bool causal, double scale) {
  check_inputs(q, k, v);
  const std::string name(rung);
  TORCH_CHECK_VALUE(q.scalar_type() == at::kBFloat16 || q.scalar_type() == at::kHalf,
                    "the backward takes bfloat16 or float16, got ", dtype_name(q.scalar_type()));
  const std::pair<const char*, const Tensor*> same_as_q[] = {{"o", &o}, {"dout", &dout}};
  for (const auto& [label, t] : same_as_q)
    TORCH_CHECK_VALUE(t->sizes() == q.sizes() && t->scalar_type() == q.scalar_type() && t->device() == q.device(),
                      label, " must be a ", dtype_name(q.scalar_type()), " tensor of q's shape ",
                      shape_str(q.sizes()), " on ", q.device());
  TORCH_CHECK_VALUE(o.is_contiguous(), "o must be contiguous (call .contiguous())");
  const Tensor d_o = dout_for(name, dout);  // in place or a contiguous copy
  const bool strided = !d_o.is_contiguous();
  const std::vector<int64_t> lse_shape{q.size(0), q.size(1), q.size(2)};
  TORCH_CHECK_VALUE(lse.sizes() == c10::IntArrayRef(lse_shape) && lse.scalar_type() == at::kFloat &&
                        lse.device() == q.device() && lse.is_contiguous(),
                    "lse must be a contiguous float32 tensor of shape ", shape_str(lse_shape), " on ", q.device());
  check_scale(scale);
  const attn_problem_t p = problem(q, k, causal, q.scalar_type() == at::kBFloat16 ? 0 : 1, scale);
  c10::DeviceGuard guard(q.device());
  char err[kErrLen] = "";
  size_t need = 0;
  int rc = attn_backward_workspace_bytes(name.c_str(), &p, &need, err, kErrLen);
  if (rc != ATTN_OK) fail(rc, name, err);
  Tensor dq = at::empty_like(q), dk = at::empty_like(k), dv = at::empty_like(v);
  const Tensor ws = workspace(need, q);
  const int64_t strides[3] = {d_o.stride(0), d_o.stride(1), d_o.stride(2)};
  rc = attn_run_backward_strided_async(name.c_str(), &p, q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(),
                                       lse.data_ptr<float>(), d_o.data_ptr(), strided ? strides : nullptr,
                                       dq.data_ptr(), dk.data_ptr(), dv.data_ptr(), ptr(ws), need, stream_of(q), err,
                                       kErrLen);
  if (rc != ATTN_OK) fail(rc, name, err);
  return {dq, dk, dv};
}

// ---- decode from a paged KV cache (python/attn_ladder/_capi.py's decode_paged, same checks) ----

void check_paged_inputs(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const Tensor& block_table,
                        const Tensor& seq_lens) {
  TORCH_CHECK_VALUE(q.dim() == 4, "q must be 4-D [B, H, Nq, d], got shape ", shape_str(q.sizes()));
  const std::pair<const char*, const Tensor*> caches[] = {{"k_cache", &k_cache}, {"v_cache", &v_cache}};
  for (const auto& [name, t] : caches)
    TORCH_CHECK_VALUE(t->dim() == 4, name, " must be 4-D [num_pages, page_size, Hkv, d], got shape ",
                      shape_str(t->sizes()));
  const std::pair<const char*, const Tensor*> all[] = {{"q", &q}, {"k_cache", &k_cache}, {"v_cache", &v_cache},
                                                       {"block_table", &block_table}, {"seq_lens", &seq_lens}};
  for (const auto& [name, t] : all) {
    TORCH_CHECK_VALUE(t->is_cuda(), name, " must be on a CUDA device, got ", t->device());
    TORCH_CHECK_VALUE(t->device() == q.device(), name, " must be on ", q.device(), ", got ", t->device());
    TORCH_CHECK_VALUE(t->is_contiguous(), name, " must be contiguous (call .contiguous())");
    for (int64_t n : t->sizes())
      TORCH_CHECK_VALUE(n <= std::numeric_limits<int>::max(), name, " has a dimension above 2^31 - 1: ",
                        shape_str(t->sizes()));
  }
  const at::ScalarType s = q.scalar_type();
  TORCH_CHECK_VALUE(s == at::kBFloat16 || s == at::kHalf, "q must be bfloat16 or float16, got ", dtype_name(s));
  TORCH_CHECK_VALUE(k_cache.scalar_type() == s && v_cache.scalar_type() == s, "q, k_cache, v_cache must share one dtype, got ",
                    dtype_name(s), ", ", dtype_name(k_cache.scalar_type()), ", ", dtype_name(v_cache.scalar_type()));
  TORCH_CHECK_VALUE(k_cache.sizes() == v_cache.sizes(), "k_cache and v_cache must have the same shape, got ",
                    shape_str(k_cache.sizes()), " and ", shape_str(v_cache.sizes()));
  TORCH_CHECK_VALUE(k_cache.size(3) == q.size(3), "head dims differ: q has d=", q.size(3), ", the caches have d=",
                    k_cache.size(3));
  TORCH_CHECK_VALUE(k_cache.size(2) >= 1 && q.size(1) % k_cache.size(2) == 0, "the caches' heads (Hkv=",
                    k_cache.size(2), ") must divide q heads (H=", q.size(1), ")");
  TORCH_CHECK_VALUE(block_table.scalar_type() == at::kInt && block_table.dim() == 2 && block_table.size(0) == q.size(0),
                    "block_table must be an int32 tensor [B, max_pages] with B=", q.size(0), ", got ",
                    dtype_name(block_table.scalar_type()), " ", shape_str(block_table.sizes()));
  TORCH_CHECK_VALUE(seq_lens.scalar_type() == at::kInt && seq_lens.dim() == 1 && seq_lens.size(0) == q.size(0),
                    "seq_lens must be an int32 tensor [B] with B=", q.size(0), ", got ",
                    dtype_name(seq_lens.scalar_type()), " ", shape_str(seq_lens.sizes()));
}

// o, lse of one decode step. A bad block table or length is never read (that sequence's o is
// NaN); nothing synchronizes after the kernel: attn_ladder.decode_paged (ops.py) refuses bad
// tables on the host before the run, and a C caller reads the kernel's fault records with
// attn_decode_paged_check.
std::tuple<Tensor, Tensor> decode_paged(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                                        const Tensor& block_table, const Tensor& seq_lens, bool causal, double scale) {
  check_paged_inputs(q, k_cache, v_cache, block_table, seq_lens);
  check_scale(scale);
  const std::string name = "05_fa2_decode (paged)";
  const attn_paged_problem_t p{int(q.size(0)), int(q.size(1)), int(k_cache.size(2)), int(q.size(2)), int(q.size(3)),
                               int(k_cache.size(0)), int(k_cache.size(1)), int(block_table.size(1)), causal ? 1 : 0,
                               q.scalar_type() == at::kBFloat16 ? 0 : 1, static_cast<float>(scale)};
  c10::DeviceGuard guard(q.device());
  char err[kErrLen] = "";
  size_t need = 0;
  int rc = attn_decode_paged_workspace_bytes(&p, &need, err, kErrLen);
  if (rc != ATTN_OK) fail(rc, name, err);
  Tensor o = at::empty_like(q);
  Tensor lse = at::empty({q.size(0), q.size(1), q.size(2)}, q.options().dtype(at::kFloat));
  const Tensor ws = workspace(need, q);
  void* stream = stream_of(q);
  rc = attn_decode_paged_async(&p, q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), block_table.data_ptr<int>(),
                               seq_lens.data_ptr<int>(), o.data_ptr(), lse.data_ptr<float>(), ptr(ws), need, stream,
                               err, kErrLen);
  if (rc != ATTN_OK) fail(rc, name, err);
  return {o, lse};
}

// ---- autograd ----

const c10::TypedOperatorHandle<decltype(attention)>& attention_op() {
  static const auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("attn_ladder::attention", "").typed<decltype(attention)>();
  return op;
}

const c10::TypedOperatorHandle<decltype(attention_e4m3)>& attention_e4m3_op() {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("attn_ladder::attention_e4m3", "")
                             .typed<decltype(attention_e4m3)>();
  return op;
}

const c10::TypedOperatorHandle<decltype(attention_backward)>& attention_backward_op() {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("attn_ladder::attention_backward", "")
                             .typed<decltype(attention_backward)>();
  return op;
}

// O's gradient through the rung's backward pass, which recomputes P from the saved lse.
class AttentionFunction : public torch::autograd::Function<AttentionFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const Tensor& q, const Tensor& k, const Tensor& v,
                               const std::string& rung, bool causal, double scale, bool fp8) {
    at::AutoDispatchBelowADInplaceOrView below;
    auto [o, lse] = attention_op().call(q, k, v, rung, causal, scale, fp8);
    ctx->saved_data["rung"] = rung;
    ctx->saved_data["causal"] = causal;
    ctx->saved_data["scale"] = scale;
    ctx->save_for_backward({q, k, v, o, lse});
    ctx->mark_non_differentiable({lse});  // its gradient would be dropped
    return {o, lse};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const std::string rung = ctx->saved_data["rung"].toStringRef();
    auto [dq, dk, dv] = attention_backward_op().call(saved[0], saved[1], saved[2], saved[3], saved[4],
                                                     grads[0], rung, ctx->saved_data["causal"].toBool(),
                                                     ctx->saved_data["scale"].toDouble());
    return {dq, dk, dv, Tensor(), Tensor(), Tensor(), Tensor()};
  }
};

// Below a gradient request, straight to the kernel; with one, the rung's backward or a clear
// refusal here, before running (eagerly, and where AOTAutograd traces a compiled graph).
std::tuple<Tensor, Tensor> attention_autograd(const Tensor& q, const Tensor& k, const Tensor& v,
                                              c10::string_view rung, bool causal, double scale, bool fp8) {
  const bool needs_grad = at::GradMode::is_enabled() && (q.requires_grad() || k.requires_grad() || v.requires_grad());
  if (!needs_grad) {
    at::AutoDispatchBelowADInplaceOrView below;
    return attention_op().call(q, k, v, rung, causal, scale, fp8);
  }
  const std::string name(rung);
  const RungFacts* facts = find_rung(name);
  const int64_t d = q.dim() > 0 ? q.size(-1) : 0;
  if (facts) {  // an unknown rung: the kernel refuses it, naming the registered ones
    const auto& dims = facts->backward_dims;
    if (fp8 || std::find(dims.begin(), dims.end(), d) == dims.end())
      TORCH_CHECK(false, no_backward_message(name, d, fp8));
  }
  const variable_list out = AttentionFunction::apply(q, k, v, name, causal, scale, fp8);
  return {out[0], out[1]};
}

std::tuple<Tensor, Tensor> attention_e4m3_autograd(const Tensor& q, const Tensor& k, const Tensor& v,
                                                   const Tensor& q_descale, const Tensor& k_descale,
                                                   const Tensor& v_descale, c10::string_view rung, bool causal,
                                                   double scale) {
  if (at::GradMode::is_enabled()) {
    for (const Tensor* t : {&q, &k, &v, &q_descale, &k_descale, &v_descale})
      TORCH_CHECK(!t->requires_grad(), no_backward_message(std::string(rung), 0, true));
  }
  at::AutoDispatchBelowADInplaceOrView below;
  return attention_e4m3_op().call(q, k, v, q_descale, k_descale, v_descale, rung, causal, scale);
}

}  // namespace

TORCH_LIBRARY(attn_ladder, m) {
  m.def("attention(Tensor q, Tensor k, Tensor v, str rung, bool causal, float scale, bool fp8) -> (Tensor, Tensor)");
  m.def(
      "attention_backward(Tensor q, Tensor k, Tensor v, Tensor o, Tensor lse, Tensor dout, str rung, bool causal, "
      "float scale) -> (Tensor, Tensor, Tensor)");
  m.def(
      "attention_e4m3(Tensor q, Tensor k, Tensor v, Tensor q_descale, Tensor k_descale, Tensor v_descale, str rung, "
      "bool causal, float scale) -> (Tensor, Tensor)");
  m.def(
      "decode_paged(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_table, Tensor seq_lens, bool causal, "
      "float scale) -> (Tensor, Tensor)");
}

// Every device: tensors off CUDA reach the checks, which raise ValueError (a CUDA-only
// registration would make the dispatcher raise NotImplementedError first).
TORCH_LIBRARY_IMPL(attn_ladder, CompositeExplicitAutograd, m) {
  m.impl("attention", &attention);
  m.impl("attention_e4m3", &attention_e4m3);
  m.impl("decode_paged", &decode_paged);
}

TORCH_LIBRARY_IMPL(attn_ladder, CUDA, m) { m.impl("attention_backward", &attention_backward); }

TORCH_LIBRARY_IMPL(attn_ladder, Autograd, m) {
  m.impl("attention", &attention_autograd);
  m.impl("attention_e4m3", &attention_e4m3_autograd);
  m.impl("attention_backward", torch::autograd::autogradNotImplementedFallback());  // no double backward
  m.impl("decode_paged", torch::autograd::autogradNotImplementedFallback());  // forward only (inference)
}
