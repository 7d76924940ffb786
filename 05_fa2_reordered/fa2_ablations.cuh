// The ablations of 05 (stages.cu registers them): FlashAttention-2's kernel (05d_fa2_reordered.cuh)
// with one of its choices undone, to measure what that choice is worth. One kernel,
// fa2_ablation_kernel, built from 05's pieces plus the ones below; each ablation picks its
// tile (fa2_ablation_tiles.h: AblationTileFor) and two switches:
//
//   05_fa2_no_delay          kDelayedNorm = false: O_i and P_ij divided by l_i every block, as FA1
//   05_fa2_one_cta_per_head  kOneCtaPerHead: FA1's grid, one CTA per (batch, head) walks its Q blocks
//   05_fa2_warps_split_kv    WarpSplit::kv_keys: the warps split K_j, V_j instead of Q_i (FA1's split-K)
//   05_fa2_prefetch          kVAhead > 0: P_ij V_j's first V_j fragments loaded before the softmax
//   05_fa2_padded            PaddedRows: padded shared-memory rows instead of the swizzle
//
// (05_fa2_eager_rescale is 05's own kernel with rescale_log2 = -inf.)
//
// The warp split (B_r = 32, B_c = 64, 4 warps): warp w takes keys 16w..16w+15 of every K_j,
// V_j for all rows, so each warp holds S_ij, P_ij of every row for its keys and a partial O_i
// of every row:
//
//                    K_j^T and V_j (B_c = 64 keys)
//           +------------+------------+------------+------------+
//  Q_i,     |   warp 0   |   warp 1   |   warp 2   |   warp 3   |
//  all 32   | keys  0-15 | keys 16-31 | keys 32-47 | keys 48-63 |
//  rows     +------------+------------+------------+------------+
//             partial O_i  partial O_i  partial O_i  partial O_i   (32 x d each)
//
// Per block the warps agree on each row's max through shared memory (cta_row_max); after the
// loop the 4 partial O_i and l_i, all under that same m_i, are summed (write_output_split_kv).
#pragma once

#include "05_fa2_reordered/fa2_ablation_tiles.h"
#include "05_fa2_reordered/05d_fa2_reordered.cuh"

