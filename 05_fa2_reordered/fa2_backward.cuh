// FlashAttention-2 backward (Dao 2023, Algorithm 2) for sm_80+, mma.sync as the forward.
//
//  1  D = rowsum(dO ∘ O)                                  pre-pass kernel (also dQ_acc = 0)
//  5  for j = 1 … T_c:                                    one CTA per (K/V block j, batch, KV head)
//  6    load K_j, V_j to SRAM;  dK_j = dV_j = (0)         dK_j, dV_j in registers
//  7    for i = 1 … T_r:                                  (and, GQA, each query head of the group)
//  8      load Q_i, dO_i, L_i, D_i to SRAM                (step i + 1 loads while i computes)
//  9      S_ij = Q_i K_jᵀ
// 10      P_ij = exp(S_ij − L_i)                           (scale folded into the exponent)
// 11      dV_j ← dV_j + P_ijᵀ dO_i
// 12      dP_ij = dO_i V_jᵀ
// 13      dS_ij = P_ij ∘ (dP_ij − D_i)
// 14      dQ_i ← dQ_i + dS_ij K_j                          fp32 atomics into the workspace
// 15      dK_j ← dK_j + dS_ijᵀ Q_i
// 17    write dK_j (× scale), dV_j to HBM
//     dQ = scale · dQ_acc in the output type              conversion kernel
//
// DqMode::separate_pass (fa2_backward.h) drops line 14 from the loop above and the
// conversion, and runs the dQ pass instead (fa2_backward_dq_kernel below):
//     for i = 1 … T_r:                                    one CTA per (Q block i, batch, head)
//       for j = 1 … T_c:  S_ij, P_ij, dP_ij, dS_ij as lines 9-13;  dQ_i ← dQ_i + dS_ij K_j
//       write dQ_i (× scale)
//
// Two kernels run lines 5-17. At d = 128, fa2_backward_2d_kernel (below) splits each
// product over its own 2-D warp grid, as FA2 does, with P_ij and dS_ij through shared memory
// (fa2_backward.h: Bwd2dTile). At d = 64, fa2_backward_kernel keeps them in registers:
//
// Who owns what (d = 64: B_c = 128 keys, 4 warps; B_r = 64 query rows per step). Warp w owns
// keys 32w … 32w + 31 of K_j: it computes Sᵀ and dPᵀ for them against the step's query rows,
// so P_ijᵀ and its rows of dK_j, dV_j never leave its registers (dS_ijᵀ only for dQ). dQ_i mixes
// keys: dS_ij K_j sums over all of K_j, so dSᵀ goes through shared memory, and for that
// product warps split the query rows instead (and d, in 32-column chunks):
//
//          Sᵀ, dPᵀ: keys x queries                  dQ_i = dS_ij K_j: queries x d
//          (B_r query rows of step i)               (one 16-row tile, 32-column chunks)
//         +-------------------------+              +-------------------------+
//  warp 0 | keys   0-31  -> dK, dV  |      warp 0  | queries  0-15           |
//  warp 1 | keys  32-63  -> dK, dV  | dSᵀ  warp 1  | queries 16-31           |
//  warp 2 | keys  64-95  -> dK, dV  | ---> warp 2  | queries 32-47           |  atomicAdd
//  warp 3 | keys 96-127  -> dK, dV  | smem warp 3  | queries 48-63           |  -> dQ_acc
//         +-------------------------+              +-------------------------+
//
// The forward's fragment code serves as it is, its loops' roles swapped (BwdTile in
// fa2_backward.h): qk_tile(K_j, Q_i) is Sᵀ, qk_tile(V_j, dO_i) is dPᵀ, pack_p turns Pᵀ and
// dSᵀ (C fragments) into A fragments, pv_tile(·, dO_i) and pv_tile(·, Q_i) accumulate dV, dK.
// dSᵀ is stored [keys][queries] and read back transposed (ldmatrix .trans) as the A operand
// of dS K_j.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <string>

#include "05_fa2_reordered/fa2_backward.h"
#include "05_fa2_reordered/05d_fa2_reordered.cuh"
#include "common/device_math.cuh"
#include "common/dtype.cuh"

namespace attn::fa2 {

template <typename T>
struct BwdParams {
  const T* q;      // [B, H, Nq, d]
  const T* k;      // [B, Hkv, Nk, d]
  const T* v;      // [B, Hkv, Nk, d]
  const T* o;      // [B, H, Nq, d]
  const T* dout;   // [B, H, Nq, d]
  const float* lse;  // [B, H, Nq] natural log
  float* dq_acc;   // fp32 workspace in 8 x 8 blocks (fa2_backward.h: dq_acc_offset; null with separate_pass)
  float* D;        // [B, H, Nq] fp32 workspace
  T* dq;           // [B, H, Nq, d]
  T* dk;           // [B, Hkv, Nk, d]
  T* dv;           // [B, Hkv, Nk, d]
  int H, Hkv, group, Nq, Nk;
  int T_c;           // K/V blocks per key/value head (the main kernel's)
  int T_r;           // Q blocks per head (the dQ pass's)
  bool causal;
  float scale;       // softmax scale
  float scale_log2;  // scale * log2(e)
};

// ---------------------------------------------------------------- line 1: D, and dQ_acc = 0

// Lanes per row in the pre-pass: each lane one 16-byte chunk (8 elements) of dO and of O.
template <int kD>
constexpr int kPrepassLanes = kD / kChunkElems;
constexpr int kPrepassThreads = 256;

// dst[0, n) = 0 by the whole grid, in address order: a warp's float4 stores cover 512
// contiguous bytes.
__device__ __forceinline__ void zero_by_grid(float4* dst, int64_t n) {
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step)
    dst[i] = make_float4(0.f, 0.f, 0.f, 0.f);
}

// dO's strides in elements (batch, head, row) for the pre-pass; row = 0: contiguous. 06o's
// launch reads dL/dO where it lies (AttnBwdTensors::dout_strides); 05's is contiguous.
struct DoutStrides {
  int64_t batch = 0, head = 0, row = 0;
};

// Row r of [B, H, Nq] in dO.
template <typename T, int kD>
__device__ __forceinline__ int64_t dout_row_offset(const BwdParams<T>& p, const DoutStrides& st, int64_t row) {
  if (st.row == 0) return row * kD;
  const int64_t bh = row / p.Nq;
  return bh / p.H * st.batch + bh % p.H * st.head + row % p.Nq * st.row;
}

