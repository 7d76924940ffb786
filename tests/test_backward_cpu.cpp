// The backward pass without a GPU: the fp64 reference against finite differences of the fp64
// forward (so the ground truth of tests/test_backward.cpp is itself checked), and the host
// arithmetic the kernels run with: 04's blocks and shared-memory layout, 05's tile, the
// workspaces, the grids, and the refusals of forward-only rungs and unsupported head dims.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "04_fa1_tiled/fa1_backward.h"
#include "05_fa2_reordered/fa2_backward.h"
#include "06_fa3_hopper/fa3_launch.h"
#include "common/reference.h"
#include "common/reference_backward.h"
#include "common/stage.h"
#include "ladder/registry.h"

namespace attn {
namespace {

// L = sum(dO ∘ O) with O from the fp64 forward, so dL/dX is what reference_backward gives.
double loss(const AttnProblem& p, const HostInputs& in, const std::vector<float>& dout) {
  const ReferenceRows o = reference_rows(p, in, all_rows(p));
  double l = 0;
  for (size_t x = 0; x < o.o.size(); ++x) l += double(dout[x]) * o.o[x];
  return l;
}

// Central differences of loss() in every element of Q, K and V against reference_backward.
void expect_matches_finite_differences(const AttnProblem& p) {
  SCOPED_TRACE(p.describe());
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.f, 1.f);
  HostInputs in;
  std::vector<float> dout(size_t(p.o_elems()));
  in.q.resize(size_t(p.q_elems()));
  in.k.resize(size_t(p.kv_elems()));
  in.v.resize(size_t(p.kv_elems()));
  for (auto* t : {&in.q, &in.k, &in.v, &dout})
    for (float& x : *t) x = normal(rng);
  const ReferenceGrads g = reference_backward(p, in, dout);
  struct Case {
    std::vector<float>* x;
    const std::vector<double>* grad;
    const char* name;
  };
  for (Case c : {Case{&in.q, &g.dq, "dQ"}, Case{&in.k, &g.dk, "dK"}, Case{&in.v, &g.dv, "dV"}}) {
    for (size_t i = 0; i < c.x->size(); ++i) {
      const float x0 = (*c.x)[i];
      const float up = x0 + 1e-2f, down = x0 - 1e-2f;
      (*c.x)[i] = up;
      const double l_up = loss(p, in, dout);
      (*c.x)[i] = down;
      const double l_down = loss(p, in, dout);
      (*c.x)[i] = x0;
      const double fd = (l_up - l_down) / (double(up) - double(down));
      EXPECT_NEAR((*c.grad)[i], fd, 1e-4 * (1 + std::fabs(fd))) << c.name << "[" << i << "]";
    }
  }
}

TEST(BackwardReference, MatchesFiniteDifferencesOfTheForward) {
  AttnProblem p;
  p.B = 1;
  p.H = 2;
  p.Hkv = 1;  // GQA: dK, dV sum both query heads
  p.d = 4;
  for (auto [nq, nk] : {std::pair{5, 7}, std::pair{7, 5}, std::pair{6, 6}})
    for (bool causal : {false, true}) {  // causal with Nq > Nk: rows that see no key
      p.Nq = nq;
      p.Nk = nk;
      p.causal = causal;
      expect_matches_finite_differences(p);
    }
}

TEST(BackwardReference, RowsThatSeeNoKeyHaveNoGradient) {
  AttnProblem p;
  p.Nq = 6;
  p.Nk = 2;  // bottom-right causal: rows 0-3 see no key
  p.d = 4;
  p.causal = true;
  HostInputs in;
  in.q.assign(size_t(p.q_elems()), 0.5f);
  in.k.assign(size_t(p.kv_elems()), -0.25f);
  in.v.assign(size_t(p.kv_elems()), 1.f);
  const std::vector<float> dout(size_t(p.o_elems()), 1.f);
  const ReferenceGrads g = reference_backward(p, in, dout);
  for (int64_t x = 0; x < 4 * p.d; ++x) EXPECT_EQ(g.dq[x], 0.0) << x;
  double dv = 0;  // row 4 sees key 0 only, row 5 keys 0 and 1 (equal scores: half each)
  for (int c = 0; c < p.d; ++c) dv += g.dv[c];
  EXPECT_NEAR(dv, p.d * (1.0 + 0.5), 1e-12);
}

TEST(Fa1Backward, BlocksFitSharedMemory) {
  for (int d : {64, 128}) {
    SCOPED_TRACE(d);
    const fa1::Blocks h100 = fa1::choose_bwd_blocks(d, 2, 232448);  // sm_90: 227 KiB per block
    EXPECT_EQ(h100.Br, fa1::kBwdMaxBlock);
    EXPECT_EQ(h100.Bc, fa1::kBwdMaxBlock);
    EXPECT_LE((fa1::BwdSmemLayout{h100.Br, h100.Bc, d, 2}.bytes()), 232448u);
    const fa1::Blocks a100 = fa1::choose_bwd_blocks(d, 2, 166912);  // sm_80: 163 KiB
    ASSERT_GE(a100.Br, fa1::kTile);
    EXPECT_EQ(a100.Br % fa1::kTile, 0);
    EXPECT_EQ(a100.Bc % fa1::kTile, 0);
    EXPECT_LE((fa1::BwdSmemLayout{a100.Br, a100.Bc, d, 2}.bytes()), 166912u);
    const fa1::Blocks none = fa1::choose_bwd_blocks(d, 2, 4096);
    EXPECT_EQ(none.Br, 0);
  }
  // Each buffer starts on the alignment WMMA loads need, and none overlaps the next.
  const fa1::BwdSmemLayout L{64, 48, 128, 2};
  const size_t offsets[] = {L.k_offset(),  L.v_offset(),  L.q_offset(),  L.do_offset(),  L.p_offset(),
                            L.ds_offset(), L.s_offset(),  L.dp_offset(), L.dk_offset(),  L.dv_offset(),
                            L.lse_offset(), L.d_offset(), L.bytes()};
  for (size_t i = 0; i < std::size(offsets); ++i) {
    EXPECT_EQ(offsets[i] % fa1::kSmemAlign, 0u) << i;
    if (i > 0) EXPECT_GT(offsets[i], offsets[i - 1]) << i;
  }
  EXPECT_GE(L.dp_offset() - L.s_offset(), size_t(64) * L.ld_s() * sizeof(float));
  EXPECT_GE(L.lse_offset() - L.dv_offset(), size_t(48) * L.ld_acc() * sizeof(float));
}

TEST(Fa2Backward, TilesFitAndSplitEvenly) {
  auto check = [](auto tile, int d) {
    using Cfg = decltype(tile);
    SCOPED_TRACE(d);
    EXPECT_EQ(Cfg::kD, d);
    EXPECT_EQ(Cfg::kKeys, Cfg::kWarps * Cfg::kWarpRows);  // the forward's Tile, roles swapped: rows are keys
    EXPECT_EQ(Cfg::kWarpRows % 16, 0);
    EXPECT_EQ(Cfg::kWarpKeys, Cfg::kQueries);
    // dQ: warps split the step's 16-row tiles, then d in 32-column chunks
    EXPECT_EQ(Cfg::kWarps % (Cfg::kQueries / 16), 0);
    EXPECT_EQ(Cfg::kQueries / 16 * (d / 32) % Cfg::kWarps, 0);
    EXPECT_EQ(Cfg::kQueries % Cfg::Pass::kWarpKeys, 0);  // whole passes per step
    EXPECT_EQ(Cfg::Pass::kWarpRows, Cfg::kWarpRows);
    const int smem_per_sm = 228 * 1024, reserved = 1024;  // sm_90
    EXPECT_LE(Cfg::kMinCtasPerSm * (Cfg::kSmemBytes + reserved), smem_per_sm);
    // K_j, V_j, two stages of Q_i, dO_i, dSᵀ, two stages of L_i, D_i
    EXPECT_EQ(Cfg::kSmemBytes, 2 * (2 * Cfg::kKeys * d + 4 * Cfg::kQueries * d + Cfg::kKeys * Cfg::kQueries) +
                                   4 * 4 * Cfg::kQueries + 128);
  };
  check(fa2::BwdTileFor<64, fa2::DqMode::atomics>{}, 64);
  check(fa2::BwdTileFor<64, fa2::DqMode::separate_pass>{}, 64);
  check(fa2::BwdOwnKeysTile<128>{}, 128);
  // d = 128, FA2's warp grids: 8 warps cover S_ij (2 x 4 tiles of 32 x 32), dK_j, dV_j (4 x 2 of
  // 32 x 64) and dQ_i (2 x 4 of 32 x 32) exactly once each.
  using T2 = fa2::BwdTileFor<128, fa2::DqMode::atomics>;
  static_assert(T2::kTwoD, "d = 128 runs fa2_backward_2d_kernel");
  EXPECT_EQ(T2::kWarps, 8);
  EXPECT_EQ((T2::kQueries / 32) * (T2::kKeys / 32), T2::kWarps);  // S, dP
  EXPECT_EQ((T2::kKeys / 32) * (T2::kD / 64), T2::kWarps);        // dK, dV
  EXPECT_EQ((T2::kQueries / 32) * (T2::kD / 32), T2::kWarps);     // dQ
  EXPECT_EQ(T2::Sdp::kWarpRows, 32);
  EXPECT_EQ(T2::Sdp::kWarpKeys, 32);
  // K_j, V_j, two stages of Q_i, dO_i, P_ij and dS_ij, two stages of L_i, D_i
  EXPECT_EQ(T2::kSmemBytes, 2 * (2 * 128 * 128 + 4 * 64 * 128 + 2 * 64 * 128) + 4 * 4 * 64 + 128);
  EXPECT_LE(T2::kSmemBytes, 227 * 1024);
  // The dQ pass: the forward's split (warps own rows of Q_i), Q_i, dO_i and a K/V ring in smem.
  auto check_dq = [](auto tile, int d) {
    using Cfg = decltype(tile);
    SCOPED_TRACE(d);
    EXPECT_EQ(Cfg::kD, d);
    EXPECT_EQ(Cfg::kWarpRows % 16, 0);
    EXPECT_GE(Cfg::kStages, 2);  // the loop waits with kStages - 2 groups in flight
    EXPECT_EQ(Cfg::kSmemBytes, 2 * d * (2 * Cfg::kBr + 2 * Cfg::kStages * Cfg::kBc) + 128);
    EXPECT_LE(Cfg::kSmemBytes, 227 * 1024);
  };
  check_dq(fa2::DqTileFor<64>{}, 64);
  check_dq(fa2::DqTileFor<128>{}, 128);

  AttnProblem p;
  p.B = 3;
  p.H = 8;
  p.Hkv = 2;
  p.Nq = 1000;
  p.Nk = 129;
  p.d = 128;
  EXPECT_EQ(fa2::bwd_workspace_bytes(p), size_t(3 * 8 * 1000) * (128 + 1) * sizeof(float));
  // dQ_acc's rows are padded to whole 8 x 8 blocks: 1001 rows take 1008
  p.Nq = 1001;
  EXPECT_EQ(fa2::bwd_workspace_bytes(p), size_t(3 * 8) * (1008 * 128 + 1001) * sizeof(float));
  p.Nq = 1000;
  EXPECT_EQ(fa2::bwd_workspace_bytes(p, fa2::DqMode::separate_pass), size_t(3 * 8 * 1000) * sizeof(float));  // D
  EXPECT_EQ(fa1::bwd_workspace_bytes(p), size_t(3 * 8 * 1000) * 128 * sizeof(float));
  EXPECT_EQ(fa2::bwd_ctas(p, 64), 3 * 3 * 2);  // ceil(129 / 64) K/V blocks x B x Hkv
  EXPECT_EQ(fa2::bwd_dq_ctas(p, 64), 16 * 3 * 8);  // ceil(1000 / 64) Q blocks x B x H
}

// dQ_acc's layout (fa2_backward.h): a bijection onto the padded head, and the kernels' red of
// 8-row block b, 8-column block n (half of an mma C tile) lands lane l's pair at 2 l of one
// 64-float run.
TEST(Fa2Backward, DqAccBlocksAreOneRedEach) {
  constexpr int d = 64;
  const int rows = int(fa2::dq_acc_rows(21));
  EXPECT_EQ(rows, 24);
  std::vector<int> seen(size_t(rows) * d, 0);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < d; ++c) {
      const int64_t x = fa2::dq_acc_offset<d>(r, c);
      ASSERT_GE(x, 0);
      ASSERT_LT(x, int64_t(rows) * d);
      ++seen[size_t(x)];
    }
  EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), rows * d);
  for (int b = 0; b < rows / 8; ++b)
    for (int n = 0; n < d / 8; ++n)
      for (int lane = 0; lane < 32; ++lane)
        for (int e = 0; e < 2; ++e)  // lane l holds row g = l / 4, columns 2 (l % 4) + e
          EXPECT_EQ(fa2::dq_acc_offset<d>(8 * b + lane / 4, 8 * n + 2 * (lane % 4) + e),
                    int64_t(b) * 8 * d + n * 64 + 2 * lane + e);
  // the kernels add offset(8a, 8b) to a lane's base offset(r, c)
  for (int r = 0; r < 8; ++r)
    for (int c = 0; c < 8; ++c)
      for (int a = 0; 8 * a + r < rows; ++a)
        for (int b = 0; 8 * b + c < d; ++b)
          EXPECT_EQ(fa2::dq_acc_offset<d>(r + 8 * a, c + 8 * b), fa2::dq_acc_offset<d>(r, c) + fa2::dq_acc_offset<d>(8 * a, 8 * b));
}

