// GPU tests of rung 06's FP8 path beyond the ladder tests (which run every fp8 stage against
// fp64 on the odd shapes, sanitize it and check repeat runs, in test_gpu.cpp):
//   - the softmax's integer-ALU 2^x (exp2_e4m3_linear): the e4m3 bytes of its line, bit for
//     bit the host's arithmetic, and 0 at -inf (masked keys); its running max's grid;
//   - the pre-kernel against its host model (tests/fp8_model.h) at every FP8 head dim: the
//     Hadamard transform, the block scales, the e4m3 rounding, V̂'s rows and (06_fp8_vt_hbm)
//     V̂ᵀ's permuted key order, with one block per CTA and with several (its persistent grid);
//   - the in-kernel V transpose (transpose_v) against the pre-kernel's: with the same key
//     order O is the same bit for bit; with the keys in order and P permuted in registers,
//     the same to within the QGMMA's summation order;
//   - FA3 Table 3 in small: on the paper's outlier inputs, block quantization with
//     incoherent processing must beat one scale per tensor without it. bench/fp8_accuracy
//     prints the whole table.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <map>

#include "06_fa3_hopper/fa3_fp8.h"
#include "tests/fp8_model.h"
#include "tests/gpu_test_util.h"

using namespace attn;
using namespace attn::testing;

