#!/usr/bin/env python3
"""The PyTorch operator's speed against the bench's and cuDNN's, on the same GPU in one call.

For each rung and problem: attn_ladder.attention timed back to back in this process (as a
training loop calls it), the plain call attn_ladder.run (the C API without the operator's
dispatch), PyTorch SDPA's cuDNN backend the same way in the same process, and
build/bench/attn_bench --timing back-to-back on the same problems (its own process). Writes
one row per (rung, problem) to --csv and prints the table; scripts/lessons.py quotes the CSV
(metric=op).

    scripts/op_bench.py --csv results/<gpu>/op.csv [--rungs 05_fa2_reordered,06d_fa3,06_fp8]
                        [--n 2048,8192] [--d 128]

Problems: B·N = 16384 tokens, H = 16 (the papers' sweep at d = 128), causal and not; FP8
rungs non-causal, bf16 in. Timing: peers.py's time_call (warm-up of 0.3 s, then 50 calls
queued together with an event between each two; median).
"""

import argparse
import csv
import pathlib
import subprocess
import sys
import tempfile

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import peers  # noqa: E402  (time_call, attention_call, gpu_name, git_sha)

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "python"))
import attn_ladder  # noqa: E402

TOKENS = 16384
HEADS = 16
REPEATS = 50
COLUMNS = ["gpu", "rung", "dtype", "B", "H", "N", "d", "causal", "op_ms", "run_ms", "bench_ms", "op_over_bench",
           "cudnn_ms", "speedup_vs_cudnn", "git_sha"]


def bench_times(bench, rungs, ns, d, fp8):
    """{(rung, N, causal): median ms} from attn_bench --timing back-to-back."""
    with tempfile.TemporaryDirectory() as tmp:
        out = pathlib.Path(tmp) / "bench.csv"
        cmd = [str(bench), "--rungs", ",".join(rungs), "--n", ",".join(map(str, ns)), "--d", str(d),
               "--H", str(HEADS), "--timing", "back-to-back", "--repeats", str(REPEATS), "--no-ceilings",
               "--causal", "0" if fp8 else "both", "--dtype", "fp8" if fp8 else "bf16", "--csv", str(out)]
        times = {}
        for n in ns:  # B varies with N: one bench call per N
            run_cmd = cmd.copy()
            run_cmd[run_cmd.index("--n") + 1] = str(n)
            subprocess.run(run_cmd + ["--B", str(TOKENS // n)], check=True, stdout=subprocess.DEVNULL)
            with open(out, newline="") as f:
                for r in csv.DictReader(f):
                    times[(r["rung"], int(r["Nq"]), int(r["causal"]))] = float(r["time_ms_median"])
        return times


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rungs", default="05_fa2_reordered,06d_fa3,06_fp8")
    p.add_argument("--n", default="2048,8192")
    p.add_argument("--d", type=int, default=128)
    p.add_argument("--bench", type=pathlib.Path, default=REPO / "build" / "bench" / "attn_bench")
    p.add_argument("--csv", type=pathlib.Path, required=True)
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("op_bench.py: no CUDA GPU visible to torch")
    if not a.bench.is_file():
        sys.exit(f"op_bench.py: no bench at {a.bench} (build the repository first)")
    rungs, ns = a.rungs.split(","), [int(n) for n in a.n.split(",")]
    fp8_rungs = [r for r in rungs if "fp8" in r]
    bf16_rungs = [r for r in rungs if r not in fp8_rungs]
    bench = {}
    if bf16_rungs:
        bench.update(bench_times(a.bench, bf16_rungs, ns, a.d, fp8=False))
    if fp8_rungs:
        bench.update(bench_times(a.bench, fp8_rungs, ns, a.d, fp8=True))
    gpu, sha = peers.gpu_name(), peers.git_sha()
    a.csv.parent.mkdir(parents=True, exist_ok=True)
    with open(a.csv, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        print(f"{'rung':<18} {'N':>5} {'causal':>6} {'op ms':>8} {'run ms':>8} {'bench ms':>9} {'op/bench':>9} {'cuDNN ms':>9} "
              f"{'vs cuDNN':>9}")
        for n in ns:
            B = TOKENS // n
            q, k, v = (torch.randn(B, HEADS, n, a.d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            for causal in (0, 1):
                cudnn_ms = peers.time_call(peers.attention_call(peers.SDPBackend.CUDNN_ATTENTION, q, k, v,
                                                                causal, None), REPEATS, None, "back-to-back")[0]
                for rung in rungs:
                    fp8 = rung in fp8_rungs
                    if fp8 and causal:
                        continue
                    with torch.no_grad():
                        op_ms = peers.time_call(lambda: attn_ladder.attention(q, k, v, rung=rung, causal=bool(causal),
                                                                              fp8=fp8),
                                                REPEATS, None, "back-to-back")[0]
                        run_ms = peers.time_call(lambda: attn_ladder.run(rung, q, k, v, causal=bool(causal), fp8=fp8),
                                                 REPEATS, None, "back-to-back")[0]
                    bench_ms = bench.get((rung, n, causal))
                    row = {"gpu": gpu, "rung": rung, "dtype": "fp8" if fp8 else "bf16", "B": B, "H": HEADS, "N": n,
                           "d": a.d, "causal": causal, "op_ms": f"{op_ms:.4f}", "run_ms": f"{run_ms:.4f}",
                           "bench_ms": f"{bench_ms:.4f}" if bench_ms else "",
                           "op_over_bench": f"{op_ms / bench_ms:.3f}" if bench_ms else "",
                           "cudnn_ms": f"{cudnn_ms:.4f}", "speedup_vs_cudnn": f"{cudnn_ms / op_ms:.3f}", "git_sha": sha}
                    w.writerow(row)
                    print(f"{rung:<18} {n:>5} {causal:>6} {op_ms:>8.3f} {run_ms:>8.3f} {bench_ms or float('nan'):>9.3f} "
                          f"{row['op_over_bench'] or '–':>9} {cudnn_ms:>9.3f} {row['speedup_vs_cudnn']:>9}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
