"""ctypes binding of the C API of libattn_ladder.so (ladder/c_api.h) and run().

run() validates torch tensors, takes the workspace from torch.empty on the current stream
(PyTorch's caching allocator) and enqueues the rung with attn_run_async (attn_run_fp8_async
for float8_e4m3fn inputs and their descales): no allocation outside PyTorch, no
synchronization.

The library is found in this package's folder (a `pip install .`), else through
$ATTN_LADDER_LIB, else at <repo>/build/libattn_ladder.so (the CMake build).

Layout is PyTorch SDPA's: [B, H, N, d], contiguous. K and V may have fewer heads than Q
(grouped-query attention: query head h reads key/value head h // (H // Hkv)). Causal
masking is aligned to the bottom-right corner: query row i sees key j iff
j <= i + (Nk - Nq); a row that sees no key gets O = 0 and logsumexp = -inf.
"""

import ctypes
import math
import os
import pathlib
import threading

import torch

_PACKAGE_LIB = pathlib.Path(__file__).resolve().parent / "libattn_ladder.so"
_REPO_LIB = pathlib.Path(__file__).resolve().parents[2] / "build" / "libattn_ladder.so"

# attn_problem_t.dtype codes (ladder/c_api.h). The FP8 rungs take bf16 tensors and quantize
# them to e4m3 themselves: run(..., fp8=True) passes bf16 tensors with code _FP8. The rung on
# e4m3 inputs ("06_fp8_e4m3") takes float8_e4m3fn tensors and their descales: code _E4M3.
_DTYPE_CODES = {torch.bfloat16: 0, torch.float16: 1}
_FP8 = 2
_E4M3 = 3
_FLOAT8_E4M3 = getattr(torch, "float8_e4m3fn", None)  # torch >= 2.1

# attn_run return codes (ladder/c_api.h).
_OK, _INVALID_INPUT, _CUDA_ERROR, _UNKNOWN_RUNG = 0, 1, 2, 3
_CODE_NAMES = {_INVALID_INPUT: "invalid input", _CUDA_ERROR: "CUDA error", _UNKNOWN_RUNG: "unknown rung"}

_ERR_LEN = 2048  # bytes of the error message buffer handed to attn_run
_INT32_MAX = 2**31 - 1  # the C API takes sizes as int


class AttnLadderError(RuntimeError):
    """A nonzero return of attn_run; `code` is 1 invalid input, 2 CUDA error, 3 unknown rung."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code


class _RungInfo(ctypes.Structure):
    """attn_rung_info_t, field for field."""

    _fields_ = [
        ("dtypes", ctypes.c_int),
        ("head_dims", ctypes.c_int * 8),  # ATTN_MAX_HEAD_DIMS
        ("num_head_dims", ctypes.c_int),
        ("writes_lse", ctypes.c_int),
        ("gqa", ctypes.c_int),
        ("min_sm", ctypes.c_int),
    ]


class _Problem(ctypes.Structure):
    """attn_problem_t, field for field."""

    _fields_ = [
        ("B", ctypes.c_int),
        ("H", ctypes.c_int),
        ("Hkv", ctypes.c_int),
        ("Nq", ctypes.c_int),
        ("Nk", ctypes.c_int),
        ("d", ctypes.c_int),
        ("causal", ctypes.c_int),
        ("dtype", ctypes.c_int),
        ("scale", ctypes.c_float),  # 0 = 1/sqrt(d)
    ]


class _PagedProblem(ctypes.Structure):
    """attn_paged_problem_t, field for field."""

    _fields_ = [
        ("B", ctypes.c_int),
        ("H", ctypes.c_int),
        ("Hkv", ctypes.c_int),
        ("Nq", ctypes.c_int),
        ("d", ctypes.c_int),
        ("num_pages", ctypes.c_int),
        ("page_size", ctypes.c_int),
        ("max_pages", ctypes.c_int),
        ("causal", ctypes.c_int),
        ("dtype", ctypes.c_int),
        ("scale", ctypes.c_float),  # 0 = 1/sqrt(d)
    ]


_lib = None

# The current stream's cudaStream_t as an int, without building a torch.cuda.Stream object
# (what torch.compile's generated code calls); torch.cuda.current_stream() where it is absent.
_RAW_STREAM = getattr(torch._C, "_cuda_getCurrentRawStream", None)
_CURRENT_DEVICE = getattr(torch._C, "_cuda_getDevice", None)
_local = threading.local()  # one error buffer per thread, reused call after call


def _stream(device):
    return _RAW_STREAM(device.index) if _RAW_STREAM else torch.cuda.current_stream(device).cuda_stream


def _err():
    """This thread's error buffer, emptied (the library writes a message only on failure)."""
    err = getattr(_local, "err", None)
    if err is None:
        err = _local.err = ctypes.create_string_buffer(_ERR_LEN)
    err[0] = b"\0"
    return err


