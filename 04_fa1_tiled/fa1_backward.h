// 04 backward: FlashAttention-1, Algorithm 4 (Dao et al. 2022, Appendix B). What the stage
// code and the kernel translation units share: the shared-memory layout of one CTA, the
// block sizes that fit it, the workspace, and the launch.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "04_fa1_tiled/fa1_tiled.cuh"
#include "common/attention.h"

namespace attn::fa1 {

// The backward's largest blocks: B_r = B_c = 64 keeps each step's five products at a few
// 16x16 tiles per warp; smaller blocks when the layout below does not fit (choose_bwd_blocks).
constexpr int kBwdMaxBlock = 64;

// Shared memory of one backward CTA, in this order (byte offsets from the dynamic smem base):
//
//   K_j, V_j      [B_c][d + skew]        elem   } the outer loop's block (loaded once per CTA)
//   Q_i, dO_i     [B_r][d + skew]        elem   } the inner loop's block
//   P_ij, dS_ij   [B_r][B_c + skew]      elem     A operands of P_ijᵀ dO_i, dS_ijᵀ Q_i, dS_ij K_j
//   S_ij          [B_r][B_c + skew]      fp32     τ Q_i K_jᵀ
//   dP_ij         [B_r][max(B_c,d)+skew] fp32     dO_i V_jᵀ, then dS_ij K_j (this step's dQ_i part)
//   dK~_j, dV~_j  [B_c][d + skew]        fp32     the CTA's accumulators (Algorithm 4, line 9)
//   L_i, D_i      [B_r]                  fp32     the rows' logsumexp and rowsum(dO_i ∘ O_i)
struct BwdSmemLayout {
  int Br, Bc, d, elem_bytes;

  __host__ __device__ int ld_qkv() const { return d + kSkew16; }
  __host__ __device__ int ld_p() const { return Bc + kSkew16; }
  __host__ __device__ int ld_s() const { return Bc + kSkew32; }
  __host__ __device__ int ld_dp() const { return (Bc > d ? Bc : d) + kSkew32; }
  __host__ __device__ int ld_acc() const { return d + kSkew32; }

  __host__ __device__ size_t k_offset() const { return 0; }
  __host__ __device__ size_t v_offset() const { return k_offset() + align_up(size_t(Bc) * ld_qkv() * elem_bytes); }
  __host__ __device__ size_t q_offset() const { return v_offset() + align_up(size_t(Bc) * ld_qkv() * elem_bytes); }
  __host__ __device__ size_t do_offset() const { return q_offset() + align_up(size_t(Br) * ld_qkv() * elem_bytes); }
  __host__ __device__ size_t p_offset() const { return do_offset() + align_up(size_t(Br) * ld_qkv() * elem_bytes); }
  __host__ __device__ size_t ds_offset() const { return p_offset() + align_up(size_t(Br) * ld_p() * elem_bytes); }
  __host__ __device__ size_t s_offset() const { return ds_offset() + align_up(size_t(Br) * ld_p() * elem_bytes); }
  __host__ __device__ size_t dp_offset() const { return s_offset() + align_up(size_t(Br) * ld_s() * sizeof(float)); }
  __host__ __device__ size_t dk_offset() const { return dp_offset() + align_up(size_t(Br) * ld_dp() * sizeof(float)); }
  __host__ __device__ size_t dv_offset() const { return dk_offset() + align_up(size_t(Bc) * ld_acc() * sizeof(float)); }
  __host__ __device__ size_t lse_offset() const { return dv_offset() + align_up(size_t(Bc) * ld_acc() * sizeof(float)); }
  __host__ __device__ size_t d_offset() const { return lse_offset() + align_up(size_t(Br) * sizeof(float)); }
  __host__ __device__ size_t bytes() const { return d_offset() + align_up(size_t(Br) * sizeof(float)); }
};

// B_r = B_c = kBwdMaxBlock, then, while the layout does not fit in smem_bytes, B_r gives up
// one 16-row tile (down to 16), then B_c. {0, 0} when not even 16 x 16 fits.
Blocks choose_bwd_blocks(int d, int elem_bytes, size_t smem_bytes);

// The workspace: dQ accumulated in fp32 by every K/V block's CTA (atomics), [B, H, Nq, d].
inline size_t bwd_workspace_bytes(const AttnProblem& p) { return size_t(p.q_elems()) * sizeof(float); }

// Enqueues the backward for one (element type, head dim): zero the dQ accumulator, the
// Algorithm 4 kernel (one CTA per (K/V block, batch, key/value head)), dQ to the output
// type. Defined in fa1_backward.cuh, instantiated by fa1_backward.cu.in.
template <typename T, int kHeadDim>
void fa1_backward_launch(const AttnProblem& p, const AttnBwdTensors& t, Blocks blocks, cudaStream_t stream);

}  // namespace attn::fa1
