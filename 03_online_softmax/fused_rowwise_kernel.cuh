// 03b: fused online-softmax attention on CUDA cores (fp32 arithmetic).
//
// One warp owns one query row i and streams the keys it sees in chunks of 32:
//
//            chunk j0 of K (32 rows)          chunk j0 of V (32 rows, d columns)
//   lane 0 ─ k_{j0+0}  · q  → s_0             ┌ lane 0 ┬ lane 1 ┬ ... ┬ lane 31 ┐
//   lane 1 ─ k_{j0+1}  · q  → s_1     p_c     │ d/32   │ d/32   │     │ d/32    │ v_{j0+c}
//    ...                          ──shuffle─▶ │ dims   │ dims   │     │ dims    │ (coalesced)
//   lane 31─ k_{j0+31} · q  → s_31            └────────┴────────┴─────┴─────────┘
//
// Per chunk: one online-softmax update (warp max, rescale, warp sum), then every lane adds
// p_c · v_{j0+c} to the d/32 output dims it owns. m, l and the unnormalised o stay in
// registers; no score ever reaches HBM. Nothing is shared between rows (that is rung 04).
#pragma once

#include <cuda_runtime.h>

#include <cmath>

#include "03_online_softmax/fused_rowwise.cuh"
#include "common/check.h"
#include "common/device_math.cuh"
#include "common/dtype.cuh"

