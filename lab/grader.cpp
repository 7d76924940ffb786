// The grader of one lab exercise (LABS.md). A lab build (cmake -DATTN_LAB=<id>) compiles it
// with that exercise's checks, which scripts/lab.py writes from lab/exercises.json into
// lab_exercise.inc, and links it to the lab's kernels and the harness.
//
//   lab_grade [--check NAME]... [--json FILE] [--list]
//
// One line per check, then "k / n passed"; a failing check prints its hint. Exit status: 0
// when nothing failed and something passed, 1 when a check failed, 77 when every check was
// skipped (no GPU, or one older than the exercise needs): CTest reports that as skipped.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "bench/harness.h"
#include "common/check.h"
#include "common/hbm_model.h"
#include "common/reference_backward.h"
#include "common/tolerance.h"
#ifdef ATTN_HAS_RUNG_01
#include "01_naive/score_pipeline.h"
#endif
#ifdef ATTN_LAB_PROBE
#include "lab/probes.h"  // the exercise's probe (lab/grader.cmake)
#endif

namespace attn::lab {

struct CheckSpec {
  const char* name;
  std::map<std::string, std::string> params;  // the check's fields in lab/exercises.json
  const char* hint;
};

#include "lab_exercise.inc"  // kLabId, kLabTitle, kLabStage, kLabMinSm, kLabChecks

// Thrown by a check that cannot run on this machine (no counters, ...): skipped, not failed.
struct Skip {
  std::string reason;
};

struct Outcome {
  bool passed = false;
  std::string detail;
};

enum class Status { passed, failed, skipped };

struct Result {
  std::string name, detail, hint;
  Status status = Status::skipped;
  double seconds = 0;
};

std::string fmt(double x, const char* f = "%.3g") {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, x);
  return buf;
}

std::string param(const CheckSpec& c, const std::string& key, const std::string& fallback) {
  auto it = c.params.find(key);
  return it == c.params.end() ? fallback : it->second;
}
double number(const CheckSpec& c, const std::string& key, double fallback) {
  auto it = c.params.find(key);
  return it == c.params.end() ? fallback : std::stod(it->second);
}

AttnProblem problem(int B, int H, int Hkv, int Nq, int Nk, int d, bool causal, DType t, float scale = 0.f) {
  AttnProblem p;
  p.B = B;
  p.H = H;
  p.Hkv = Hkv;
  p.Nq = Nq;
  p.Nk = Nk;
  p.d = d;
  p.causal = causal;
  p.dtype = t;
  p.scale = scale;
  return p;
}

// The problem of the timing and byte checks: B, H, N (= Nq = Nk), d from the check's fields,
// in element type t (the graded rung's first).
AttnProblem large_problem(const CheckSpec& c, DType t) {
  return problem(int(number(c, "B", 1)), int(number(c, "H", 8)), int(number(c, "H", 8)), int(number(c, "N", 4096)),
                 int(number(c, "N", 4096)), int(number(c, "d", 64)), param(c, "causal", "false") == "true", t);
}

// Set when a probe's kernel did not finish: nothing else may touch the GPU, and the process
// must exit without waiting for it (main).
bool g_gpu_stuck = false;

// What the graded rung offers among the shapes the checks use: d = 64, 128; bf16, fp16.
std::vector<int> head_dims(const Stage& s) {
  std::vector<int> dims;
  for (int d : {64, 128})
    if (s.supports_head_dim(d)) dims.push_back(d);
  if (dims.empty()) dims.push_back(s.head_dims.front());
  return dims;
}
std::vector<DType> dtypes(const Stage& s) {
  std::vector<DType> types;
  for (DType t : {DType::bf16, DType::fp16})
    if (s.supports(t)) types.push_back(t);
  if (types.empty()) types.push_back(s.dtypes.front());
  return types;
}

// Every row when the fp64 reference is cheap, else 64 spread rows per head.
std::vector<RowIndex> checked_rows(const AttnProblem& p) {
  const double macs = double(p.B) * p.H * p.Nq * double(p.Nk) * p.d;
  return macs <= 3e8 ? all_rows(p) : sampled_rows(p, 64);
}

class Grader {
 public:
  explicit Grader(const Stage& s) : s_(s) { CUDA_CHECK(cudaStreamCreate(&stream_)); }
  ~Grader() { cudaStreamDestroy(stream_); }

