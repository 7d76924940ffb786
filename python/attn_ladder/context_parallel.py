"""Context-parallel (ring) attention over torch.distributed: the ⊕ merge across GPUs.

    import torch.distributed as dist, attn_ladder as al
    dist.init_process_group("nccl", timeout=datetime.timedelta(seconds=60))
    q = al.zigzag_shard(q_full, dist.get_rank(), dist.get_world_size())   # and k, v
    o = al.context_parallel_attention(q, k, v, causal=True)              # this rank's rows
    o_full = al.zigzag_gather(o)                                         # (tests, not training)

The sequence of N tokens is sharded over the P ranks of a process group. Each rank keeps its
queries; the K/V shards travel around the ring (rank r sends to r + 1, receives from r − 1)
with dist.batch_isend_irecv on a communication stream while the current block runs on the
ladder's kernel; every block's (O, lse) is merged into the running result with rung 03's ⊕
(ring_math.merge, in fp32). The lesson: 05_fa2_reordered/context_parallel.md.

Causal: zigzag sharding. The sequence is cut into 2P chunks (torch.tensor_split's sizes:
the first N mod 2P chunks one token longer); rank r holds chunks r and 2P−1−r, concatenated.
With the K/V of rank j on rank r, every block is one of three kinds:

    j == r   the rank's own K/V: ordinary causal attention on the local rows (Nq = Nk, so the
             kernel's bottom-right alignment is the top-left one)
    j <  r   all local queries against chunk j only (chunk 2P−1−j lies in the future): full
    j >  r   local chunk 2P−1−r only against both chunks of j (chunk r sees none): full
    (and the quarter that remains, chunk r against chunk 2P−1−j, is skipped: all future)

so each step costs every rank the same half of a (local × local) block: balanced. Non-causal:
any sharding (shards of any lengths ≥ 1); every block is full.

What is allowed: any N ≥ 2P for causal, provided the shards are zigzag_shard's (uneven by
at most one token per chunk); any shard lengths ≥ 1 for non-causal. Before any transfer the
ranks all_gather one descriptor each (shapes, dtype, flags, scale) and all raise the same
ValueError if they disagree or the lengths break the rule: never a hang, never wrong numbers.
Create the process group with a timeout so that a rank that never calls fails the others.

Backward: autograd.Function. P is recomputed block by block by the rung's backward op from the
MERGED O and lse (the block's share of the global softmax); dQ accumulates locally in fp32;
dK, dV accumulate in fp32 in a buffer that travels the ring with the block and ends, after P
hops, on the rank that owns the block.

torch.compile: context_parallel_attention is excluded from tracing (torch.compiler.disable):
a compiled model runs it eagerly between compiled regions (fullgraph=True refuses it). The
ring's stream switches and P2P handles are outside what Dynamo traces.
"""

import contextlib
import math
from dataclasses import dataclass

import torch
import torch.distributed as dist

from . import ring_math
from .ring_math import zigzag_chunks

_DTYPE_CODES = {torch.bfloat16: 0, torch.float16: 1, torch.float32: 2, torch.float64: 3}
FORWARD_RUNG = "06d_fa3"  # forward with lse and backward (06q's kernel) on sm_90; FALLBACK_RUNG elsewhere
FALLBACK_RUNG = "05_fa2_reordered"


# ---------------------------------------------------------------- zigzag sharding


def zigzag_shard(x, rank, world, dim=2):
    """Rank `rank`'s shard of the full tensor x: chunks rank and 2·world−1−rank along dim."""
    chunks = x.tensor_split(2 * world, dim=dim)
    return torch.cat([chunks[rank], chunks[2 * world - 1 - rank]], dim=dim).contiguous()


def zigzag_unshard(shards, dim=2):
    """The full tensor from every rank's zigzag shard (a list in rank order)."""
    world = len(shards)
    N = sum(s.shape[dim] for s in shards)
    sizes = zigzag_chunks(N, world)
    chunks = [None] * (2 * world)
    for r, s in enumerate(shards):
        chunks[r], chunks[2 * world - 1 - r] = s.split([sizes[r], sizes[2 * world - 1 - r]], dim=dim)
    return torch.cat(chunks, dim=dim)


