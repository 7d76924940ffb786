// Shared-memory tile layouts of rung 06 as plain constexpr arithmetic, usable on the host
// and the device: the swizzle modes that TMA writes and wgmma reads, where a K step starts
// inside a tile, and the wgmma matrix descriptor. No CUDA headers, so the CPU tests check
// the same arithmetic the kernels use (tests/test_cpu.cpp, Swizzle*).
#pragma once

#include <cstdint>

namespace attn::hopper {

// A swizzled tile is stored in rows of `row_bytes` (the TMA box width in bytes); inside
// each 8-row atom the 16-byte pieces of a row are XOR-permuted by the row:
//   128B: piece ^= row % 8         8 rows x 128 B = 1024-byte atom
//    64B: piece ^= (row / 2) % 4   8 rows x  64 B =  512-byte atom
// Rows longer than row_bytes are split into column chunks of row_bytes each.
enum class Swizzle : int { b64 = 64, b128 = 128 };

constexpr int row_bytes(Swizzle s) { return int(s); }
constexpr int atom_bytes(Swizzle s) { return 8 * row_bytes(s); }

// The swizzle for a K-major tile whose rows are `bytes` long: the widest that does not
// exceed one row (64-byte rows: e4m3 at d = 64; 128 bytes or more: chunks of 128).
constexpr Swizzle swizzle_for_row(int bytes) { return bytes >= 128 ? Swizzle::b128 : Swizzle::b64; }

// K-major tile of `rows` rows stored as column chunks of one swizzle row each: the byte
// offset where K step kk (k_step_bytes of every row) starts. Steps walk along a row, then
// jump to the next chunk; a step never straddles two chunks (static_asserts at the users).
constexpr uint32_t kmajor_step_offset(int kk, int k_step_bytes, int rows, Swizzle s) {
  const int steps_per_row = row_bytes(s) / k_step_bytes;
  return uint32_t((kk / steps_per_row) * rows * row_bytes(s) + (kk % steps_per_row) * k_step_bytes);
}

// wgmma shared-memory matrix descriptor (PTX ISA 9.7.15.5.1.2, "Matrix Descriptor Format"):
// start address, leading and stride byte offsets (each >> 4, 14 bits), base offset 0 (every
// tile starts on a whole atom), layout type in bits 62-63: 1 = 128B swizzle, 2 = 64B.
//   K-major operand: SBO = bytes between 8-row groups = one atom; LBO unused (a K step
//                    stays inside one swizzle row).
//   N-major operand (06's V, bf16/fp16): SBO as above; LBO = bytes between column chunks.
constexpr uint64_t desc_layout_type(Swizzle s) { return s == Swizzle::b128 ? 1 : 2; }
constexpr uint64_t encode_smem_desc(uint32_t smem_addr, uint32_t leading_bytes, uint32_t stride_bytes, Swizzle s) {
  return uint64_t((smem_addr & 0x3FFFF) >> 4) | uint64_t(leading_bytes >> 4) << 16 |
         uint64_t(stride_bytes >> 4) << 32 | desc_layout_type(s) << 62;
}

}  // namespace attn::hopper
