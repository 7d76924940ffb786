// FA3 Table 3 on this repository's kernels: RMSE against the fp64 reference on the paper's
// inputs, N(0,1) + N(0,100)·Bernoulli(0.001) for Q, K and V (Fill::outliers).
//
//   fp8_accuracy [--csv PATH] [--time | --time-only] [--timing MODE]
//
// Rows: standard attention in fp16 (02), FA2 fp16 (05), FA3 fp16 (06d), and the four FP8
// stages (per-tensor baseline, full, without block quantization, without incoherent
// processing), on B=1, H=16 and N=4096, d=64; N=4096, d=128; N=2048, d=256. RMSE over
// sampled rows (64 per head; first, last and evenly spread), relative Frobenius error
// alongside.
// --time: the FP8 launch, its pre-kernel alone and its attention kernel alone (on the
// workspace the pre-kernel filled; its TB/s counts the bytes it must move,
// fp8_quantize_bytes), next to 06d bf16, at the paper sweep's long sequences
// (N = 8192, 16384; H = 2048 / d; non-causal) with B = 1. --time-only: that, without the RMSE table.
// --timing: as attn_bench's (flushed, the default and the protocol's; isolated; back-to-back),
// for every timed launch.
#include <cmath>
#include <cstdio>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "06_fa3_hopper/fa3_fp8.h"
#include "common/check.h"
#include "bench/harness.h"
#include "common/hbm_model.h"

using namespace attn;

namespace {

struct Entry {
  const char* label;  // as in FA3 Table 3
  const char* rung;
  DType dtype;
};

const Entry kEntries[] = {
    {"standard attention fp16", "02_safe_softmax", DType::fp16},
    {"FA2 fp16", "05_fa2_reordered", DType::fp16},
    {"FA3 fp16", "06d_fa3", DType::fp16},
    {"fp8 per-tensor, no Hadamard (baseline)", "06_fp8_per_tensor", DType::fp8_e4m3},
    {"FA3 fp8 (block quant + Hadamard)", "06_fp8", DType::fp8_e4m3},
    {"fp8 without block quantization", "06_fp8_per_tensor_hadamard", DType::fp8_e4m3},
    {"fp8 without incoherent processing", "06_fp8_no_hadamard", DType::fp8_e4m3},
};

double rmse(const std::vector<double>& a, const std::vector<double>& b) {
  double sum = 0;
  for (size_t i = 0; i < a.size(); ++i) sum += (a[i] - b[i]) * (a[i] - b[i]);
  return std::sqrt(sum / double(a.size()));
}

void accuracy(std::FILE* out, std::ofstream* csv, cudaStream_t stream) {
  struct Dims {
    int N, d;
  };
  constexpr int kRowsPerHead = 64;
  constexpr uint64_t kSeed = 2024;
  std::fprintf(out, "%-42s %6s %5s %4s %10s %10s\n", "method", "N", "d", "", "RMSE", "rel err");
  for (Dims dims : {Dims{4096, 64}, Dims{4096, 128}, Dims{2048, 256}}) {
    for (const Entry& e : kEntries) {
      AttnProblem p;
      p.B = 1;
      p.H = p.Hkv = 16;
      p.Nq = p.Nk = dims.N;
      p.d = dims.d;
      p.dtype = e.dtype;
      const Stage& s = find_stage(e.rung);
      // Same seed for every row: the same random draws, rounded to the row's storage type.
      ProblemInputs in(p, kSeed, Fill::outliers, 0.f, 1.f, stream, true);
      std::vector<RowIndex> rows = sampled_rows(p, kRowsPerHead);
      ReferenceRows ref = reference_rows(p, in.host, rows);
      std::vector<double> o;
      try {
        o = gather_o_rows(run_rung(s, in, stream), p, rows);
      } catch (const AttnError& err) {
        std::fprintf(out, "%-42s refused: %s\n", e.label, err.what());
        continue;
      }
      const double r = rmse(o, ref.o), rel = rel_frobenius(o, ref.o);
      std::fprintf(out, "%-42s %6d %5d %4s %10.2e %10.2e\n", e.label, p.Nq, p.d, dtype_name(e.dtype), r, rel);
      if (csv)
        *csv << e.label << ',' << e.rung << ',' << dtype_name(e.dtype) << ',' << p.B << ',' << p.H << ',' << p.Nq << ','
             << p.d << ',' << r << ',' << rel << '\n';
    }
  }
}

void timing(std::FILE* out, cudaStream_t stream, TimingMode mode) {
  L2Flusher flusher;
  constexpr int kWarmup = 3, kRepeats = 20;
  constexpr double kMaxSeconds = 2.0;
  const double kWarmSeconds = HarnessOptions{}.warm_seconds;  // as the bench: the clock settles first
  constexpr int kHidden = 2048;
  if (mode != TimingMode::flushed)
    std::fprintf(out, "\ntiming: %s (not the protocol's flushed runs)", timing_mode_name(mode));
  std::fprintf(out, "\n%-12s %6s %4s %10s %10s %10s %8s %10s %10s %10s\n", "", "N", "d", "total ms", "quant ms",
               "attn ms", "q / attn", "quant TB/s", "attn TF/s", "06d TF/s");
  for (int d : fa3::kFp8HeadDims)
    for (int N : {8192, 16384}) {
      AttnProblem p;
      p.H = p.Hkv = kHidden / d;
      p.Nq = p.Nk = N;
      p.d = d;
      p.dtype = DType::fp8_e4m3;
      ProblemInputs in(p, 7, Fill::normal, 0.f, 1.f, stream, false);
      RungOutput out8 = run_rung(find_stage("06_fp8"), in, stream);
      AttnTensors t = out8.tensors(in);
      const Stage& full = find_stage("06_fp8");
      const Timing total = time_launch([&] { full.launch(p, t, stream); }, flusher, stream, kWarmup, kRepeats,
                                       kMaxSeconds, kWarmSeconds, mode);
      const fa3::Fp8Options opt;  // the full variant's options
      const fa3::Fp8QuantizeFn quantize = fa3::fp8_quantize_for(d);
      const Timing quant = time_launch([&] { quantize(p, t, opt, stream); }, flusher, stream, kWarmup, kRepeats,
                                       kMaxSeconds, kWarmSeconds, mode);
      const fa3::Fp8AttentionFn attention = fa3::fp8_attention_for(d);
      const Timing attn = time_launch([&] { attention(p, t, fa3::Schedule::persistent, stream); }, flusher, stream,
                                      kWarmup, kRepeats, kMaxSeconds, kWarmSeconds, mode);
      AttnProblem pb = p;
      pb.dtype = DType::bf16;
      ProblemInputs inb(pb, 7, Fill::normal, 0.f, 1.f, stream, false);
      const Stage& bf16 = find_stage("06d_fa3");
      RungOutput outb = run_rung(bf16, inb, stream);
      AttnTensors tb = outb.tensors(inb);
      const Timing t06d = time_launch([&] { bf16.launch(pb, tb, stream); }, flusher, stream, kWarmup, kRepeats,
                                      kMaxSeconds, kWarmSeconds, mode);
      const double attn_ms = attn.median_ms, flops = hbm::flops(p);
      const double quant_bytes = fa3::fp8_quantize_bytes(p, opt);  // HBM bytes the pre-kernel must move
      std::fprintf(out, "%-12s %6d %4d %10.3f %10.3f %10.3f %7.1f%% %10.2f %10.1f %10.1f\n", "06_fp8", N, d,
                   total.median_ms, quant.median_ms, attn_ms, 100 * quant.median_ms / attn_ms,
                   quant_bytes / (quant.median_ms * 1e-3) / 1e12, flops / (attn_ms * 1e-3) / 1e12,
                   flops / (t06d.median_ms * 1e-3) / 1e12);
    }
}

}  // namespace