def _on_device(device, call, *args):
    """call(*args) with `device` current (the library runs on the current CUDA device); no
    device switch, the usual case, when it already is."""
    if _CURRENT_DEVICE is not None and _CURRENT_DEVICE() == device.index:
        return call(*args)
    with torch.cuda.device(device):
        return call(*args)


def library_path():
    """Where the shared library is loaded from: $ATTN_LADDER_LIB if set, else the package's own,
    else <repo>/build/."""
    if os.environ.get("ATTN_LADDER_LIB"):
        return pathlib.Path(os.environ["ATTN_LADDER_LIB"])
    return _PACKAGE_LIB if _PACKAGE_LIB.is_file() else _REPO_LIB


def _load():
    global _lib
    if _lib is not None:
        return _lib
    path = library_path()
    if not path.is_file():
        raise OSError(
            f"attn_ladder library not found at {path}: `pip install .` in the repository, or build "
            "it with `cmake --preset default && cmake --build --preset default` there, "
            "or point $ATTN_LADDER_LIB at libattn_ladder.so"
        )
    lib = ctypes.CDLL(str(path))
    lib.attn_num_rungs.argtypes = []
    lib.attn_num_rungs.restype = ctypes.c_int
    lib.attn_rung_name.argtypes = [ctypes.c_int]
    lib.attn_rung_name.restype = ctypes.c_char_p
    lib.attn_run.argtypes = [
        ctypes.c_char_p,  # rung
        ctypes.POINTER(_Problem),
        ctypes.c_void_p,  # q
        ctypes.c_void_p,  # k
        ctypes.c_void_p,  # v
        ctypes.c_void_p,  # o
        ctypes.c_void_p,  # lse (float*, may be null)
        ctypes.c_void_p,  # cudaStream_t
        ctypes.c_char_p,  # err
        ctypes.c_size_t,  # err_len
    ]
    lib.attn_run.restype = ctypes.c_int
    lib.attn_workspace_bytes.argtypes = [
        ctypes.c_char_p,  # rung
        ctypes.POINTER(_Problem),
        ctypes.POINTER(ctypes.c_size_t),
        ctypes.c_char_p,  # err
        ctypes.c_size_t,  # err_len
    ]
    lib.attn_workspace_bytes.restype = ctypes.c_int
    lib.attn_run_async.argtypes = lib.attn_run.argtypes[:7] + [
        ctypes.c_void_p,  # workspace
        ctypes.c_size_t,  # workspace_bytes
    ] + lib.attn_run.argtypes[7:]
    lib.attn_run_async.restype = ctypes.c_int
    lib.attn_rung_info.argtypes = [ctypes.c_char_p, ctypes.POINTER(_RungInfo), ctypes.c_char_p, ctypes.c_size_t]
    lib.attn_rung_info.restype = ctypes.c_int
    lib.attn_descale_blocks.argtypes = [
        ctypes.c_char_p,  # rung
        ctypes.POINTER(_Problem),
        ctypes.POINTER(ctypes.c_int),  # q_rows
        ctypes.POINTER(ctypes.c_int),  # kv_rows
        ctypes.c_char_p,  # err
        ctypes.c_size_t,  # err_len
    ]
    lib.attn_descale_blocks.restype = ctypes.c_int
    lib.attn_run_fp8_async.argtypes = lib.attn_run.argtypes[:5] + [
        ctypes.c_void_p,  # q_descale
        ctypes.c_void_p,  # k_descale
        ctypes.c_void_p,  # v_descale
    ] + lib.attn_run_async.argtypes[5:]
    lib.attn_run_fp8_async.restype = ctypes.c_int
    if hasattr(lib, "attn_run_backward_async"):  # the backward pass (a library built before it has none)
        lib.attn_backward_info.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int),
                                           ctypes.c_char_p, ctypes.c_size_t]
        lib.attn_backward_info.restype = ctypes.c_int
        lib.attn_backward_workspace_bytes.argtypes = lib.attn_workspace_bytes.argtypes
        lib.attn_backward_workspace_bytes.restype = ctypes.c_int
        lib.attn_run_backward_async.argtypes = lib.attn_run.argtypes[:7] + [  # rung, problem, q, k, v, o, lse
            ctypes.c_void_p,  # dout
            ctypes.c_void_p,  # dq
            ctypes.c_void_p,  # dk
            ctypes.c_void_p,  # dv
        ] + lib.attn_run_async.argtypes[7:]  # workspace, workspace_bytes, stream, err, err_len
        lib.attn_run_backward_async.restype = ctypes.c_int
    if hasattr(lib, "attn_run_backward_strided_async"):  # dout with its own strides (06o's-06q's backward)
        lib.attn_backward_strided_dout.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_int), ctypes.c_char_p,
                                                   ctypes.c_size_t]
        lib.attn_backward_strided_dout.restype = ctypes.c_int
        lib.attn_run_backward_strided_async.argtypes = lib.attn_run_backward_async.argtypes[:8] + [
            ctypes.POINTER(ctypes.c_int64),  # dout_strides (batch, head, row)
        ] + lib.attn_run_backward_async.argtypes[8:]
        lib.attn_run_backward_strided_async.restype = ctypes.c_int
    if hasattr(lib, "attn_decode_paged_async"):  # the paged decode (a library built before it has none)
        lib.attn_decode_paged_workspace_bytes.argtypes = [ctypes.POINTER(_PagedProblem),
                                                          ctypes.POINTER(ctypes.c_size_t), ctypes.c_char_p,
                                                          ctypes.c_size_t]
        lib.attn_decode_paged_workspace_bytes.restype = ctypes.c_int
        lib.attn_decode_paged_async.argtypes = [
            ctypes.POINTER(_PagedProblem),
            ctypes.c_void_p,  # q
            ctypes.c_void_p,  # k_cache
            ctypes.c_void_p,  # v_cache
            ctypes.c_void_p,  # block_table
            ctypes.c_void_p,  # seq_lens
            ctypes.c_void_p,  # o
            ctypes.c_void_p,  # lse
            ctypes.c_void_p,  # workspace
            ctypes.c_size_t,  # workspace_bytes
            ctypes.c_void_p,  # cudaStream_t
            ctypes.c_char_p,  # err
            ctypes.c_size_t,  # err_len
        ]
        lib.attn_decode_paged_async.restype = ctypes.c_int
    _lib = lib
    return lib