// D_r (line 1, README §8) for every row r of [B, H, Nq], then the whole dQ_acc zeroed (the
// main kernel only adds to it) when there is one. The loop is uniform per warp, so every lane
// is in the shuffles. A device function: 06o's pre-pass zeroes more in the same launch.
template <typename T, int kD>
__device__ __forceinline__ void prepass(const BwdParams<T>& p, int64_t rows, const DoutStrides& st = {}) {
  constexpr int kLanes = kPrepassLanes<kD>, kRowsPerWarp = 32 / kLanes;
  const int lane = threadIdx.x % 32, chunk = lane % kLanes;
  const int64_t warp = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int64_t warps = int64_t(gridDim.x) * blockDim.x / 32;
  for (int64_t base = warp * kRowsPerWarp; base < rows; base += warps * kRowsPerWarp) {
    const int64_t row = base + lane / kLanes;
    float dot = 0.f;
    if (row < rows) {
      const int64_t x = row * kD + chunk * kChunkElems;
      const uint4 dO8 = *reinterpret_cast<const uint4*>(p.dout + dout_row_offset<T, kD>(p, st, row) + chunk * kChunkElems);
      const uint4 O8 = *reinterpret_cast<const uint4*>(p.o + x);
      const T* dO_e = reinterpret_cast<const T*>(&dO8);
      const T* O_e = reinterpret_cast<const T*>(&O8);
#pragma unroll  // LAB:BEGIN 05b.rowsum_do_o
      for (int e = 0; e < kChunkElems; ++e) dot += to_float(dO_e[e]) * to_float(O_e[e]);  // LAB:END
    }
    dot = group_sum<kLanes>(dot);
    if (row < rows && chunk == 0) p.D[row] = dot;
  }
  // dQ_acc = 0, padding rows too, in address order (by rows, a lane's 32 bytes land in 8 x 8
  // blocks that other warps complete).
  if (p.dq_acc) zero_by_grid(reinterpret_cast<float4*>(p.dq_acc), rows / p.Nq * dq_acc_rows(p.Nq) * kD / 4);
}

template <typename T, int kD>
__global__ void __launch_bounds__(kPrepassThreads) fa2_backward_prepass(const BwdParams<T> p, int64_t rows) {
  prepass<T, kD>(p, rows);
}

// ---------------------------------------------------------------- lines 5-17: one K/V block

// Shared-memory tiles of one CTA (BwdTile's kSmemBytes): K_j, V_j, then Q_i and dO_i of both
// step stages, then dSᵀ (rows of B_r, its own swizzle), then L_i and D_i of both stages.
template <typename T, class Cfg>
struct BwdSmem {
  T* K;
  T* V;
  T* Q;    // [2][B_r][d]
  T* dO;   // [2][B_r][d]
  T* dST;  // [B_c][B_r]
  float* L;  // [2][B_r]: L_i, the forward's logsumexp (0 past Nq: those rows are masked)
  float* D;  // [2][B_r]
  __device__ BwdSmem(unsigned char* base) {
    constexpr int kTileQ = Cfg::kQueries * Cfg::kStride, kTileK = Cfg::kKeys * Cfg::kStride;
    K = reinterpret_cast<T*>(base);
    V = K + kTileK;
    Q = V + kTileK;
    dO = Q + Cfg::kStepStages * kTileQ;
    dST = dO + Cfg::kStepStages * kTileQ;
    L = reinterpret_cast<float*>(dST + Cfg::kKeys * Cfg::kQueries);
    D = L + Cfg::kStepStages * Cfg::kQueries;
  }
};

// The layout of dSᵀ in shared memory: rows of B_r queries, swizzled as the other tiles.
template <class Cfg>
using DsLayout = SwizzledRows<Cfg::kQueries>;

// Pᵀ recomputed from Sᵀ and L (line 10) for this warp's keys (rows) and the step's queries
// (columns), in place, in base 2 (exp2_approx). kMasked: entries a query does not see
// (key past Nk, query past Nq, causal key > query + Nk − Nq) are 0 without evaluating exp2,
// since L is −inf for a query that sees no key at all (and 0, not a logsumexp, past Nq).
template <class Cfg, bool kMasked, typename T>
__device__ __forceinline__ void probs_t(float (&S)[Frag<Cfg>::kM][Frag<Cfg>::kS][4], const float* L,
                                        const BwdParams<T>& p, int key0, int query0, int lane) {
#pragma unroll
  for (int mt = 0; mt < Frag<Cfg>::kM; ++mt)
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int key = key0 + mt * 16 + lane / 4 + 8 * half;
#pragma unroll
    for (int nt = 0; nt < Frag<Cfg>::kS; ++nt)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int col = nt * 8 + 2 * (lane % 4) + e, query = query0 + col;
        float& s = S[mt][nt][2 * half + e];
        const float p_val = exp2_approx(fmaf(s, p.scale_log2, -L[col] * float(M_LOG2E)));  // LAB:BEGIN 05b.recompute_p
        if constexpr (kMasked) {
          const bool visible = key < p.Nk && query < p.Nq && (!p.causal || key <= query + (p.Nk - p.Nq));
          s = visible ? p_val : 0.f;
        } else {
          s = p_val;
        }  // LAB:END
      }
  }
}

// Two bf16 / fp16 in one register (pack2's layout) back to fp32: lo from the low half.
template <typename T>
__device__ __forceinline__ float2 unpack2(uint32_t x);
template <>
__device__ __forceinline__ float2 unpack2<__nv_bfloat16>(uint32_t x) {
  return make_float2(__uint_as_float(x << 16), __uint_as_float(x & 0xffff0000u));
}
template <>
__device__ __forceinline__ float2 unpack2<__half>(uint32_t x) {
  return __half22float2(*reinterpret_cast<const __half2*>(&x));
}

// Line 13 in place: dPᵀ becomes dSᵀ, with D per query (column). Pᵀ is read from
// its A fragments (pack_p's map, inverted: C tile nt, element e is in register (nt % 2) * 2 +
// e / 2 of 16-key step nt / 2, half e % 2), the copy dV was computed from: the fp32 Pᵀ need
// not stay live through dPᵀ = V_j dO_iᵀ, 32 registers fewer at d = 128.
template <typename T, class Cfg>
__device__ __forceinline__ void ds_t(float (&dP)[Frag<Cfg>::kM][Frag<Cfg>::kS][4],
                                     const uint32_t (&P)[Frag<Cfg>::kM][Cfg::kWarpKeys / 16][4], const float* D,
                                     int lane) {
#pragma unroll
  for (int mt = 0; mt < Frag<Cfg>::kM; ++mt)
#pragma unroll
    for (int nt = 0; nt < Frag<Cfg>::kS; ++nt)
#pragma unroll
      for (int half = 0; half < 2; ++half) {  // rows g, g + 8
        const float2 p = unpack2<T>(P[mt][nt / 2][(nt % 2) * 2 + half]);
        const int col = nt * 8 + 2 * (lane % 4);
        dP[mt][nt][2 * half] = p.x * (dP[mt][nt][2 * half] - D[col]);  // LAB:BEGIN 05b.ds
        dP[mt][nt][2 * half + 1] = p.y * (dP[mt][nt][2 * half + 1] - D[col + 1]);  // LAB:END
      }
}

