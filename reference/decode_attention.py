"""Decode attention over the KV cache on the CPU: the torch op `ssdgen::decode_attention`, for 1 to 16 queries
per row over fp32 or bf16 caches, around the C kernel in decode_attention.c.

torch's SDPA kernel for the CPU reads a decode step's cache at about half the speed a plain read of it reaches
(docs/benchmarks.md, "The step at the roofline"). The kernel reads each (row, head)'s keys once and its values once
for all of the row's queries, so plain AR (1 query), windows (S queries, causal within the window), packed ragged
steps and tree steps all take it: any boolean mask [B, 1, S, T], True = attend, as reference/gpt.py builds it. Every
decoder's cached steps and plain AR's run the same op; no decoder has a kernel the others lack.

The op is registered with torch.library (`torch.ops.ssdgen.decode_attention`): it shows in profiles under its
name, and its fake implementation lets torch.compile and FakeTensor trace through it. Its arguments are checked
in Python before the C call (`check`): a call of the wrong shape, dtype, stride or mask width raises ValueError,
where the kernel would read out of bounds.

The kernel is built once per machine by native_build.py (the system's `cc -O3 -march=native -fopenmp`, a few
seconds, cached by source, compiler, flags and CPU) and loaded with ctypes at the first cached step. Without a
compiler, or when the build fails, attention stays torch's SDPA, with one warning per process. `attention(q, k, v,
mask)` returns None where the op does not apply (not the CPU, more than 16 queries: a prefill; dtypes it lacks; no
op built): the caller then runs SDPA. `kind` says which of the two a model's steps run (the planner's cache keys
on it: workers/plan_cache.py).
"""

from __future__ import annotations

import ctypes
import logging
import threading

import torch

from . import native_build

log = logging.getLogger(__name__)

MAX_QUERIES = 16  # per row: the kernel's vectors hold one query per lane, 16 lanes at most
KV_DTYPES = {torch.float32: 0, torch.bfloat16: 1}  # the caches the kernel reads -> its dtype flag
_i64 = ctypes.c_int64


class _Args(ctypes.Structure):
    """decode_attention.c's Args, field for field: pointers and element strides; dtype flags 1 = bf16."""
    _fields_ = [("q", ctypes.c_void_p), ("qb", _i64), ("qh", _i64), ("qs", _i64), ("q_bf16", _i64),
                ("k", ctypes.c_void_p), ("v", ctypes.c_void_p), ("kb", _i64), ("kh", _i64), ("vb", _i64),
                ("vh", _i64), ("kv_bf16", _i64), ("mask", ctypes.c_void_p), ("mb", _i64), ("ms", _i64),
                ("out", ctypes.c_void_p), ("ob", _i64), ("os", _i64), ("oh", _i64), ("out_bf16", _i64),
                ("B", _i64), ("H", _i64), ("S", _i64), ("T", _i64), ("D", _i64)]


_built: native_build.Built | None = None
_state = "untried"  # then "built" (this process compiled it), "loaded" (an earlier build) or "unavailable"
_lock = threading.Lock()


def library() -> ctypes.CDLL | None:
    """The kernel's library, built or loaded at the first call (None: not available in this process)."""
    if _state == "untried":
        with _lock:
            if _state == "untried":
                _load()
    return None if _built is None else _built.lib


def _load() -> None:
    global _built, _state
    try:
        built = native_build.load("decode_attention.c")
    except native_build.BuildError as e:
        log.warning("decode attention's op is not built (%s): attention on the CPU stays torch's SDPA, which reads "
                    "the cache at about half the speed", e)
        _state = "unavailable"
        return
    built.lib.decode_attention.argtypes = [ctypes.POINTER(_Args), ctypes.c_int]
    built.lib.decode_attention.restype = ctypes.c_int
    _built, _state = built, "built" if built.compiled else "loaded"


loop = library  # #37's name, which its scripts in lab/results call


def state() -> str:
    """"built", "loaded" or "unavailable", loading the library first if no call has yet."""
    library()
    return _state


def kind(device: torch.device | str, dtype: torch.dtype, kv_dtype: torch.dtype) -> str:
    """Which attention a model's cached steps of 1 to 16 queries run: "op" or "sdpa" (a GPU, a precision the
    kernel lacks, no op built)."""
    fits = torch.device(device).type == "cpu" and kv_dtype in KV_DTYPES and dtype in (torch.float32, kv_dtype)
    return "op" if fits and library() is not None else "sdpa"


def applies(q: torch.Tensor, k: torch.Tensor) -> bool:
    """Whether the op takes this step: on the CPU, at most 16 queries per row, a cache it reads and q in fp32 or
    the cache's dtype, and the op built. Everything else about the call `check` checks, and raises on."""
    return (q.device.type == "cpu" and q.dim() == 4 and q.shape[2] <= MAX_QUERIES and k.dtype in KV_DTYPES
            and q.dtype in (torch.float32, k.dtype) and library() is not None)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor | None:
    """q [B, H, S, hd]; k, v the caches [B, H, Talloc, hd]; mask [B, 1, S, T] bool (True: attend), T <= Talloc ->
    [B, S, H, hd] in q's dtype, softmax(q k^T / sqrt(hd)) v over the slots the mask allows; None where the op does
    not apply (`applies`: the caller runs SDPA)."""
    if not applies(q, k):
        return None
    return OP(q, k, v, mask)


