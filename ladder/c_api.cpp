#include "ladder/c_api.h"

#include <cstring>
#include <string>

#include "common/check.h"
#include "common/device_buffer.h"
#include "ladder/registry.h"

namespace {

int fail(int code, const std::string& msg, char* err, size_t err_len) {
  if (err && err_len > 0) {
    std::strncpy(err, msg.c_str(), err_len - 1);
    err[err_len - 1] = '\0';
  }
  return code;
}

attn::AttnProblem to_problem(const attn_problem_t& c) {
  if (c.dtype < 0 || c.dtype > 2) throw attn::AttnError("dtype code " + std::to_string(c.dtype) + " is not 0 (bf16), 1 (fp16) or 2 (fp8)");
  attn::AttnProblem p;
  p.B = c.B;
  p.H = c.H;
  p.Hkv = c.Hkv;
  p.Nq = c.Nq;
  p.Nk = c.Nk;
  p.d = c.d;
  p.causal = c.causal != 0;
  p.dtype = static_cast<attn::DType>(c.dtype);
  p.scale = c.scale;
  return p;
}

}  // namespace

extern "C" int attn_num_rungs(void) { return int(attn::registry().size()); }

extern "C" const char* attn_rung_name(int i) {
  const auto& r = attn::registry();
  return i >= 0 && i < int(r.size()) ? r[i].name.c_str() : nullptr;
}

extern "C" int attn_run(const char* rung, const attn_problem_t* cp, const void* q, const void* k, const void* v,
                        void* o, float* lse, void* stream_ptr, char* err, size_t err_len) {
  const attn::Stage* stage = nullptr;
  try {
    stage = &attn::find_stage(rung ? rung : "");
  } catch (const attn::AttnError& e) {
    return fail(ATTN_UNKNOWN_RUNG, e.what(), err, err_len);
  }
  try {
    if (!cp) throw attn::AttnError("problem is a null pointer");
    attn::AttnProblem p = to_problem(*cp);
    auto stream = static_cast<cudaStream_t>(stream_ptr);
    attn::AttnTensors t;
    t.q = q;
    t.k = k;
    t.v = v;
    t.o = o;
    t.lse = stage->writes_lse ? lse : nullptr;
    attn::validate_problem(*stage, p);
    size_t ws_bytes = stage->workspace(p);
    attn::require_device_memory(ws_bytes, stage->name + " workspace (S and P)");
    attn::DeviceBuffer ws(ws_bytes);
    t.workspace = ws.get();
    t.workspace_bytes = ws.bytes();
    attn::run_stage(*stage, p, t, stream);
    // The workspace is freed when this returns; the launch must be done with it first.
    if (ws_bytes) CUDA_CHECK(cudaStreamSynchronize(stream));
    return ATTN_OK;
  } catch (const attn::AttnError& e) {
    return fail(ATTN_INVALID_INPUT, e.what(), err, err_len);
  } catch (const std::exception& e) {
    return fail(ATTN_CUDA_ERROR, e.what(), err, err_len);
  }
}
