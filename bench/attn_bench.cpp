// attn_bench: runs the ladder. Every registered rung (or --rungs) on every problem of the
// sweep, with the same inputs per problem; prints a progress line per row and a table at
// the end; writes CSV/JSON rows (schema in bench/harness.h).
//
//   attn_bench --paper-sweep --check --csv results/h100/ladder.csv
//   attn_bench --rungs 02_safe_softmax,03a_online_softmax --n 8192 --d 128
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "bench/harness.h"
#include "common/tolerance.h"

using namespace attn;

namespace {

const char* kUsage = R"(usage: attn_bench [options]
  --rungs a,b,...     rungs to run (default: all registered, in ladder order)
  --list              print the registered rungs and exit
  --paper-sweep       B*N = 16384, H = 2048/d, N in 512..16384, d in {64,128,256}
  --decode-sweep      flash-decoding's shapes: B in {1,8,32}, H = 32 over Hkv = 8, d = 128,
                      Nq in {1,4}, Nk in {4096,16384,65536,131072}, not causal
  --n 512,1024        sequence lengths (Nq = Nk = n)            [default 1024,4096]
  --nk N              override Nk (Nq != Nk, bottom-right causal alignment)
  --nq 1,4            query rows with --nk (decode; the same as --n)
  --d 64,128          head dims                                  [default 128; sweep: 64,128,256]
  --B N --H N --Hkv N batch, heads, kv heads (without --paper-sweep) [default 1, 16, H]
  --causal 0|1|both   masking                                    [default both]
  --dtype bf16,fp16   element types: bf16, fp16, fp8 (bf16 in, quantized inside), e4m3 (e4m3
                      in, one descale per tensor)                [default bf16]
  --repeats N         timed runs per row (median reported)       [default 20]
  --warm-seconds S    warm-up per row before timing, seconds      [default 0.3; the clock settles]
  --timing MODE       flushed: each run alone after an L2 flush; isolated: alone, no flush;
                      back-to-back: runs queued together          [default flushed]
  --check             fp64 reference check (full or 64 sampled rows per head)
  --backward          time the rungs' backward passes (dQ, dK, dV from dO; forward-only rungs
                      are listed and skipped); FLOPs = 2.5x the forward's, CSV rung <name>_bwd;
                      --check compares dQ, dK, dV with fp64 up to 4e9 multiply-adds
  --measure-bytes     measured DRAM bytes through CUPTI (needs profiling permission)
  --no-ceilings       skip the copy-bandwidth and GEMM ceilings
  --csv FILE          write rows as CSV       --json FILE   write rows as JSON
  --seed N            input seed              --outliers    N(0,1)+N(0,100)*Bernoulli(0.001) inputs
)";

