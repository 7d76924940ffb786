#include "bench/harness.h"

#include <cublas_v2.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <sstream>

#include "attn_git_sha.h"  // ATTN_GIT_SHA, written at build time (cmake/git_sha.cmake)
#include "common/check.h"
#include "common/hbm_model.h"

namespace attn {

// ---------------------------------------------------------------- inputs and one run

namespace {

// Bytes per element of Q, K, V in memory.
size_t input_bytes(DType t) { return t == DType::e4m3 ? 1 : dtype_bytes(storage_dtype(t)); }

// n seeded values (through bf16, as the other dtypes' inputs) divided by c, a power of two
// with amax / c <= 448, and rounded to e4m3 into dst; `rows` descales c; *host (if given)
// the e4m3 values times c, exactly the tensor the rung is given.
void fill_e4m3(const DeviceBuffer& dst, DeviceBuffer& descale, int64_t n, int64_t rows, uint64_t seed, Fill dist,
               float mean, float stddev, cudaStream_t stream, std::vector<float>* host) {
  DeviceBuffer staged(n * sizeof(uint16_t));
  fill_random(staged.get(), n, DType::bf16, seed, dist, mean, stddev, stream);
  std::vector<uint16_t> raw(n);
  CUDA_CHECK(cudaMemcpyAsync(raw.data(), staged.get(), n * sizeof(uint16_t), cudaMemcpyDeviceToHost, stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));
  float amax = 0.f;
  for (uint16_t r : raw) amax = std::max(amax, std::fabs(bf16_to_float(r)));
  const float c = amax > 0.f ? std::exp2(std::ceil(std::log2(amax / 448.f))) : 1.f;
  std::vector<uint8_t> bytes(n);
  if (host) host->resize(n);
  for (int64_t i = 0; i < n; ++i) {
    bytes[i] = __nv_cvt_float_to_fp8(bf16_to_float(raw[i]) / c, __NV_SATFINITE, __NV_E4M3);
    if (host) {
      __nv_fp8_e4m3 e;
      e.__x = bytes[i];
      (*host)[i] = float(e) * c;
    }
  }
  CUDA_CHECK(cudaMemcpy(dst.get(), bytes.data(), n, cudaMemcpyHostToDevice));
  descale = DeviceBuffer(rows * sizeof(float));
  const std::vector<float> scales(rows, c);
  CUDA_CHECK(cudaMemcpy(descale.get(), scales.data(), rows * sizeof(float), cudaMemcpyHostToDevice));
}

}  // namespace

ProblemInputs::ProblemInputs(const AttnProblem& prob, uint64_t seed, Fill dist, float mean, float stddev,
                             cudaStream_t stream, bool keep_host)
    : p(prob),
      q(p.q_elems() * input_bytes(p.dtype)),
      k(p.kv_elems() * input_bytes(p.dtype)),
      v(p.kv_elems() * input_bytes(p.dtype)) {
  if (p.dtype == DType::e4m3) {
    fill_e4m3(q, q_descale, p.q_elems(), p.q_elems() / p.d, seed, dist, mean, stddev, stream,
              keep_host ? &host.q : nullptr);
    fill_e4m3(k, k_descale, p.kv_elems(), p.kv_elems() / p.d, seed + 1, dist, mean, stddev, stream,
              keep_host ? &host.k : nullptr);
    fill_e4m3(v, v_descale, p.kv_elems(), p.kv_elems() / p.d, seed + 2, dist, mean, stddev, stream,
              keep_host ? &host.v : nullptr);
    return;
  }
  DType t = storage_dtype(p.dtype);
  fill_random(q.get(), p.q_elems(), t, seed, dist, mean, stddev, stream);
  fill_random(k.get(), p.kv_elems(), t, seed + 1, dist, mean, stddev, stream);
  fill_random(v.get(), p.kv_elems(), t, seed + 2, dist, mean, stddev, stream);
  if (keep_host) {
    auto download = [&](const DeviceBuffer& b, int64_t n) {
      std::vector<uint16_t> raw(n);
      CUDA_CHECK(cudaMemcpyAsync(raw.data(), b.get(), n * 2, cudaMemcpyDeviceToHost, stream));
      CUDA_CHECK(cudaStreamSynchronize(stream));
      return to_float(raw, t);
    };
    host.q = download(q, p.q_elems());
    host.k = download(k, p.kv_elems());
    host.v = download(v, p.kv_elems());
  }
  CUDA_CHECK(cudaStreamSynchronize(stream));
}

AttnTensors RungOutput::tensors(const ProblemInputs& in) const {
  AttnTensors t;
  t.q = in.q.get();
  t.k = in.k.get();
  t.v = in.v.get();
  t.o = o.get();
  t.lse = lse.as<float>();
  t.workspace = workspace.get();
  t.workspace_bytes = workspace.bytes();
  t.q_descale = in.q_descale.as<float>();
  t.k_descale = in.k_descale.as<float>();
  t.v_descale = in.v_descale.as<float>();
  return t;
}

RungOutput run_rung(const Stage& s, const ProblemInputs& in, cudaStream_t stream) {
  const AttnProblem& p = in.p;
  validate_problem(s, p);
  validate_device(s);
  size_t out_bytes = p.o_elems() * dtype_bytes(storage_dtype(p.dtype));
  size_t ws = s.workspace(p);
  require_device_memory(ws + out_bytes + p.lse_elems() * sizeof(float),
                        s.name + " (output" + std::string(ws ? " + S/P workspace" : "") + ")");
  RungOutput out;
  out.o = DeviceBuffer(out_bytes);
  out.lse = DeviceBuffer(p.lse_elems() * sizeof(float));
  out.workspace = DeviceBuffer(ws);
  fill_poison(out.o.get(), out.o.bytes(), stream);
  fill_poison(out.lse.get(), out.lse.bytes(), stream);
  run_stage(s, p, out.tensors(in), stream);
  CUDA_CHECK(cudaStreamSynchronize(stream));
  return out;
}

GradInput::GradInput(const AttnProblem& p, uint64_t seed, Fill dist, float mean, float stddev, cudaStream_t stream,
                     bool keep_host)
    : dout(p.o_elems() * dtype_bytes(storage_dtype(p.dtype))) {
  fill_random(dout.get(), p.o_elems(), storage_dtype(p.dtype), seed, dist, mean, stddev, stream);
  CUDA_CHECK(cudaStreamSynchronize(stream));
  if (keep_host) {
    const std::vector<double> d = download_as_double(dout.get(), p.o_elems(), storage_dtype(p.dtype));
    host.assign(d.begin(), d.end());
  }
}

AttnBwdTensors RungGrads::tensors(const ProblemInputs& in, const GradInput& g) const {
  AttnBwdTensors t;
  t.q = in.q.get();
  t.k = in.k.get();
  t.v = in.v.get();
  t.o = forward.o.get();
  t.lse = forward.lse.as<float>();
  t.dout = g.dout.get();
  t.dq = dq.get();
  t.dk = dk.get();
  t.dv = dv.get();
  t.workspace = workspace.get();
  t.workspace_bytes = workspace.bytes();
  return t;
}

RungGrads run_rung_backward(const Stage& s, const ProblemInputs& in, const GradInput& g, cudaStream_t stream) {
  const AttnProblem& p = in.p;
  validate_backward_problem(s, p);
  validate_device(s);
  const size_t elem = dtype_bytes(storage_dtype(p.dtype)), ws = s.backward_workspace(p);
  require_device_memory(ws + (p.q_elems() + 2 * p.kv_elems()) * elem, s.name + " backward (dQ, dK, dV + workspace)");
  RungGrads out;
  out.forward = run_rung(s, in, stream);
  out.dq = DeviceBuffer(p.q_elems() * elem);
  out.dk = DeviceBuffer(p.kv_elems() * elem);
  out.dv = DeviceBuffer(p.kv_elems() * elem);
  out.workspace = DeviceBuffer(ws);
  for (const DeviceBuffer* b : {&out.dq, &out.dk, &out.dv, &out.workspace})
    if (b->bytes()) fill_poison(b->get(), b->bytes(), stream);
  run_backward(s, p, out.tensors(in, g), stream);
  CUDA_CHECK(cudaStreamSynchronize(stream));
  return out;
}

std::vector<double> download_as_double(const void* src, int64_t n, DType t) {
  std::vector<uint16_t> raw(n);
  CUDA_CHECK(cudaMemcpy(raw.data(), src, n * sizeof(uint16_t), cudaMemcpyDeviceToHost));
  const bool bf16 = storage_dtype(t) == DType::bf16;
  std::vector<double> out(n);
  for (int64_t i = 0; i < n; ++i) out[i] = bf16 ? bf16_to_float(raw[i]) : fp16_to_float(raw[i]);
  return out;
}

std::vector<double> gather_o_rows(const RungOutput& out, const AttnProblem& p, const std::vector<RowIndex>& rows) {
  // One copy of all of O (a row at a time costs a transfer per row: thousands per problem).
  std::vector<uint16_t> raw(p.o_elems());
  CUDA_CHECK(cudaMemcpy(raw.data(), out.o.get(), raw.size() * sizeof(uint16_t), cudaMemcpyDeviceToHost));
  const bool bf16 = storage_dtype(p.dtype) == DType::bf16;
  std::vector<double> result;
  result.reserve(rows.size() * p.d);
  for (const RowIndex& r : rows) {
    const uint16_t* row = raw.data() + ((int64_t(r.b) * p.H + r.h) * p.Nq + r.i) * p.d;
    for (int c = 0; c < p.d; ++c) result.push_back(bf16 ? bf16_to_float(row[c]) : fp16_to_float(row[c]));
  }
  return result;
}

std::vector<double> gather_lse(const RungOutput& out, const AttnProblem& p, const std::vector<RowIndex>& rows) {
  std::vector<float> all(p.lse_elems());
  CUDA_CHECK(cudaMemcpy(all.data(), out.lse.get(), all.size() * sizeof(float), cudaMemcpyDeviceToHost));
  std::vector<double> result;
  for (const RowIndex& r : rows) result.push_back(all[(int64_t(r.b) * p.H + r.h) * p.Nq + r.i]);
  return result;
}

// ---------------------------------------------------------------- timing and ceilings

const char* timing_mode_name(TimingMode mode) {
  switch (mode) {
    case TimingMode::flushed: return "flushed";
    case TimingMode::isolated: return "isolated";
    case TimingMode::back_to_back: return "back-to-back";
  }
  return "?";
}

bool parse_timing_mode(const std::string& name, TimingMode* mode) {
  for (TimingMode m : {TimingMode::flushed, TimingMode::isolated, TimingMode::back_to_back})
    if (name == timing_mode_name(m)) {
      *mode = m;
      return true;
    }
  return false;
}

Timing time_launch(const std::function<void()>& launch, L2Flusher& flusher, cudaStream_t stream, int warmup,
                   int repeats, double max_seconds, double warm_seconds, TimingMode mode) {
  const auto warm_start = std::chrono::steady_clock::now();
  for (int i = 0; i < warmup; ++i) launch();
  CUDA_CHECK(cudaStreamSynchronize(stream));
  while (std::chrono::duration<double>(std::chrono::steady_clock::now() - warm_start).count() < warm_seconds) {
    launch();
    CUDA_CHECK(cudaStreamSynchronize(stream));
  }
  std::vector<double> ms;
  if (mode == TimingMode::back_to_back) {
    std::vector<cudaEvent_t> ev(repeats + 1);
    for (cudaEvent_t& e : ev) CUDA_CHECK(cudaEventCreate(&e));
    CUDA_CHECK(cudaEventRecord(ev[0], stream));
    for (int i = 0; i < repeats; ++i) {
      launch();
      CUDA_CHECK(cudaEventRecord(ev[i + 1], stream));
    }
    CUDA_CHECK(cudaEventSynchronize(ev[repeats]));
    CUDA_CHECK_LAUNCH();
    for (int i = 0; i < repeats; ++i) {
      float t = 0;
      CUDA_CHECK(cudaEventElapsedTime(&t, ev[i], ev[i + 1]));
      ms.push_back(t);
    }
    for (cudaEvent_t e : ev) CUDA_CHECK(cudaEventDestroy(e));
  } else {  // each run alone
    cudaEvent_t start, stop;
    CUDA_CHECK(cudaEventCreate(&start));
    CUDA_CHECK(cudaEventCreate(&stop));
    double total = 0;
    for (int i = 0; i < repeats; ++i) {
      if (mode == TimingMode::flushed) flusher.flush(stream);
      CUDA_CHECK(cudaEventRecord(start, stream));
      launch();
      CUDA_CHECK(cudaEventRecord(stop, stream));
      CUDA_CHECK(cudaEventSynchronize(stop));
      CUDA_CHECK_LAUNCH();
      float t = 0;
      CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
      ms.push_back(t);
      total += t * 1e-3;
      if (total > max_seconds && ms.size() >= 3) break;
    }
    CUDA_CHECK(cudaEventDestroy(start));
    CUDA_CHECK(cudaEventDestroy(stop));
  }
  std::sort(ms.begin(), ms.end());
  Timing t;
  t.runs = int(ms.size());
  t.min_ms = ms.front();
  t.max_ms = ms.back();
  t.median_ms = ms.size() % 2 ? ms[ms.size() / 2] : 0.5 * (ms[ms.size() / 2 - 1] + ms[ms.size() / 2]);
  return t;
}

Ceilings measure_ceilings(cudaStream_t stream) {
  Ceilings c;
  L2Flusher flusher;
  {  // copy bandwidth: 1 GiB device to device, read + write bytes counted
    size_t bytes = size_t(1) << 30;
    DeviceBuffer a(bytes), b(bytes);
    fill_random(a.get(), int64_t(bytes / 2), DType::bf16, 7, Fill::normal, 0, 1, stream);
    Timing t = time_launch([&] { CUDA_CHECK(cudaMemcpyAsync(b.get(), a.get(), bytes, cudaMemcpyDeviceToDevice, stream)); },
                           flusher, stream, 2, 10, 10, HarnessOptions{}.warm_seconds);
    c.copy_gbps = 2.0 * bytes / (t.median_ms * 1e-3) / 1e9;
  }
  {  // bf16 GEMM 8192^3 on random data, fp32 accumulate
    const int n = 8192;
    DeviceBuffer A(size_t(n) * n * 2), B(size_t(n) * n * 2), C(size_t(n) * n * 2);
    fill_random(A.get(), int64_t(n) * n, DType::bf16, 8, Fill::normal, 0, 1, stream);
    fill_random(B.get(), int64_t(n) * n, DType::bf16, 9, Fill::normal, 0, 1, stream);
    cublasHandle_t h;
    CUBLAS_CHECK(cublasCreate(&h));
    CUBLAS_CHECK(cublasSetStream(h, stream));
    float alpha = 1, beta = 0;
    Timing t = time_launch(
        [&] {
          CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, A.get(), CUDA_R_16BF, n, B.get(),
                                    CUDA_R_16BF, n, &beta, C.get(), CUDA_R_16BF, n, CUBLAS_COMPUTE_32F,
                                    CUBLAS_GEMM_DEFAULT));
        },
        flusher, stream, 3, 10, 10, HarnessOptions{}.warm_seconds);
    CUBLAS_CHECK(cublasDestroy(h));
    c.gemm_tflops = 2.0 * n * double(n) * n / (t.median_ms * 1e-3) / 1e12;
  }
  return c;
}

