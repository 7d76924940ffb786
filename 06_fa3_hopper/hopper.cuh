// Thin, named wrappers over the Hopper (sm_90a) instructions this rung uses, so that the
// kernel body reads as the algorithm: TMA tensor maps and loads (and plain bulk copies),
// mbarriers, wgmma descriptors / fence / commit / wait, setmaxnreg, named barriers; on the
// host, also the launch helpers of the persistent grids (configure_kernel, persistent_grid). The
// layout arithmetic behind the descriptors and tensor maps is in swizzle.h (host and device).
// Each device wrapper is one PTX instruction (or a wait loop around one); the PTX ISA
// section named in the comment is the reference.
#pragma once

#include <cuda.h>  // CUtensorMap and its enums (types only: libcuda is not linked)
#include <cuda_runtime.h>
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled
#include <cuda_fp8.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <utility>

#include "06_fa3_hopper/swizzle.h"
#include "06_fa3_hopper/wgmma_ops.cuh"
#include "common/check.h"
#include "common/device_math.cuh"
#include "common/smem_limit.h"
#include "common/stage.h"

namespace attn::hopper {

// ---------------------------------------------------------------------------------------
// Host: TMA tensor maps
// ---------------------------------------------------------------------------------------

// A [heads, rows, d] view of a contiguous [B, H, N, d] tensor (heads = B*H), read in boxes
// of box_rows x (one swizzle row) and stored swizzled (swizzle.h). A d-wide tile is loaded
// as d / (row_bytes / elem_bytes) boxes ("column chunks"): bf16/fp16 use the 128-byte
// swizzle, 64 elements per chunk; e4m3 (elem_bytes = 1) 128 elements per chunk, or one
// 64-byte chunk for a 64-byte row (Swizzle::b64). Rows past N are zero-filled by the copy
// engine: a tile never runs into the next head's rows.
// The tiled map of `rank` dims (innermost first; strides in bytes of dims 1..rank-1), boxes of
// one swizzle row x box_rows x 1 ..., stored swizzled.
inline CUtensorMap encode_tensor_map(const void* base, CUtensorMapDataType type, int rank, const cuuint64_t* dims,
                                     const cuuint64_t* strides, int box_rows, int elem_bytes, Swizzle swizzle) {
  static PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult status{};
    CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &status));
    if (status != cudaDriverEntryPointSuccess || !fn)
      throw AttnError("06_fa3_hopper: the driver does not provide cuTensorMapEncodeTiled (needs CUDA 12+)");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  const int chunk_cols = row_bytes(swizzle) / elem_bytes;
  if (int(dims[0]) % chunk_cols != 0)
    throw AttnError("06_fa3_hopper: a row of " + std::to_string(dims[0]) + " elements is not whole " +
                    std::to_string(row_bytes(swizzle)) + "-byte swizzle rows");
  CUtensorMap map{};
  const cuuint32_t box[4] = {cuuint32_t(chunk_cols), cuuint32_t(box_rows), 1, 1};
  const cuuint32_t element_strides[4] = {1, 1, 1, 1};
  CUresult r = encode(&map, type, cuuint32_t(rank), const_cast<void*>(base), dims, strides, box, element_strides,
                      CU_TENSOR_MAP_INTERLEAVE_NONE,
                      swizzle == Swizzle::b128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B,
                      CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE /* out-of-bounds elements read as zero */);
  if (r != CUDA_SUCCESS)
    throw AttnError("06_fa3_hopper: cuTensorMapEncodeTiled failed with CUresult " + std::to_string(int(r)) +
                    " (pointers and strides must be 16-byte aligned)");
  return map;
}

inline CUtensorMap make_tensor_map_3d(const void* base, CUtensorMapDataType type, int heads, int rows, int d,
                                      int box_rows, int elem_bytes, Swizzle swizzle) {
  const cuuint64_t dims[3] = {cuuint64_t(d), cuuint64_t(rows), cuuint64_t(heads)};  // innermost first
  const cuuint64_t strides[2] = {cuuint64_t(d) * elem_bytes, cuuint64_t(rows) * d * elem_bytes};  // bytes, dims 1..2
  return encode_tensor_map(base, type, 3, dims, strides, box_rows, elem_bytes, swizzle);
}

