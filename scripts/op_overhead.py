#!/usr/bin/env python3
"""The operator's host cost per call and a small model's training step, next to SDPA's.

    scripts/op_overhead.py --out results/<gpu> [--rung 05_fa2_reordered] [--no-python-backend]

Host cost: a tiny problem (B 1, H 4, N 128, d 64, bf16, causal), whose kernels take a few
microseconds, called back to back (no grad): the wall time per call after a warm-up is then
the host's time to issue one call. Timed in one process: attn_ladder.attention (the
operator; its definition, C++ or Python, in the `backend` column), attn_ladder.run (the
ctypes call) and SDPA's flash and cuDNN backends. The control: the same calls captured in a
CUDA graph and replayed, i.e. the GPU time per call without the host; it must stay well below
the host numbers for them to mean host time.

Training step: the model of scripts/train_compare.py (2 pre-norm blocks, d_model 256, 4 heads
of 64, causal, B 16, T 256, AdamW): forward, backward and optimizer step, back to back, with
the rung's attention (forward and backward) and with SDPA flash and cuDNN.

By default the script also runs itself once more with ATTN_LADDER_TORCH_OP=0 (the operator
defined in Python over ctypes) and adds those rows, so the CSV compares both definitions.
Writes <out>/op_overhead.csv; about a minute on an H200.
"""

import argparse
import csv
import os
import pathlib
import subprocess
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

SCRIPTS = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(SCRIPTS))
sys.path.insert(0, str(SCRIPTS.parent / "python"))
import attn_ladder  # noqa: E402
import peers  # noqa: E402  (gpu_name, git_sha)
import train_compare  # noqa: E402  (the toy model)

TINY = dict(B=1, H=4, N=128, d=64)
CALLS = 3000  # timed calls per implementation (after WARMUP)
WARMUP = 300
GRAPH_CALLS = 200  # calls captured in one CUDA graph (the control)
STEPS, WARMUP_STEPS = 40, 10
COLUMNS = ["gpu", "what", "impl", "backend", "B", "H", "N", "d", "us", "over_sdpa_flash", "git_sha"]


def host_us(call):
    """Wall microseconds per call, CALLS calls back to back after WARMUP, GPU idle at both ends."""
    for _ in range(WARMUP):
        call()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(CALLS):
        call()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / CALLS * 1e6


def graph_us(call):
    """GPU microseconds per call: GRAPH_CALLS calls captured in one CUDA graph, replayed."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up outside the capture
        for _ in range(3):
            call()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(GRAPH_CALLS):
            call()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / (5 * GRAPH_CALLS)


def tiny_calls(rung):
    """{impl: call} on the tiny problem. SDPA's backend is chosen once, outside the timed calls."""
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(TINY["B"], TINY["H"], TINY["N"], TINY["d"], device="cuda", dtype=torch.bfloat16,
                           generator=g) for _ in range(3))
    return {
        f"attention {rung}": (lambda: attn_ladder.attention(q, k, v, rung=rung, causal=True), None),
        f"run {rung}": (lambda: attn_ladder.run(rung, q, k, v, causal=True), None),
        "sdpa flash": (lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), SDPBackend.FLASH_ATTENTION),
        "sdpa cudnn": (lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), SDPBackend.CUDNN_ATTENTION),
    }


def step_ms(attend, sdpa_backend=None):
    """Milliseconds per training step of train_compare's model, steps back to back (SDPA's
    backend, if given, chosen once around them all)."""
    if sdpa_backend is not None:
        with sdpa_kernel([sdpa_backend]):
            return step_ms(attend)
    T, B = train_compare.SEQ, train_compare.BATCH
    text = train_compare.markov_text(B * (T + 1) * 2 + T + 1, 0).cuda()
    torch.manual_seed(0)
    model = train_compare.LanguageModel(attend).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=train_compare.LR, weight_decay=0.01)
    g = torch.Generator(device="cuda").manual_seed(0)

    def step():
        starts = torch.randint(0, text.numel() - T - 1, (B,), device="cuda", generator=g)
        window = text[starts[:, None] + torch.arange(T + 1, device="cuda")]
        logits = model(window[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, train_compare.VOCAB), window[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    for _ in range(WARMUP_STEPS):
        step()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(3):  # the best of three rounds: a stray host hiccup does not count
        start = time.perf_counter()
        for _ in range(STEPS):
            step()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - start) / STEPS * 1e3)
    return best


