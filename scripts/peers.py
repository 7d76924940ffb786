#!/usr/bin/env python3
"""PyTorch SDPA rows for the ladder's CSV: the peers every rung is compared against.

Each backend of torch.nn.functional.scaled_dot_product_attention (flash = FlashAttention-2,
cuDNN, memory-efficient, math) runs the same problems as build/bench/attn_bench and is
timed the same way: warm-up (3 calls, and calls for at least 0.3 s so that the clock
settles under the power cap), then for each repeat an L2 flush (write, then read, a buffer
of 2x L2) and CUDA events around the attention call alone; median, min and max. The rows use the
bench's CSV columns in the bench's order (rung = torch_flash, torch_cudnn, ...).

    scripts/peers.py --paper-sweep --csv results/<gpu>/peers.csv
    scripts/peers.py --d 128 --n 1024,4096 --causal both --backends flash,cudnn

Problems are the bench's (bench/attn_bench.cpp), flag for flag: --paper-sweep is the
FlashAttention papers' sweep (B*N = 16384 tokens, H = Hkv = 2048/d, N = 512 .. 16384,
d in {64, 128, 256}); --d / --n narrow it. Without it: --B 1, --H 16, --Hkv H, --n
1024,4096, --d 128. --causal both by default; --nk overrides Nk.

Columns a peer cannot fill are left empty: measured bytes (no CUPTI here; use
scripts/profile.sh), err_vs_prev, prev_rung, softmax_*. model_hbm_bytes is the least any
algorithm moves (Q, K, V read once, O written once) for the fused backends, empty for
math (which materializes the N^2 scores). err_vs_ref is against an fp64 reference with
the harness's rule (common/reference.cpp): every row when B*H*Nq*Nk*d <= 4e9
multiply-adds, else 64 sampled query rows per (batch, head).

--backward times each backend's backward pass instead, as attn_bench --backward times the
rungs': one forward with requires_grad builds the autograd graph, and the timed call is
torch.autograd.grad(O, (Q, K, V), dO, retain_graph=True) alone (the backend's backward
kernels: the dO . O pre-pass, the main kernel and the dQ conversion for flash), not the
forward. Rows are rung = torch_flash_bwd, ...; model_flops = 2.5 x the forward's (the
FlashAttention papers' convention); err_vs_ref is the largest relative error of dQ, dK, dV
against fp64 autograd on torch's math, up to 4e9 multiply-adds (empty above).
"""

import argparse
import csv
import math
import os
import pathlib
import re
import statistics
import subprocess
import sys
import time
import warnings

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right

REPO = pathlib.Path(__file__).resolve().parent.parent

# The bench's CSV schema, in order (bench/harness.cu writes the same).
COLUMNS = [
    "gpu", "rung", "dtype", "B", "H", "Hkv", "Nq", "Nk", "d", "causal",
    "time_ms_median", "time_ms_min", "time_ms_max", "tflops",
    "model_flops", "model_hbm_bytes", "measured_read_bytes", "measured_write_bytes",
    "err_vs_prev", "err_vs_ref", "prev_rung", "softmax_ms", "softmax_model_bytes",
    "ceiling_copy_gbps", "ceiling_gemm_tflops", "git_sha",
]

BACKENDS = {
    "flash": ("torch_flash", SDPBackend.FLASH_ATTENTION),
    "cudnn": ("torch_cudnn", SDPBackend.CUDNN_ATTENTION),
    "efficient": ("torch_efficient", SDPBackend.EFFICIENT_ATTENTION),
    "math": ("torch_math", SDPBackend.MATH),
}
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}

# The FlashAttention papers' sweep.
PAPER_TOKENS = 16384  # B * N
PAPER_HIDDEN = 2048  # H * d
PAPER_N = [512, 1024, 2048, 4096, 8192, 16384]
PAPER_D = [64, 128, 256]

# flash-decoding's sweep (bench --decode-sweep): a decode step against a long KV cache.
DECODE_B = [1, 8, 32]
DECODE_NQ = [1, 4]
DECODE_NK = [4096, 16384, 65536, 131072]
DECODE_H, DECODE_HKV = 32, 8

