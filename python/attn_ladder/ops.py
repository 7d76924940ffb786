"""attention(): the ladder's rungs as one PyTorch operator, attn_ladder::attention.

Two definitions of the same operators (attention, attention_backward, attention_e4m3,
decode_paged), with the same schemas, checks and messages:
- in C++ (ladder/torch_op.cpp, libattn_ladder_torch.so beside libattn_ladder.so), loaded with
  torch.ops.load_library when it was built against this very torch (CMake builds it when it
  finds torch: the repository's build, or `pip install --no-build-isolation .`). A call
  crosses into C++ once; checks, allocations, launch and autograd's node stay there, as for
  SDPA. BACKEND == "c++".
- in Python (torch.library.custom_op over the ctypes binding, _capi.run), the fallback when
  that library is absent, built for another torch, or ATTN_LADDER_TORCH_OP=0. BACKEND ==
  "python": the same behaviour at a higher host cost per call (Python is entered for the
  operator's autograd, its kernel and the binding).

Either way torch.compile(fullgraph=True) traces the operator (the fake implementations below
give the output shapes and dtypes without running anything) and CUDA graphs capture it (the
rung is only enqueued, its workspace comes from PyTorch's caching allocator). Autograd: the
rungs with a backward pass (has_backward: 04_fa1_tiled, 05_fa2_reordered and its backward
ablations) differentiate O through attn_ladder::attention_backward, which recomputes P from
the saved lse; asking for a gradient through any other rung raises a clear error where the
operator's autograd is set up (eagerly before running, or where a compiled graph is traced)
instead of silently stopping the gradient. The lse output is not differentiable (marked so;
attention() also returns it detached).
"""

import math
import os
import re
import warnings

import torch

from . import _capi

_NAME = "attn_ladder::attention"


def has_backward(rung, d=None, fp8=False):
    """Whether autograd can differentiate `rung` (at head dim d, if given)."""
    dims = [] if fp8 else _capi.backward_head_dims(rung)
    return bool(dims) and (d is None or d in dims)


def _no_backward_message(rung, d, fp8):  # ladder/torch_op.cpp's no_backward_message says the same
    dims = [] if fp8 else _capi.backward_head_dims(rung)
    why = (f"has a backward pass for d in {dims} only, not d = {d}" if dims else
           "has no backward pass (the FP8 path is forward only)" if fp8 else "has no backward pass")
    with_backward = ", ".join(r for r in _capi.rungs() if _capi.backward_head_dims(r))
    return (f"attn_ladder: rung '{rung}' {why}; differentiate through one that has ({with_backward}), "
            "or run it under torch.no_grad() / on tensors that do not require grad")


# The fake implementations (both definitions): output shapes and dtypes, nothing run.
def _fake_attention(q, k, v, rung, causal, scale, fp8):
    B, H, Nq, _ = q.shape
    return torch.empty_like(q), q.new_empty((B, H, Nq), dtype=torch.float32)


def _fake_attention_backward(q, k, v, o, lse, dout, rung, causal, scale):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _fake_decode_paged(q, k_cache, v_cache, block_table, seq_lens, causal, scale):
    B, H, Nq, _ = q.shape
    return torch.empty_like(q), q.new_empty((B, H, Nq), dtype=torch.float32)


def _fake_attention_e4m3(q, k, v, q_descale, k_descale, v_descale, rung, causal, scale):
    B, H, Nq, _ = q.shape
    return q.new_empty(q.shape, dtype=torch.bfloat16), q.new_empty((B, H, Nq), dtype=torch.float32)


