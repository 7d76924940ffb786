// The score pipeline shared by 01, 02 and 03a: they differ only in their softmax.
//
//   GEMM 1 (cuBLAS)   S = scale · Q Kᵀ        fp32, [B, H, Nq, Nk] in the workspace
//   softmax (the rung) P = softmax(S + mask)  input dtype, [B, H, Nq, Nk] in the workspace
//   GEMM 2 (cuBLAS)   O = P V                 input dtype, fp32 accumulation
//
// Grouped-query attention costs nothing here: the query heads g·group .. g·group+group-1
// that share kv head g are adjacent in [B, H, Nq, d], so per (batch, kv head) their Q rows
// form one [group·Nq × d] matrix and both GEMMs are batched over B·Hkv.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <string>

#include "common/attention.h"
#include "common/stage.h"

namespace attn::score_pipeline {

// The workspace, carved into four arrays (each starts on a kAlign boundary):
//
//   | S: fp32 [B,H,Nq,Nk] | P: dtype [B,H,Nq,Nk] | row_max m: fp32 [B,H,Nq] | row_sum l: fp32 [B,H,Nq] |
struct Workspace {
  float* S = nullptr;
  void* P = nullptr;
  float* row_max = nullptr;  // m_i (01 keeps none and leaves it unused)
  float* row_sum = nullptr;  // l_i
};

constexpr size_t kAlign = 256;  // every array starts 16-byte aligned, as float4 loads need

size_t workspace_bytes(const AttnProblem& p);
Workspace carve(const AttnProblem& p, const AttnTensors& t);

// "" when cuBLAS's 32-bit int arguments (GEMM sizes, leading dimensions, batch count) and
// the workspace size can hold this problem; else the reason.
std::string refuse(const AttnProblem& p);

// A rung's softmax: reads S, writes P (masked keys and rows with no visible key get P = 0),
// its row statistics in the workspace, and lse when it is non-null. Enqueued on `stream`.
using Softmax = void (*)(const AttnProblem& p, const Workspace& ws, float* lse, cudaStream_t stream);

// Enqueues GEMM 1, the softmax, GEMM 2.
void launch(const AttnProblem& p, const AttnTensors& t, cudaStream_t stream, Softmax softmax);

// The last pass of every softmax here: P_ij = exp(S_ij - m_i) / l_i over the visible keys,
// 0 over the masked ones, lse_i = m_i + log l_i. With subtract_max = false (01) m_i = 0.
void normalize(const AttnProblem& p, const Workspace& ws, bool subtract_max, float* lse, cudaStream_t stream);

// The Stage of a rung built on this pipeline: sm_80+, bf16/fp16, GQA, lse, memory-bound.
// softmax_reads = how many times the softmax streams S (the cost model).
Stage make_stage(std::string name, std::string prev, std::string summary, int softmax_reads, Softmax softmax);

}  // namespace attn::score_pipeline