namespace {

double rmse(const std::vector<double>& a, const std::vector<double>& b) {
  double sum = 0;
  for (size_t i = 0; i < a.size(); ++i) sum += (a[i] - b[i]) * (a[i] - b[i]);
  return std::sqrt(sum / double(a.size()));
}

template <typename T>
std::vector<T> to_host(const char* base, size_t offset, size_t count) {
  std::vector<T> out(count);
  CUDA_CHECK(cudaMemcpy(out.data(), base + offset, count * sizeof(T), cudaMemcpyDeviceToHost));
  return out;
}

// Q̂ or K̂ (e4m3 [heads, N, d]) and their scales (one per block of `block_rows`) against the
// model: y = x M (or x), scale = amax / 448 over the block (or the tensor; at least
// FLT_MIN, 1 for an all-zero block), and every byte
// y / scale rounded to nearest.
void expect_rows_quantized(const char* what, const std::vector<float>& x, const std::vector<uint8_t>& q8,
                           const std::vector<float>& scale, int heads, int N, int d, int block_rows, bool hadamard,
                           bool block_scales) {
  SCOPED_TRACE(what);
  const int blocks = (N + block_rows - 1) / block_rows;
  std::vector<double> y(x.size());
  for (size_t row = 0; row < x.size() / d; ++row) {
    std::vector<double> r(x.begin() + row * d, x.begin() + (row + 1) * d);
    if (hadamard) r = hadamard_row(r);
    std::copy(r.begin(), r.end(), y.begin() + row * d);
  }
  std::vector<double> block_amax(size_t(heads) * blocks, 0.0);
  for (size_t i = 0; i < y.size(); ++i) {
    const size_t row = i / d, head = row / N, block = (row % N) / block_rows;
    double& amax = block_amax[head * blocks + block];
    amax = std::max(amax, std::fabs(y[i]));
  }
  const double tensor_amax = *std::max_element(block_amax.begin(), block_amax.end());
  int bad = 0;
  for (size_t b = 0; b < block_amax.size(); ++b) {
    const double amax = block_scales ? block_amax[b] : tensor_amax;
    const double expected = amax > 0 ? std::max(amax / fa3::kE4m3Max, double(FLT_MIN)) : 1.0;
    EXPECT_NEAR(scale[b], expected, 1e-5 * expected) << "scale of block " << b;
  }
  for (size_t i = 0; i < y.size() && bad < 10; ++i) {
    const size_t row = i / d, head = row / N, block = (row % N) / block_rows;
    const double s = scale[head * blocks + block];
    const double got = e4m3_value(q8[i]) * s;
    const double slack = 1e-5 * fa3::kE4m3Max * s;  // fp32 on the GPU vs double here, near a rounding tie
    if (!(std::fabs(got - y[i]) <= e4m3_rounding_bound(y[i], s) + slack)) {
      ADD_FAILURE() << "row " << row % N << " of head " << head << ", column " << i % d << ": " << got << " vs "
                    << y[i];
      ++bad;
    }
  }
}

// The pre-kernel of stage `name` on problem p (its workspace, after one run) against the
// host model: Q̂, K̂, V̂ and their scales, or for 06_fp8_vt_hbm every byte of V̂ᵀ.
void expect_pre_kernel_matches_model(const char* name, const AttnProblem& p, cudaStream_t stream) {
  const Stage& s = find_stage(name);
  SCOPED_TRACE(std::string(name) + " d = " + std::to_string(p.d) + ", " + p.describe());
  const bool block_scales = std::string(name) != "06_fp8_per_tensor", hadamard = block_scales;
  const bool vt_in_hbm = std::string(name) == "06_fp8_vt_hbm";
  const int d = p.d;
  ProblemInputs in(p, 71 + d, Fill::normal, 0.f, 1.f, stream, true);
  RungOutput out = run_rung(s, in, stream);  // the attention kernel only reads the workspace
  const fa3::Fp8Workspace ws(p, vt_in_hbm);
  const char* base = static_cast<const char*>(out.workspace.get());
  const int q_heads = p.B * p.H, kv_heads = p.B * p.Hkv;
  expect_rows_quantized("Q̂", in.host.q, to_host<uint8_t>(base, ws.q8, p.q_elems()),
                        to_host<float>(base, ws.q_scale, size_t(q_heads) * ws.q_blocks), q_heads, p.Nq, d,
                        fa3::kFp8QBlockRows, hadamard, block_scales);
  expect_rows_quantized("K̂", in.host.k, to_host<uint8_t>(base, ws.k8, p.kv_elems()),
                        to_host<float>(base, ws.k_scale, size_t(kv_heads) * ws.kv_blocks), kv_heads, p.Nk, d,
                        ws.block_cols, hadamard, block_scales);
  const std::vector<float> v_scale = to_host<float>(base, ws.v_scale, size_t(kv_heads) * ws.kv_blocks);
  if (!vt_in_hbm) {  // V̂ as K̂ is, without the Hadamard transform (the attention kernel transposes it)
    expect_rows_quantized("V̂", in.host.v, to_host<uint8_t>(base, ws.v8, p.kv_elems()), v_scale, kv_heads, p.Nk, d,
                          ws.block_cols, false, block_scales);
    return;
  }
  // V̂ᵀ [head][dim][key position]: key n of block n / B_c at wgmma_key_position(n % B_c),
  // V / v_scale rounded (no Hadamard on V); padded keys are zero.
  const std::vector<uint8_t> vt8 = to_host<uint8_t>(base, ws.v8, size_t(kv_heads) * d * ws.nk_padded);
  int bad = 0;
  for (int h = 0; h < kv_heads && bad < 10; ++h)
    for (int64_t n = 0; n < ws.nk_padded; ++n)
      for (int c = 0; c < d; ++c) {
        const int64_t block = n / ws.block_cols;
        const int64_t pos = block * ws.block_cols + fa3::wgmma_key_position(int(n % ws.block_cols));
        const uint8_t byte = vt8[(int64_t(h) * d + c) * ws.nk_padded + pos];
        const double sv = v_scale[int64_t(h) * ws.kv_blocks + block];
        const double want = n < p.Nk ? in.host.v[(int64_t(h) * p.Nk + n) * d + c] : 0.0;
        const double got = e4m3_value(byte) * sv;
        if (!(std::fabs(got - want) <= e4m3_rounding_bound(want, sv) + 1e-5 * fa3::kE4m3Max * sv) && bad++ < 10)
          ADD_FAILURE() << "V̂ᵀ of kv head " << h << ", key " << n << ", dim " << c << ": " << got << " vs " << want;
      }
}

TEST_F(Gpu, Fp8PreKernelMatchesHostModel) {
  for (const char* name : {"06_fp8", "06_fp8_per_tensor", "06_fp8_vt_hbm"})
    for (int d : fa3::kFp8HeadDims) {
      // Ragged: 3 full Q blocks of 64 and 8 rows; K/V blocks of 128 keys: 2 full and 44 keys
      // (of 192 at d = 128: 1 and 108); V̂ᵀ padded to 384 with zeros.
      const AttnProblem p{1, 4, 2, 200, 300, d, false, DType::fp8_e4m3};  // B, H, Hkv, Nq, Nk, d
      if (!runs_here(find_stage(name), p)) GTEST_SKIP() << name << " does not run here";
      expect_pre_kernel_matches_model(name, p, stream_);
    }
}

// The pre-kernel's grid is persistent (a few CTAs per SM, each taking every G-th block, its
// bulk copies two blocks ahead): with several blocks per CTA of every tensor (2400 Q blocks
// and 1200 K/V blocks at d = 64 and 256, 800 at d = 128; a 132-SM GPU runs at most 528 and
// 264 CTAs), each stage of shared memory is refilled and its barrier's phase turns over.
// Many heads and short rows keep the attention kernel cheap; in the sanitizers' subset.
TEST_F(Gpu, SanitizeFp8PreKernelManyBlocksPerCta) {
  for (const char* name : {"06_fp8", "06_fp8_per_tensor", "06_fp8_vt_hbm"})
    for (int d : fa3::kFp8HeadDims) {
      const AttnProblem p{2, 400, 200, 130, 300, d, false, DType::fp8_e4m3};  // ragged tails as above
      if (!runs_here(find_stage(name), p)) GTEST_SKIP() << name << " does not run here";
      expect_pre_kernel_matches_model(name, p, stream_);
    }
}

// The producer's transpose (fp8h_fa3.cuh: transpose_v) against the pre-kernel's: the three
// V paths (Fp8VPath) on the same bf16 inputs, whose pre-kernels round Q, K, V to the same
// bytes and scales. With V̂ᵀ's keys in the same order (06_fp8, 06_fp8_vt_hbm) every QGMMA
// gets the same operands, so O and lse must agree bit for bit: each byte of the in-kernel
// V̂ᵀ is the pre-kernel's. With the keys in order and P permuted across the quad
// (06_fp8_keys_in_order) the products are the same but summed in another order inside each QGMMA: O
// agrees to within that rounding (a wrong permute would pair P with other keys' V: an error
// of order 1). Shapes: several K/V blocks with a ragged last one (the copy engine's zero
// rows past Nk), GQA, causal, and more tiles than SMs (the rings wrap, the transposers stop
// after the CTA's last block), at every FP8 head dim; in the sanitizers' subset.
TEST_F(Gpu, SanitizeFp8InKernelTransposeMatchesThePreKernels) {
  const Stage& in_order = find_stage("06_fp8_keys_in_order");
  const Stage& permuted = find_stage("06_fp8");
  const Stage& hbm = find_stage("06_fp8_vt_hbm");
  int checked = 0;
  for (int d : fa3::kFp8HeadDims)
    for (const AttnProblem& p : {AttnProblem{1, 4, 2, 333, 1000, d, false, DType::fp8_e4m3},
                                 AttnProblem{2, 100, 20, 130, 300, d, true, DType::fp8_e4m3}}) {
      if (!runs_here(in_order, p)) continue;
      SCOPED_TRACE(p.describe());
      ProblemInputs in(p, 811 + d, Fill::normal, 0.f, 1.f, stream_, false);
      const RungOutput a = run_rung(hbm, in, stream_), b = run_rung(permuted, in, stream_),
                       c = run_rung(in_order, in, stream_);
      auto bytes = [](const DeviceBuffer& x) { return to_host<unsigned char>(static_cast<const char*>(x.get()), 0, x.bytes()); };
      EXPECT_TRUE(bytes(a.o) == bytes(b.o)) << "O: in-kernel transpose (keys permuted) vs the pre-kernel's V̂ᵀ";
      EXPECT_TRUE(bytes(a.lse) == bytes(b.lse)) << "lse: in-kernel transpose (keys permuted) vs the pre-kernel's V̂ᵀ";
      const double err = rel_frobenius_device(c.o.get(), b.o.get(), p.o_elems(), storage_dtype(p.dtype), stream_);
      EXPECT_LE(err, 4e-3) << "keys in order with P permuted in registers vs keys permuted";
      ++checked;
    }
  if (checked == 0) GTEST_SKIP() << "06_fp8_keys_in_order does not run here";
}

// exp2_e4m3_linear and e4m3_linear_grid on the device (the CPU test
// Exp2Linear.E4m3BytesAreTheLineRounded checks their host mirrors): the bytes the line
// rounds to, and bit for bit the host's arithmetic.
TEST_F(Gpu, Fp8LinearExp2E4m3Bytes) {
  if (!runs_here(find_stage("06_fp8"), AttnProblem{1, 1, 1, 64, 64, 128, false, DType::fp8_e4m3}))
    GTEST_SKIP() << "06_fp8 does not run here";
  const Exp2E4m3Points points = exp2_e4m3_linear_points();
  const std::vector<uint8_t> b = fa3::exp2_e4m3_linear_on_gpu(points.s, points.c);
  expect_exp2_e4m3_linear_bytes(points, b);
  for (size_t i = 0; i < b.size(); ++i)
    if (b[i] != exp2_e4m3_linear_host(points.s[i], 1.f, points.c[i])) {
      ADD_FAILURE() << "s " << points.s[i] << " c " << points.c[i] << ": device " << int(b[i]) << ", host "
                    << int(exp2_e4m3_linear_host(points.s[i], 1.f, points.c[i]));
      break;
    }
  const std::vector<float> m = {-INFINITY, -3000.7f, -1.f, 0.f, 0.06f, 7.77f, 2999.9f};
  const std::vector<float> g = fa3::e4m3_linear_grid_on_gpu(m);
  for (size_t i = 0; i < m.size(); ++i) EXPECT_EQ(g[i], e4m3_linear_grid_host(m[i])) << m[i];
}

TEST_F(Gpu, Fp8FullVariantBeatsPerTensorBaselineOnOutliers) {
  for (int d : fa3::kFp8HeadDims) {
    AttnProblem p;
    p.H = p.Hkv = 4;
    p.Nq = p.Nk = 2048;
    p.d = d;
    p.dtype = DType::fp8_e4m3;
    SCOPED_TRACE("d = " + std::to_string(d));
    ProblemInputs in(p, 99, Fill::outliers, 0.f, 1.f, stream_, true);
    std::vector<RowIndex> rows = sampled_rows(p, 128);
    ReferenceRows ref = reference_rows(p, in.host, rows);
    std::map<std::string, double> err;
    for (const char* name : {"06_fp8", "06_fp8_per_tensor"}) {
      const Stage& s = find_stage(name);
      ASSERT_TRUE(runs_here(s, p)) << name << " refuses " << p.describe();
      err[name] = rmse(gather_o_rows(run_rung(s, in, stream_), p, rows), ref.o);
      std::printf("  d = %3d  %-20s RMSE %.3e\n", d, name, err[name]);
    }
    // FA3 reports 2.6x at d = 128 (9.1e-3 vs 2.4e-2); measured here on an H200 at d = 128:
    // 8.9e-3 vs 1.75e-2 (2.0x).
    EXPECT_LT(err["06_fp8"], 0.75 * err["06_fp8_per_tensor"]) << "block scales + Hadamard must cut the error";
  }
}

// ---------------------------------------------------------------- the peaked softmax (issue 35)
// Logits 8x the default (scale 8/sqrt(d) on N(0,1) inputs: their standard deviation
// sigma_L = 8), N = 257. On bf16 inputs every FP8 stage's error passes the flat bound 0.1
// here: the host model has 1.1e-1, nearly all of it the noise that rounding Q and K puts on
// the logits (tests/test_cpu.cpp, Fp8Model.PeakedSoftmaxErrorIsTheLogitsNoise). Each FP8
// stage must stay within the bound that grows with sigma_L (common/tolerance.h), lse within
// its bound, and O must lie nearer the host model's O (tests/fp8_model.h, the stage's
// roundings) than fp64's: the model's roundings are the kernel's error. On e4m3 inputs
// (06_fp8_e4m3) the flat bound holds.
TEST_F(Gpu, Fp8PeakedSoftmaxIsTheModelsAndWithinItsBound) {
  int checked = 0;
  for (const Stage& s : registry()) {
    const DType t = s.supports(DType::e4m3) ? DType::e4m3 : DType::fp8_e4m3;
    if (!s.supports(t)) continue;
    for (int d : fa3::kFp8HeadDims) {
      AttnProblem p{1, 4, 4, 257, 257, d, false, t};  // B, H, Hkv, Nq, Nk, d
      p.scale = 8.f / std::sqrt(float(d));
      if (!runs_here(s, p)) continue;
      SCOPED_TRACE(s.name + " d = " + std::to_string(d));
      ProblemInputs in(p, 35 + d, Fill::normal, 0.f, 1.f, stream_, true);
      const std::vector<RowIndex> rows = all_rows(p);
      const ReferenceRows ref = reference_rows(p, in.host, rows);
      const RungOutput out = run_rung(s, in, stream_);
      const std::vector<double> o = gather_o_rows(out, p, rows);
      const Fp8ModelOutput model = fp8_forward_model(p, in.host, fp8_model_options(s.name));
      const double err = rel_frobenius(o, ref.o), to_model = rel_frobenius(o, model.o);
      const double bound = tolerance(t, logit_std(p));
      std::printf("  %-28s d = %3d  vs fp64 %.3e (model %.3e, bound %.3e)  vs model %.3e\n", s.name.c_str(), d, err,
                  rel_frobenius(model.o, ref.o), bound, to_model);
      EXPECT_LE(err, bound) << "vs fp64";
      if (t == DType::fp8_e4m3)
        EXPECT_LT(to_model, 0.5 * err) << "the host model's roundings are the kernel's error";
      else
        EXPECT_LT(to_model, 0.5 * tolerance(t)) << "the host model";
      if (s.writes_lse) {
        const std::vector<double> lse = gather_lse(out, p, rows);
        for (size_t r = 0; r < rows.size(); ++r)
          ASSERT_NEAR(lse[r], ref.lse[r], lse_tolerance(t, ref.lse[r], logit_std(p))) << "lse of row " << rows[r].i;
      }
      ++checked;
    }
  }
  if (checked == 0) GTEST_SKIP() << "no FP8 stage runs here";
}

}  // namespace
