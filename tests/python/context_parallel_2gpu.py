"""Context-parallel attention on 2+ GPUs over NCCL: run with
    torchrun --nproc-per-node 2 tests/python/context_parallel_2gpu.py
or plainly (CTest: python_cp_2gpu), which starts torchrun on 2 GPUs itself, or exits 77 (skipped)
with the reason when torch, 2 GPUs or the library are missing.

Each case: one full problem made from one seed on every rank; the ring (context_parallel_attention
with the ladder's kernels: 06d_fa3's forward and backward on Hopper, else 05's; one case also
with 05's backward on Hopper) on zigzag shards
(causal) or uneven contiguous shards (not), forward and backward of sum(O * W); its O, lse, dQ,
dK, dV gathered and compared with (a) the same kernels on one GPU over the full sequence and
(b) fp64 math (TorchBlocks): odd N (not divisible by the ranks), causal and not, GQA, bf16 and
fp16, within the forward's bounds (common/tolerance.h). Then the refusals: ranks that disagree
on the problem raise the same ValueError on every rank (and the group still works after);
and torch.compile around the call. Prints one line per check and "context_parallel_2gpu: PASS"
on rank 0; exits 1 on any failure (every rank).
"""

import datetime
import math
import os
import pathlib
import sys

SKIP = 77


def launch_or_skip():
    """Not under torchrun: start it on 2 GPUs (this file again), or exit SKIP with the reason."""
    try:
        import torch
    except ImportError:
        print("context_parallel_2gpu: skipped: torch is not installed")
        sys.exit(SKIP)
    if torch.cuda.device_count() < 2:
        print(f"context_parallel_2gpu: skipped: needs 2 CUDA GPUs, found {torch.cuda.device_count()}")
        sys.exit(SKIP)
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "python"))
    import attn_ladder

    if not attn_ladder.library_path().is_file():
        print(f"context_parallel_2gpu: skipped: {attn_ladder.library_path()} is not built")
        sys.exit(SKIP)
    os.execv(sys.executable, [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                              __file__])


if __name__ == "__main__" and "LOCAL_RANK" not in os.environ:
    launch_or_skip()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "python"))
import attn_ladder as al  # noqa: E402
from attn_ladder import context_parallel as cp  # noqa: E402

BOUND = {torch.bfloat16: 1e-2, torch.float16: 3e-3}  # common/tolerance.h, the forward's
CASES = [  # (B, H, Hkv, N, d, causal, dtype)
    (1, 4, 4, 4097, 128, True, torch.bfloat16),
    (2, 8, 2, 1001, 64, True, torch.bfloat16),  # GQA 4
    (1, 4, 1, 3001, 128, False, torch.float16),  # GQA 4, uneven contiguous shards
    (1, 2, 2, 7, 128, True, torch.bfloat16),  # 7 tokens over 4 chunks: 2, 2, 2, 1
    (1, 8, 8, 8192, 128, True, torch.bfloat16),
    (1, 4, 2, 2049, 128, True, torch.bfloat16, "05_fa2_reordered"),  # 05's backward, on Hopper too
]


def rel(a, b):
    b = b.double()
    return ((a.double() - b).norm() / b.norm()).item()


