"""Decode attention alone at v3's shapes (#48): the op `ssdgen::decode_attention` against torch's SDPA (what the
model ran for windows and bf16 caches before the op) and against a plain read of the same cache bytes (a sum over
the keys and the values in use: the floor, the read bandwidth's roof).

A cell is a batch (CFG: 2 rows per sample), a number of queries per row (1: plain AR; 4, 8, 16: windows, causal
within the window, every row at the same position) and a cache dtype; heads 8, head size 32, T = 1,100 slots in
use of 1,252 allocated (v3: 32x32 image tokens, the 36-token caption, 192 spare slots). The caches of several
layers are cycled, enough that their bytes exceed twice the CPU's last-level cache, so every read comes from
memory as in a step. Per kernel: the best of `repeats` calls over all layers, in `rounds` interleaved rounds; the
median over rounds is reported, with the min-max. GB/s: the keys' and values' bytes in use over the time; "of
read": the plain read's time over the kernel's (100% = at the floor).

Timings need a quiet machine (nothing else running; check `uptime` before and after).

    python -m lab.bench.attention_op [--batches 16,64,128] [--queries 1,4,8,16] [--dtypes fp32,bf16]
        [--slots 1100] [--alloc 1252] [--rounds 3] [--repeats 5] [--min-mb 0] [--json F]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from ssdgen.reference import decode_attention as da

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
KERNELS = ("op", "sdpa", "read")


def last_level_cache_bytes() -> int:
    """The largest CPU cache's size (sysfs; 64 MB where it is not listed)."""
    sizes = []
    for f in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        text = f.read_text().strip()
        scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
        sizes.append(int(text.rstrip("KMG")) * scale)
    return max(sizes, default=64 * 2**20)


def case(rows: int, S: int, dtype: torch.dtype, slots: int, alloc: int, layers: int, heads: int = 8, hd: int = 32):
    """q [rows, H, S, hd] (fp32, the model's), caches [rows, H, alloc, hd] per layer, a window's causal mask."""
    q = torch.randn(rows, heads, S, hd)
    ks = [torch.randn(rows, heads, alloc, hd).to(dtype) for _ in range(layers)]
    vs = [torch.randn(rows, heads, alloc, hd).to(dtype) for _ in range(layers)]
    pos = slots - S + torch.arange(S)  # the window's positions, the last at slot T - 1
    mask = (torch.arange(slots)[None, :] <= pos[:, None]).expand(rows, 1, S, slots).contiguous()
    return q, ks, vs, mask


def kernels(q, ks, vs, mask) -> dict:
    """Each kernel over every layer's caches, as one callable."""
    T = mask.shape[-1]

    def op():
        for k, v in zip(ks, vs):
            torch.ops.ssdgen.decode_attention(q, k, v, mask)

    def sdpa():  # as reference/gpt.py ran it: in the cache's dtype
        for k, v in zip(ks, vs):
            F.scaled_dot_product_attention(q.to(k.dtype), k[:, :, :T], v[:, :, :T], attn_mask=mask)

    def read():
        for k, v in zip(ks, vs):
            k[:, :, :T].sum(), v[:, :, :T].sum()
    return {"op": op, "sdpa": sdpa, "read": read}


def best_s(fn, repeats: int) -> float:
    fn()  # warm-up
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return min(out)


