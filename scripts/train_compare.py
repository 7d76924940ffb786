#!/usr/bin/env python3
"""Train one small transformer language model twice, with the ladder's attention and with SDPA.

    scripts/train_compare.py --rung 05_fa2_reordered --steps 200 --out results/<gpu>

The model: 2 pre-norm blocks, d_model 256, 4 heads of d = 64, causal self-attention, a GELU
MLP of 1024, tied embeddings (GPT-2's init, std 0.02); AdamW. The text: a synthetic language
over 64 tokens, an order-2 Markov chain whose next token depends on the current token and on
the one before it, which only attention can bring (entropy about 1.9 nats per token with both,
about 2.5 with the current token alone, log 64 = 4.16 with neither). Both runs start from the
same seed: the same initial weights, the same batches. Attention runs in bfloat16 in both (q,
k, v cast from the fp32 activations), through attn_ladder.attention (whose autograd is the
rung's backward pass) or torch.nn.functional.scaled_dot_product_attention; everything else is
identical.

Writes train_loss.csv (step, loss_sdpa, loss_<rung>) and train_loss.png (both curves and their
ratio) into --out, and prints the final losses (mean of the last 10 steps) and their relative
difference. tests/python/test_autograd.py runs train() and asserts that difference is within 1 %.
"""

import argparse
import csv
import math
import pathlib
import sys

import torch
import torch.nn.functional as F

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "python"))
import attn_ladder  # noqa: E402

VOCAB = 64
D_MODEL = 256
HEADS = 4
LAYERS = 2
SEQ = 256
BATCH = 16
LR = 3e-3
FINAL_WINDOW = 10  # the final loss: mean of this many last steps
BIGRAM_WEIGHT, CONTEXT_WEIGHT = 2.5, 1.5  # the text's dependence on the current and the previous token


def markov_text(tokens, seed):
    """A token stream of an order-2 Markov chain: after tokens (a, b) the next token's logits are
    BIGRAM_WEIGHT * U[b] + CONTEXT_WEIGHT * W[a], U and W fixed N(0,1) tables."""
    g = torch.Generator().manual_seed(seed)
    u, w = torch.randn(VOCAB, VOCAB, generator=g), torch.randn(VOCAB, VOCAB, generator=g)
    table = torch.softmax(BIGRAM_WEIGHT * u[None, :, :] + CONTEXT_WEIGHT * w[:, None, :], dim=-1)
    out = torch.empty(tokens, dtype=torch.long)
    out[0], out[1] = 0, 1
    draws = torch.rand(tokens, generator=g)
    cdf = table.cumsum(dim=-1)
    for i in range(2, tokens):
        out[i] = torch.searchsorted(cdf[out[i - 2], out[i - 1]], draws[i]).clamp_max(VOCAB - 1)
    return out