def _load_cpp_operators():
    """Loads libattn_ladder_torch.so from the folder of the C library that _capi loads; its path,
    or None (then the operators are defined in Python)."""
    if os.environ.get("ATTN_LADDER_TORCH_OP", "1") == "0":
        return None
    path = _capi.library_path().parent / "libattn_ladder_torch.so"
    stamp = path.with_suffix(".version")  # the torch.__version__ it was compiled against
    if not (path.is_file() and stamp.is_file()):
        return None
    built_for = stamp.read_text().strip()
    if built_for != torch.__version__:  # another ABI: loading it could crash, not fail
        warnings.warn(f"attn_ladder: {path} was built for torch {built_for}, this is {torch.__version__}: "
                      "using the Python operator (slower per call); rebuild to get the C++ one", stacklevel=3)
        return None
    try:
        _capi._load()  # first: the operator's library then binds to this one (same soname)
        torch.ops.load_library(str(path))
    except OSError as e:
        warnings.warn(f"attn_ladder: could not load {path} ({e}): using the Python operator", stacklevel=3)
        return None
    return path


def _define_in_python():
    """The operators with torch.library.custom_op over the ctypes binding: (attention,
    attention_backward, attention_e4m3)."""

    # No device_types: tensors on any other device reach _capi.run, whose checks raise
    # ValueError (a CUDA-only registration made the dispatcher raise NotImplementedError first).
    @torch.library.custom_op(_NAME, mutates_args=())
    def attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rung: str, causal: bool, scale: float,
                     fp8: bool) -> tuple[torch.Tensor, torch.Tensor]:
        return _capi.run(rung, q, k, v, causal=causal, scale=scale, return_lse=True, fp8=fp8)

    @torch.library.custom_op(_NAME + "_backward", mutates_args=(), device_types="cuda")
    def backward_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
                    dout: torch.Tensor, rung: str, causal: bool,
                    scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return _capi.run_backward(rung, q, k, v, o, lse, dout, causal=causal, scale=scale)

    def backward(ctx, grad_o, grad_lse):  # only for rungs with a backward (save_for_backward refuses others)
        q, k, v, o, lse = ctx.saved_tensors
        # dL/dO as it comes (a training step's is transposed): the operator reads it in place
        # where the rung takes strides, else copies it (_capi.dout_for, on the real tensors)
        dq, dk, dv = backward_op(q, k, v, o, lse, grad_o, ctx.rung, ctx.causal, ctx.scale)
        return dq, dk, dv, None, None, None, None

    # Runs only when q, k or v requires grad (and grad mode is on), eagerly or where AOTAutograd
    # traces a compiled graph: the refusal of a rung without a backward lives here, so it holds
    # for the operator called directly and under torch.compile.
    def save_for_backward(ctx, inputs, output):
        q, k, v, rung, causal, scale, fp8 = inputs
        if not has_backward(rung, q.shape[-1], fp8):
            raise RuntimeError(_no_backward_message(rung, q.shape[-1], fp8))
        ctx.rung, ctx.causal, ctx.scale = rung, causal, scale
        ctx.mark_non_differentiable(output[1])  # lse: its gradient would be dropped
        ctx.save_for_backward(q, k, v, *output)

    attention_op.register_autograd(backward, setup_context=save_for_backward)

    # The same on e4m3 inputs with their descales (the rung "06_fp8_e4m3"): an operator of its
    # own, so that neither schema has optional tensors.
    @torch.library.custom_op(_NAME + "_e4m3", mutates_args=())
    def e4m3_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_descale: torch.Tensor, k_descale: torch.Tensor,
                v_descale: torch.Tensor, rung: str, causal: bool, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
        return _capi.run(rung, q, k, v, causal=causal, scale=scale, return_lse=True,
                         descale=(q_descale, k_descale, v_descale))

    def refuse_e4m3_gradient(ctx, inputs, output):
        raise RuntimeError(_no_backward_message(inputs[6], None, True))

    def no_backward(ctx, *grads):  # not reached: refuse_e4m3_gradient refuses first
        raise RuntimeError("attn_ladder: the e4m3 operator has no backward pass")

    e4m3_op.register_autograd(no_backward, setup_context=refuse_e4m3_gradient)

    # Decode from a paged KV cache: forward only (no autograd registered: an inference step).
    @torch.library.custom_op(_NAME.replace("attention", "decode_paged"), mutates_args=())
    def decode_paged_op(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
                        seq_lens: torch.Tensor, causal: bool, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
        return _capi.decode_paged(q, k_cache, v_cache, block_table, seq_lens, causal=causal, scale=scale)

    return attention_op, backward_op, e4m3_op, decode_paged_op


_CPP_LIBRARY = _load_cpp_operators()
BACKEND = "c++" if _CPP_LIBRARY else "python"
if _CPP_LIBRARY:
    _attention = torch.ops.attn_ladder.attention.default
    _attention_backward = torch.ops.attn_ladder.attention_backward.default
    _attention_e4m3 = torch.ops.attn_ladder.attention_e4m3.default
    _decode_paged = torch.ops.attn_ladder.decode_paged.default
else:
    _attention, _attention_backward, _attention_e4m3, _decode_paged = _define_in_python()
torch.library.register_fake(_NAME, _fake_attention)
torch.library.register_fake(_NAME + "_backward", _fake_attention_backward)
torch.library.register_fake(_NAME + "_e4m3", _fake_attention_e4m3)
torch.library.register_fake("attn_ladder::decode_paged", _fake_decode_paged)

# The C++ operator's refusals: "attn_ladder '<rung>' failed (<what>): <message>" (_capi's words).
_FAILED = re.compile(r"attn_ladder '[^']*' failed \(([^)]*)\)")
_CODES = {name: code for code, name in _capi._CODE_NAMES.items()}


def _ladder_error(e):
    """The C++ operator's RuntimeError as the AttnLadderError that _capi raises (None if it is
    another error)."""
    m = _FAILED.match(str(e))
    code = _CODES.get(m.group(1)) if m else None
    return _capi.AttnLadderError(code, str(e)) if code else None


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
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    if descale is not None and not (isinstance(descale, (tuple, list)) and len(descale) == 3):
        raise ValueError("descale must be (q_descale, k_descale, v_descale)")
    if _CPP_LIBRARY:
        # Nothing but the call: the C++ operator checks, refuses a gradient request through a
        # rung without a backward pass, allocates and launches. Two of its refusals are made
        # here first, in its words (plain comparisons, so torch.compile traces them): on an
        # H200 (torch 2.11) a scale that fp32 cannot hold crashed the process (SIGSEGV) inside
        # the C++ call, where it should have raised ValueError; the cause is not found yet (the
        # same throw raised ValueError with CPU tensors on a machine without a GPU).
        for name, t in (("q", q), ("k", k), ("v", v)):
            if not t.is_cuda:
                raise ValueError(f"{name} must be on a CUDA device, got {t.device}")
        _capi._check_scale(scale)
        try:
            if descale is None:
                o, lse = _attention(q, k, v, rung, bool(causal), float(scale), bool(fp8))
            else:
                o, lse = _attention_e4m3(q, k, v, *descale, rung, bool(causal), float(scale))
        except RuntimeError as e:
            error = _ladder_error(e)
            if error is None:
                raise
            raise error from None
        return (o, lse.detach()) if return_lse else o
    needs_grad = torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in (q, k, v))
    # Eagerly, refuse before running. Not while Dynamo traces: the check loads the library (file
    # and ctypes calls, which it cannot trace); the operator's setup_context refuses there.
    if needs_grad and not torch.compiler.is_compiling():
        if descale is not None or not has_backward(rung, q.shape[-1], fp8):
            raise RuntimeError(_no_backward_message(rung, q.shape[-1], fp8 or descale is not None))
    if descale is not None:
        o, lse = _attention_e4m3(q, k, v, *descale, rung, bool(causal), float(scale))
    else:
        o, lse = _attention(q, k, v, rung, bool(causal), float(scale), bool(fp8))
    return (o, lse.detach()) if return_lse else o