// A [B, H, rows, d] tensor with any strides (elements; batch, head, row), its d elements
// contiguous: boxes as make_tensor_map_3d's, at coordinates (column, row, head, batch). The
// backward's dO arrives so from a [B, N, H, d] activation (AttnBwdTensors::dout_strides).
inline CUtensorMap make_tensor_map_4d(const void* base, CUtensorMapDataType type, int B, int H, int rows, int d,
                                      const int64_t (&strides)[3], int box_rows, int elem_bytes, Swizzle swizzle) {
  const cuuint64_t dims[4] = {cuuint64_t(d), cuuint64_t(rows), cuuint64_t(H), cuuint64_t(B)};
  const cuuint64_t bytes[3] = {cuuint64_t(strides[2]) * elem_bytes, cuuint64_t(strides[1]) * elem_bytes,
                               cuuint64_t(strides[0]) * elem_bytes};
  return encode_tensor_map(base, type, 4, dims, bytes, box_rows, elem_bytes, swizzle);
}

// ---------------------------------------------------------------------------------------
// Host: launch configuration
// ---------------------------------------------------------------------------------------

// Once per kernel and device, at its first launch there: opt in to more than 48 KB of
// dynamic shared memory (an attribute of the device's context) and ask how many CTAs of it
// fit on one SM. A kernel launched on a second GPU is configured there again.
template <auto kKernel>
int configure_kernel(int threads, size_t smem_bytes) {
  constexpr int kDevices = 64;
  static std::atomic<int> ctas_per_sm[kDevices];  // 0: not configured on that device yet
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  if (device < kDevices)
    if (const int n = ctas_per_sm[device].load(std::memory_order_relaxed); n > 0) return n;
  allow_dynamic_smem(kKernel, smem_bytes, "06_fa3_hopper: a kernel of " + std::to_string(threads) + " threads");
  int n = 0;
  CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kKernel, threads, smem_bytes));
  n = n > 1 ? n : 1;
  if (device < kDevices) ctas_per_sm[device].store(n, std::memory_order_relaxed);
  return n;
}

// A persistent grid over `units` pieces of work: as many CTAs as fit on the current device
// at once (ctas_per_sm on each SM), fewer if there are fewer units.
inline unsigned persistent_grid(long long units, int ctas_per_sm) {
  int device = 0, sms = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const long long fit = 1LL * sms * ctas_per_sm;
  return unsigned(units < fit ? units : fit);
}

// Launches kernel<<<grid, block, smem, stream>>>(args...), with `beside`: allowed to start
// beside the stream's previous kernel (programmatic stream serialization), once every CTA of
// that grid has called grid_dependents_may_launch (or exited).
template <typename... Params, typename... Args>
void launch_beside_previous(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                            bool beside, Args&&... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = &attribute;
  config.numAttrs = beside ? 1 : 0;
  CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}

// ---------------------------------------------------------------------------------------
// Device: programmatic dependent launch (PTX ISA 9.7.13.12, griddepcontrol)
// ---------------------------------------------------------------------------------------

// Lets the stream's next kernel, if it was launched with programmatic stream serialization,
// be scheduled once every CTA of this grid has executed this (or exited).
__device__ inline void grid_dependents_may_launch() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }
// Waits until the grids this one was launched beside have completed and their memory
// operations are visible; a no-op in a grid launched the ordinary way.
__device__ inline void grid_dependency_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

// ---------------------------------------------------------------------------------------
// Device: shared-memory addresses, mbarriers (PTX ISA 9.7.13.15)
// ---------------------------------------------------------------------------------------

__device__ inline uint32_t smem_addr(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }
// A 32-bit load from shared memory by its shared-window address: reading a field of the
// SharedStorage reference as a plain C++ load makes a generic load, and keeps the 64-bit
// generic base live across the tile loop (at d = 128, B_c = 192, ptxas spilled it).
__device__ inline int ld_shared(const int* p) {
  int v;
  asm volatile("ld.shared.b32 %0, [%1];" : "=r"(v) : "r"(smem_addr(p)) : "memory");
  return v;
}

// An mbarrier completes a phase when `arrivals` threads arrived and all expected
// transaction bytes (TMA) landed; waiters test the phase parity.
__device__ inline void mbarrier_init(uint64_t* bar, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(arrivals) : "memory");
}
// Makes the initialised barriers visible to the async proxy (the TMA unit).
__device__ inline void fence_barrier_init() { asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }

__device__ inline void mbarrier_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
}
// Arrive and announce that `bytes` will land on this barrier (by TMA) in this phase.
__device__ inline void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes)
               : "memory");
}
// Block until the phase with parity `phase` has completed.
__device__ inline void mbarrier_wait(uint64_t* bar, uint32_t phase) {
  asm volatile(
      "{\n.reg .pred done;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n}\n" ::"r"(smem_addr(bar)),
      "r"(phase)
      : "memory");
}