TEST(Backward, StagesDeclareIt) {
  AttnProblem p;
  p.H = p.Hkv = 2;
  p.Nq = p.Nk = 100;
  p.d = 64;
  int with = 0;
  for (const Stage& s : registry()) {
    if (!s.supports(DType::bf16) || !s.supports_head_dim(64) || (s.refuse && !s.refuse(p).empty())) continue;
    if (s.has_backward() && !s.supports_backward_head_dim(p.d)) {  // an ablation at d = 128 only
      EXPECT_THROW(validate_backward_problem(s, p), AttnError) << s.name;
    } else if (s.has_backward()) {
      ++with;
      EXPECT_NO_THROW(validate_backward_problem(s, p)) << s.name;
      EXPECT_GT(s.backward_workspace(p), 0u) << s.name;
    } else {
      try {
        validate_backward_problem(s, p);
        ADD_FAILURE() << s.name << ": forward-only, yet its backward validated";
      } catch (const AttnError& e) {
        EXPECT_NE(std::string(e.what()).find("no backward pass"), std::string::npos) << e.what();
      }
    }
  }
  EXPECT_TRUE(find_stage("04_fa1_tiled").has_backward());
  EXPECT_TRUE(find_stage("05_fa2_reordered").has_backward());
  EXPECT_FALSE(find_stage("05_fa2_decode").has_backward());  // copies of 05 stay forward only
  // 06d_fa3's backward (the last step's kernel) and the steps 06e-06o at d = 64 and 128,
  // chained 06e -> 06f -> 06g -> 06h -> 06i -> 06j -> 06k -> 06l -> 06m -> 06n -> 06o; 06d's ablations stay
  // forward only.
  EXPECT_EQ(find_stage("06d_fa3").backward_head_dims, (std::vector<int>{64, 128}));
  EXPECT_EQ(find_stage("06e_bwd_wgmma").backward_head_dims, (std::vector<int>{64, 128}));   // 06e
  EXPECT_EQ(find_stage("06e_bwd_wgmma").prev, "06d_fa3");
  EXPECT_EQ(find_stage("06f_bwd_dq_reduce").prev, "06e_bwd_wgmma");
  EXPECT_EQ(find_stage("06g_bwd_one_dq_add").prev, "06f_bwd_dq_reduce");
  EXPECT_EQ(find_stage("06h_bwd_dq_columns").prev, "06g_bwd_one_dq_add");
  EXPECT_EQ(find_stage("06h_bwd_dq_columns").backward_head_dims, (std::vector<int>{64, 128}));  // 06h
  EXPECT_EQ(find_stage("06i_bwd_shared_space").prev, "06h_bwd_dq_columns");
  EXPECT_EQ(find_stage("06i_bwd_shared_space").backward_head_dims, (std::vector<int>{64, 128}));  // 06i
  EXPECT_EQ(find_stage("06j_bwd_issue_order").prev, "06i_bwd_shared_space");
  EXPECT_EQ(find_stage("06j_bwd_issue_order").backward_head_dims, (std::vector<int>{64, 128}));  // 06j
  EXPECT_EQ(find_stage("06k_bwd_tall_steps").prev, "06j_bwd_issue_order");
  EXPECT_EQ(find_stage("06k_bwd_tall_steps").backward_head_dims, (std::vector<int>{64, 128}));  // 06k
  EXPECT_EQ(find_stage("06l_bwd_tma_store").prev, "06k_bwd_tall_steps");
  EXPECT_EQ(find_stage("06l_bwd_tma_store").backward_head_dims, (std::vector<int>{64, 128}));  // 06l
  EXPECT_EQ(find_stage("06m_bwd_heavy_first").prev, "06l_bwd_tma_store");
  EXPECT_EQ(find_stage("06m_bwd_heavy_first").backward_head_dims, (std::vector<int>{64, 128}));  // 06m
  EXPECT_EQ(find_stage("06n_bwd_k_in_registers").prev, "06m_bwd_heavy_first");
  EXPECT_EQ(find_stage("06n_bwd_k_in_registers").backward_head_dims, (std::vector<int>{64, 128}));  // 06n
  EXPECT_EQ(find_stage("06o_bwd_tail_pieces").prev, "06n_bwd_k_in_registers");
  EXPECT_EQ(find_stage("06o_bwd_tail_pieces").backward_head_dims, (std::vector<int>{64, 128}));  // 06o
  EXPECT_EQ(find_stage("06f_bwd_dq_reduce").backward_head_dims, (std::vector<int>{64, 128}));  // 06f
  EXPECT_EQ(find_stage("06g_bwd_one_dq_add").backward_head_dims, (std::vector<int>{64, 128}));  // 06g
  EXPECT_FALSE(find_stage("06d_one_tile_per_cta").has_backward());
  EXPECT_GE(with, 2);
  p.d = 256;
  try {
    validate_backward_problem(find_stage("05_fa2_reordered"), p);
    ADD_FAILURE() << "05_fa2_reordered has no d = 256 backward";
  } catch (const AttnError& e) {
    EXPECT_NE(std::string(e.what()).find("backward: head dim d = 256"), std::string::npos) << e.what();
  }
}