def gather_shards(x, group=None, dim=2):
    """Every rank's x (lengths along dim may differ) on every rank, in rank order (all_gather
    of padded copies). For tests and checks, not for training."""
    world = dist.get_world_size(group)
    length = torch.tensor([x.shape[dim]], device=x.device)
    lengths = [torch.zeros_like(length) for _ in range(world)]
    dist.all_gather(lengths, length, group=group)
    lengths = [int(n) for n in lengths]
    pad = [0] * (2 * (x.dim() - 1 - dim % x.dim())) + [0, max(lengths) - x.shape[dim]]
    padded = torch.nn.functional.pad(x, pad).contiguous()
    out = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(out, padded, group=group)
    return [t.narrow(dim, 0, n) for t, n in zip(out, lengths)]


def zigzag_gather(x, group=None, dim=2):
    """The full tensor from this rank's zigzag shard, on every rank."""
    return zigzag_unshard(gather_shards(x, group, dim), dim)


# ---------------------------------------------------------------- block kernels


class LadderBlocks:
    """One block of the ring on the ladder's kernels. forward_rung (default: 06d_fa3, or
    05_fa2_reordered where 06d cannot run: no sm_90, or a head dim it lacks) with lse;
    backward_rung's backward op (default: 06d_fa3's, the last backward step's kernel, where it
    has one for this head dim on sm_90; else 05_fa2_reordered's). Either may be named explicitly (any
    rung with a backward for the backward: has_backward)."""

    def __init__(self, forward_rung=None, backward_rung=None):
        from . import ops  # loads the library: only when the ladder's kernels are asked for

        self._ops = ops
        self.forward_rung = forward_rung
        self.backward_rung = backward_rung

    @staticmethod
    def _hopper_rung_fits(q, backward):
        from . import _capi

        if FORWARD_RUNG not in _capi.rungs() or torch.cuda.get_device_capability(q.device)[0] != 9:
            return False
        dims = _capi.backward_head_dims(FORWARD_RUNG) if backward else _capi.rung_info(FORWARD_RUNG)["head_dims"]
        return q.shape[-1] in dims

    def pick_forward(self, q):
        if self.forward_rung is not None:
            return self.forward_rung
        return FORWARD_RUNG if self._hopper_rung_fits(q, backward=False) else FALLBACK_RUNG

    def pick_backward(self, q):
        if self.backward_rung is not None:
            return self.backward_rung
        return FORWARD_RUNG if self._hopper_rung_fits(q, backward=True) else FALLBACK_RUNG

    def forward(self, q, k, v, causal, scale):
        return self._ops._attention(q, k, v, self.pick_forward(q), bool(causal), float(scale), False)

    def backward(self, q, k, v, o, lse, dout, causal, scale):
        return self._ops._attention_backward(q, k, v, o, lse, dout, self.pick_backward(q), bool(causal),
                                             float(scale))