def rungs():
    """The registered rung names, in ladder order."""
    lib = _load()
    return [lib.attn_rung_name(i).decode() for i in range(lib.attn_num_rungs())]


_info_cache = {}


def rung_info(rung):
    """What `rung` accepts: {"dtypes": [...], "head_dims": [...], "writes_lse", "gqa", "min_sm"}."""
    if rung not in _info_cache:
        lib = _load()
        info, err = _RungInfo(), ctypes.create_string_buffer(_ERR_LEN)
        _raise_unless_ok(lib.attn_rung_info(rung.encode(), ctypes.byref(info), err, _ERR_LEN), rung, err)
        names = ["bf16", "fp16", "fp8", "e4m3"]
        _info_cache[rung] = {
            "dtypes": [n for c, n in enumerate(names) if info.dtypes >> c & 1],
            "head_dims": list(info.head_dims[: info.num_head_dims]),
            "writes_lse": bool(info.writes_lse),
            "gqa": bool(info.gqa),
            "min_sm": info.min_sm,
        }
    return _info_cache[rung]


def _check_inputs(q, k, v):
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D [B, H, N, d], got shape {tuple(t.shape)}")
        if not t.is_cuda:
            raise ValueError(f"{name} must be on a CUDA device, got {t.device}")
        if t.dtype not in _DTYPE_CODES and t.dtype != _FLOAT8_E4M3:
            raise ValueError(f"{name} must be bfloat16, float16 or float8_e4m3fn, got {t.dtype}")
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous [B, H, N, d] (call .contiguous())")
        if max(t.shape) > _INT32_MAX:
            raise ValueError(f"{name} has a dimension above 2^31 - 1: {tuple(t.shape)}")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    B, H, _, d = q.shape
    Bk, Hkv, _, dk = k.shape
    if Bk != B:
        raise ValueError(f"batch sizes differ: q has B={B}, k/v have B={Bk}")
    if dk != d:
        raise ValueError(f"head dims differ: q has d={d}, k/v have d={dk}")
    if Hkv < 1 or H % Hkv != 0:
        raise ValueError(f"k/v heads (Hkv={Hkv}) must divide q heads (H={H})")


