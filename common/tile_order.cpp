#include "common/tile_order.h"

#include <cuda_runtime.h>

#include "common/check.h"

namespace attn {

size_t l2_cache_bytes() {
  int device = 0, l2 = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device));
  return size_t(l2);
}

TileOrder tile_order(const AttnProblem& p, int block_rows, size_t kv_elem_bytes) {
  TileOrder o;
  o.m_blocks = int((int64_t(p.Nq) + block_rows - 1) / block_rows);
  o.heads = p.B * p.H;
  o.heads_per_section = 1;  // without a mask: head after head
  if (!p.causal) return o;  // (and no device query on the launch path)
  // A query head's share of its K/V head (the group's heads are neighbours in b * H + h).
  const size_t kv_bytes = 2 * size_t(p.Nk) * size_t(p.d) * kv_elem_bytes / size_t(p.group());
  o.heads_per_section = heads_per_section(p.causal, o.heads, kv_bytes, l2_cache_bytes());
  return o;
}

}  // namespace attn