// ---------------------------------------------------------------- the harness

Harness::Harness(HarnessOptions opt) : opt_(opt) {
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  gpu_ = current_gpu_slug();
  flusher_ = std::make_unique<L2Flusher>();
  if (opt_.measure_bytes) counter_ = std::make_unique<HbmCounter>();
}

Harness::~Harness() {
  counter_.reset();
  flusher_.reset();
  if (stream_) cudaStreamDestroy(stream_);
}

namespace {
std::string fmt(double x, const char* f = "%.3g") {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, x);
  return buf;
}
}  // namespace

std::vector<Row> Harness::run_problem(const AttnProblem& p, const std::vector<const Stage*>& stages,
                                      const std::function<void(const std::string&)>& log) {
  if (opt_.backward) return run_problem_backward(p, stages, log);
  ProblemInputs in(p, opt_.seed, opt_.fill, opt_.mean, opt_.stddev, stream_, opt_.check_ref);
  std::vector<RowIndex> ref_rows;
  ReferenceRows ref;
  bool ref_ready = false;
  std::map<std::string, RungOutput> outputs;  // this problem's O per rung, for the chain check
  std::vector<Row> rows;

  for (const Stage* s : stages) {
    RungOutput out;
    try {
      validate_problem(*s, p);
      out = run_rung(*s, in, stream_);
    } catch (const AttnError& e) {
      log("  refused: " + std::string(e.what()));
      continue;
    }
    Row r;
    r.gpu = gpu_;
    r.rung = s->name;
    r.git_sha = git_sha();
    r.p = p;
    r.ceilings = ceilings_;
    r.model_flops = hbm::flops(p);
    if (s->model_hbm_bytes) r.model_hbm_bytes = s->model_hbm_bytes(p);

    DType out_t = storage_dtype(p.dtype);
    int64_t bad = count_nonfinite(out.o.get(), p.o_elems(), out_t, stream_);
    if (bad) r.note = std::to_string(bad) + " non-finite or unwritten outputs";

    // Chain check: the nearest rung below (following prev) that ran this problem.
    for (std::string below = s->prev; !below.empty(); below = find_stage(below).prev)
      if (outputs.count(below)) {
        r.prev_rung = below;
        r.err_vs_prev = rel_frobenius_device(out.o.get(), outputs[below].o.get(), p.o_elems(), out_t, stream_);
        break;
      }
    if (opt_.check_ref) {
      if (!ref_ready) {
        double macs = double(p.B) * p.H * p.Nq * double(p.Nk) * p.d;
        ref_rows = macs <= opt_.full_ref_macs ? all_rows(p) : sampled_rows(p, opt_.ref_rows_per_head);
        ref = reference_rows(p, in.host, ref_rows);
        ref_ready = true;
      }
      r.err_vs_ref = rel_frobenius(gather_o_rows(out, p, ref_rows), ref.o, &r.max_abs_vs_ref);
    }

    AttnTensors t = out.tensors(in);
    auto launch = [&] { s->launch(p, t, stream_); };
    r.t = time_launch(launch, *flusher_, stream_, opt_.warmup, opt_.repeats, opt_.max_seconds_per_rung,
                      opt_.warm_seconds, opt_.timing);
    r.tflops = r.model_flops / (r.t.median_ms * 1e-3) / 1e12;
    if (s->launch_softmax_only) {
      Timing sm = time_launch([&] { s->launch_softmax_only(p, t, stream_); }, *flusher_, stream_, opt_.warmup,
                              opt_.repeats, opt_.max_seconds_per_rung, opt_.warm_seconds, opt_.timing);
      r.softmax_ms = sm.median_ms;
      if (s->softmax_model_bytes) r.softmax_model_bytes = s->softmax_model_bytes(p);
    }
    if (counter_ && counter_->available()) r.measured = counter_->measure(launch, stream_);

    std::string line = "  " + s->name + ": " + fmt(r.t.median_ms, "%.3f") + " ms  " + fmt(r.tflops, "%.1f") +
                       " TFLOPS";
    if (r.err_vs_ref >= 0) line += "  err_ref " + fmt(r.err_vs_ref, "%.2e");
    if (r.err_vs_prev >= 0) line += "  err_vs_" + r.prev_rung + " " + fmt(r.err_vs_prev, "%.2e");
    if (r.softmax_ms >= 0)
      line += "  softmax " + fmt(r.softmax_ms, "%.3f") + " ms = " +
              fmt(r.softmax_model_bytes / (r.softmax_ms * 1e-3) / 1e9, "%.0f") + " GB/s";
    if (r.measured.measured())
      line += "  dram " + fmt(r.measured.read / 1e9, "%.3f") + "+" + fmt(r.measured.write / 1e9, "%.3f") +
              " GB (model " + fmt(r.model_hbm_bytes / 1e9, "%.3f") + ")";
    if (!r.note.empty()) line += "  !! " + r.note;
    log(line);
    rows.push_back(r);

    out.workspace = DeviceBuffer();  // S and P can be large: keep only O for the chain
    outputs.emplace(s->name, std::move(out));
  }
  return rows;
}

