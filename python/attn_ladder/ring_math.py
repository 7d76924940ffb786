"""The arithmetic of context parallelism, without torch: rung 03's ⊕ on (O, lse) pairs, the
zigzag chunk sizes, and which block of the causal mask a ring step computes.

Two partial attentions of the same query rows over disjoint key sets A and B, each normalized
over its own keys, O_A with L_A = log Σ_{j∈A} e^(S_ij) and O_B with L_B, combine into the
attention over A ∪ B:

    L = log(e^(L_A) + e^(L_B)) = m + log(e^(L_A − m) + e^(L_B − m)),     m = max(L_A, L_B)
    O = e^(L_A − L) O_A + e^(L_B − L) O_B

(05_fa2_reordered/context_parallel.md derives it from rung 03's (m, ℓ) ⊕). A row that sees no
key in a block has L = −∞ there and weight 0; a row that sees no key at all stays O = 0,
L = −∞. Natural-log lse, as the ladder's kernels write it.

Written over an array module `xp` (numpy or torch) so that the same function is checked in CI
without torch (tests/python/test_context_parallel_merge.py) and used by the ring
(context_parallel.py). Importing this file imports neither.
"""

import math


def merge(o_a, lse_a, o_b, lse_b, xp):
    """(O_A, L_A) ⊕ (O_B, L_B) -> (O, L). o: [..., N, d]; lse: [..., N] (fp32 or fp64).

    O comes in lse's precision (a bf16 O_B is promoted by the weights)."""
    m = xp.maximum(lse_a, lse_b)
    m = xp.where(xp.isneginf(m), 0.0, m)  # a row no block sees: any finite shift, both weights 0
    w_a = xp.exp(lse_a - m)
    w_b = xp.exp(lse_b - m)
    total = w_a + w_b
    seen = total > 0
    total_safe = xp.where(seen, total, 1.0)
    lse = xp.where(seen, m + xp.log(total_safe), -math.inf)
    o = (w_a[..., None] * o_a + w_b[..., None] * o_b) / total_safe[..., None]
    return o, lse


def zigzag_chunks(N, world):
    """The sizes of the 2·world chunks of a sequence of N tokens (torch.tensor_split's: the
    first N mod 2·world chunks one token longer). Rank r holds chunks r and 2·world−1−r."""
    parts = 2 * world
    return [N // parts + (1 if i < N % parts else 0) for i in range(parts)]


def ring_block(rank, world, step, causal):
    """(j, kind): at `step` rank `rank` holds the K/V shard of rank j = rank − step (mod
    world), and computes with it one block of kind
      "own"    step 0: its own K/V; causal attention on the local rows when causal (in zigzag
               order the local rows are increasing global positions, Nq = Nk)
      "full"   non-causal: every local query against every key of j
      "front"  causal, j < rank: every local query against j's first chunk only (j's second
               chunk, 2·world−1−j, lies after both local chunks)
      "back"   causal, j > rank: the local second chunk only against both chunks of j (the
               local first chunk, rank, lies before both of j's)
    Each non-own causal block is half of a (local × local) block: every rank, every step,
    the same work."""
    j = (rank - step) % world
    if step == 0:
        return j, "own"
    if not causal:
        return j, "full"
    return j, "front" if j < rank else "back"
