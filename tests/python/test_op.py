"""pytest: the operator attn_ladder::attention (python/attn_ladder/ops.py) on a GPU.

Checks it against PyTorch SDPA's math backend on fp32 copies, through torch.library.opcheck,
torch.compile(fullgraph=True) and a CUDA graph, and that a gradient request through a rung
without a backward pass is refused with a clear error; attn_ladder::attention_e4m3 (e4m3 inputs with their descales) likewise. Skips
(with the reason) without torch, a CUDA GPU or the built library.
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


def quantize_e4m3(x, rows):
    """x [B, H, N, d] -> (e4m3 x / scale, fp32 scale [B, H, ceil(N / rows)]): one scale per block of
    `rows` rows, amax / 448, as the bf16 FP8 path's pre-kernel takes it (1 for an all-zero block)."""
    B, H, N, d = x.shape
    blocks = -(-N // rows)
    padded = torch.nn.functional.pad(x.float(), (0, 0, 0, blocks * rows - N)).view(B, H, blocks, rows * d)
    amax = padded.abs().amax(dim=-1)
    scale = torch.where(amax > 0, (amax / 448).clamp_min(torch.finfo(torch.float32).tiny), torch.ones_like(amax))
    x8 = (x.float() / expand_scale(scale, rows, N)).clamp(-448, 448).to(torch.float8_e4m3fn)
    return x8, scale.contiguous()


def expand_scale(scale, rows, N):
    """[B, H, blocks] -> [B, H, N, 1]: each row's block scale."""
    return scale.repeat_interleave(rows, dim=2)[:, :, :N, None]


def e4m3_inputs(rung, q, k, v):
    """q, k, v (bf16) quantized for `rung`'s blocks: (q8, k8, v8), (q_descale, k_descale, v_descale)
    and the dequantized values the rung is given, for the reference."""
    q_rows, kv_rows = attn_ladder.descale_blocks(rung, q, k)
    (q8, qs), (k8, ks), (v8, vs) = quantize_e4m3(q, q_rows), quantize_e4m3(k, kv_rows), quantize_e4m3(v, kv_rows)
    exact = (q8.float() * expand_scale(qs, q_rows, q.shape[2]), k8.float() * expand_scale(ks, kv_rows, k.shape[2]),
             v8.float() * expand_scale(vs, kv_rows, v.shape[2]))
    return (q8, k8, v8), (qs, ks, vs), exact


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
    e4m3 = "e4m3" in info["dtypes"]  # the caller's e4m3 inputs and descales
    bound = 1e-1 if fp8 or e4m3 else BOUND[torch.bfloat16]
    ran = 0
    for d in (64, 128):
        if d not in info["head_dims"]:
            continue
        for B, H, Hkv, Nq, Nk, causal in ODD_SHAPES:
            if Hkv != H and not info["gqa"]:
                continue
            q, k, v = inputs(B, H, Hkv, Nq, Nk, d, seed=Nq + d)
            if e4m3:
                qkv8, descale, (q, k, v) = e4m3_inputs(rung, q, k, v)
                o = attn_ladder.attention(*qkv8, rung=rung, causal=causal, descale=descale)
            else:
                try:
                    o = attn_ladder.attention(q, k, v, rung=rung, causal=causal, fp8=fp8)
                except attn_ladder.AttnLadderError as e:  # a shape the rung refuses (05_fa2_decode: Nq > 64)
                    assert e.code == 1 and "use " in str(e), str(e)
                    continue
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


E4M3 = "06_fp8_e4m3"  # FlashAttention-3's FP8 interface: e4m3 q, k, v and their block descales
needs_hopper = pytest.mark.skipif(not HOPPER, reason="06_fp8_e4m3 needs sm_90")


@needs_hopper
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_e4m3_inputs_match_the_reference(d, causal):
    q, k, v = inputs(B=2, H=4, Hkv=2, Nq=113, Nk=1000, d=d, seed=d)
    qkv8, descale, exact = e4m3_inputs(E4M3, q, k, v)
    o, lse = attn_ladder.attention(*qkv8, rung=E4M3, causal=causal, descale=descale, return_lse=True)
    assert o.dtype == torch.bfloat16 and o.shape == q.shape and lse.shape == q.shape[:3]
    assert torch.isfinite(o).all()
    assert rel_err(o, reference(*exact, causal)) <= 1e-1  # common/tolerance.h, e4m3
    # The plain call gives the operator's bytes.
    torch.testing.assert_close(attn_ladder.run(E4M3, *qkv8, causal=causal, descale=descale), o, rtol=0, atol=0)


@needs_hopper
def test_e4m3_per_tensor_scales_are_repeated_per_block():
    q, k, v = inputs(seed=3)
    q_rows, kv_rows = attn_ladder.descale_blocks(E4M3, q, k)
    s = torch.tensor(2.0**-5, device="cuda")
    qkv8 = tuple((t.float() / s).to(torch.float8_e4m3fn) for t in (q, k, v))
    q_descale = s.expand(q.shape[0], q.shape[1], -(-q.shape[2] // q_rows)).contiguous()
    kv_descale = s.expand(k.shape[0], k.shape[1], -(-k.shape[2] // kv_rows)).contiguous()
    o = attn_ladder.attention(*qkv8, rung=E4M3, descale=(q_descale, kv_descale, kv_descale))
    assert rel_err(o, reference(*(t.float() * s for t in qkv8), False)) <= 1e-1


@needs_hopper
def test_e4m3_opcheck():
    qkv8, descale, _ = e4m3_inputs(E4M3, *inputs())
    torch.library.opcheck(torch.ops.attn_ladder.attention_e4m3.default, (*qkv8, *descale, E4M3, True, 0.125),
                          test_utils=("test_faketensor",))  # the schema check multiplies its inputs: no fp8 mul


@needs_hopper
def test_e4m3_compiles_with_fullgraph_and_is_captured_in_a_cuda_graph():
    qkv8, descale, _ = e4m3_inputs(E4M3, *inputs(seed=4))

    def call():
        return attn_ladder.attention(*qkv8, rung=E4M3, causal=True, descale=descale)

    expected = call()
    torch.testing.assert_close(torch.compile(call, fullgraph=True)(), expected, rtol=0, atol=0)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        call()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = call()
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


@needs_hopper
def test_e4m3_bad_inputs_are_refused_with_a_message():
    q, k, v = inputs()
    qkv8, (qs, ks, vs), _ = e4m3_inputs(E4M3, q, k, v)
    with pytest.raises(ValueError, match="descale="):
        attn_ladder.run(E4M3, *qkv8)
    with pytest.raises(ValueError, match="k_descale must have shape"):
        attn_ladder.run(E4M3, *qkv8, descale=(qs, ks.repeat(1, 1, 2), vs))
    with pytest.raises(ValueError, match="q_descale must be a float32"):
        attn_ladder.run(E4M3, *qkv8, descale=(qs.half(), ks, vs))
    with pytest.raises(ValueError, match="descale goes with float8_e4m3fn"):
        attn_ladder.run(E4M3, q, k, v, descale=(qs, ks, vs))
    with pytest.raises(attn_ladder.AttnLadderError, match="dtype bf16 is not supported"):
        attn_ladder.run(E4M3, q, k, v)
    with pytest.raises(attn_ladder.AttnLadderError, match="takes no descales"):
        attn_ladder.run("06_fp8", *qkv8, descale=(qs, ks, vs))


def test_gradient_request_is_refused():
    # A rung without a backward pass (autograd through 04 and 05: tests/python/test_autograd.py).
    q, k, v = inputs()
    q.requires_grad_()
    with pytest.raises(RuntimeError, match="no backward"):
        attn_ladder.attention(q, k, v, rung="03b_fused_online")
    with torch.no_grad():
        attn_ladder.attention(q, k, v, rung="03b_fused_online")


def test_bad_inputs_are_refused_with_a_message():
    q, k, v = inputs()
    with pytest.raises(ValueError, match="float32"):
        attn_ladder.attention(q.float(), k.float(), v.float(), rung="05_fa2_reordered")
    with pytest.raises(attn_ladder.AttnLadderError, match="head dim"):
        attn_ladder.attention(*inputs(d=80), rung="05_fa2_reordered")
    with pytest.raises(attn_ladder.AttnLadderError, match="unknown rung"):
        attn_ladder.attention(q, k, v, rung="07_nope")


def test_bad_inputs_through_the_operator():
    q, k, v = inputs()
    with pytest.raises(ValueError, match="CUDA device"):  # not the dispatcher's NotImplementedError
        attn_ladder.attention(q.cpu(), k.cpu(), v.cpu(), rung="05_fa2_reordered")
    with pytest.raises(ValueError, match="fp32"):  # 1e-46 rounds to 0 in fp32, the C API's "default"
        attn_ladder.attention(q, k, v, rung="05_fa2_reordered", scale=1e-46)
    with pytest.raises(ValueError, match="fp32"):
        attn_ladder.attention(q, k, v, rung="05_fa2_reordered", scale=1e39)


def test_library_path_prefers_the_environment(monkeypatch, tmp_path):
    lib = tmp_path / "libattn_ladder.so"
    monkeypatch.setenv("ATTN_LADDER_LIB", str(lib))
    assert attn_ladder.library_path() == lib


def test_rung_info():
    info = attn_ladder.rung_info("05_fa2_reordered")
    assert set(info["dtypes"]) == {"bf16", "fp16"}
    assert 128 in info["head_dims"] and info["writes_lse"] and info["gqa"]
    assert attn_ladder.rung_info("06d_fa3")["min_sm"] == 90