// 06m's grid (fa3_launch.h: cta_order, bwd_order): every (K/V block j, batch x KV head)
// once. One head per section (no mask) is 06l's order: CTA x takes block x mod T_c of head
// x / T_c. With sections, every head's block j comes before any head's block j + 1 inside a
// section (block 0, which walks every Q block under the mask, first), sections in order.
TEST(BackwardOrder, EveryCtaOnceHeaviestFirstWithinSections) {
  for (int T_c : {1, 3, 16})
    for (int heads : {1, 5, 12})
      for (int per_section : {1, 2, 4, 12}) {
        if (per_section > heads) continue;
        const TileOrder o{T_c, heads, per_section};
        std::vector<int> seen(size_t(T_c) * heads, 0);
        int prev_section = 0, prev_j = 0;
        for (int x = 0; x < T_c * heads; ++x) {
          const TileCoord c = fa3::step06m::cta_order(o, x);
          ASSERT_GE(c.bh, 0);
          ASSERT_LT(c.bh, heads);
          ASSERT_GE(c.m_block, 0);
          ASSERT_LT(c.m_block, T_c);
          ++seen[size_t(c.bh) * T_c + c.m_block];
          if (per_section == 1) {
            EXPECT_EQ(c.m_block, x % T_c) << "06l's order";
            EXPECT_EQ(c.bh, x / T_c) << "06l's order";
          }
          const int section = c.bh / per_section;
          EXPECT_GE(section, prev_section) << "sections in order";
          if (section != prev_section) prev_j = 0;
          EXPECT_GE(c.m_block, prev_j) << "heaviest (lowest j) first inside a section";
          prev_section = section;
          prev_j = c.m_block;
        }
        for (int n : seen) EXPECT_EQ(n, 1) << "every CTA exactly once";
      }
}

