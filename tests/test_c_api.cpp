// The C API's questions that need no GPU: what a rung accepts, the workspace a problem needs,
// and the error codes and messages of bad calls.
#include <gtest/gtest.h>

#include <string>

#include "ladder/c_api.h"
#include "ladder/registry.h"

namespace attn {
namespace {

TEST(CApi, RungInfoMatchesTheRegistry) {
  ASSERT_EQ(attn_num_rungs(), int(registry().size()));
  for (const Stage& s : registry()) {
    attn_rung_info_t info;
    char err[256] = {0};
    ASSERT_EQ(attn_rung_info(s.name.c_str(), &info, err, sizeof err), ATTN_OK) << err;
    for (int code = 0; code < 4; ++code)
      EXPECT_EQ((info.dtypes >> code) & 1, int(s.supports(DType(code)))) << s.name << " dtype " << code;
    ASSERT_EQ(info.num_head_dims, int(s.head_dims.size())) << s.name;
    for (int i = 0; i < info.num_head_dims; ++i) EXPECT_EQ(info.head_dims[i], s.head_dims[i]) << s.name;
    EXPECT_EQ(info.writes_lse, int(s.writes_lse)) << s.name;
    EXPECT_EQ(info.gqa, int(s.gqa)) << s.name;
    EXPECT_EQ(info.min_sm, s.min_sm) << s.name;
  }
  char err[256] = {0};
  attn_rung_info_t info;
  EXPECT_EQ(attn_rung_info("07_nope", &info, err, sizeof err), ATTN_UNKNOWN_RUNG);
  EXPECT_NE(std::string(err).find("07_nope"), std::string::npos) << err;
  EXPECT_EQ(attn_rung_info(registry().front().name.c_str(), nullptr, err, sizeof err), ATTN_INVALID_INPUT);
}

TEST(CApi, WorkspaceBytesAreTheStagesAndBadProblemsAreRefused) {
  attn_problem_t cp{2, 4, 2, 1000, 1000, 64, 1, 0, 0.f};
  AttnProblem p;
  p.B = 2;
  p.H = 4;
  p.Hkv = 2;
  p.Nq = p.Nk = 1000;
  p.d = 64;
  p.causal = true;
  int quadratic = 0;
  for (const Stage& s : registry()) {
    if (!s.supports(DType::bf16) || !s.supports_head_dim(p.d)) continue;
    if (s.refuse && !s.refuse(p).empty()) continue;  // a shape limit (05_fa2_decode: Nq <= 64)
    size_t bytes = 12345;
    char err[256] = {0};
    ASSERT_EQ(attn_workspace_bytes(s.name.c_str(), &cp, &bytes, err, sizeof err), ATTN_OK) << s.name << ": " << err;
    EXPECT_EQ(bytes, s.workspace(p)) << s.name;
    if (bytes >= size_t(p.score_elems())) ++quadratic;  // S or P held in the workspace (01-03a)
  }
  EXPECT_GE(quadratic, 3);
  char err[256] = {0};
  size_t bytes = 0;
  attn_problem_t bad = cp;
  bad.d = 80;
  EXPECT_EQ(attn_workspace_bytes("05_fa2_reordered", &bad, &bytes, err, sizeof err), ATTN_INVALID_INPUT);
  EXPECT_NE(std::string(err).find("d = 80"), std::string::npos) << err;
  bad = cp;
  bad.Hkv = 3;
  EXPECT_EQ(attn_workspace_bytes("05_fa2_reordered", &bad, &bytes, err, sizeof err), ATTN_INVALID_INPUT);
  EXPECT_NE(std::string(err).find("does not divide"), std::string::npos) << err;
  EXPECT_EQ(attn_workspace_bytes("05_fa2_reordered", nullptr, &bytes, err, sizeof err), ATTN_INVALID_INPUT);
  EXPECT_EQ(attn_workspace_bytes("no_such_rung", &cp, &bytes, err, sizeof err), ATTN_UNKNOWN_RUNG);
}

TEST(CApi, RunAsyncRefusesASmallWorkspaceBeforeAnyLaunch) {
  // 01_naive keeps S and P in its workspace: one byte short is refused with the size it needs,
  // before the device is touched (so this holds without a GPU).
  attn_problem_t cp{1, 2, 2, 113, 113, 64, 0, 0, 0.f};
  size_t need = 0;
  char err[256] = {0};
  ASSERT_EQ(attn_workspace_bytes("01_naive", &cp, &need, err, sizeof err), ATTN_OK) << err;
  ASSERT_GT(need, 0u);
  alignas(16) int dummy = 0;  // the library refuses pointers that are not 16-byte aligned
  EXPECT_EQ(attn_run_async("01_naive", &cp, &dummy, &dummy, &dummy, &dummy, nullptr, &dummy, need - 1, nullptr, err,
                           sizeof err),
            ATTN_INVALID_INPUT);
  EXPECT_NE(std::string(err).find(std::to_string(need)), std::string::npos) << err;
  // A misaligned pointer is refused too (the kernels copy 16-byte pieces), before any launch.
  alignas(16) unsigned char buf[64];
  EXPECT_EQ(attn_run_async("01_naive", &cp, buf + 4, buf, buf, buf, nullptr, buf, need, nullptr, err, sizeof err),
            ATTN_INVALID_INPUT);
  EXPECT_NE(std::string(err).find("Q is not 16-byte aligned"), std::string::npos) << err;
  EXPECT_EQ(attn_run_async("01_naive", &cp, nullptr, &dummy, &dummy, &dummy, nullptr, &dummy, need, nullptr, err,
                           sizeof err),
            ATTN_INVALID_INPUT);
  EXPECT_NE(std::string(err).find("Q is a null pointer"), std::string::npos) << err;
}

TEST(CApi, BackwardInfoAndWorkspaceAreTheStagesAndForwardOnlyRungsSaySo) {
  attn_problem_t cp{2, 4, 2, 1000, 700, 64, 1, 0, 0.f};
  AttnProblem p;
  p.B = 2;
  p.H = 4;
  p.Hkv = 2;
  p.Nq = 1000;
  p.Nk = 700;
  p.d = 64;
  p.causal = true;
  int with_backward = 0;
  for (const Stage& s : registry()) {
    SCOPED_TRACE(s.name);
    int dims[ATTN_MAX_HEAD_DIMS], n_dims = -1;
    char err[256] = {0};
    ASSERT_EQ(attn_backward_info(s.name.c_str(), dims, &n_dims, err, sizeof err), ATTN_OK) << err;
    size_t bytes = 12345;
    const int rc = attn_backward_workspace_bytes(s.name.c_str(), &cp, &bytes, err, sizeof err);
    if (!s.has_backward()) {
      EXPECT_EQ(n_dims, 0);
      EXPECT_EQ(rc, ATTN_INVALID_INPUT);
      EXPECT_NE(std::string(err).find("no backward pass"), std::string::npos) << err;
      continue;
    }
    ASSERT_EQ(n_dims, int(s.backward_head_dims.size()));
    for (int i = 0; i < n_dims; ++i) EXPECT_EQ(dims[i], s.backward_head_dims[i]);
    if (!s.supports_backward_head_dim(p.d)) {  // an ablation at d = 128 only
      EXPECT_EQ(rc, ATTN_INVALID_INPUT);
      EXPECT_NE(std::string(err).find("head dim"), std::string::npos) << err;
      continue;
    }
    ++with_backward;
    ASSERT_EQ(rc, ATTN_OK) << err;
    EXPECT_EQ(bytes, s.backward_workspace(p));
    EXPECT_GE(bytes, size_t(p.lse_elems()) * sizeof(float));  // a float per row at least (05: D; 04: dQ)
  }
  EXPECT_GE(with_backward, 3);  // 04_fa1_tiled, 05_fa2_reordered, 05_fa2_dq_pass
  char err[256] = {0};
  size_t bytes = 0;
  attn_problem_t wide = cp;
  wide.d = 256;  // 05 has d = 256 forward only
  EXPECT_EQ(attn_backward_workspace_bytes("05_fa2_reordered", &wide, &bytes, err, sizeof err), ATTN_INVALID_INPUT);
  EXPECT_NE(std::string(err).find("d = 256"), std::string::npos) << err;
  // Refused before any launch, so without a GPU too: a null pointer, a small workspace.
  ASSERT_EQ(attn_backward_workspace_bytes("05_fa2_reordered", &cp, &bytes, err, sizeof err), ATTN_OK) << err;
  alignas(16) int dummy = 0;  // the library refuses pointers that are not 16-byte aligned
  EXPECT_EQ(attn_run_backward_async("05_fa2_reordered", &cp, &dummy, &dummy, &dummy, &dummy, nullptr, &dummy, &dummy,
                                    &dummy, &dummy, &dummy, bytes, nullptr, err, sizeof err),
            ATTN_INVALID_INPUT);
  EXPECT_NE(std::string(err).find("lse is a null pointer"), std::string::npos) << err;
  float lse = 0.f;
  EXPECT_EQ(attn_run_backward_async("05_fa2_reordered", &cp, &dummy, &dummy, &dummy, &dummy, &lse, &dummy, &dummy,
                                    &dummy, &dummy, &dummy, bytes - 1, nullptr, err, sizeof err),
            ATTN_INVALID_INPUT);
  EXPECT_NE(std::string(err).find(std::to_string(bytes)), std::string::npos) << err;
  EXPECT_EQ(attn_backward_info("no_such_rung", nullptr, nullptr, err, sizeof err), ATTN_UNKNOWN_RUNG);
}

// dO with its own strides (attn_run_backward_strided_async): which rungs read them, and the
// refusals before any launch (so without a GPU too): other strides for a rung that takes dO
// contiguous, strides that are not 16-byte multiples. The contiguous strides pass for any rung
// (the check that follows is the workspace's).
TEST(CApi, BackwardDoutStrides) {
  int with_strides = 0;
  char err[256] = {0};
  for (const Stage& s : registry()) {
    SCOPED_TRACE(s.name);
    int strided = -1;
    ASSERT_EQ(attn_backward_strided_dout(s.name.c_str(), &strided, err, sizeof err), ATTN_OK) << err;
    EXPECT_EQ(strided, s.has_backward() && s.backward_strided_dout ? 1 : 0);
    with_strides += strided;
  }
  const bool fa3_backward = find_stage("06d_fa3").has_backward();  // not in a lab build without it
  if (fa3_backward) {
    EXPECT_TRUE(find_stage("06d_fa3").backward_strided_dout);
    EXPECT_TRUE(find_stage("06o_bwd_tail_pieces").backward_strided_dout);
    EXPECT_TRUE(find_stage("06p_bwd_dq_writer").backward_strided_dout);
    EXPECT_TRUE(find_stage("06q_bwd_persistent").backward_strided_dout);
    EXPECT_FALSE(find_stage("06n_bwd_k_in_registers").backward_strided_dout);
    EXPECT_EQ(with_strides, 4);
  }
  EXPECT_EQ(attn_backward_strided_dout("no_such_rung", nullptr, err, sizeof err), ATTN_UNKNOWN_RUNG);

  attn_problem_t cp{};
  cp.B = 2, cp.H = 4, cp.Hkv = 4, cp.Nq = 100, cp.Nk = 100, cp.d = 64, cp.causal = 1, cp.dtype = 0;
  size_t bytes = 0;
  ASSERT_EQ(attn_backward_workspace_bytes("05_fa2_reordered", &cp, &bytes, err, sizeof err), ATTN_OK) << err;
  alignas(16) int dummy = 0;
  float lse = 0.f;
  auto run = [&](const char* rung, const int64_t* strides, size_t ws) {
    return attn_run_backward_strided_async(rung, &cp, &dummy, &dummy, &dummy, &dummy, &lse, &dummy, strides, &dummy,
                                           &dummy, &dummy, &dummy, ws, nullptr, err, sizeof err);
  };
  const int64_t transposed[3] = {100 * 4 * 64, 64, 4 * 64};  // [B, N, H, d] seen as [B, H, N, d]
  EXPECT_EQ(run("05_fa2_reordered", transposed, bytes), ATTN_INVALID_INPUT);
  EXPECT_NE(std::string(err).find("takes dO contiguous"), std::string::npos) << err;
  const int64_t odd[3] = {100 * 4 * 68, 68, 4 * 68 + 4};  // 8-byte multiples only
  EXPECT_EQ(run("05_fa2_reordered", odd, bytes), ATTN_INVALID_INPUT);
  EXPECT_NE(std::string(err).find("multiples of 16 bytes"), std::string::npos) << err;
  const int64_t dense[3] = {4 * 100 * 64, 100 * 64, 64};
  EXPECT_EQ(run("05_fa2_reordered", dense, bytes - 1), ATTN_INVALID_INPUT);  // past the strides' check
  EXPECT_NE(std::string(err).find("workspace"), std::string::npos) << err;
  if (fa3_backward) {
    ASSERT_EQ(attn_backward_workspace_bytes("06d_fa3", &cp, &bytes, err, sizeof err), ATTN_OK) << err;
    EXPECT_EQ(run("06d_fa3", odd, bytes), ATTN_INVALID_INPUT);
    EXPECT_NE(std::string(err).find("multiples of 16 bytes"), std::string::npos) << err;
  }
}

// The paged decode's workspace query validates what the host sees, without a GPU.
TEST(CApi, PagedDecodeWorkspaceAndRefusals) {
  char err[512] = {0};
  size_t bytes = 0;
  const attn_paged_problem_t good{2, 8, 2, 4, 128, 10, 64, 5, 1, 0, 0.f};
  ASSERT_EQ(attn_decode_paged_workspace_bytes(&good, &bytes, err, sizeof err), ATTN_OK) << err;
  EXPECT_GE(bytes, 256u);  // the fault records' header at least
  struct Bad {
    attn_paged_problem_t c;
    const char* words;
  };
  auto with = [&](auto edit) {
    attn_paged_problem_t c = good;
    edit(c);
    return c;
  };
  const Bad cases[] = {
      {with([](auto& c) { c.dtype = 2; }), "bf16"},
      {with([](auto& c) { c.page_size = 0; }), "page_size = 0"},
      {with([](auto& c) { c.max_pages = 0; }), "max_pages = 0"},
      {with([](auto& c) { c.Nq = 65; }), "at most 64"},
      {with([](auto& c) { c.Hkv = 3; }), "Hkv"},
      {with([](auto& c) { c.max_pages = 1 << 20, c.page_size = 4096; }), "2^31 - 1"},
  };
  for (const Bad& b : cases) {
    err[0] = 0;
    EXPECT_EQ(attn_decode_paged_workspace_bytes(&b.c, &bytes, err, sizeof err), ATTN_INVALID_INPUT) << b.words;
    EXPECT_NE(std::string(err).find(b.words), std::string::npos) << err;
  }
  EXPECT_EQ(attn_decode_paged_workspace_bytes(nullptr, &bytes, err, sizeof err), ATTN_INVALID_INPUT);
}

}  // namespace
}  // namespace attn