def cell(batch: int, S: int, name: str, a) -> dict:
    """One (batch, queries, dtype) cell: its kernels timed in interleaved rounds."""
    dtype, rows = DTYPES[name], 2 * batch
    item = torch.finfo(dtype).bits // 8
    per_layer = 2 * rows * 8 * a.alloc * 32 * item
    target = a.min_mb * 2**20 if a.min_mb else 2 * last_level_cache_bytes()
    layers = max(1, math.ceil(target / per_layer))
    q, ks, vs, mask = case(rows, S, dtype, a.slots, a.alloc, layers)
    got = torch.ops.ssdgen.decode_attention(q, ks[0], vs[0], mask).double()
    T = mask.shape[-1]
    want = F.scaled_dot_product_attention(q.double(), ks[0][:, :, :T].double(), vs[0][:, :, :T].double(),
                                          attn_mask=mask).transpose(1, 2)
    assert (got - want).abs().max() < 1e-4, "the op does not match SDPA here"
    fns = kernels(q, ks, vs, mask)
    times = {k: [] for k in KERNELS}
    for _ in range(a.rounds):
        for k in KERNELS:
            times[k].append(best_s(fns[k], a.repeats))
    gb = layers * 2 * rows * 8 * T * 32 * item / 1e9
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"batch": batch, "rows": rows, "queries": S, "dtype": name, "layers": layers, "slots": T,
            "gb": gb, "ms": {k: 1e3 * v for k, v in med.items()},
            "ms_range": {k: [1e3 * min(v), 1e3 * max(v)] for k, v in times.items()},
            "gb_s": {k: gb / v for k, v in med.items()},
            "of_read": {k: med["read"] / med[k] for k in ("op", "sdpa")}}


HEADER = ("| dtype | batch | queries | layers | GB | op ms (min-max) | op GB/s | SDPA ms | SDPA GB/s | read ms | "
          "read GB/s | op of read | SDPA of read |\n|" + "---|" * 13)


def row(r: dict) -> str:
    ms, lo_hi, gbs = r["ms"], r["ms_range"]["op"], r["gb_s"]
    return (f"| {r['dtype']} | {r['batch']} | {r['queries']} | {r['layers']} | {r['gb']:.2f} | "
            f"{ms['op']:.2f} ({lo_hi[0]:.2f}-{lo_hi[1]:.2f}) | {gbs['op']:.1f} | {ms['sdpa']:.2f} | "
            f"{gbs['sdpa']:.1f} | {ms['read']:.2f} | {gbs['read']:.1f} | {100 * r['of_read']['op']:.0f}% | "
            f"{100 * r['of_read']['sdpa']:.0f}% |")


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m lab.bench.attention_op", description=__doc__.split("\n\n")[0])
    p.add_argument("--batches", type=_ints, default=[16, 64, 128], help="samples per batch (CFG: 2 rows each)")
    p.add_argument("--queries", type=_ints, default=[1, 4, 8, 16], help="queries per row (1: plain AR)")
    p.add_argument("--dtypes", type=lambda t: t.split(","), default=["fp32", "bf16"], help="cache dtypes")
    p.add_argument("--slots", type=int, default=1100, help="slots in use (the mask's width)")
    p.add_argument("--alloc", type=int, default=1252, help="slots allocated per cache row")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    p.add_argument("--repeats", type=int, default=5, help="calls per kernel per round (the best counts)")
    p.add_argument("--min-mb", type=int, default=0, help="the layers' caches at least this many MB (0, the "
                   "default: twice the last-level cache, so reads come from memory)")
    p.add_argument("--json", type=Path, default=None, help="also write the cells here")
    a = p.parse_args(argv)
    if not set(a.dtypes) <= set(DTYPES) or any(s < 1 or s > da.MAX_QUERIES for s in a.queries):
        p.error(f"--dtypes among {sorted(DTYPES)}, --queries 1 to {da.MAX_QUERIES}")
    if not 1 <= max(a.queries) <= a.slots <= a.alloc:
        p.error("need queries <= slots <= alloc")
    return a


def main(argv=None) -> list[dict]:
    a = parse(argv)
    if da.library() is None:
        raise SystemExit("the op is not built on this machine (no C compiler?): nothing to time")
    load = open("/proc/loadavg").read().split()[:3] if Path("/proc/loadavg").exists() else "?"
    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads, load average {load}, op {da.state()} ({da._built.path.name}), "
          f"last-level cache {last_level_cache_bytes() / 2**20:.0f} MB\n{HEADER}", flush=True)
    cells = []
    for name in a.dtypes:
        for batch in a.batches:
            for S in a.queries:
                cells.append(cell(batch, S, name, a))
                print(row(cells[-1]), flush=True)
    if a.json:
        a.json.write_text(json.dumps(cells, indent=1))
    return cells


if __name__ == "__main__":
    main()
