"""#37, not landed: decode attention's C loop for windows of 2-8 queries per row (windows_attempt.c: the landed
one-query loop plus a copy specialised for each window size, head size 32), against SDPA alone at the batch-64
shapes over six layers' caches (a causal window at the last slots in use); first its outputs against SDPA's.
5 rounds, median (min). Slower than SDPA from 4 queries on: not landed.
    .venv/bin/python -m lab.results.roofline_37.c_loop.windows_attempt time
"""
import ctypes
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

torch.set_num_threads(2)
SO = Path(tempfile.mkdtemp()) / "windows_attempt.so"
subprocess.run(["cc", "-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-o", str(SO),
                str(Path(__file__).with_name("windows_attempt.c")), "-lm"], check=True)
lib = ctypes.CDLL(str(SO))


def call(q, k, v, m):
    B, H, S, D = q.shape
    out = torch.empty(B, S, H, D)
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    lib.decode_attention(ptr(q.data_ptr()), i64(q.stride(0)), i64(q.stride(1)), i64(q.stride(2)),
                         ptr(k.data_ptr()), ptr(v.data_ptr()), i64(k.stride(0)), i64(k.stride(1)),
                         i64(v.stride(0)), i64(v.stride(1)), ptr(m.data_ptr()), i64(m.stride(0)), i64(m.stride(2)),
                         ptr(out.data_ptr()), i64(out.stride(0)), i64(out.stride(2)), i64(out.stride(1)),
                         i64(B), i64(H), i64(S), i64(m.shape[-1]), i64(D), ctypes.c_int(2))
    return out


def window_mask(B, S, T, last):
    """[B, 1, S, T]: query s of a window ending at slot `last` (per row, [B, 1]) sees slots up to its own."""
    pos = last - S + 1 + torch.arange(S)[None]
    return (torch.arange(T)[None, None, :] <= pos[:, :, None]).unsqueeze(1)


H, TA, D = 8, 484, 32
for S in range(1, 9):
    q = torch.randn(3, S, 3, H, D)[:, :, 0].transpose(1, 2)
    k, v = torch.randn(3, H, TA, D), torch.randn(3, H, TA, D)
    m = window_mask(3, S, 40, torch.randint(S - 1, 40, (3, 1)))
    m[..., 0] = False
    ref = F.scaled_dot_product_attention(q, k[:, :, :40], v[:, :, :40], attn_mask=m).transpose(1, 2)
    print(f"S={S}: max |loop - SDPA| {(call(q, k, v, m) - ref).abs().max().item():.2e}")
if len(sys.argv) < 2:
    sys.exit()
B, T, L = 128, 165, 6
KS = [torch.randn(B, H, TA, D) for _ in range(L)]
VS = [torch.randn(B, H, TA, D) for _ in range(L)]
print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load {open('/proc/loadavg').read().split()[:3]}")
for S in (1, 2, 4, 8):
    q = torch.randn(B, H, S, D)
    m = window_mask(B, S, T, torch.full((B, 1), T - 1)).contiguous()
    fns = {"SDPA": lambda q=q, m=m: [F.scaled_dot_product_attention(q, k[:, :, :T], v[:, :, :T], attn_mask=m)
                                     for k, v in zip(KS, VS)],
           "loop": lambda q=q, m=m: [call(q, k, v, m) for k, v in zip(KS, VS)]}
    res = {n: [] for n in fns}
    for _ in range(5):
        for n, f in fns.items():
            f()
            t = time.perf_counter()
            f()
            res[n].append((time.perf_counter() - t) * 1e3)
    print(f"{S} queries per row, 6 layers: " + ", ".join(
        f"{n} {statistics.median(x):.2f} ms (min {min(x):.2f})" for n, x in res.items()), flush=True)