  Outcome run(const std::string& kind, const CheckSpec& c) {
    if (kind == "stats") return stats(c);
    if (kind == "ragged") return outputs(ragged_problems(false));
    if (kind == "causal") return outputs(ragged_problems(true));
    if (kind == "gqa") return outputs(gqa_problems());
    if (kind == "overflow") return outputs(overflow_problems(float(number(c, "scale", 4.0))));
    if (kind == "bytes") return bytes(c);
    if (kind == "speed") return speed(c);
    if (kind == "bandwidth") return bandwidth(c);
    if (kind == "causal_speedup") return causal_speedup(c);
    if (kind == "range") return range(c);
    if (kind == "outliers") return outliers(c);
    if (kind == "backward") return gradients(backward_problems(false));
    if (kind == "backward_causal") return gradients(backward_problems(true));
    if (kind == "backward_gqa") return gradients(backward_gqa_problems());
#ifdef ATTN_LAB_PROBE
    const ProbeResult r = run_probe(kind);
    if (r.known) {
      g_gpu_stuck |= r.hung;
      return {r.passed, r.detail};
    }
#endif
    throw AttnError("lab/exercises.json names an unknown check kind '" + kind + "' (or one of a probe this lab lacks)");
  }

 private:
  // ------------------------------------------------------------ O against fp64

  std::vector<AttnProblem> ragged_problems(bool causal) const {
    std::vector<std::pair<int, int>> lengths = {{1, 1}, {17, 17}, {113, 113}, {1000, 1000}, {17, 1000}, {1000, 113}};
    if (causal) lengths.push_back({200, 65});  // Nq > Nk: the first 135 rows see no key
    std::vector<AttnProblem> ps;
    for (DType t : dtypes(s_))
      for (int d : head_dims(s_))
        for (auto [Nq, Nk] : lengths) ps.push_back(problem(1, 2, 2, Nq, Nk, d, causal, t));
    return ps;
  }

  std::vector<AttnProblem> gqa_problems() const {
    std::vector<AttnProblem> ps;
    for (int d : head_dims(s_))
      for (int Hkv : {2, 1})
        for (int N : {113, 1000})
          for (bool causal : {false, true}) ps.push_back(problem(2, 4, Hkv, N, N, d, causal, dtypes(s_).front()));
    return ps;
  }

  std::vector<AttnProblem> overflow_problems(float scale) const {
    std::vector<AttnProblem> ps;
    for (DType t : dtypes(s_))
      for (int N : {113, 1000})
        for (bool causal : {false, true}) ps.push_back(problem(1, 2, 2, N, N, head_dims(s_).front(), causal, t, scale));
    return ps;
  }

  // Inputs far from unit scale, N(0, stddev^2): what a fixed quantization scale gets wrong.
  Outcome range(const CheckSpec& c) {
    std::vector<AttnProblem> ps;
    for (DType t : dtypes(s_))
      for (int d : head_dims(s_))
        for (int N : {113, 1000})
          for (bool causal : {false, true}) ps.push_back(problem(1, 2, 2, N, N, d, causal, t));
    const float stddev = float(number(c, "stddev", 1e-3));
    Outcome o = outputs(ps, stddev);
    o.detail = "inputs N(0, " + fmt(stddev) + "^2): " + o.detail;
    return o;
  }

  // ||O - O_fp64|| / ||O_fp64|| of stage s over `rows`.
  double error_vs_fp64(const Stage& s, const ProblemInputs& in, const std::vector<RowIndex>& rows,
                       const ReferenceRows& ref) {
    RungOutput out = run_rung(s, in, stream_);
    const int64_t bad = count_nonfinite(out.o.get(), in.p.o_elems(), storage_dtype(in.p.dtype), stream_);
    if (bad) return INFINITY;
    return rel_frobenius(gather_o_rows(out, in.p, rows), ref.o);
  }