[[noreturn]] void usage_error(const std::string& msg) {
  std::cerr << "attn_bench: " << msg << "\n" << kUsage;
  std::exit(2);
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

std::vector<int> split_ints(const std::string& flag, const std::string& s) {
  std::vector<int> out;
  for (const std::string& item : split(s)) {
    char* end = nullptr;
    long v = std::strtol(item.c_str(), &end, 10);
    if (*end || v < 1 || v > (1L << 30)) usage_error(flag + " expects positive integers, got '" + item + "'");
    out.push_back(int(v));
  }
  if (out.empty()) usage_error(flag + " expects a value");
  return out;
}

struct Args {
  std::vector<std::string> rungs;
  std::vector<int> n = {1024, 4096}, d = {128};
  int nk = 0, B = 1, H = 16, Hkv = 0;
  bool paper_sweep = false, decode_sweep = false, d_given = false, n_given = false, causal_given = false;
  std::vector<int> causal = {0, 1};
  std::vector<DType> dtypes = {DType::bf16};
  std::string csv, json;
  bool ceilings = true;
  HarnessOptions opt;
};

Args parse(int argc, char** argv) {
  Args a;
  a.opt.check_ref = false;
  for (int i = 1; i < argc; ++i) {
    std::string f = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage_error(f + " needs a value");
      return argv[++i];
    };
    if (f == "--rungs") a.rungs = split(value());
    else if (f == "--list") {
      for (const Stage& s : registry()) std::cout << s.name << "  (" << s.summary << ")\n";
      std::exit(0);
    } else if (f == "--paper-sweep") a.paper_sweep = true;
    else if (f == "--decode-sweep") a.decode_sweep = true;
    else if (f == "--n" || f == "--nq") a.n = split_ints(f, value()), a.n_given = true;
    else if (f == "--nk") a.nk = split_ints(f, value())[0];
    else if (f == "--d") a.d = split_ints(f, value()), a.d_given = true;
    else if (f == "--B") a.B = split_ints(f, value())[0];
    else if (f == "--H") a.H = split_ints(f, value())[0];
    else if (f == "--Hkv") a.Hkv = split_ints(f, value())[0];
    else if (f == "--causal") {
      a.causal_given = true;
      std::string v = value();
      if (v == "0") a.causal = {0};
      else if (v == "1") a.causal = {1};
      else if (v == "both") a.causal = {0, 1};
      else usage_error("--causal expects 0, 1 or both");
    } else if (f == "--dtype") {
      a.dtypes.clear();
      try {
        for (const std::string& t : split(value())) a.dtypes.push_back(parse_dtype(t));
      } catch (const AttnError& e) {
        usage_error(e.what());
      }
    } else if (f == "--repeats") a.opt.repeats = split_ints(f, value())[0];
    else if (f == "--warm-seconds") {
      char* end = nullptr;
      const std::string v = value();
      a.opt.warm_seconds = std::strtod(v.c_str(), &end);
      if (end == v.c_str() || *end != '\0' || a.opt.warm_seconds < 0) usage_error("--warm-seconds needs a number >= 0");
    }
    else if (f == "--timing") {
      if (!parse_timing_mode(value(), &a.opt.timing)) usage_error("--timing expects flushed, isolated or back-to-back");
    }
    else if (f == "--check") a.opt.check_ref = true;
    else if (f == "--backward") a.opt.backward = true;
    else if (f == "--measure-bytes") a.opt.measure_bytes = true;
    else if (f == "--no-ceilings") a.ceilings = false;
    else if (f == "--csv") a.csv = value();
    else if (f == "--json") a.json = value();
    else if (f == "--seed") a.opt.seed = split_ints(f, value())[0];
    else if (f == "--outliers") a.opt.fill = Fill::outliers;
    else if (f == "-h" || f == "--help") {
      std::cout << kUsage;
      std::exit(0);
    } else usage_error("unknown flag " + f);
  }
  if (a.paper_sweep && a.decode_sweep) usage_error("--paper-sweep and --decode-sweep are two different sweeps");
  if (a.paper_sweep) {
    if (!a.n_given) a.n = {512, 1024, 2048, 4096, 8192, 16384};
    if (!a.d_given) a.d = {64, 128, 256};
  }
  if (a.decode_sweep) {
    if (!a.n_given) a.n = {1, 4};
    if (!a.causal_given) a.causal = {0};
  }
  return a;
}

std::vector<AttnProblem> problems(const Args& a) {
  std::vector<AttnProblem> out;
  if (a.decode_sweep) {  // one decode step (Nq query rows) against a long KV cache, GQA 32 / 8
    for (DType t : a.dtypes)
      for (int d : a.d)
        for (int causal : a.causal)
          for (int B : {1, 8, 32})
            for (int nq : a.n)
              for (int nk : {4096, 16384, 65536, 131072}) {
                AttnProblem p;
                p.dtype = t, p.d = d, p.causal = causal, p.B = B, p.H = 32, p.Hkv = 8, p.Nq = nq, p.Nk = nk;
                out.push_back(p);
              }
    return out;
  }
  for (DType t : a.dtypes)
    for (int d : a.d)
      for (int causal : a.causal)
        for (int n : a.n) {
          AttnProblem p;
          p.dtype = t;
          p.d = d;
          p.causal = causal;
          p.Nq = n;
          p.Nk = a.nk ? a.nk : n;
          if (a.paper_sweep) {  // FlashAttention papers: 16k tokens in total, hidden size 2048
            p.B = std::max(1, 16384 / n);
            p.H = p.Hkv = std::max(1, 2048 / d);
          } else {
            p.B = a.B;
            p.H = a.H;
            p.Hkv = a.Hkv ? a.Hkv : a.H;
          }
          out.push_back(p);
        }
  return out;
}