def descale_blocks(rung, q, k):
    """(q_rows, kv_rows): how many rows of q [B, H, Nq, d], and keys of k and v [B, Hkv, Nk, d],
    share one descale in `rung` (one taking float8_e4m3fn inputs, as "06_fp8_e4m3"). Its
    descales are then fp32 [B, H, ceil(Nq / q_rows)] (q) and [B, Hkv, ceil(Nk / kv_rows)] (k, v)."""
    lib = _load()
    B, H, Nq, d = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    problem = _Problem(B, H, Hkv, Nq, Nk, d, 0, _E4M3, 0.0)
    q_rows, kv_rows, err = ctypes.c_int(0), ctypes.c_int(0), ctypes.create_string_buffer(_ERR_LEN)
    _raise_unless_ok(lib.attn_descale_blocks(rung.encode(), ctypes.byref(problem), ctypes.byref(q_rows),
                                             ctypes.byref(kv_rows), err, _ERR_LEN), rung, err)
    return q_rows.value, kv_rows.value


def _check_descale(rung, q, k, descale):
    if not (isinstance(descale, (tuple, list)) and len(descale) == 3):
        raise ValueError("float8_e4m3fn q, k, v take descale=(q_descale, k_descale, v_descale), fp32 tensors of "
                         f"one scale per block of rows (attn_ladder.descale_blocks('{rung}', q, k))")
    q_rows, kv_rows = descale_blocks(rung, q, k)
    (B, H, Nq, _), (Hkv, Nk) = q.shape, k.shape[1:3]
    q_shape, kv_shape = (B, H, -(-Nq // q_rows)), (B, Hkv, -(-Nk // kv_rows))
    for name, t, shape in zip(("q_descale", "k_descale", "v_descale"), descale, (q_shape, kv_shape, kv_shape)):
        if not isinstance(t, torch.Tensor) or t.dtype != torch.float32:
            raise ValueError(f"{name} must be a float32 tensor, got {getattr(t, 'dtype', type(t).__name__)}")
        if tuple(t.shape) != shape:
            raise ValueError(f"{name} must have shape {shape} (one scale per block of rows for '{rung}'; "
                             f"repeat a per-tensor or per-head scale), got {tuple(t.shape)}")
        if t.device != q.device or not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous on {q.device}, got {t.device}"
                             f"{'' if t.is_contiguous() else ', not contiguous'}")


_FP32_MIN_POSITIVE = 2.0 ** -149  # fp32's smallest subnormal
_FP32_MAX = (2.0 - 2.0 ** -23) * 2.0 ** 127


def _check_scale(scale):
    """None (1/sqrt(d)) or a positive scale that stays positive and finite in fp32: the C API
    reads 0 as 'the default', so a scale that rounds to 0 must not reach it."""
    if scale is None:
        return
    # Plain comparisons (no ctypes round trip), so that torch.compile traces through it: the
    # smallest positive fp32 (a subnormal) and the largest finite one bound what survives.
    if not (_FP32_MIN_POSITIVE <= scale <= _FP32_MAX):
        raise ValueError(f"scale must be positive and finite in fp32 (None means 1/sqrt(d)), got {scale}")


def run(rung, q, k, v, causal=False, scale=None, return_lse=False, fp8=False, descale=None):
    """O = softmax(scale * Q K^T + mask) V by the named rung; returns O (and lse if asked).

    q: [B, H, Nq, d]; k, v: [B, Hkv, Nk, d]; bf16 or fp16, contiguous, one CUDA device.
    scale: softmax scale, default 1/sqrt(d). return_lse: also return the natural-log
    logsumexp per query row, fp32 [B, H, Nq] (left NaN by a rung that does not write it).
    fp8: run an FP8 rung ("06_fp8", "06_fp8_no_hadamard", ...): q, k, v must be bfloat16;
    the rung quantizes them to e4m3 (with its workspace) and returns O in bfloat16.
    descale: with float8_e4m3fn q, k, v (the rung "06_fp8_e4m3", FlashAttention-3's FP8
    interface): (q_descale, k_descale, v_descale), fp32, one positive scale per block of rows
    (descale_blocks(rung, q, k)), so that Q = q_descale * q on each block; used as
    given (no Hadamard inside); O in bfloat16.
    Runs on torch.cuda.current_stream(). Raises ValueError for bad tensors and
    AttnLadderError (a RuntimeError) with the library's message when the rung refuses
    the problem or CUDA fails.
    """
    if not isinstance(rung, str):
        raise ValueError(f"rung must be a name (str), got {type(rung).__name__}")
    _check_inputs(q, k, v)
    e4m3 = q.dtype == _FLOAT8_E4M3
    if fp8 and q.dtype != torch.bfloat16:
        raise ValueError(f"fp8=True takes bfloat16 q, k, v (quantized to e4m3 by the rung), got {q.dtype}")
    if e4m3:
        _check_descale(rung, q, k, descale)
    elif descale is not None:
        raise ValueError(f"descale goes with float8_e4m3fn q, k, v, got {q.dtype}")
    _check_scale(scale)
    lib = _load()

    B, H, Nq, d = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    code = _E4M3 if e4m3 else _FP8 if fp8 else _DTYPE_CODES[q.dtype]
    problem = _Problem(B, H, Hkv, Nq, Nk, d, int(bool(causal)), code, float(scale or 0.0))
    o = torch.empty(q.shape, dtype=torch.bfloat16, device=q.device) if e4m3 else torch.empty_like(q)
    lse = None
    if return_lse:  # a rung that writes no lse leaves NaN
        lse_shape = (B, H, Nq)
        lse = (torch.empty(lse_shape, dtype=torch.float32, device=q.device) if rung_info(rung)["writes_lse"]
               else torch.full(lse_shape, float("nan"), dtype=torch.float32, device=q.device))
    err, rung_c, need = _err(), rung.encode(), ctypes.c_size_t(0)

    def launch():
        _raise_unless_ok(lib.attn_workspace_bytes(rung_c, ctypes.byref(problem), ctypes.byref(need), err, _ERR_LEN),
                         rung, err)
        # The workspace comes from PyTorch's caching allocator on the current stream, and the
        # launch is only enqueued: no cudaMalloc, no synchronization.
        workspace = torch.empty(need.value, dtype=torch.uint8, device=q.device) if need.value else None
        tail = (
            o.data_ptr(),
            lse.data_ptr() if lse is not None else None,
            workspace.data_ptr() if workspace is not None else None,
            need.value,
            _stream(q.device),
            err,
            _ERR_LEN,
        )
        if e4m3:
            return lib.attn_run_fp8_async(rung_c, ctypes.byref(problem), q.data_ptr(), k.data_ptr(), v.data_ptr(),
                                          *(t.data_ptr() for t in descale), *tail)
        return lib.attn_run_async(rung_c, ctypes.byref(problem), q.data_ptr(), k.data_ptr(), v.data_ptr(), *tail)

    rc = _on_device(q.device, launch)  # sizes too depend on the device (05_fa2_decode's SM count)
    _raise_unless_ok(rc, rung, err)
    return (o, lse) if return_lse else o


_backward_cache = {}


def backward_head_dims(rung):
    """The head dims `rung` has a backward pass for; [] for a forward-only rung."""
    if rung not in _backward_cache:
        lib = _load()
        if not hasattr(lib, "attn_backward_info"):
            return []
        dims, count, err = (ctypes.c_int * 8)(), ctypes.c_int(0), ctypes.create_string_buffer(_ERR_LEN)
        _raise_unless_ok(lib.attn_backward_info(rung.encode(), dims, ctypes.byref(count), err, _ERR_LEN), rung, err)
        _backward_cache[rung] = list(dims[: count.value])
    return _backward_cache[rung]


_strided_cache = {}


def backward_takes_strided_dout(rung):
    """Whether `rung`'s backward reads dout with its own strides (06o_bwd_tail_pieces,
    06p_bwd_dq_writer, 06q_bwd_persistent, 06d_fa3); the others take it contiguous."""
    if rung not in _strided_cache:
        lib = _load()
        strided = ctypes.c_int(0)
        if hasattr(lib, "attn_backward_strided_dout"):
            err = ctypes.create_string_buffer(_ERR_LEN)
            _raise_unless_ok(lib.attn_backward_strided_dout(rung.encode(), ctypes.byref(strided), err, _ERR_LEN),
                             rung, err)
        _strided_cache[rung] = bool(strided.value)
    return _strided_cache[rung]


def dout_for(rung, dout):
    """dout as `rung`'s backward reads it: as it lies where the rung takes strides and its
    rows are 16-byte aligned (dL/dO of a [B, N, H, d] activation's transpose, in a training
    step), else a contiguous copy. On real tensors only (run_backward; not where autograd is
    traced with fake ones)."""
    if dout.is_contiguous():
        return dout
    per16 = 16 // dout.element_size()
    if (dout.dim() == 4 and dout.stride(3) == 1 and all(st > 0 and st % per16 == 0 for st in dout.stride()[:3])
            and dout.data_ptr() % 16 == 0 and backward_takes_strided_dout(rung)):
        return dout
    return dout.contiguous()


def run_backward(rung, q, k, v, o, lse, dout, causal=False, scale=None):
    """(dq, dk, dv) of O = attention(q, k, v) for the upstream gradient dout = dL/dO, by the
    backward pass of `rung` (04_fa1_tiled, 05_fa2_reordered: backward_head_dims). o and lse
    are the forward's outputs (any rung's: fp32 natural-log lse [B, H, Nq]); dout has o's
    shape and dtype, any strides: read where it lies by a rung that takes strides
    (backward_takes_strided_dout) when its last dim is contiguous and the others are 16-byte
    multiples, else copied (dout_for). dk, dv have k's shape: with GQA each sums its group's
    query heads. Enqueued on torch.cuda.current_stream(), its workspace from torch.empty."""
    _check_inputs(q, k, v)
    if q.dtype not in _DTYPE_CODES:
        raise ValueError(f"the backward takes bfloat16 or float16, got {q.dtype}")
    for name, t in (("o", o), ("dout", dout)):
        if not isinstance(t, torch.Tensor) or t.shape != q.shape or t.dtype != q.dtype or t.device != q.device:
            raise ValueError(f"{name} must be a {q.dtype} tensor of q's shape {tuple(q.shape)} on {q.device}")
    if not o.is_contiguous():
        raise ValueError("o must be contiguous (call .contiguous())")
    dout = dout_for(rung, dout)
    strided = not dout.is_contiguous()
    B, H, Nq, d = q.shape
    if (not isinstance(lse, torch.Tensor) or tuple(lse.shape) != (B, H, Nq) or lse.dtype != torch.float32
            or lse.device != q.device or not lse.is_contiguous()):
        raise ValueError(f"lse must be a contiguous float32 tensor of shape {(B, H, Nq)} on {q.device}")
    _check_scale(scale)
    lib = _load()
    if not hasattr(lib, "attn_run_backward_async"):
        raise AttnLadderError(_INVALID_INPUT, f"attn_ladder '{rung}': this library has no backward pass")
    Hkv, Nk = k.shape[1], k.shape[2]
    problem = _Problem(B, H, Hkv, Nq, Nk, d, int(bool(causal)), _DTYPE_CODES[q.dtype], float(scale or 0.0))
    err, rung_c, need = _err(), rung.encode(), ctypes.c_size_t(0)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)

    def launch():
        _raise_unless_ok(lib.attn_backward_workspace_bytes(rung_c, ctypes.byref(problem), ctypes.byref(need), err,
                                                           _ERR_LEN), rung, err)
        workspace = torch.empty(need.value, dtype=torch.uint8, device=q.device) if need.value else None
        args = [rung_c, ctypes.byref(problem), q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(),
                lse.data_ptr(), dout.data_ptr(), dq.data_ptr(), dk.data_ptr(), dv.data_ptr(),
                workspace.data_ptr() if workspace is not None else None, need.value, _stream(q.device), err, _ERR_LEN]
        if not strided:
            return lib.attn_run_backward_async(*args)
        strides = (ctypes.c_int64 * 3)(*dout.stride()[:3])
        return lib.attn_run_backward_strided_async(*args[:8], strides, *args[8:])

    rc = _on_device(q.device, launch)
    _raise_unless_ok(rc, rung, err)
    return dq, dk, dv


