#!/usr/bin/env python3
"""The decode sweep in CUDA graphs: 05_fa2_decode on a contiguous and on a paged KV cache,
against PyTorch SDPA's cuDNN and flash backends on the contiguous equivalent, in one process.

Every implementation is captured once in a CUDA graph (no host cost in the timing) and timed
by graph replays between CUDA events, each after an L2 flush, in `--rounds` rounds whose order
rotates (so that no implementation always follows the same one); the time is the median over
rounds of each round's median. Same inputs for all; no mask for any (Nq > 1 without a mask,
so that no peer takes a materialized dense mask). Rows:
  05_fa2_decode             attn_ladder.attention(rung="05_fa2_decode"), K, V [B, Hkv, Nk, d]
  05_fa2_decode_paged<P>    attn_ladder.decode_paged, the same K, V copied into pages of P
                            tokens [B * Nk / P, P, Hkv, d] in a random order, seq_lens = Nk
  torch_cudnn, torch_flash  SDPA on the contiguous K, V (enable_gqa)
and ceiling_copy_gbps, a plain device copy (bytes read + written per second, as the bench's
ceiling): the rate the HBM sustains, the roofline of a decode step's K + V reads. err_vs_prev: each row's O against cuDNN's.

    scripts/decode_bench.py --csv results/<gpu>/decode_paged.csv
    scripts/decode_bench.py --B 1,8 --nk 4096,65536 --nq 1 --pages 64

Prints, per (B, Nq, Nk) as it goes, the time of the contiguous decode, cuDNN / ours and flash / ours
(> 1: ours is faster), paged / contiguous per page size, and the K + V read rate against the
copy's rate.
"""

import argparse
import pathlib
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import peers  # noqa: E402  (COLUMNS, L2Flush, gpu_name, git_sha, fmt, open_csv)

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "python"))
import attn_ladder  # noqa: E402

H, HKV, D = 32, 8, 128
COPY_BYTES = 2 << 30  # the copy ceiling's buffer: far past any L2
WARM_SECONDS = 0.2  # per problem, all implementations in turn: the clock settles under the power cap


def ints(text):
    return [int(x) for x in text.split(",") if x]


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--B", type=ints, default=[1, 8, 32])
    ap.add_argument("--nk", type=ints, default=[4096, 16384, 65536, 131072])
    ap.add_argument("--nq", type=ints, default=[1, 4])
    ap.add_argument("--pages", type=ints, default=[64, 256], help="page sizes of the paged rows")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=10, help="timed replays per round")
    ap.add_argument("--csv", type=pathlib.Path)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    if a.rounds < 1 or a.repeats < 1:
        ap.error("--rounds and --repeats must be at least 1")
    return a