WARMUP = 3
WARM_SECONDS = 0.3  # and keep launching until this long has passed (bench/harness.h: time_launch)
FLUSH_L2_MULTIPLE = 2  # the flush buffer is this many times L2
# err_vs_ref, as the harness: every row up to this many multiply-adds, else sampled rows.
FULL_REF_MACS = 4e9
REF_ROWS_PER_HEAD = 64
MAX_SECONDS = 2.0  # stop timing after this many seconds (at least 3 runs), as the harness
BENCH_DEFAULTS = {"B": 1, "H": 16, "n": [1024, 4096], "d": [128]}  # without --paper-sweep
# torch_math materializes scores and probabilities: about this many fp32 N^2 buffers live.
MATH_SCORE_BUFFERS = 3
COPY_CEILING_BYTES = 1 << 30  # device-to-device copy for the bandwidth ceiling
GEMM_CEILING_SIZE = 8192  # M = N = K of the bf16 GEMM ceiling
CEILING_REPEATS = 10


def parse_list(text, kind=int):
    return [kind(x) for x in text.split(",") if x.strip()]


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--paper-sweep", action="store_true", help="B*N = 16384, H = 2048/d, N in 512..16384, d in {64,128,256}")
    p.add_argument("--d", type=parse_list, help="head dims (default 128; sweep: 64,128,256)")
    p.add_argument("--decode-sweep", action="store_true",
                   help="B in {1,8,32}, H = 32 over Hkv = 8, d = 128, Nq in {1,4}, Nk in {4096..131072}, not causal")
    p.add_argument("--n", "--nq", type=parse_list, help="sequence lengths, Nq = Nk (default 1024,4096; sweep: 512..16384); with --nk: Nq")
    p.add_argument("--nk", type=int, help="override Nk")
    p.add_argument("--B", type=int, default=BENCH_DEFAULTS["B"], help="batch, without --paper-sweep")
    p.add_argument("--H", type=int, default=BENCH_DEFAULTS["H"], help="query heads, without --paper-sweep")
    p.add_argument("--Hkv", type=int, help="key/value heads, without --paper-sweep (default: H)")
    p.add_argument("--causal", choices=["0", "1", "both"], help="default both (--decode-sweep: 0)")
    p.add_argument("--dtype", type=lambda s: parse_list(s, str), default=["bf16"], help="bf16,fp16")
    p.add_argument("--backends", type=lambda s: parse_list(s, str), default=list(BACKENDS), help="flash,cudnn,efficient,math")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--timing", choices=["flushed", "isolated", "back-to-back"], default="flushed",
                   help="as attn_bench --timing: each call after an L2 flush, alone without one, or queued together")
    p.add_argument("--csv", type=pathlib.Path, help="append rows (header written if the file is new)")
    p.add_argument("--max-math-bytes", type=float, help="skip torch_math above this N^2 memory (default: free memory)")
    p.add_argument("--no-ceilings", action="store_true", help="leave the ceiling columns empty")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--backward", action="store_true",
                   help="time the backward pass alone (autograd.grad through one forward's graph); rungs torch_<backend>_bwd")
    args = p.parse_args(argv)
    for name in args.dtype:
        if name not in DTYPES:
            p.error(f"--dtype {name}: choose from {', '.join(DTYPES)}")
    for name in args.backends:
        if name not in BACKENDS:
            p.error(f"--backends {name}: choose from {', '.join(BACKENDS)}")
    if args.repeats < 1:
        p.error("--repeats must be >= 1")
    if args.paper_sweep and args.decode_sweep:
        p.error("--paper-sweep and --decode-sweep are two different sweeps")
    args.causal = args.causal or ("0" if args.decode_sweep else "both")
    args.d = args.d or (PAPER_D if args.paper_sweep else BENCH_DEFAULTS["d"])
    args.n = args.n or (PAPER_N if args.paper_sweep else DECODE_NQ if args.decode_sweep else BENCH_DEFAULTS["n"])
    return args


