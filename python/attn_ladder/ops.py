"""attention(): the ladder's rungs as one PyTorch operator, attn_ladder::attention.

Registered with torch.library.custom_op, so torch.compile(fullgraph=True) traces it (the
fake implementation gives the output shapes and dtypes without running anything) and CUDA
graphs capture it (the rung is only enqueued, its workspace comes from PyTorch's caching
allocator). Autograd: the rungs with a backward pass (has_backward: 04_fa1_tiled,
05_fa2_reordered and its backward ablations) differentiate O through
attn_ladder::attention_backward, which recomputes P from the saved lse; asking for a gradient
through any other rung raises a clear error (at the call, or where the operator's autograd is
set up: compiled or called directly) instead of silently stopping the gradient. The lse output
is not differentiable (marked so; attention() also returns it detached).
"""

import math

import torch

from . import _capi

_NAME = "attn_ladder::attention"


# No device_types: tensors on any other device reach _capi.run, whose checks raise ValueError
# (a CUDA-only registration made the dispatcher raise NotImplementedError first).
@torch.library.custom_op(_NAME, mutates_args=())
def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rung: str, causal: bool, scale: float,
               fp8: bool) -> tuple[torch.Tensor, torch.Tensor]:
    return _capi.run(rung, q, k, v, causal=causal, scale=scale, return_lse=True, fp8=fp8)


@_attention.register_fake
def _(q, k, v, rung, causal, scale, fp8):
    B, H, Nq, _ = q.shape
    return torch.empty_like(q), q.new_empty((B, H, Nq), dtype=torch.float32)


@torch.library.custom_op(_NAME + "_backward", mutates_args=(), device_types="cuda")
def _attention_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
                        dout: torch.Tensor, rung: str, causal: bool,
                        scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _capi.run_backward(rung, q, k, v, o, lse, dout, causal=causal, scale=scale)


@_attention_backward.register_fake
def _(q, k, v, o, lse, dout, rung, causal, scale):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def has_backward(rung, d=None, fp8=False):
    """Whether autograd can differentiate `rung` (at head dim d, if given)."""
    dims = [] if fp8 else _capi.backward_head_dims(rung)
    return bool(dims) and (d is None or d in dims)


def _no_backward_message(rung, d, fp8):
    dims = [] if fp8 else _capi.backward_head_dims(rung)
    why = (f"has a backward pass for d in {dims} only, not d = {d}" if dims else
           "has no backward pass (the FP8 path is forward only)" if fp8 else "has no backward pass")
    with_backward = ", ".join(r for r in _capi.rungs() if _capi.backward_head_dims(r))
    return (f"attn_ladder: rung '{rung}' {why}; differentiate through one that has ({with_backward}), "
            "or run it under torch.no_grad() / on tensors that do not require grad")


def _backward(ctx, grad_o, grad_lse):  # only for rungs with a backward (_save_for_backward refuses others)
    q, k, v, o, lse = ctx.saved_tensors
    dq, dk, dv = _attention_backward(q, k, v, o, lse, grad_o.contiguous(), ctx.rung, ctx.causal, ctx.scale)
    return dq, dk, dv, None, None, None, None


# Runs only when q, k or v requires grad (and grad mode is on), eagerly or where AOTAutograd
# traces a compiled graph: the refusal of a rung without a backward lives here, so it holds
# for the operator called directly and under torch.compile.
def _save_for_backward(ctx, inputs, output):
    q, k, v, rung, causal, scale, fp8 = inputs
    if not has_backward(rung, q.shape[-1], fp8):
        raise RuntimeError(_no_backward_message(rung, q.shape[-1], fp8))
    ctx.rung, ctx.causal, ctx.scale = rung, causal, scale
    ctx.mark_non_differentiable(output[1])  # lse: its gradient would be dropped
    ctx.save_for_backward(q, k, v, *output)


_attention.register_autograd(_backward, setup_context=_save_for_backward)


def _no_backward(ctx, *grads):  # not reached: _remember_e4m3_rung refuses first
    raise RuntimeError("attn_ladder: the e4m3 operator has no backward pass")


# The same on e4m3 inputs with their descales (the rung "06_fp8_e4m3"): an operator of its
# own, so that neither schema has optional tensors.
@torch.library.custom_op(_NAME + "_e4m3", mutates_args=())
def _attention_e4m3(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_descale: torch.Tensor,
                    k_descale: torch.Tensor, v_descale: torch.Tensor, rung: str, causal: bool,
                    scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    return _capi.run(rung, q, k, v, causal=causal, scale=scale, return_lse=True,
                     descale=(q_descale, k_descale, v_descale))


@_attention_e4m3.register_fake
def _(q, k, v, q_descale, k_descale, v_descale, rung, causal, scale):
    B, H, Nq, _ = q.shape
    return q.new_empty(q.shape, dtype=torch.bfloat16), q.new_empty((B, H, Nq), dtype=torch.float32)


def _remember_e4m3_rung(ctx, inputs, output):
    raise RuntimeError(_no_backward_message(inputs[6], None, True))


_attention_e4m3.register_autograd(_no_backward, setup_context=_remember_e4m3_rung)


def attention(q, k, v, rung="06d_fa3", causal=False, scale=None, return_lse=False, fp8=False, descale=None):
    """softmax(scale · Q Kᵀ + mask) V by the named rung, as the operator attn_ladder::attention.

    q: [B, H, Nq, d]; k, v: [B, Hkv, Nk, d]; bfloat16 or float16, contiguous, one CUDA device.
    scale: default 1/sqrt(d). causal: bottom-right aligned when Nq != Nk. return_lse: also
    return the natural-log logsumexp per query row, fp32 [B, H, Nq] (NaN from a rung that does
    not write it). fp8: an FP8 rung ("06_fp8", ...) on bfloat16 inputs, quantized to e4m3
    inside. descale: with float8_e4m3fn q, k, v and rung="06_fp8_e4m3" (the operator
    attn_ladder::attention_e4m3), their fp32 descales (q_descale, k_descale, v_descale), one per
    block of rows (attn_ladder.descale_blocks); O in bfloat16. Autograd differentiates O through
    the rungs with a backward pass (has_backward); through any other, when q, k or v requires
    grad, it raises RuntimeError (eagerly here, before running; under torch.compile when the
    graph is traced). Bad tensors raise ValueError. lse is returned detached.
    """
    needs_grad = torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in (q, k, v))
    # Eagerly, refuse before running. Not while Dynamo traces: the check loads the library (file
    # and ctypes calls, which it cannot trace); the operator's setup_context refuses there.
    if needs_grad and not torch.compiler.is_compiling():
        if descale is not None or not has_backward(rung, q.shape[-1], fp8):
            raise RuntimeError(_no_backward_message(rung, q.shape[-1], fp8 or descale is not None))
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    if descale is not None:
        if not (isinstance(descale, (tuple, list)) and len(descale) == 3):
            raise ValueError("descale must be (q_descale, k_descale, v_descale)")
        o, lse = _attention_e4m3(q, k, v, *descale, rung, bool(causal), float(scale))
    else:
        o, lse = _attention(q, k, v, rung, bool(causal), float(scale), bool(fp8))
    return (o, lse.detach()) if return_lse else o