class TorchBlocks:
    """The same two calls in plain PyTorch math (fp32, or fp64 on fp64 inputs), on any device:
    the reference the ring is tested with on CPU (gloo), and an fp64 check on GPU. Causal is
    bottom-right aligned, as the ladder's."""

    @staticmethod
    def _scores(q, k, causal, scale):
        acc = torch.float64 if q.dtype == torch.float64 else torch.float32
        group = q.shape[1] // k.shape[1]
        kk = k.to(acc).repeat_interleave(group, dim=1)
        s = (q.to(acc) @ kk.transpose(-1, -2)) * scale
        if causal:
            Nq, Nk = q.shape[2], k.shape[2]
            i = torch.arange(Nq, device=q.device)[:, None]
            j = torch.arange(Nk, device=q.device)[None, :]
            s = s.masked_fill(j > i + (Nk - Nq), -math.inf)
        return s, kk, group

    def forward(self, q, k, v, causal, scale):
        s, _, group = self._scores(q, k, causal, scale)
        lse = torch.logsumexp(s, dim=-1)
        p = torch.exp(s - lse.where(lse.isfinite(), 0.0)[..., None])
        o = p @ v.to(s.dtype).repeat_interleave(group, dim=1)
        return o.to(q.dtype), lse.to(torch.float64 if q.dtype == torch.float64 else torch.float32)

    def backward(self, q, k, v, o, lse, dout, causal, scale):
        # P from the given lse (the merged one in the ring), then FA2's Algorithm 2 in matrices.
        s, kk, group = self._scores(q, k, causal, scale)
        acc = s.dtype
        p = torch.exp(s - lse.to(acc).where(lse.isfinite(), 0.0)[..., None])
        vv = v.to(acc).repeat_interleave(group, dim=1)
        do = dout.to(acc)
        dv = p.transpose(-1, -2) @ do
        dp = do @ vv.transpose(-1, -2)
        D = (do * o.to(acc)).sum(-1, keepdim=True)
        ds = p * (dp - D)
        dq = (ds @ kk) * scale
        dk = (ds.transpose(-1, -2) @ q.to(acc)) * scale

        def fold(t):  # the group's query heads onto their K/V head
            B, H, N, d = t.shape
            return t.view(B, H // group, group, N, d).sum(2)

        return dq.to(q.dtype), fold(dk).to(k.dtype), fold(dv).to(v.dtype)


# ---------------------------------------------------------------- the plan: who holds what


@dataclass
class _Plan:
    rank: int  # in the group
    world: int
    send_to: int  # global ranks of the ring's neighbours
    recv_from: int
    lengths: list  # every rank's local sequence length
    heads: list  # every rank's first-chunk length (zigzag; causal only)
    causal: bool

    def block(self, step):
        """(j, kind) of the K/V block this rank holds at `step` (ring_math.ring_block)."""
        return ring_math.ring_block(self.rank, self.world, step, self.causal)


def _descriptor(q, k, v, causal, scale):
    """This rank's problem as int64s: every rank must agree on all but the local length."""
    bad = 0
    shapes = []
    for t in (q, k, v):
        ok = isinstance(t, torch.Tensor) and t.dim() == 4
        bad |= not ok
        shapes += list(t.shape) if ok else [-1] * 4
    dtypes = [_DTYPE_CODES.get(t.dtype, -1) if isinstance(t, torch.Tensor) else -1 for t in (q, k, v)]
    scale_bits = torch.tensor([float(scale)], dtype=torch.float64).view(torch.int64).item()
    return shapes + dtypes + [int(bool(causal)), scale_bits, int(bad)]


_FIELDS = ["B", "H", "Nq", "d", "Bk", "Hkv", "Nk", "dk", "Bv", "Hv", "Nv", "dv", "q dtype", "k dtype", "v dtype",
           "causal", "scale", "bad"]


def _check_agreement(rows, causal):
    """The reason the gathered descriptors (one per rank) cannot run, or None. Every rank
    computes this from the same rows, so every rank raises the same error."""
    world = len(rows)
    for r, row in enumerate(rows):
        if row[-1]:
            return f"rank {r}: q, k, v must be 4-D tensors [B, H, N, d]"
        if -1 in row[12:15]:
            return f"rank {r}: dtype must be one of {list(_DTYPE_CODES)}"
    agree = [i for i in range(len(_FIELDS) - 1) if i not in (2, 6, 10)]  # all but the local lengths
    for i in agree:
        values = [row[i] for row in rows]
        if len(set(values)) > 1:
            return f"ranks disagree on {_FIELDS[i]}: {values} (rank order)"
    B, H, _, d, _, Hkv, _, dk, _, Hv, _, dv = rows[0][:12]
    if (B, d) != (rows[0][4], dk) or (B, d) != (rows[0][8], dv) or Hkv != Hv:
        return f"q, k, v shapes do not match: q {rows[0][0:4]}, k {rows[0][4:8]}, v {rows[0][8:12]} (rank 0)"
    if H % Hkv:
        return f"k/v heads (Hkv={Hkv}) must divide q heads (H={H})"
    if len(set(rows[0][12:15])) > 1:
        return "q, k, v must share one dtype"
    for r, row in enumerate(rows):
        if not row[2] == row[6] == row[10]:
            return f"rank {r}: q, k, v shards must have one length, got {row[2]}, {row[6]}, {row[10]}"
        if row[2] < 1:
            return f"rank {r}: empty shard (every rank needs at least one token)"
    if causal:
        lengths = [row[2] for row in rows]
        N = sum(lengths)
        if N < 2 * world:
            return (f"causal context parallelism needs N >= 2·ranks = {2 * world} (one token per zigzag chunk), "
                    f"got N = {N}")
        sizes = zigzag_chunks(N, world)
        want = [sizes[r] + sizes[2 * world - 1 - r] for r in range(world)]
        if lengths != want:
            return (f"causal shards must be zigzag_shard's: N = {N} over {world} ranks gives lengths {want}, "
                    f"got {lengths}")
    return None


def _plan(q, k, v, group, causal, scale):
    """all_gather every rank's descriptor, raise on every rank if they disagree, else the plan."""
    group = group if group is not None else dist.group.WORLD
    world = dist.get_world_size(group)
    rank = dist.get_rank(group)
    mine = torch.tensor(_descriptor(q, k, v, causal, scale), dtype=torch.int64)
    device = q.device if isinstance(q, torch.Tensor) and q.device.type == "cuda" else torch.device("cpu")
    if dist.get_backend(group) == "nccl" and device.type != "cuda":
        device = torch.device("cuda", torch.cuda.current_device())
    mine = mine.to(device)
    rows = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(rows, mine, group=group)
    rows = [row.tolist() for row in rows]
    why = _check_agreement(rows, causal)
    if why:
        raise ValueError(f"context_parallel_attention (rank {rank} of {world}): {why}")
    lengths = [row[2] for row in rows]
    sizes = zigzag_chunks(sum(lengths), world)
    return _Plan(rank, world, dist.get_global_rank(group, (rank + 1) % world),
                 dist.get_global_rank(group, (rank - 1) % world), lengths, sizes[:world], bool(causal))


# ---------------------------------------------------------------- the ring


class _Ring:
    """Transfers around the ring on a communication stream (CUDA) or inline (CPU, gloo).
    transfers=False keeps every buffer in place and hands out an equally sized tensor instead
    (the compute-only timing of the same blocks; numbers meaningless)."""

    def __init__(self, plan, group, device, transfers=True):
        self.plan, self.group, self.transfers = plan, group, transfers
        self.cuda = device.type == "cuda"
        self.comm = torch.cuda.Stream(device) if self.cuda else None
        self.pending = []  # (requests, sent tensor) not waited on yet

    def pass_on(self, send, recv_shape, dtype):
        """Send `send` to the next rank, receive a recv_shape tensor from the previous one;
        returns a handle for wait()."""
        recv = torch.empty(recv_shape, dtype=dtype, device=send.device)
        if not self.transfers:
            return None, send if tuple(send.shape) == tuple(recv_shape) else recv
        if self.cuda:
            self.comm.wait_stream(torch.cuda.current_stream(send.device))  # `send` is written
        ctx = torch.cuda.stream(self.comm) if self.cuda else contextlib.nullcontext()
        with ctx:
            reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, send, self.plan.send_to, self.group),
                                           dist.P2POp(dist.irecv, recv, self.plan.recv_from, self.group)])
        self.pending.append((reqs, send))  # `send` kept alive until its request is waited on
        return reqs, recv

    def wait(self, handle):
        """The received tensor, with the current stream ordered after its transfer (NCCL: the
        stream waits; gloo: the call blocks). Each request is waited on once (gloo's wait on a
        finished send waits for another)."""
        reqs, recv = handle
        if reqs is not None:
            for req in reqs:
                req.wait()
            self.pending = [(r, t) for r, t in self.pending if r is not reqs]
        return recv

    def finish(self):
        for reqs, _ in self.pending:
            for req in reqs:
                req.wait()
        self.pending.clear()