// The backward counterpart of run_problem: each rung's own forward gives O and lse, then its
// backward runs on the same dO; checked for unwritten or non-finite gradients, against the
// rung below that has a backward (chain) and, for problems up to full_ref_macs, against
// reference_backward (sampling rows does not apply: every key's dK, dV sums all query rows).
std::vector<Row> Harness::run_problem_backward(const AttnProblem& p, const std::vector<const Stage*>& stages,
                                               const std::function<void(const std::string&)>& log) {
  const bool check_ref = opt_.check_ref && double(p.B) * p.H * p.Nq * double(p.Nk) * p.d <= opt_.full_ref_macs;
  if (opt_.check_ref && !check_ref)
    log("  fp64 check of the backward skipped: more than " + fmt(opt_.full_ref_macs) + " multiply-adds");
  ProblemInputs in(p, opt_.seed, opt_.fill, opt_.mean, opt_.stddev, stream_, check_ref);
  GradInput g(p, opt_.seed + 3, opt_.fill, opt_.mean, opt_.stddev, stream_, check_ref);
  const DType t = storage_dtype(p.dtype);
  ReferenceGrads ref;
  bool ref_ready = false;
  std::map<std::string, RungGrads> outputs;  // dQ, dK, dV per rung, for the chain check
  std::vector<Row> rows;

  for (const Stage* s : stages) {
    if (!s->has_backward()) {
      log("  " + s->name + ": no backward pass (forward only)");
      continue;
    }
    RungGrads out;
    try {
      out = run_rung_backward(*s, in, g, stream_);
    } catch (const AttnError& e) {
      log("  refused: " + std::string(e.what()));
      continue;
    }
    Row r;
    r.gpu = gpu_;
    r.rung = s->name;
    r.backward = true;
    r.git_sha = git_sha();
    r.p = p;
    r.ceilings = ceilings_;
    r.model_flops = 2.5 * hbm::flops(p);
    if (s->model_backward_hbm_bytes) r.model_hbm_bytes = s->model_backward_hbm_bytes(p);

    const int64_t bad = count_nonfinite(out.dq.get(), p.q_elems(), t, stream_) +
                        count_nonfinite(out.dk.get(), p.kv_elems(), t, stream_) +
                        count_nonfinite(out.dv.get(), p.kv_elems(), t, stream_);
    if (bad) r.note = std::to_string(bad) + " non-finite or unwritten gradients";
    for (std::string below = s->prev; !below.empty(); below = find_stage(below).prev)
      if (outputs.count(below)) {
        const RungGrads& o = outputs[below];
        r.prev_rung = below;
        r.err_vs_prev = std::max({rel_frobenius_device(out.dq.get(), o.dq.get(), p.q_elems(), t, stream_),
                                  rel_frobenius_device(out.dk.get(), o.dk.get(), p.kv_elems(), t, stream_),
                                  rel_frobenius_device(out.dv.get(), o.dv.get(), p.kv_elems(), t, stream_)});
        break;
      }
    std::string ref_errors;
    if (check_ref) {
      if (!ref_ready) {
        ref = reference_backward(p, in.host, g.host);
        ref_ready = true;
      }
      const double e_dq = rel_frobenius(download_as_double(out.dq.get(), p.q_elems(), t), ref.dq);
      const double e_dk = rel_frobenius(download_as_double(out.dk.get(), p.kv_elems(), t), ref.dk);
      const double e_dv = rel_frobenius(download_as_double(out.dv.get(), p.kv_elems(), t), ref.dv);
      r.err_vs_ref = std::max({e_dq, e_dk, e_dv});
      ref_errors = "  (dQ " + fmt(e_dq, "%.1e") + ", dK " + fmt(e_dk, "%.1e") + ", dV " + fmt(e_dv, "%.1e") + ")";
    }

    const AttnBwdTensors bt = out.tensors(in, g);
    auto launch = [&] { s->launch_backward(p, bt, stream_); };
    r.t = time_launch(launch, *flusher_, stream_, opt_.warmup, opt_.repeats, opt_.max_seconds_per_rung,
                      opt_.warm_seconds, opt_.timing);
    r.tflops = r.model_flops / (r.t.median_ms * 1e-3) / 1e12;
    if (counter_ && counter_->available()) r.measured = counter_->measure(launch, stream_);

    std::string line = "  " + s->name + " backward: " + fmt(r.t.median_ms, "%.3f") + " ms  " +
                       fmt(r.tflops, "%.1f") + " TFLOPS";
    if (r.err_vs_ref >= 0) line += "  err_ref " + fmt(r.err_vs_ref, "%.2e") + ref_errors;
    if (r.err_vs_prev >= 0) line += "  err_vs_" + r.prev_rung + " " + fmt(r.err_vs_prev, "%.2e");
    if (r.measured.measured())
      line += "  dram " + fmt(r.measured.read / 1e9, "%.3f") + "+" + fmt(r.measured.write / 1e9, "%.3f") + " GB";
    if (!r.note.empty()) line += "  !! " + r.note;
    log(line);
    rows.push_back(r);

    out.forward = RungOutput();  // keep only the gradients for the chain
    out.workspace = DeviceBuffer();
    outputs.emplace(s->name, std::move(out));
  }
  return rows;
}