namespace attn {
namespace fused_rowwise {

constexpr int kWarpSize = 32;
constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kLoadBytes = 16;  // widest vector load per lane (LDG.128)

struct Args {
  int64_t Nq, Nk;
  int H, Hkv, group;   // query heads, key/value heads, query heads per key/value head
  int64_t row_blocks;  // CTAs per (batch, head) = ceil(Nq / rows per CTA)
  float scale;         // tau
  bool causal;
};

// The unsigned vector type of a given size, so a row piece moves as one load or store.
template <int kBytes> struct VectorOf;
template <> struct VectorOf<4> { using type = unsigned; };
template <> struct VectorOf<8> { using type = uint2; };
template <> struct VectorOf<16> { using type = uint4; };

// n contiguous elements at p (aligned to their total size) in one load, converted to fp32.
template <typename T, int n>
__device__ inline void load_floats(const T* p, float (&out)[n]) {
  using Vec = typename VectorOf<n * sizeof(T)>::type;
  const Vec raw = *reinterpret_cast<const Vec*>(p);
  const T* x = reinterpret_cast<const T*>(&raw);
#pragma unroll
  for (int e = 0; e < n; ++e) out[e] = to_float(x[e]);
}

// n fp32 values converted to T and written to p (aligned to their total size) in one store.
template <typename T, int n>
__device__ inline void store_floats(T* p, const float (&in)[n]) {
  using Vec = typename VectorOf<n * sizeof(T)>::type;
  Vec raw;
  T* x = reinterpret_cast<T*>(&raw);
#pragma unroll
  for (int e = 0; e < n; ++e) x[e] = from_float<T>(in[e]);
  *reinterpret_cast<Vec*>(p) = raw;
}

template <typename T, int kHeadDim, int kRowsPerCta>
__global__ void __launch_bounds__(kRowsPerCta * kWarpSize)
    fused_rowwise_kernel(const T* __restrict__ Q, const T* __restrict__ K, const T* __restrict__ V,
                         T* __restrict__ O, float* __restrict__ lse, Args a) {
  static_assert(kHeadDim % kWarpSize == 0, "each lane owns d/32 output dims");
  constexpr int kDimsPerLane = kHeadDim / kWarpSize;  // o dims (and V columns) per lane
  constexpr int kKeyVec = kLoadBytes / sizeof(T);     // K elements per vector load
  constexpr int kQVec = kLoadBytes / sizeof(float);   // q elements per shared float4 load
  static_assert(kHeadDim % kKeyVec == 0 && kKeyVec % kQVec == 0, "a K row is whole vector loads");

  __shared__ __align__(kLoadBytes) float q_s[kRowsPerCta][kHeadDim];  // each warp's tau q_i (broadcast reads)

  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int64_t bh = blockIdx.x / a.row_blocks;                              // (batch, query head)
  const int64_t i = (blockIdx.x % a.row_blocks) * kRowsPerCta + warp;        // query row
  if (i >= a.Nq) return;  // whole warp leaves; no CTA-wide barrier follows
  const int64_t b = bh / a.H, h = bh % a.H;
  const int64_t bh_kv = b * a.Hkv + h / a.group;  // GQA: the K/V head this query head reads

  const T* q_i = Q + (bh * a.Nq + i) * kHeadDim;
  const T* K_h = K + bh_kv * a.Nk * kHeadDim;
  const T* V_h = V + bh_kv * a.Nk * kHeadDim;

  float* q = q_s[warp];
  for (int c = lane; c < kHeadDim; c += kWarpSize) q[c] = a.scale * to_float(q_i[c]);
  __syncwarp();

  // Keys [0, key_end) are visible: all of them, or (causal, bottom-right) j <= i + Nk - Nq.
  const int64_t key_end = a.causal ? min(max(i + a.Nk - a.Nq + 1, int64_t(0)), a.Nk) : a.Nk;

  float m = -INFINITY;          // running max of the scores seen so far
  float l = 0.f;                // running sum of exp(s - m)
  float o[kDimsPerLane] = {};   // running sum of exp(s - m) v, this lane's dims

  for (int64_t j0 = 0; j0 < key_end; j0 += kWarpSize) {
    // s = tau q · k_j for this lane's key j = j0 + lane (-inf past the visible end)
    const int64_t j = j0 + lane;
    float s = -INFINITY;
    if (j < key_end) {
      const T* k_j = K_h + j * kHeadDim;
      s = 0.f;
#pragma unroll
      for (int c = 0; c < kHeadDim; c += kKeyVec) {
        float k[kKeyVec];
        load_floats(k_j + c, k);
#pragma unroll
        for (int e = 0; e < kKeyVec; e += kQVec) {
          const float4 q4 = *reinterpret_cast<const float4*>(q + c + e);
          s += q4.x * k[e] + q4.y * k[e + 1] + q4.z * k[e + 2] + q4.w * k[e + 3];
        }
      }
    }

    // online softmax: fold the chunk's 32 keys into m, l and o
    const float m_new = fmaxf(m, group_max(s));  // finite: key j0 is visible; LAB:BEGIN 03b.update
    const float alpha = __expf(m - m_new);      // exp(-inf) = 0 on the first chunk
    const float p = __expf(s - m_new);          // 0 for keys past the end
    l = alpha * l + group_sum(p);
#pragma unroll
    for (int k = 0; k < kDimsPerLane; ++k) o[k] *= alpha;

    // o += sum_c p_c v_{j0+c}: p_c broadcast from lane c, each lane reads its d/32 columns
#pragma unroll
    for (int c = 0; c < kWarpSize; ++c) {
      const float p_c = __shfl_sync(kFullMask, p, c);
      const int64_t row = min(j0 + c, key_end - 1);  // past the end p_c = 0: any in-bounds row
      float v[kDimsPerLane];
      load_floats(V_h + row * kHeadDim + lane * kDimsPerLane, v);
#pragma unroll
      for (int k = 0; k < kDimsPerLane; ++k) o[k] += p_c * v[k];
    }
    m = m_new;  // LAB:END
  }

  // O_i = o / l; a row that sees no key has l = 0: O = 0, lse = -inf
  const float inv_l = l > 0.f ? 1.f / l : 0.f;
#pragma unroll
  for (int k = 0; k < kDimsPerLane; ++k) o[k] *= inv_l;
  store_floats(O + (bh * a.Nq + i) * kHeadDim + lane * kDimsPerLane, o);
  if (lse != nullptr && lane == 0) lse[bh * a.Nq + i] = l > 0.f ? m + logf(l) : -INFINITY;
}

}  // namespace fused_rowwise

template <typename T, int kHeadDim>
void fused_rowwise_launch(const AttnProblem& p, const AttnTensors& t, cudaStream_t stream) {
  using namespace fused_rowwise;
  constexpr int kRowsPerCta = kFusedRowsPerCta;
  Args a;
  a.Nq = p.Nq;
  a.Nk = p.Nk;
  a.H = p.H;
  a.Hkv = p.Hkv;
  a.group = p.group();
  a.row_blocks = (int64_t(p.Nq) + kRowsPerCta - 1) / kRowsPerCta;
  a.scale = p.softmax_scale();
  a.causal = p.causal;
  const int64_t ctas = a.row_blocks * p.B * p.H;  // refuse() keeps this <= INT_MAX
  fused_rowwise_kernel<T, kHeadDim, kRowsPerCta><<<unsigned(ctas), kRowsPerCta * kWarpSize, 0, stream>>>(
      static_cast<const T*>(t.q), static_cast<const T*>(t.k), static_cast<const T*>(t.v), static_cast<T*>(t.o),
      t.lse, a);
  CUDA_CHECK_LAUNCH();
}

}  // namespace attn