  // FA3's Table 3 inputs (a few outlier features): the graded stage's error against that of
  // `versus` (the same pipeline without the step the exercise adds), same inputs, same rows.
  Outcome outliers(const CheckSpec& c) {
    const Stage& versus = find_stage(param(c, "versus", s_.prev));
    const double max_ratio = number(c, "max_ratio", 0.75);
    const int N = int(number(c, "N", 4096)), d = int(number(c, "d", 128)), H = int(number(c, "H", 16));
    const AttnProblem p = problem(1, H, H, N, N, d, false, dtypes(s_).front());
    ProblemInputs in(p, 6000, Fill::outliers, 0.f, 1.f, stream_, true);
    const std::vector<RowIndex> rows = checked_rows(p);
    const ReferenceRows ref = reference_rows(p, in.host, rows);
    const double mine = error_vs_fp64(s_, in, rows, ref), base = error_vs_fp64(versus, in, rows, ref);
    const double ratio = mine / base;
    const bool ok = mine <= tolerance(p.dtype) && ratio <= max_ratio;
    return {ok, p.describe() + ", outlier inputs: error vs fp64 " + fmt(mine) + " (" + s_.name + "), " + fmt(base) +
                    " (" + versus.name + "), ratio " + fmt(ratio, "%.2f") + (ratio <= max_ratio ? " <= " : " > ") +
                    fmt(max_ratio) + (mine <= tolerance(p.dtype) ? "" : "; above the bound " + fmt(tolerance(p.dtype)))};
  }

  // "" when O of p is written, finite and within the dtype's bound of fp64; else what is wrong.
  // Inputs N(0, stddev^2).
  std::string compare_output(const AttnProblem& p, uint64_t seed, double* worst, float stddev = 1.f) {
    ProblemInputs in(p, seed, Fill::normal, 0.f, stddev, stream_, true);
    RungOutput out = run_rung(s_, in, stream_);
    const int64_t bad = count_nonfinite(out.o.get(), p.o_elems(), storage_dtype(p.dtype), stream_);
    if (bad) return p.describe() + ": " + std::to_string(bad) + " of " + std::to_string(p.o_elems()) +
                    " outputs unwritten or not finite";
    const std::vector<RowIndex> rows = checked_rows(p);
    const ReferenceRows ref = reference_rows(p, in.host, rows);
    double max_abs = 0;
    const double err = rel_frobenius(gather_o_rows(out, p, rows), ref.o, &max_abs);
    *worst = std::max(*worst, err);
    if (!(err <= tolerance(p.dtype)))
      return p.describe() + ": error vs fp64 " + fmt(err) + " (bound " + fmt(tolerance(p.dtype)) +
             "), max abs error " + fmt(max_abs);
    return "";
  }

  Outcome outputs(const std::vector<AttnProblem>& ps, float stddev = 1.f) {
    std::vector<std::string> failures;
    double worst = 0;
    uint64_t seed = 1000;
    for (const AttnProblem& p : ps) {
      std::string why = compare_output(p, seed++, &worst, stddev);
      if (!why.empty()) failures.push_back(why);
    }
    if (failures.empty())
      return {true, std::to_string(ps.size()) + " problems, worst error vs fp64 " + fmt(worst)};
    return {false, std::to_string(failures.size()) + " of " + std::to_string(ps.size()) +
                       " problems wrong; first: " + failures.front()};
  }

  // ------------------------------------------------------------ dQ, dK, dV against fp64

  std::vector<int> backward_head_dims() const {
    std::vector<int> dims;
    for (int d : s_.backward_head_dims)
      if (d == 64 || d == 128) dims.push_back(d);
    if (dims.empty()) throw AttnError(s_.name + " has no backward pass at d = 64 or 128 in this build");
    return dims;
  }

  std::vector<AttnProblem> backward_problems(bool causal) const {
    std::vector<std::pair<int, int>> lengths = {{1, 1}, {17, 17}, {113, 113}, {300, 300}, {17, 300}, {300, 113}};
    if (causal) lengths.push_back({200, 65});  // Nq > Nk: the first 135 rows see no key
    std::vector<AttnProblem> ps;
    for (DType t : dtypes(s_))
      for (int d : backward_head_dims())
        for (auto [Nq, Nk] : lengths) ps.push_back(problem(1, 2, 2, Nq, Nk, d, causal, t));
    return ps;
  }

  std::vector<AttnProblem> backward_gqa_problems() const {
    std::vector<AttnProblem> ps;
    for (int d : backward_head_dims())
      for (int Hkv : {2, 1})
        for (bool causal : {false, true}) ps.push_back(problem(2, 4, Hkv, 300, 300, d, causal, dtypes(s_).front()));
    return ps;
  }