// ---------------------------------------------------------------- naming and output

std::string gpu_slug(const std::string& device_name) {
  std::string s;
  for (char c : device_name) s += std::isalnum(static_cast<unsigned char>(c)) ? char(std::tolower(c)) : '_';
  return s;
}

std::string current_gpu_slug() {
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  return gpu_slug(prop.name);
}

const char* git_sha() { return ATTN_GIT_SHA; }

namespace {
std::string cell(double x) { return x < 0 ? "" : fmt(x, "%.6g"); }
// The rung as the CSV names it: a backward row's is <name>_bwd.
std::string row_rung(const Row& r, const std::string& name) {
  return name.empty() || !r.backward ? name : name + "_bwd";
}
}  // namespace

void write_csv_header(std::ostream& os) {
  os << "gpu,rung,dtype,B,H,Hkv,Nq,Nk,d,causal,time_ms_median,time_ms_min,time_ms_max,tflops,model_flops,"
        "model_hbm_bytes,measured_read_bytes,measured_write_bytes,err_vs_prev,err_vs_ref,prev_rung,softmax_ms,"
        "softmax_model_bytes,ceiling_copy_gbps,ceiling_gemm_tflops,git_sha\n";
}

void write_csv_row(std::ostream& os, const Row& r) {
  const AttnProblem& p = r.p;
  os << r.gpu << ',' << row_rung(r, r.rung) << ',' << dtype_name(p.dtype) << ',' << p.B << ',' << p.H << ',' << p.Hkv << ','
     << p.Nq << ',' << p.Nk << ',' << p.d << ',' << int(p.causal) << ',' << cell(r.t.median_ms) << ','
     << cell(r.t.min_ms) << ',' << cell(r.t.max_ms) << ',' << cell(r.tflops) << ',' << cell(r.model_flops) << ','
     << cell(r.model_hbm_bytes) << ',' << cell(r.measured.read) << ',' << cell(r.measured.write) << ','
     << cell(r.err_vs_prev) << ',' << cell(r.err_vs_ref) << ',' << row_rung(r, r.prev_rung) << ','
     << cell(r.softmax_ms) << ','
     << cell(r.softmax_model_bytes) << ',' << cell(r.ceilings.copy_gbps > 0 ? r.ceilings.copy_gbps : -1) << ','
     << cell(r.ceilings.gemm_tflops > 0 ? r.ceilings.gemm_tflops : -1) << ',' << r.git_sha << '\n';
}

