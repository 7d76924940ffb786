// CPU tests of rung 06's FP8 path on e4m3 inputs (06_fp8_e4m3, fa3_fp8_e4m3.h): its Stage
// record, the refusals of a wrong dtype or missing descales (validation and the C API), all
// before any launch, so they hold without a GPU.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "06_fa3_hopper/fa3_fp8.h"
#include "06_fa3_hopper/fa3_fp8_e4m3.h"
#include "ladder/c_api.h"
#include "ladder/registry.h"

namespace attn {
namespace {

AttnProblem e4m3_problem(int d) {
  AttnProblem p;
  p.B = 2;
  p.H = 4;
  p.Hkv = 2;
  p.Nq = 113;
  p.Nk = 1000;
  p.d = d;
  p.causal = true;
  p.dtype = DType::e4m3;
  return p;
}

// The message of the AttnError that `body` throws, or "" (and a failure) if it throws none.
template <class Body>
std::string refusal(Body&& body) {
  try {
    body();
  } catch (const AttnError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected AttnError";
  return "";
}

TEST(Fp8E4m3, DtypeNames) {
  EXPECT_EQ(parse_dtype("e4m3"), DType::e4m3);
  EXPECT_STREQ(dtype_name(DType::e4m3), "e4m3");
  EXPECT_EQ(dtype_bytes(DType::e4m3), 1u);
  EXPECT_EQ(storage_dtype(DType::e4m3), DType::bf16) << "O is bf16";
}

TEST(Fp8E4m3, StageTakesE4m3AtEveryFp8HeadDimWithTheKernelsBlocks) {
  const Stage& s = find_stage("06_fp8_e4m3");
  EXPECT_EQ(s.dtypes, std::vector<DType>{DType::e4m3});
  EXPECT_EQ(s.head_dims, find_stage("06_fp8").head_dims);
  ASSERT_TRUE(bool(s.descale_blocks));
  for (int d : fa3::kFp8HeadDims) {
    const AttnProblem p = e4m3_problem(d);
    EXPECT_NO_THROW(validate_problem(s, p)) << d;
    const DescaleBlocks b = s.descale_blocks(p);
    EXPECT_EQ(b.q_rows, fa3::kFp8QBlockRows) << d;
    EXPECT_EQ(b.kv_rows, fa3::fp8_block_cols(d)) << d;
    // No pre-kernel: the workspace is the unit counter alone; Q, K and V stay the caller's.
    const fa3::Fp8Workspace bf16_ws(p);
    const fa3::Fp8E4m3Workspace ws(p);
    EXPECT_EQ(ws.total, sizeof(int)) << d;
    EXPECT_EQ(s.workspace(p), ws.total) << d;
    EXPECT_LT(ws.total, bf16_ws.total) << d;
    AttnProblem bf16_in = p;
    bf16_in.dtype = DType::fp8_e4m3;
    EXPECT_LT(s.model_hbm_bytes(p), find_stage("06_fp8_no_hadamard").model_hbm_bytes(bf16_in))
        << "no quantization pass: fewer bytes than the bf16 path";
  }
}

TEST(Fp8E4m3, WrongDtypesAreRefusedByName) {
  const Stage& s = find_stage("06_fp8_e4m3");
  AttnProblem p = e4m3_problem(128);
  for (DType t : {DType::bf16, DType::fp16, DType::fp8_e4m3}) {
    p.dtype = t;
    const std::string why = refusal([&] { validate_problem(s, p); });
    EXPECT_NE(why.find(std::string("dtype ") + dtype_name(t) + " is not supported (supported: e4m3)"),
              std::string::npos)
        << why;
  }
  p.dtype = DType::e4m3;
  p.H = p.Hkv;  // past the GQA check of the rungs without it
  for (const Stage& other : registry())
    if (!other.supports(DType::e4m3)) {
      const std::string why = refusal([&] { validate_problem(other, p); });
      EXPECT_NE(why.find("dtype e4m3 is not supported"), std::string::npos) << why;
    }
}

TEST(Fp8E4m3, MissingDescalesAreRefusedByName) {
  const Stage& s = find_stage("06_fp8_e4m3");
  const AttnProblem p = e4m3_problem(64);
  alignas(16) int dummy = 0;  // the library refuses pointers that are not 16-byte aligned
  float descale = 1.f;
  std::vector<char> ws(s.workspace(p));
  AttnTensors t{&dummy, &dummy, &dummy, &dummy, nullptr, ws.data(), ws.size()};
  t.q_descale = t.k_descale = t.v_descale = &descale;
  EXPECT_NO_THROW(validate_tensors(s, p, t));
  for (const char* which : {"q", "k", "v"}) {
    AttnTensors missing = t;
    (which[0] == 'q' ? missing.q_descale : which[0] == 'k' ? missing.k_descale : missing.v_descale) = nullptr;
    const std::string why = refusal([&] { validate_tensors(s, p, missing); });
    EXPECT_NE(why.find(std::string("need their descales: ") + which + "_descale is a null pointer"),
              std::string::npos)
        << why;
  }
}

TEST(Fp8E4m3, CApiRefusalsComeBeforeAnyLaunch) {
  const attn_problem_t cp{2, 4, 2, 113, 1000, 128, 1, 3, 0.f};  // dtype 3: e4m3
  char err[512] = {0};
  alignas(16) int dummy = 0;  // the library refuses pointers that are not 16-byte aligned
  float descale = 1.f;
  size_t need = 0;
  ASSERT_EQ(attn_workspace_bytes("06_fp8_e4m3", &cp, &need, err, sizeof err), ATTN_OK) << err;
  EXPECT_EQ(need, fa3::Fp8E4m3Workspace(e4m3_problem(128)).total);
  int q_rows = 0, kv_rows = 0;
  ASSERT_EQ(attn_descale_blocks("06_fp8_e4m3", &cp, &q_rows, &kv_rows, err, sizeof err), ATTN_OK) << err;
  EXPECT_EQ(q_rows, 64);
  EXPECT_EQ(kv_rows, fa3::fp8_block_cols(128));
  std::vector<char> ws(need);

  // A rung without descales; a bad problem; an unknown rung.
  EXPECT_EQ(attn_descale_blocks("05_fa2_reordered", &cp, &q_rows, &kv_rows, err, sizeof err), ATTN_INVALID_INPUT);
  EXPECT_NE(std::string(err).find("takes no descales"), std::string::npos) << err;
  attn_problem_t bad = cp;
  bad.d = 80;
  EXPECT_EQ(attn_descale_blocks("06_fp8_e4m3", &bad, &q_rows, &kv_rows, err, sizeof err), ATTN_INVALID_INPUT);
  EXPECT_NE(std::string(err).find("d = 80"), std::string::npos) << err;
  EXPECT_EQ(attn_run_fp8_async("07_nope", &cp, &dummy, &dummy, &dummy, &descale, &descale, &descale, &dummy, nullptr,
                               ws.data(), need, nullptr, err, sizeof err),
            ATTN_UNKNOWN_RUNG);

  // Each descale missing, by name.
  EXPECT_EQ(attn_run_fp8_async("06_fp8_e4m3", &cp, &dummy, &dummy, &dummy, &descale, nullptr, &descale, &dummy,
                               nullptr, ws.data(), need, nullptr, err, sizeof err),
            ATTN_INVALID_INPUT);
  EXPECT_NE(std::string(err).find("k_descale is a null pointer"), std::string::npos) << err;
  // The entry without descales refuses e4m3 inputs; the one with them, other dtypes.
  EXPECT_EQ(attn_run_async("06_fp8_e4m3", &cp, &dummy, &dummy, &dummy, &dummy, nullptr, ws.data(), need, nullptr,
                           err, sizeof err),
            ATTN_INVALID_INPUT);
  EXPECT_NE(std::string(err).find("q_descale is a null pointer"), std::string::npos) << err;
  attn_problem_t bf16 = cp;
  bf16.dtype = 0;
  EXPECT_EQ(attn_run_fp8_async("05_fa2_reordered", &bf16, &dummy, &dummy, &dummy, &descale, &descale, &descale,
                               &dummy, nullptr, nullptr, 0, nullptr, err, sizeof err),
            ATTN_INVALID_INPUT);
  EXPECT_NE(std::string(err).find("takes e4m3 inputs (dtype 3)"), std::string::npos) << err;
  attn_problem_t fp8 = cp;
  fp8.dtype = 2;
  EXPECT_EQ(attn_run_fp8_async("06_fp8_e4m3", &fp8, &dummy, &dummy, &dummy, &descale, &descale, &descale, &dummy,
                               nullptr, ws.data(), need, nullptr, err, sizeof err),
            ATTN_INVALID_INPUT);
  EXPECT_NE(std::string(err).find("got dtype fp8"), std::string::npos) << err;
  attn_problem_t unknown = cp;
  unknown.dtype = 4;
  EXPECT_EQ(attn_workspace_bytes("06_fp8_e4m3", &unknown, &need, err, sizeof err), ATTN_INVALID_INPUT);
  EXPECT_NE(std::string(err).find("3 (e4m3)"), std::string::npos) << err;
}

}  // namespace
}  // namespace attn
