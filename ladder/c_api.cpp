#include "ladder/c_api.h"

#include <cstring>
#include <string>
#include <vector>

#include "common/check.h"
#include "ladder/registry.h"
#ifdef ATTN_HAS_RUNG_05  // a lab build below rung 05 has neither the decode's files nor kernels
#include "05_fa2_reordered/fa2_decode.h"
#endif

namespace {

int fail(int code, const std::string& msg, char* err, size_t err_len) {
  if (err && err_len > 0) {
    std::strncpy(err, msg.c_str(), err_len - 1);
    err[err_len - 1] = '\0';
  }
  return code;
}

attn::AttnProblem to_problem(const attn_problem_t& c) {
  if (c.dtype < 0 || c.dtype > 3)
    throw attn::AttnError("dtype code " + std::to_string(c.dtype) + " is not 0 (bf16), 1 (fp16), 2 (fp8) or 3 (e4m3)");
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

namespace {

// The stage named `rung`, or a message and ATTN_UNKNOWN_RUNG.
const attn::Stage* lookup(const char* rung, int* code, char* err, size_t err_len) {
  try {
    return &attn::find_stage(rung ? rung : "");
  } catch (const attn::AttnError& e) {
    *code = fail(ATTN_UNKNOWN_RUNG, e.what(), err, err_len);
    return nullptr;
  }
}

// Runs `body`, turning refusals into ATTN_INVALID_INPUT and CUDA failures into ATTN_CUDA_ERROR.
template <class Body>
int guarded(Body&& body, char* err, size_t err_len) {
  try {
    body();
    return ATTN_OK;
  } catch (const attn::AttnError& e) {
    return fail(ATTN_INVALID_INPUT, e.what(), err, err_len);
  } catch (const std::exception& e) {
    return fail(ATTN_CUDA_ERROR, e.what(), err, err_len);
  }
}

attn::AttnTensors tensors(const attn::Stage& s, const void* q, const void* k, const void* v, void* o, float* lse,
                          void* workspace, size_t workspace_bytes) {
  attn::AttnTensors t;
  t.q = q;
  t.k = k;
  t.v = v;
  t.o = o;
  t.lse = s.writes_lse ? lse : nullptr;
  t.workspace = workspace;
  t.workspace_bytes = workspace_bytes;
  return t;
}

// The workspace of the forward or the backward: validate(stage, problem), then *bytes = size(stage, problem).
template <class Validate, class Size>
int workspace_query(const char* rung, const attn_problem_t* cp, size_t* bytes, char* err, size_t err_len,
                    Validate validate, Size size) {
  int code = ATTN_OK;
  const attn::Stage* s = lookup(rung, &code, err, err_len);
  if (!s) return code;
  return guarded([&] {
    if (!cp) throw attn::AttnError("problem is a null pointer");
    if (!bytes) throw attn::AttnError("bytes is a null pointer");
    const attn::AttnProblem p = to_problem(*cp);
    validate(*s, p);
    *bytes = size(*s, p);
  }, err, err_len);
}

}  // namespace

extern "C" int attn_rung_info(const char* rung, attn_rung_info_t* info, char* err, size_t err_len) {
  int code = ATTN_OK;
  const attn::Stage* s = lookup(rung, &code, err, err_len);
  if (!s) return code;
  return guarded([&] {
    if (!info) throw attn::AttnError("info is a null pointer");
    if (s->head_dims.size() > ATTN_MAX_HEAD_DIMS) throw attn::AttnError("more head dims than ATTN_MAX_HEAD_DIMS");
    *info = attn_rung_info_t{};
    for (attn::DType t : s->dtypes) info->dtypes |= 1 << int(t);
    for (int d : s->head_dims) info->head_dims[info->num_head_dims++] = d;
    info->writes_lse = s->writes_lse;
    info->gqa = s->gqa;
    info->min_sm = s->min_sm;
  }, err, err_len);
}

extern "C" int attn_workspace_bytes(const char* rung, const attn_problem_t* cp, size_t* bytes, char* err,
                                    size_t err_len) {
  return workspace_query(rung, cp, bytes, err, err_len, attn::validate_problem,
                         [](const attn::Stage& s, const attn::AttnProblem& p) { return s.workspace(p); });
}

extern "C" int attn_run_async(const char* rung, const attn_problem_t* cp, const void* q, const void* k,
                              const void* v, void* o, float* lse, void* workspace, size_t workspace_bytes,
                              void* stream, char* err, size_t err_len) {
  int code = ATTN_OK;
  const attn::Stage* s = lookup(rung, &code, err, err_len);
  if (!s) return code;
  return guarded([&] {
    if (!cp) throw attn::AttnError("problem is a null pointer");
    attn::run_stage(*s, to_problem(*cp), tensors(*s, q, k, v, o, lse, workspace, workspace_bytes),
                    static_cast<cudaStream_t>(stream));
  }, err, err_len);
}

extern "C" int attn_run(const char* rung, const attn_problem_t* cp, const void* q, const void* k, const void* v,
                        void* o, float* lse, void* stream_ptr, char* err, size_t err_len) {
  int code = ATTN_OK;
  const attn::Stage* s = lookup(rung, &code, err, err_len);
  if (!s) return code;
  return guarded([&] {
    if (!cp) throw attn::AttnError("problem is a null pointer");
    const attn::AttnProblem p = to_problem(*cp);
    attn::validate_problem(*s, p);
    const size_t ws_bytes = s->workspace(p);
    auto stream = static_cast<cudaStream_t>(stream_ptr);
    void* ws = nullptr;
    if (ws_bytes > 0) {
      cudaError_t e = cudaMallocAsync(&ws, ws_bytes, stream);
      if (e != cudaSuccess) {
        cudaGetLastError();  // an allocation failure is not sticky: clear it for the caller
        throw attn::AttnError(s->name + " needs a workspace of " + std::to_string(ws_bytes) + " bytes (" +
                              std::to_string(ws_bytes / double(1 << 30)) + " GiB) of device memory: " +
                              cudaGetErrorString(e));
      }
    }
    // Freed in stream order after the launch, whether or not it was enqueued.
    struct FreeAfter {
      void* p;
      cudaStream_t st;
      ~FreeAfter() {
        if (p) cudaFreeAsync(p, st);
      }
    } free_after{ws, stream};
    attn::run_stage(*s, p, tensors(*s, q, k, v, o, lse, ws, ws_bytes), stream);
  }, err, err_len);
}

extern "C" int attn_descale_blocks(const char* rung, const attn_problem_t* cp, int* q_rows, int* kv_rows, char* err,
                                   size_t err_len) {
  int code = ATTN_OK;
  const attn::Stage* s = lookup(rung, &code, err, err_len);
  if (!s) return code;
  return guarded([&] {
    if (!cp) throw attn::AttnError("problem is a null pointer");
    if (!q_rows || !kv_rows) throw attn::AttnError("q_rows or kv_rows is a null pointer");
    if (!s->descale_blocks) throw attn::AttnError(s->name + " takes no descales (its inputs are not e4m3)");
    const attn::AttnProblem p = to_problem(*cp);
    attn::validate_problem(*s, p);
    const attn::DescaleBlocks blocks = s->descale_blocks(p);
    *q_rows = blocks.q_rows;
    *kv_rows = blocks.kv_rows;
  }, err, err_len);
}

extern "C" int attn_run_fp8_async(const char* rung, const attn_problem_t* cp, const void* q, const void* k,
                                  const void* v, const float* q_descale, const float* k_descale,
                                  const float* v_descale, void* o, float* lse, void* workspace,
                                  size_t workspace_bytes, void* stream, char* err, size_t err_len) {
  int code = ATTN_OK;
  const attn::Stage* s = lookup(rung, &code, err, err_len);
  if (!s) return code;
  return guarded([&] {
    if (!cp) throw attn::AttnError("problem is a null pointer");
    const attn::AttnProblem p = to_problem(*cp);
    if (p.dtype != attn::DType::e4m3)
      throw attn::AttnError(std::string("attn_run_fp8_async takes e4m3 inputs (dtype 3), got dtype ") +
                            attn::dtype_name(p.dtype) + "; use attn_run_async");
    attn::AttnTensors t = tensors(*s, q, k, v, o, lse, workspace, workspace_bytes);
    t.q_descale = q_descale;
    t.k_descale = k_descale;
    t.v_descale = v_descale;
    attn::run_stage(*s, p, t, static_cast<cudaStream_t>(stream));
  }, err, err_len);
}

extern "C" int attn_backward_info(const char* rung, int* head_dims, int* num_head_dims, char* err, size_t err_len) {
  int code = ATTN_OK;
  const attn::Stage* s = lookup(rung, &code, err, err_len);
  if (!s) return code;
  return guarded([&] {
    if (!head_dims || !num_head_dims) throw attn::AttnError("head_dims or num_head_dims is a null pointer");
    const std::vector<int> dims = s->has_backward() ? s->backward_head_dims : std::vector<int>{};
    if (dims.size() > ATTN_MAX_HEAD_DIMS) throw attn::AttnError("more head dims than ATTN_MAX_HEAD_DIMS");
    for (size_t i = 0; i < dims.size(); ++i) head_dims[i] = dims[i];
    *num_head_dims = int(dims.size());
  }, err, err_len);
}

extern "C" int attn_backward_workspace_bytes(const char* rung, const attn_problem_t* cp, size_t* bytes, char* err,
                                             size_t err_len) {
  return workspace_query(rung, cp, bytes, err, err_len, attn::validate_backward_problem,
                         [](const attn::Stage& s, const attn::AttnProblem& p) { return s.backward_workspace(p); });
}

extern "C" int attn_backward_strided_dout(const char* rung, int* strided, char* err, size_t err_len) {
  int code = ATTN_OK;
  const attn::Stage* s = lookup(rung, &code, err, err_len);
  if (!s) return code;
  return guarded([&] {
    if (!strided) throw attn::AttnError("strided is a null pointer");
    *strided = s->has_backward() && s->backward_strided_dout ? 1 : 0;
  }, err, err_len);
}

extern "C" int attn_run_backward_strided_async(const char* rung, const attn_problem_t* cp, const void* q,
                                               const void* k, const void* v, const void* o, const float* lse,
                                               const void* dout, const int64_t* dout_strides, void* dq, void* dk,
                                               void* dv, void* workspace, size_t workspace_bytes, void* stream,
                                               char* err, size_t err_len) {
  int code = ATTN_OK;
  const attn::Stage* s = lookup(rung, &code, err, err_len);
  if (!s) return code;
  return guarded([&] {
    if (!cp) throw attn::AttnError("problem is a null pointer");
    attn::AttnBwdTensors t;
    t.q = q;
    t.k = k;
    t.v = v;
    t.o = o;
    t.lse = lse;
    t.dout = dout;
    t.dq = dq;
    t.dk = dk;
    t.dv = dv;
    t.workspace = workspace;
    t.workspace_bytes = workspace_bytes;
    if (dout_strides)
      for (int i = 0; i < 3; ++i) t.dout_strides[i] = dout_strides[i];
    attn::run_backward(*s, to_problem(*cp), t, static_cast<cudaStream_t>(stream));
  }, err, err_len);
}

extern "C" int attn_run_backward_async(const char* rung, const attn_problem_t* cp, const void* q, const void* k,
                                       const void* v, const void* o, const float* lse, const void* dout, void* dq,
                                       void* dk, void* dv, void* workspace, size_t workspace_bytes, void* stream,
                                       char* err, size_t err_len) {
  return attn_run_backward_strided_async(rung, cp, q, k, v, o, lse, dout, nullptr, dq, dk, dv, workspace,
                                         workspace_bytes, stream, err, err_len);
}

namespace {

// The paged problem as the decode stage's AttnProblem (Nk: the block table's capacity).
attn::AttnProblem paged_problem(const attn_paged_problem_t& c) {
  if (c.dtype != 0 && c.dtype != 1)
    throw attn::AttnError("the paged decode takes dtype 0 (bf16) or 1 (fp16), got " + std::to_string(c.dtype));
  if (c.page_size < 1 || c.max_pages < 1)
    throw attn::AttnError("page_size = " + std::to_string(c.page_size) + " and max_pages = " +
                          std::to_string(c.max_pages) + " must be >= 1");
  const int64_t capacity = int64_t(c.max_pages) * c.page_size;
  if (capacity > INT32_MAX)
    throw attn::AttnError("max_pages * page_size = " + std::to_string(capacity) + " tokens exceed 2^31 - 1");
  attn_problem_t flat{c.B, c.H, c.Hkv, c.Nq, int(capacity), c.d, c.causal, c.dtype, c.scale};
  return to_problem(flat);
}

const attn::Stage& decode_stage() { return attn::find_stage("05_fa2_decode"); }

#ifdef ATTN_HAS_RUNG_05
attn::fa2::PagedKV paged_kv(const attn_paged_problem_t& c, const void* k_cache, const void* v_cache,
                            const int* block_table, const int* seq_lens) {
  attn::fa2::PagedKV kv;
  kv.k_cache = k_cache;
  kv.v_cache = v_cache;
  kv.block_table = block_table;
  kv.seq_lens = seq_lens;
  kv.num_pages = c.num_pages;
  kv.page_size = c.page_size;
  kv.max_pages = c.max_pages;
  return kv;
}
#endif

}  // namespace

// A lab build of rungs below 05 (CMakeLists.txt defines ATTN_HAS_RUNG_<nn> for the rungs it
// builds) has no decode kernels to link; decode_stage() refuses first, this says why if not.
[[maybe_unused]] constexpr const char* kNoPagedDecode = "this build has no rung 05: no paged decode";

extern "C" int attn_decode_paged_workspace_bytes(const attn_paged_problem_t* cp, size_t* bytes, char* err,
                                                 size_t err_len) {
  return guarded([&] {
    if (!cp) throw attn::AttnError("problem is a null pointer");
    if (!bytes) throw attn::AttnError("bytes is a null pointer");
    const attn::AttnProblem p = paged_problem(*cp);
    attn::validate_problem(decode_stage(), p);
#ifdef ATTN_HAS_RUNG_05
    *bytes = attn::fa2::decode_paged_workspace(p);
#else
    throw attn::AttnError(kNoPagedDecode);
#endif
  }, err, err_len);
}

extern "C" int attn_decode_paged_async(const attn_paged_problem_t* cp, const void* q, const void* k_cache,
                                       const void* v_cache, const int* block_table, const int* seq_lens, void* o,
                                       float* lse, void* workspace, size_t workspace_bytes, void* stream, char* err,
                                       size_t err_len) {
  return guarded([&] {
    if (!cp) throw attn::AttnError("problem is a null pointer");
    const attn::AttnProblem p = paged_problem(*cp);
    const attn::Stage& s = decode_stage();
    attn::validate_problem(s, p);
    attn::validate_device(s);
    attn::AttnTensors t;
    t.q = q;
    t.o = o;
    t.lse = lse;
    t.workspace = workspace;
    t.workspace_bytes = workspace_bytes;
#ifdef ATTN_HAS_RUNG_05
    attn::fa2::run_decode_paged(p, paged_kv(*cp, k_cache, v_cache, block_table, seq_lens), t,
                                static_cast<cudaStream_t>(stream));
#else
    static_cast<void>(k_cache), static_cast<void>(v_cache), static_cast<void>(block_table);
    static_cast<void>(seq_lens), static_cast<void>(stream);
    throw attn::AttnError(kNoPagedDecode);
#endif
  }, err, err_len);
}

extern "C" int attn_decode_paged_check(const attn_paged_problem_t* cp, const void* workspace, void* stream_ptr,
                                       int* checked, char* err, size_t err_len) {
  if (checked) *checked = 0;
  return guarded([&] {
    if (!cp) throw attn::AttnError("problem is a null pointer");
    if (!workspace) throw attn::AttnError("workspace is a null pointer");
    auto stream = static_cast<cudaStream_t>(stream_ptr);
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    CUDA_CHECK(cudaStreamIsCapturing(stream, &capturing));
    if (capturing != cudaStreamCaptureStatusNone) return;  // no synchronization inside a capture
#ifdef ATTN_HAS_RUNG_05
    const attn::AttnProblem p = paged_problem(*cp);
    attn::validate_problem(decode_stage(), p);
    std::vector<attn::fa2::PagedErrorWord> records(attn::fa2::decode_paged_records(p));
    CUDA_CHECK(cudaMemcpyAsync(records.data(), workspace, records.size() * sizeof(records[0]),
                               cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    if (checked) *checked = 1;
    const std::string msg = attn::fa2::paged_error_message(
        attn::fa2::first_paged_error(records.data(), records.size()), cp->page_size, cp->max_pages, cp->num_pages);
    if (!msg.empty()) throw attn::AttnError(msg);
#else
    throw attn::AttnError(kNoPagedDecode);
#endif
  }, err, err_len);
}