namespace attn::fa2 {

// This warp's part of every S_ij (WarpSplit): kWarpRows rows of Q_i from the first,
// kWarpKeys keys of K_j, V_j from the first.
template <class Cfg>
__device__ __forceinline__ int ablation_first_row(int warp) {
  return Cfg::kSplitKV ? 0 : warp * Cfg::kWarpRows;
}
template <class Cfg>
__device__ __forceinline__ int ablation_first_key(int warp) {
  return Cfg::kSplitKV ? warp * Cfg::kWarpKeys : 0;
}

// No delayed normalization (FA1's update), Algorithm 1, lines 9-10 for one row: P_ij and O_i
// divided by the full l_i at every step,
// O_i = diag(l_new)^-1 (diag(l_old) e^(m_old - m_new) O_i + P_ij V_j).
template <class Cfg, bool kMasked>
__device__ __forceinline__ void softmax_row_no_delay(float (&S_ij)[Frag<Cfg>::kM][Frag<Cfg>::kS][4],
                                                     float (&O_i)[Frag<Cfg>::kM][Frag<Cfg>::kO][4],
                                                     float (&m_i)[Frag<Cfg>::kM][2], float (&l_i)[Frag<Cfg>::kM][2],
                                                     int mt, int half, float row_max, float scale_log2,
                                                     bool rescale_o) {
  const float max_scaled = scaled_max<kMasked>(row_max, scale_log2);
  const float alpha = rescale_o ? exp2_approx(m_i[mt][half] * scale_log2 - max_scaled) : 1.f;
  m_i[mt][half] = row_max;
  float row_sum = exp_row<Cfg>(S_ij, mt, half, max_scaled, scale_log2);
  row_sum += __shfl_xor_sync(kFullWarp, row_sum, 1);
  row_sum += __shfl_xor_sync(kFullWarp, row_sum, 2);
  const float l_new = alpha * l_i[mt][half] + row_sum;
  const float inv_l = l_new > 0.f ? 1.f / l_new : 0.f;
  const float o_scale = alpha * l_i[mt][half] * inv_l;
  l_i[mt][half] = l_new;
#pragma unroll
  for (int nt = 0; nt < Frag<Cfg>::kS; ++nt)
#pragma unroll
    for (int e = 0; e < 2; ++e) S_ij[mt][nt][2 * half + e] *= inv_l;
  if (rescale_o)
#pragma unroll
    for (int dt = 0; dt < Frag<Cfg>::kO; ++dt)
#pragma unroll
      for (int e = 0; e < 2; ++e) O_i[mt][dt][2 * half + e] *= o_scale;
}

// Split-K only: each warp has seen B_c / warps keys of the block, so the warps exchange their
// row maxima through shared memory (s_row_max, fp32 [B_r][warps]) and all continue with the max
// over the whole block: one barrier per block. The next block's writes come after its top
// barrier, which every warp reaches only once it has read these.
template <class Cfg>
__device__ __forceinline__ void cta_row_max(float (&row_max)[Frag<Cfg>::kM][2], float* s_row_max, int lane) {
  static_assert(Cfg::kWarps == 4, "one float4 of warp maxima per row");
  const int warp = threadIdx.x / 32;
#pragma unroll
  for (int mt = 0; mt < Frag<Cfg>::kM; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half)
      if (lane % 4 == 0) s_row_max[(mt * 16 + lane / 4 + 8 * half) * Cfg::kWarps + warp] = row_max[mt][half];
  __syncthreads();
#pragma unroll
  for (int mt = 0; mt < Frag<Cfg>::kM; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const float4 w = *reinterpret_cast<const float4*>(s_row_max + (mt * 16 + lane / 4 + 8 * half) * Cfg::kWarps);
      row_max[mt][half] = fmaxf(fmaxf(w.x, w.y), fmaxf(w.z, w.w));
    }
}

// 05's online_softmax with the switches: split-K agrees on the row max across warps first;
// kLazy = false rescales after every block; kDelayedNorm = false is FA1's update.
template <class Cfg, bool kDelayedNorm, bool kMasked, bool kLazy>
__device__ __forceinline__ void online_softmax_ablation(float (&S_ij)[Frag<Cfg>::kM][Frag<Cfg>::kS][4],
                                                        float (&O_i)[Frag<Cfg>::kM][Frag<Cfg>::kO][4],
                                                        float (&m_i)[Frag<Cfg>::kM][2],
                                                        float (&l_i)[Frag<Cfg>::kM][2], float scale_log2,
                                                        float rescale_log2, float* s_row_max, int lane) {
  static_assert(!Cfg::kSplitKV || kDelayedNorm, "split-K sums the warps' l_i after the loop");
  // Lazy rescaling keeps l_i and O_i under a stale m_i; with split-K a warp sees only part of
  // each row before cta_row_max.
  static_assert(!kLazy || (kDelayedNorm && !Cfg::kSplitKV), "lazy rescaling keeps l_i and O_i in the same units");
  float row_max[Frag<Cfg>::kM][2];  // max(m_i, rowmax(S_ij))
  bool grew = false;
#pragma unroll
  for (int mt = 0; mt < Frag<Cfg>::kM; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      row_max[mt][half] = quad_row_max<Cfg>(S_ij, mt, half, m_i[mt][half]);
      grew |= (row_max[mt][half] - m_i[mt][half]) * scale_log2 > rescale_log2;  // -inf - (-inf): false
    }
  if constexpr (Cfg::kSplitKV) cta_row_max<Cfg>(row_max, s_row_max, lane);
  const bool moved = !kLazy || __any_sync(kFullWarp, grew);
#pragma unroll
  for (int mt = 0; mt < Frag<Cfg>::kM; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const float m = moved ? row_max[mt][half] : m_i[mt][half];
      if constexpr (kDelayedNorm)
        softmax_row<Cfg, kMasked>(S_ij, O_i, m_i, l_i, mt, half, m, scale_log2, moved);
      else
        softmax_row_no_delay<Cfg, kMasked>(S_ij, O_i, m_i, l_i, mt, half, m, scale_log2, moved);
    }
}

// The prefetch variant (kVAhead > 0): V_j fragments in registers before the softmax.
//
// pv_tile issues each ldmatrix of V_j next to the mma that consume it, and ptxas hoists loads
// as far as registers allow inside one basic block, but not into an earlier one: the softmax
// (masked or not) is a branch, so pv_tile's first mma wait for its first ldmatrix after every
// softmax. The variant loads the first kVAhead steps of P_ij V_j right after the barrier that
// proves V_j landed, before the softmax, and continues as a ring of register buffers:
//
//   V_j landed (barrier)  load f[0] <- step 0 .. f[A-1] <- step A-1        (A = kVAhead)
//   softmax               (the loads complete meanwhile)
//   step 0:               load f[A] <- step A        mma(f[0])
//   step 1:               load f[0] <- step A+1      mma(f[1])            (ring of A + 1)
//   ...
//   step s:               load f[(s+A) % (A+1)]      mma(f[s % (A+1)])
//
// A step is one ldmatrix of V_j (keys 16kk.., d 16dp..; pv_tile's order) and the mma it feeds.
// The loops are unrolled, so f[s % (A+1)] names registers (no copies, no local memory).

template <class Cfg, typename T>
__device__ __forceinline__ uint32_t v_lane_base(const T* sV, int lane) {
  return lane_row<Cfg>(sV, lane % 16, lane / 16);  // as in pv_tile
}
// Step s of P_ij V_j: B = V_j[keys 16kk.., d 16dp..], kk = s / (d / 16), dp = s % (d / 16).
template <class Cfg>
__device__ __forceinline__ void load_v_step(uint32_t (&b)[4], uint32_t v_base, int s) {
  constexpr int kDSteps = Cfg::kD / 16;
  ptx::ldmatrix_x4_trans(b, frag_addr<Cfg>(v_base, (s / kDSteps) * 16, s % kDSteps));
}

// Steps 0 .. kVAhead - 1, issued once V_j has landed and before the softmax.
template <class Cfg, typename T>
__device__ __forceinline__ void load_v_head(uint32_t (&v_frags)[Cfg::kVAhead + 1][4], const T* sV, int lane) {
  const uint32_t v_base = v_lane_base<Cfg>(sV, lane);
#pragma unroll
  for (int s = 0; s < Cfg::kVAhead; ++s) load_v_step<Cfg>(v_frags[s], v_base, s);
}

// O_i += P_ij V_j as pv_tile, with v_frags holding steps 0 .. kVAhead - 1 (load_v_head); step
// s + kVAhead goes into the slot that step s - 1 has just freed.
template <typename T, class Cfg>
__device__ __forceinline__ void pv_tile_prefetch(float (&O_i)[Frag<Cfg>::kM][Frag<Cfg>::kO][4],
                                                 const uint32_t (&P_ij)[Frag<Cfg>::kM][Cfg::kWarpKeys / 16][4],
                                                 uint32_t (&v_frags)[Cfg::kVAhead + 1][4], const T* sV, int lane) {
  constexpr int kDSteps = Cfg::kD / 16, kSteps = Cfg::kWarpKeys / 16 * kDSteps, kRing = Cfg::kVAhead + 1;
  static_assert(kSteps > Cfg::kVAhead, "fewer steps than fragments loaded ahead");
  const uint32_t v_base = v_lane_base<Cfg>(sV, lane);
#pragma unroll
  for (int s = 0; s < kSteps; ++s) {
    if (s + Cfg::kVAhead < kSteps) load_v_step<Cfg>(v_frags[(s + Cfg::kVAhead) % kRing], v_base, s + Cfg::kVAhead);
    const int kk = s / kDSteps, dp = s % kDSteps;
    const uint32_t(&b)[4] = v_frags[s % kRing];
#pragma unroll
    for (int mt = 0; mt < Frag<Cfg>::kM; ++mt) {
      ptx::mma_16816<T>(O_i[mt][2 * dp], P_ij[mt][kk], b[0], b[1]);
      ptx::mma_16816<T>(O_i[mt][2 * dp + 1], P_ij[mt][kk], b[2], b[3]);
    }
  }
}

// No delayed normalization, lines 12-13: l_i is already the full row sum and O_i already
// divided by it; only L_i = m_i + log(l_i) is left to write.
template <typename T, class Cfg>
__device__ __forceinline__ void write_lse_no_delay(const float (&m_i)[Frag<Cfg>::kM][2],
                                                   const float (&l_i)[Frag<Cfg>::kM][2], const Params<T>& p, int bh,
                                                   int row0, int warp_row0, int lane) {
  float* L = p.lse ? p.lse + int64_t(bh) * p.Nq : nullptr;
#pragma unroll
  for (int mt = 0; mt < Frag<Cfg>::kM; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const float l = l_i[mt][half];
      const int row = row0 + warp_row0 + mt * 16 + lane / 4 + 8 * half;
      if (L && lane % 4 == 0 && row < p.Nq) L[row] = l > 0.f ? m_i[mt][half] * p.scale + logf(l) : -INFINITY;
    }
}

// Split-K, lines 12-15: each warp holds a partial O_i and l_i over its keys, all under the
// same m_i (cta_row_max), so they add without rescaling. Every warp writes its partials to
// shared memory (fp32, over the K/V buffers, free after the loop); then warp w sums the
// kWarps partials of rows w, w + kWarps, ..., divides by l_i and writes O_i and L_i, lane l
// columns 4l..4l+3 of every 128 (16-byte shared loads, 8-byte global stores).
template <typename T, class Cfg>
__device__ __forceinline__ void write_output_split_kv(const float (&O_i)[Frag<Cfg>::kM][Frag<Cfg>::kO][4],
                                                      const float (&m_i)[Frag<Cfg>::kM][2],
                                                      const float (&l_i)[Frag<Cfg>::kM][2], float* s_partial_o,
                                                      float* s_stats, const Params<T>& p, int bh, int row0, int lane) {
  constexpr int D = Cfg::kD, B_r = Cfg::kBr, kWarps = Cfg::kWarps, kPitch = Cfg::kPartialOStride;
  constexpr int kLaneCols = 4, kPassCols = 32 * kLaneCols;  // one float4 per lane: a warp covers 128 columns
  static_assert(D % kPassCols == 0, "a warp covers a row in whole passes");
  const int warp = threadIdx.x / 32;
  float* s_row_sum = s_stats;          // [B_r][warps], where the row maxima were
  float* s_m = s_stats + B_r * kWarps;  // [B_r]
  __syncthreads();  // every warp is done with K_j, V_j (overwritten below) and the row maxima
#pragma unroll
  for (int mt = 0; mt < Frag<Cfg>::kM; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float l = l_i[mt][half];
      l += __shfl_xor_sync(kFullWarp, l, 1);  // the 4 lanes' partial sums: this warp's keys of the row
      l += __shfl_xor_sync(kFullWarp, l, 2);
      const int r = mt * 16 + lane / 4 + 8 * half;
      if (lane % 4 == 0) {
        s_row_sum[r * kWarps + warp] = l;
        if (warp == 0) s_m[r] = m_i[mt][half];  // the same in every warp
      }
#pragma unroll
      for (int dt = 0; dt < Frag<Cfg>::kO; ++dt)
        *reinterpret_cast<float2*>(s_partial_o + (warp * B_r + r) * kPitch + dt * 8 + 2 * (lane % 4)) =
            make_float2(O_i[mt][dt][2 * half], O_i[mt][dt][2 * half + 1]);
    }
  __syncthreads();
  T* O = p.o + int64_t(bh) * p.Nq * D;  // this head's [Nq, D] output
  for (int r = warp; r < B_r && row0 + r < p.Nq; r += kWarps) {
    float l = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) l += s_row_sum[r * kWarps + w];
    const float inv_l = l > 0.f ? 1.f / l : 0.f;  // a row that sees no key: O = 0
#pragma unroll
    for (int c = kLaneCols * lane; c < D; c += kPassCols) {
      float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
      for (int w = 0; w < kWarps; ++w) {
        const float4 part = *reinterpret_cast<const float4*>(s_partial_o + (w * B_r + r) * kPitch + c);
        o.x += part.x;
        o.y += part.y;
        o.z += part.z;
        o.w += part.w;
      }
      *reinterpret_cast<uint2*>(O + int64_t(row0 + r) * D + c) =
          make_uint2(pack2<T>(o.x * inv_l, o.y * inv_l), pack2<T>(o.z * inv_l, o.w * inv_l));
    }
    if (p.lse && lane == 0) p.lse[int64_t(bh) * p.Nq + row0 + r] = l > 0.f ? s_m[r] * p.scale + logf(l) : -INFINITY;
  }
}