def _kv_shape(k, length):
    B, Hkv, _, d = k.shape
    return (2, B, Hkv, length, d)


def _block_kv(kv, plan, j, kind):
    """(K_j, V_j) as the kernel takes them: contiguous; j's first chunk only for "front"."""
    if kind == "front":
        n = plan.heads[j]
        return kv[0, :, :, :n].contiguous(), kv[1, :, :, :n].contiguous()
    return kv[0], kv[1]


def ring_forward(q, k, v, plan, group, blocks, scale, transfers=True):
    """O (q's dtype) and lse (fp32 [B, H, Nq]) of this rank's queries against every rank's K/V."""
    ring = _Ring(plan, group, q.device, transfers)
    kv = torch.stack([k, v]) if plan.world > 1 else None
    split = plan.heads[plan.rank]
    q_back = q[:, :, split:].contiguous() if plan.causal and plan.world > 1 else None
    out = lse = None
    for step in range(plan.world):
        j, kind = plan.block(step)
        if step + 1 < plan.world:
            handle = ring.pass_on(kv, _kv_shape(k, plan.lengths[(j - 1) % plan.world]), k.dtype)
        if kind == "own":
            o_blk, lse_blk = blocks.forward(q, k, v, plan.causal, scale)
            out, lse = o_blk.to(torch.float32 if q.dtype != torch.float64 else q.dtype), lse_blk.clone()
        else:
            k_j, v_j = _block_kv(kv, plan, j, kind)
            rows = slice(split, None) if kind == "back" else slice(None)
            o_blk, lse_blk = blocks.forward(q_back if kind == "back" else q, k_j, v_j, False, scale)
            merged_o, merged_lse = ring_math.merge(out[:, :, rows], lse[:, :, rows], o_blk, lse_blk, torch)
            out[:, :, rows] = merged_o
            lse[:, :, rows] = merged_lse
        if step + 1 < plan.world:
            kv = ring.wait(handle)
    ring.finish()
    return out.to(q.dtype), lse  # fp32 (fp64 for fp64 inputs, TorchBlocks)