def problems(args):
    """(B, H, Hkv, Nq, Nk, d, causal) in the bench's order: d, causal, N."""
    causals = [0, 1] if args.causal == "both" else [int(args.causal)]
    if args.decode_sweep:  # bench/attn_bench.cpp --decode-sweep, in its order
        for d in args.d:
            for causal in causals:
                for B in DECODE_B:
                    for nq in args.n:
                        for nk in DECODE_NK:
                            yield B, DECODE_H, DECODE_HKV, nq, nk, d, causal
        return
    for d in args.d:
        for causal in causals:
            for n in args.n:
                if args.paper_sweep:
                    B, H = max(1, PAPER_TOKENS // n), max(1, PAPER_HIDDEN // d)
                    Hkv = H
                else:
                    B, H, Hkv = args.B, args.H, args.Hkv or args.H
                yield B, H, Hkv, n, args.nk or n, d, causal


def gpu_name():
    """As the bench (bench/harness.cu gpu_slug): lowercased, every other character '_'."""
    return re.sub(r"[^0-9a-z]", "_", torch.cuda.get_device_name().lower())


def git_sha():
    if os.environ.get("ATTN_GIT_SHA"):  # a copy of the tree without .git (set by the caller)
        return os.environ["ATTN_GIT_SHA"]
    try:
        out = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True)
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"  # as the bench when git is not there


def visible_pairs(Nq, Nk, causal):
    """(query, key) pairs the mask leaves. Bottom-right causal: row i sees i + (Nk - Nq) + 1
    keys when that is positive, so the last row sees all Nk and the counts step down by one
    per row: max(Nk - Nq, 0) + 1, ..., Nk."""
    if not causal:
        return Nq * Nk
    lo = max(Nk - Nq, 0) + 1
    return (lo + Nk) * (Nk - lo + 1) // 2


def model_flops(B, H, Nq, Nk, d, causal):
    return 4 * d * visible_pairs(Nq, Nk, causal) * B * H


def min_hbm_bytes(B, H, Hkv, Nq, Nk, d, elem_bytes):
    """Read Q, K, V once, write O once (common/hbm_model.h: min_bytes)."""
    return elem_bytes * (2 * B * H * Nq * d + 2 * B * Hkv * Nk * d)


def reference_rows(B, H, Nq, Nk, d):
    """{(b, h): query rows} checked against fp64, as common/reference.cpp: all rows when the
    full reference is cheap, else REF_ROWS_PER_HEAD spread over [0, Nq-1], both ends
    included, inner ones offset by (7b + 13h) mod 5 so heads differ."""
    if B * H * Nq * Nk * d <= FULL_REF_MACS or REF_ROWS_PER_HEAD >= Nq:
        return {(b, h): list(range(Nq)) for b in range(B) for h in range(H)}
    per = REF_ROWS_PER_HEAD
    rows = {}
    for b in range(B):
        for h in range(H):
            picked = []
            for k in range(per):
                i = k * (Nq - 1) // (per - 1)
                if 0 < k < per - 1:
                    i = min(Nq - 2, i + (b * 7 + h * 13) % 5)
                picked.append(i)
            rows[(b, h)] = picked
    return rows


def rel_diff(x, ref):
    """Relative Frobenius difference of x from ref, in fp32 (two kernels' outputs)."""
    ref = ref.float()
    return ((x.float() - ref).norm() / ref.norm()).item()


def reference_error(q, k, v, o, causal, scale):
    """Relative Frobenius error of O against an fp64 reference on the harness's rows."""
    B, H, Nq, d = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    cols = torch.arange(Nk, device=q.device)
    diff2 = ref2 = 0.0
    for (b, h), picked in reference_rows(B, H, Nq, Nk, d).items():
        rows = torch.tensor(picked, device=q.device)
        kv_head = h // (H // Hkv)
        s = (q[b, h, rows].double() @ k[b, kv_head].double().T) * scale
        if causal:
            s = s.masked_fill(cols[None, :] > rows[:, None] + (Nk - Nq), float("-inf"))
        p = torch.softmax(s, dim=-1).nan_to_num(0.0)  # a row that sees no key: O = 0
        o_ref = p @ v[b, kv_head].double()
        diff2 += (o[b, h, rows].double() - o_ref).pow(2).sum().item()
        ref2 += o_ref.pow(2).sum().item()
    return math.sqrt(diff2 / ref2) if ref2 > 0 else math.sqrt(diff2)


