"""#37: RoPE as one complex multiply for queries and keys at once (reference/gpt.py `apply_rope`) against the
real form it replaced (x1 cos - x2 sin and x1 sin + x2 cos stacked, per tensor), taken from the commit before:

    git show 4ffbc74~1:reference/gpt.py > /tmp/gpt_old.py    # the commit before RoPE changed
    .venv/bin/python -m lab.results.roofline_37.rope_complex 9 /tmp/gpt_old.py

1. per layer alone: one step's rotation of q and k at 2 and 128 rows (plain AR, batch 1 and 64 with CFG), the
   positions' table lookup included;
2. in the model: one `model.step` at MID_IMAGE (lab/bench/roofline.py) with each, the old forward methods swapped
   in, interleaved, ROUNDS rounds of the median of 7 steps per cell.
"""
import importlib.util
import statistics
import sys
import time
from functools import partial

import torch

import ssdgen.reference.gpt as new
from lab.bench.roofline import step_time
from ssdgen.models.registry import load_model

CELLS = [(1, 1), (16, 1), (64, 1), (128, 1), (64, 4), (64, 8)]


def load_old(path: str):
    spec = importlib.util.spec_from_file_location("gpt_old", path)
    old = importlib.util.module_from_spec(spec)
    sys.modules["gpt_old"] = old
    spec.loader.exec_module(old)
    return old


def us(fn, n: int = 5000) -> float:
    for _ in range(100):
        fn()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t) / n * 1e6


def per_layer(old) -> None:
    cos, sin = torch.randn(500, 16), torch.randn(500, 16)
    print("rows | real form, q and k, us per layer | complex, q and k at once, us per layer")
    for rows in (2, 128):
        qkv, pos = torch.randn(rows, 1, 768), torch.full((rows, 1), 160)
        print(f"{rows} | {us(partial(real_form, old, qkv, pos, cos, sin)):.1f} | "
              f"{us(partial(complex_form, qkv, pos, cos, sin)):.1f}", flush=True)


def real_form(old, qkv, pos, cos, sin):
    c, s = cos[pos].unsqueeze(1), sin[pos].unsqueeze(1)
    q, k, _ = qkv.view(len(qkv), 1, 3, 8, 32).permute(2, 0, 3, 1, 4)
    return old.apply_rope(q, c, s), old.apply_rope(k, c, s)


def complex_form(qkv, pos, cos, sin):
    rot = new.rotation(cos[pos], sin[pos])[:, :, None, None]
    return new.apply_rope(qkv.view(len(qkv), 1, 3, 8, 32)[:, :, :2], rot).permute(2, 0, 3, 1, 4)

def in_model(old, rounds: int) -> None:
    forwards = {v: {"Attention": m.Attention.forward, "Block": m.Block.forward, "hidden": m.GPT.hidden}
                for v, m in (("old", old), ("new", new))}
    model = load_model("reference")
    ms = {(v, c): [] for v in forwards for c in CELLS}
    for r in range(rounds):
        for c in CELLS:
            for v in (("old", "new") if r % 2 == 0 else ("new", "old")):  # alternate who goes first
                f = forwards[v]
                new.Attention.forward, new.Block.forward, new.GPT.hidden = f["Attention"], f["Block"], f["hidden"]
                ms[v, c].append(1e3 * statistics.median(step_time(model, *c, repeats=7)))
    print("batch x window | real-form RoPE ms median (min-max) | complex RoPE ms | x (real / complex, min-max)")
    for c in CELLS:
        a, b = ms["old", c], ms["new", c]
        ratio = [x / y for x, y in zip(a, b)]
        print(f"{c[0]} x {c[1]} | {statistics.median(a):.2f} ({min(a):.2f}-{max(a):.2f}) | "
              f"{statistics.median(b):.2f} ({min(b):.2f}-{max(b):.2f}) | "
              f"x{statistics.median(ratio):.2f} ({min(ratio):.2f}-{max(ratio):.2f})", flush=True)


if __name__ == "__main__":
    torch.set_num_threads(2)
    old = load_old(sys.argv[2])
    with open("/proc/loadavg") as f:
        print("load average", f.read().split()[:3], time.strftime("%Y-%m-%dT%H:%M:%S%z"), flush=True)
    per_layer(old)
    in_model(old, int(sys.argv[1]))
