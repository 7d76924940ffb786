// 04: FlashAttention-1 (Dao et al. 2022, Algorithm 1). What both the stage code and the
// kernel translation units need: the block sizes B_r, B_c (chosen at launch from the
// device's shared memory), the shared-memory layout they imply, and the launch.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "common/attention.h"

namespace attn::fa1 {

constexpr int kTile = 16;       // WMMA tile edge (m = n = k = 16 for bf16/fp16 in, fp32 out)
constexpr int kSkew16 = 8;      // padding (elements) per 16-bit row: 16 bytes, so that the
                                // rows of one tile start in different banks
constexpr int kSkew32 = 4;      // the same 16 bytes for fp32 rows
constexpr int kSmemAlign = 128; // each shared buffer starts on this byte boundary
constexpr int kRowVectors = 4;  // fp32 [B_r] vectors in shared memory: m_i, l_i and two weights

__host__ __device__ constexpr size_t align_up(size_t bytes) {
  return (bytes + kSmemAlign - 1) / kSmemAlign * kSmemAlign;
}

// Shared memory of one CTA, in this order (byte offsets from the dynamic smem base):
//
//   K_j   [B_c][d + skew]        elem     } the outer loop's block (loaded once per j)
//   V_j   [B_c][d + skew]        elem     }
//   Q_i   [B_r][d + skew]        elem       the inner loop's block
//   P_ij  [B_r][B_c + skew]      elem       P~_ij, the A operand of P~_ij V_j
//   S_ij  [B_r][max(B_c,d)+skew] fp32       S_ij, then reused for P~_ij V_j
//   m_i, l_i, old_weight, new_weight        fp32 [B_r] each: the block's row statistics
//                                           and the two per-row weights of the O_i update
struct SmemLayout {
  int Br, Bc, d, elem_bytes;

  __host__ __device__ int ld_qkv() const { return d + kSkew16; }
  __host__ __device__ int ld_p() const { return Bc + kSkew16; }
  __host__ __device__ int ld_s() const { return (Bc > d ? Bc : d) + kSkew32; }

  __host__ __device__ size_t k_offset() const { return 0; }
  __host__ __device__ size_t v_offset() const { return k_offset() + align_up(size_t(Bc) * ld_qkv() * elem_bytes); }
  __host__ __device__ size_t q_offset() const { return v_offset() + align_up(size_t(Bc) * ld_qkv() * elem_bytes); }
  __host__ __device__ size_t p_offset() const { return q_offset() + align_up(size_t(Br) * ld_qkv() * elem_bytes); }
  __host__ __device__ size_t s_offset() const { return p_offset() + align_up(size_t(Br) * ld_p() * elem_bytes); }
  // the k-th per-row vector (0: m_i, 1: l_i, 2: old_weight, 3: new_weight)
  __host__ __device__ size_t row_offset(int k) const {
    return s_offset() + align_up(size_t(Br) * ld_s() * sizeof(float)) + k * align_up(size_t(Br) * sizeof(float));
  }
  __host__ __device__ size_t bytes() const { return row_offset(kRowVectors); }
};

struct Blocks {
  int Br = 0, Bc = 0;  // 0 when not even one 16x16 tile fits
};

// The paper's rule with M = the on-chip memory in elements: B_c = ceil(M / 4d),
// B_r = min(ceil(M / 4d), d); both rounded down to the tensor-core tile; then, while the
// layout above does not fit in smem_bytes, the larger of the two gives up one tile.
Blocks choose_blocks(int d, int elem_bytes, size_t smem_bytes);

// choose_blocks for p on the current device (cudaDevAttrMaxSharedMemoryPerBlockOptin).
// Throws AttnError when nothing fits.
Blocks device_blocks(const AttnProblem& p);

// Enqueues the FA1 kernel for one (element type, head dim); defined in fa1_tiled_kernel.cuh,
// instantiated by fa1_tiled.cu.in. t.workspace holds O (fp32, [B,H,Nq,d]), then l, then m
// (fp32, [B,H,Nq] each).
template <typename T, int kHeadDim>
void fa1_launch(const AttnProblem& p, const AttnTensors& t, Blocks blocks, cudaStream_t stream);

}  // namespace attn::fa1
