"""Decode attention over the KV cache on the CPU: the C loop in decode_attention.c, built once per process.

torch's SDPA kernel for the CPU reads a decode step's cache at about half the speed a plain read of it reaches; on
this project's 2-core machines attention is two thirds of a batch-64 plain-AR step (docs/benchmarks.md, "The step
at the roofline"). The C loop reads the keys once and the values once per (row, head), at about the plain read's
speed, for one query per row (plain AR); windows of several queries stay with SDPA, which was faster for them.

It is built at the first cached fp32 step on the CPU with the system's C compiler (`cc -O3 -march=native
-fopenmp`, under a second) into a private temporary folder, so the build always matches the CPU it runs on, and
loaded with ctypes. Without a compiler, or when the build fails, attention stays SDPA, with one warning.

`attention(q, k, v, mask)` returns None where the loop does not apply (not the CPU, not fp32, more than one query
per row, no loop built): the caller then runs SDPA.
"""

from __future__ import annotations

import ctypes
import logging
import os
import shlex
import shutil
import subprocess
import tempfile
import threading
from importlib import resources

import torch

log = logging.getLogger(__name__)

_FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC")
_lib: ctypes.CDLL | None = None
_tried = False
_lock = threading.Lock()


def _build() -> ctypes.CDLL | None:
    """Compile and load the loop; None, with one log line, when it cannot be."""
    cc = shlex.split(os.environ.get("CC", "")) or [c for c in (shutil.which("cc") or shutil.which("gcc"),) if c]
    if not cc:
        log.warning("no C compiler (cc) found: decode attention on the CPU uses torch's SDPA, about 1.3x slower")
        return None
    src = resources.files(__package__).joinpath("decode_attention.c")
    folder = tempfile.mkdtemp(prefix="ssdgen-attn-")
    try:
        so = os.path.join(folder, "decode_attention.so")
        with resources.as_file(src) as path:
            done = subprocess.run([*cc, *_FLAGS, "-o", so, str(path), "-lm"], capture_output=True, text=True,
                                  timeout=120)
        if done.returncode != 0:
            why = done.stderr.strip()[-300:]
            log.warning("decode attention's C loop did not build (%s): torch's SDPA instead", why)
            return None
        lib = ctypes.CDLL(so)  # the loaded library stays mapped once its file is gone
    except (OSError, subprocess.SubprocessError) as e:
        log.warning("decode attention's C loop did not build (%s): torch's SDPA instead", e)
        return None
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    lib.decode_attention.argtypes = [ptr, i64, i64, ptr, ptr, i64, i64, i64, i64, ptr, i64, ptr, i64, i64,
                                     i64, i64, i64, i64, ctypes.c_int]
    lib.decode_attention.restype = None
    return lib


def loop() -> ctypes.CDLL | None:
    """The built loop, building it on the first call (None: not available in this process)."""
    global _lib, _tried
    if not _tried:
        with _lock:
            if not _tried:
                _lib, _tried = _build(), True
    return _lib


def applies(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> bool:
    """Whether the loop takes this call: fp32 on the CPU, one query per row, contiguous caches (the model's), one
    boolean mask for every head."""
    return (q.device.type == "cpu" and q.dtype == torch.float32 and k.dtype == torch.float32 and q.shape[2] == 1
            and q.stride(3) == 1 and k.is_contiguous() and v.is_contiguous() and mask.dtype == torch.bool
            and mask.shape[1] == 1 and mask.stride(3) == 1)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor | None:
    """q [B, H, 1, hd]; k, v the caches [B, H, Talloc, hd]; mask [B, 1, 1, T] bool (True: attend) -> [B, 1, H, hd],
    softmax(q k^T / sqrt(hd)) v over the slots t < T the mask allows; None where the loop does not apply."""
    if not applies(q, k, v, mask):
        return None
    lib = _lib if _tried else loop()
    if lib is None:
        return None
    B, H, _, D = q.shape
    out = q.new_empty(B, 1, H, D)
    if getattr(torch.autograd.profiler, "_is_profiler_enabled", True):  # a profile sees the C call by this name
        with torch.profiler.record_function("ssdgen::decode_attention"):
            _call(lib, q, k, v, mask, out)
    else:  # the label costs ~7 us, a fifth of a batch-1 step's attention per layer
        _call(lib, q, k, v, mask, out)
    return out


def _call(lib: ctypes.CDLL, q, k, v, mask, out) -> None:
    B, H, _, D = q.shape
    lib.decode_attention(q.data_ptr(), q.stride(0), q.stride(1),
                         k.data_ptr(), v.data_ptr(), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
                         mask.data_ptr(), mask.stride(0), out.data_ptr(), out.stride(0), out.stride(2),
                         B, H, mask.shape[-1], D, torch.get_num_threads())