def _check_paged_inputs(q, k_cache, v_cache, block_table, seq_lens):
    """ladder/torch_op.cpp's check_paged_inputs, same order and words."""
    if not isinstance(q, torch.Tensor) or q.dim() != 4:
        raise ValueError(f"q must be 4-D [B, H, Nq, d], got shape {tuple(getattr(q, 'shape', ()))}")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise ValueError(f"{name} must be 4-D [num_pages, page_size, Hkv, d], got shape "
                             f"{tuple(getattr(t, 'shape', ()))}")
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("block_table", block_table),
                    ("seq_lens", seq_lens)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if not t.is_cuda:
            raise ValueError(f"{name} must be on a CUDA device, got {t.device}")
        if t.device != q.device:
            raise ValueError(f"{name} must be on {q.device}, got {t.device}")
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous (call .contiguous())")
        if t.numel() and max(t.shape) > _INT32_MAX:
            raise ValueError(f"{name} has a dimension above 2^31 - 1: {tuple(t.shape)}")
    if q.dtype not in _DTYPE_CODES:
        raise ValueError(f"q must be bfloat16 or float16, got {q.dtype}")
    if not (k_cache.dtype == v_cache.dtype == q.dtype):
        raise ValueError(f"q, k_cache, v_cache must share one dtype, got {q.dtype}, {k_cache.dtype}, {v_cache.dtype}")
    if k_cache.shape != v_cache.shape:
        raise ValueError(f"k_cache and v_cache must have the same shape, got {tuple(k_cache.shape)} and "
                         f"{tuple(v_cache.shape)}")
    B, H, _, d = q.shape
    if k_cache.shape[3] != d:
        raise ValueError(f"head dims differ: q has d={d}, the caches have d={k_cache.shape[3]}")
    Hkv = k_cache.shape[2]
    if Hkv < 1 or H % Hkv != 0:
        raise ValueError(f"the caches' heads (Hkv={Hkv}) must divide q heads (H={H})")
    if block_table.dtype != torch.int32 or block_table.dim() != 2 or block_table.shape[0] != B:
        raise ValueError(f"block_table must be an int32 tensor [B, max_pages] with B={B}, got {block_table.dtype} "
                         f"{tuple(block_table.shape)}")
    if seq_lens.dtype != torch.int32 or seq_lens.dim() != 1 or seq_lens.shape[0] != B:
        raise ValueError(f"seq_lens must be an int32 tensor [B] with B={B}, got {seq_lens.dtype} "
                         f"{tuple(seq_lens.shape)}")


