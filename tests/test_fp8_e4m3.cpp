// GPU tests of rung 06's FP8 path on e4m3 inputs (06_fp8_e4m3, fa3_fp8_e4m3.h): given the
// e4m3 Q, K, V and block descales that the bf16 path's pre-kernel makes without Hadamard
// (06_fp8_no_hadamard's workspace), it must give that stage's O and lse bit for bit (the same
// attention kernel on the same bytes and scales, with no pre-kernel: its workspace is the
// unit counter alone), and its O must match fp64 attention on the dequantized inputs. Odd shapes: one key,
// 17 and 1000 keys, causal, GQA, Nq != Nk, rows that see no key, every FP8 head dim. The
// sanitizer subsets and the refusals run it through the harness's e4m3 inputs (test_gpu.cpp).
// Without a GPU every test here skips with the reason.
#include <gtest/gtest.h>

#include <cuda_fp8.h>

#include <cmath>
#include <string>
#include <vector>

#include "06_fa3_hopper/fa3_fp8.h"
#include "06_fa3_hopper/fa3_fp8_e4m3.h"
#include "ladder/c_api.h"
#include "tests/fp8_model.h"
#include "tests/gpu_test_util.h"

using namespace attn;
using namespace attn::testing;

namespace {

template <typename T>
std::vector<T> to_host(const void* base, size_t offset, size_t count) {
  std::vector<T> out(count);
  CUDA_CHECK(cudaMemcpy(out.data(), static_cast<const char*>(base) + offset, count * sizeof(T),
                        cudaMemcpyDeviceToHost));
  return out;
}

template <typename T>
DeviceBuffer to_device(const std::vector<T>& host) {
  DeviceBuffer b(host.size() * sizeof(T));
  CUDA_CHECK(cudaMemcpy(b.get(), host.data(), b.bytes(), cudaMemcpyHostToDevice));
  return b;
}

std::vector<unsigned char> device_bytes(const DeviceBuffer& b) { return to_host<unsigned char>(b.get(), 0, b.bytes()); }

// What a caller holding FP8 activations passes: e4m3 Q, K, V and their descales, on the host.
struct E4m3Inputs {
  std::vector<uint8_t> q8, k8, v8;
  std::vector<float> q_scale, k_scale, v_scale;
};

// The e4m3 inputs that 06_fp8_no_hadamard's pre-kernel made of `in` (its workspace `ws_dev`):
// Q̂, K̂, V̂ and the scales as they are, V̂'s bytes each checked against V quantized here with
// the pre-kernel's block scales (x * (1 / scale), rounded to nearest e4m3, as fp8_quantize.cuh).
E4m3Inputs e4m3_inputs_of(const AttnProblem& p, const ProblemInputs& in, const void* ws_dev) {
  const fa3::Fp8Workspace ws(p);
  const int q_heads = p.B * p.H, kv_heads = p.B * p.Hkv, d = p.d;
  E4m3Inputs e;
  e.q8 = to_host<uint8_t>(ws_dev, ws.q8, p.q_elems());
  e.k8 = to_host<uint8_t>(ws_dev, ws.k8, p.kv_elems());
  e.q_scale = to_host<float>(ws_dev, ws.q_scale, size_t(q_heads) * ws.q_blocks);
  e.k_scale = to_host<float>(ws_dev, ws.k_scale, size_t(kv_heads) * ws.kv_blocks);
  e.v_scale = to_host<float>(ws_dev, ws.v_scale, size_t(kv_heads) * ws.kv_blocks);
  e.v8 = to_host<uint8_t>(ws_dev, ws.v8, p.kv_elems());
  int bad = 0;
  for (int h = 0; h < kv_heads; ++h)
    for (int n = 0; n < p.Nk; ++n) {
      const int64_t block = n / ws.block_cols;
      const float inv_scale = 1.f / e.v_scale[int64_t(h) * ws.kv_blocks + block];
      for (int c = 0; c < d; ++c) {
        const int64_t i = (int64_t(h) * p.Nk + n) * d + c;
        const uint8_t host = __nv_cvt_float_to_fp8(in.host.v[i] * inv_scale, __NV_SATFINITE, __NV_E4M3);
        if (host != e.v8[i] && bad++ < 10)
          ADD_FAILURE() << "V of kv head " << h << ", key " << n << ", dim " << c << ": host byte " << int(host)
                        << ", pre-kernel's " << int(e.v8[i]);
      }
    }
  return e;
}

// Q, K, V as the kernel sees them: every e4m3 value times its block's descale.
HostInputs dequantized(const AttnProblem& p, const E4m3Inputs& e) {
  const fa3::Fp8Workspace ws(p);
  auto expand = [&](const std::vector<uint8_t>& x8, const std::vector<float>& scale, int N, int block_rows,
                    int64_t blocks) {
    std::vector<float> x(x8.size());
    for (size_t i = 0; i < x.size(); ++i) {
      const int64_t row = int64_t(i) / p.d, head = row / N, n = row % N;
      x[i] = float(e4m3_value(x8[i]) * scale[head * blocks + n / block_rows]);
    }
    return x;
  };
  HostInputs h;
  h.q = expand(e.q8, e.q_scale, p.Nq, fa3::kFp8QBlockRows, ws.q_blocks);
  h.k = expand(e.k8, e.k_scale, p.Nk, ws.block_cols, ws.kv_blocks);
  h.v = expand(e.v8, e.v_scale, p.Nk, ws.block_cols, ws.kv_blocks);
  return h;
}

// The caller's tensors on the device, each in an allocation of its own (read in place).
struct E4m3Device {
  DeviceBuffer q8, k8, v8, q_scale, k_scale, v_scale;
  explicit E4m3Device(const E4m3Inputs& e)
      : q8(to_device(e.q8)), k8(to_device(e.k8)), v8(to_device(e.v8)), q_scale(to_device(e.q_scale)),
        k_scale(to_device(e.k_scale)), v_scale(to_device(e.v_scale)) {}
};

struct Case {
  int B, H, Hkv, Nq, Nk;
  bool causal;
};

// One key; 17 keys, causal, GQA; 1000 keys over several K/V blocks, causal; Nq < Nk; Nq > Nk
// with a causal mask, whose first rows see no key.
const Case kCases[] = {
    {1, 2, 1, 17, 1, false},    {1, 4, 2, 17, 17, true},    {2, 4, 2, 1000, 1000, true},
    {1, 3, 1, 113, 1000, false}, {1, 2, 2, 1000, 17, true},
};

TEST_F(Gpu, Fp8E4m3InputsGiveTheBf16PathsOutputBitForBit) {
  const Stage& bf16_path = find_stage("06_fp8_no_hadamard");
  const Stage& e4m3_path = find_stage("06_fp8_e4m3");
  int checked = 0;
  for (int d : fa3::kFp8HeadDims)
    for (const Case& c : kCases) {
      const AttnProblem p{c.B, c.H, c.Hkv, c.Nq, c.Nk, d, c.causal, DType::fp8_e4m3};
      AttnProblem p8 = p;
      p8.dtype = DType::e4m3;
      if (!runs_here(bf16_path, p) || !runs_here(e4m3_path, p8)) continue;
      SCOPED_TRACE(p8.describe());
      ProblemInputs in(p, 501 + d + c.Nk, Fill::normal, 0.f, 1.f, stream_, true);
      const RungOutput ref_out = run_rung(bf16_path, in, stream_);
      const E4m3Inputs e = e4m3_inputs_of(p, in, ref_out.workspace.get());
      const E4m3Device dev(e);

      RungOutput out;
      out.o = DeviceBuffer(ref_out.o.bytes());
      out.lse = DeviceBuffer(ref_out.lse.bytes());
      out.workspace = DeviceBuffer(e4m3_path.workspace(p8));
      fill_poison(out.o.get(), out.o.bytes(), stream_);
      fill_poison(out.lse.get(), out.lse.bytes(), stream_);
      AttnTensors t{dev.q8.get(), dev.k8.get(), dev.v8.get(), out.o.get(), out.lse.as<float>(),
                    out.workspace.get(), out.workspace.bytes()};
      t.q_descale = dev.q_scale.as<float>();
      t.k_descale = dev.k_scale.as<float>();
      t.v_descale = dev.v_scale.as<float>();
      run_stage(e4m3_path, p8, t, stream_);
      CUDA_CHECK(cudaStreamSynchronize(stream_));

      EXPECT_TRUE(device_bytes(out.o) == device_bytes(ref_out.o)) << "O differs from 06_fp8_no_hadamard's";
      EXPECT_TRUE(device_bytes(out.lse) == device_bytes(ref_out.lse)) << "lse differs from 06_fp8_no_hadamard's";

      // Against fp64 on the inputs it was given (exact: the dequantized e4m3 values), where
      // only P's rounding to e4m3 errs.
      const std::vector<RowIndex> rows = all_rows(p8);
      const ReferenceRows ref = reference_rows(p8, dequantized(p8, e), rows);
      double max_abs = 0;
      EXPECT_LE(rel_frobenius(gather_o_rows(out, p8, rows), ref.o, &max_abs), tolerance(DType::e4m3))
          << "vs fp64, max abs error " << max_abs;
      const std::vector<double> lse = gather_lse(out, p8, rows);
      for (size_t r = 0; r < rows.size(); ++r)
        if (std::isinf(ref.lse[r]))
          EXPECT_TRUE(std::isinf(lse[r]) && lse[r] < 0) << "row " << rows[r].i << " sees no key: lse " << lse[r];
        else
          ASSERT_NEAR(lse[r], ref.lse[r], lse_tolerance(DType::e4m3, ref.lse[r])) << "lse of row " << rows[r].i;
      ++checked;
    }
  if (checked == 0) GTEST_SKIP() << "06_fp8_e4m3 does not run here";
}

// The C entry: attn_run_fp8_async on the caller's tensors and workspace gives run_stage's O;
// attn_run_async, which has no descales, refuses e4m3 inputs before any launch.
TEST_F(Gpu, Fp8E4m3ThroughTheCApi) {
  const AttnProblem p{2, 4, 2, 113, 300, 128, true, DType::fp8_e4m3};
  AttnProblem p8 = p;
  p8.dtype = DType::e4m3;
  const Stage& e4m3_path = find_stage("06_fp8_e4m3");
  if (!runs_here(e4m3_path, p8)) GTEST_SKIP() << "06_fp8_e4m3 does not run here";
  ProblemInputs in(p8, 601, Fill::normal, 0.f, 1.f, stream_, false);
  const RungOutput ref_out = run_rung(e4m3_path, in, stream_);

  const attn_problem_t cp{p8.B, p8.H, p8.Hkv, p8.Nq, p8.Nk, p8.d, 1, int(DType::e4m3), 0.f};
  char err[512] = {0};
  size_t need = 0;
  ASSERT_EQ(attn_workspace_bytes("06_fp8_e4m3", &cp, &need, err, sizeof err), ATTN_OK) << err;
  int q_rows = 0, kv_rows = 0;
  ASSERT_EQ(attn_descale_blocks("06_fp8_e4m3", &cp, &q_rows, &kv_rows, err, sizeof err), ATTN_OK) << err;
  EXPECT_EQ(q_rows, fa3::kFp8QBlockRows);
  EXPECT_EQ(kv_rows, fa3::fp8_block_cols(p8.d));
  DeviceBuffer o(ref_out.o.bytes()), lse(ref_out.lse.bytes()), ws(need);
  fill_poison(o.get(), o.bytes(), stream_);
  ASSERT_EQ(attn_run_fp8_async("06_fp8_e4m3", &cp, in.q.get(), in.k.get(), in.v.get(), in.q_descale.as<float>(),
                               in.k_descale.as<float>(), in.v_descale.as<float>(), o.get(), lse.as<float>(), ws.get(),
                               need, stream_, err, sizeof err),
            ATTN_OK)
      << err;
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  EXPECT_TRUE(device_bytes(o) == device_bytes(ref_out.o));

  fill_poison(o.get(), o.bytes(), stream_);
  EXPECT_EQ(attn_run_async("06_fp8_e4m3", &cp, in.q.get(), in.k.get(), in.v.get(), o.get(), nullptr, ws.get(), need,
                           stream_, err, sizeof err),
            ATTN_INVALID_INPUT);
  EXPECT_NE(std::string(err).find("descales"), std::string::npos) << err;
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  for (unsigned char b : device_bytes(o)) ASSERT_EQ(b, 0xFF) << "a refused call wrote to O";
}

}  // namespace
