// CPU tests: the fp64 reference, the cost model, validation and the registry, rung 06's
// tile layouts and the host model of its FP8 path (the pre-kernel, and the whole forward:
// where FP8's error comes from). No GPU needed.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <type_traits>

#include "05_fa2_reordered/fa2_ablation_tiles.h"
#include "05_fa2_reordered/fa2_decode.h"
#include "05_fa2_reordered/fa2_steps.h"
#include "05_fa2_reordered/fa2_tiles.h"
#include "06_fa3_hopper/fa3_fp8.h"
#include "06_fa3_hopper/swizzle.h"
#include "bench/harness.h"
#include "common/hbm_model.h"
#include "common/reference.h"
#include "common/stage.h"
#include "common/tolerance.h"
#include "ladder/registry.h"
#include "common/tile_order.h"
#include "tests/fp8_model.h"

using namespace attn;

namespace {

AttnProblem tiny(int Nq, int Nk, int d, bool causal = false, int H = 1, int Hkv = 1) {
  AttnProblem p;
  p.B = 1;
  p.H = H;
  p.Hkv = Hkv;
  p.Nq = Nq;
  p.Nk = Nk;
  p.d = d;
  p.causal = causal;
  return p;
}

HostInputs random_inputs(const AttnProblem& p, unsigned seed) {
  HostInputs in;
  auto fill = [&](std::vector<float>& v, int64_t n) {
    v.resize(n);
    for (auto& x : v) {
      seed = seed * 1664525u + 1013904223u;
      x = float(int(seed >> 9) % 2001 - 1000) / 500.f;
    }
  };
  fill(in.q, p.q_elems());
  fill(in.k, p.kv_elems());
  fill(in.v, p.kv_elems());
  return in;
}

}  // namespace

TEST(Reference, HandCheckedTwoKeys) {
  // One query, two keys, d = 1, scale 1: s = (q*k0, q*k1) = (0, ln 3) -> p = (1/4, 3/4).
  AttnProblem p = tiny(1, 2, 1);
  p.scale = 1.f;
  HostInputs in{{1.f}, {0.f, float(std::log(3.0))}, {4.f, 8.f}};
  ReferenceRows r = reference_rows(p, in, all_rows(p));
  EXPECT_NEAR(r.o[0], 0.25 * 4 + 0.75 * 8, 1e-6);
  EXPECT_NEAR(r.lse[0], std::log(1.0 + 3.0), 1e-6);
}

TEST(Reference, DefaultScaleIsInverseSqrtD) {
  AttnProblem p = tiny(1, 2, 4);
  HostInputs in{{1, 1, 1, 1}, {0, 0, 0, 0, 1, 1, 1, 1}, {0, 0, 0, 0, 1, 1, 1, 1}};
  // s = (0, 4 / sqrt(4)) = (0, 2): weight of key 1 = e^2 / (1 + e^2).
  ReferenceRows r = reference_rows(p, in, all_rows(p));
  double w1 = std::exp(2.0) / (1 + std::exp(2.0));
  for (int c = 0; c < 4; ++c) EXPECT_NEAR(r.o[c], w1, 1e-6);
}

TEST(Reference, ProbabilitiesSumToOne) {
  for (bool causal : {false, true}) {
    AttnProblem p = tiny(7, 11, 8, causal);
    HostInputs in = random_inputs(p, 3);
    for (int64_t i = 0; i < p.Nq; ++i) {
      std::vector<double> probs = reference_probs(p, in, {0, 0, i});
      double sum = 0;
      for (double x : probs) sum += x;
      EXPECT_NEAR(sum, 1.0, 1e-12) << "row " << i << (causal ? " causal" : "");
    }
  }
}

TEST(Reference, CausalIsBottomRightAligned) {
  // Nq = 2, Nk = 4: row 0 sees keys 0..2, row 1 sees keys 0..3.
  AttnProblem p = tiny(2, 4, 4, true);
  HostInputs in = random_inputs(p, 5);
  std::vector<double> row0 = reference_probs(p, in, {0, 0, 0});
  EXPECT_GT(row0[2], 0.0);
  EXPECT_EQ(row0[3], 0.0);
  std::vector<double> row1 = reference_probs(p, in, {0, 0, 1});
  EXPECT_GT(row1[3], 0.0);
  // Nq = Nk: the usual lower triangle.
  AttnProblem sq = tiny(3, 3, 4, true);
  HostInputs in2 = random_inputs(sq, 6);
  std::vector<double> r0 = reference_probs(sq, in2, {0, 0, 0});
  EXPECT_EQ(r0[1], 0.0);
  EXPECT_NEAR(r0[0], 1.0, 1e-12);
}

TEST(Reference, RowWithoutKeysIsZeroWithMinusInfLse) {
  // Nq = 4 > Nk = 2 causal: rows 0 and 1 see no key (last visible key = i - 2 < 0).
  AttnProblem p = tiny(4, 2, 4, true);
  HostInputs in = random_inputs(p, 7);
  ReferenceRows r = reference_rows(p, in, all_rows(p));
  for (int i = 0; i < 2; ++i) {
    EXPECT_TRUE(std::isinf(r.lse[i]) && r.lse[i] < 0) << "row " << i;
    for (int c = 0; c < 4; ++c) EXPECT_EQ(r.o[i * 4 + c], 0.0);
  }
  EXPECT_TRUE(std::isfinite(r.lse[2]));
}

TEST(Reference, GqaQueryHeadsShareTheirKvHead) {
  // H = 4, Hkv = 2: heads 0,1 read kv head 0; heads 2,3 read kv head 1. Give heads 0 and 1
  // (and 2 and 3) the same queries: their outputs must match; heads 0 and 2 must differ.
  AttnProblem p = tiny(3, 5, 4, false, 4, 2);
  HostInputs in = random_inputs(p, 9);
  int64_t head = int64_t(p.Nq) * p.d;
  std::copy(in.q.begin(), in.q.begin() + head, in.q.begin() + head);
  std::copy(in.q.begin(), in.q.begin() + head, in.q.begin() + 2 * head);
  ReferenceRows r = reference_rows(p, in, all_rows(p));
  for (int64_t x = 0; x < head; ++x) EXPECT_DOUBLE_EQ(r.o[x], r.o[head + x]);
  double diff = 0;
  for (int64_t x = 0; x < head; ++x) diff += std::fabs(r.o[x] - r.o[2 * head + x]);
  EXPECT_GT(diff, 1e-3);
}

TEST(Reference, SampledRowsCoverBothEnds) {
  AttnProblem p = tiny(1000, 1000, 8);
  p.H = 2;
  p.Hkv = 2;
  auto rows = sampled_rows(p, 64);
  ASSERT_EQ(rows.size(), 128u);
  EXPECT_EQ(rows.front().i, 0);
  EXPECT_EQ(rows[63].i, 999);
  for (auto& r : rows) EXPECT_LT(r.i, 1000);
  EXPECT_EQ(sampled_rows(tiny(17, 17, 8), 64).size(), 17u);
}

