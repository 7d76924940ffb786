"""pytest, CPU: context_parallel_attention's whole ring over gloo, with TorchBlocks (plain
PyTorch math) in place of the ladder's kernels.

Spawns 2 and 3 processes (a gloo group with a timeout). Each runs the ring forward and
backward on its shard of an fp64 problem and compares O, lse and dQ, dK, dV, gathered over
the ranks, with fp64 autograd through full attention on one process: causal (zigzag shards)
and not, odd N (not divisible by the ranks), GQA. Then the refusals: ranks that disagree on
the problem (head count, causal flag) or causal shards that are not zigzag_shard's raise the
same ValueError on every rank, before any transfer, within the test's time (never a hang).
Also the merge on torch tensors (ring_math.merge with xp=torch, as the ring calls it) in fp32
against softmax attention. Skips without torch (CI); test_context_parallel_merge.py checks
the same arithmetic there with numpy. The GPU version: tests/python/context_parallel_2gpu.py.
"""

import datetime
import math
import os
import pathlib
import socket
import sys
import time
import traceback

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "python"))
from attn_ladder import context_parallel as cp  # noqa: E402
from attn_ladder import ring_math  # noqa: E402


def reference(q, k, v, causal, w):
    """O, lse and the gradients of sum(O * w), by fp64 autograd through full attention."""
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    o, lse = cp.TorchBlocks().forward(q, k, v, causal, 1.0 / math.sqrt(q.shape[-1]))
    (o * w).sum().backward()
    return o.detach(), lse.detach(), q.grad, k.grad, v.grad


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(rank, world, port, job, out_dir):
    try:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=30))
        torch.manual_seed(0)
        message = job(rank, world)
        dist.destroy_process_group()
    except Exception:  # report, do not hang the parent
        message = "ERROR " + traceback.format_exc()
    (pathlib.Path(out_dir) / f"rank{rank}.txt").write_text(message)


def run(world, job, tmp_path):
    port = free_port()
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=worker, args=(r, world, port, job, str(tmp_path))) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
        if p.is_alive():
            p.kill()
            pytest.fail("a rank did not finish within 120 s (a hang)")
    return [(tmp_path / f"rank{r}.txt").read_text() for r in range(world)]


CASES = [  # (B, H, Hkv, N, d, causal)
    (1, 2, 2, 8, 8, True),
    (2, 4, 2, 13, 16, True),  # odd N, GQA
    (1, 4, 1, 11, 8, False),  # odd N, GQA 4
    (1, 2, 2, 40, 16, True),
]


def ring_job(rank, world):
    for B, H, Hkv, N, d, causal in CASES:
        g = torch.Generator().manual_seed(N * 7 + H)
        q = torch.randn(B, H, N, d, generator=g, dtype=torch.float64)
        k, v = (torch.randn(B, Hkv, N, d, generator=g, dtype=torch.float64) for _ in range(2))
        w = torch.randn(B, H, N, d, generator=g, dtype=torch.float64)
        o_ref, lse_ref, dq_ref, dk_ref, dv_ref = reference(q, k, v, causal, w)
        # causal: zigzag shards; non-causal: contiguous uneven shards (any sharding is allowed)
        if causal:
            shard = lambda t: cp.zigzag_shard(t, rank, world)  # noqa: E731
            gather = cp.zigzag_gather
        else:
            shard = lambda t: t.tensor_split(world, dim=2)[rank].contiguous()  # noqa: E731
            gather = lambda t: torch.cat(cp.gather_shards(t), dim=2)  # noqa: E731
        ql, kl, vl = (shard(t).requires_grad_() for t in (q, k, v))
        o, lse = cp.context_parallel_attention(ql, kl, vl, causal=causal, return_lse=True, blocks=cp.TorchBlocks())
        (o * shard(w)).sum().backward()
        got = [gather(t) for t in (o.detach(), lse[..., None])] + [gather(t.grad) for t in (ql, kl, vl)]
        want = [o_ref, lse_ref[..., None], dq_ref, dk_ref, dv_ref]
        for name, a, b in zip(["O", "lse", "dQ", "dK", "dV"], got, want):
            err = ((a - b).norm() / b.norm()).item()
            if not err < 1e-10:
                return f"FAIL {name} rel err {err:.3g} at {(B, H, Hkv, N, d, causal)}"
    return "OK"


