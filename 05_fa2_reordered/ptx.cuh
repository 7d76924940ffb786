// Thin, named wrappers around the sm_80 PTX this rung uses, so the kernel body reads as the
// algorithm: cp.async (global -> shared without registers), ldmatrix (shared -> mma
// fragments) and mma.sync m16n8k16 (tensor cores, fp32 accumulate).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "common/device_math.cuh"

namespace attn::fa2::ptx {

// Shared-memory address as the 32-bit value PTX instructions expect.
__device__ inline uint32_t smem_u32(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

// Copy 16 bytes global -> shared, bypassing L1 (.cg). With valid = false nothing is read and
// the 16 bytes are zero-filled (src-size 0): how ragged Q/K/V rows past N become zeros.
__device__ inline void cp_async_16(uint32_t dst, const void* src, bool valid) {
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
// Close the current group of cp.async copies.
__device__ inline void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Wait until at most `kPending` of this thread's committed groups are still in flight.
template <int kPending>
__device__ inline void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// Four 8x8 b16 matrices; lanes 8m..8m+7 give the 8 row addresses of matrix m, and lane
// l receives row l/4, columns 2(l%4), 2(l%4)+1 of each matrix in r[m].
__device__ inline void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
// As ldmatrix_x4, transposed: lane l receives rows 2(l%4), 2(l%4)+1 of column l/4.
__device__ inline void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// D += A B for one 16x8x16 tile: A 16x16 row-major (4 regs of 2 elements), B 16x8
// column-major (2 regs), D 16x8 fp32 (4 regs). Fragment layouts: see 05d_fa2_reordered.cuh.
template <typename T>
__device__ inline void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);

template <>
__device__ inline void mma_16816<__nv_bfloat16>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <>
__device__ inline void mma_16816<__half>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Programmatic dependent launch (sm_90): a grid launched with
// cudaLaunchAttributeProgrammaticStreamSerialization may start once every CTA of the grid
// before it has called launch_dependents (or exited); it calls wait before reading what that
// grid writes, which returns once that grid has finished and its writes are visible. Below
// sm_90 both are empty: the grids then run one after the other (launch_fa2_decode).
__device__ inline void griddep_launch_dependents() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
__device__ inline void griddep_wait() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// exp2_approx and pack2 live in common/device_math.cuh (rung 06 uses them too).

}  // namespace attn::fa2::ptx
