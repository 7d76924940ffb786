"""pytest: attn_ladder.decode_paged (the operator attn_ladder::decode_paged) on a GPU.

A ragged batch in shuffled pages against fp64 on each sequence's contiguous K and V, through
torch.library.opcheck, torch.compile(fullgraph=True) and a CUDA graph replayed with new lengths;
bad block tables and lengths raise ValueError. Skips without torch, a CUDA GPU or the library.
"""

import pathlib
import sys

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU visible to torch", allow_module_level=True)
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "python"))
import attn_ladder  # noqa: E402

if not attn_ladder.library_path().is_file():
    pytest.skip(f"libattn_ladder.so not built ({attn_ladder.library_path()})", allow_module_level=True)
from test_op import reference  # noqa: E402  (fp64, the ladder's conventions; pytest puts tests/python on the path)


def paged_batch(lens, page_size=16, H=8, Hkv=2, Nq=4, d=128, dtype=torch.bfloat16, seed=0):
    """(q, k_cache, v_cache, block_table, seq_lens, [(k_b, v_b)]): pages shuffled, one spare
    block-table column of out-of-range garbage."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    pages = [-(-n // page_size) for n in lens]
    num_pages, max_pages = sum(pages) + 2, max(pages) + 1
    order = torch.randperm(num_pages, generator=torch.Generator().manual_seed(seed)).tolist()
    k_cache = torch.randn(num_pages, page_size, Hkv, d, device="cuda", dtype=dtype, generator=g)
    v_cache = torch.randn_like(k_cache)
    table = torch.full((len(lens), max_pages), 2**31 - 1, dtype=torch.int32)
    seqs, used = [], 0
    for b, n in enumerate(lens):
        ids = order[used:used + pages[b]]
        used += pages[b]
        table[b, :len(ids)] = torch.tensor(ids, dtype=torch.int32)
        idx = torch.tensor(ids, device="cuda", dtype=torch.long)
        # [pages, page_size, Hkv, d] -> [Hkv, n, d]
        seqs.append(tuple(c[idx].reshape(-1, Hkv, d)[:n].transpose(0, 1) for c in (k_cache, v_cache)))
    q = torch.randn(len(lens), H, Nq, d, device="cuda", dtype=dtype, generator=g)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device="cuda")
    return q, k_cache, v_cache, table.cuda(), seq_lens, seqs


def expect_close(o, q, seqs, causal):
    for b, (k, v) in enumerate(seqs):
        ref = reference(q[b][None], k[None], v[None], causal)[0]  # test_op's, on a batch of one
        err = ((o[b].double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()
        assert err <= 1e-2 or ref.norm() == 0, f"sequence {b}: relative error {err}"


@pytest.mark.parametrize("page_size", [16, 64, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_ragged_batch_matches_fp64(page_size, causal):
    q, kc, vc, table, lens, seqs = paged_batch([1, 17, 4097, 700], page_size=page_size)
    o = attn_ladder.decode_paged(q, kc, vc, table, lens, causal=causal)
    expect_close(o, q, seqs, causal)


@pytest.mark.parametrize("H, Hkv", [(6, 3), (12, 6), (5, 1)])
def test_kv_heads_any_count(H, Hkv):
    """H_kv no power of two: each CTA finds its sequence by division (by shift otherwise)."""
    q, kc, vc, table, lens, seqs = paged_batch([1, 130, 700], page_size=64, H=H, Hkv=Hkv, Nq=2)
    o = attn_ladder.decode_paged(q, kc, vc, table, lens, causal=True)
    expect_close(o, q, seqs, True)


def test_opcheck_compile_and_graph():
    q, kc, vc, table, lens, seqs = paged_batch([300, 5000, 64], page_size=64)
    torch.library.opcheck(torch.ops.attn_ladder.decode_paged.default, (q, kc, vc, table, lens, True, 0.125),
                          test_utils=("test_schema", "test_faketensor"))
    compiled = torch.compile(lambda *a: attn_ladder.decode_paged(*a, causal=True), fullgraph=True)
    expect_close(compiled(q, kc, vc, table, lens), q, seqs, True)
    graph = torch.cuda.CUDAGraph()
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        out = attn_ladder.decode_paged(q, kc, vc, table, lens, causal=True)
    for new in ([300, 5000, 64], [1, 17, 0]):
        lens.copy_(torch.tensor(new, dtype=torch.int32))
        graph.replay()
        torch.cuda.synchronize()
        eager = attn_ladder.decode_paged(q, kc, vc, table, lens, causal=True)
        assert torch.equal(out, eager), f"graph replay with lengths {new} differs from an eager call"


@pytest.mark.parametrize("edit, words", [
    ("page", "is not a page index"),
    ("negative", "is negative"),
    ("beyond", "is beyond the"),
])
def test_bad_tables_raise(edit, words):
    q, kc, vc, table, lens, _ = paged_batch([20, 40], page_size=16)
    if edit == "page":
        table[1, 1] = kc.shape[0]
    elif edit == "negative":
        lens[0] = -1
    else:
        lens[1] = table.shape[1] * 16 + 1
    with pytest.raises(ValueError, match=words):
        attn_ladder.decode_paged(q, kc, vc, table, lens)
    with pytest.raises(ValueError, match="int32"):
        attn_ladder.decode_paged(q, kc, vc, table.long(), lens)
