// The C API on a GPU: attn_run_async with the caller's workspace gives the reference's answer
// for every rung, and both entries enqueue without synchronizing or allocating outside the
// stream, so a CUDA graph captures them.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "ladder/c_api.h"
#include "tests/gpu_test_util.h"

namespace attn::testing {
namespace {

attn_problem_t to_c(const AttnProblem& p) {
  return attn_problem_t{p.B, p.H, p.Hkv, p.Nq, p.Nk, p.d, p.causal ? 1 : 0, int(p.dtype), p.scale};
}

AttnProblem small_problem(DType t) {
  AttnProblem p;
  p.B = 2;
  p.H = 4;
  p.Hkv = 2;
  p.Nq = p.Nk = 113;
  p.d = 64;
  p.causal = true;
  p.dtype = t;
  return p;
}

RungOutput poisoned_output(const AttnProblem& p, cudaStream_t stream) {
  RungOutput out;
  out.o = DeviceBuffer(p.o_elems() * dtype_bytes(storage_dtype(p.dtype)));
  out.lse = DeviceBuffer(size_t(p.B) * p.H * p.Nq * sizeof(float));
  fill_poison(out.o.get(), out.o.bytes(), stream);
  fill_poison(out.lse.get(), out.lse.bytes(), stream);
  return out;
}

TEST_F(Gpu, CApiRunAsyncWithTheCallersWorkspace) {
  int checked = 0;
  for (DType t : {DType::bf16, DType::fp8_e4m3}) {
    const AttnProblem p = small_problem(t);
    ProblemInputs in(p, 23, Fill::normal, 0, 1, stream_, true);
    const std::vector<RowIndex> rows = all_rows(p);
    const ReferenceRows ref = reference_rows(p, in.host, rows);
    const attn_problem_t cp = to_c(p);
    for (const Stage& s : registry()) {
      if (!runs_here(s, p)) continue;
      SCOPED_TRACE(s.name);
      char err[512] = {0};
      size_t need = 0;
      ASSERT_EQ(attn_workspace_bytes(s.name.c_str(), &cp, &need, err, sizeof err), ATTN_OK) << err;
      RungOutput out = poisoned_output(p, stream_);
      if (need) out.workspace = DeviceBuffer(need);
      ASSERT_EQ(attn_run_async(s.name.c_str(), &cp, in.q.get(), in.k.get(), in.v.get(), out.o.get(),
                               static_cast<float*>(out.lse.get()), out.workspace.get(), need, stream_, err, sizeof err),
                ATTN_OK)
          << err;
      CUDA_CHECK(cudaStreamSynchronize(stream_));
      expect_matches_reference(s, out, in, rows, ref, stream_);
      ++checked;
    }
  }
  EXPECT_GT(checked, 0);
}

// A synchronization, a cudaMalloc or a free-memory query inside either entry would break the
// capture; a graph replayed twice must give the reference's answer each time.
TEST_F(Gpu, CApiEntriesAreCapturedInACudaGraph) {
  const AttnProblem p = small_problem(DType::bf16);
  ProblemInputs in(p, 29, Fill::normal, 0, 1, stream_, true);
  const std::vector<RowIndex> rows = all_rows(p);
  const ReferenceRows ref = reference_rows(p, in.host, rows);
  const attn_problem_t cp = to_c(p);
  int checked = 0;
  for (const char* name : {"01_naive", "05_fa2_reordered", "06d_fa3"}) {
    const Stage& s = find_stage(name);
    if (!runs_here(s, p)) continue;
    for (bool convenience : {false, true}) {
      SCOPED_TRACE(std::string(name) + (convenience ? " attn_run" : " attn_run_async"));
      RungOutput out = poisoned_output(p, stream_);
      size_t need = 0;
      char err[512] = {0};
      ASSERT_EQ(attn_workspace_bytes(name, &cp, &need, err, sizeof err), ATTN_OK) << err;
      if (need && !convenience) out.workspace = DeviceBuffer(need);
      CUDA_CHECK(cudaStreamSynchronize(stream_));
      cudaGraph_t graph = nullptr;
      CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
      const int rc =
          convenience ? attn_run(name, &cp, in.q.get(), in.k.get(), in.v.get(), out.o.get(),
                                 static_cast<float*>(out.lse.get()), stream_, err, sizeof err)
                      : attn_run_async(name, &cp, in.q.get(), in.k.get(), in.v.get(), out.o.get(),
                                       static_cast<float*>(out.lse.get()), out.workspace.get(), need, stream_, err,
                                       sizeof err);
      const cudaError_t end = cudaStreamEndCapture(stream_, &graph);
      ASSERT_EQ(rc, ATTN_OK) << err;
      ASSERT_EQ(end, cudaSuccess) << cudaGetErrorString(end);
      cudaGraphExec_t exec = nullptr;
      CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
      for (int replay = 0; replay < 2; ++replay) {
        fill_poison(out.o.get(), out.o.bytes(), stream_);
        CUDA_CHECK(cudaGraphLaunch(exec, stream_));
        CUDA_CHECK(cudaStreamSynchronize(stream_));
        expect_matches_reference(s, out, in, rows, ref, stream_);
      }
      CUDA_CHECK(cudaGraphExecDestroy(exec));
      CUDA_CHECK(cudaGraphDestroy(graph));
      ++checked;
    }
  }
  EXPECT_GT(checked, 0);
}

// The backward through the C API: the forward by attn_run_async (o and lse), then
// attn_run_backward_async with the caller's workspace, captured in a CUDA graph and replayed
// twice onto poisoned dq, dk, dv; each replay within the bounds of the fp64 gradients.
TEST_F(Gpu, CApiBackwardAsyncIsCapturedAndMatchesFp64) {
  const AttnProblem p = small_problem(DType::bf16);
  ProblemInputs in(p, 31, Fill::normal, 0, 1, stream_, true);
  GradInput g(p, 37, Fill::normal, 0, 1, stream_, true);
  const ReferenceGrads ref = reference_backward(p, in.host, g.host);
  const attn_problem_t cp = to_c(p);
  const size_t elem = dtype_bytes(p.dtype);
  int checked = 0;
  for (const Stage& s : registry()) {
    int dims[ATTN_MAX_HEAD_DIMS], n_dims = -1;
    char err[512] = {0};
    ASSERT_EQ(attn_backward_info(s.name.c_str(), dims, &n_dims, err, sizeof err), ATTN_OK) << err;
    if (n_dims == 0 || !backward_runs_here(s, p)) continue;
    SCOPED_TRACE(s.name);
    size_t fwd_need = 0, bwd_need = 0;
    ASSERT_EQ(attn_workspace_bytes(s.name.c_str(), &cp, &fwd_need, err, sizeof err), ATTN_OK) << err;
    ASSERT_EQ(attn_backward_workspace_bytes(s.name.c_str(), &cp, &bwd_need, err, sizeof err), ATTN_OK) << err;
    EXPECT_EQ(bwd_need, s.backward_workspace(p));
    RungOutput fwd = poisoned_output(p, stream_);
    DeviceBuffer fwd_ws(fwd_need), bwd_ws(bwd_need);
    ASSERT_EQ(attn_run_async(s.name.c_str(), &cp, in.q.get(), in.k.get(), in.v.get(), fwd.o.get(),
                             fwd.lse.as<float>(), fwd_ws.get(), fwd_need, stream_, err, sizeof err),
              ATTN_OK)
        << err;
    DeviceBuffer dq(p.q_elems() * elem), dk(p.kv_elems() * elem), dv(p.kv_elems() * elem);
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    cudaGraph_t graph = nullptr;
    CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    const int rc = attn_run_backward_async(s.name.c_str(), &cp, in.q.get(), in.k.get(), in.v.get(), fwd.o.get(),
                                           fwd.lse.as<float>(), g.dout.get(), dq.get(), dk.get(), dv.get(),
                                           bwd_ws.get(), bwd_need, stream_, err, sizeof err);
    const cudaError_t end = cudaStreamEndCapture(stream_, &graph);
    ASSERT_EQ(rc, ATTN_OK) << err;
    ASSERT_EQ(end, cudaSuccess) << cudaGetErrorString(end);
    cudaGraphExec_t exec = nullptr;
    CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    for (int replay = 0; replay < 2; ++replay) {
      for (DeviceBuffer* b : {&dq, &dk, &dv, &bwd_ws}) fill_poison(b->get(), b->bytes(), stream_);
      CUDA_CHECK(cudaGraphLaunch(exec, stream_));
      CUDA_CHECK(cudaStreamSynchronize(stream_));
      EXPECT_LE(rel_frobenius(download_as_double(dq.get(), p.q_elems(), p.dtype), ref.dq), tolerance(p.dtype));
      EXPECT_LE(rel_frobenius(download_as_double(dk.get(), p.kv_elems(), p.dtype), ref.dk), tolerance(p.dtype));
      EXPECT_LE(rel_frobenius(download_as_double(dv.get(), p.kv_elems(), p.dtype), ref.dv), tolerance(p.dtype));
    }
    CUDA_CHECK(cudaGraphExecDestroy(exec));
    CUDA_CHECK(cudaGraphDestroy(graph));
    ++checked;
  }
  EXPECT_GE(checked, 2);  // 04_fa1_tiled, 05_fa2_reordered
}

}  // namespace
}  // namespace attn::testing