def main():
    local = int(os.environ.get("LOCAL_RANK", 0))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", timeout=datetime.timedelta(seconds=60), device_id=torch.device("cuda", local))
    rank, world = dist.get_rank(), dist.get_world_size()
    failures = []

    def report(line, ok):
        if not ok:
            failures.append(line)
        if rank == 0:
            print(("ok    " if ok else "FAIL  ") + line, flush=True)

    for B, H, Hkv, N, d, causal, dtype, *backward_rung in CASES:
        blocks = cp.LadderBlocks(backward_rung=(backward_rung or [None])[0])
        g = torch.Generator(device="cuda").manual_seed(N * 31 + H)
        q = torch.randn(B, H, N, d, generator=g, device="cuda").to(dtype)
        k, v = (torch.randn(B, Hkv, N, d, generator=g, device="cuda").to(dtype) for _ in range(2))
        w = torch.randn(B, H, N, d, generator=g, device="cuda").to(dtype)
        scale = 1.0 / math.sqrt(d)
        # one GPU, the same kernels over the whole sequence
        o1, lse1 = blocks.forward(q, k, v, causal, scale)
        grads1 = blocks.backward(q, k, v, o1, lse1, w, causal, scale)
        # fp64
        ref = cp.TorchBlocks()
        q64, k64, v64, w64 = (t.double() for t in (q, k, v, w))
        o64, lse64 = ref.forward(q64, k64, v64, causal, scale)
        grads64 = ref.backward(q64, k64, v64, o64, lse64, w64, causal, scale)
        # the ring
        if causal:
            shard, gather = (lambda t: cp.zigzag_shard(t, rank, world)), cp.zigzag_gather
        else:
            shard = lambda t: t.tensor_split(world, dim=2)[rank].contiguous()  # noqa: E731
            gather = lambda t: torch.cat(cp.gather_shards(t), dim=2)  # noqa: E731
        ql, kl, vl = (shard(t).requires_grad_() for t in (q, k, v))
        o, lse = cp.context_parallel_attention(ql, kl, vl, causal=causal, return_lse=True, blocks=blocks)
        o.backward(shard(w))
        got = [gather(o.detach()), gather(lse[..., None])[..., 0]] + [gather(t.grad) for t in (ql, kl, vl)]
        name = (f"B={B} H={H} Hkv={Hkv} N={N} d={d} causal={causal} {str(dtype)[6:]} "
                f"fwd={blocks.pick_forward(q)} bwd={blocks.pick_backward(q)}")
        ones, exacts = [o1, lse1, *grads1], [o64, lse64, *grads64]
        for what, a, one, exact in zip(["O", "lse", "dQ", "dK", "dV"], got, ones, exacts):
            e64, e1, e1_64 = rel(a, exact), rel(a, one), rel(one, exact)
            ok = e64 <= BOUND[dtype] and e1 <= BOUND[dtype]
            report(f"{name} {what}: ring vs fp64 {e64:.2e}, vs one GPU {e1:.2e} (one GPU vs fp64 {e1_64:.2e})", ok)
        del q, k, v, w, q64, k64, v64, w64, o64, lse64, grads64
        torch.cuda.empty_cache()

    # Refusals: every rank raises the same error, before any transfer; the group still works.
    n = 64
    for case in ("heads", "causal", "lengths", "dtype"):
        H = 4 if case == "heads" and rank == 1 else 2
        causal = not (case == "causal" and rank == 1)
        length = n + (rank if case == "lengths" else 0)  # causal: not zigzag_shard's lengths
        dtype = torch.float16 if case == "dtype" and rank == 1 else torch.bfloat16
        q = torch.randn(1, H, length, 64, device="cuda", dtype=dtype)
        k = v = torch.randn(1, 2, length, 64, device="cuda", dtype=dtype)
        try:
            cp.context_parallel_attention(q, k, v, causal=causal)
            message = "no error"
        except ValueError as e:
            message = str(e).split(": ", 1)[1]
        messages = [None] * world
        dist.all_gather_object(messages, message)
        ok = message != "no error" and len(set(messages)) == 1
        report(f"mismatch '{case}' raises on every rank: {message}", ok)

    # torch.compile around the call: the call runs eagerly inside the compiled function.
    g = torch.Generator(device="cuda").manual_seed(5)
    q, k, v = (torch.randn(1, 4, 2 * 1024, 128, generator=g, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    ql, kl, vl = (cp.zigzag_shard(t, rank, world) for t in (q, k, v))

    def layer(q, k, v):
        return cp.context_parallel_attention(q * 1.0, k, v, causal=True).float().square().sum()

    eager = layer(ql, kl, vl)
    compiled = torch.compile(layer)(ql, kl, vl)
    report(f"torch.compile(layer) = eager: {compiled.item():.6g} vs {eager.item():.6g}",
           abs(compiled.item() - eager.item()) <= 1e-3 * abs(eager.item()))

    verdict = torch.tensor([len(failures)], device="cuda")
    dist.all_reduce(verdict)
    if rank == 0:
        print("context_parallel_2gpu: " + ("PASS" if verdict.item() == 0 else f"FAIL ({verdict.item()} checks)"),
              flush=True)
    dist.destroy_process_group()
    sys.exit(0 if verdict.item() == 0 else 1)


if __name__ == "__main__":
    main()