def check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> None:
    """Raise ValueError unless the kernel can take these tensors as they are: on the CPU; q [B, H, S, hd] in fp32 or
    the caches' dtype; k, v [B, H, Talloc, hd], fp32 or bf16 alike, contiguous (the caches as allocated); mask [B,
    1, S, T] bool with 1 <= T <= Talloc; 1 <= S <= 16; q's and the mask's last dimension contiguous."""
    def bad(why: str):
        raise ValueError(f"ssdgen::decode_attention: {why} (q {_desc(q)}, k {_desc(k)}, v {_desc(v)}, "
                         f"mask {_desc(mask)})")
    if not q.device.type == k.device.type == v.device.type == mask.device.type == "cpu":
        bad("every tensor must be on the CPU")
    if (q.dim(), k.dim(), v.dim(), mask.dim()) != (4, 4, 4, 4):
        bad("q, k, v and mask must each have 4 dimensions")
    if k.dtype not in KV_DTYPES or v.dtype != k.dtype:
        bad("k and v must both be float32 or both bfloat16")
    if q.dtype not in (torch.float32, k.dtype):
        bad("q must be float32 or the caches' dtype")
    if mask.dtype != torch.bool:
        bad("the mask must be bool (True: attend)")
    B, H, S, D = q.shape
    if tuple(k.shape) != tuple(v.shape) or (k.shape[0], k.shape[1], k.shape[3]) != (B, H, D):
        bad("k and v must be [B, H, Talloc, hd] with q's B, H and hd")
    if not 1 <= S <= MAX_QUERIES:
        bad(f"1 to {MAX_QUERIES} queries per row")
    if (mask.shape[0], mask.shape[1], mask.shape[2]) != (B, 1, S):
        bad("the mask must be [B, 1, S, T], one for every head")
    if not 1 <= mask.shape[3] <= k.shape[2]:
        bad("the mask must cover 1 to Talloc slots: T <= the caches' allocated length")
    if D < 1:
        bad("hd must be at least 1")
    if q.stride(3) != 1 or mask.stride(3) != 1:
        bad("q's and the mask's last dimension must be contiguous")
    if not (k.is_contiguous() and v.is_contiguous()):
        bad("k and v must be contiguous")


def _desc(t: torch.Tensor) -> str:
    return f"{tuple(t.shape)} {str(t.dtype).removeprefix('torch.')} {t.device.type} strides {tuple(t.stride())}"


# The op's registration, kept alive with this module. torch.library's low-level API, not `custom_op`: a call
# through the dispatcher then costs about 2 us where custom_op's wrapper cost about 11, six times a step (one per
# layer), which is a few percent of a batch-1 step.
_LIBRARY = torch.library.Library("ssdgen", "FRAGMENT")
_LIBRARY.define("decode_attention(Tensor q, Tensor k, Tensor v, Tensor mask) -> Tensor")


def _kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The op's implementation (`attention`'s contract): checked, then the C kernel on torch's thread count now
    (workers/cpus.py changes it between calls)."""
    check(q, k, v, mask)
    lib = library()
    if lib is None:
        raise RuntimeError("ssdgen::decode_attention is not built on this machine (see the warning logged): "
                           "call decode_attention.attention, which falls back to SDPA")
    B, H, S, D = q.shape
    out = q.new_empty(B, S, H, D)
    if out.numel() and lib.decode_attention(ctypes.byref(_args(q, k, v, mask, out)), torch.get_num_threads()):
        raise MemoryError("ssdgen::decode_attention: no memory for the kernel's per-thread scratch")
    return out


# every device reaches the kernel's checks, which refuse all but the CPU with a ValueError
_LIBRARY.impl("decode_attention", _kernel, "CompositeExplicitAutograd")


@torch.library.register_fake("ssdgen::decode_attention", lib=_LIBRARY)
def _fake(q, k, v, mask):
    """The output's shape and dtype without running the kernel (torch.compile, FakeTensor), after the same checks."""
    check(q, k, v, mask)
    B, H, S, D = q.shape
    return q.new_empty(B, S, H, D)


OP = torch.ops.ssdgen.decode_attention.default  # the registered op, as callers reach it


def _args(q, k, v, mask, out) -> _Args:
    B, H, S, D = q.shape
    return _Args(q.data_ptr(), q.stride(0), q.stride(1), q.stride(2), int(q.dtype == torch.bfloat16),
                 k.data_ptr(), v.data_ptr(), k.stride(0), k.stride(1), v.stride(0), v.stride(1), KV_DTYPES[k.dtype],
                 mask.data_ptr(), mask.stride(0), mask.stride(2),
                 out.data_ptr(), out.stride(0), out.stride(1), out.stride(2), int(out.dtype == torch.bfloat16),
                 B, H, S, mask.shape[3], D)