// ---------------------------------------------------------------------------------------
// Device: TMA load (PTX ISA 9.7.9.25): one box of a 3-D tensor map into shared memory,
// completing `bytes` on the mbarrier.
// ---------------------------------------------------------------------------------------

__device__ inline void tma_load_3d(void* dst, const CUtensorMap* map, int c0, int c1, int c2, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], "
      "[%5];" ::"r"(smem_addr(dst)),
      "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(smem_addr(bar))
      : "memory");
}

// The same from a 4-D map (make_tensor_map_4d): coordinates (column, row, head, batch).
__device__ inline void tma_load_4d(void* dst, const CUtensorMap* map, int c0, int c1, int c2, int c3, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], "
      "[%6];" ::"r"(smem_addr(dst)),
      "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(smem_addr(bar))
      : "memory");
}

// The reverse (PTX ISA 9.7.9.25, cp.async.bulk.tensor, shared::cta -> global): one box of
// shared memory, laid out as tma_load_3d would write it, stored at the box's coordinates;
// elements outside the tensor are not written. Tracked by the issuing thread's bulk groups:
// bulk_wait_group_read before the shared memory is reused or the CTA exits.
__device__ inline void tma_store_3d(const CUtensorMap* map, const void* src, int c0, int c1, int c2) {
  asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.tile.bulk_group [%0, {%2, %3, %4}], [%1];" ::"l"(map),
               "r"(smem_addr(src)), "r"(c0), "r"(c1), "r"(c2)
               : "memory");
}

// A bulk copy (PTX ISA 9.7.9.25, non-tensor): `bytes` contiguous bytes of global memory
// into shared memory, completing `bytes` on the mbarrier. Addresses and size are multiples
// of 16 bytes.
__device__ inline void bulk_load(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(smem_addr(dst)),
      "l"(src), "r"(bytes), "r"(smem_addr(bar))
      : "memory");
}

// The reverse direction with an add (PTX ISA 9.7.9.25.4, cp.reduce.async.bulk): `bytes`
// contiguous fp32 of shared memory added element by element into global memory, as one
// bulk operation of the copy engine, tracked by the issuing thread's bulk groups (not an
// mbarrier). Addresses and size are multiples of 16 bytes.
__device__ inline void bulk_reduce_add_f32(float* dst, const float* src, uint32_t bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;" ::"l"(dst),
               "r"(smem_addr(src)), "r"(bytes)
               : "memory");
}
// Close this thread's bulk operations issued so far into one bulk group.
__device__ inline void bulk_commit_group() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }
// Wait until at most `Pending` of this thread's bulk groups still read their shared memory
// (.read: the source may be overwritten; the global writes may still be in flight).
template <int Pending>
__device__ inline void bulk_wait_group_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(Pending) : "memory");
}
// Wait until at most `Pending` of this thread's bulk groups are still in flight at all.
template <int Pending>
__device__ inline void bulk_wait_group() {
  asm volatile("cp.async.bulk.wait_group %0;" ::"n"(Pending) : "memory");
}

// The same box copied into the shared memory of every CTA of the cluster named in
// `cta_mask` (bit i: CTA rank i), at this CTA's offset `dst`; each receiving CTA's mbarrier
// at offset `bar` sees the bytes that land in its own shared memory.
__device__ inline void tma_load_3d_multicast(void* dst, const CUtensorMap* map, int c0, int c1, int c2, uint64_t* bar,
                                             uint16_t cta_mask) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster "
      "[%0], [%1, {%2, %3, %4}], [%5], %6;" ::"r"(smem_addr(dst)),
      "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(smem_addr(bar)), "h"(cta_mask)
      : "memory");
}

// ---------------------------------------------------------------------------------------
// Device: thread-block clusters (PTX ISA 9.7.12.3, 9.7.13.15)
// ---------------------------------------------------------------------------------------

// This CTA's rank in its cluster.
__device__ inline uint32_t cluster_ctarank() {
  uint32_t rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
  return rank;
}
// Arrive on the mbarrier at the same shared-memory offset as `bar` in CTA `cta` of the
// cluster (default semantics, release at CTA scope, as for a local arrive).
__device__ inline void mbarrier_arrive_remote(uint64_t* bar, uint32_t cta) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(smem_addr(bar)), "r"(cta));
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];" ::"r"(remote) : "memory");
}
// Every thread of every CTA of the cluster waits here for all the others.
__device__ inline void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}

// ---------------------------------------------------------------------------------------
// Device: wgmma (PTX ISA 9.7.15)
// ---------------------------------------------------------------------------------------

