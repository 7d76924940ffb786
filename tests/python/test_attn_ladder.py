#!/usr/bin/env python3
"""GPU test of python/attn_ladder.py: every registered rung against PyTorch SDPA.

The reference is SDPA's math backend on fp32 copies of the same bf16/fp16 inputs, with an
explicit bottom-right causal mask; rows that see no key are zero, as the ladder defines.
Bound: relative Frobenius error 1e-2 (bf16) / 3e-3 (fp16) / 1e-1 (fp8), as common/tolerance.h.
A rung may refuse a problem it does not support (code 1, printed); it must run at least
one. Bad input (d = 80, mismatched shapes, unknown rung) must raise with a message.

Plain script, no pytest: exit 0 = pass, 1 = failure, 77 = skipped (reason printed).
"""

import math
import pathlib
import sys

SKIP = 77
TOLERANCE = {"bf16": 1e-2, "fp16": 3e-3, "fp8": 1e-1}  # common/tolerance.h
# logsumexp is fp32 from the same inputs: only rounding differs; e4m3 scores err by ~0.05
# per score, kept whole by rows that see few keys (common/tolerance.h, lse_tolerance)
LSE_ABS_TOLERANCE = {"bf16": 2e-2, "fp16": 2e-2, "fp8": 0.3}
SEED = 0

# (B, H, Hkv, Nq, Nk, d, causal): odd length, causal, GQA, Nq < Nk and Nq > Nk (empty rows).
SHAPES = [
    (1, 2, 2, 113, 113, 64, False),
    (2, 3, 3, 113, 113, 128, True),
    (1, 8, 2, 256, 256, 64, False),
    (1, 4, 1, 200, 200, 128, True),
    (1, 2, 2, 64, 200, 128, True),
    (1, 2, 2, 200, 64, 64, True),
]


def skip(reason):
    print(f"SKIP: {reason}")
    sys.exit(SKIP)


try:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
except ImportError as e:
    skip(f"torch is not installed ({e})")
if not torch.cuda.is_available():
    skip("no CUDA GPU visible to torch")

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "python"))
import attn_ladder  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def visible_mask(Nq, Nk, causal, device):
    """[Nq, Nk] bool: query row i sees key j iff j <= i + (Nk - Nq) (bottom-right causal)."""
    if not causal:
        return torch.ones(Nq, Nk, dtype=torch.bool, device=device)
    i = torch.arange(Nq, device=device)[:, None]
    j = torch.arange(Nk, device=device)[None, :]
    return j <= i + (Nk - Nq)