@pytest.mark.parametrize("world", [2, 3])
def test_ring_matches_full_attention(world, tmp_path):
    results = run(world, ring_job, tmp_path)
    assert results == ["OK"] * world, results


def mismatch_job(rank, world):
    """Three bad problems; every rank must raise, and the same message."""
    messages = []
    N, d = 12, 8
    for case in ("heads", "causal", "not zigzag"):
        H = 4 if (case == "heads" and rank == 1) else 2
        causal = not (case == "causal" and rank == 1)
        q = torch.randn(1, H, N // world, d, dtype=torch.float64)
        k = v = torch.randn(1, 2, N // world, d, dtype=torch.float64)
        if case == "not zigzag":  # 12 tokens over 2 ranks as 5 + 7: not the zigzag lengths 6 + 6
            n = 5 if rank == 0 else 7
            q, k, v = (torch.randn(1, 2, n, d, dtype=torch.float64) for _ in range(3))
        try:
            cp.context_parallel_attention(q, k, v, causal=causal, blocks=cp.TorchBlocks())
            messages.append(f"{case}: no error")
        except ValueError as e:
            messages.append(f"{case}: {str(e).split(': ', 1)[1]}")  # without the "rank r of P" prefix
    return "\n".join(messages)


def test_mismatch_raises_on_every_rank(tmp_path):
    results = run(2, mismatch_job, tmp_path)
    assert results[0] == results[1], results
    lines = results[0].splitlines()
    assert len(lines) == 3 and not any("no error" in line or "ERROR" in line for line in lines), results
    assert "disagree on H" in lines[0] and "disagree on causal" in lines[1] and "zigzag_shard" in lines[2], lines


def absent_rank_job(rank, world):
    """Rank 1 never calls: rank 0's shape exchange fails at the group's timeout, not never."""
    group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=3))
    message = "skipped the call"
    if rank == 0:
        q = torch.randn(1, 2, 6, 8, dtype=torch.float64)
        start = time.monotonic()
        try:
            cp.context_parallel_attention(q, q, q, group=group, causal=True, blocks=cp.TorchBlocks())
            message = "no error"
        except RuntimeError as e:
            message = f"raised {type(e).__name__} after {time.monotonic() - start:.0f} s"
    dist.barrier()  # the world group (30 s): rank 1 waits here for rank 0
    return message


def test_absent_rank_times_out(tmp_path):
    results = run(2, absent_rank_job, tmp_path)
    assert results[1] == "skipped the call" and results[0].startswith("raised"), results
    assert float(results[0].split()[-2]) < 20, results


def test_torch_merge_in_fp32():
    g = torch.Generator().manual_seed(3)
    q, k, v = torch.randn(2, 3, 50, 16, generator=g) * 3, torch.randn(2, 3, 90, 16, generator=g), \
        torch.randn(2, 3, 90, 16, generator=g)
    blocks = cp.TorchBlocks()
    o, lse = blocks.forward(q, k, v, False, 0.25)
    o_m, l_m = blocks.forward(q, k[:, :, :30], v[:, :, :30], False, 0.25)
    o_b, l_b = blocks.forward(q, k[:, :, 30:], v[:, :, 30:], False, 0.25)
    o_m, l_m = ring_math.merge(o_m, l_m, o_b.to(torch.bfloat16), l_b, torch)  # a bf16 block, as the kernel's
    assert o_m.dtype == torch.float32
    assert ((o_m - o).norm() / o.norm()).item() < 1e-2 and (l_m - lse).abs().max().item() < 1e-5


def test_zigzag_shard_roundtrip():
    x = torch.arange(2 * 3 * 23).reshape(2, 3, 23, 1)
    for world in (1, 2, 3, 5):
        shards = [cp.zigzag_shard(x, r, world) for r in range(world)]
        sizes = ring_math.zigzag_chunks(23, world)
        assert [s.shape[2] for s in shards] == [sizes[r] + sizes[2 * world - 1 - r] for r in range(world)]
        assert torch.equal(cp.zigzag_unshard(shards), x)