// This warp's rows of dSᵀ (C fragments of one pass) into shared memory as bf16/fp16 pairs:
// rows = its keys, columns = the pass's queries, from 8-query chunk `chunk0` of the step.
// Chunk c of row r sits at chunk c ^ (r % 8), so the 8 rows g of one store hit 8 different
// bank groups.
template <typename T, class Cfg, class Pass>
__device__ __forceinline__ void store_ds_t(T* dST, const float (&dS)[Frag<Pass>::kM][Frag<Pass>::kS][4],
                                           int warp_key0, int chunk0, int lane) {
#pragma unroll
  for (int mt = 0; mt < Frag<Pass>::kM; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = warp_key0 + mt * 16 + lane / 4 + 8 * half;
#pragma unroll
      for (int nt = 0; nt < Frag<Pass>::kS; ++nt)
        *reinterpret_cast<uint32_t*>(dST + DsLayout<Cfg>::offset(row, chunk0 + nt) + 2 * (lane % 4)) =
            pack2<T>(dS[mt][nt][2 * half], dS[mt][nt][2 * half + 1]);
    }
}

// Copy 4 bytes global -> shared (cp.async.ca: 4-byte copies are not .cg's); valid = false
// copies nothing and zero-fills.
__device__ inline void cp_async_4(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 4 : 0) : "memory");
}

// dst[0] += x, dst[1] += y where live: one predicated 8-byte red on sm_90 (no branch, so a
// lane's adds share one address register and immediate offsets), two 4-byte atomics before.
__device__ __forceinline__ void atomic_add2(float* dst, float x, float y, bool live) {
#if __CUDA_ARCH__ >= 900
  asm volatile(
      "{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %3, 0;\n\t@p red.global.add.v2.f32 [%0], {%1, %2};\n\t}\n" ::"l"(dst),
      "f"(x), "f"(y), "r"(int(live))
      : "memory");
#else
  if (live) {
    atomicAdd(dst, x);
    atomicAdd(dst + 1, y);
  }
#endif
}

