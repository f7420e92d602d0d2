"""#37: the cache writes of a step where every row writes the same adjacent slots (a plain-AR batch) as one slice
copy, against the index copy of whole vectors every step used before (reference/gpt.py `KVCache.slots`).

1. alone: one step's keys written into six layers' caches, warm (the lines in the CPU's caches) and cold (after a
   320 MB read, as in a step, whose attention reads the cache first);
2. in the model: one `model.step` at MID_IMAGE (lab/bench/roofline.py) with each (the index copy forced by swapping
   `KVCache.slots` for its general form), interleaved, ROUNDS rounds of the median of 7 steps per cell, and the
   tokens of a plain-AR decode with each, which must be equal.

Run on a quiet machine from the repository root:
    .venv/bin/python -m lab.results.roofline_37.slice_writes 9
"""
import statistics
import sys
import time

import torch

from lab.bench.roofline import step_time
from ssdgen.decoders.decoder import build
from ssdgen.models.registry import load_model
from ssdgen.reference.gpt import KVCache
from ssdgen.reference.prompts import eval_prompts

CELLS = [(1, 1), (16, 1), (64, 1), (128, 1)]
SLICED = KVCache.slots


def indexed(self, input_pos):
    """KVCache.slots without the slice: the rows of every (row, head, position), as before."""
    B, H, T, _ = self.k.shape
    first = torch.arange(B * H, device=input_pos.device).view(B, H, 1) * T
    return (first + input_pos[:, None, :]).flatten()


def alone() -> None:
    B, H, D, T, layers = 128, 8, 32, 484, 6
    caches = [KVCache(B, H, T, D) for _ in range(layers)]
    flush = torch.randn(80_000_000)
    k = torch.randn(B, 1, 3, H, D).permute(2, 0, 3, 1, 4)[1]  # [B, H, 1, hd], strided as the model's
    pos = torch.full((B, 1), 160)
    print("one step's keys and values, six layers, 128 rows | warm ms | cold ms")
    for name, slots in (("index copy of whole vectors", indexed), ("one slice", SLICED)):
        ms = {}
        for cold in (False, True):
            times = []
            for _ in range(15):
                if cold:
                    flush.sum()
                t = time.perf_counter()
                for c in caches:
                    c.update(slots(c, pos), k, k)
                times.append(time.perf_counter() - t)
            ms[cold] = 1e3 * statistics.median(times)
        print(f"{name} | {ms[False]:.3f} | {ms[True]:.3f}", flush=True)


def in_model(rounds: int) -> None:
    model = load_model("reference")
    rows = eval_prompts(16)
    toks = {}
    for name, slots in (("indexed", indexed), ("sliced", SLICED)):
        KVCache.slots = slots
        toks[name] = build("ar", model).decode([r["prompt"] for r in rows], [r["seed"] for r in rows]).tokens
    print("plain AR, 16 eval prompts: the same tokens with either write:", torch.equal(toks["indexed"], toks["sliced"]))
    ms = {(n, c): [] for n in ("indexed", "sliced") for c in CELLS}
    for r in range(rounds):
        for c in CELLS:
            for n in (("indexed", "sliced") if r % 2 == 0 else ("sliced", "indexed")):  # alternate who goes first
                KVCache.slots = indexed if n == "indexed" else SLICED
                ms[n, c].append(1e3 * statistics.median(step_time(model, *c, repeats=7)))
    print("batch x window | index copy ms median (min-max) | slice ms | x (index / slice, min-max)")
    for c in CELLS:
        a, b = ms["indexed", c], ms["sliced", c]
        ratio = [x / y for x, y in zip(a, b)]
        print(f"{c[0]} x {c[1]} | {statistics.median(a):.2f} ({min(a):.2f}-{max(a):.2f}) | "
              f"{statistics.median(b):.2f} ({min(b):.2f}-{max(b):.2f}) | "
              f"x{statistics.median(ratio):.2f} ({min(ratio):.2f}-{max(ratio):.2f})", flush=True)


if __name__ == "__main__":
    torch.set_num_threads(2)
    with open("/proc/loadavg") as f:
        print("load average", f.read().split()[:3], time.strftime("%Y-%m-%dT%H:%M:%S%z"), flush=True)
    alone()
    in_model(int(sys.argv[1]))