def decode_paged(q, k_cache, v_cache, block_table, seq_lens, causal=False, scale=None):
    """(o, lse) of one decode step from a paged KV cache (05_fa2_decode's kernels).

    q [B, H, Nq, d] (Nq <= 64); k_cache, v_cache [num_pages, page_size, Hkv, d]; block_table
    [B, max_pages] int32 (sequence b's token n in page block_table[b, n // page_size]);
    seq_lens [B] int32 (0 <= seq_lens[b] <= max_pages * page_size). causal: query row i of
    sequence b sees key j iff j <= i + seq_lens[b] - Nq. o like q, lse fp32 [B, H, Nq]. A bad
    length or page index is never read; its sequence's o is NaN. Nothing synchronizes: the
    tables are checked on the host by attn_ladder.decode_paged before the run (ops.py).
    """
    _check_paged_inputs(q, k_cache, v_cache, block_table, seq_lens)
    _check_scale(scale)
    lib = _load()
    if not hasattr(lib, "attn_decode_paged_async"):
        raise AttnLadderError(_INVALID_INPUT, "attn_ladder: this library has no paged decode")
    B, H, Nq, d = q.shape
    num_pages, page_size, Hkv, _ = k_cache.shape
    problem = _PagedProblem(B, H, Hkv, Nq, d, num_pages, page_size, block_table.shape[1], int(bool(causal)),
                            _DTYPE_CODES[q.dtype], float(scale or 0.0))
    o = torch.empty_like(q)
    lse = torch.empty((B, H, Nq), dtype=torch.float32, device=q.device)
    err, need = _err(), ctypes.c_size_t(0)
    name = "05_fa2_decode (paged)"

    def launch():
        _raise_unless_ok(lib.attn_decode_paged_workspace_bytes(ctypes.byref(problem), ctypes.byref(need), err,
                                                               _ERR_LEN), name, err)
        workspace = torch.empty(need.value, dtype=torch.uint8, device=q.device)
        stream = _stream(q.device)
        _raise_unless_ok(lib.attn_decode_paged_async(ctypes.byref(problem), q.data_ptr(), k_cache.data_ptr(),
                                                     v_cache.data_ptr(), block_table.data_ptr(), seq_lens.data_ptr(),
                                                     o.data_ptr(), lse.data_ptr(), workspace.data_ptr(), need.value,
                                                     stream, err, _ERR_LEN), name, err)

    _on_device(q.device, launch)
    return o, lse


def _raise_unless_ok(rc, rung, err):
    if rc != _OK:
        what = _CODE_NAMES.get(rc, f"code {rc}")
        msg = err.value.decode(errors="replace") or "(no message)"
        raise AttnLadderError(rc, f"attn_ladder '{rung}' failed ({what}): {msg}")
