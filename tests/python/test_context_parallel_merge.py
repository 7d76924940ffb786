"""pytest, no torch, no GPU: the arithmetic of context parallelism (python/attn_ladder/ring_math.py).

Runs in CI, where torch is not installed: ring_math.py is loaded by its path (the package
imports torch) and exercised with numpy in fp64. Checks that rung 03's ⊕ on (O, lse) of key
blocks equals softmax attention over all keys (two blocks, many blocks in any order, rows that
see no key in a block or at all), that it is commutative and associative with identity
(O = 0, L = −∞), and that the ring's zigzag schedule (zigzag_chunks, ring_block: own /
front / back blocks, the skipped quarter) reproduces causal attention exactly for 1-4 ranks
and odd N, merging in the ring's order. The same ring on torch tensors:
test_context_parallel_cpu.py (gloo) and tests/python/context_parallel_2gpu.py (NCCL).
"""

import importlib.util
import pathlib

import pytest

np = pytest.importorskip("numpy", reason="numpy (matplotlib's dependency) is not installed")

REPO = pathlib.Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("ring_math", REPO / "python" / "attn_ladder" / "ring_math.py")
ring_math = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ring_math)


def attention(q, k, v, mask=None):
    """(O, lse) of softmax(q kᵀ) v with mask (True = visible); a row that sees nothing: 0, −∞."""
    s = q @ k.T
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    m = np.where(np.isneginf(m), 0.0, m)
    p = np.exp(s - m)
    ell = p.sum(axis=-1)
    seen = ell > 0
    o = (p @ v) / np.where(seen, ell, 1.0)[:, None]
    lse = np.where(seen, m[:, 0] + np.log(np.where(seen, ell, 1.0)), -np.inf)
    return o, lse


def rel(a, b):
    return np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300)


def problem(rng, Nq, Nk, d=16, spread=3.0):
    return rng.normal(size=(Nq, d)) * spread, rng.normal(size=(Nk, d)), rng.normal(size=(Nk, d))


def test_two_blocks_equal_the_whole_row():
    rng = np.random.default_rng(0)
    q, k, v = problem(rng, 37, 101)
    o, lse = attention(q, k, v)
    o_a, l_a = attention(q, k[:40], v[:40])
    o_b, l_b = attention(q, k[40:], v[40:])
    o_m, l_m = ring_math.merge(o_a, l_a, o_b, l_b, np)
    assert rel(o_m, o) < 1e-13 and rel(l_m, lse) < 1e-13


def test_many_blocks_any_order_and_masked_rows():
    rng = np.random.default_rng(1)
    q, k, v = problem(rng, 29, 97, spread=8.0)  # large scores: the max subtraction matters
    mask = rng.random((29, 97)) < 0.3
    mask[0] = False  # a row that sees no key at all
    mask[1, :50] = False  # a row that sees nothing in the first blocks
    o, lse = attention(q, k, v, mask)
    bounds = [0, 13, 14, 50, 77, 97]
    blocks = [attention(q, k[a:b], v[a:b], mask[:, a:b]) for a, b in zip(bounds, bounds[1:])]
    for order in ([0, 1, 2, 3, 4], [4, 2, 0, 3, 1]):
        o_m, l_m = np.zeros_like(o), np.full_like(lse, -np.inf)  # the identity
        for i in order:
            o_m, l_m = ring_math.merge(o_m, l_m, *blocks[i], np)
        assert rel(o_m, o) < 1e-13
        assert np.array_equal(np.isneginf(l_m), np.isneginf(lse))
        finite = np.isfinite(lse)
        assert np.abs(l_m[finite] - lse[finite]).max() < 1e-12
    assert np.all(o_m[0] == 0) and np.isneginf(l_m[0])