def _check_paged_tables(block_table, seq_lens, page_size, num_pages):
    """Eagerly, before either operator: the refusals the kernel's fault records would give after
    the run (fa2_decode.h: paged_error_message), in its words, with one synchronization. The
    operators themselves do not synchronize after the kernel (a C++ ValueError raised there
    crashed the process on an H200 with torch 2.11, as the bad-scale one did: see attention);
    where this check is skipped (a graph being captured, torch.compile) the kernel still never
    reads a bad page. block_table and seq_lens have passed _capi._check_paged_inputs."""
    max_pages = block_table.shape[1]
    lens = seq_lens.to(torch.int64)
    used_pages = (lens.clamp(min=0) + page_size - 1) // page_size
    used = torch.arange(max_pages, device=block_table.device)[None, :] < used_pages[:, None]
    bad_page = used & ((block_table < 0) | (block_table >= num_pages))
    negative, beyond = lens < 0, lens > max_pages * page_size
    if not bool(negative.any() | beyond.any() | bad_page.any()):
        return
    tail = "; nothing was run"
    if bool(negative.any()):
        b = int(negative.nonzero()[0, 0])
        raise ValueError(f"bad paged KV cache: seq_lens[{b}] = {int(lens[b])} is negative{tail}")
    if bool(beyond.any()):
        b = int(beyond.nonzero()[0, 0])
        raise ValueError(f"bad paged KV cache: seq_lens[{b}] = {int(lens[b])} is beyond the {max_pages} pages of "
                         f"{page_size} tokens the block table gives ({max_pages * page_size} tokens){tail}")
    b, j = (int(x) for x in bad_page.nonzero()[0])
    raise ValueError(f"bad paged KV cache: block_table[{b}][{j}] = {int(block_table[b, j])} is not a page index "
                     f"in [0, {num_pages}){tail}")