// One Q block i of head bh: 05's attend_q_block with the switches. s_stats: split-K only.
template <typename T, class Cfg, bool kDelayedNorm, bool kLazy>
__device__ __forceinline__ void attend_q_block_ablation(const Params<T>& p, T* sQ, T* sK, T* sV, float* s_stats,
                                                        int bh, int i) {
  constexpr int D = Cfg::kD, B_r = Cfg::kBr, B_c = Cfg::kBc, kStages = Cfg::kStages;
  constexpr int kTileKV = B_c * Cfg::kStride;  // elements per K or V tile
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int b = bh / p.H, h = bh % p.H, h_kv = h / p.group;
  const T* Q = p.q + int64_t(bh) * p.Nq * D;
  const T* K = p.k + (int64_t(b) * p.Hkv + h_kv) * p.Nk * D;
  const T* V = p.v + (int64_t(b) * p.Hkv + h_kv) * p.Nk * D;
  const int row0 = i * B_r;
  const KvRange kv = kv_range<B_r, B_c>(p, row0);

  float O_i[Frag<Cfg>::kM][Frag<Cfg>::kO][4];
  float m_i[Frag<Cfg>::kM][2], l_i[Frag<Cfg>::kM][2];
#pragma unroll
  for (int mt = 0; mt < Frag<Cfg>::kM; ++mt) {
#pragma unroll
    for (int dt = 0; dt < Frag<Cfg>::kO; ++dt)
#pragma unroll
      for (int e = 0; e < 4; ++e) O_i[mt][dt][e] = 0.f;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      m_i[mt][half] = -INFINITY;
      l_i[mt][half] = 0.f;
    }
  }

  auto load_kv = [&](T* dst, const T* src, int block) { load_tile<Cfg, B_c>(dst, src, block * B_c, p.Nk); };
  if (kv.T_c > 0) {
    load_tile<Cfg, B_r>(sQ, Q, row0, p.Nq);
    if constexpr (kStages == 1) {
      load_kv(sK, K, 0);
      ptx::cp_async_commit();
    } else {
#pragma unroll
      for (int s = 0; s < kStages - 1; ++s) {
        if (s < kv.T_c) {
          load_kv(sK + s * kTileKV, K, s);
          load_kv(sV + s * kTileKV, V, s);
        }
        ptx::cp_async_commit();
      }
    }
  }

  for (int j = 0; j < kv.T_c; ++j) {
    ptx::cp_async_wait<kStages == 1 ? 0 : kStages - 2>();
    __syncthreads();
    if constexpr (kStages == 1) {
      load_kv(sV, V, j);
    } else {
      const int next = j + kStages - 1;
      if (next < kv.T_c) {
        load_kv(sK + (next % kStages) * kTileKV, K, next);
        load_kv(sV + (next % kStages) * kTileKV, V, next);
      }
    }
    ptx::cp_async_commit();
    const T* K_j = sK + (j % kStages) * kTileKV + ablation_first_key<Cfg>(warp) * Cfg::kStride;  // this warp's keys
    const T* V_j = sV + (j % kStages) * kTileKV + ablation_first_key<Cfg>(warp) * Cfg::kStride;

    float S_ij[Frag<Cfg>::kM][Frag<Cfg>::kS][4];
    qk_tile<T, Cfg>(S_ij, sQ, K_j, ablation_first_row<Cfg>(warp), lane);
    if constexpr (kStages == 1) {
      ptx::cp_async_wait<0>();
      __syncthreads();
      if (j + 1 < kv.T_c) load_kv(sK, K, j + 1);
      ptx::cp_async_commit();
    }
    uint32_t v_frags[Cfg::kVAhead + 1][4];  // the prefetch variant: P_ij V_j's first V_j fragments
    if constexpr (Cfg::kPrefetch) load_v_head<Cfg>(v_frags, V_j, lane);  // V_j has landed (a barrier above)
    if (j < kv.unmasked_blocks) {
      online_softmax_ablation<Cfg, kDelayedNorm, false, kLazy>(S_ij, O_i, m_i, l_i, p.scale_log2, p.rescale_log2,
                                                               s_stats, lane);
    } else {
      mask_tile<T, Cfg>(S_ij, p, row0 + ablation_first_row<Cfg>(warp), j * B_c + ablation_first_key<Cfg>(warp),
                        lane);
      online_softmax_ablation<Cfg, kDelayedNorm, true, kLazy>(S_ij, O_i, m_i, l_i, p.scale_log2, p.rescale_log2,
                                                              s_stats, lane);
    }
    uint32_t P_ij[Frag<Cfg>::kM][Cfg::kWarpKeys / 16][4];
    pack_p<T, Cfg>(P_ij, S_ij);
    if constexpr (Cfg::kPrefetch)
      pv_tile_prefetch<T, Cfg>(O_i, P_ij, v_frags, V_j, lane);
    else
      pv_tile<T, Cfg>(O_i, P_ij, V_j, lane);
  }

  if constexpr (Cfg::kSplitKV) {
    write_output_split_kv<T, Cfg>(O_i, m_i, l_i, reinterpret_cast<float*>(sK), s_stats, p, bh, row0, lane);
  } else {
    if constexpr (kDelayedNorm)
      normalize_output<T, Cfg>(O_i, m_i, l_i, p, bh, row0, ablation_first_row<Cfg>(warp), lane);
    else
      write_lse_no_delay<T, Cfg>(m_i, l_i, p, bh, row0, ablation_first_row<Cfg>(warp), lane);
    store_output<T, Cfg>(O_i, sQ, p, bh, row0, ablation_first_row<Cfg>(warp), lane);
  }
}