def test_merge_is_commutative_and_associative():
    rng = np.random.default_rng(2)
    q, k, v = problem(rng, 8, 60)
    a, b, c = (attention(q, k[s], v[s]) for s in (slice(0, 20), slice(20, 35), slice(35, 60)))
    ab = ring_math.merge(*a, *b, np)
    ba = ring_math.merge(*b, *a, np)
    left = ring_math.merge(*ab, *c, np)
    right = ring_math.merge(*a, *ring_math.merge(*b, *c, np), np)
    assert rel(ab[0], ba[0]) < 1e-15 and rel(left[0], right[0]) < 1e-14 and rel(left[1], right[1]) < 1e-14


@pytest.mark.parametrize("N", [4, 9, 64, 101])
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_zigzag_chunks_partition_the_sequence(N, world):
    sizes = ring_math.zigzag_chunks(N, world)
    assert len(sizes) == 2 * world and sum(sizes) == N and max(sizes) - min(sizes) <= 1
    # Fewer tokens than chunks leaves a chunk empty: the case context_parallel_attention refuses.
    assert (min(sizes) == 0) == (N < 2 * world)
    lengths = [sizes[r] + sizes[2 * world - 1 - r] for r in range(world)]
    assert max(lengths) - min(lengths) <= 1 + (N % (2 * world) > 0)  # balanced: 2 chunks each


def zigzag_positions(N, world, r):
    """Global positions of rank r's rows: chunks r and 2·world−1−r."""
    sizes = ring_math.zigzag_chunks(N, world)
    starts = np.concatenate([[0], np.cumsum(sizes)])
    a, b = r, 2 * world - 1 - r
    return np.concatenate([np.arange(starts[a], starts[a + 1]), np.arange(starts[b], starts[b + 1])]), sizes[r]


@pytest.mark.parametrize("world,N", [(1, 7), (2, 8), (2, 13), (3, 6), (3, 31), (4, 45)])
@pytest.mark.parametrize("causal", [True, False])
def test_ring_schedule_reproduces_attention(world, N, causal):
    """Each rank, step by step in the ring's order, computes only its block (own: causal on the
    local rows; front / back: full, on the rows and keys ring_block names) and merges it: the
    result equals full (causal) attention on the rank's rows, every visible (row, key) pair is
    computed exactly once and no masked one."""
    rng = np.random.default_rng(N * 10 + world)
    q, k, v = problem(rng, N, N)
    i, j = np.arange(N)[:, None], np.arange(N)[None, :]
    full_mask = j <= i if causal else None
    o_ref, lse_ref = attention(q, k, v, full_mask)
    for r in range(world):
        rows, split = zigzag_positions(N, world, r)
        o = lse = None
        visited = np.zeros((len(rows), N), dtype=int)  # how often each (row, key) is computed
        for step in range(world):
            src, kind = ring_math.ring_block(r, world, step, causal)
            keys, src_split = zigzag_positions(N, world, src)
            row_sel, key_sel = slice(None), slice(None)
            if kind == "front":
                key_sel = slice(0, src_split)
            elif kind == "back":
                row_sel = slice(split, None)
            qr, kr = rows[row_sel], keys[key_sel]
            local_mask = None
            if kind == "own" and causal:
                local_mask = np.arange(len(kr))[None, :] <= np.arange(len(qr))[:, None]
                assert np.array_equal(local_mask, kr[None, :] <= qr[:, None])  # top-left = global
            elif causal:
                assert np.all(kr[None, :] <= qr[:, None]), f"{kind} block is not fully visible"
            block = attention(q[qr], k[kr], v[kr], local_mask)
            seen = np.ones((len(qr), len(kr)), bool) if local_mask is None else local_mask
            visited[np.ix_(np.arange(len(rows))[row_sel], kr)] += seen
            if o is None:
                assert kind == "own"
                o, lse = block
            else:
                o_part, lse_part = ring_math.merge(o[row_sel], lse[row_sel], *block, np)
                o[row_sel], lse[row_sel] = o_part, lse_part
        want = np.ones((len(rows), N), bool) if not causal else (np.arange(N)[None, :] <= rows[:, None])
        assert np.array_equal(visited, want.astype(int)), "the schedule must compute each visible pair once"
        assert rel(o, o_ref[rows]) < 1e-13 and rel(lse, lse_ref[rows]) < 1e-13