int main(int argc, char** argv) {
  std::string csv_path;
  bool time_it = false, accuracy_too = true;
  TimingMode mode = TimingMode::flushed;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--csv" && i + 1 < argc) {
      csv_path = argv[++i];
    } else if (a == "--time") {
      time_it = true;
    } else if (a == "--time-only") {
      time_it = true;
      accuracy_too = false;
    } else if (a == "--timing" && i + 1 < argc && parse_timing_mode(argv[i + 1], &mode)) {
      ++i;
    } else {
      std::fprintf(stderr, "usage: %s [--csv PATH] [--time | --time-only] [--timing flushed|isolated|back-to-back]\n",
                   argv[0]);
      return 2;
    }
  }
  try {
    std::string why;
    if (!cuda_device_available(&why)) throw std::runtime_error("no GPU: " + why);
    cudaStream_t stream;
    CUDA_CHECK(cudaStreamCreate(&stream));
    std::ofstream csv;
    if (!csv_path.empty()) {
      csv.open(csv_path);
      if (!csv) throw std::runtime_error("cannot write " + csv_path);
      csv << "method,rung,dtype,B,H,N,d,rmse,rel_err\n";
    }
    if (accuracy_too) accuracy(stdout, csv_path.empty() ? nullptr : &csv, stream);
    if (time_it) timing(stdout, stream, mode);
    CUDA_CHECK(cudaStreamDestroy(stream));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fp8_accuracy: %s\n", e.what());
    return 1;
  }
  return 0;
}