// Line 14: dQ_i += dS_ij K_j for 16 query rows (row tile `row_tile` of the step) and all d
// columns, 32 at a time, added to dQ_acc rows query0 + 16 row_tile ... (those inside Nq).
//   A = dS (16 queries x B_c keys): dSᵀ read transposed. ldmatrix .trans gives lane l rows
//       2(l%4), 2(l%4)+1 of column l/4 of each stored 8x8 matrix (keys x queries), i.e.
//       dS[query l/4][keys 2(l%4), +1]: the A layout. Matrices (queries 0-7 | 8-15) x
//       (keys 0-7 | 8-15) -> key l % 8 + 8 (l / 16), query chunk (l / 8) % 2.
//   B = K_j (keys x d), keys as the k index: transposed on load, as V_j in the forward's PV.
// One chunk's accumulators at a time, and its A fragments loaded for it: dK, dV hold 128
// registers, and holding more here spills.
template <typename T, class Cfg>
__device__ __forceinline__ void dq_tile(const BwdParams<T>& p, const T* sK, const T* dST, int bh, int query0,
                                        int row_tile, int first_chunk, int lane) {
  constexpr int kKeySteps = Cfg::kKeys / 16, kChunkCols = 32;
  constexpr int kChunks = Cfg::kD / kChunkCols;
  constexpr int kChunkStride = Cfg::kWarps / (Cfg::kQueries / 16);  // warps sharing a row tile
  const uint32_t ds_base =
      ptx::smem_u32(dST + DsLayout<Cfg>::offset(lane % 8 + 8 * (lane / 16), (lane / 8) % 2));
  const uint32_t k_base = lane_row<Cfg>(sK, lane % 16, lane / 16);
  const int row_g = query0 + row_tile * 16 + lane / 4;  // rows g and g + 8 of the tile
  // The lane's pair of row g in dQ_acc; its C tile (half, n) of a chunk lies dq_acc_offset(8 half,
  // chunk columns + 8 n) past it.
  float* dQ = p.dq_acc + dq_acc_index<Cfg::kD>(bh, query0 + row_tile * 16 + lane / 4, 2 * (lane % 4), p.Nq);
#pragma unroll
  for (int chunk = first_chunk; chunk < kChunks; chunk += kChunkStride) {
    float acc[kChunkCols / 8][4];
#pragma unroll
    for (int n = 0; n < kChunkCols / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[n][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < kKeySteps; ++kk) {
      uint32_t a[4];  // A = dS[16 queries, keys 16kk..]
      ptx::ldmatrix_x4_trans(a, DsLayout<Cfg>::frag(ds_base, kk * 16, row_tile));
#pragma unroll
      for (int dp = 0; dp < kChunkCols / 16; ++dp) {
        uint32_t b[4];  // B = K_j[keys 16kk.., d 16(2 chunk + dp)..]
        ptx::ldmatrix_x4_trans(b, frag_addr<Cfg>(k_base, kk * 16, chunk * (kChunkCols / 16) + dp));
        ptx::mma_16816<T>(acc[2 * dp], a, b[0], b[1]);
        ptx::mma_16816<T>(acc[2 * dp + 1], a, b[2], b[3]);
      }
    }
#pragma unroll
    for (int half = 0; half < 2; ++half)
      if (row_g + 8 * half < p.Nq)  // (a branch: the predicate as an operand spills this kernel)
#pragma unroll
        for (int n = 0; n < kChunkCols / 8; ++n)
          atomic_add2(dQ + dq_acc_offset<Cfg::kD>(8 * half, chunk * kChunkCols + 8 * n), acc[n][2 * half],
                      acc[n][2 * half + 1], true);
  }
}

// The CTA's index, read afresh: a volatile read is not merged with the kernel's first one,
// so values derived from it after the main loop are recomputed, not kept in registers
// across it (at d = 128 the loop needs all 255).
__device__ __forceinline__ unsigned cta_index() {
  unsigned x;
  asm volatile("mov.u32 %0, %%ctaid.x;" : "=r"(x));
  return x;
}

// Line 17: this warp's rows of dK_j (× scale) and dV_j, those inside Nk, to HBM.
template <typename T, class Cfg>
__device__ __forceinline__ void store_dkv(const float (&dK)[Frag<Cfg>::kM][Frag<Cfg>::kO][4],
                                          const float (&dV)[Frag<Cfg>::kM][Frag<Cfg>::kO][4], const BwdParams<T>& p,
                                          int lane) {
  const unsigned cta = cta_index();
  const int64_t bh_kv = cta / p.T_c;
  const int warp_key0 = int(cta % p.T_c) * Cfg::kKeys + int(threadIdx.x / 32) * Cfg::kWarpRows;
#pragma unroll
  for (int mt = 0; mt < Frag<Cfg>::kM; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int key = warp_key0 + mt * 16 + lane / 4 + 8 * half;
      if (key >= p.Nk) continue;
      const int64_t x = (bh_kv * p.Nk + key) * Cfg::kD + 2 * (lane % 4);
#pragma unroll
      for (int dt = 0; dt < Frag<Cfg>::kO; ++dt) {
        *reinterpret_cast<uint32_t*>(p.dk + x + dt * 8) =
            pack2<T>(p.scale * dK[mt][dt][2 * half], p.scale * dK[mt][dt][2 * half + 1]);
        *reinterpret_cast<uint32_t*>(p.dv + x + dt * 8) = pack2<T>(dV[mt][dt][2 * half], dV[mt][dt][2 * half + 1]);
      }
    }
}

// kDqAtomics = false: lines 5-17 without line 14 (the dQ pass sums dQ instead).
template <typename T, class Cfg, bool kDqAtomics>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinCtasPerSm) fa2_backward_kernel(const BwdParams<T> p) {
  constexpr int D = Cfg::kD, B_c = Cfg::kKeys, B_r = Cfg::kQueries;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  constexpr int kAlign = Cfg::Layout::kAlign;
  const BwdSmem<T, Cfg> s(smem_raw + (kAlign - ptx::smem_u32(smem_raw) % kAlign) % kAlign);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int warp_key0 = warp * Cfg::kWarpRows;  // this warp's keys in K_j (Tile's rows)

  // This CTA: K/V block j of key/value head (b, h_kv), for query heads h_kv * group + 0 .. group - 1.
  const int j = blockIdx.x % p.T_c;
  const int64_t bh_kv = blockIdx.x / p.T_c;
  const int bh0 = int(bh_kv / p.Hkv) * p.H + int(bh_kv % p.Hkv) * p.group;  // the group's first (batch, query head)
  const int key0 = j * B_c;
  const int off = p.Nk - p.Nq;  // causal, bottom-right: query r sees keys c <= r + off
  // Causal: the Q blocks before the first whose last row sees key0 are skipped.
  const int first_i = p.causal && key0 - off > 0 ? (key0 - off) / B_r : 0;
  const int T_r = (p.Nq + B_r - 1) / B_r;
  const int blocks_per_head = T_r - first_i;  // >= 1: the last query row sees every key
  const int steps = p.group * blocks_per_head;
  auto step_head = [&](int step) { return bh0 + step / blocks_per_head; };
  auto step_block = [&](int step) { return first_i + step % blocks_per_head; };
  // Q block i needs the mask unless every key of K_j is inside Nk, every row of Q_i inside Nq
  // and (causal) its first row sees the block's last key.
  const bool ragged_keys = key0 + B_c > p.Nk;

  // The loads of step `step` into stage `stage`, all by cp.async: Q_i, dO_i, and L_i, D_i
  // (threads t < B_r, row t); rows past Nq zero-filled.
  auto load_step = [&](int step, int stage) {
    const int64_t bh = step_head(step);
    const int row0 = step_block(step) * B_r;
    load_tile<Cfg, B_r>(s.Q + stage * B_r * Cfg::kStride, p.q + bh * p.Nq * D, row0, p.Nq);
    load_tile<Cfg, B_r>(s.dO + stage * B_r * Cfg::kStride, p.dout + bh * p.Nq * D, row0, p.Nq);
    if (threadIdx.x < B_r) {
      const int row = row0 + threadIdx.x;
      const bool live = row < p.Nq;
      const int64_t x = live ? bh * p.Nq + row : 0;
      cp_async_4(ptx::smem_u32(s.L + stage * B_r + threadIdx.x), p.lse + x, live);
      cp_async_4(ptx::smem_u32(s.D + stage * B_r + threadIdx.x), p.D + x, live);
    }
  };

  // line 6: K_j, V_j (rows past Nk zero), and step 0's tiles, one cp.async group
  load_tile<Cfg, B_c>(s.K, p.k + bh_kv * p.Nk * D, key0, p.Nk);
  load_tile<Cfg, B_c>(s.V, p.v + bh_kv * p.Nk * D, key0, p.Nk);
  load_step(0, 0);
  ptx::cp_async_commit();

  float dK[Frag<Cfg>::kM][Frag<Cfg>::kO][4], dV[Frag<Cfg>::kM][Frag<Cfg>::kO][4];  // line 6: dK_j = dV_j = 0
#pragma unroll
  for (int mt = 0; mt < Frag<Cfg>::kM; ++mt)
#pragma unroll
    for (int dt = 0; dt < Frag<Cfg>::kO; ++dt)
#pragma unroll
      for (int e = 0; e < 4; ++e) dK[mt][dt][e] = dV[mt][dt][e] = 0.f;

  for (int step = 0; step < steps; ++step) {  // line 7
    const int stage = step % 2;
    ptx::cp_async_wait<0>();  // line 8: this step's Q_i, dO_i
    __syncthreads();          // ... landed for every thread; the last step's reads of the other stage and of dSᵀ are done
    if (step + 1 < steps) {   // the next step's loads, while this one computes
      load_step(step + 1, stage ^ 1);
    }
    ptx::cp_async_commit();
    [[maybe_unused]] const int bh = step_head(step);
    const int query0 = step_block(step) * B_r;
    const T* Q_i = s.Q + stage * B_r * Cfg::kStride;
    const T* dO_i = s.dO + stage * B_r * Cfg::kStride;
    const float* L_i = s.L + stage * B_r;
    const float* D_i = s.D + stage * B_r;

    const bool masked = ragged_keys || query0 + B_r > p.Nq || (p.causal && query0 + off < key0 + B_c - 1);
    // Lines 9-15 but 14, in passes of kPassQueries of the step's query rows (Pass: the Tile of
    // one pass); each pass's Sᵀ, dPᵀ registers die before the next.
    using Pass = typename Cfg::Pass;
#pragma unroll 1
    for (int q = 0; q < B_r; q += Pass::kWarpKeys) {
      const T* Q_q = Q_i + q * Cfg::kStride;  // whole 8-row swizzle periods: the layout holds
      const T* dO_q = dO_i + q * Cfg::kStride;
      float S[Frag<Pass>::kM][Frag<Pass>::kS][4];
      qk_tile<T, Pass>(S, s.K, Q_q, warp_key0, lane);  // line 9: Sᵀ = K_j Q_iᵀ (this warp's keys)
      if (masked)                                     // line 10: Pᵀ = exp(Sᵀ − L_i)
        probs_t<Pass, true>(S, L_i + q, p, key0 + warp_key0, query0 + q, lane);
      else
        probs_t<Pass, false>(S, L_i + q, p, key0 + warp_key0, query0 + q, lane);
      uint32_t A[Frag<Pass>::kM][Pass::kWarpKeys / 16][4];  // Pᵀ, then dSᵀ, as A fragments
      pack_p<T, Pass>(A, S);
      pv_tile<T, Pass>(dV, A, dO_q, lane);  // line 11: dV_j += Pᵀ dO_i

      float dS[Frag<Pass>::kM][Frag<Pass>::kS][4];
      qk_tile<T, Pass>(dS, s.V, dO_q, warp_key0, lane);  // line 12: dPᵀ = V_j dO_iᵀ
      ds_t<T, Pass>(dS, A, D_i + q, lane);               // line 13: dSᵀ = Pᵀ ∘ (dPᵀ − D_i), in place
      pack_p<T, Pass>(A, dS);
      pv_tile<T, Pass>(dK, A, Q_q, lane);  // line 15: dK_j += dSᵀ Q_i

      if constexpr (kDqAtomics) store_ds_t<T, Cfg, Pass>(s.dST, dS, warp_key0, q / kChunkElems, lane);
    }
    if constexpr (kDqAtomics) {
      __syncthreads();  // all of dSᵀ is in shared memory
      // line 14: dQ_i += dS_ij K_j; warp w takes row tile w % (B_r / 16), chunks from w / (B_r / 16)
      dq_tile<T, Cfg>(p, s.K, s.dST, bh, query0, warp % (B_r / 16), warp / (B_r / 16), lane);
    }
  }
  store_dkv<T, Cfg>(dK, dV, p, lane);  // line 17
}