def decode_paged(q, k_cache, v_cache, block_table, seq_lens, causal=False, scale=None, return_lse=False):
    """One decode step from a paged KV cache, as the operator attn_ladder::decode_paged.

    q: [B, H, Nq, d], Nq <= 64 (bfloat16 or float16, d 64 or 128); k_cache, v_cache:
    [num_pages, page_size, Hkv, d] (vLLM's and FlashAttention's layout: one token's Hkv * d
    elements contiguous); block_table: int32 [B, max_pages], sequence b's token n in page
    block_table[b, n // page_size] (entries past its length are never read); seq_lens: int32
    [B], 0 <= seq_lens[b] <= max_pages * page_size. causal: bottom-right per sequence, query row
    i sees key j iff j <= i + seq_lens[b] - Nq. Returns o (like q), and lse fp32 [B, H, Nq] when
    return_lse. torch.compile traces it; a CUDA graph captures it and replays it with new
    block_table and seq_lens contents (the grid is sized for max_pages * page_size keys).

    Bad tables: a negative length, one beyond the pages, or a page index outside
    [0, num_pages) among the pages a length uses raises ValueError naming it, before the run
    (this synchronizes the stream), except while a graph is captured or torch.compile traces,
    where nothing may synchronize: there the kernel never dereferences a bad page and that
    sequence's o is NaN.
    """
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    # Both operators refuse bad shapes themselves and never read a bad page (that sequence's o
    # is NaN); a bad table or length is refused here, eagerly, before the run: the one place
    # that reads the tables on the host (see _check_paged_tables).
    if not torch.compiler.is_compiling():
        _capi._check_scale(scale)
        _capi._check_paged_inputs(q, k_cache, v_cache, block_table, seq_lens)
        if not torch.cuda.is_current_stream_capturing():  # reading the tables synchronizes
            _check_paged_tables(block_table, seq_lens, k_cache.shape[1], k_cache.shape[0])
    try:
        o, lse = _decode_paged(q, k_cache, v_cache, block_table, seq_lens, bool(causal), float(scale))
    except RuntimeError as e:
        error = _ladder_error(e)
        if error is None:
            raise
        raise error from None
    return (o, lse) if return_lse else o
