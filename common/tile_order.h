// The order in which a kernel's grid hands out its tiles (B_r query rows of one head), for
// the rungs that launch one CTA per tile (05; 06 with a causal mask). Plain constexpr
// arithmetic, usable on the host and the device, so the CPU tests check what the kernels
// run (tests/test_cpu.cpp, TileOrder*).
//
// The hardware starts CTAs roughly in blockIdx order, each as soon as an SM has room: a
// greedy list schedule. Without a mask every tile costs the same and the order only has to
// keep a head's tiles close together in time, so that its K and V are read from HBM once
// and from L2 after. With a causal mask Q block m sees ~m + 1 K/V blocks: handed out head
// after head, the last heads' longest tiles start in the last wave and run on alone while
// the other SMs idle. Longest first (LPT) makes the last wave the shortest tiles. Sorting
// all tiles of the grid that way would interleave every head, and no head's K/V would stay
// in L2 between its tiles; so the grid is cut into sections of a few heads (sized so that
// their K/V fit in a share of L2) and sorted longest first within each section:
//
//   unit u -> section u / (heads_per_section * m_blocks); inside it, Q blocks from the last
//             (longest) to the first, and for each Q block the section's heads in turn.
//
// heads_per_section = 1 is the plain head-after-head order (Q blocks last to first).
#pragma once

#include <cstddef>

#include "common/attention.h"

namespace attn {

struct TileOrder {
  int m_blocks;           // Q blocks per head
  int heads;              // B * H
  int heads_per_section;  // 1 without a causal mask
};

struct TileCoord {
  int bh;       // b * H + h
  int m_block;  // Q block: rows [m_block * B_r, (m_block + 1) * B_r)
};

constexpr TileCoord tile_at(const TileOrder& o, int unit) {
  const int per_section = o.heads_per_section * o.m_blocks;
  const int section = unit / per_section;
  const int first_head = section * o.heads_per_section;
  const int rest = o.heads - first_head;
  const int heads_here = rest < o.heads_per_section ? rest : o.heads_per_section;  // the last may be short
  const int r = unit - section * per_section;
  return {first_head + r % heads_here, o.m_blocks - 1 - r / heads_here};
}

// Heads per section: as many as keep their K and V within a third of the L2 cache (the
// section running now and the next one's first tiles share it); 1 without a causal mask.
constexpr int heads_per_section(bool causal, int heads, size_t kv_bytes_per_head, size_t l2_bytes) {
  if (!causal || kv_bytes_per_head == 0) return 1;
  const size_t fit = l2_bytes / 3 / kv_bytes_per_head;
  return fit < 1 ? 1 : fit > size_t(heads) ? heads : int(fit);
}

// The current GPU's L2 size in bytes (host only; tile_order.cpp): what a section may fill.
size_t l2_cache_bytes();

// The order for problem p on the current GPU (host only; tile_order.cpp): tiles of
// block_rows query rows, K and V elements of kv_elem_bytes in the kernel's memory.
TileOrder tile_order(const AttnProblem& p, int block_rows, size_t kv_elem_bytes);

}  // namespace attn