def attention_call(backend, q, k, v, causal, scale):
    """One SDPA call on one backend; bottom-right causal via CausalBias when Nq != Nk."""
    Nq, Nk = q.shape[2], k.shape[2]
    gqa = q.shape[1] != k.shape[1]
    if causal and Nq != Nk:
        mask, is_causal = causal_lower_right(Nq, Nk), False
        if backend in (SDPBackend.CUDNN_ATTENTION, SDPBackend.MATH):  # these take a dense mask: build
            mask = mask._materialize(q.device)  # it once, outside the timed call, not in every call
    else:
        mask, is_causal = None, bool(causal)

    def call():
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal, scale=scale, enable_gqa=gqa)

    return call


class L2Flush:
    """As the harness's L2Flusher: write a buffer of 2x L2 (evicts the last call's lines),
    then read it (evicts our own dirty lines, so no write-back lands in the timed call)."""

    def __init__(self):
        l2 = torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size
        self.buffer = torch.empty(FLUSH_L2_MULTIPLE * l2, dtype=torch.uint8, device="cuda")

    def __call__(self):
        self.buffer.fill_(1)
        self.buffer.sum()


def event_time(call):
    """One call's time (ms) between two CUDA events, waited for."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    call()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def time_call(call, repeats, flush, timing="flushed"):
    """Median, min, max of `repeats` event-timed calls, each after an L2 flush (ms); stops
    after MAX_SECONDS in total once 3 runs are in, as the harness does. timing="isolated":
    no flush; "back-to-back": the calls queued together, an event between each two (the
    Python call overhead must stay below the kernel's time for the GPU not to idle)."""
    warm_start = time.perf_counter()
    for _ in range(WARMUP):
        call()
    torch.cuda.synchronize()
    while time.perf_counter() - warm_start < WARM_SECONDS:
        call()
        torch.cuda.synchronize()
    times = []
    if timing == "back-to-back":
        events = [torch.cuda.Event(enable_timing=True) for _ in range(repeats + 1)]
        events[0].record()
        for e in events[1:]:
            call()
            e.record()
        events[-1].synchronize()
        times = [a.elapsed_time(b) for a, b in zip(events, events[1:])]
        return statistics.median(times), min(times), max(times)
    for _ in range(repeats):
        if timing == "flushed":
            flush()
        times.append(event_time(call))
        if sum(times) * 1e-3 > MAX_SECONDS and len(times) >= 3:
            break
    return statistics.median(times), min(times), max(times)


def ceilings(flush):
    """Device-to-device copy bandwidth (read + write bytes, GB/s) and bf16 GEMM TFLOPS."""
    src = torch.empty(COPY_CEILING_BYTES // 2, dtype=torch.int16, device="cuda").fill_(1)
    dst = torch.empty_like(src)
    copy_ms, _, _ = time_call(lambda: dst.copy_(src), CEILING_REPEATS, flush)
    copy_gbps = 2 * COPY_CEILING_BYTES / (copy_ms * 1e-3) / 1e9
    del src, dst
    n = GEMM_CEILING_SIZE
    a = torch.randn(n, n, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(n, n, dtype=torch.bfloat16, device="cuda")
    gemm_ms, _, _ = time_call(lambda: a @ b, CEILING_REPEATS, flush)
    return copy_gbps, 2 * n**3 / (gemm_ms * 1e-3) / 1e12


def refusal_reason(error, caught_warnings):
    """The error's first line, plus SDPA's warnings that say why (without their source locations)."""
    first = lambda text: text.strip().splitlines()[0] if text.strip() else ""  # noqa: E731
    notes = []
    for w in caught_warnings:
        note = first(str(w.message)).split(" (Triggered internally")[0]
        if note and not note.endswith("because:") and note not in notes:
            notes.append(note)
    reason = first(str(error)) or type(error).__name__
    return f"{reason} ({'; '.join(notes)})" if notes else reason


def math_bytes(B, H, Nq, Nk):
    return MATH_SCORE_BUFFERS * 4 * B * H * Nq * Nk


def fmt(x):
    if x is None:
        return ""
    if isinstance(x, float):
        return f"{x:.6g}"
    return str(x)


def open_csv(path):
    """Append to `path`; write the header when the file is new or empty; refuse a foreign header."""
    fresh = not path.exists() or path.stat().st_size == 0
    if not fresh:
        with path.open(newline="") as f:
            header = next(csv.reader(f), [])
        if header != COLUMNS:
            sys.exit(f"peers.py: {path} has a different header; write to a new file")
    path.parent.mkdir(parents=True, exist_ok=True)
    f = path.open("a", newline="")
    writer = csv.writer(f, lineterminator="\n")  # as the bench writes it
    if fresh:
        writer.writerow(COLUMNS)
    return f, writer


def run_problem(args, flush, common, writer, dtype_name, B, H, Hkv, Nq, Nk, d, causal):
    dtype = DTYPES[dtype_name]
    gen = torch.Generator(device="cuda").manual_seed(args.seed)
    q = torch.randn(B, H, Nq, d, dtype=dtype, device="cuda", generator=gen)
    k = torch.randn(B, Hkv, Nk, d, dtype=dtype, device="cuda", generator=gen)
    v = torch.randn(B, Hkv, Nk, d, dtype=dtype, device="cuda", generator=gen)
    scale = 1.0 / math.sqrt(d)
    shape = f"{dtype_name} B={B} H={H} Hkv={Hkv} Nq={Nq} Nk={Nk} d={d} causal={causal}"
    flops = model_flops(B, H, Nq, Nk, d, causal)
    free_bytes = torch.cuda.mem_get_info()[0]
    for key in args.backends:
        rung, backend = BACKENDS[key]
        if key == "math":
            limit = args.max_math_bytes if args.max_math_bytes is not None else free_bytes
            need = math_bytes(B, H, Nq, Nk)
            if need > limit:
                print(f"[peers] skip {rung} {shape}: its N^2 scores need ~{need / 1e9:.1f} GB, limit {limit / 1e9:.1f} GB", flush=True)
                continue
        call = attention_call(backend, q, k, v, causal, scale)
        try:
            with warnings.catch_warnings(record=True) as why:  # SDPA says why a backend refuses as warnings
                warnings.simplefilter("always")
                o = call()
            torch.cuda.synchronize()
            med, lo, hi = time_call(call, args.repeats, flush, args.timing)
        except (RuntimeError, ValueError, NotImplementedError) as e:  # the backend refuses the shape
            print(f"[peers] skip {rung} {shape}: {refusal_reason(e, why)}", flush=True)
            torch.cuda.empty_cache()
            continue
        err = reference_error(q, k, v, o, causal, scale)
        tflops = flops / (med * 1e-3) / 1e12
        row = dict(common, rung=rung, dtype=dtype_name, B=B, H=H, Hkv=Hkv, Nq=Nq, Nk=Nk, d=d, causal=causal,
                   time_ms_median=med, time_ms_min=lo, time_ms_max=hi, tflops=tflops, model_flops=flops,
                   model_hbm_bytes=None if key == "math" else min_hbm_bytes(B, H, Hkv, Nq, Nk, d, q.element_size()),
                   err_vs_ref=err)
        print(f"[peers] {rung:16s} {shape}: {med:.3f} ms, {tflops:.1f} TFLOPS, err_vs_ref {err:.2e}", flush=True)
        if writer:
            writer.writerow([fmt(row.get(c)) for c in COLUMNS])
        del o
    del q, k, v
    torch.cuda.empty_cache()


def reference_grad_error(q, k, v, dout, grads, causal, scale):
    """Largest relative Frobenius error of (dQ, dK, dV) against fp64 autograd through the
    math attention (GQA by repeating K, V heads; a row that sees no key gets no gradient)."""
    B, H, Nq, d = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ke, ve = (t.repeat_interleave(H // Hkv, dim=1) for t in (k64, v64))
    s = (q64 @ ke.transpose(-1, -2)) * scale
    if causal:
        rows = torch.arange(Nq, device=q.device)[:, None]
        cols = torch.arange(Nk, device=q.device)[None, :]
        s = s.masked_fill(cols > rows + (Nk - Nq), float("-inf"))
    o = torch.softmax(s, dim=-1).nan_to_num(0.0) @ ve
    ref = torch.autograd.grad(o, (q64, k64, v64), dout.double())
    errs = []
    for got, want in zip(grads, ref):
        diff, norm = (got.double() - want).norm().item(), want.norm().item()
        errs.append(diff / norm if norm > 0 else diff)
    return max(errs)


def run_problem_backward(args, flush, common, writer, dtype_name, B, H, Hkv, Nq, Nk, d, causal):
    """As run_problem, timing each backend's backward pass alone (see --backward)."""
    dtype = DTYPES[dtype_name]
    gen = torch.Generator(device="cuda").manual_seed(args.seed)
    q = torch.randn(B, H, Nq, d, dtype=dtype, device="cuda", generator=gen).requires_grad_()
    k = torch.randn(B, Hkv, Nk, d, dtype=dtype, device="cuda", generator=gen).requires_grad_()
    v = torch.randn(B, Hkv, Nk, d, dtype=dtype, device="cuda", generator=gen).requires_grad_()
    dout = torch.randn(B, H, Nq, d, dtype=dtype, device="cuda", generator=gen)
    scale = 1.0 / math.sqrt(d)
    shape = f"{dtype_name} B={B} H={H} Hkv={Hkv} Nq={Nq} Nk={Nk} d={d} causal={causal}"
    flops = 2.5 * model_flops(B, H, Nq, Nk, d, causal)
    check = B * H * Nq * Nk * d <= FULL_REF_MACS
    free_bytes = torch.cuda.mem_get_info()[0]
    for key in args.backends:
        rung, backend = BACKENDS[key]
        rung += "_bwd"
        if key == "math":
            limit = args.max_math_bytes if args.max_math_bytes is not None else free_bytes
            need = 2 * math_bytes(B, H, Nq, Nk)  # the forward's saved N^2 tensors and their gradients
            if need > limit:
                print(f"[peers] skip {rung} {shape}: its N^2 tensors need ~{need / 1e9:.1f} GB, limit {limit / 1e9:.1f} GB", flush=True)
                continue
        try:
            with warnings.catch_warnings(record=True) as why:
                warnings.simplefilter("always")
                o = attention_call(backend, q, k, v, causal, scale)()
                call = lambda: torch.autograd.grad(o, (q, k, v), dout, retain_graph=True)  # noqa: E731
                grads = call()
            torch.cuda.synchronize()
            med, lo, hi = time_call(call, args.repeats, flush, args.timing)
        except (RuntimeError, ValueError, NotImplementedError) as e:  # the backend refuses the shape
            print(f"[peers] skip {rung} {shape}: {refusal_reason(e, why)}", flush=True)
            torch.cuda.empty_cache()
            continue
        err = reference_grad_error(q, k, v, dout, grads, causal, scale) if check else None
        tflops = flops / (med * 1e-3) / 1e12
        row = dict(common, rung=rung, dtype=dtype_name, B=B, H=H, Hkv=Hkv, Nq=Nq, Nk=Nk, d=d, causal=causal,
                   time_ms_median=med, time_ms_min=lo, time_ms_max=hi, tflops=tflops, model_flops=flops,
                   err_vs_ref=err)
        err_text = f"{err:.2e}" if err is not None else "-"
        print(f"[peers] {rung:20s} {shape}: {med:.3f} ms, {tflops:.1f} TFLOPS, err_vs_ref {err_text}", flush=True)
        if writer:
            writer.writerow([fmt(row.get(c)) for c in COLUMNS])
        del o, grads
    del q, k, v, dout
    torch.cuda.empty_cache()


def main(argv=None):
    args = parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("peers.py: no CUDA GPU visible to torch")
    flush = L2Flush()
    common = {"gpu": gpu_name(), "git_sha": git_sha()}
    if not args.no_ceilings:
        copy_gbps, gemm_tflops = ceilings(flush)
        common.update(ceiling_copy_gbps=copy_gbps, ceiling_gemm_tflops=gemm_tflops)
        print(f"[peers] ceilings on {common['gpu']}: copy {copy_gbps:.0f} GB/s (read+write), bf16 GEMM {gemm_tflops:.0f} TFLOPS", flush=True)
    f, writer = open_csv(args.csv) if args.csv else (None, None)
    try:
        for dtype_name in args.dtype:
            for prob in problems(args):
                (run_problem_backward if args.backward else run_problem)(args, flush, common, writer, dtype_name, *prob)
                if f:
                    f.flush()
    finally:
        if f:
            f.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