  // "" when dQ, dK and dV of p are written, finite and within the dtype's bound of the fp64
  // backward (common/reference_backward.h); else what is wrong.
  std::string compare_gradients(const AttnProblem& p, uint64_t seed, double* worst) {
    ProblemInputs in(p, seed, Fill::normal, 0.f, 1.f, stream_, true);
    GradInput g(p, seed + 1, Fill::normal, 0.f, 1.f, stream_, true);
    const ReferenceGrads ref = reference_backward(p, in.host, g.host);
    const RungGrads out = run_rung_backward(s_, in, g, stream_);  // poisons dQ, dK, dV first
    const DType t = storage_dtype(p.dtype);
    const char* names[3] = {"dQ", "dK", "dV"};
    const DeviceBuffer* got[3] = {&out.dq, &out.dk, &out.dv};
    const std::vector<double>* want[3] = {&ref.dq, &ref.dk, &ref.dv};
    std::string why;
    for (int x = 0; x < 3; ++x) {
      const int64_t n = int64_t(want[x]->size());
      const int64_t bad = count_nonfinite(got[x]->get(), n, t, stream_);
      if (bad) {
        why += std::string(why.empty() ? "" : "; ") + names[x] + " " + std::to_string(bad) + " of " +
               std::to_string(n) + " unwritten or not finite";
        continue;
      }
      double max_abs = 0;
      const double err = rel_frobenius(download_as_double(got[x]->get(), n, t), *want[x], &max_abs);
      *worst = std::max(*worst, err);
      if (!(err <= tolerance(p.dtype)))
        why += std::string(why.empty() ? "" : "; ") + names[x] + " error vs fp64 " + fmt(err) + " (bound " +
               fmt(tolerance(p.dtype)) + "), max abs error " + fmt(max_abs);
    }
    return why.empty() ? "" : p.describe() + ": " + why;
  }

  Outcome gradients(const std::vector<AttnProblem>& ps) {
    std::vector<std::string> failures;
    double worst = 0;
    uint64_t seed = 3000;
    for (const AttnProblem& p : ps) {
      std::string why = compare_gradients(p, seed, &worst);
      seed += 2;
      if (!why.empty()) failures.push_back(why);
    }
    if (failures.empty())
      return {true, std::to_string(ps.size()) + " problems, worst error of dQ, dK, dV vs fp64 " + fmt(worst)};
    return {false, std::to_string(failures.size()) + " of " + std::to_string(ps.size()) +
                       " problems wrong; first: " + failures.front()};
  }

  // ------------------------------------------------------------ row statistics

  // fp64 m_i (max of the visible scores) and l_i = sum_j exp(S_ij - m_i), or with no max
  // subtracted (01) l_i = sum_j exp(S_ij). A row that sees no key: m = -inf, l = 0.
  static void reference_stats(const AttnProblem& p, const HostInputs& in, const std::vector<RowIndex>& rows,
                              bool subtract_max, std::vector<double>* m, std::vector<double>* l) {
    const double tau = p.softmax_scale();
    std::vector<double> S(p.Nk);
    for (const RowIndex& r : rows) {
      const float* q = in.q.data() + ((int64_t(r.b) * p.H + r.h) * p.Nq + r.i) * p.d;
      const float* K = in.k.data() + (int64_t(r.b) * p.Hkv + r.h / p.group()) * p.Nk * p.d;
      const int64_t last = p.causal ? std::min<int64_t>(p.Nk - 1, p.last_visible_key(r.i)) : p.Nk - 1;
      double m_i = -INFINITY, l_i = 0;
      for (int64_t j = 0; j <= last; ++j) {
        double dot = 0;
        for (int c = 0; c < p.d; ++c) dot += double(q[c]) * K[j * p.d + c];
        S[j] = tau * dot;
        m_i = std::max(m_i, S[j]);
      }
      for (int64_t j = 0; j <= last; ++j) l_i += std::exp(S[j] - (subtract_max ? m_i : 0.0));
      m->push_back(m_i);
      l->push_back(l_i);
    }
  }

