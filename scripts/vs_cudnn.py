#!/usr/bin/env python3
"""A rung against PyTorch SDPA's cuDNN backend, timed call by call in turns in one process.

The ladder's tables time the rungs (attn_bench) and the peers (peers.py) in two sweeps, one
after the other: each number is fair, but a ratio between them also carries whatever the
two sweeps did differently (the clock under the power cap after different preceding work).
Here, per problem, the rung (attn_ladder.run, the plain C API call) and cuDNN are timed in
`--rounds` rounds, call by call in alternation (time_interleaved: a joint 0.3 s warm-up, then
per turn an L2 flush and an event-timed call of each; the median of each), which of the two
goes first swapped every round. Interleaved calls share one window of the GPU's clock under
the power cap; timed as two blocks, one after the other, each block inherits what ran before
it, and with several rungs the one that follows a cooler kernel (rung 05's mma.sync) is
favoured. With several rungs, each rung has its own cuDNN times, interleaved with its own.
Reported: the median over rounds of each, their ratio (> 1: the rung is faster), and the
lowest and highest ratio of a single round. Before timing, the rung's O is compared with
cuDNN's.

--backward: the same for the backward pass alone, given O and lse: the rung's backward
(attn_ladder's run_backward on its own forward's O and lse) against
torch.autograd.grad through one cuDNN forward (peers.py --backward's call); the column
o_diff then holds the largest relative difference of dQ, dK, dV from cuDNN's. The printed
line adds the SM clock NVML saw after the rung's last round (MHz, where torch can read it):
a pair that draws more power runs at a lower clock under the power cap.

    scripts/vs_cudnn.py --rung 06d_fa3 --d 64,128 --n 4096,8192,16384 --causal both \\
                        --csv results/<gpu>/vs_cudnn.csv
    scripts/vs_cudnn.py --backward --rung 06d_fa3,05_fa2_reordered --d 64,128 \\
                        --n 2048,4096,8192,16384 --csv results/<gpu>/vs_cudnn.csv --append

Problems: the papers' sweep (B*N = 16384, H = 2048/d), bf16.
"""

import argparse
import csv
import pathlib
import statistics
import sys
import time

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import peers  # noqa: E402  (event_time, warm-up and limits, attention_call, L2Flush, gpu_name, git_sha)

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "python"))
import attn_ladder  # noqa: E402

COLUMNS = ["gpu", "rung", "peer", "dtype", "B", "H", "N", "d", "causal", "rounds", "rung_ms", "peer_ms", "speedup",
           "speedup_min", "speedup_max", "o_diff", "git_sha"]
O_DIFF_BOUND = 2e-2  # two bf16 kernels, each within 1e-2 of fp64 (common/tolerance.h)


def summarize(rung_ms, peer_ms):
    """Medians over rounds, their ratio (peer / rung: > 1 when the rung is faster), and the
    lowest and highest ratio of one round."""
    if not rung_ms or len(rung_ms) != len(peer_ms):
        raise ValueError("one rung time and one peer time per round")
    per_round = [p / r for r, p in zip(rung_ms, peer_ms)]
    r, p = statistics.median(rung_ms), statistics.median(peer_ms)
    return r, p, p / r, min(per_round), max(per_round)


def time_interleaved(calls, repeats, flush, timer=None, sync=None):
    """Each call's median time (ms) over `repeats` turns; a turn runs every call once, in order,
    each after an L2 flush. Warm-up as peers.time_call's, every call in each of its turns. Stops
    once the timed calls pass peers.MAX_SECONDS per call and each has 3 times."""
    timer, sync = timer or peers.event_time, sync or torch.cuda.synchronize
    warm_start = time.perf_counter()
    for _ in range(peers.WARMUP):
        for call in calls:
            call()
    sync()
    while time.perf_counter() - warm_start < peers.WARM_SECONDS:
        for call in calls:
            call()
        sync()
    times = [[] for _ in calls]
    for _ in range(repeats):
        for call, own in zip(calls, times):
            flush()
            own.append(timer(call))
        if sum(map(sum, times)) * 1e-3 > peers.MAX_SECONDS * len(calls) and len(times[0]) >= 3:
            break
    return [statistics.median(own) for own in times]


def peer_forward(q, k, v, dout, causal):
    """cuDNN's forward call and its output, what each rung's O is checked against."""
    cudnn = peers.attention_call(peers.SDPBackend.CUDNN_ATTENTION, q, k, v, causal, None)
    with torch.no_grad():
        return cudnn, [cudnn()]


def rung_forward(rung, q, k, v, dout, causal, want):
    """The rung's forward call and the relative difference of its O from cuDNN's (the bound checked)."""
    def ours():
        with torch.no_grad():
            return attn_ladder.run(rung, q, k, v, causal=bool(causal))

    got = [call_or_exit(ours, rung, q, causal)]
    return ours, check_diff(got, want, rung, q, causal)


def peer_backward(q, k, v, dout, causal):
    """cuDNN's backward (torch.autograd.grad through one cuDNN forward) and its dQ, dK, dV."""
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    o_ref = peers.attention_call(peers.SDPBackend.CUDNN_ATTENTION, *leaves, causal, None)()

    def cudnn():
        return torch.autograd.grad(o_ref, leaves, dout, retain_graph=True)

    return cudnn, list(cudnn())


def rung_backward(rung, q, k, v, dout, causal, want):
    """The rung's backward call, given its own forward's O and lse, and the largest relative
    difference of its dQ, dK, dV from cuDNN's."""
    o, lse = call_or_exit(lambda: attn_ladder.run(rung, q, k, v, causal=bool(causal), return_lse=True), rung, q, causal)

    def ours():
        return attn_ladder._capi.run_backward(rung, q, k, v, o, lse, dout, causal=bool(causal))

    return ours, check_diff(call_or_exit(ours, rung, q, causal), want, rung, q, causal)