// Sections (with the mask) of as many (batch, KV head)s as keep their Q, dO and dQ_acc
// (8 bytes per query element, the group's query heads each) within a third of L2.
TEST(BackwardOrder, SectionsHoldQdOAndDqAccInAThirdOfL2) {
  AttnProblem p;
  p.B = 8, p.H = p.Hkv = 16, p.Nq = p.Nk = 2048, p.d = 128, p.causal = true;  // 2 MiB per head
  const size_t l2 = 50u << 20;
  EXPECT_EQ(fa3::step06m::bwd_order(p, 16, l2).heads_per_section, 8);
  EXPECT_EQ(fa3::step06m::bwd_order(p, 16, l2).heads, 128);
  EXPECT_EQ(fa3::step06m::bwd_order(p, 16, l2).m_blocks, 16);
  p.Hkv = 4;  // GQA: 4 query heads per KV head, 8 MiB
  EXPECT_EQ(fa3::step06m::bwd_order(p, 16, l2).heads_per_section, 2);
  p.Nq = 1 << 16;  // one head past the share: head after head
  EXPECT_EQ(fa3::step06m::bwd_order(p, 16, l2).heads_per_section, 1);
  p.Nq = 2048, p.Hkv = 16, p.causal = false;  // every CTA walks as far: 06l's order
  EXPECT_EQ(fa3::step06m::bwd_order(p, 16, l2).heads_per_section, 1);
}