def reference(q, k, v, causal):
    """fp32 SDPA (math backend) on upcast inputs; rows without a visible key are O = 0."""
    H, Hkv, Nq, Nk = q.shape[1], k.shape[1], q.shape[2], k.shape[2]
    kf = k.float().repeat_interleave(H // Hkv, dim=1)
    vf = v.float().repeat_interleave(H // Hkv, dim=1)
    mask = visible_mask(Nq, Nk, causal, q.device)
    with sdpa_kernel(SDPBackend.MATH):
        o = F.scaled_dot_product_attention(q.float(), kf, vf, attn_mask=mask)
    has_key = mask.any(dim=1)[None, None, :, None]
    o = torch.where(has_key, o, torch.zeros_like(o))
    scores = (q.float() @ kf.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    lse = torch.logsumexp(scores.masked_fill(~mask, float("-inf")), dim=-1)
    return o, lse


def rel_error(x, ref):
    return (torch.linalg.vector_norm((x.float() - ref).flatten()) / torch.linalg.vector_norm(ref.flatten())).item()


def lse_error(lse, ref):
    """Max abs error on finite entries; inf if the -inf pattern (rows with no key) differs."""
    if not torch.equal(torch.isneginf(lse), torch.isneginf(ref)):
        return math.inf
    finite = torch.isfinite(ref)
    return (lse[finite] - ref[finite]).abs().max().item() if finite.any() else 0.0


def expected_refusal(rung, H, Hkv, Nq, d):
    """Whether the rung may refuse this problem: what rung_info declares it does not run (a
    head dim, GQA), or a decode rung's query rows past its one tile (Nq > 64)."""
    info = attn_ladder.rung_info(rung)
    return d not in info["head_dims"] or (Hkv != H and not info["gqa"]) or ("decode" in rung and Nq > 64)


def check_rung(rung, failures):
    if attn_ladder.rung_info(rung)["dtypes"] == ["e4m3"]:
        print("  skipped: takes e4m3 inputs with their descales (tests/python/test_op.py runs it)")
        return
    ran = 0
    # The FP8 rungs take bf16 tensors and quantize them themselves (run(..., fp8=True)).
    modes = {"fp8": torch.bfloat16} if "fp8" in rung else DTYPES
    for dtype_name, dtype in modes.items():
        for B, H, Hkv, Nq, Nk, d, causal in SHAPES:
            label = f"{rung} {dtype_name} B={B} H={H} Hkv={Hkv} Nq={Nq} Nk={Nk} d={d} causal={int(causal)}"
            q = torch.randn(B, H, Nq, d, device="cuda", dtype=dtype)
            k = torch.randn(B, Hkv, Nk, d, device="cuda", dtype=dtype)
            v = torch.randn(B, Hkv, Nk, d, device="cuda", dtype=dtype)
            try:
                o, lse = attn_ladder.run(rung, q, k, v, causal=causal, return_lse=True, fp8=dtype_name == "fp8")
            except attn_ladder.AttnLadderError as e:
                if e.code != 1 or not expected_refusal(rung, H, Hkv, Nq, d):
                    failures.append(f"{label}: refused a problem it declares it runs: {e}")
                else:
                    print(f"  refused  {label}: {e}")
                continue
            torch.cuda.synchronize()
            ran += 1
            o_ref, lse_ref = reference(q, k, v, causal)
            err = rel_error(o, o_ref)
            ok = torch.isfinite(o).all().item() and err <= TOLERANCE[dtype_name]
            lse_note = "lse not written"
            if attn_ladder.rung_info(rung)["writes_lse"] and torch.isnan(lse).all():
                ok, lse_note = False, "lse all NaN from a rung that declares it writes lse"
            elif not torch.isnan(lse).all():
                lse_err = lse_error(lse, lse_ref)
                lse_note = f"lse max abs err {lse_err:.2e}"
                ok = ok and lse_err <= LSE_ABS_TOLERANCE[dtype_name]
            print(f"  {'ok  ' if ok else 'FAIL'}     {label}: rel err {err:.2e}, {lse_note}")
            if not ok:
                failures.append(f"{label}: rel err {err:.3e} (bound {TOLERANCE[dtype_name]}), {lse_note}")
    if ran == 0:
        failures.append(f"{rung}: refused every test problem")


def expect_raise(label, exc_type, fn, failures, code=None):
    try:
        fn()
    except exc_type as e:
        if not str(e) or (code is not None and getattr(e, "code", None) != code):
            failures.append(f"{label}: raised {type(e).__name__} (code {getattr(e, 'code', None)}) '{e}'")
        else:
            print(f"  ok       {label}: {type(e).__name__}: {e}")
        return
    except Exception as e:  # noqa: BLE001 - any other exception type is the failure being reported
        failures.append(f"{label}: raised {type(e).__name__} instead of {exc_type.__name__}: {e}")
        return
    failures.append(f"{label}: did not raise")


def check_bad_input(rung, failures):
    q = torch.randn(1, 2, 17, 80, device="cuda", dtype=torch.bfloat16)
    expect_raise(f"{rung} d=80", attn_ladder.AttnLadderError, lambda: attn_ladder.run(rung, q, q, q), failures, code=1)
    q64 = torch.randn(1, 2, 17, 64, device="cuda", dtype=torch.bfloat16)
    k128 = torch.randn(1, 2, 17, 128, device="cuda", dtype=torch.bfloat16)
    expect_raise("mismatched head dims", ValueError, lambda: attn_ladder.run(rung, q64, k128, k128), failures)
    kv3 = torch.randn(1, 3, 17, 64, device="cuda", dtype=torch.bfloat16)
    expect_raise("Hkv not dividing H", ValueError, lambda: attn_ladder.run(rung, q64, kv3, kv3), failures)
    expect_raise("CPU tensors", ValueError, lambda: attn_ladder.run(rung, q64.cpu(), q64.cpu(), q64.cpu()), failures)
    expect_raise("fp32 tensors", ValueError, lambda: attn_ladder.run(rung, q64.float(), q64.float(), q64.float()), failures)
    expect_raise("unknown rung", attn_ladder.AttnLadderError, lambda: attn_ladder.run("no_such_rung", q64, q64, q64), failures, code=3)


def main():
    try:
        names = attn_ladder.rungs()
    except OSError as e:
        skip(f"library not loadable: {e}")
    if not names:
        skip("the library registers no rungs yet")
    torch.manual_seed(SEED)
    print(f"rungs: {', '.join(names)} on {torch.cuda.get_device_name()}")
    failures = []
    for rung in names:
        print(f"{rung}:")
        check_rung(rung, failures)
    print("bad input:")
    check_bad_input(names[0], failures)
    if failures:
        print(f"\n{len(failures)} failure(s):")
        for f in failures:
            print(f"  {f}")
        return 1
    print("\nall passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