def call_or_exit(call, rung, q, causal):
    try:
        return call()
    except (attn_ladder.AttnLadderError, ValueError) as e:  # a shape the rung refuses
        sys.exit(f"vs_cudnn.py: {rung} refuses d={q.shape[3]} N={q.shape[2]} causal={causal}: {e}")


def check_diff(got, want, rung, q, causal):
    """The largest relative difference of the rung's outputs from cuDNN's; exits past the bound."""
    diff = max(peers.rel_diff(x, ref) for x, ref in zip(got, want))
    if not diff <= O_DIFF_BOUND:
        sys.exit(f"vs_cudnn.py: {rung} and cuDNN disagree at d={q.shape[3]} N={q.shape[2]} causal={causal}: "
                 f"relative difference {diff:.2e} > {O_DIFF_BOUND}")
    return diff


def sm_clock_mhz():
    """The SM clock NVML reports now (MHz), None where torch cannot read it (no pynvml)."""
    try:
        return torch.cuda.clock_rate()
    except Exception:  # noqa: BLE001  (pynvml missing or NVML unavailable: the column is optional)
        return None


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rung", default="06d_fa3", help="one rung or several, comma-separated (all timed in turns)")
    ap.add_argument("--d", default="64,128")
    ap.add_argument("--n", default="4096,8192,16384")
    ap.add_argument("--causal", choices=["0", "1", "both"], default="both")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--backward", action="store_true", help="time the backward passes (rungs <name>_bwd)")
    ap.add_argument("--csv", type=pathlib.Path)
    ap.add_argument("--append", action="store_true", help="add rows to --csv (the header only if it is new)")
    a = ap.parse_args(argv)
    if a.rounds < 1:
        sys.exit("vs_cudnn.py: --rounds must be at least 1")
    if not torch.cuda.is_available():
        sys.exit("vs_cudnn.py: no CUDA GPU visible to torch")
    if not attn_ladder.library_path().is_file():
        sys.exit(f"vs_cudnn.py: libattn_ladder.so not built ({attn_ladder.library_path()})")
    flush = peers.L2Flush()
    gpu, sha = peers.gpu_name(), peers.git_sha()
    causals = [0, 1] if a.causal == "both" else [int(a.causal)]
    writer = None
    if a.csv:
        a.csv.parent.mkdir(parents=True, exist_ok=True)
        new = not (a.append and a.csv.is_file() and a.csv.stat().st_size > 0)
        out = open(a.csv, "w" if new else "a", newline="")
        writer = csv.DictWriter(out, fieldnames=COLUMNS)
        if new:
            writer.writeheader()
    what = "backward" if a.backward else "forward"
    rungs = a.rung.split(",")
    peer_setup, rung_setup = (peer_backward, rung_backward) if a.backward else (peer_forward, rung_forward)
    print(f"{', '.join(rungs)} against torch_cudnn ({what}), {a.rounds} rounds each, in turns, on {gpu}")
    print(f"{'rung':>18} {'d':>4} {'N':>6} {'causal':>6} {'rung ms':>9} {'cuDNN ms':>9} {'speedup':>8} {'rounds':>13}")
    for d in map(int, a.d.split(",")):
        for n in map(int, a.n.split(",")):
            B, H = max(1, peers.PAPER_TOKENS // n), max(1, peers.PAPER_HIDDEN // d)
            q, k, v = (torch.randn(B, H, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            dout = torch.randn_like(q) if a.backward else None
            for causal in causals:
                peer, want = peer_setup(q, k, v, dout, causal)  # once per problem, shared by the rungs
                calls, diffs = {}, {}
                for rung in rungs:
                    calls[rung], diffs[rung] = rung_setup(rung, q, k, v, dout, causal, want)
                del want
                times = {rung: ([], []) for rung in rungs}  # the rung's, its own cuDNN's
                mhz = {rung: None for rung in rungs}
                for i in range(a.rounds):
                    for rung in rungs:
                        pair = (calls[rung], peer) if i % 2 == 0 else (peer, calls[rung])
                        got = time_interleaved(pair, a.repeats, flush)
                        ours, theirs = got if i % 2 == 0 else got[::-1]
                        times[rung][0].append(ours)
                        times[rung][1].append(theirs)
                        mhz[rung] = sm_clock_mhz()
                del calls, peer
                suffix = "_bwd" if a.backward else ""
                for rung in rungs:
                    r, p, s, lo, hi = summarize(*times[rung])
                    row = {"gpu": gpu, "rung": rung + suffix, "peer": "torch_cudnn" + suffix, "dtype": "bf16", "B": B,
                           "H": H, "N": n, "d": d, "causal": causal, "rounds": a.rounds, "rung_ms": f"{r:.4f}",
                           "peer_ms": f"{p:.4f}", "speedup": f"{s:.3f}", "speedup_min": f"{lo:.3f}",
                           "speedup_max": f"{hi:.3f}", "o_diff": f"{diffs[rung]:.2e}", "git_sha": sha}
                    if writer:
                        writer.writerow(row)
                        out.flush()
                    clocks = f"  SM MHz {mhz[rung]}" if mhz[rung] is not None else ""
                    print(f"{rung:>18} {d:>4} {n:>6} {causal:>6} {r:>9.3f} {p:>9.3f} {s:>8.3f} {lo:>6.3f}-{hi:.3f}{clocks}",
                          flush=True)
            del q, k, v, dout
            torch.cuda.empty_cache()
    if writer:
        out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