double percent_of_ceiling(const Stage& s, const Row& r) {
  if (s.compute_bound && is_fp8(r.p.dtype)) return -1;  // the ceiling is a bf16 GEMM: no e4m3 one measured
  if (s.compute_bound) return r.ceilings.gemm_tflops > 0 ? 100 * r.tflops / r.ceilings.gemm_tflops : -1;
  if (r.ceilings.copy_gbps <= 0 || r.model_hbm_bytes < 0) return -1;
  return 100 * r.model_hbm_bytes / (r.t.median_ms * 1e-3) / 1e9 / r.ceilings.copy_gbps;
}

}  // namespace

int main(int argc, char** argv) {
  Args a = parse(argc, argv);
  std::vector<const Stage*> stages;
  try {
    if (a.rungs.empty())
      for (const Stage& s : registry()) stages.push_back(&s);
    else
      for (const std::string& name : a.rungs) stages.push_back(&find_stage(name));
  } catch (const AttnError& e) {
    usage_error(e.what());
  }
  std::string why;
  if (!cuda_device_available(&why)) {
    std::cerr << "attn_bench: " << why << "; the ladder needs an NVIDIA GPU\n";
    return 1;
  }
  std::ofstream csv, json;
  if (!a.csv.empty()) {
    csv.open(a.csv);
    if (!csv) usage_error("cannot write " + a.csv);
    write_csv_header(csv);
  }
  try {
    Harness h(a.opt);
    std::cout << "gpu: " << h.gpu() << "\n";
    if (a.opt.measure_bytes)
      std::cout << "measured bytes: "
                << (h.counter()->available() ? "CUPTI range profiler" : "not measured (" + h.counter()->reason() + ")")
                << "\n";
    if (a.ceilings) {
      Ceilings c = measure_ceilings(nullptr);
      std::printf("ceilings: copy %.0f GB/s (read+write), bf16 GEMM %.0f TFLOPS\n", c.copy_gbps, c.gemm_tflops);
      h.set_ceilings(c);
    }
    std::vector<AttnProblem> probs = problems(a);
    std::vector<Row> rows;
    for (size_t i = 0; i < probs.size(); ++i) {
      std::printf("[%zu/%zu] %s\n", i + 1, probs.size(), probs[i].describe().c_str());
      std::fflush(stdout);
      for (Row& r : h.run_problem(probs[i], stages, [](const std::string& line) {
             std::puts(line.c_str());
             std::fflush(stdout);
           })) {
        if (csv) write_csv_row(csv, r), csv.flush();
        rows.push_back(r);
      }
    }
    if (!a.json.empty()) {
      json.open(a.json);
      write_json(json, rows);
    }

    int failures = 0;
    std::printf("\n%-22s %-34s %9s %8s %7s %9s %9s\n", "rung", "problem", "ms", "TFLOPS", "%ceil", "err_ref",
                "err_prev");
    for (const Row& r : rows) {
      const Stage& s = find_stage(r.rung);
      // An error past its bound, or NaN (NaN > tol is false); -1: not computed. Against the
      // rung below, two approximations may differ by twice the bound (chain_tolerance).
      auto over = [](double err, double tol) { return std::isnan(err) || (err >= 0 && err > tol); };
      bool bad = !r.note.empty() || over(r.err_vs_ref, tolerance(r.p.dtype)) ||
                 over(r.err_vs_prev, chain_tolerance(r.p.dtype));
      failures += bad;
      std::ostringstream prob;
      prob << "B" << r.p.B << " H" << r.p.H << " N" << r.p.Nq << (r.p.Nk != r.p.Nq ? "/" + std::to_string(r.p.Nk) : "")
           << " d" << r.p.d << (r.p.causal ? " causal" : "") << " " << dtype_name(r.p.dtype);
      auto opt = [](double x, const char* f) {
        char buf[32];
        std::snprintf(buf, sizeof buf, f, x);
        return x < 0 ? std::string("-") : std::string(buf);
      };
      const std::string rung = r.backward ? r.rung + " bwd" : r.rung;
      std::printf("%-22s %-34s %9.3f %8.1f %7s %9s %9s%s\n", rung.c_str(), prob.str().c_str(), r.t.median_ms, r.tflops,
                  opt(percent_of_ceiling(s, r), "%.1f").c_str(), opt(r.err_vs_ref, "%.2e").c_str(),
                  opt(r.err_vs_prev, "%.2e").c_str(), bad ? "  FAIL" : "");
    }
    if (failures) {
      std::printf("\n%d row(s) failed the accuracy bounds or wrote non-finite values\n", failures);
      return 1;
    }
  } catch (const std::exception& e) {
    std::cerr << "attn_bench: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