def measure(rung):
    """Rows (what, impl, B, H, N, d, us) of this process (train_step's in us too)."""
    rows = []
    shape = (TINY["B"], TINY["H"], TINY["N"], TINY["d"])
    with torch.no_grad():
        for impl, (call, backend) in tiny_calls(rung).items():
            if backend is not None:
                with sdpa_kernel([backend]):
                    host, gpu = host_us(call), graph_us(call)
            else:
                host, gpu = host_us(call), graph_us(call)
            rows.append(("host_per_call", impl, *shape, host))
            rows.append(("graph_replay_per_call", impl, *shape, gpu))
    toy = (train_compare.BATCH, train_compare.HEADS, train_compare.SEQ, train_compare.D_MODEL // train_compare.HEADS)
    for impl, attend, backend in ((f"attention {rung}", train_compare.ladder_attention(rung), None),
                                  ("sdpa flash", train_compare.sdpa_attention, SDPBackend.FLASH_ATTENTION),
                                  ("sdpa cudnn", train_compare.sdpa_attention, SDPBackend.CUDNN_ATTENTION)):
        rows.append(("train_step", impl, *toy, step_ms(attend, backend) * 1e3))
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=pathlib.Path, required=True, help="folder for op_overhead.csv")
    p.add_argument("--rung", default="05_fa2_reordered", help="a rung with a backward pass at d = 64")
    p.add_argument("--no-python-backend", action="store_true",
                   help="skip the second run with the operator defined in Python (ATTN_LADDER_TORCH_OP=0)")
    p.add_argument("--rows-only", action="store_true", help=argparse.SUPPRESS)  # the second run: rows to stdout
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("op_overhead.py: no CUDA GPU visible to torch")
    if not attn_ladder.has_backward(a.rung, train_compare.D_MODEL // train_compare.HEADS):
        sys.exit(f"op_overhead.py: rung '{a.rung}' has no backward pass at d = 64")
    backend = attn_ladder.ops.BACKEND
    rows = [(backend, *r) for r in measure(a.rung)]
    if a.rows_only:
        for r in rows:
            print("ROW", *r, sep="\t")
        return 0
    if backend == "c++" and not a.no_python_backend:
        env = dict(os.environ, ATTN_LADDER_TORCH_OP="0")
        out = subprocess.run([sys.executable, __file__, "--out", str(a.out), "--rung", a.rung, "--rows-only"],
                             env=env, check=True, capture_output=True, text=True).stdout
        for line in out.splitlines():
            if line.startswith("ROW\t"):
                b, what, impl, *shape, us = line.split("\t")[1:]
                rows.append((b, what, impl, *map(int, shape), float(us)))
    flash = {r[1]: r[-1] for r in rows if r[2] == "sdpa flash" and r[0] == backend}
    gpu, sha = peers.gpu_name(), peers.git_sha()
    a.out.mkdir(parents=True, exist_ok=True)
    path = a.out / "op_overhead.csv"
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        print(f"{gpu}; the operator's definition in this process: {backend}")
        print(f"{'what':<22} {'impl':<28} {'backend':<7} {'B':>3} {'H':>3} {'N':>4} {'d':>3} {'us':>9} {'/ flash':>8}")
        for b, what, impl, B, H, N, d, us in rows:
            ratio = us / flash[what] if flash.get(what) else float("nan")
            w.writerow({"gpu": gpu, "what": what, "impl": impl, "backend": b,
                        "B": B, "H": H, "N": N, "d": d, "us": f"{us:.2f}", "over_sdpa_flash": f"{ratio:.3f}",
                        "git_sha": sha})
            print(f"{what:<22} {impl:<28} {b:<7} {B:>3} {H:>3} {N:>4} {d:>3} {us:>9.2f} {ratio:>8.3f}")
    host = {r[2]: r[-1] for r in rows if r[1] == "host_per_call" and r[0] == backend}
    sdpa_host = min(host["sdpa flash"], host["sdpa cudnn"])
    step = {r[2]: r[-1] for r in rows if r[1] == "train_step" and r[0] == backend}
    op = f"attention {a.rung}"
    print(f"host per call: attention {host[op]:.1f} us = {host[op] / sdpa_host:.2f}x SDPA's best ({sdpa_host:.1f} us; "
          f"goal <= 1.5x); run() {host[f'run {a.rung}']:.1f} us")
    print(f"training step: {step[op] / 1e3:.3f} ms with {a.rung}, {step['sdpa flash'] / 1e3:.3f} ms with SDPA flash "
          f"({step[op] / step['sdpa flash']:.3f}x; goal <= 1.05x), {step['sdpa cudnn'] / 1e3:.3f} ms with cuDNN")
    print(f"op_overhead.py: wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