// 06o's producer divides a query head index by H with a multiply and a shift
// (fa3_launch.h: head_divisor): exact for every head count up to 1024 and indices below 2^31.
TEST(BackwardTail, HeadDivisorIsExact) {
  using fa3::step06o::head_divisor;
  for (int H = 1; H <= 1024; ++H) {
    const auto div = head_divisor(H);
    const uint64_t probes[] = {0, 1, uint64_t(H) - 1, uint64_t(H), uint64_t(H) + 1, 12345, (1ull << 20) + 7,
                               (1ull << 31) - 1, (1ull << 31) - uint64_t(H)};
    for (uint64_t x : probes)
      ASSERT_EQ((x * div.magic) >> div.shift, x / uint64_t(H)) << "H = " << H << ", x = " << x;
    for (uint64_t m = 1; m < 64; ++m) {  // around multiples of H
      const uint64_t x = m * uint64_t(H) * 4099;
      if (x < (1ull << 31) - 1)
        for (uint64_t y : {x - 1, x, x + 1}) ASSERT_EQ((y * div.magic) >> div.shift, y / uint64_t(H)) << H << " " << y;
    }
  }
}

// 06o's tail (fa3_launch.h: tail_plan): the papers' shapes on 132 SMs and the cases without
// pieces. d = 128, N = 2k: 2048 tiles of 32 steps, 68 in the last wave. In 3 equal pieces
// they take 2 rounds of 11 + 2 steps (26) against one of 32 + 2; 44 tiles in 3 pieces (132
// CTAs of 13) and 24 in 4 (96 of 8 + 2, on the SMs as the long ones end) take 13 + 10 = 23.
// d = 64: 4096 tiles of 16 steps, 4 in the last wave; 16 pieces of one step fit one round.
TEST(BackwardTail, PiecesShortenThePartialWave) {
  using fa3::step06o::tail_plan;
  const auto d128 = tail_plan(2048, 32, 132, false);
  EXPECT_EQ(d128.full_ctas, 1980);
  EXPECT_EQ(d128.tail_tiles, 68);
  EXPECT_EQ(d128.pieces, 3);
  EXPECT_EQ(d128.long_tiles, 44);
  EXPECT_EQ(d128.tail_ctas(), 44 * 3 + 24 * 4);
  const auto d64 = tail_plan(4096, 16, 132, false);
  EXPECT_EQ(d64.full_ctas, 4092);
  EXPECT_EQ(d64.tail_tiles, 4);
  EXPECT_EQ(d64.pieces, 16);
  EXPECT_EQ(d64.long_tiles, 4);  // equal pieces
  // Fewer tiles than SMs: all of them are the tail, every piece in one round.
  const auto small = tail_plan(3, 5, 132, false);
  EXPECT_EQ(small.full_ctas, 0);
  EXPECT_EQ(small.tail_tiles, 3);
  EXPECT_EQ(small.pieces, 5);
  // No pieces: with the mask, whole waves, one step a tile, no SM count (a failed query).
  for (const auto& plan : {tail_plan(2048, 32, 132, true), tail_plan(264, 32, 132, false), tail_plan(2048, 1, 132, false),
                           tail_plan(2048, 32, 0, false)}) {
    EXPECT_EQ(plan.pieces, 1);
    EXPECT_EQ(plan.tail_tiles, 0);
  }
}