def ring_backward(q, k, v, o, lse, dout, plan, group, blocks, scale, transfers=True):
    """(dQ, dK, dV) of this rank's shards: dQ from every block here, dK and dV summed over
    every rank's queries by the buffer that travels the ring with the block."""
    if plan.world == 1:
        return blocks.backward(q, k, v, o, lse, dout, plan.causal, scale)
    ring = _Ring(plan, group, q.device, transfers)
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    kv = torch.stack([k, v])
    split = plan.heads[plan.rank]
    if plan.causal:  # the second local chunk's rows, for the "back" blocks
        back = [t[:, :, split:].contiguous() for t in (q, o, lse, dout)]
    dq = torch.zeros(q.shape, dtype=acc, device=q.device)
    dkv_handle = None
    for step in range(plan.world):
        j, kind = plan.block(step)
        if step + 1 < plan.world:
            kv_handle = ring.pass_on(kv, _kv_shape(k, plan.lengths[(j - 1) % plan.world]), k.dtype)
        if kind == "own":
            dq_j, dk_j, dv_j = blocks.backward(q, k, v, o, lse, dout, plan.causal, scale)
            rows, keys = slice(None), slice(None)
        else:
            k_j, v_j = _block_kv(kv, plan, j, kind)
            rows = slice(split, None) if kind == "back" else slice(None)
            keys = slice(None, plan.heads[j]) if kind == "front" else slice(None)
            args = back if kind == "back" else (q, o, lse, dout)
            dq_j, dk_j, dv_j = blocks.backward(args[0], k_j, v_j, args[1], args[2], args[3], False, scale)
        dq[:, :, rows] += dq_j
        # dK_j, dV_j so far: zeros for the own block, else what the previous rank sent on
        dkv = torch.zeros(_kv_shape(k, plan.lengths[j]), dtype=acc, device=q.device) if step == 0 \
            else ring.wait(dkv_handle)
        dkv[0, :, :, keys] += dk_j
        dkv[1, :, :, keys] += dv_j
        # on to the next rank; after the last step this is the block's owner
        dkv_handle = ring.pass_on(dkv, _kv_shape(k, plan.lengths[(j - 1) % plan.world]), acc)
        if step + 1 < plan.world:
            kv = ring.wait(kv_handle)
    dkv = ring.wait(dkv_handle)
    ring.finish()
    return dq.to(q.dtype), dkv[0].to(k.dtype), dkv[1].to(v.dtype)


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, plan, group, blocks, scale):
        o, lse = ring_forward(q, k, v, plan, group, blocks, scale)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.plan, ctx.group, ctx.blocks, ctx.scale = plan, group, blocks, scale
        ctx.mark_non_differentiable(lse)
        return o, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = ring_backward(q, k, v, o, lse, dout.contiguous(), ctx.plan, ctx.group, ctx.blocks, ctx.scale)
        return dq, dk, dv, None, None, None, None


@torch.compiler.disable
def context_parallel_attention(q, k, v, group=None, causal=False, scale=None, return_lse=False, blocks=None,
                               forward_rung=None, backward_rung=None):
    """softmax(scale · Q Kᵀ + mask) V for this rank's shard of the queries, against the keys of
    every rank of `group` (default: the world). A collective: every rank of the group calls it.

    q: [B, H, L_r, d], k, v: [B, Hkv, L_r, d] (this rank's shards; zigzag_shard's for causal,
    any lengths ≥ 1 otherwise), contiguous, bf16/fp16 on the rank's GPU for the ladder's
    kernels. causal: over the global positions (zigzag layout). Returns O [B, H, L_r, d] (and
    lse, fp32 [B, H, L_r], natural log, if return_lse). Differentiable in q, k, v.
    blocks: the per-block kernels (default LadderBlocks(forward_rung, backward_rung): 06d_fa3's
    forward and backward on sm_90, 05_fa2_reordered's elsewhere);
    TorchBlocks() runs the same ring in plain PyTorch (CPU, gloo). Ranks that disagree on
    the problem all raise ValueError, before any transfer."""
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1]) if isinstance(q, torch.Tensor) and q.dim() == 4 else 1.0
    group = group if group is not None else dist.group.WORLD
    plan = _plan(q, k, v, group, causal, scale)
    if blocks is None:
        blocks = LadderBlocks(forward_rung, backward_rung)
    q, k, v = (t.contiguous() for t in (q, k, v))
    o, lse = _RingAttention.apply(q, k, v, plan, group, blocks, float(scale))
    return (o, lse) if return_lse else o