// ---------------------------------------------------------------- dQ = scale dQ_acc

// One thread per 8-element chunk of dQ (row-major), read from dQ_acc's 8 consecutive floats;
// chunks first, first + stride, ... (a device function: 06o's post-pass has blocks of its own).
template <typename T, int kD>
__device__ __forceinline__ void convert_dq(const float* __restrict__ dq_acc, T* __restrict__ dq, int64_t chunks,
                                           int Nq, float scale, int64_t first, int64_t stride) {
  constexpr int kChunksPerRow = kD / kChunkElems;
  for (int64_t c = first; c < chunks; c += stride) {
    const int64_t row = c / kChunksPerRow;
    const float* src = dq_acc + dq_acc_index<kD>(row / Nq, int(row % Nq), int(c % kChunksPerRow) * kChunkElems, Nq);
    const float4 lo = reinterpret_cast<const float4*>(src)[0];
    const float4 hi = reinterpret_cast<const float4*>(src)[1];
    uint4 out;
    out.x = pack2<T>(scale * lo.x, scale * lo.y);
    out.y = pack2<T>(scale * lo.z, scale * lo.w);
    out.z = pack2<T>(scale * hi.x, scale * hi.y);
    out.w = pack2<T>(scale * hi.z, scale * hi.w);
    reinterpret_cast<uint4*>(dq)[c] = out;
  }
}

template <typename T, int kD>
__global__ void fa2_backward_convert_dq(const float* __restrict__ dq_acc, T* __restrict__ dq, int64_t chunks, int Nq,
                                        float scale) {
  convert_dq<T, kD>(dq_acc, dq, chunks, Nq, scale, blockIdx.x * int64_t(blockDim.x) + threadIdx.x,
                    int64_t(gridDim.x) * blockDim.x);
}

// ---------------------------------------------------------------- the dQ pass (separate_pass)

// P_ij = exp(S_ij scale − L) for this warp's query rows (L_log2: L log2(e) of rows g, g + 8
// of each 16-row tile) and the block's keys, in place. kMasked: keys past Nk and, causal,
// keys past a row's last visible one are 0 (a row that sees no key has L = −inf).
template <class Cfg, bool kMasked, typename T>
__device__ __forceinline__ void probs(float (&S)[Frag<Cfg>::kM][Frag<Cfg>::kS][4],
                                      const float (&L_log2)[Frag<Cfg>::kM][2], const BwdParams<T>& p, int row0,
                                      int key0, int lane) {
#pragma unroll
  for (int mt = 0; mt < Frag<Cfg>::kM; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = row0 + mt * 16 + lane / 4 + 8 * half;
      const int last_key = p.causal ? min(p.Nk - 1, row + (p.Nk - p.Nq)) : p.Nk - 1;
#pragma unroll
      for (int nt = 0; nt < Frag<Cfg>::kS; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& s = S[mt][nt][2 * half + e];
          const float p_val = exp2_approx(fmaf(s, p.scale_log2, -L_log2[mt][half]));
          if constexpr (kMasked)
            s = key0 + nt * 8 + 2 * (lane % 4) + e <= last_key ? p_val : 0.f;
          else
            s = p_val;
        }
    }
}

// dQ_i = scale Σ_j dS_ij K_j for Q block i of head bh, one CTA per (Q block, batch, head);
// the warps split the rows of Q_i, as in the forward, so dQ_i never leaves registers.
template <typename T, class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads) fa2_backward_dq_kernel(const BwdParams<T> p) {
  constexpr int D = Cfg::kD, B_r = Cfg::kBr, B_c = Cfg::kBc, kStages = Cfg::kStages;
  constexpr int kTileQ = B_r * Cfg::kStride, kTileKV = B_c * Cfg::kStride;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  constexpr int kAlign = Cfg::Layout::kAlign;
  T* sQ = reinterpret_cast<T*>(smem_raw + (kAlign - ptx::smem_u32(smem_raw) % kAlign) % kAlign);
  T* sdO = sQ + kTileQ;
  T* sK = sdO + kTileQ;
  T* sV = sK + kStages * kTileKV;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int warp_row0 = warp_first_row<Cfg>(warp);

  // The longest Q blocks (causal: the last) first.
  const int i = p.T_r - 1 - int(blockIdx.x % p.T_r);
  const int64_t bh = blockIdx.x / p.T_r;
  const int64_t bh_kv = bh / p.H * p.Hkv + bh % p.H / p.group;
  const int row0 = i * B_r;
  const KvRange kv = kv_range<B_r, B_c>(p, row0);
  const T* K = p.k + bh_kv * p.Nk * D;
  const T* V = p.v + bh_kv * p.Nk * D;

  // L_i log2(e) and D_i of this thread's rows (0 past Nq: Q, dO are zero there, so dS = 0).
  float L_log2[Frag<Cfg>::kM][2], D_i[Frag<Cfg>::kM][2];
#pragma unroll
  for (int mt = 0; mt < Frag<Cfg>::kM; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = row0 + warp_row0 + mt * 16 + lane / 4 + 8 * half;
      const bool live = row < p.Nq;
      L_log2[mt][half] = live ? p.lse[bh * p.Nq + row] * float(M_LOG2E) : 0.f;
      D_i[mt][half] = live ? p.D[bh * p.Nq + row] : 0.f;
    }

  float dQ[Frag<Cfg>::kM][Frag<Cfg>::kO][4];
#pragma unroll
  for (int mt = 0; mt < Frag<Cfg>::kM; ++mt)
#pragma unroll
    for (int dt = 0; dt < Frag<Cfg>::kO; ++dt)
#pragma unroll
      for (int e = 0; e < 4; ++e) dQ[mt][dt][e] = 0.f;

  // Q_i, dO_i once; K_j, V_j through a ring of kStages buffers, as the forward's loop.
  auto load_kv = [&](int block) {
    load_tile<Cfg, B_c>(sK + block % kStages * kTileKV, K, block * B_c, p.Nk);
    load_tile<Cfg, B_c>(sV + block % kStages * kTileKV, V, block * B_c, p.Nk);
  };
  load_tile<Cfg, B_r>(sQ, p.q + bh * p.Nq * D, row0, p.Nq);
  load_tile<Cfg, B_r>(sdO, p.dout + bh * p.Nq * D, row0, p.Nq);
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < kv.T_c) load_kv(s);
    ptx::cp_async_commit();
  }
  for (int j = 0; j < kv.T_c; ++j) {
    ptx::cp_async_wait<kStages - 2>();
    __syncthreads();  // K_j, V_j landed for every thread; block j - 1's buffers are free
    if (j + kStages - 1 < kv.T_c) load_kv(j + kStages - 1);
    ptx::cp_async_commit();
    const T* K_j = sK + j % kStages * kTileKV;
    const T* V_j = sV + j % kStages * kTileKV;

    float S[Frag<Cfg>::kM][Frag<Cfg>::kS][4];
    qk_tile<T, Cfg>(S, sQ, K_j, warp_row0, lane);  // line 9: S_ij = Q_i K_jᵀ
    if (j < kv.unmasked_blocks)                     // line 10: P_ij = exp(S_ij − L_i)
      probs<Cfg, false>(S, L_log2, p, row0 + warp_row0, j * B_c, lane);
    else
      probs<Cfg, true>(S, L_log2, p, row0 + warp_row0, j * B_c, lane);
    float dS[Frag<Cfg>::kM][Frag<Cfg>::kS][4];
    qk_tile<T, Cfg>(dS, sdO, V_j, warp_row0, lane);  // line 12: dP_ij = dO_i V_jᵀ
#pragma unroll
    for (int mt = 0; mt < Frag<Cfg>::kM; ++mt)  // line 13: dS_ij = P_ij ∘ (dP_ij − D_i), in place
#pragma unroll
      for (int nt = 0; nt < Frag<Cfg>::kS; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) dS[mt][nt][e] = S[mt][nt][e] * (dS[mt][nt][e] - D_i[mt][e / 2]);
    uint32_t A[Frag<Cfg>::kM][B_c / 16][4];
    pack_p<T, Cfg>(A, dS);
    pv_tile<T, Cfg>(dQ, A, K_j, lane);  // line 14: dQ_i += dS_ij K_j (K_j as the forward's V_j)
  }
  ptx::cp_async_wait<0>();  // T_c = 0 (causal rows that see no key): Q_i, dO_i's copies still land

  T* dq = p.dq + bh * p.Nq * D;  // dQ = scale dQ_i, the rows inside Nq