def captured(call):
    """call() captured in a CUDA graph after two eager warm-up calls on a side stream:
    (graph, its output)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            call()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = call()
    torch.cuda.synchronize()
    return graph, out


def time_graph(graph, flush, repeats):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    graph.replay()
    times = []
    for _ in range(repeats):
        flush()
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times), min(times), max(times)


def paged_copy(k, v, page_size, gen):
    """K, V [B, Hkv, Nk, d] in pages [B * Nk / P, P, Hkv, d] handed out in a random order:
    (k_cache, v_cache, block_table [B, Nk / P] int32)."""
    B, Hkv, Nk, d = k.shape
    per = Nk // page_size
    order = torch.randperm(B * per, generator=gen).to(k.device).view(B, per)
    caches = []
    for src in (k, v):
        cache = torch.empty(B * per, page_size, Hkv, d, dtype=src.dtype, device=src.device)
        for b in range(B):  # one sequence at a time: a temporary of one sequence's K, not the batch's
            cache[order[b]] = src[b].view(Hkv, per, page_size, d).permute(1, 2, 0, 3)
        caches.append(cache)
    return caches[0], caches[1], order.to(torch.int32).contiguous()


def sdpa(backend, q, k, v):
    def call():
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    return call


def copy_ceiling(flush):
    """A plain device copy of COPY_BYTES by a kernel, in a graph: read + write bytes per second
    / 1e9. A kernel (an elementwise negation), not dst.copy_(src): captured, that is a memcpy
    node, which ran at two thirds of the kernel's rate on an H200."""
    src = torch.ones(COPY_BYTES // 4, dtype=torch.float32, device="cuda")
    dst = torch.empty_like(src)
    graph, _ = captured(lambda: torch.neg(src, out=dst))
    ms, _, _ = time_graph(graph, flush, 10)
    del graph, src, dst
    torch.cuda.empty_cache()
    return 2 * COPY_BYTES / (ms * 1e-3) / 1e9


def run_problem(a, flush, common, writer, B, Nq, Nk, summary):
    gen = torch.Generator(device="cuda").manual_seed(a.seed)
    q = torch.randn(B, H, Nq, D, dtype=torch.bfloat16, device="cuda", generator=gen)
    k = torch.randn(B, HKV, Nk, D, dtype=torch.bfloat16, device="cuda", generator=gen)
    v = torch.randn(B, HKV, Nk, D, dtype=torch.bfloat16, device="cuda", generator=gen)
    calls = {"05_fa2_decode": lambda: attn_ladder.attention(q, k, v, rung="05_fa2_decode")}
    paged = {}
    cpu_gen = torch.Generator().manual_seed(a.seed)
    for page in a.pages:
        if Nk % page:
            continue
        kc, vc, table = paged_copy(k, v, page, cpu_gen)
        lens = torch.full((B,), Nk, dtype=torch.int32, device="cuda")
        paged[page] = (kc, vc, table, lens)
        calls[f"05_fa2_decode_paged{page}"] = (lambda t=paged[page]: attn_ladder.decode_paged(q, *t))
    calls["torch_cudnn"] = sdpa(SDPBackend.CUDNN_ATTENTION, q, k, v)
    calls["torch_flash"] = sdpa(SDPBackend.FLASH_ATTENTION, q, k, v)
    graphs, outs = {}, {}
    for name, call in calls.items():
        try:
            graphs[name], outs[name] = captured(call)
        except RuntimeError as e:  # a backend that refuses the shape
            print(f"[decode] skip {name} B={B} Nq={Nq} Nk={Nk}: {str(e).splitlines()[0]}", flush=True)
    names = list(graphs)
    warm_start = time.perf_counter()
    while time.perf_counter() - warm_start < WARM_SECONDS:
        for name in names:
            graphs[name].replay()
        torch.cuda.synchronize()
    per_round = {name: [] for name in names}
    for r in range(a.rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            per_round[name].append(time_graph(graphs[name], flush, a.repeats))
    ref = outs.get("torch_cudnn")
    kv_bytes = 2 * 2 * B * HKV * Nk * D
    model_bytes = kv_bytes + 2 * 2 * B * H * Nq * D
    flops = 4 * B * H * Nq * Nk * D
    times = {}
    for name in names:
        med = statistics.median(t[0] for t in per_round[name])
        times[name] = med
        err = peers.rel_diff(outs[name], ref) if ref is not None and name != "torch_cudnn" else None
        row = dict(common, rung=name, dtype="bf16", B=B, H=H, Hkv=HKV, Nq=Nq, Nk=Nk, d=D, causal=0,
                   time_ms_median=med, time_ms_min=min(t[1] for t in per_round[name]),
                   time_ms_max=max(t[2] for t in per_round[name]), tflops=flops / (med * 1e-3) / 1e12,
                   model_flops=flops, model_hbm_bytes=model_bytes, err_vs_prev=err,
                   prev_rung="torch_cudnn" if err is not None else None)
        if writer:
            writer.writerow([peers.fmt(row.get(c)) for c in peers.COLUMNS])
        if err is not None and err > 2e-2:
            print(f"[decode] WARNING {name} B={B} Nq={Nq} Nk={Nk}: O differs from cuDNN's by {err:.2e}", flush=True)
    summary.append((B, Nq, Nk, times, kv_bytes))
    del graphs, outs, calls, paged, q, k, v
    torch.cuda.empty_cache()


def summary_header(copy_gbps, pages):
    print(f"\nratios (> 1: ours faster / paged slower); device copy {copy_gbps:.0f} GB/s (read + written)")
    head = f"{'B':>3} {'Nq':>3} {'Nk':>7} {'ours us':>8} {'cuDNN/ours':>10} {'flash/ours':>10}"
    head += "".join(f" {f'paged{p}/contig':>15}" for p in pages) + f" {'KV TB/s':>8} {'% copy':>7}"
    print(head, flush=True)


def summary_line(entry, copy_gbps, pages):
    B, Nq, Nk, t, kv = entry
    ours = t.get("05_fa2_decode")
    if ours is None:
        return
    cell = lambda x: f"{x:.3f}" if x is not None else "-"  # noqa: E731
    line = f"{B:>3} {Nq:>3} {Nk:>7} {ours * 1e3:>8.1f}"
    line += f" {cell(t['torch_cudnn'] / ours if 'torch_cudnn' in t else None):>10}"
    line += f" {cell(t['torch_flash'] / ours if 'torch_flash' in t else None):>10}"
    for p in pages:
        pt = t.get(f"05_fa2_decode_paged{p}")
        line += f" {cell(pt / ours if pt else None):>15}"
    rate = kv / (ours * 1e-3) / 1e9
    line += f" {rate / 1e3:>8.2f} {100 * rate / copy_gbps:>6.1f}%"
    print(line, flush=True)


def main(argv=None):
    a = parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("decode_bench.py: no CUDA GPU visible to torch")
    flush = peers.L2Flush()
    copy_gbps = copy_ceiling(flush)
    common = {"gpu": peers.gpu_name(), "git_sha": peers.git_sha(), "ceiling_copy_gbps": copy_gbps}
    print(f"[decode] {common['gpu']}: device copy {copy_gbps:.0f} GB/s (read + written), "
          f"torch {torch.__version__}, operator backend {attn_ladder.ops.BACKEND}", flush=True)
    f, writer = peers.open_csv(a.csv) if a.csv else (None, None)
    summary = []  # one line per problem as it is measured (a timeout keeps the lines so far)
    summary_header(copy_gbps, a.pages)
    try:
        for Nq in a.nq:
            for B in a.B:
                for Nk in a.nk:
                    run_problem(a, flush, common, writer, B, Nq, Nk, summary)
                    summary_line(summary[-1], copy_gbps, a.pages)
                    if f:
                        f.flush()
    finally:
        if f:
            f.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