// The CTAs of m1 long then m2 short pieces, each to the SM free first (the hardware's
// hand-out), simulated: two_size_end's closed form must agree.
long long list_schedule_end(long long sms, long long m1, long long L1, long long m2, long long L2) {
  std::vector<long long> free_at(size_t(sms), 0);
  long long end = 0;
  for (long long i = 0; i < m1 + m2; ++i) {
    auto first = std::min_element(free_at.begin(), free_at.end());
    *first += i < m1 ? L1 : L2;
    end = std::max(end, *first);
  }
  return end;
}

TEST(BackwardTail, TwoSizeEndIsTheListSchedule) {
  std::mt19937 rng(7);
  for (int i = 0; i < 3000; ++i) {
    const long long sms = 1 + rng() % 140, m1 = rng() % 300, m2 = rng() % 300, L2 = 1 + rng() % 20,
                    L1 = L2 + rng() % 12;
    ASSERT_EQ(fa3::step06o::two_size_end(sms, m1, L1, m2, L2), list_schedule_end(sms, m1, L1, m2, L2))
        << sms << " SMs, " << m1 << " x " << L1 << " then " << m2 << " x " << L2;
  }
}

// The plan ends no later than any other of its kind (every p, every count of long tiles),
// every piece has a step, and the tail's grid covers each tile's steps exactly once.
TEST(BackwardTail, PlanIsTheBestTwoSizeSplitAndCoversEveryStep) {
  using namespace fa3::step06o;
  for (int sms : {78, 114, 132})
    for (long long tiles = 1; tiles < 2200; tiles += 37)
      for (int steps : {2, 3, 7, 16, 32, 64, 256}) {
        const TailPlan plan = tail_plan(tiles, steps, sms, false);
        const long long tail = tiles % sms;
        if (tail == 0) {  // whole waves
          ASSERT_EQ(plan.pieces, 1);
          continue;
        }
        auto end_of = [&](int p, long long a) {
          return two_size_end(sms, a * p, (steps + p - 1) / p + kPieceCostSteps, (tail - a) * (p + 1),
                              (steps + p) / (p + 1) + kPieceCostSteps);
        };
        long long best = steps + kPieceCostSteps;
        for (int p = 2; p <= std::min(steps, kMaxPieces); ++p)
          for (long long a = 0; a <= tail; ++a)
            if (a == tail || (p + 1 <= steps && p + 1 <= kMaxPieces)) best = std::min(best, end_of(p, a));
        const long long planned = plan.pieces > 1 ? end_of(plan.pieces, plan.long_tiles) : steps + kPieceCostSteps;
        ASSERT_EQ(planned, best) << tiles << " tiles of " << steps << " steps on " << sms << " SMs";
        if (plan.pieces == 1) continue;
        ASSERT_LE(plan.long_tiles < plan.tail_tiles ? plan.pieces + 1 : plan.pieces, steps);
        std::vector<int> covered(size_t(plan.tail_tiles * steps), 0);
        for (int x = 0; x < int(plan.tail_ctas()); ++x) {
          const TailPiece t = tail_piece(x, int(plan.long_tiles), plan.pieces);
          ASSERT_LT(t.tail, plan.tail_tiles);
          ASSERT_LE(t.count, kMaxPieces);
          const int n0 = t.piece * steps / t.count, n1 = (t.piece + 1) * steps / t.count;
          ASSERT_LT(n0, n1) << "a piece without a step";
          for (int n = n0; n < n1; ++n) ++covered[size_t(t.tail) * steps + n];
        }
        for (int c : covered) ASSERT_EQ(c, 1);
      }
}

}  // namespace
}  // namespace attn