// Shared-memory matrix descriptor of a swizzled tile (encode_smem_desc in swizzle.h):
//   K-major operand (Q, K; the FP8 path's Vᵀ): 8-row atoms atom_bytes(swizzle) apart (SBO);
//                            LBO unused.
//   N-major operand (V):     the same atoms; LBO = bytes between column chunks.
__device__ inline uint64_t make_smem_desc(const void* tile, uint32_t leading_bytes, uint32_t stride_bytes,
                                          Swizzle swizzle) {
  return encode_smem_desc(smem_addr(tile), leading_bytes, stride_bytes, swizzle);
}
// Advance a descriptor's start address by `bytes` (16-byte units live in bits 0-13).
__device__ inline uint64_t desc_advance(uint64_t desc, uint32_t bytes) { return desc + (bytes >> 4); }

// Shared-memory writes of this thread (generic proxy) made visible to later wgmma and TMA
// reads (async proxy); a barrier then orders them for the other threads.
__device__ inline void fence_proxy_async_shared() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
// The same between the generic and the async proxy's accesses to global memory (a bulk
// reduction's writes and a flag read or written with plain loads and stores).
__device__ inline void fence_proxy_async_global() { asm volatile("fence.proxy.async.global;" ::: "memory"); }

// A flag in global memory read with acquire and bumped with release semantics at GPU scope:
// what one CTA wrote before the bump is visible to another that read the bumped value.
__device__ inline int load_acquire_gpu(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ inline void add_release_gpu(int* p, int v) {
  asm volatile("red.release.gpu.global.add.s32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
// Order earlier register writes (accumulators, A fragments) before the next wgmma.
__device__ inline void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
// Close the wgmmas issued so far into one group.
__device__ inline void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
// Wait until at most `Pending` committed groups are still in flight.
template <int Pending>
__device__ inline void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(Pending) : "memory");
}
// A scheduling fence: the code after it starts a new basic block that depends on `after`.
// ptxas schedules a wgmma wait as early as its basic block allows, above independent
// arithmetic (the FP8 consumer's softmax, meant to run while its P V is in flight); it
// does not hoist it above a branch. The branch is never taken: no float operation yields
// the bit pattern 0xffffffff (the GPU's NaN is 0x7fffffff).
__device__ inline void fence_schedule_after(float after) {
  if (__any_sync(0xffffffffu, __float_as_uint(after) == 0xffffffffu)) __trap();
}
// Pin registers that an in-flight wgmma owns: the compiler may not move reads or writes
// of them across this point.
template <int N>
__device__ inline void pin_registers(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}

// ---------------------------------------------------------------------------------------
// Device: warp specialisation
// ---------------------------------------------------------------------------------------

// Give registers back (producer) or take them (consumers); every warp of the warpgroup
// executes it. Takes effect only under a launch-bounds register cap.
template <int Regs>
__device__ inline void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(Regs));
}
template <int Regs>
__device__ inline void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(Regs));
}

// Named barriers (ids 1..15; 0 is __syncthreads): sync waits for `threads` arrivals,
// arrive counts this thread's and goes on.
__device__ inline void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
__device__ inline void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// ---------------------------------------------------------------------------------------
// Device: math
// ---------------------------------------------------------------------------------------

// exp2_approx and pack2: common/device_math.cuh.

// Two fp32 values -> two e4m3 bytes (byte 0 = first), rounded to nearest and saturated to
// +-448 (the e4m3 range) instead of overflowing to NaN.
__device__ inline uint16_t pack2_e4m3(float b0, float b1) {
  return uint16_t(__nv_cvt_float2_to_fp8x2(make_float2(b0, b1), __NV_SATFINITE, __NV_E4M3));
}
// The same in bytes 0 and 1 of a 32-bit register whose upper half is 0 (the conversion
// writes it so; pack2_e4m3's 16-bit result, widened, costs a mask).
__device__ inline uint32_t pack2_e4m3_u32(float b0, float b1) {
  uint32_t r;
  asm("{.reg .b16 h; cvt.rn.satfinite.e4m3x2.f32 h, %2, %1; mov.b32 %0, {h, 0};}" : "=r"(r) : "f"(b0), "f"(b1));
  return r;
}
// Four fp32 values -> one 32-bit register of four e4m3 bytes, as pack2_e4m3.
__device__ inline uint32_t pack4_e4m3(float b0, float b1, float b2, float b3) {
  const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(b0, b1), __NV_SATFINITE, __NV_E4M3);
  const uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(b2, b3), __NV_SATFINITE, __NV_E4M3);
  return lo | hi << 16;
}

}  // namespace attn::hopper