#pragma unroll
  for (int mt = 0; mt < Frag<Cfg>::kM; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = row0 + warp_row0 + mt * 16 + lane / 4 + 8 * half;
      if (row >= p.Nq) continue;
#pragma unroll
      for (int dt = 0; dt < Frag<Cfg>::kO; ++dt)
        *reinterpret_cast<uint32_t*>(dq + int64_t(row) * D + dt * 8 + 2 * (lane % 4)) =
            pack2<T>(p.scale * dQ[mt][dt][2 * half], p.scale * dQ[mt][dt][2 * half + 1]);
    }
}

// ---------------------------------------------------------------- lines 5-17, FA2's warp grids

// C += A B for one warp: C is kMt x kNt mma tiles (16 x 8 each), the sum over kKt 16-wide k
// steps; A and B from swizzled shared-memory tiles (layouts LA, LB), each stored either with
// the product's k index along its rows ("k-major") or across them:
//   A [m][k] (kAkMajor = false): ldmatrix, as Q_i in qk_tile; A [k][m]: ldmatrix .trans.
//   B [n][k] (kBkMajor = false): ldmatrix, as K_j in qk_tile; B [k][n]: .trans, as V_j in pv_tile.
// (m0, n0, k0): the warp's first row of A's m, B's n and the first k, in elements
// (multiples of 16), so a lane's base address keeps its row's swizzle.
template <typename T, int kMt, int kNt, int kKt, bool kAkMajor, bool kBkMajor, class LA, class LB>
__device__ __forceinline__ void mma_smem(float (&C)[kMt][kNt][4], const T* sA, int m0, const T* sB, int n0, int k0,
                                         int lane) {
  static_assert(kNt % 2 == 0, "B fragments come in pairs of 8-wide n tiles (one ldmatrix x4)");
  const uint32_t a_base = kAkMajor ? ptx::smem_u32(sA + LA::offset(k0 + lane % 8 + 8 * (lane / 16), (lane / 8) % 2))
                                   : ptx::smem_u32(sA + LA::offset(m0 + lane % 16, lane / 16));
  const uint32_t b_base = kBkMajor ? ptx::smem_u32(sB + LB::offset(k0 + lane % 16, lane / 16))
                                   : ptx::smem_u32(sB + LB::offset(n0 + lane % 8 + 8 * (lane / 16), (lane / 8) % 2));
#pragma unroll
  for (int kk = 0; kk < kKt; ++kk) {
    uint32_t a[kMt][4];
#pragma unroll
    for (int mt = 0; mt < kMt; ++mt) {
      if constexpr (kAkMajor)
        ptx::ldmatrix_x4_trans(a[mt], LA::frag(a_base, kk * 16, m0 / 16 + mt));
      else
        ptx::ldmatrix_x4(a[mt], LA::frag(a_base, mt * 16, k0 / 16 + kk));
    }
#pragma unroll
    for (int np = 0; np < kNt / 2; ++np) {
      uint32_t b[4];
      if constexpr (kBkMajor)
        ptx::ldmatrix_x4_trans(b, LB::frag(b_base, kk * 16, n0 / 16 + np));
      else
        ptx::ldmatrix_x4(b, LB::frag(b_base, np * 16, k0 / 16 + kk));
#pragma unroll
      for (int mt = 0; mt < kMt; ++mt) {
        ptx::mma_16816<T>(C[mt][2 * np], a[mt], b[0], b[1]);
        ptx::mma_16816<T>(C[mt][2 * np + 1], a[mt], b[2], b[3]);
      }
    }
  }
}

// This warp's 32 x 32 tile of P_ij or dS_ij (C fragments, rows = queries) packed in pairs:
// X[mt][nt][half] holds row g + 8 half of 16-row tile mt, columns 2t, 2t + 1 of key tile nt.
template <typename T>
__device__ __forceinline__ void pack_c(uint32_t (&X)[2][4][2], const float (&C)[2][4][4]) {
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int half = 0; half < 2; ++half) X[mt][nt][half] = pack2<T>(C[mt][nt][2 * half], C[mt][nt][2 * half + 1]);
}

