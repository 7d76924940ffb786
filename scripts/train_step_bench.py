#!/usr/bin/env python3
"""Time whole training steps of a transformer with the ladder's attention and with SDPA.

    scripts/train_step_bench.py --rungs 06d_fa3,05_fa2_reordered --csv train_step.csv

One step: forward of L pre-norm blocks (LayerNorm, qkv projection, causal attention, output
projection, LayerNorm, GELU MLP of 4 d_model), a mean-square loss on the output, backward; no
optimizer (its time does not depend on the attention). Everything in bfloat16 on one GPU.
Attention runs through attn_ladder.attention (whose autograd is the rung's backward pass) or
torch.nn.functional.scaled_dot_product_attention with one backend forced (cuDNN, flash); the
rest of the model is the same module with the same weights. The two default shapes are the
ones the Hopper-backward issue measured (4 layers each): d_model 2048, 16 heads of 128, B 4,
T 4096; and d_model 1024, 8 heads of 128, B 2, T 16384.

Per shape, each rung is timed against each SDPA backend in a pair of its own, the two taking
turns step by step (vs_cudnn.time_interleaved: a joint warm-up, then --repeats turns, each
timing one step of both between CUDA events), so that both run under the same clock and each
follows the other: under the board's power cap a step inherits the clock the step before it
left, and a block of one attention's steps, or a third attention between them, biases the pair
(06o_bwd.md, pitfalls). A row per (shape, rung, backend): both medians and their ratio (> 1: the
ladder's step is faster). Writes --csv.
"""

import argparse
import csv
import pathlib
import sys

import torch
import torch.nn.functional as F

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "python"))
import attn_ladder  # noqa: E402
from train_compare import Block, ladder_attention  # noqa: E402  (the same pre-norm block)

sys.path.insert(0, str(REPO / "scripts"))
from vs_cudnn import time_interleaved  # noqa: E402  (the turns)
from peers import git_sha  # noqa: E402

SHAPES = {  # name: (layers, d_model, heads, batch, tokens)
    "2048x16h_B4_T4k": (4, 2048, 16, 4, 4096),
    "1024x8h_B2_T16k": (4, 1024, 8, 2, 16384),
}


class Model(torch.nn.Module):
    def __init__(self, layers, d_model, heads, attend):
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block(attend, d_model, heads) for _ in range(layers))

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


def sdpa(backend):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    which = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}[backend]

    def attend(q, k, v):
        with sdpa_kernel(which):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return attend


def step_calls(model, x, impls):
    """One forward + backward step of `model` on `x` per attention: a callable each."""
    def step(attend):
        for block in model.blocks:
            block.attend = attend
        model.zero_grad(set_to_none=True)
        model(x).float().square().mean().backward()
    return [lambda attend=attend: step(attend) for _, attend in impls]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rungs", default="06d_fa3,05_fa2_reordered", help="rungs with a backward pass at d = 128")
    p.add_argument("--peers", default="cudnn,flash", help="SDPA backends to force")
    p.add_argument("--shapes", default=",".join(SHAPES), help=f"any of {', '.join(SHAPES)}")
    p.add_argument("--repeats", type=int, default=20, help="turns of each pair (one timed step of each)")
    p.add_argument("--csv", type=pathlib.Path)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("train_step_bench: no CUDA device: it times training steps on a GPU")
    rungs = [r for r in args.rungs.split(",") if r]
    for rung in rungs:
        if not attn_ladder.has_backward(rung, 128):
            sys.exit(f"train_step_bench: rung '{rung}' has no backward pass at d = 128")
    peers = [b for b in args.peers.split(",") if b]
    gpu, sha = torch.cuda.get_device_name(), git_sha()
    rows = []
    for name in args.shapes.split(","):
        if name not in SHAPES:
            sys.exit(f"train_step_bench: unknown shape '{name}' (known: {', '.join(SHAPES)})")
        layers, d_model, heads, batch, tokens = SHAPES[name]
        torch.manual_seed(0)
        model = Model(layers, d_model, heads, None).to("cuda", torch.bfloat16)
        x = torch.randn(batch, tokens, d_model, device="cuda", dtype=torch.bfloat16)
        for rung in rungs:
            for peer in peers:
                pair = [(f"ladder_{rung}", ladder_attention(rung)), (f"sdpa_{peer}", sdpa(peer))]
                ms, peer_ms = time_interleaved(step_calls(model, x, pair), args.repeats, lambda: None)
                print(f"[train_step] {gpu} {name}: {rung} {ms:.2f} ms, {peer} {peer_ms:.2f} ms in turns: "
                      f"{peer_ms / ms:.3f}x (> 1: the ladder's step is faster)", flush=True)
                rows.append({"gpu": gpu, "shape": name, "layers": layers, "d_model": d_model, "heads": heads,
                             "B": batch, "T": tokens, "impl": pair[0][0], "peer": pair[1][0],
                             "step_ms_median": f"{ms:.3f}", "peer_ms_median": f"{peer_ms:.3f}",
                             "speedup": f"{peer_ms / ms:.3f}", "git_sha": sha})
        del model, x
        torch.cuda.empty_cache()
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
        print(f"[train_step] wrote {args.csv}")


if __name__ == "__main__":
    main()
