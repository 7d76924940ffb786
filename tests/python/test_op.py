"""pytest: the operator attn_ladder::attention (python/attn_ladder/ops.py) on a GPU.

Checks it against PyTorch SDPA's math backend on fp32 copies, through torch.library.opcheck,
torch.compile(fullgraph=True) and a CUDA graph, and that a gradient request is refused with a
clear error. Skips (with the reason) without torch, a CUDA GPU or the built library.
"""

import math
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

HOPPER = torch.cuda.get_device_capability() >= (9, 0)
RUNGS = ["03b_fused_online", "05_fa2_reordered"] + (["06d_fa3"] if HOPPER else [])
BOUND = {torch.bfloat16: 1e-2, torch.float16: 3e-3}  # common/tolerance.h


def inputs(B=2, H=4, Hkv=2, Nq=113, Nk=113, d=64, dtype=torch.bfloat16, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(B, H, Nq, d, device="cuda", dtype=dtype, generator=g)
    k = torch.randn(B, Hkv, Nk, d, device="cuda", dtype=dtype, generator=g)
    v = torch.randn(B, Hkv, Nk, d, device="cuda", dtype=dtype, generator=g)
    return q, k, v


def reference(q, k, v, causal):
    """fp64 attention with the ladder's conventions: GQA, bottom-right causal, empty rows 0."""
    rep = q.shape[1] // k.shape[1]
    k, v = (t.double().repeat_interleave(rep, dim=1) for t in (k, v))
    s = q.double() @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        Nq, Nk = q.shape[2], k.shape[2]
        i = torch.arange(Nq, device="cuda")[:, None]
        j = torch.arange(Nk, device="cuda")[None, :]
        s = s.masked_fill(j > i + (Nk - Nq), float("-inf"))
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)
    return p @ v


def rel_err(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


ODD_SHAPES = [  # (B, H, Hkv, Nq, Nk, causal): one key, odd lengths, GQA, Nq < Nk and Nq > Nk
    (1, 2, 2, 1, 1, False),
    (2, 2, 1, 17, 17, True),
    (1, 3, 3, 113, 200, True),
    (1, 4, 2, 200, 113, True),
]


@pytest.mark.parametrize("rung", attn_ladder.rungs())
def test_every_rung_on_odd_shapes(rung):
    info = attn_ladder.rung_info(rung)
    if info["min_sm"] > 10 * torch.cuda.get_device_capability()[0] + torch.cuda.get_device_capability()[1]:
        pytest.skip(f"{rung} needs sm_{info['min_sm']}")
    fp8 = "fp8" in info["dtypes"]
    bound = 1e-1 if fp8 else BOUND[torch.bfloat16]
    ran = 0
    for d in (64, 128):
        if d not in info["head_dims"]:
            continue
        for B, H, Hkv, Nq, Nk, causal in ODD_SHAPES:
            if Hkv != H and not info["gqa"]:
                continue
            q, k, v = inputs(B, H, Hkv, Nq, Nk, d, seed=Nq + d)
            o = attn_ladder.attention(q, k, v, rung=rung, causal=causal, fp8=fp8)
            ref = reference(q, k, v, causal)
            assert torch.isfinite(o).all(), (rung, d, Nq, Nk)
            if ref.norm() > 0:
                assert rel_err(o, ref) <= bound, (rung, d, B, H, Hkv, Nq, Nk, causal)
            ran += 1
    assert ran > 0


@pytest.mark.parametrize("rung", RUNGS)
@pytest.mark.parametrize("causal", [False, True])
def test_matches_the_reference(rung, causal):
    q, k, v = inputs()
    o, lse = attn_ladder.attention(q, k, v, rung=rung, causal=causal, return_lse=True)
    assert o.dtype == q.dtype and o.shape == q.shape and lse.shape == q.shape[:3]
    assert rel_err(o, reference(q, k, v, causal)) <= BOUND[q.dtype]


@pytest.mark.parametrize("rung", RUNGS)
def test_opcheck(rung):
    q, k, v = inputs()
    torch.library.opcheck(torch.ops.attn_ladder.attention.default, (q, k, v, rung, True, 0.125, False))


@pytest.mark.parametrize("rung", RUNGS)
def test_compiles_with_fullgraph(rung):
    q, k, v = inputs(seed=1)

    def block(q, k, v):
        return attn_ladder.attention(q, k, v, rung=rung, causal=True) * 2.0

    compiled = torch.compile(block, fullgraph=True)
    torch.testing.assert_close(compiled(q, k, v), block(q, k, v), rtol=0, atol=0)


@pytest.mark.parametrize("rung", RUNGS + ["01_naive"] + (["06_fp8"] if HOPPER else []))
def test_captured_in_a_cuda_graph(rung):
    q, k, v = inputs(seed=2)
    fp8 = "fp8" in rung
    causal = not fp8

    def call():
        return attn_ladder.attention(q, k, v, rung=rung, causal=causal, fp8=fp8)

    expected = call()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up outside the capture, as CUDA graphs ask
        call()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = call()
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


def test_gradient_request_is_refused():
    q, k, v = inputs()
    q.requires_grad_()
    with pytest.raises(RuntimeError, match="no backward"):
        attn_ladder.attention(q, k, v, rung="05_fa2_reordered")
    with torch.no_grad():
        attn_ladder.attention(q, k, v, rung="05_fa2_reordered")


def test_bad_inputs_are_refused_with_a_message():
    q, k, v = inputs()
    with pytest.raises(ValueError, match="float32"):
        attn_ladder.attention(q.float(), k.float(), v.float(), rung="05_fa2_reordered")
    with pytest.raises(attn_ladder.AttnLadderError, match="head dim"):
        attn_ladder.attention(*inputs(d=80), rung="05_fa2_reordered")
    with pytest.raises(attn_ladder.AttnLadderError, match="unknown rung"):
        attn_ladder.attention(q, k, v, rung="07_nope")


def test_rung_info():
    info = attn_ladder.rung_info("05_fa2_reordered")
    assert set(info["dtypes"]) == {"bf16", "fp16"}
    assert 128 in info["head_dims"] and info["writes_lse"] and info["gqa"]
    assert attn_ladder.rung_info("06d_fa3")["min_sm"] == 90