class Block(torch.nn.Module):
    """A pre-norm block: LayerNorm, qkv projection, causal attention by `attend` on bfloat16
    q, k, v [B, H, T, d], output projection, LayerNorm, GELU MLP of 4 d_model. The rest runs in
    the activations' dtype. scripts/train_step_bench.py builds its larger models from it."""

    def __init__(self, attend, d_model=D_MODEL, heads=HEADS):
        super().__init__()
        self.attend, self.heads = attend, heads
        self.ln1, self.ln2 = torch.nn.LayerNorm(d_model), torch.nn.LayerNorm(d_model)
        self.qkv = torch.nn.Linear(d_model, 3 * d_model, bias=False)
        self.proj = torch.nn.Linear(d_model, d_model, bias=False)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(d_model, 4 * d_model), torch.nn.GELU(),
                                       torch.nn.Linear(4 * d_model, d_model))

    def forward(self, x):
        B, T, D = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(B, T, 3, self.heads, D // self.heads).permute(2, 0, 3, 1, 4)
        o = self.attend(*(t.to(torch.bfloat16).contiguous() for t in (q, k, v)))
        x = x + self.proj(o.to(x.dtype).transpose(1, 2).reshape(B, T, D))
        return x + self.mlp(self.ln2(x))


class LanguageModel(torch.nn.Module):
    def __init__(self, attend):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, D_MODEL)
        torch.nn.init.normal_(self.embed.weight, std=0.02)  # tied to the output: N(0,1) would start at loss ~200
        self.pos = torch.nn.Parameter(torch.randn(SEQ, D_MODEL) * 0.02)
        self.blocks = torch.nn.ModuleList(Block(attend) for _ in range(LAYERS))
        self.ln = torch.nn.LayerNorm(D_MODEL)

    def forward(self, tokens):
        x = self.embed(tokens) + self.pos[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.ln(x) @ self.embed.weight.T


def ladder_attention(rung):
    return lambda q, k, v: attn_ladder.attention(q, k, v, rung=rung, causal=True)


def sdpa_attention(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def train(attend, steps, seed=0, device="cuda", progress=None):
    """Losses of `steps` AdamW steps of a fresh LanguageModel(attend) from `seed`."""
    text = markov_text(BATCH * (SEQ + 1) * 8 + SEQ + 1, seed).to(device)
    torch.manual_seed(seed)
    model = LanguageModel(attend).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01)
    g = torch.Generator(device=device).manual_seed(seed)
    losses = []
    for step in range(steps):
        starts = torch.randint(0, text.numel() - SEQ - 1, (BATCH,), device=device, generator=g)
        window = text[starts[:, None] + torch.arange(SEQ + 1, device=device)]
        logits = model(window[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), window[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if progress and (step + 1) % 50 == 0:
            progress(f"  step {step + 1}/{steps}: loss {losses[-1]:.4f}")
    return losses


def final(losses):
    tail = losses[-FINAL_WINDOW:]
    return sum(tail) / len(tail)


def plot(losses_sdpa, losses_ladder, rung, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = range(1, len(losses_sdpa) + 1)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 7), sharex=True, height_ratios=[3, 1], layout="constrained")
    top.plot(steps, losses_sdpa, label="SDPA (torch)", color="tab:gray", linewidth=2.2)
    top.plot(steps, losses_ladder, label=f"attn_ladder {rung}", color="tab:blue", linewidth=1.4, linestyle="--")
    top.set_ylabel("training loss (nats/token)")
    top.legend()
    top.grid(True, alpha=0.3)
    bottom.plot(steps, [b / a for a, b in zip(losses_sdpa, losses_ladder)], color="tab:blue")
    bottom.axhline(1.0, color="gray", linewidth=1)
    bottom.set_ylabel("ladder / SDPA")
    bottom.set_xlabel("step")
    bottom.grid(True, alpha=0.3)
    fig.suptitle(f"2-layer LM, d_model {D_MODEL}, {HEADS} heads of d = {D_MODEL // HEADS}, same seed\n"
                 f"{torch.cuda.get_device_name()}")
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rung", default="05_fa2_reordered", help="a rung with a backward pass")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=pathlib.Path, help="folder for train_loss.csv and train_loss.png")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("train_compare.py: needs a CUDA GPU")
    if not attn_ladder.has_backward(args.rung, D_MODEL // HEADS):
        sys.exit(f"train_compare.py: rung '{args.rung}' has no backward pass at d = {D_MODEL // HEADS}")
    print(f"SDPA, {args.steps} steps:", flush=True)
    sdpa = train(sdpa_attention, args.steps, args.seed, progress=lambda s: print(s, flush=True))
    print(f"attn_ladder {args.rung}, {args.steps} steps:", flush=True)
    ladder = train(ladder_attention(args.rung), args.steps, args.seed, progress=lambda s: print(s, flush=True))
    a, b = final(sdpa), final(ladder)
    print(f"loss at step 1: {sdpa[0]:.4f} (log {VOCAB} = {math.log(VOCAB):.4f}); final loss (mean of the last "
          f"{FINAL_WINDOW} steps): SDPA {a:.4f}, {args.rung} {b:.4f}, relative difference {abs(b - a) / a * 100:.3f} %")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        with open(args.out / "train_loss.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["step", "loss_sdpa", f"loss_{args.rung}"])
            for i, (x, y) in enumerate(zip(sdpa, ladder), 1):
                w.writerow([i, f"{x:.6f}", f"{y:.6f}"])
        plot(sdpa, ladder, args.rung, args.out / "train_loss.png")
        print(f"train_compare.py: wrote {args.out / 'train_loss.csv'} and train_loss.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
