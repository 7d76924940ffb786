#include "01_naive/score_pipeline.h"

#include <cublas_v2.h>

#include <climits>
#include <mutex>
#include <vector>

#include "01_naive/softmax_rows.cuh"
#include "common/check.h"
#include "common/dtype.cuh"
#include "common/hbm_model.h"

namespace attn::score_pipeline {

using namespace softmax_rows;

namespace {

size_t round_up(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

size_t scores_bytes(const AttnProblem& p) { return round_up(size_t(p.score_elems()) * sizeof(float)); }
size_t probs_bytes(const AttnProblem& p) { return round_up(size_t(p.score_elems()) * dtype_bytes(p.dtype)); }
size_t stats_bytes(const AttnProblem& p) { return round_up(size_t(p.lse_elems()) * sizeof(float)); }

cudaDataType cuda_type(DType t) { return t == DType::bf16 ? CUDA_R_16BF : CUDA_R_16F; }

// One cuBLAS handle per device, created on first use and never destroyed (the process
// exit tears the context down first). A handle follows one stream at a time, so a launch
// holds it, bound to its stream, for its whole scope: concurrent host threads take turns.
class CublasOnStream {
 public:
  explicit CublasOnStream(cudaStream_t stream) : lock_(mutex()) {
    int dev = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    std::vector<cublasHandle_t>& handles = per_device();
    if (size_t(dev) >= handles.size()) handles.resize(dev + 1, nullptr);
    if (!handles[dev]) CUBLAS_CHECK(cublasCreate(&handles[dev]));
    handle_ = handles[dev];
    CUBLAS_CHECK(cublasSetStream(handle_, stream));
  }
  cublasHandle_t get() const { return handle_; }

 private:
  static std::mutex& mutex() {
    static std::mutex m;
    return m;
  }
  static std::vector<cublasHandle_t>& per_device() {
    static std::vector<cublasHandle_t> handles;
    return handles;
  }
  std::unique_lock<std::mutex> lock_;
  cublasHandle_t handle_ = nullptr;
};

// cuBLAS is column-major; a row-major [rows × cols] matrix is its column-major transpose.
// So both GEMMs are written for the transposes, and every "row-major" below is our layout.

// GEMM 1: S = scale · Q Kᵀ per (batch, kv head), i.e. Sᵀ = K · Qᵀ column-major:
//   Sᵀ [Nk × M] = K [Nk × d] · Qᵀ [d × M],  M = group·Nq query rows (op T: cuBLAS sees K as Kᵀ).
void scores_gemm(cublasHandle_t cublas, const AttnProblem& p, const AttnTensors& t, float* S) {
  const int M = p.group() * p.Nq;
  const float alpha = p.softmax_scale(), beta = 0.f;
  CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      cublas, CUBLAS_OP_T, CUBLAS_OP_N, /*m=*/p.Nk, /*n=*/M, /*k=*/p.d, &alpha,
      t.k, cuda_type(p.dtype), /*lda=*/p.d, /*strideA=*/int64_t(p.Nk) * p.d,
      t.q, cuda_type(p.dtype), /*ldb=*/p.d, /*strideB=*/int64_t(M) * p.d, &beta,
      S, CUDA_R_32F, /*ldc=*/p.Nk, /*strideC=*/int64_t(M) * p.Nk,
      /*batchCount=*/p.B * p.Hkv, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

// GEMM 2: O = P V per (batch, kv head), i.e. Oᵀ = Vᵀ · Pᵀ column-major:
//   Oᵀ [d × M] = Vᵀ [d × Nk] · Pᵀ [Nk × M].
void values_gemm(cublasHandle_t cublas, const AttnProblem& p, const AttnTensors& t, const void* P) {
  const int M = p.group() * p.Nq;
  const float alpha = 1.f, beta = 0.f;
  CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      cublas, CUBLAS_OP_N, CUBLAS_OP_N, /*m=*/p.d, /*n=*/M, /*k=*/p.Nk, &alpha,
      t.v, cuda_type(p.dtype), /*lda=*/p.d, /*strideA=*/int64_t(p.Nk) * p.d,
      P, cuda_type(p.dtype), /*ldb=*/p.Nk, /*strideB=*/int64_t(M) * p.Nk, &beta,
      t.o, cuda_type(p.dtype), /*ldc=*/p.d, /*strideC=*/int64_t(M) * p.d,
      /*batchCount=*/p.B * p.Hkv, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

// P_ij = exp(S_ij - m_i) / l_i; masked keys read as S_ij = -inf and get P_ij = 0.
// Without a max (01) m_i = 0; a row with no visible key gets P_i = 0 and lse_i = -inf.
template <typename T, typename Walk>
__global__ void __launch_bounds__(Walk::Threads)
    normalize_kernel(ScoreRows rows, const float* S, const float* row_max, const float* row_sum, T* P, float* lse) {
  for (int64_t r = first_row(); r < rows.count; r += row_stride()) {
    const int64_t n = rows.visible(r);
    const float* S_i = S + r * rows.Nk;
    T* P_i = P + r * rows.Nk;
    const float m_i = row_max && n > 0 ? row_max[r] : 0.f;  // finite, so exp(-inf - m_i) = 0
    const float inv_l_i = n > 0 ? 1.f / row_sum[r] : 0.f;
    for (int64_t base = 0; base < rows.Nk; base += Walk::Step) {
      float s[Walk::Chunk];
      load_chunk<Walk>(S_i, base, n, s);
#pragma unroll
      for (int u = 0; u < Walk::Unroll; ++u) {
        const int64_t c = column<Walk>(base, u);
        if (c >= rows.Nk) continue;  // past the row (Width = 4 rows end on a whole vector)
        Vec<T, Walk::Width> P_ij;
#pragma unroll
        for (int k = 0; k < Walk::Width; ++k) P_ij.v[k] = from_float<T>(__expf(s[u * Walk::Width + k] - m_i) * inv_l_i);
        *reinterpret_cast<Vec<T, Walk::Width>*>(P_i + c) = P_ij;
      }
    }
    if (lse && lane() == 0) lse[r] = n > 0 ? m_i + logf(row_sum[r]) : -INFINITY;
  }
}

template <typename T>
void normalize_as(const AttnProblem& p, const Workspace& ws, bool subtract_max, float* lse, cudaStream_t stream) {
  const ScoreRows rows = score_rows(p);
  with_row_walk(p.Nk, [&](auto walk) {
    using Walk = decltype(walk);
    normalize_kernel<T, Walk><<<row_grid<Walk>(rows), Walk::Threads, 0, stream>>>(
        rows, ws.S, subtract_max ? ws.row_max : nullptr, ws.row_sum, static_cast<T*>(ws.P), lse);
    CUDA_CHECK_LAUNCH();
  });
}

}  // namespace

size_t workspace_bytes(const AttnProblem& p) { return scores_bytes(p) + probs_bytes(p) + 2 * stats_bytes(p); }

Workspace carve(const AttnProblem& p, const AttnTensors& t) {
  char* base = static_cast<char*>(t.workspace);
  Workspace ws;
  ws.S = reinterpret_cast<float*>(base);
  ws.P = base + scores_bytes(p);
  ws.row_max = reinterpret_cast<float*>(base + scores_bytes(p) + probs_bytes(p));
  ws.row_sum = reinterpret_cast<float*>(base + scores_bytes(p) + probs_bytes(p) + stats_bytes(p));
  return ws;
}

std::string refuse(const AttnProblem& p) {
  // cuBLAS takes GEMM sizes, leading dimensions and the batch count as int (strides are
  // 64-bit); Nk and d are ints already, so the products are what can overflow.
  const int64_t rows_per_batch = int64_t(p.group()) * p.Nq;  // GEMM n: one kv head's query rows
  const int64_t batches = int64_t(p.B) * p.Hkv;
  if (rows_per_batch > INT_MAX)
    return "(H / Hkv) * Nq = " + std::to_string(rows_per_batch) +
           " query rows per kv head exceed the 32-bit int cuBLAS takes for a GEMM size";
  if (batches > INT_MAX)
    return "B * Hkv = " + std::to_string(batches) + " GEMMs exceed the 32-bit int cuBLAS takes for a batch count";
  // S and P need (4 + e) bytes per (query, key) pair; refuse before size_t arithmetic wraps.
  const double pairs = double(p.B) * p.H * p.Nq * p.Nk;
  const double bytes = pairs * (sizeof(float) + dtype_bytes(p.dtype));
  if (bytes > double(INT64_MAX) / 2)
    return "S and P would need " + std::to_string(bytes) + " bytes, more than any device holds";
  return "";
}

void launch(const AttnProblem& p, const AttnTensors& t, cudaStream_t stream, Softmax softmax) {
  const Workspace ws = carve(p, t);
  CublasOnStream cublas(stream);
  scores_gemm(cublas.get(), p, t, ws.S);  // S = scale · Q Kᵀ
  softmax(p, ws, t.lse, stream);          // P = softmax(S), the rung's own
  values_gemm(cublas.get(), p, t, ws.P);  // O = P V
}

void normalize(const AttnProblem& p, const Workspace& ws, bool subtract_max, float* lse, cudaStream_t stream) {
  if (p.dtype == DType::bf16)
    normalize_as<__nv_bfloat16>(p, ws, subtract_max, lse, stream);
  else
    normalize_as<__half>(p, ws, subtract_max, lse, stream);
}

Stage make_stage(std::string name, std::string prev, std::string summary, int softmax_reads, Softmax softmax) {
  Stage s;
  s.name = std::move(name);
  s.prev = std::move(prev);
  s.summary = std::move(summary);
  s.min_sm = 80;
  s.dtypes = {DType::bf16, DType::fp16};
  s.head_dims = {64, 128, 256};
  s.gqa = true;
  s.writes_lse = true;
  s.compute_bound = false;
  s.refuse = refuse;
  s.workspace_bytes = workspace_bytes;
  s.launch = [softmax](const AttnProblem& p, const AttnTensors& t, cudaStream_t stream) {
    launch(p, t, stream, softmax);
  };
  s.model_hbm_bytes = [softmax_reads](const AttnProblem& p) { return hbm::score_pipeline_bytes(p, softmax_reads); };
  s.launch_softmax_only = [softmax](const AttnProblem& p, const AttnTensors& t, cudaStream_t stream) {
    softmax(p, carve(p, t), t.lse, stream);
  };
  s.softmax_model_bytes = [softmax_reads](const AttnProblem& p) { return hbm::softmax_bytes(p, softmax_reads); };
  return s;
}

}  // namespace attn::score_pipeline