template <typename T, class Cfg, bool kDelayedNorm, bool kOneCtaPerHead>
__global__ void __launch_bounds__(Cfg::kThreads) fa2_ablation_kernel(const Params<T> p) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  constexpr int kAlign = Cfg::Layout::kAlign;  // 0: padded rows need only 16-byte alignment
  unsigned char* smem = smem_raw;
  if constexpr (kAlign > 0) smem += (kAlign - ptx::smem_u32(smem_raw) % kAlign) % kAlign;
  const SmemTiles<T> s = smem_tiles<T, Cfg>(smem);
  float* s_stats = reinterpret_cast<float*>(s.sV + Cfg::kStages * Cfg::kBc * Cfg::kStride);  // split-K: kStatsBytes
  if constexpr (!kOneCtaPerHead) {
    const TileCoord tile = tile_at(p.order, int(blockIdx.x));
    // Lazy rescaling where it fits: not without delayed normalization, not with split-K
    // (online_softmax_ablation), not in the prefetch variant (its registers then spill at d = 128).
    constexpr bool kLazy = kDelayedNorm && !Cfg::kSplitKV && !Cfg::kPrefetch;
    attend_q_block_ablation<T, Cfg, kDelayedNorm, kLazy>(p, s.sQ, s.sK, s.sV, s_stats, tile.bh, tile.m_block);
  } else {
    // FA1's grid: one CTA per (batch, head), the Q blocks one after another.
    for (int q_block = 0; q_block < p.T_r; ++q_block) {
      attend_q_block_ablation<T, Cfg, kDelayedNorm, false>(p, s.sQ, s.sK, s.sV, s_stats, blockIdx.x, q_block);
      __syncthreads();  // every warp has written its O rows from sQ before the next Q_i lands there
    }
  }
}

template <Ablation kA, typename T, int kD>
void launch_ablation(const AttnProblem& p, const AttnTensors& t, cudaStream_t stream) {
  using Cfg = AblationTileFor<kA, kD>;
  constexpr bool kDelayedNorm = kA != Ablation::no_delay;
  constexpr bool kOneCtaPerHead = kA == Ablation::one_cta_per_head;
  const Params<T> prm = make_params<T, Cfg>(p, t, kRescaleLog2);
  auto kernel = fa2_ablation_kernel<T, Cfg, kDelayedNorm, kOneCtaPerHead>;
  allow_smem<Cfg>(kernel);
  const int64_t ctas = int64_t(p.B) * p.H * (kOneCtaPerHead ? 1 : prm.T_r);  // Stage::refuse: <= INT_MAX
  kernel<<<static_cast<unsigned>(ctas), Cfg::kThreads, Cfg::kSmemBytes, stream>>>(prm);
  CUDA_CHECK_LAUNCH();
}

}  // namespace attn::fa2