TEST(Reference, HalfPrecisionConversions) {
  EXPECT_EQ(bf16_to_float(0x3f80), 1.0f);
  EXPECT_EQ(bf16_to_float(0xc040), -3.0f);
  EXPECT_EQ(fp16_to_float(0x3c00), 1.0f);
  EXPECT_EQ(fp16_to_float(0xc200), -3.0f);
  EXPECT_EQ(fp16_to_float(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_TRUE(std::isinf(fp16_to_float(0x7c00)));
  EXPECT_TRUE(std::isnan(fp16_to_float(0xffff)));  // the poison pattern
  EXPECT_TRUE(std::isnan(bf16_to_float(0xffff)));
}

TEST(Reference, RelativeFrobenius) {
  double mx = 0;
  EXPECT_NEAR(rel_frobenius({3, 4}, {0, 5}, &mx), std::sqrt(9.0 + 1.0) / 5.0, 1e-12);
  EXPECT_EQ(mx, 3.0);
  EXPECT_TRUE(std::isinf(rel_frobenius({std::nan("")}, {1.0})));
}

// ---------------------------------------------------------------- cost model

TEST(HbmModel, FlopsCountVisiblePairs) {
  AttnProblem p = tiny(4, 4, 8);
  p.B = 2;
  p.H = 3;
  p.Hkv = 3;
  EXPECT_EQ(hbm::flops(p), 4.0 * 8 * 16 * 6);
  p.causal = true;  // 1 + 2 + 3 + 4 visible pairs
  EXPECT_EQ(hbm::flops(p), 4.0 * 8 * 10 * 6);
  AttnProblem r = tiny(2, 4, 8, true);  // bottom-right: rows see 3 and 4 keys
  EXPECT_EQ(hbm::visible_pairs(r), 7.0);
  AttnProblem w = tiny(4, 2, 8, true);  // rows see 0, 0, 1, 2 keys
  EXPECT_EQ(hbm::visible_pairs(w), 3.0);
}

TEST(HbmModel, ScorePipelineBytes) {
  AttnProblem p = tiny(128, 256, 64);  // bf16, e = 2
  double S = 128.0 * 256;
  EXPECT_EQ(hbm::softmax_bytes(p, 3), 4 * S * 3 + 2 * S);
  double qkvo = 2.0 * (128 * 64 + 256 * 64 + 256 * 64 + 128 * 64);
  EXPECT_EQ(hbm::score_pipeline_bytes(p, 2), qkvo + 4 * S + 2 * S + (4 * S * 2 + 2 * S));
  EXPECT_EQ(hbm::min_bytes(p), qkvo);
  // FP8: the rung quantizing bf16 inputs reads them as bf16; 06_fp8_e4m3 reads e4m3. O is bf16.
  AttnProblem f = p;
  f.dtype = DType::fp8_e4m3;
  EXPECT_EQ(hbm::min_bytes(f), qkvo);
  f.dtype = DType::e4m3;
  EXPECT_EQ(hbm::min_bytes(f), 1.0 * (128 * 64 + 256 * 64 + 256 * 64) + 2.0 * 128 * 64);
  AttnProblem c = tiny(4, 4, 64, true);  // 10 visible of 16 scores: masked ones are not read
  EXPECT_EQ(hbm::softmax_bytes(c, 2), 4.0 * 10 * 2 + 2.0 * 16);
}

TEST(HbmModel, FusedRowwiseRereadsKvPerRow) {
  AttnProblem p = tiny(100, 200, 64);
  EXPECT_EQ(hbm::fused_rowwise_bytes(p), 2.0 * (2 * 100 * 64 + 2.0 * 64 * 100 * 200));
}

TEST(HbmModel, Fa2ReadsKvOncePerQueryBlock) {
  AttnProblem p = tiny(256, 512, 64);
  // 2 Q blocks of 128, each reads all 512 K and V rows.
  EXPECT_EQ(hbm::fa2_bytes(p, 128, 64), 2.0 * 2 * 256 * 64 + 4.0 * 256 + 2.0 * 2 * 64 * (2 * 512));
  p.causal = true;  // Nq != Nk: block 0 (rows 0..127) sees keys up to 127 + 256 = 383 -> 384 keys
  EXPECT_EQ(hbm::keys_loaded(p, 0, 128, 64), 384);
  EXPECT_EQ(hbm::keys_loaded(p, 128, 256, 64), 512);
  EXPECT_EQ(hbm::fa2_bytes(p, 128, 64), 2.0 * 2 * 256 * 64 + 4.0 * 256 + 2.0 * 2 * 64 * (384 + 512));
}

TEST(HbmModel, Fa2BackwardReadsKvOncePerKvHeadAndQiOncePerPair) {
  // H = 2 over Hkv = 1, Nq = Nk = 256, d = 64, bf16; Q blocks of 64 rows, K/V blocks of 128.
  AttnProblem p = tiny(256, 256, 64, false, 2, 1);
  const double pre = 2 * 256 * (2.0 * 2 * 64 + 4 + 4 * 64);  // O, dO read; D written; dQ_acc = 0
  const double kv = 1 * 256 * 64 * 2.0 * 4;                  // K, V read; dK, dV written
  const double per_row = 2.0 * 2 * 64 + 8 + 8 * 64;          // Q_i, dO_i; L_i, D_i; dQ_acc +=
  const double post = 2 * 256 * 64 * (4.0 + 2);              // dQ_acc read, dQ written
  // Without a mask every Q block meets both K/V blocks: 256 rows x 2 per query head.
  EXPECT_EQ(hbm::fa2_backward_bytes(p, 64, 128), pre + kv + 2 * 256 * 2 * per_row + post);
  // Causal: the Q blocks of rows 0-63 and 64-127 see K/V block 0 only, 128-255 both.
  p.causal = true;
  EXPECT_EQ(hbm::fa2_backward_bytes(p, 64, 128), pre + kv + 2 * 64 * (1 + 1 + 2 + 2) * per_row + post);
  // Two partials of each dQ_i per pair (06e, 06f: one per consumer warpgroup): twice the adds.
  EXPECT_EQ(hbm::fa2_backward_bytes(p, 64, 128, 2) - hbm::fa2_backward_bytes(p, 64, 128),
            2 * 64 * (1 + 1 + 2 + 2) * 8.0 * 64);
}

TEST(HbmModel, Fa1GrowsAsNSquaredD2OverM) {
  AttnProblem p = tiny(1024, 1024, 64);
  double small_blocks = hbm::fa1_bytes(p, 32, 32), big_blocks = hbm::fa1_bytes(p, 32, 128);
  // Q/O/l/m traffic is proportional to T_c = Nk / Bc: 4x larger Bc, ~4x fewer inner bytes.
  EXPECT_GT(small_blocks / big_blocks, 3.0);
  // Exact value for one K/V block and one Q block.
  AttnProblem q = tiny(16, 16, 8);
  double inner = 16 * (2.0 * 8 + 2 * 4 * 8 + 16);
  double expect = inner + 2 * 2 * 16 * 8 + 16 * (4 * 8 + 8) + 16 * (4 * 8 + 8 + 4 + 2 * 8);
  EXPECT_EQ(hbm::fa1_bytes(q, 16, 16), expect);
}

TEST(HbmModel, DecodeReadsKvOncePerKvHead) {
  // B = 2, H = 8 query heads over Hkv = 2, Nq = 1, Nk = 1000, d = 64, bf16, 4 splits.
  AttnProblem p = tiny(1, 1000, 64, false, 8, 2);
  p.B = 2;
  const double rows = 2 * 8 * 1;
  const double kv = 2.0 * 2 * (2 * 2 * 1000 * 64);  // K and V, 2 bytes, once per (batch, KV head)
  const double expect = 2.0 * 2 * rows * 64 /* Q, O */ + kv + 2.0 * 4 * rows * 4 * 65 /* partials */ + 4 * rows;
  EXPECT_EQ(hbm::decode_bytes(p, 4, 1), expect);
  // Against FA2's model, which counts K and V per query head: 4x less at group 4.
  const double fa2_kv = hbm::fa2_bytes(p, 128, 64) - (2.0 * 2 * rows * 64 + 4 * rows);
  EXPECT_EQ(fa2_kv, 4 * kv);
  // Two row blocks stream K and V twice.
  EXPECT_EQ(hbm::decode_bytes(p, 4, 2) - hbm::decode_bytes(p, 4, 1), kv);
  // One split: no partials, the split kernel writes O.
  EXPECT_EQ(hbm::decode_bytes(p, 1, 1), 2.0 * 2 * rows * 64 + kv + 4 * rows);
}

// Device models of the two Hopper parts the decode stage is measured on: what
// cudaDeviceGetAttribute gives (SMs, shared memory; bandwidth = 2 x memory clock x bus width
// / 8), nothing keyed by name.
attn::fa2::DecodeDevice h100_like() {
  attn::fa2::DecodeDevice dev;
  dev.sm_count = 132;
  dev.bandwidth = 2.0 * 2619e6 * 5120 / 8;  // HBM3: 2619 MHz, 5120-bit bus: 3.35 TB/s
  dev.smem_per_sm = 233472;
  dev.smem_per_block = 232448;
  dev.smem_reserved_per_block = 1024;
  dev.latency_s = attn::fa2::kDecodeLoadedLatencyNs * 1e-9;
  return dev;
}
attn::fa2::DecodeDevice h200_like() {
  attn::fa2::DecodeDevice dev = h100_like();
  dev.bandwidth = 2.0 * 3201e6 * 6144 / 8;  // HBM3e: 3201 MHz, 6144-bit bus: 4.92 TB/s
  return dev;
}

TEST(Fa2Decode, LittlesLawSetsBytesInFlightAndCtasPerSm) {
  using namespace attn::fa2;
  const DecodeDevice h100 = h100_like(), h200 = h200_like();
  // bandwidth x latency / SMs: 3.35e12 B/s x 2 us / 132 = 50.8 kB; 4.92e12 x 2 us / 132 = 74.5 kB.
  EXPECT_NEAR(h100.bytes_in_flight_per_sm(), 3.35232e12 * 2e-6 / 132, 1.0);
  EXPECT_NEAR(h200.bytes_in_flight_per_sm(), 4.916736e12 * 2e-6 / 132, 1.0);
  // The narrow tile at d = 128 keeps (stages - 1) x 32 kB (K_j + V_j: 2 x 64 x 128 x 2 B) ahead.
  // H100: one CTA with a 3-stage ring (64 kB) is enough. H200: 64 kB is not; two CTAs per SM
  // (two fit: 2 x (102.5 + 1) kB of 228) keep 128 kB.
  int stages = 0, ctas = 0;
  decode_pipeline(h100, 128, true, stages, ctas);
  EXPECT_EQ(stages, 3);
  EXPECT_EQ(ctas, 1);
  decode_pipeline(h200, 128, true, stages, ctas);
  EXPECT_EQ(stages, 3);
  EXPECT_EQ(ctas, 2);
  EXPECT_EQ(h200.ctas_per_sm(decode_smem_bytes(128, 16, 3)), 2);
  EXPECT_EQ(h200.ctas_per_sm(decode_smem_bytes(128, 16, 4)), 1);
  // Where one 3-stage CTA fills an SM's shared memory (an sm_80-like 164 kB) and 64 kB is too
  // little, the ring deepens: 4 stages keep 96 kB.
  DecodeDevice small_smem = h200;
  small_smem.smem_per_sm = 167936;
  small_smem.smem_per_block = 166912;
  decode_pipeline(small_smem, 128, true, stages, ctas);
  EXPECT_EQ(stages, 4);
  EXPECT_EQ(ctas, 1);
  // Nothing reaches it (a latency of 10 us): the most bytes that fit, 2 CTAs x 2 blocks.
  DecodeDevice slow = h200;
  slow.latency_s = 10e-6;
  decode_pipeline(slow, 128, true, stages, ctas);
  EXPECT_EQ(stages, 3);
  EXPECT_EQ(ctas, 2);
  // The wide tile (2 stages, 32 kB per CTA): two CTAs per SM on both.
  decode_pipeline(h100, 128, false, stages, ctas);
  EXPECT_EQ(stages, 2);
  EXPECT_EQ(ctas, 2);
  // d = 64: blocks of 16 kB; H100 needs 4 of them, two 3-stage CTAs.
  decode_pipeline(h100, 64, true, stages, ctas);
  EXPECT_EQ(stages, 3);
  EXPECT_EQ(ctas, 2);
}

TEST(Fa2Decode, SplitsFillWholeWavesWithEnoughKeysEach) {
  using namespace attn::fa2;
  const DecodeDevice h100 = h100_like(), h200 = h200_like();
  // The narrow tile holds 16 rows of Q and a 3-stage ring: two fit in an SM at d = 128.
  EXPECT_LE(2 * ((DecodeTileNarrow<128, 3>::kSmemBytes) + 1024), 228 * 1024);
  EXPECT_EQ((DecodeTileNarrow<128, 4>::kSmemBytes), decode_smem_bytes(128, 16, 4));
  EXPECT_EQ(DecodeTileWide<64>::kSmemBytes, decode_smem_bytes(64, 64, 2));
  AttnProblem p = tiny(1, 65536, 128, false, 32, 8);
  DecodeSplit s = decode_split(p, h100);
  EXPECT_EQ(s.rows, 4);
  EXPECT_TRUE(s.narrow);
  EXPECT_EQ(s.row_blocks, 1);
  // B * Hkv = 8 CTAs without a split; on the H100 a wave is one CTA per SM: 16 splits of 4096
  // keys make 128 CTAs on 132 SMs (17 would make 136, a wave and a bit).
  EXPECT_EQ(s.splits, 16);
  EXPECT_EQ(s.keys_per_split, 4096);
  EXPECT_EQ(s.keys_per_split % kDecodeBc, 0);
  EXPECT_GE(s.keys_per_split, kDecodeMinSplitKeys);
  EXPECT_LT(int64_t(s.splits - 1) * s.keys_per_split, p.Nk);  // every split has keys
  EXPECT_GE(int64_t(s.splits) * s.keys_per_split, p.Nk);      // and together all of them
  // On the H200 a wave is two CTAs per SM, 264: at Nk = 128k, 32 splits of 4096 keys make
  // 256 (the H100 keeps 16 of 8192).
  p.Nk = 131072;
  EXPECT_EQ(decode_split(p, h200).splits, 32);
  EXPECT_EQ(decode_split(p, h200).keys_per_split, 4096);
  EXPECT_EQ(decode_split(p, h100).splits, 16);
  p.Nk = 65536;
  // A wave lasts as long as its longest CTA: 31 splits (248 CTAs) would fill the wave as well,
  // but with 2176 keys each (the 31st gets 224); 32 splits of 2048 finish 6 % sooner.
  EXPECT_EQ(decode_split(p, h200).splits, 32);
  EXPECT_EQ(decode_split(p, h200).keys_per_split, 2048);
  // B = 8: 64 CTAs; 2 splits make 128, one H100 wave; 4 make 256, one H200 wave.
  p.B = 8;
  EXPECT_EQ(decode_split(p, h100).splits, 2);
  EXPECT_EQ(decode_split(p, h200).splits, 4);
  // B = 32: 256 CTAs are a full wave (H200) or two (H100) unsplit, and one split writes O
  // itself: no workspace.
  p.B = 32;
  EXPECT_EQ(decode_split(p, h100).splits, 1);
  EXPECT_EQ(decode_split(p, h200).splits, 1);
  EXPECT_EQ(decode_workspace_bytes(p, decode_split(p, h100)), 0u);
  // Short K: at least kDecodeMinSplitKeys keys per split; Nk < that: one split.
  p.B = 1;
  p.Nk = 4096;
  EXPECT_EQ(decode_split(p, h100).splits, 4096 / kDecodeMinSplitKeys);
  for (int nk : {1, 17, 255}) {
    p.Nk = nk;
    EXPECT_EQ(decode_split(p, h100).splits, 1) << nk;
  }
  // A batch that fills the GPU by itself: no split.
  p.B = 256;
  p.Nk = 100003;
  EXPECT_EQ(decode_split(p, h100).splits, 1);
  // Nq = 64 and 8 heads per KV head: 512 packed rows, the wide tile, 8 row blocks.
  AttnProblem q = tiny(64, 4097, 64, true, 8, 1);
  DecodeSplit t = decode_split(q, h100);
  EXPECT_EQ(t.rows, 512);
  EXPECT_FALSE(t.narrow);
  EXPECT_EQ(t.row_blocks, 8);
  EXPECT_EQ(t.stages, kDecodeWideStages);
  EXPECT_EQ(decode_workspace_bytes(q, t), t.splits > 1 ? size_t(8) * 64 * t.splits * 65 * 4 : 0u);
  for (int nk : {1, 17, 4097, 100003}) {  // the tests' Nk: splits cover the keys exactly
    q.Nk = nk;
    for (const DecodeDevice& dev : {h100, h200}) {
      t = decode_split(q, dev);
      EXPECT_LT(int64_t(t.splits - 1) * t.keys_per_split, nk);
      EXPECT_GE(int64_t(t.splits) * t.keys_per_split, nk);
    }
  }
  // Nq = 4 at group 4 is 16 rows: still narrow; Nq = 5 is not.
  AttnProblem r = tiny(4, 16384, 128, true, 32, 8);
  EXPECT_TRUE(decode_split(r, h100).narrow);
  r.Nq = 5;
  EXPECT_FALSE(decode_split(r, h100).narrow);
}

TEST(Fa2Decode, PagedWorkspaceAndErrorMessages) {
  using namespace attn::fa2;
  // The shifts the kernel takes for the page size and H_kv: -1 where it must divide.
  EXPECT_EQ(shift_for(1), 0);
  EXPECT_EQ(shift_for(64), 6);
  EXPECT_EQ(shift_for(1 << 16), 16);
  for (int n : {0, -8, 3, 48, 100}) EXPECT_EQ(shift_for(n), -1) << n;
  AttnProblem p = tiny(1, 64 * 100, 128, false, 32, 8);  // capacity: 100 pages of 64
  const DecodeSplit s = decode_split(p, h100_like());
  EXPECT_EQ(decode_paged_workspace_bytes(p, s), paged_header_bytes(p.B, s.splits) + decode_workspace_bytes(p, s));
  for (int B : {1, 3, 32, 1000})  // one record per (sequence, split), the partials 256-byte aligned after them
    for (int splits : {1, 7, 16}) {
      EXPECT_GE(paged_header_bytes(B, splits), size_t(B) * splits * sizeof(PagedErrorWord));
      EXPECT_EQ(paged_header_bytes(B, splits) % 256, 0u);
    }
  const PagedErrorWord records[] = {{0, 0, -1, 5}, {0, 0, -1, 5}, {kPageOutOfRange, 1, 4, -2}, {kBadLength, 2, -1, -1}};
  EXPECT_EQ(first_paged_error(records, 2).flags, 0);  // none among the first two
  EXPECT_EQ(first_paged_error(records, 4).position, 4);  // the first fault in (b, split) order
  EXPECT_EQ(paged_error_message(PagedErrorWord{0, 0, 0, 0}, 64, 100, 500), "");
  EXPECT_NE(paged_error_message(PagedErrorWord{kBadLength, 3, -1, -5}, 64, 100, 500).find("seq_lens[3] = -5 is negative"),
            std::string::npos);
  EXPECT_NE(paged_error_message(PagedErrorWord{kLengthBeyondPages, 1, -1, 6401}, 64, 100, 500)
                .find("seq_lens[1] = 6401 is beyond the 100 pages of 64 tokens"),
            std::string::npos);
  EXPECT_NE(paged_error_message(PagedErrorWord{kPageOutOfRange, 2, 7, 500}, 64, 100, 500)
                .find("block_table[2][7] = 500 is not a page index in [0, 500)"),
            std::string::npos);
}

TEST(Fa2Decode, RefusesMoreQueryRowsThanItTakes) {
  const Stage& s = find_stage("05_fa2_decode");
  AttnProblem p = tiny(fa2::kDecodeMaxNq, 4096, 128, true, 32, 8);
  EXPECT_NO_THROW(validate_problem(s, p));
  EXPECT_GT(s.workspace(p), 0u);
  p.Nq = fa2::kDecodeMaxNq + 1;
  try {
    validate_problem(s, p);
    ADD_FAILURE() << "accepted " << p.describe();
  } catch (const AttnError& e) {
    EXPECT_NE(std::string(e.what()).find("use 05_fa2_reordered"), std::string::npos) << e.what();
  }
  EXPECT_EQ(s.workspace(p), 0u);  // asked about a refused problem: no workspace, no overflow
  // The combine runs one CTA per query row: more rows than a grid holds are refused up front.
  AttnProblem big = tiny(64, 4096, 128, false, 64, 1);
  big.B = 1 << 20;  // 2^20 * 64 heads * 64 rows = 2^32 rows
  EXPECT_NE(s.refuse(big).find("rows exceed the grid"), std::string::npos) << s.refuse(big);
  big.B = 1 << 10;
  EXPECT_EQ(s.refuse(big), "");
}

// ---------------------------------------------------------------- validation and registry

TEST(Registry, NamesUniqueAndChainResolves) {
  std::set<std::string> seen;
  ASSERT_FALSE(registry().empty());
  for (const Stage& s : registry()) {
    EXPECT_TRUE(seen.insert(s.name).second) << "duplicate rung " << s.name;
    if (!s.prev.empty()) {
      EXPECT_TRUE(seen.count(s.prev)) << s.name << ": prev '" << s.prev << "' is not an earlier rung";
    }
    EXPECT_TRUE(bool(s.launch)) << s.name;
    EXPECT_TRUE(bool(s.model_hbm_bytes)) << s.name;
    EXPECT_FALSE(s.dtypes.empty()) << s.name;
    EXPECT_FALSE(s.head_dims.empty()) << s.name;
  }
}

TEST(Registry, UnknownNameListsTheRungs) {
  try {
    find_stage("07_nope");
    FAIL() << "expected AttnError";
  } catch (const AttnError& e) {
    EXPECT_NE(std::string(e.what()).find(registry().front().name), std::string::npos) << e.what();
  }
}

TEST(Validation, BadProblemsAreRefusedWithReasons) {
  for (const Stage& s : registry()) {
    AttnProblem ok = tiny(17, 17, s.head_dims.front());
    ok.dtype = s.dtypes.front();
    EXPECT_NO_THROW(validate_problem(s, ok)) << s.name;
    auto refused = [&](AttnProblem p, const std::string& needle) {
      try {
        validate_problem(s, p);
        ADD_FAILURE() << s.name << " accepted " << p.describe();
      } catch (const AttnError& e) {
        EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      }
    };
    AttnProblem p = ok;
    p.d = 80;
    refused(p, "head dim d = 80");
    p = ok;
    p.Nq = 0;
    refused(p, ">= 1");
    p = ok;
    p.H = 4;
    p.Hkv = 3;
    refused(p, "does not divide");
    p = ok;
    p.dtype = DType::fp8_e4m3;
    if (!s.supports(DType::fp8_e4m3)) refused(p, "dtype fp8");
  }
}

TEST(Validation, NullPointersAndMissingWorkspace) {
  for (const Stage& s : registry()) {
    AttnProblem p = tiny(17, 17, s.head_dims.front());
    p.dtype = s.dtypes.front();
    alignas(16) int dummy = 0;  // the library refuses pointers that are not 16-byte aligned
    float descale = 1.f;
    AttnTensors t{&dummy, &dummy, &dummy, &dummy};
    t.q_descale = t.k_descale = t.v_descale = &descale;  // read by e4m3 inputs only
    std::vector<char> ws(s.workspace(p));
    t.workspace = ws.data();
    t.workspace_bytes = ws.size();
    EXPECT_NO_THROW(validate_tensors(s, p, t)) << s.name;
    AttnTensors no_q = t;
    no_q.q = nullptr;
    EXPECT_THROW(validate_tensors(s, p, no_q), AttnError) << s.name;
    AttnTensors no_o = t;
    no_o.o = nullptr;
    EXPECT_THROW(validate_tensors(s, p, no_o), AttnError) << s.name;
    if (s.workspace(p) > 0) {
      AttnTensors no_ws = t;
      no_ws.workspace_bytes = 0;
      EXPECT_THROW(validate_tensors(s, p, no_ws), AttnError) << s.name;
    }
  }
}

TEST(Validation, DtypeNames) {
  EXPECT_EQ(parse_dtype("bf16"), DType::bf16);
  EXPECT_EQ(parse_dtype("fp16"), DType::fp16);
  EXPECT_THROW(parse_dtype("fp32"), AttnError);
}

// ---------------------------------------------------------------- rung 05: shared-memory tiles
// fa2::tile_offset, the layout every cp.async, ldmatrix and O store of 05 goes through: each
// row's chunks are a permutation of the row's slots; the 8 rows an ldmatrix 8x8 matrix reads
// hit 8 different bank groups; a swizzled chunk stays in its unswizzled 128-byte line (so a
// 128-byte piece of a global row lands in one line). And fa2::frag_addr, which the ldmatrix
// of every fragment goes through, finds each fragment from a lane's own chunk.

namespace {

template <class Cfg>
void expect_fa2_tile_layout(const char* name) {
  SCOPED_TRACE(name);
  constexpr int kChunks = Cfg::kD / fa2::kChunkElems, kBytes = Cfg::kElemBytes;
  for (int row = 0; row < 24; ++row) {
    std::set<int> slots;
    for (int c = 0; c < kChunks; ++c) {
      const int off = fa2::tile_offset<Cfg>(row, c) - row * Cfg::kStride;
      ASSERT_EQ(off % fa2::kChunkElems, 0);
      ASSERT_GE(off, 0);
      ASSERT_LT(off, Cfg::kD) << "row " << row << " chunk " << c << " leaves its row";
      slots.insert(off);
      if (std::is_same_v<typename Cfg::Layout, fa2::SwizzledRows<Cfg::kD>>) {
        const uint32_t plain = uint32_t((row * Cfg::kStride + c * fa2::kChunkElems) * kBytes);
        const uint32_t stored = uint32_t(fa2::tile_offset<Cfg>(row, c) * kBytes);
        EXPECT_EQ(stored / 128, plain / 128) << "row " << row << " chunk " << c << " leaves its 128-byte line";
      }
    }
    EXPECT_EQ(int(slots.size()), kChunks) << "row " << row << ": two chunks share a slot";
  }
  for (int row0 = 0; row0 < 24; row0 += 8)
    for (int c = 0; c < kChunks; ++c) {
      std::set<int> bank_groups;  // 16-byte bank groups of the 8 rows of one ldmatrix 8x8 matrix
      for (int r = row0; r < row0 + 8; ++r) bank_groups.insert(fa2::tile_offset<Cfg>(r, c) * kBytes / 16 % 8);
      EXPECT_EQ(int(bank_groups.size()), 8) << "rows " << row0 << "-" << row0 + 7 << ", chunk " << c << ": bank conflict";
    }
  // A lane's chunk is chunk 0 or 1 of any row; its fragments lie whole 8-row groups and 16-column steps away.
  for (int row = 0; row < 16; ++row)
    for (int c = 0; c < 2; ++c)
      for (int rows = 0; rows <= 56; rows += 8)
        for (int k16 = 0; k16 < Cfg::kD / 16; ++k16) {
          const uint32_t lane = uint32_t(fa2::tile_offset<Cfg>(row, c) * kBytes);
          const uint32_t want = uint32_t(fa2::tile_offset<Cfg>(row + rows, c + 2 * k16) * kBytes);
          ASSERT_EQ(fa2::frag_addr<Cfg>(lane, rows, k16), want)
              << "lane row " << row << " chunk " << c << ", +" << rows << " rows, k16 " << k16;
        }
}

}  // namespace

TEST(Fa2Layout, TilesArePermutationsFreeOfBankConflicts) {
  using fa2::Ablation;
  expect_fa2_tile_layout<fa2::TileFor<64>>("TileFor<64> (swizzled)");
  expect_fa2_tile_layout<fa2::TileFor<128>>("TileFor<128> (swizzled)");
  expect_fa2_tile_layout<fa2::TileFor<256>>("TileFor<256> (swizzled)");
  expect_fa2_tile_layout<fa2::AblationTileFor<Ablation::padded, 64>>("padded, d = 64");
  expect_fa2_tile_layout<fa2::AblationTileFor<Ablation::padded, 128>>("padded, d = 128");
  expect_fa2_tile_layout<fa2::AblationTileFor<Ablation::warps_split_kv, 128>>("split-K, d = 128 (padded)");
  expect_fa2_tile_layout<fa2::AblationTileFor<Ablation::prefetch, 256>>("prefetch, d = 256 (swizzled)");
  static_assert(fa2::TileFor<128>::kStride == 128 && fa2::AblationTileFor<Ablation::padded, 128>::kStride == 136,
                "the layouts the README describes");
  // The steps that build 05 up (fa2_steps.h).
  expect_fa2_tile_layout<fa2::step_a::TileFor<64>>("05a, d = 64 (padded)");
  expect_fa2_tile_layout<fa2::step_a::TileFor<128>>("05a, d = 128 (padded)");
  expect_fa2_tile_layout<fa2::step_b::TileFor<64>>("05b, d = 64 (swizzled)");
  expect_fa2_tile_layout<fa2::step_b::TileFor<128>>("05b, d = 128 (swizzled)");
  expect_fa2_tile_layout<fa2::step_c::TileFor<128>>("05c, d = 128 (swizzled)");
}

// 05a reads its mma fragments with 32-bit shared loads from padded rows: lane (g, t) reads
// the word at row g, column 2t (+ a whole 8-row group and a 16-column step), Q_i and K_j's
// A/B fragments; V_j's B fragment reads 16-bit halves of rows 2t, 2t + 1, column g. Each
// such warp-wide load reads at most one distinct word per bank (05a.md).
template <class Cfg>
void expect_step_a_conflict_free(const char* name) {
  SCOPED_TRACE(name);
  constexpr int kBytes = Cfg::kElemBytes;
  for (int rows = 0; rows <= 24; rows += 8)
    for (int cols = 0; cols < Cfg::kD; cols += 8) {
      std::map<int, std::set<int>> words_of_bank;  // bank -> distinct words the warp reads in it
      std::map<int, std::set<int>> v_words_of_bank[2];  // one load per row of the pair
      for (int lane = 0; lane < 32; ++lane) {
        const int g = lane / 4, t = lane % 4;
        const int word = ((g + rows) * Cfg::kStride + cols + 2 * t) * kBytes / 4;
        words_of_bank[word % 32].insert(word);
        for (int r = 0; r < 2; ++r) {  // V_j: rows 2t + r, column g
          const int v_word = ((2 * t + r + rows) * Cfg::kStride + cols + g) * kBytes / 4;
          v_words_of_bank[r][v_word % 32].insert(v_word);
        }
      }
      for (const auto& [bank, words] : words_of_bank)
        EXPECT_EQ(words.size(), 1u) << "Q/K loads, +" << rows << " rows, +" << cols << " cols: bank " << bank;
      for (int r = 0; r < 2; ++r)
        for (const auto& [bank, words] : v_words_of_bank[r])
          EXPECT_EQ(words.size(), 1u) << "V loads, row 2t + " << r << ", +" << rows << " rows: bank " << bank;
    }
}

TEST(Fa2Layout, Step05aPaddedRowsServe32BitFragmentLoads) {
  expect_step_a_conflict_free<fa2::step_a::TileFor<64>>("05a, d = 64");
  expect_step_a_conflict_free<fa2::step_a::TileFor<128>>("05a, d = 128");
  static_assert(fa2::step_a::TileFor<128>::kStride == 136 && fa2::step_b::TileFor<128>::kStride == 128 &&
                    fa2::step_c::TileFor<128>::kStages == 2 && fa2::step_b::TileFor<128>::kStages == 1 &&
                    fa2::step_a::TileFor<64>::kBr == fa2::step_b::TileFor<64>::kBr &&
                    fa2::step_a::TileFor<128>::kBc == fa2::step_b::TileFor<128>::kBc &&
                    fa2::step_c::TileFor<128>::kBr == fa2::TileFor<128>::kBr,
                "the layouts, buffers and tiles 05a.md, 05b.md and 05c.md describe");
}

// ---------------------------------------------------------------- rung 06: tile layouts and the FP8 pre-kernel model
// The layout arithmetic the kernels use (06_fa3_hopper/swizzle.h, Fp8Layout in fa3_fp8.h),
// checked against a model of what TMA writes and what wgmma reads.

namespace {

using hopper::Swizzle;

// Where byte `offset` of a tile (base on a whole atom) really lies: TMA and wgmma both XOR
// bits [4, 4+b) of the shared-memory address with bits [7, 7+b), b = log2(row_bytes / 16).
uint32_t swizzled(uint32_t offset, Swizzle s) {
  const uint32_t mask = uint32_t(hopper::row_bytes(s) / 16 - 1);
  return offset ^ (((offset >> 7) & mask) << 4);
}

// TMA: byte `col` of row `row` of a [rows][row_len] tile loaded as column chunks of one
// swizzle row each, the chunks' boxes stored one after another.
uint32_t tma_byte(int row, int col, int rows, Swizzle s) {
  const int rb = hopper::row_bytes(s);
  return swizzled(uint32_t((col / rb) * rows * rb + row * rb + col % rb), s);
}

// wgmma, K-major operand: byte k of row m in the K step whose descriptor starts at `start`
// with stride byte offset `sbo`: rows row_bytes apart inside an 8-row group, groups SBO
// apart, then the swizzle on the address.
uint32_t wgmma_byte(uint32_t start, uint32_t sbo, int m, int k, Swizzle s) {
  return swizzled(start + uint32_t(m / 8) * sbo + uint32_t(m % 8) * hopper::row_bytes(s) + uint32_t(k), s);
}

// Every byte every K step reads is the byte TMA stored for that (row, column).
void expect_kmajor_tile_consistent(const char* what, int row_len, int rows, int step_bytes, uint32_t sbo, Swizzle s) {
  SCOPED_TRACE(what);
  ASSERT_EQ(row_len % hopper::row_bytes(s), 0) << "rows are whole swizzle rows";
  for (int kk = 0; kk < row_len / step_bytes; ++kk) {
    const uint32_t start = hopper::kmajor_step_offset(kk, step_bytes, rows, s);
    for (int m = 0; m < rows; ++m)
      for (int k = 0; k < step_bytes; ++k)
        ASSERT_EQ(wgmma_byte(start, sbo, m, k, s), tma_byte(m, kk * step_bytes + k, rows, s))
            << "K step " << kk << ", row " << m << ", byte " << k;
  }
}

template <int D>
void expect_fp8_layout_consistent() {
  using L = fa3::Fp8Layout<D>;
  SCOPED_TRACE("fp8 d = " + std::to_string(D));
  expect_kmajor_tile_consistent("Q̂_i", D, 64, L::kK, L::kAtomBytes, L::kSwizzle);
  expect_kmajor_tile_consistent("K̂_j", D, L::B_c, L::kK, L::kAtomBytes, L::kSwizzle);
  // V̂ᵀ chunks are kPvCols rows apart (d, or d + 8 with the row-sum column's rows after V's).
  expect_kmajor_tile_consistent("V̂_jᵀ", L::B_c, L::kPvCols, L::kK, L::kVtAtomBytes, L::kVtSwizzle);
}

}  // namespace

TEST(Swizzle, DescriptorFields) {
  // 64B swizzle, SBO = one 512-byte atom: layout type 2 in bits 62-63, offsets >> 4.
  const uint64_t d64 = hopper::encode_smem_desc(0x10400, 16, 512, Swizzle::b64);
  EXPECT_EQ(d64 & 0x3FFF, 0x10400u >> 4);
  EXPECT_EQ((d64 >> 16) & 0x3FFF, 1u);
  EXPECT_EQ((d64 >> 32) & 0x3FFF, 32u);
  EXPECT_EQ((d64 >> 49) & 7, 0u);  // base offset: tiles start on whole atoms
  EXPECT_EQ(d64 >> 62, 2u);
  const uint64_t d128 = hopper::encode_smem_desc(0x10400, 16, 1024, Swizzle::b128);
  EXPECT_EQ((d128 >> 32) & 0x3FFF, 64u);
  EXPECT_EQ(d128 >> 62, 1u);
  EXPECT_EQ(hopper::atom_bytes(Swizzle::b64), 512);
  EXPECT_EQ(hopper::atom_bytes(Swizzle::b128), 1024);
}

TEST(Swizzle, Fp8TileLayoutsPerHeadDim) {
  // d = 64: a Q̂ or K̂ row is 64 bytes, one 64-byte swizzle row; Vᵀ keeps 128-byte rows.
  using L64 = fa3::Fp8Layout<64>;
  EXPECT_EQ(L64::kSwizzle, Swizzle::b64);
  EXPECT_EQ(L64::kChunks, 1);
  EXPECT_EQ(L64::kAtomBytes, 512);
  EXPECT_EQ(L64::kVtSwizzle, Swizzle::b128);
  EXPECT_EQ(hopper::kmajor_step_offset(1, 32, 64, Swizzle::b64), 32u);  // second K step: same row
  EXPECT_EQ(fa3::Fp8Layout<128>::kSwizzle, Swizzle::b128);
  EXPECT_EQ(fa3::Fp8Layout<256>::kChunks, 2);
  EXPECT_EQ(hopper::kmajor_step_offset(4, 32, 128, Swizzle::b128), 128u * 128);  // d = 256: next chunk
  // d = 128: B_c = 192 keys, so V̂ᵀ rows are three 64-byte column chunks (64B swizzle).
  using L128 = fa3::Fp8Layout<128>;
  EXPECT_EQ(L128::B_c, 192);
  EXPECT_EQ(L128::kVtSwizzle, Swizzle::b64);
  EXPECT_EQ(L128::kVtChunks, 3);
  EXPECT_EQ(hopper::kmajor_step_offset(2, 32, 128, Swizzle::b64), 128u * 64);  // third K step: second chunk
  // The row-sum column: P V has N = d + 8 where that is a QGMMA shape (N <= 256), and the 8
  // constant rows start a swizzle atom of every chunk, so the swizzle leaves them whole rows.
  EXPECT_TRUE(L64::kRowSumColumn);
  EXPECT_EQ(L64::kPvCols, 72);
  EXPECT_TRUE(L128::kRowSumColumn);
  EXPECT_EQ(L128::kPvCols, 136);
  EXPECT_FALSE(fa3::Fp8Layout<256>::kRowSumColumn);
  EXPECT_EQ(fa3::Fp8Layout<256>::kPvCols, 256);
  EXPECT_EQ(64 * hopper::row_bytes(L64::kVtSwizzle) % L64::kVtAtomBytes, 0);
  EXPECT_EQ(128 * hopper::row_bytes(L128::kVtSwizzle) % L128::kVtAtomBytes, 0);
  EXPECT_EQ(hopper::kmajor_step_offset(2, 32, L128::kPvCols, Swizzle::b64), 136u * 64);  // chunks 136 rows apart
}

TEST(Swizzle, WgmmaReadsWhatTmaWrote) {
  expect_fp8_layout_consistent<64>();
  expect_fp8_layout_consistent<128>();
  expect_fp8_layout_consistent<256>();
  // bf16/fp16 (06a-d): 128-byte rows of 64 elements, K steps of 16 elements = 32 bytes.
  for (int d : {64, 128, 256})
    for (int rows : {64, 80, 128, 176}) {
      SCOPED_TRACE("bf16 d = " + std::to_string(d) + ", rows = " + std::to_string(rows));
      expect_kmajor_tile_consistent("Q or K", 2 * d, rows, 32, 1024, Swizzle::b128);
    }
  // The model is not vacuous: the 128-byte atom's SBO on 64-byte rows reads other bytes.
  EXPECT_NE(wgmma_byte(0, 1024, 8, 0, Swizzle::b64), tma_byte(8, 0, 64, Swizzle::b64));
}

TEST(Fa3Budgets, ConsumersTakeOnlyWhatTheProducerGaveBack) {
  // 06d and FP8 as built: 24 + 2 x 240 with three warpgroups (launched at 168 each), 24 +
  // 3 x 160 with four (128 each).
  EXPECT_TRUE(fa3::setmaxnreg_budgets_fit(2, 24, 240));
  EXPECT_TRUE(fa3::setmaxnreg_budgets_fit(3, 24, 160));
  EXPECT_TRUE(fa3::setmaxnreg_budgets_fit(3, 32, 160));
  // A 32-register producer frees 136 x 128 registers, 1024 fewer than two 240-register
  // consumers add: within 64K, yet the consumers' setmaxnreg.inc would wait forever (seen
  // as a hang on an H100 before this rule was checked).
  static_assert(128 * (32 + 2 * 240) <= 65536, "the old check, register file size alone, passed it");
  EXPECT_FALSE(fa3::setmaxnreg_budgets_fit(2, 32, 240));
  EXPECT_TRUE(fa3::setmaxnreg_budgets_fit(2, 40, 232));
}

TEST(Fa3Instances, CtaPairsCodeOnlyWhere06dNeedsIt) {
  // 06d's own kernel carries the CTA pairs' code only at d = 256; at the other head dims
  // 06d_cta_pairs runs an instance of its own (06_fa3_hopper/CMakeLists.txt builds
  // 06d_cta_pairs.cu.in for those only, and stages.cu picks it).
  for (int d : fa3::kHeadDims) EXPECT_EQ(fa3::cta_pairs_code_in_06d(d), d == 256) << "d = " << d;
  // The pairs' build is 06d in everything else: the same head dims, the same tiles, so the
  // same modelled traffic.
  const Stage& fa3_06d = find_stage("06d_fa3");
  for (const char* name : {"06d_cta_pairs", "06d_one_tile_per_cta", "06d_eager_rescale"}) {
    const Stage& ablation = find_stage(name);
    EXPECT_EQ(ablation.head_dims, fa3_06d.head_dims) << name;
    for (int d : fa3::kHeadDims) {
      const AttnProblem p = tiny(1000, 1000, d, false, 4, 2);
      EXPECT_EQ(ablation.model_hbm_bytes(p), fa3_06d.model_hbm_bytes(p)) << name << " d = " << d;
    }
  }
}

TEST(Registry, Fa3StagesTakeEveryBuiltHeadDim) {
  // The Stage records list exactly the head dims CMakeLists.txt builds (fa3_head_dims.h).
  const std::vector<int> built(std::begin(fa3::kHeadDims), std::end(fa3::kHeadDims));
  for (const char* name : {"06a_tma_wgmma", "06b_warp_specialized", "06c_pingpong", "06d_fa3",
                           "06d_one_tile_per_cta", "06d_cta_pairs", "06d_eager_rescale"})
    EXPECT_EQ(find_stage(name).head_dims, built) << name;
  // 06d's steps take the head dims built for them (fa3_step_head_dims), run 06d's tiles and
  // chain 06c -> 06d1_overlap -> 06d2_lazy_softmax -> 06d_fa3.
  const std::vector<int> steps_built(std::begin(fa3::kStepHeadDims), std::end(fa3::kStepHeadDims));
  EXPECT_EQ(find_stage("06d1_overlap").head_dims, steps_built);
  EXPECT_EQ(find_stage("06d2_lazy_softmax").head_dims, steps_built);
  EXPECT_EQ(find_stage("06d1_overlap").prev, "06c_pingpong");
  EXPECT_EQ(find_stage("06d2_lazy_softmax").prev, "06d1_overlap");
  EXPECT_EQ(find_stage("06d_fa3").prev, "06d2_lazy_softmax");
  for (int d : fa3::kStepHeadDims) {
    const AttnProblem p = tiny(1000, 1000, d, false, 4, 2);
    EXPECT_EQ(find_stage("06d1_overlap").model_hbm_bytes(p), find_stage("06d_fa3").model_hbm_bytes(p)) << d;
  }
  // 06a's one warpgroup keeps B_c = 64 at d = 256; 06b-d's consumers take 80.
  EXPECT_EQ(fa3::block_cols_06a(256), 64);
  EXPECT_EQ(fa3::block_cols(256), 80);
  EXPECT_EQ(fa3::block_rows(64), 3 * fa3::kWarpgroupRows);
}

TEST(Fp8Model, WgmmaKeyPositionMakesAccumulatorPairsOperandQuads) {
  // A permutation inside every 32 keys...
  for (int group = 0; group < 4; ++group) {
    std::set<int> seen;
    for (int key = 32 * group; key < 32 * group + 32; ++key) {
      const int pos = fa3::wgmma_key_position(key);
      EXPECT_EQ(pos / 32, group);
      seen.insert(pos);
    }
    EXPECT_EQ(seen.size(), 32u);
  }
  // ...that sends thread t's accumulator keys {2t, 2t+1, 8+2t, 9+2t} (+16) to positions
  // {4t .. 4t+3} (+16), the four bytes of its e4m3 A-operand register.
  for (int half : {0, 16})
    for (int t = 0; t < 4; ++t) {
      const int keys[4] = {2 * t, 2 * t + 1, 8 + 2 * t, 9 + 2 * t};
      for (int b = 0; b < 4; ++b) EXPECT_EQ(fa3::wgmma_key_position(half + keys[b]), half + 4 * t + b);
    }
}

TEST(Fp8Model, HadamardIsTheSignedSylvesterMatrixAndOrthogonal) {
  for (int d : fa3::kFp8HeadDims) {
    SCOPED_TRACE("d = " + std::to_string(d));
    std::vector<double> q(d), k(d);
    unsigned seed = 17u + unsigned(d);
    for (int c = 0; c < d; ++c) {
      seed = seed * 1664525u + 1013904223u;
      q[c] = double(int(seed >> 9) % 2001 - 1000) / 500.0;
      k[c] = double(int(seed >> 12) % 2001 - 1000) / 500.0;
    }
    const std::vector<double> qm = attn::testing::hadamard_row(q), km = attn::testing::hadamard_row(k);
    double dot = 0, dot_m = 0;
    for (int c = 0; c < d; ++c) {
      dot += q[c] * k[c];
      dot_m += qm[c] * km[c];
      // Column c of x diag(s) H / sqrt(d): sum_i x_i s_i (-1)^popcount(i & c) / sqrt(d).
      double explicit_sum = 0;
      for (int i = 0; i < d; ++i)
        explicit_sum += q[i] * fa3::hadamard_sign(i) * ((__builtin_popcount(unsigned(i & c)) & 1) ? -1 : 1);
      EXPECT_NEAR(qm[c], explicit_sum / std::sqrt(double(d)), 1e-12);
    }
    EXPECT_NEAR(dot_m, dot, 1e-9) << "(QM)(KM)ᵀ = QKᵀ";
  }
}

TEST(Fp8Model, E4m3Values) {
  EXPECT_EQ(attn::testing::e4m3_value(0x38), 1.0);
  EXPECT_EQ(attn::testing::e4m3_value(0xB8), -1.0);
  EXPECT_EQ(attn::testing::e4m3_value(0x7E), 448.0);  // the largest finite value
  EXPECT_EQ(attn::testing::e4m3_value(0x08), std::ldexp(1.0, -6));  // smallest normal
  EXPECT_EQ(attn::testing::e4m3_value(0x01), std::ldexp(1.0, -9));  // smallest subnormal
  EXPECT_TRUE(std::isnan(attn::testing::e4m3_value(0x7F)));
}

// ---------------------------------------------------------------- rung 06: where FP8's error comes from
// The host model of the whole FP8 forward (tests/fp8_model.h: fp8_forward_model) on N(0,1)
// inputs, against fp64, with each rounding switched off in turn.

namespace {

// N(0,1) values rounded to bf16, as the GPU tests' inputs: the model, the reference and a
// kernel see the same values.
HostInputs normal_bf16_inputs(const AttnProblem& p, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal;
  HostInputs in;
  for (auto* t : {&in.q, &in.k, &in.v}) {
    t->resize(size_t(t == &in.q ? p.q_elems() : p.kv_elems()));
    for (float& x : *t) x = float(attn::testing::bf16_round(normal(rng)));
  }
  return in;
}

// One problem's inputs and fp64 reference, and the model's error on them: O's relative
// Frobenius error, and lse's largest excess over lse_tolerance (> 0: outside it).
struct Fp8ModelCase {
  AttnProblem p;
  HostInputs in;
  ReferenceRows ref;
  Fp8ModelCase(const AttnProblem& p_, HostInputs in_)
      : p(p_), in(std::move(in_)), ref(reference_rows(p, in, all_rows(p))) {}
  struct Error {
    double o, lse;
  };
  // FP8 stage `stage`'s roundings, then `tweak` (one switched off, say).
  template <class Tweak>
  Error error(const char* stage, Tweak&& tweak) const {
    attn::testing::Fp8ModelOptions opt = attn::testing::fp8_model_options(stage);
    tweak(opt);
    const attn::testing::Fp8ModelOutput model = attn::testing::fp8_forward_model(p, in, opt);
    Error e{rel_frobenius(model.o, ref.o), -INFINITY};
    for (size_t r = 0; r < ref.lse.size(); ++r)
      e.lse = std::max(e.lse, std::fabs(model.lse[r] - ref.lse[r]) - lse_tolerance(p.dtype, ref.lse[r], logit_std(p)));
    return e;
  }
  Error error(const char* stage) const {
    return error(stage, [](attn::testing::Fp8ModelOptions&) {});
  }
};

// The peaked class: scale 8/sqrt(d) (logits of standard deviation 8), d = 128,
// Nq = Nk = 257 (two K/V blocks of 192 keys), 8 heads.
AttnProblem peaked_fp8_problem(DType t = DType::fp8_e4m3, float scale_times = 8) {
  AttnProblem p = tiny(257, 257, 128, false, 8, 8);
  p.dtype = t;
  p.scale = scale_times / std::sqrt(128.f);
  return p;
}

}  // namespace

TEST(Fp8Model, E4m3RoundingAndBf16) {
  using attn::testing::e4m3_round;
  EXPECT_EQ(e4m3_round(1.0625), 1.0) << "a tie goes to the even mantissa";
  EXPECT_EQ(e4m3_round(1.1875), 1.25);
  EXPECT_EQ(e4m3_round(-3.3), -3.25);
  EXPECT_EQ(e4m3_round(500.0), 448.0) << "satfinite";
  EXPECT_EQ(e4m3_round(3 * std::ldexp(1.0, -11)), std::ldexp(1.0, -9)) << "subnormal steps of 2^-9";
  for (int byte = 0; byte < 0x7F; ++byte)
    EXPECT_EQ(e4m3_round(attn::testing::e4m3_value(uint8_t(byte))), attn::testing::e4m3_value(uint8_t(byte)));
  EXPECT_EQ(attn::testing::bf16_round(1.0 + std::ldexp(1.0, -8)), 1.0);
  EXPECT_EQ(attn::testing::bf16_round(1.0 + 3 * std::ldexp(1.0, -8)), 1.0 + std::ldexp(1.0, -6));
}

// At the default scale (logits of standard deviation 1) the roundings of Q and K, V and P
// share the error, and the model stays within the FP8 bound (the GPU's ladder tests hold
// the kernels to it).
TEST(Fp8Model, DefaultScaleErrorWithinTheFp8Bound) {
  const AttnProblem p = peaked_fp8_problem(DType::fp8_e4m3, 1);
  const Fp8ModelCase c(p, normal_bf16_inputs(p, 5));
  ASSERT_NEAR(logit_std(c.p), 1.0, 1e-6);
  const Fp8ModelCase::Error full = c.error("06_fp8");
  EXPECT_LE(full.o, tolerance(c.p.dtype));
  EXPECT_GT(full.o, 0.3 * tolerance(c.p.dtype)) << "three mantissa bits: a few per cent";
  EXPECT_LE(full.lse, 0.0);
  const double qk_only = c.error("06_fp8", [](auto& o) { o.round_v = o.round_p = false; }).o;
  const double v_only = c.error("06_fp8", [](auto& o) { o.round_qk = o.round_p = false; }).o;
  EXPECT_LT(qk_only, 0.8 * full.o);
  EXPECT_LT(v_only, 0.8 * full.o);
}

// The peaked softmax (logits 8x the default): every FP8 stage's error passes the flat bound
// 0.1 (1.1e-1 in the model, as on the GPU), and the whole of the excess is Q's and K's
// rounding, the noise on the logits. Neither P's e4m3 step nor V's block scale nor the row
// max: with Q and K exact the error falls below the default scale's.
TEST(Fp8Model, PeakedSoftmaxErrorIsTheLogitsNoise) {
  const AttnProblem p = peaked_fp8_problem();
  const Fp8ModelCase c(p, normal_bf16_inputs(p, 7));
  for (const char* stage : {"06_fp8", "06_fp8_no_hadamard", "06_fp8_per_tensor_hadamard", "06_fp8_per_tensor"}) {
    SCOPED_TRACE(stage);
    const Fp8ModelCase::Error full = c.error(stage);
    EXPECT_GT(full.o, tolerance(p.dtype)) << "the flat bound fails on the peaked class";
    EXPECT_LE(full.o, tolerance(p.dtype, logit_std(p))) << "the bound that grows with the logits";
    EXPECT_LE(full.lse, 0.0) << "lse within its bound at sigma_L = 8";
  }
  const double full = c.error("06_fp8").o;
  const double qk_exact = c.error("06_fp8", [](auto& o) { o.round_qk = false; }).o;
  const double qk_only = c.error("06_fp8", [](auto& o) { o.round_v = o.round_p = false; }).o;
  EXPECT_LT(qk_exact, 0.4 * tolerance(p.dtype)) << "V and P alone: ~3 %";
  EXPECT_GT(qk_only, 0.9 * full) << "Q and K alone: nearly all of it";
  // The old lse bound (fp8's at sigma_L = 1) fails too: a peaked row's lse is about its
  // largest logit, and keeps that logit's noise.
  const attn::testing::Fp8ModelOutput model =
      attn::testing::fp8_forward_model(p, c.in, attn::testing::fp8_model_options("06_fp8"));
  int outside_flat_bound = 0;
  for (size_t r = 0; r < c.ref.lse.size(); ++r)
    outside_flat_bound += std::fabs(model.lse[r] - c.ref.lse[r]) > lse_tolerance(p.dtype, c.ref.lse[r]);
  EXPECT_GT(outside_flat_bound, 0);
}

// On e4m3 inputs (06_fp8_e4m3) the reference sees the rounded Q and K, so the logits carry
// no rounding noise and the peaked class stays far inside the flat bound: only P rounds.
TEST(Fp8Model, PeakedSoftmaxOnE4m3InputsKeepsTheFlatBound) {
  const AttnProblem p = peaked_fp8_problem(DType::e4m3);
  HostInputs in = normal_bf16_inputs(p, 7);
  for (auto* t : {&in.q, &in.k, &in.v}) {  // as the harness's fill_e4m3: e4m3 times a power of two
    float amax = 0;
    for (float x : *t) amax = std::max(amax, std::fabs(x));
    const double c = std::exp2(std::ceil(std::log2(amax / fa3::kE4m3Max)));
    for (float& x : *t) x = float(attn::testing::e4m3_round(x / c) * c);
  }
  const Fp8ModelCase::Error e = Fp8ModelCase(p, in).error("06_fp8_e4m3");
  EXPECT_LE(e.o, 0.3 * tolerance(p.dtype));
  EXPECT_EQ(tolerance(p.dtype, logit_std(p)), tolerance(p.dtype));
  EXPECT_LE(e.lse, 0.0);
}

// The bound grows as sqrt(sigma_L), as the error does: within it from flat to very peaked
// logits, with room (the bound is >= 1.75x the model's error on a sweep of d and N).
TEST(Fp8Model, ErrorGrowsAsTheSqrtOfTheLogitsSpread) {
  double last = 0;
  for (float times : {1.f, 2.f, 4.f, 8.f, 16.f, 32.f}) {
    SCOPED_TRACE("scale " + std::to_string(times) + "/sqrt(d)");
    AttnProblem p = peaked_fp8_problem(DType::fp8_e4m3, times);
    p.H = p.Hkv = 2;
    const Fp8ModelCase::Error e = Fp8ModelCase(p, normal_bf16_inputs(p, 11)).error("06_fp8");
    EXPECT_LE(e.o, 0.7 * tolerance(p.dtype, logit_std(p)));
    EXPECT_GT(e.o, last) << "more spread, more error";
    EXPECT_LE(e.lse, 0.0);
    last = e.o;
  }
  EXPECT_GT(last, 1.5 * tolerance(DType::fp8_e4m3));
}

// The line the FP8 softmax's integer-ALU 2^x rounds to e4m3 (common/exp2_linear.h), as a
// float on the host: within -3.9 % .. +2.0 %, unbiased over the fraction, exactly 0 from
// x = -127 down and at -inf.
TEST(Exp2Linear, WithinBoundsUnbiasedAndZeroBelowRange) {
  using namespace attn::testing;
  const Exp2LinearPoints points = exp2_linear_points();
  std::vector<float> y;
  for (float x : points.x) y.push_back(exp2_linear_host(x));
  expect_exp2_linear_bounds(points, y);
  // At an integer x the line is exact and the shift of 0.0575 (471 ulps of z, 2^-13 each)
  // lowers it to 2^x (1 - 471 / 2^14).
  for (float x : {-5.f, 0.f, 1.f, 3.f}) EXPECT_EQ(exp2_linear_host(x), std::ldexp(1.f - 471.f / 16384.f, int(x)));
}

// The same line straight to e4m3 bytes (exp2_e4m3_linear), its arithmetic on the host: the
// running max on a grid of 1/8 (shifted), each point its own, within 1/16 of the max; the
// bytes exp2_linear's line rounded to e4m3. (The GPU test Fp8LinearExp2E4m3Bytes runs the
// device function.)
TEST(Exp2Linear, E4m3BytesAreTheLineRounded) {
  using namespace attn::testing;
  for (float m : {-3000.7f, -100.01f, -1.f, -0.0574f, 0.f, 0.06f, 0.5f, 7.77f, 42.f, 2999.9f}) {
    const float g = e4m3_linear_grid_host(m);
    EXPECT_LE(std::fabs(double(g) - double(m)), 1.0 / 16 + 1e-3) << m;
    EXPECT_EQ(e4m3_linear_grid_host(g), g) << m << ": a grid point maps to itself";
    const double k = (double(g) + double(kExp2LinearShift)) * kE4m3LinearStep;
    EXPECT_NEAR(k, std::nearbyint(k), 1e-3) << m;
    EXPECT_EQ(std::fmod(double(e4m3_linear_offset(8.f - g)), 1.0), 0.0) << m << ": the FFMA's addend is an integer";
  }
  EXPECT_EQ(e4m3_linear_grid_host(-INFINITY), -INFINITY);
  const Exp2E4m3Points points = exp2_e4m3_linear_points();
  std::vector<uint8_t> b;
  for (size_t i = 0; i < points.s.size(); ++i) b.push_back(exp2_e4m3_linear_host(points.s[i], 1.f, points.c[i]));
  expect_exp2_e4m3_linear_bytes(points, b);
  // A row whose max is 0: its grid point is -0.0575, and the max's P is 2^8 (0x78), as is
  // the grid point's.
  const float g0 = e4m3_linear_grid_host(0.f);
  EXPECT_EQ(g0, -kExp2LinearShift);
  EXPECT_EQ(exp2_e4m3_linear_host(0.f, 1.f, 8.f - g0), 0x78);
  EXPECT_EQ(exp2_e4m3_linear_host(g0, 1.f, 8.f - g0), 0x78);
}

// The benches' --timing names (attn_bench, fp8_accuracy).
TEST(Harness, TimingModeNames) {
  attn::TimingMode mode = attn::TimingMode::flushed;
  EXPECT_TRUE(attn::parse_timing_mode("back-to-back", &mode));
  EXPECT_EQ(mode, attn::TimingMode::back_to_back);
  EXPECT_TRUE(attn::parse_timing_mode("isolated", &mode));
  EXPECT_EQ(mode, attn::TimingMode::isolated);
  EXPECT_TRUE(attn::parse_timing_mode("flushed", &mode));
  EXPECT_EQ(mode, attn::TimingMode::flushed);
  for (attn::TimingMode m : {attn::TimingMode::flushed, attn::TimingMode::isolated, attn::TimingMode::back_to_back}) {
    attn::TimingMode parsed = attn::TimingMode::flushed;
    EXPECT_TRUE(attn::parse_timing_mode(attn::timing_mode_name(m), &parsed));
    EXPECT_EQ(parsed, m) << attn::timing_mode_name(m);
  }
  for (const char* bad : {"", "back_to_back", "Flushed", "flushed "}) {
    EXPECT_FALSE(attn::parse_timing_mode(bad, &mode)) << "'" << bad << "'";
    EXPECT_EQ(mode, attn::TimingMode::flushed) << "a refused name leaves the mode alone";
  }
}

TEST(Registry, Fp8StagesTakeEveryBuiltHeadDim) {
  for (const char* name : {"06_fp8", "06_fp8_no_hadamard", "06_fp8_per_tensor_hadamard", "06_fp8_per_tensor"})
    for (int d : fa3::kFp8HeadDims) EXPECT_TRUE(find_stage(name).supports_head_dim(d)) << name << " d = " << d;
  for (int d : fa3::kFp8HeadDims) {
    EXPECT_NE(fa3::fp8_launch_for(d), nullptr);
    EXPECT_NE(fa3::fp8_quantize_for(d), nullptr);
  }
  try {
    fa3::fp8_launch_for(96);
    FAIL() << "expected AttnError";
  } catch (const AttnError& e) {
    EXPECT_NE(std::string(e.what()).find("d = 96"), std::string::npos) << e.what();
  }
}

// The pre-kernel numbers the scale blocks of a tensor with an int (fp8_quantize.cuh): a
// problem with more of them is refused, by name, before anything is allocated.
TEST(Validation, Fp8RefusesMoreScaleBlocksThanAnInt) {
  const Stage& s = find_stage("06_fp8");
  AttnProblem p = tiny(4096, 4096, 128, false, 16, 16);
  p.dtype = DType::fp8_e4m3;
  EXPECT_EQ(s.refuse(p), "");
  p.H = p.Hkv = 1 << 16;
  p.Nq = 64 << 16;  // 2^16 heads x 2^16 Q blocks of 64 rows = 2^32 scale blocks
  const std::string why = s.refuse(p);
  EXPECT_NE(why.find("scale blocks"), std::string::npos) << why;
}

// The grid order of the one-tile-per-CTA launches (common/tile_order.h): every (head, Q
// block) exactly once; inside a section, Q blocks from the last to the first, so that with
// a causal mask the longest tiles start first; sections of whole heads, the last one short.
TEST(TileOrder, EveryTileOnceLongestFirstWithinSections) {
  for (int m_blocks : {1, 3, 16})
    for (int heads : {1, 5, 12})
      for (int per_section : {1, 2, 4, 12}) {
        if (per_section > heads) continue;
        const TileOrder o{m_blocks, heads, per_section};
        std::set<std::pair<int, int>> seen;
        int prev_section = 0, prev_m = m_blocks;
        for (int u = 0; u < m_blocks * heads; ++u) {
          const TileCoord c = tile_at(o, u);
          ASSERT_GE(c.bh, 0);
          ASSERT_LT(c.bh, heads);
          ASSERT_GE(c.m_block, 0);
          ASSERT_LT(c.m_block, m_blocks);
          EXPECT_TRUE(seen.insert({c.bh, c.m_block}).second) << "unit " << u << " repeats a tile";
          const int section = c.bh / per_section;
          EXPECT_GE(section, prev_section) << "sections run in order";
          if (section == prev_section) EXPECT_LE(c.m_block, prev_m) << "longest first inside a section";
          prev_section = section;
          prev_m = c.m_block;
        }
        EXPECT_EQ(int(seen.size()), m_blocks * heads);
      }
  // Head after head, last Q block first: the order without a mask.
  const TileOrder plain{4, 3, 1};
  EXPECT_EQ(tile_at(plain, 0).bh, 0);
  EXPECT_EQ(tile_at(plain, 0).m_block, 3);
  EXPECT_EQ(tile_at(plain, 5).bh, 1);
  EXPECT_EQ(tile_at(plain, 5).m_block, 2);
}

TEST(TileOrder, SectionsHoldWhatFitsInAThirdOfL2) {
  const size_t l2 = 48u << 20, head = 1u << 20;  // 1 MiB of K and V per head
  EXPECT_EQ(heads_per_section(false, 128, head, l2), 1) << "no mask: head after head";
  EXPECT_EQ(heads_per_section(true, 128, head, l2), 16);
  EXPECT_EQ(heads_per_section(true, 8, head, l2), 8) << "never more than the grid's heads";
  EXPECT_EQ(heads_per_section(true, 128, 64 * head, l2), 1) << "a head larger than the share";
}