void write_json(std::ostream& os, const std::vector<Row>& rows) {
  auto num = [](double x) { return x < 0 ? std::string("null") : fmt(x, "%.6g"); };
  os << "[\n";
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    const AttnProblem& p = r.p;
    os << "  {\"gpu\": \"" << r.gpu << "\", \"rung\": \"" << row_rung(r, r.rung) << "\", \"dtype\": \""
       << dtype_name(p.dtype)
       << "\", \"B\": " << p.B << ", \"H\": " << p.H << ", \"Hkv\": " << p.Hkv << ", \"Nq\": " << p.Nq
       << ", \"Nk\": " << p.Nk << ", \"d\": " << p.d << ", \"causal\": " << int(p.causal)
       << ", \"time_ms_median\": " << num(r.t.median_ms) << ", \"time_ms_min\": " << num(r.t.min_ms)
       << ", \"time_ms_max\": " << num(r.t.max_ms) << ", \"tflops\": " << num(r.tflops)
       << ", \"model_flops\": " << num(r.model_flops) << ", \"model_hbm_bytes\": " << num(r.model_hbm_bytes)
       << ", \"measured_read_bytes\": " << num(r.measured.read)
       << ", \"measured_write_bytes\": " << num(r.measured.write) << ", \"err_vs_prev\": " << num(r.err_vs_prev)
       << ", \"err_vs_ref\": " << num(r.err_vs_ref) << ", \"prev_rung\": \"" << row_rung(r, r.prev_rung)
       << "\", \"softmax_ms\": " << num(r.softmax_ms) << ", \"softmax_model_bytes\": " << num(r.softmax_model_bytes)
       << ", \"ceiling_copy_gbps\": " << num(r.ceilings.copy_gbps > 0 ? r.ceilings.copy_gbps : -1)
       << ", \"ceiling_gemm_tflops\": " << num(r.ceilings.gemm_tflops > 0 ? r.ceilings.gemm_tflops : -1)
       << ", \"git_sha\": \"" << r.git_sha << "\"}" << (i + 1 < rows.size() ? "," : "") << "\n";
  }
  os << "]\n";
}

}  // namespace attn
