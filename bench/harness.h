// Runs rungs on problems: seeded inputs, poisoned outputs, the every-element-written
// check, the chain check against the rung below, the fp64 check, timing, TFLOPS, modelled
// and measured bytes. One CSV/JSON row per (rung, problem). The bench and the GPU tests
// are both built on this file.
#pragma once

#include <cuda_runtime.h>

#include <functional>
#include <map>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "common/attention.h"
#include "common/device_buffer.h"
#include "common/hbm_counter.h"
#include "common/reference.h"
#include "common/reference_backward.h"
#include "ladder/registry.h"

namespace attn {

// Q, K, V on the device, filled from a seed, and their exact float copies on the host
// (for the fp64 reference) when asked for. e4m3 problems: the seeded values over a power of
// two c per tensor (the largest then at most 448), rounded to e4m3, with c as every descale,
// one per row (any rung's blocks of rows read inside them); the host copies hold the
// dequantized values.
struct ProblemInputs {
  ProblemInputs(const AttnProblem& p, uint64_t seed, Fill dist, float mean, float stddev, cudaStream_t stream,
                bool keep_host);
  AttnProblem p;
  DeviceBuffer q, k, v;
  DeviceBuffer q_descale, k_descale, v_descale;  // e4m3 only
  HostInputs host;  // empty unless keep_host
};

// One rung's output for one problem.
struct RungOutput {
  DeviceBuffer o, lse, workspace;
  AttnTensors tensors(const ProblemInputs& in) const;
};

// Validates, checks free memory for the workspace, allocates, poisons O and lse, runs the
// rung once and synchronizes. Throws AttnError on a refusal, CudaError on a CUDA failure.
RungOutput run_rung(const Stage& s, const ProblemInputs& in, cudaStream_t stream);

// ---- The backward pass (Stage::launch_backward; attn_bench --backward, the GPU tests).

// dO = dL/dO on the device, seeded as the inputs are, and its float copy on the host when
// asked for (for reference_backward).
struct GradInput {
  GradInput(const AttnProblem& p, uint64_t seed, Fill dist, float mean, float stddev, cudaStream_t stream,
            bool keep_host);
  DeviceBuffer dout;
  std::vector<float> host;  // empty unless keep_host
};

// One rung's backward on one problem: its own forward's O and lse, then dQ, dK, dV.
struct RungGrads {
  RungOutput forward;
  DeviceBuffer dq, dk, dv, workspace;
  AttnBwdTensors tensors(const ProblemInputs& in, const GradInput& g) const;
};

// validate_backward_problem; runs the rung's forward (run_rung) for O and lse; poisons dQ,
// dK, dV and the backward workspace; runs the backward once and synchronizes. Throws
// AttnError on a refusal (a forward-only rung: "no backward pass"), CudaError on a failure.
RungGrads run_rung_backward(const Stage& s, const ProblemInputs& in, const GradInput& g, cudaStream_t stream);

// n elements of dtype t (bf16 or fp16) on the device, as double on the host.
std::vector<double> download_as_double(const void* src, int64_t n, DType t);

// O rows (as double) and lse values of `rows`, copied from the device.
std::vector<double> gather_o_rows(const RungOutput& out, const AttnProblem& p, const std::vector<RowIndex>& rows);
std::vector<double> gather_lse(const RungOutput& out, const AttnProblem& p, const std::vector<RowIndex>& rows);

struct Timing {
  double median_ms = 0, min_ms = 0, max_ms = 0;
  int runs = 0;
};
// How the timed runs follow each other (attn_bench --timing; scripts/peers.py has the same).
enum class TimingMode {
  flushed,       // each run alone after an L2 flush (the default: every row starts from a cold L2)
  isolated,      // each run alone, no flush (the L2 holds whatever the last run left)
  back_to_back,  // the runs queued together, an event between each two (the GPU never idles)
};
// The benches' --timing names: "flushed", "isolated", "back-to-back".
const char* timing_mode_name(TimingMode mode);
// A --timing name -> its mode; false (and the mode left alone) for any other name.
bool parse_timing_mode(const std::string& name, TimingMode* mode);

// Warm-up (at least `warmup` launches and `warm_seconds` of back-to-back work), then
// `repeats` runs, by default each after an L2 flush (TimingMode), timed with CUDA events
// around the launch only. A rung slower than max_seconds in total stops early (at least 3
// runs; back_to_back runs all of them).
//
// Why seconds of warm-up: under a power cap the SM clock follows the load with a lag of
// tenths of a second, and falls well below its idle value under a heavy kernel. Twenty
// runs of a 1 ms kernel are over before the clock settles, so each row would be timed
// partly on the clock the previous row left behind, and a ratio between two rows would
// depend on their order. After the warm-up every row runs at the clock its own kernel
// sustains.
Timing time_launch(const std::function<void()>& launch, L2Flusher& flusher, cudaStream_t stream, int warmup,
                   int repeats, double max_seconds, double warm_seconds = 0,
                   TimingMode mode = TimingMode::flushed);

struct Ceilings {
  double copy_gbps = 0;     // device-to-device copy, bytes read + written per second / 1e9
  double gemm_tflops = 0;   // bf16 GEMM 8192^3 through cuBLAS, fp32 accumulate
};
Ceilings measure_ceilings(cudaStream_t stream);

struct Row {
  std::string gpu, rung, prev_rung, git_sha, note;
  AttnProblem p;
  Timing t;
  double tflops = -1, model_flops = -1, model_hbm_bytes = -1;
  DramBytes measured;
  double err_vs_prev = -1, err_vs_ref = -1, max_abs_vs_ref = -1;
  double softmax_ms = -1, softmax_model_bytes = -1;
  Ceilings ceilings;
  // A backward row: the time of launch_backward alone, model_flops 2.5x the forward's (the
  // FlashAttention papers' convention), errors the largest of dQ's, dK's and dV's. The CSV
  // names its rung <name>_bwd (and its prev_rung so).
  bool backward = false;
};

struct HarnessOptions {
  int warmup = 3;
  double warm_seconds = 0.3;  // and at least this long (see time_launch)
  int repeats = 20;
  TimingMode timing = TimingMode::flushed;
  double max_seconds_per_rung = 2.0;  // slow rungs (03b, 04 at large N) stop early, >= 3 runs
  bool check_ref = true;
  int ref_rows_per_head = 64;  // sampled rows when the full reference is too costly
  double full_ref_macs = 4e9;  // full fp64 check below this many multiply-adds
  bool measure_bytes = false;
  uint64_t seed = 2024;
  Fill fill = Fill::normal;
  float mean = 0.f, stddev = 1.f;
  bool backward = false;  // run_problem times the rungs' backward passes instead (forward-only rungs: a log line)
};

class Harness {
 public:
  explicit Harness(HarnessOptions opt);
  ~Harness();
  void set_ceilings(const Ceilings& c) { ceilings_ = c; }
  const std::string& gpu() const { return gpu_; }
  const HbmCounter* counter() const { return counter_.get(); }
  // Runs `stages` (ladder order) on one problem with one set of inputs. A refused rung
  // gives a line in `log` and no row; any other failure throws.
  std::vector<Row> run_problem(const AttnProblem& p, const std::vector<const Stage*>& stages,
                               const std::function<void(const std::string&)>& log);

 private:
  std::vector<Row> run_problem_backward(const AttnProblem& p, const std::vector<const Stage*>& stages,
                                        const std::function<void(const std::string&)>& log);
  HarnessOptions opt_;
  cudaStream_t stream_ = nullptr;
  std::string gpu_;
  Ceilings ceilings_;
  std::unique_ptr<L2Flusher> flusher_;
  std::unique_ptr<HbmCounter> counter_;
};

// "NVIDIA H100 80GB HBM3" -> "nvidia_h100_80gb_hbm3".
std::string gpu_slug(const std::string& device_name);
std::string current_gpu_slug();
const char* git_sha();

void write_csv_header(std::ostream& os);
void write_csv_row(std::ostream& os, const Row& r);
void write_json(std::ostream& os, const std::vector<Row>& rows);

}  // namespace attn