  // m_i and l_i where the graded rung keeps them after a launch ([B, H, Nq] fp32 each).
  struct DeviceStats {
    std::vector<float> m, l;
  };
  DeviceStats device_stats(const std::string& where, const AttnProblem& p, const RungOutput& out,
                           const ProblemInputs& in) {
    const float* m = nullptr;
    const float* l = nullptr;
    if (where == "score_pipeline") {
#ifdef ATTN_HAS_RUNG_01
      const score_pipeline::Workspace ws = score_pipeline::carve(p, out.tensors(in));
      m = ws.row_max;
      l = ws.row_sum;
#else
      throw AttnError("stats = score_pipeline needs 01_naive in the lab's rungs");
#endif
    } else if (where == "fa1_workspace") {
      // 04's workspace (04_fa1_tiled/fa1_tiled.cuh, fa1_launch): O (fp32), then l, then m.
      const float* base = out.workspace.as<float>();
      l = base + p.o_elems();
      m = l + p.lse_elems();
    } else {
      return {};  // "lse": the statistics are in registers only
    }
    (void)in;
    DeviceStats st;
    st.m.resize(p.lse_elems());
    st.l.resize(p.lse_elems());
    CUDA_CHECK(cudaMemcpy(st.m.data(), m, st.m.size() * sizeof(float), cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(st.l.data(), l, st.l.size() * sizeof(float), cudaMemcpyDeviceToHost));
    return st;
  }

  Outcome stats(const CheckSpec& c) {
    const std::string where = param(c, "stats", "lse");
    const bool subtract_max = param(c, "max", "true") == "true";
    const std::vector<int> dims = head_dims(s_);
    const std::vector<DType> types = dtypes(s_);
    const std::vector<AttnProblem> ps = {
        problem(1, 2, 2, 1000, 1000, dims.front(), false, types.front()),
        problem(1, 2, 1, 17, 113, dims.back(), true, types.back()),
        problem(1, 2, 2, 200, 65, dims.front(), true, types.front()),  // rows 0..134 see no key
    };
    int64_t checked = 0, wrong = 0;
    std::string first;
    auto report = [&](const AttnProblem& p, const RowIndex& r, const std::string& what, double got, double want) {
      ++wrong;
      if (first.empty())
        first = p.describe() + ", row (b " + std::to_string(r.b) + ", h " + std::to_string(r.h) + ", i " +
                std::to_string(r.i) + "): " + what + " = " + fmt(got, "%.6g") + ", fp64 gives " + fmt(want, "%.6g");
    };
    uint64_t seed = 2000;
    for (const AttnProblem& p : ps) {
      ProblemInputs in(p, seed++, Fill::normal, 0.f, 1.f, stream_, true);
      RungOutput out = run_rung(s_, in, stream_);
      const std::vector<RowIndex> rows = all_rows(p);
      std::vector<double> m_ref, l_ref;
      reference_stats(p, in.host, rows, subtract_max, &m_ref, &l_ref);
      const ReferenceRows ref = reference_rows(p, in.host, rows);
      const std::vector<double> lse = s_.writes_lse ? gather_lse(out, p, rows) : std::vector<double>();
      const DeviceStats dev = device_stats(where, p, out, in);
      for (size_t k = 0; k < rows.size(); ++k) {
        const RowIndex& r = rows[k];
        const int64_t at = (int64_t(r.b) * p.H + r.h) * p.Nq + r.i;
        const bool empty = std::isinf(ref.lse[k]);  // the row sees no key
        ++checked;
        if (!lse.empty()) {
          const bool ok = empty ? (std::isinf(lse[k]) && lse[k] < 0)
                                : std::fabs(lse[k] - ref.lse[k]) <= lse_tolerance(p.dtype, ref.lse[k]);
          if (!ok) report(p, r, "lse_i", lse[k], ref.lse[k]);
        }
        if (!dev.m.empty() && subtract_max) {
          const double m = dev.m[at];
          const bool ok = empty ? (std::isinf(m) && m < 0) : std::fabs(m - m_ref[k]) <= 1e-3 * (1 + std::fabs(m_ref[k]));
          if (!ok) report(p, r, "m_i", m, m_ref[k]);
        }
        if (!dev.l.empty()) {
          const double l = dev.l[at];
          const bool ok = empty ? l == 0 : std::fabs(l - l_ref[k]) <= 1e-3 * l_ref[k];
          if (!ok) report(p, r, "l_i", l, l_ref[k]);
        }
      }
    }
    std::string what = s_.writes_lse ? "lse" : "";
    if (where != "lse") what += std::string(what.empty() ? "" : ", ") + (subtract_max ? "m, l" : "l");
    if (wrong == 0) return {true, std::to_string(checked) + " rows of 3 problems: " + what + " match fp64"};
    return {false, std::to_string(wrong) + " wrong values (" + what + ") in " + std::to_string(checked) +
                       " rows; first: " + first};
  }

  // ------------------------------------------------------------ DRAM bytes

  Outcome bytes(const CheckSpec& c) {
    HbmCounter counter;
    if (!counter.available()) throw Skip{"measured bytes unavailable: " + counter.reason()};
    const AttnProblem p = large_problem(c, dtypes(s_).front());
    ProblemInputs in(p, 3000, Fill::normal, 0.f, 1.f, stream_, false);
    RungOutput out = run_rung(s_, in, stream_);
    const AttnTensors t = out.tensors(in);
    const DramBytes b = counter.measure([&] { s_.launch(p, t, stream_); }, stream_);
    if (!b.measured()) throw Skip{"the counter returned no measurement"};
    const double measured = b.read + b.write, model = s_.model_hbm_bytes(p), floor = hbm::min_bytes(p);
    std::string detail = p.describe() + ": measured " + fmt(measured / 1e9, "%.3f") + " GB (read " +
                         fmt(b.read / 1e9, "%.3f") + ", write " + fmt(b.write / 1e9, "%.3f") + "), model " +
                         fmt(model / 1e9, "%.3f") + " GB";
    if (s_.workspace(p) >= size_t(p.score_elems())) {  // S and P in HBM, far larger than L2
      const bool ok = std::fabs(measured / model - 1.0) <= 0.15;
      return {ok, detail + (ok ? ", within 15%" : ", more than 15% off")};
    }
    // Fused rungs: the model counts re-reads that L2 may absorb; never below the minimum.
    const bool ok = measured >= 0.85 * floor && measured <= 1.15 * model;
    return {ok, detail + ", minimum " + fmt(floor / 1e9, "%.3f") + " GB" +
                    (ok ? "" : measured < 0.85 * floor ? ": below 0.85 x the minimum" : ": above 1.15 x the model")};
  }

  // ------------------------------------------------------------ time

  std::function<void()> launcher(const Stage& s, const AttnProblem& p, const AttnTensors& t, bool softmax_only) {
    if (softmax_only) {
      if (!s.launch_softmax_only) throw AttnError(s.name + " has no softmax-only launch");
      return [&s, p, t, this] { s.launch_softmax_only(p, t, stream_); };
    }
    return [&s, p, t, this] { s.launch(p, t, stream_); };
  }

  double median_ms(const std::function<void()>& launch, L2Flusher& flusher) {
    const HarnessOptions o;
    return time_launch(launch, flusher, stream_, o.warmup, o.repeats, o.max_seconds_per_rung, o.warm_seconds)
        .median_ms;
  }

  Outcome speed(const CheckSpec& c) {
    const Stage& below = find_stage(param(c, "below", s_.prev));
    const bool softmax_only = param(c, "part", "all") == "softmax";
    const double max_ratio = number(c, "max_ratio", 1.0);
    const AttnProblem p = large_problem(c, dtypes(s_).front());
    ProblemInputs in(p, 4000, Fill::normal, 0.f, 1.f, stream_, false);
    RungOutput mine = run_rung(s_, in, stream_), ref = run_rung(below, in, stream_);
    const AttnTensors t_mine = mine.tensors(in), t_ref = ref.tensors(in);
    const auto run_mine = launcher(s_, p, t_mine, softmax_only), run_ref = launcher(below, p, t_ref, softmax_only);
    L2Flusher flusher;
    // Alternate, and keep each one's better median: a clock change hits both.
    double ms_ref = median_ms(run_ref, flusher), ms_mine = median_ms(run_mine, flusher);
    ms_ref = std::min(ms_ref, median_ms(run_ref, flusher));
    ms_mine = std::min(ms_mine, median_ms(run_mine, flusher));
    const double ratio = ms_mine / ms_ref;
    const std::string what = softmax_only ? " (softmax only)" : "";
    return {ratio <= max_ratio, p.describe() + what + ": " + s_.name + " " + fmt(ms_mine, "%.3f") + " ms, " +
                                    below.name + " " + fmt(ms_ref, "%.3f") + " ms, ratio " + fmt(ratio, "%.2f") +
                                    (ratio <= max_ratio ? " <= " : " > ") + fmt(max_ratio)};
  }

  // The graded stage with the causal mask against itself without: skipping the blocks above
  // the diagonal does about half the work, so the time ratio must stay under max_ratio.
  Outcome causal_speedup(const CheckSpec& c) {
    const double max_ratio = number(c, "max_ratio", 0.75);
    AttnProblem full = large_problem(c, dtypes(s_).front());
    full.causal = false;
    AttnProblem causal = full;
    causal.causal = true;
    ProblemInputs in_full(full, 4100, Fill::normal, 0.f, 1.f, stream_, false);
    ProblemInputs in_causal(causal, 4100, Fill::normal, 0.f, 1.f, stream_, false);
    RungOutput out_full = run_rung(s_, in_full, stream_), out_causal = run_rung(s_, in_causal, stream_);
    const AttnTensors t_full = out_full.tensors(in_full), t_causal = out_causal.tensors(in_causal);
    const auto run_full = launcher(s_, full, t_full, false), run_causal = launcher(s_, causal, t_causal, false);
    L2Flusher flusher;
    double ms_full = median_ms(run_full, flusher), ms_causal = median_ms(run_causal, flusher);
    ms_full = std::min(ms_full, median_ms(run_full, flusher));
    ms_causal = std::min(ms_causal, median_ms(run_causal, flusher));
    const double ratio = ms_causal / ms_full;
    return {ratio <= max_ratio, full.describe() + ": causal " + fmt(ms_causal, "%.3f") + " ms, no mask " +
                                    fmt(ms_full, "%.3f") + " ms, ratio " + fmt(ratio, "%.2f") +
                                    (ratio <= max_ratio ? " <= " : " > ") + fmt(max_ratio)};
  }

  Outcome bandwidth(const CheckSpec& c) {
    if (!s_.launch_softmax_only || !s_.softmax_model_bytes) throw AttnError(s_.name + " has no softmax-only launch");
    const double min_fraction = number(c, "min_fraction", 0.5);
    const Ceilings ceilings = measure_ceilings(stream_);
    const AttnProblem p = large_problem(c, dtypes(s_).front());
    ProblemInputs in(p, 5000, Fill::normal, 0.f, 1.f, stream_, false);
    RungOutput out = run_rung(s_, in, stream_);
    L2Flusher flusher;
    const double ms = median_ms(launcher(s_, p, out.tensors(in), true), flusher);
    const double gbps = s_.softmax_model_bytes(p) / (ms * 1e-3) / 1e9, fraction = gbps / ceilings.copy_gbps;
    return {fraction >= min_fraction, p.describe() + ": softmax " + fmt(ms, "%.3f") + " ms = " + fmt(gbps, "%.0f") +
                                          " GB/s, " + fmt(fraction, "%.2f") + " of the copy bandwidth " +
                                          fmt(ceilings.copy_gbps, "%.0f") + " GB/s (needs " + fmt(min_fraction) +
                                          ")"};
  }

  const Stage& s_;
  cudaStream_t stream_ = nullptr;
};

// ------------------------------------------------------------ output

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char ch : s) {
    const unsigned char u = static_cast<unsigned char>(ch);
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += ch;
    } else if (ch == '\n') {
      out += "\\n";
    } else if (u < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", unsigned(u));
      out += buf;
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

const char* status_name(Status s) {
  switch (s) {
    case Status::passed: return "passed";
    case Status::failed: return "failed";
    case Status::skipped: return "skipped";
  }
  return "?";
}

void write_json(std::ostream& os, const std::string& gpu, const std::string& overall, const std::vector<Result>& rs,
                int passed, int failed, int skipped) {
  os << "{\n  \"exercise\": " << json_string(kLabId) << ",\n  \"title\": " << json_string(kLabTitle)
     << ",\n  \"stage\": " << json_string(kLabStage) << ",\n  \"gpu\": " << json_string(gpu)
     << ",\n  \"git_sha\": " << json_string(git_sha()) << ",\n  \"status\": " << json_string(overall)
     << ",\n  \"passed\": " << passed << ",\n  \"failed\": " << failed << ",\n  \"skipped\": " << skipped
     << ",\n  \"total\": " << rs.size() << ",\n  \"checks\": [\n";
  for (size_t i = 0; i < rs.size(); ++i) {
    const Result& r = rs[i];
    os << "    {\"name\": " << json_string(r.name) << ", \"status\": " << json_string(status_name(r.status))
       << ", \"seconds\": " << fmt(r.seconds, "%.2f") << ", \"detail\": " << json_string(r.detail)
       << ", \"hint\": " << json_string(r.status == Status::failed ? r.hint : "") << "}"
       << (i + 1 < rs.size() ? "," : "") << "\n";
  }
  os << "  ]\n}\n";
}

// Empty when a GPU is there; else "no GPU found (...)", with CUDA's own words in parentheses:
// on a machine without a GPU the runtime reports a driver problem (the CUDA driver is absent,
// or only its stub is installed), which is no reason to suspect the student's code or setup.
std::string no_gpu_reason() {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  cudaGetLastError();  // leave no error behind for later queries
  if (err == cudaSuccess && n > 0) return "";
  if (err == cudaSuccess) return "no GPU found (the CUDA runtime sees no device)";
  return std::string("no GPU found (cudaGetDeviceCount: ") + cudaGetErrorString(err) + ")";
}

int main(int argc, char** argv) {
  std::vector<std::string> only;
  std::string json_path;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--check" && i + 1 < argc) {
      only.push_back(argv[++i]);
    } else if (a == "--json" && i + 1 < argc) {
      json_path = argv[++i];
    } else if (a == "--list") {
      for (const CheckSpec& c : kLabChecks) std::printf("%s\n", c.name);
      return 0;
    } else {
      std::fprintf(stderr, "usage: %s [--check NAME]... [--json FILE] [--list]\n", argv[0]);
      return 2;
    }
  }
  std::vector<const CheckSpec*> selected;
  for (const CheckSpec& c : kLabChecks)
    if (only.empty() || std::find(only.begin(), only.end(), c.name) != only.end()) selected.push_back(&c);
  if (selected.size() < only.size() || selected.empty()) {
    std::fprintf(stderr, "lab %s: unknown check among --check; its checks are:", kLabId);
    for (const CheckSpec& c : kLabChecks) std::fprintf(stderr, " %s", c.name);
    std::fprintf(stderr, "\n");
    return 2;
  }

  // Why nothing can run here, if so.
  std::string skip_all = no_gpu_reason(), gpu = "none";
  if (skip_all.empty()) {
    gpu = current_gpu_slug();
    cudaDeviceProp prop{};
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    const int sm = prop.major * 10 + prop.minor;
    if (sm < kLabMinSm)
      skip_all = "lab " + std::string(kLabId) + " needs sm_" + std::to_string(kLabMinSm) + " or newer; this GPU is sm_" +
                 std::to_string(sm);
  }
  std::printf("lab %s: %s (%s) on %s\n", kLabId, kLabTitle, kLabStage, gpu.c_str());
  if (gpu == "none" && !skip_all.empty())
    std::printf("  %s: every check is skipped, nothing is graded (on a machine with an NVIDIA GPU, nvidia-smi\n"
                "  should list it, and its driver must support this CUDA version)\n",
                skip_all.c_str());

  std::vector<Result> results;
  std::unique_ptr<Grader> grader;
  for (const CheckSpec* c : selected) {
    Result r;
    r.name = c->name;
    r.hint = c->hint;
    const auto start = std::chrono::steady_clock::now();
    if (!skip_all.empty()) {
      r.status = Status::skipped;
      r.detail = skip_all;
    } else if (g_gpu_stuck) {
      r.status = Status::failed;
      r.detail = "not run: a kernel of an earlier check never finished";
    } else {
      try {
        if (!grader) grader = std::make_unique<Grader>(find_stage(kLabStage));
        const Outcome o = grader->run(param(*c, "kind", c->name), *c);
        r.status = o.passed ? Status::passed : Status::failed;
        r.detail = o.detail;
      } catch (const Skip& s) {
        r.status = Status::skipped;
        r.detail = s.reason;
      } catch (const std::exception& e) {  // a refusal, a CUDA error (a crash in the kernel), a bad table
        r.status = Status::failed;
        r.detail = e.what();
      }
    }
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const char* tag = r.status == Status::passed ? "PASS" : r.status == Status::failed ? "FAIL" : "SKIP";
    std::printf("  %s  %-14s %s (%.1f s)\n", tag, r.name.c_str(), r.detail.c_str(), r.seconds);
    if (r.status == Status::failed) std::printf("        hint: %s\n", r.hint.c_str());
    std::fflush(stdout);
    results.push_back(r);
  }

  int passed = 0, failed = 0, skipped = 0;
  for (const Result& r : results) (r.status == Status::passed ? passed : r.status == Status::failed ? failed : skipped)++;
  const std::string overall = failed ? "failed" : passed ? "passed" : "skipped";
  std::printf("%d / %zu passed", passed, results.size());
  if (failed) std::printf(", %d failed", failed);
  if (skipped) std::printf(", %d skipped", skipped);
  std::printf("\n");
  if (!json_path.empty()) {
    std::ofstream f(json_path);
    write_json(f, gpu, overall, results, passed, failed, skipped);
  }
  if (g_gpu_stuck) {  // a kernel still runs: leave without the destructors, which would wait for it
    std::fflush(stdout);
    std::_Exit(1);
  }
  return failed ? 1 : passed ? 0 : 77;
}

}  // namespace attn::lab

int main(int argc, char** argv) { return attn::lab::main(argc, argv); }