// A packed 32 x 32 tile (pack_c) into shared memory [B_r][B_c], from row q0 and key c0.
template <class Cfg, typename T>
__device__ __forceinline__ void store_ps(T* dst, const uint32_t (&X)[2][4][2], int q0, int c0, int lane) {
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = q0 + mt * 16 + lane / 4 + 8 * half;
#pragma unroll
      for (int nt = 0; nt < 4; ++nt)
        *reinterpret_cast<uint32_t*>(dst + Cfg::PsLayout::offset(row, c0 / kChunkElems + nt) + 2 * (lane % 4)) =
            X[mt][nt][half];
    }
}

// One CTA per (K/V block j, batch, KV head) as fa2_backward_kernel, with FA2's warp grids
// (Bwd2dTile): per step, S_ij and dP_ij in 32 x 32 warp tiles, P_ij and dS_ij to shared
// memory, a barrier, then dV_j += P_ijᵀ dO_i and dK_j += dS_ijᵀ Q_i (warp w: keys 32 (w / 2),
// half w % 2 of d) and dQ_i += dS_ij K_j (warp w: queries 32 (w % 2), d quarter w / 2).
template <typename T, class Cfg, bool kDqAtomics>
__global__ void __launch_bounds__(Cfg::kThreads, 1) fa2_backward_2d_kernel(const BwdParams<T> p) {
  constexpr int D = Cfg::kD, B_c = Cfg::kKeys, B_r = Cfg::kQueries;
  using L = typename Cfg::Layout;
  using LP = typename Cfg::PsLayout;
  using Sdp = typename Cfg::Sdp;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  constexpr int kAlign = L::kAlign, kTileQ = B_r * Cfg::kStride;
  T* sK = reinterpret_cast<T*>(smem_raw + (kAlign - ptx::smem_u32(smem_raw) % kAlign) % kAlign);
  T* sV = sK + B_c * Cfg::kStride;
  T* sQ = sV + B_c * Cfg::kStride;  // [2][B_r][d]
  T* sdO = sQ + 2 * kTileQ;         // [2][B_r][d]
  T* sP = sdO + 2 * kTileQ;         // [B_r][B_c]
  T* sdS = sP + B_r * B_c;          // [B_r][B_c]
  float* sL = reinterpret_cast<float*>(sdS + B_r * B_c);  // [2][B_r]: L_i (0 past Nq)
  float* sD = sL + 2 * B_r;                               // [2][B_r]: D_i (0 past Nq)
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wq = 32 * (warp % 2), wk = 32 * (warp / 2);  // S, dP: this warp's queries, keys
  const int wd = 64 * (warp % 2);                       // dK, dV: keys wk, d columns wd ..
  const int qd = 32 * (warp / 2);                       // dQ: queries wq, d columns qd ..

  const int j = blockIdx.x % p.T_c;
  const int64_t bh_kv = blockIdx.x / p.T_c;
  const int bh0 = int(bh_kv / p.Hkv) * p.H + int(bh_kv % p.Hkv) * p.group;
  const int key0 = j * B_c;
  const int off = p.Nk - p.Nq;
  const int first_i = p.causal && key0 - off > 0 ? (key0 - off) / B_r : 0;
  const int T_r = (p.Nq + B_r - 1) / B_r;
  const int blocks_per_head = T_r - first_i;
  const int steps = p.group * blocks_per_head;
  const bool ragged_keys = key0 + B_c > p.Nk;
  // The steps' (query head, Q block), advanced one step at a time: no division in the loop.
  struct Pos {
    int bh, block;
  };
  auto advance = [&](Pos q) { return ++q.block < T_r ? q : Pos{q.bh + 1, first_i}; };

  auto load_step = [&](Pos at, int stage) {
    const int64_t bh = at.bh;
    const int row0 = at.block * B_r;
    load_tile<Cfg, B_r>(sQ + stage * kTileQ, p.q + bh * p.Nq * D, row0, p.Nq);
    load_tile<Cfg, B_r>(sdO + stage * kTileQ, p.dout + bh * p.Nq * D, row0, p.Nq);
    if (threadIdx.x < B_r) {
      const int row = row0 + threadIdx.x;
      const bool live = row < p.Nq;
      const int64_t x = live ? bh * p.Nq + row : 0;
      cp_async_4(ptx::smem_u32(sL + stage * B_r + threadIdx.x), p.lse + x, live);
      cp_async_4(ptx::smem_u32(sD + stage * B_r + threadIdx.x), p.D + x, live);
    }
  };
  load_tile<Cfg, B_c>(sK, p.k + bh_kv * p.Nk * D, key0, p.Nk);
  load_tile<Cfg, B_c>(sV, p.v + bh_kv * p.Nk * D, key0, p.Nk);
  Pos at{bh0, first_i};
  load_step(at, 0);
  ptx::cp_async_commit();

  float dK[2][8][4], dV[2][8][4];  // keys wk .. wk + 31, d columns wd .. wd + 63
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int dt = 0; dt < 8; ++dt)
#pragma unroll
      for (int e = 0; e < 4; ++e) dK[mt][dt][e] = dV[mt][dt][e] = 0.f;

  for (int step = 0; step < steps; ++step) {
    const int stage = step % 2;
    ptx::cp_async_wait<0>();
    __syncthreads();  // step's tiles landed; the last step's reads of the other stage, P and dS are done
    const Pos next = advance(at);
    if (step + 1 < steps) load_step(next, stage ^ 1);
    ptx::cp_async_commit();
    const int64_t bh = at.bh;
    const int query0 = at.block * B_r;
    at = next;
    const T* Q_i = sQ + stage * kTileQ;
    const T* dO_i = sdO + stage * kTileQ;

    float L_log2[2][2], D_i[2][2];  // rows g, g + 8 of this warp's two 16-row tiles
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int r = stage * B_r + wq + mt * 16 + lane / 4 + 8 * half;
        L_log2[mt][half] = sL[r] * float(M_LOG2E);
        D_i[mt][half] = sD[r];
      }
    {
      uint32_t P[2][4][2];  // P_ij as the products read it, 16 registers instead of 32
      {
        float S[2][4][4];
        qk_tile<T, Sdp>(S, Q_i, sK + wk * Cfg::kStride, wq, lane);  // line 9: S_ij = Q_i K_jᵀ
        const bool masked = ragged_keys || query0 + B_r > p.Nq || (p.causal && query0 + off < key0 + B_c - 1);
        if (masked)  // line 10: P_ij = exp(S_ij − L_i)
          probs<Sdp, true>(S, L_log2, p, query0 + wq, key0 + wk, lane);
        else
          probs<Sdp, false>(S, L_log2, p, query0 + wq, key0 + wk, lane);
        pack_c<T>(P, S);
      }
      store_ps<Cfg>(sP, P, wq, wk, lane);
      float dS[2][4][4];
      qk_tile<T, Sdp>(dS, dO_i, sV + wk * Cfg::kStride, wq, lane);  // line 12: dP_ij = dO_i V_jᵀ
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)  // line 13: dS_ij = P_ij ∘ (dP_ij − D_i)
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            const float2 pp = unpack2<T>(P[mt][nt][half]);
            dS[mt][nt][2 * half] = pp.x * (dS[mt][nt][2 * half] - D_i[mt][half]);
            dS[mt][nt][2 * half + 1] = pp.y * (dS[mt][nt][2 * half + 1] - D_i[mt][half]);
          }
      pack_c<T>(P, dS);  // the registers of P now hold dS_ij
      store_ps<Cfg>(sdS, P, wq, wk, lane);
    }
    __syncthreads();  // all of P_ij, dS_ij in shared memory
    // line 14: dQ_i += dS_ij K_j, fp32 atomics into dQ_acc: the product first, its adds at
    // the end of the step. A red's registers are not rewritten until it has read them, and
    // right after the product the next writes waited on them (EXPERIMENTS.md).
    [[maybe_unused]] float acc[2][4][4];
    if constexpr (kDqAtomics) {
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[mt][nt][e] = 0.f;
      mma_smem<T, 2, 4, B_c / 16, false, true, LP, L>(acc, sdS, wq, sK, qd, 0, lane);
    }
    // line 11: dV_j += P_ijᵀ dO_i; line 15: dK_j += dS_ijᵀ Q_i (A = [queries][keys]: k-major).
    // (After dQ's product: in this order ptxas fits the kernel in 255 registers, no spill.)
    mma_smem<T, 2, 8, B_r / 16, true, true, LP, L>(dV, sP, wk, dO_i, wd, 0, lane);
    mma_smem<T, 2, 8, B_r / 16, true, true, LP, L>(dK, sdS, wk, Q_i, wd, 0, lane);
    if constexpr (kDqAtomics) {  // line 14's adds: the lane's pair of row g in dQ_acc, then its C
      // tiles (rows 8 (2 mt + half), columns 8 nt further) at constant offsets
      float* dQ = p.dq_acc + dq_acc_index<D>(bh, query0 + wq + lane / 4, qd + 2 * (lane % 4), p.Nq);
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const bool live = query0 + wq + mt * 16 + lane / 4 + 8 * half < p.Nq;
#pragma unroll
          for (int nt = 0; nt < 4; ++nt)
            atomic_add2(dQ + dq_acc_offset<D>(8 * (2 * mt + half), 8 * nt), acc[mt][nt][2 * half],
                        acc[mt][nt][2 * half + 1], live);
        }
    }
  }

  // line 17: dK_j (× scale), dV_j, the keys inside Nk
  const unsigned cta = cta_index();
  const int64_t kv_head = cta / p.T_c;
  const int first_key = int(cta % p.T_c) * B_c + wk;
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int key = first_key + mt * 16 + lane / 4 + 8 * half;
      if (key >= p.Nk) continue;
      const int64_t x = (kv_head * p.Nk + key) * D + wd + 2 * (lane % 4);
