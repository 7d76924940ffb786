#include "common/stage.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <utility>

#include "common/check.h"

namespace attn {

bool Stage::supports(DType t) const { return std::find(dtypes.begin(), dtypes.end(), t) != dtypes.end(); }
bool Stage::supports_head_dim(int d) const {
  return std::find(head_dims.begin(), head_dims.end(), d) != head_dims.end();
}

bool Stage::supports_backward_head_dim(int d) const {
  return has_backward() && std::find(backward_head_dims.begin(), backward_head_dims.end(), d) != backward_head_dims.end();
}

namespace {
template <typename T>
std::string join(const std::vector<T>& v) {
  std::ostringstream os;
  for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
  return os.str();
}
}  // namespace

void validate_problem(const Stage& s, const AttnProblem& p) {
  auto fail = [&](const std::string& why) { throw AttnError(s.name + ": " + why + " [" + p.describe() + "]"); };
  if (p.B < 1 || p.H < 1 || p.Hkv < 1 || p.Nq < 1 || p.Nk < 1 || p.d < 1)
    fail("B, H, Hkv, Nq, Nk and d must all be >= 1");
  if (p.H % p.Hkv != 0)
    fail("Hkv = " + std::to_string(p.Hkv) + " does not divide H = " + std::to_string(p.H));
  if (p.Hkv != p.H && !s.gqa) fail("grouped-query attention (Hkv < H) is not supported by this rung");
  if (!s.supports(p.dtype)) {
    std::vector<std::string> names;
    for (DType t : s.dtypes) names.push_back(dtype_name(t));
    fail(std::string("dtype ") + dtype_name(p.dtype) + " is not supported (supported: " + join(names) + ")");
  }
  if (!s.supports_head_dim(p.d))
    fail("head dim d = " + std::to_string(p.d) + " is not supported (supported: " + join(s.head_dims) + ")");
  if (!(p.scale >= 0.f) || !std::isfinite(p.scale)) fail("scale must be finite and >= 0 (0 = 1/sqrt(d))");
  if (s.refuse) {
    std::string why = s.refuse(p);
    if (!why.empty()) fail(why);
  }
}

namespace {
// The kernels move tensors and workspaces in 16-byte pieces: a misaligned pointer would fault
// (a sticky error that ends the CUDA context), so every launch refuses it first.
bool misaligned(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 != 0; }
}  // namespace

void validate_tensors(const Stage& s, const AttnProblem& p, const AttnTensors& t) {
  auto fail = [&](const std::string& why) { throw AttnError(s.name + ": " + why); };
  if (!t.q) fail("Q is a null pointer");
  if (!t.k) fail("K is a null pointer");
  if (!t.v) fail("V is a null pointer");
  if (!t.o) fail("O is a null pointer");
  if (p.dtype == DType::e4m3 && (!t.q_descale || !t.k_descale || !t.v_descale))
    fail(std::string("e4m3 inputs need their descales: ") + (!t.q_descale ? "q" : !t.k_descale ? "k" : "v") +
         "_descale is a null pointer (AttnTensors; attn_run_fp8_async in the C API)");
  size_t need = s.workspace(p);
  if (need > 0 && (!t.workspace || t.workspace_bytes < need))
    fail("needs a workspace of " + std::to_string(need) + " bytes, got " + std::to_string(t.workspace_bytes));
  const std::pair<const void*, const char*> aligned[] = {{t.q, "Q"}, {t.k, "K"}, {t.v, "V"}, {t.o, "O"},
                                                        {t.workspace, "the workspace"}};
  for (const auto& [ptr, name] : aligned)
    if (misaligned(ptr)) fail(std::string(name) + " is not 16-byte aligned");
}

void validate_device(const Stage& s) {
  int dev = 0, major = 0, minor = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  // Attribute queries are cheap; the full property struct (for the name) only on refusal.
  CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
  const int cc = major * 10 + minor;
  if (cc < s.min_sm || (s.max_sm && cc > s.max_sm)) {
    cudaDeviceProp prop{};
    CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
    std::ostringstream os;
    os << s.name << ": needs compute capability " << s.min_sm / 10 << "." << s.min_sm % 10;
    if (s.max_sm == s.min_sm) os << " exactly (its code is arch-specific: sm_" << s.min_sm << "a)";
    else if (s.max_sm) os << " to " << s.max_sm / 10 << "." << s.max_sm % 10;
    else os << " or newer";
    os << "; " << prop.name << " is " << major << "." << minor;
    throw AttnError(os.str());
  }
}

void require_device_memory(size_t bytes, const std::string& what) {
  size_t free_b = 0, total_b = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  if (bytes > free_b) {
    std::ostringstream os;
    os << what << " needs " << bytes << " bytes (" << bytes / double(1 << 30) << " GiB) of device memory; "
       << free_b << " bytes (" << free_b / double(1 << 30) << " GiB) are free";
    throw AttnError(os.str());
  }
}

void run_stage(const Stage& s, const AttnProblem& p, const AttnTensors& t, cudaStream_t stream) {
  validate_problem(s, p);
  validate_tensors(s, p, t);
  validate_device(s);
  s.launch(p, t, stream);
  CUDA_CHECK_LAUNCH();
}

void validate_backward_problem(const Stage& s, const AttnProblem& p) {
  if (!s.has_backward()) throw AttnError(s.name + ": no backward pass (this rung is forward only)");
  validate_problem(s, p);
  auto fail = [&](const std::string& why) { throw AttnError(s.name + " backward: " + why + " [" + p.describe() + "]"); };
  if (!s.supports_backward_head_dim(p.d))
    fail("head dim d = " + std::to_string(p.d) + " is not supported (supported: " + join(s.backward_head_dims) + ")");
  if (s.backward_refuse) {
    std::string why = s.backward_refuse(p);
    if (!why.empty()) fail(why);
  }
}

void validate_backward_tensors(const Stage& s, const AttnProblem& p, const AttnBwdTensors& t) {
  auto fail = [&](const std::string& why) { throw AttnError(s.name + " backward: " + why); };
  const std::pair<const void*, const char*> required[] = {{t.q, "Q"},     {t.k, "K"},   {t.v, "V"},
                                                         {t.o, "O"},     {t.dout, "dO"}, {t.lse, "lse"},
                                                         {t.dq, "dQ"},   {t.dk, "dK"}, {t.dv, "dV"}};
  for (const auto& [ptr, name] : required)
    if (!ptr) fail(std::string(name) + " is a null pointer");
  size_t need = s.backward_workspace(p);
  if (need > 0 && (!t.workspace || t.workspace_bytes < need))
    fail("needs a workspace of " + std::to_string(need) + " bytes, got " + std::to_string(t.workspace_bytes));
  for (const auto& [ptr, name] : required)  // as the forward's (lse: fp32 words)
    if (ptr != t.lse && misaligned(ptr)) fail(std::string(name) + " is not 16-byte aligned");
  if (misaligned(t.workspace)) fail("the workspace is not 16-byte aligned");
  const int64_t* given = t.dout_strides;
  if (given[0] || given[1] || given[2]) {
    const std::string strides =
        "(" + std::to_string(given[0]) + ", " + std::to_string(given[1]) + ", " + std::to_string(given[2]) + ")";
    const int64_t elems_per_16_bytes = 16 / int64_t(dtype_bytes(p.dtype));
    for (int i = 0; i < 3; ++i)
      if (given[i] <= 0 || given[i] % elems_per_16_bytes != 0)
        fail("dO's strides " + strides + " (batch, head, row; elements) must be positive multiples of 16 bytes");
    if (!dout_strides_dense(p, t.dout_strides) && !s.backward_strided_dout)
      fail("takes dO contiguous [B, H, Nq, d]; strides " + strides + " are not (make it contiguous)");
  }
}

void run_backward(const Stage& s, const AttnProblem& p, const AttnBwdTensors& t, cudaStream_t stream) {
  validate_backward_problem(s, p);
  validate_backward_tensors(s, p, t);
  validate_device(s);
  s.launch_backward(p, t, stream);
  CUDA_CHECK_LAUNCH();
}

}  // namespace attn
