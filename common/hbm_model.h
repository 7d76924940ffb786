// Analytic cost model: FLOPs and HBM bytes per rung, the formulas each rung's README
// derives from its loop nest. Leading terms only (the per-row statistics m and l are counted
// by the fused rungs' models; the score pipeline's leave them out). Tested in tests/test_cpu.cpp.
//
// Notation: e = bytes per element of Q/K/V/O/P; S is fp32 (4 bytes); "pairs" = the
// (query, key) pairs the mask leaves visible (Nq*Nk without causal masking).
// K and V traffic of the fused rungs (not decode) is counted per query head: with GQA each query head
// streams its K/V head itself (L2 may share it; the model does not assume so).
#pragma once

#include <cstdint>

#include "common/attention.h"

namespace attn::hbm {

// Visible (query, key) pairs per (batch, head).
double visible_pairs(const AttnProblem& p);
// Keys that a query-row block [row_begin, row_end) must read when K is loaded in blocks
// of block_cols: all keys up to the block's last visible one, rounded up to whole blocks,
// capped at Nk. Without causal masking that is Nk.
int64_t keys_loaded(const AttnProblem& p, int64_t row_begin, int64_t row_end, int block_cols);

// FLOPs: 4 * d per visible pair (QKᵀ and PV, a multiply-add = 2 FLOPs), times B*H.
double flops(const AttnProblem& p);

// The least any algorithm must move: read Q, K, V once, write O once.
double min_bytes(const AttnProblem& p);

// 01, 02, 03a: S = QKᵀ by a GEMM (fp32 S written), a softmax that reads S `softmax_reads`
// times and writes P, O = PV by a GEMM (P and V read, O written). Q, O once; K, V once per query head.
double score_pipeline_bytes(const AttnProblem& p, int softmax_reads);
// The softmax kernel(s) alone: the visible part of S read `softmax_reads` times, P
// (all Nq x Nk, zeros where masked) written once.
double softmax_bytes(const AttnProblem& p, int softmax_reads);

// 03b: each query row streams every visible key and value row from HBM (no reuse between
// rows), reads its Q row once, writes its O row once.
double fused_rowwise_bytes(const AttnProblem& p);

// 04: FlashAttention-1 Algorithm 1. Outer loop over K/V blocks of Bc rows (K_j, V_j read
// once); inner loop over Q blocks of Br rows: for every visible (i, j) block pair, read Q_i,
// read and write O_i (fp32 accumulator) and l_i, m_i (fp32); then one pass converts O to the
// output dtype (reading m and l, writing the logsumexp). Initialisation writes O = 0,
// l = 0, m = -inf once.
double fa1_bytes(const AttnProblem& p, int Br, int Bc);

// 05, 06: FlashAttention-2 order. Per Q block of Br rows: read Q_i once, read the visible
// K_j, V_j (blocks of Bc), write O_i and the logsumexp once.
double fa2_bytes(const AttnProblem& p, int Br, int Bc);

// 05's and 06's backward (FlashAttention-2's Algorithm 2 order): a pre-pass reads O and dO,
// writes D and zeroes the fp32 dQ accumulator; one CTA per (K/V block of Bc keys, batch, KV
// head) reads K_j, V_j once and writes dK_j, dV_j once, and for every visible (Q block of Br
// rows, K/V block) pair of each query head of its group reads Q_i, dO_i, L_i, D_i and adds
// its dQ_i partial to the accumulator (fp32 read + write, counted at HBM: an upper bound,
// since L2 absorbs part of the atomics); a post-pass reads the accumulator and writes dQ.
// dq_adds: partials of one dQ_i added per pair (06e, 06f: one per consumer warpgroup, 2).
double fa2_backward_bytes(const AttnProblem& p, int Br, int Bc, int dq_adds = 1);

// 05_fa2_decode (flash-decoding): each (batch, KV head) streams its K and V once per block
// of packed rows (the group = H / Hkv query heads that share it, Nq rows each; row_blocks = 1
// unless group * Nq > B_r); Q read and O written once; each row's `splits` partial O rows and
// logsumexps (fp32) written by the split kernel and read back by the combine (none with one
// split: the split kernel writes O); lse written.
double decode_bytes(const AttnProblem& p, int splits, int row_blocks);

}  // namespace attn::hbm