#pragma unroll
      for (int dt = 0; dt < 8; ++dt) {
        *reinterpret_cast<uint32_t*>(p.dk + x + dt * 8) =
            pack2<T>(p.scale * dK[mt][dt][2 * half], p.scale * dK[mt][dt][2 * half + 1]);
        *reinterpret_cast<uint32_t*>(p.dv + x + dt * 8) = pack2<T>(dV[mt][dt][2 * half], dV[mt][dt][2 * half + 1]);
      }
    }
}

// ---------------------------------------------------------------- the launch

template <typename T, int kD, DqMode kMode, class Cfg>
void launch_fa2_backward(const AttnProblem& p, const AttnBwdTensors& t, cudaStream_t stream) {
  using DqCfg = DqTileFor<kD>;
  constexpr bool kAtomics = kMode == DqMode::atomics;
  BwdParams<T> prm;
  prm.q = static_cast<const T*>(t.q);
  prm.k = static_cast<const T*>(t.k);
  prm.v = static_cast<const T*>(t.v);
  prm.o = static_cast<const T*>(t.o);
  prm.dout = static_cast<const T*>(t.dout);
  prm.lse = t.lse;
  float* ws = static_cast<float*>(t.workspace);
  prm.dq_acc = kAtomics ? ws : nullptr;
  prm.D = kAtomics ? ws + dq_acc_elems(p) : ws;
  prm.dq = static_cast<T*>(t.dq);
  prm.dk = static_cast<T*>(t.dk);
  prm.dv = static_cast<T*>(t.dv);
  prm.H = p.H;
  prm.Hkv = p.Hkv;
  prm.group = p.group();
  prm.Nq = p.Nq;
  prm.Nk = p.Nk;
  prm.T_c = (p.Nk + Cfg::kKeys - 1) / Cfg::kKeys;
  prm.T_r = (p.Nq + DqCfg::kBr - 1) / DqCfg::kBr;
  prm.causal = p.causal;
  prm.scale = p.softmax_scale();
  prm.scale_log2 = prm.scale * static_cast<float>(M_LOG2E);

  constexpr int kMaxBlocks = 8192;  // grid-stride loops beyond this
  const int64_t rows = p.lse_elems();
  constexpr int kRowsPerBlock = kPrepassThreads / kPrepassLanes<kD>;
  const int64_t prepass_blocks = std::min<int64_t>((rows + kRowsPerBlock - 1) / kRowsPerBlock, kMaxBlocks);
  fa2_backward_prepass<T, kD><<<unsigned(prepass_blocks), kPrepassThreads, 0, stream>>>(prm, rows);
  CUDA_CHECK_LAUNCH();

  // Stage::backward_refuse: both grids <= INT_MAX CTAs
  auto kernel = [] {
    if constexpr (Cfg::kTwoD) return fa2_backward_2d_kernel<T, Cfg, kAtomics>;
    else return fa2_backward_kernel<T, Cfg, kAtomics>;
  }();
  allow_smem<Cfg>(kernel);
  kernel<<<static_cast<unsigned>(bwd_ctas(p, Cfg::kKeys)), Cfg::kThreads, Cfg::kSmemBytes, stream>>>(prm);
  CUDA_CHECK_LAUNCH();

  if constexpr (kAtomics) {
    const int64_t chunks = p.q_elems() / kChunkElems;  // d is a multiple of 8
    constexpr int kConvertThreads = 256;
    const int64_t convert_blocks = std::min<int64_t>((chunks + kConvertThreads - 1) / kConvertThreads, kMaxBlocks);
    fa2_backward_convert_dq<T, kD><<<unsigned(convert_blocks), kConvertThreads, 0, stream>>>(
        prm.dq_acc, prm.dq, chunks, p.Nq, prm.scale);
  } else {
    auto dq_kernel = fa2_backward_dq_kernel<T, DqCfg>;
    allow_smem<DqCfg>(dq_kernel);
    dq_kernel<<<static_cast<unsigned>(bwd_dq_ctas(p, DqCfg::kBr)), DqCfg::kThreads, DqCfg::kSmemBytes, stream>>>(prm);
  }
  CUDA_CHECK_LAUNCH();
}

}  // namespace attn::fa2
