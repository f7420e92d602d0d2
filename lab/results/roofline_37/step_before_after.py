"""#37: the reference model's step with this session's changes (RoPE as one complex multiply, a plain-AR step's
writes as one slice) against the step before them, in one process: the old module's forward methods and cache
writes swapped in, interleaved, ROUNDS rounds of the median of 7 steps per cell (lab/bench/roofline.py's setup).

    git show 2016013:reference/gpt.py > /tmp/gpt_2016013.py
    .venv/bin/python -m lab.results.roofline_37.step_before_after 9 /tmp/gpt_2016013.py
"""
import importlib.util
import statistics
import sys
import time

import torch

import ssdgen.reference.gpt as new
from lab.bench.roofline import step_time
from ssdgen.models.registry import load_model

CELLS = [(1, 1), (16, 1), (64, 1), (128, 1), (64, 4), (64, 8)]
SWAPPED = (("Attention", "forward"), ("Block", "forward"), ("GPT", "hidden"), ("KVCache", "slots"),
           ("KVCache", "update"))


def load_old(path: str):
    spec = importlib.util.spec_from_file_location("gpt_old", path)
    old = importlib.util.module_from_spec(spec)
    sys.modules["gpt_old"] = old
    spec.loader.exec_module(old)
    return old


def methods(module) -> dict:
    return {(cls, name): getattr(getattr(module, cls), name) for cls, name in SWAPPED}


def use(chosen: dict) -> None:
    for (cls, name), fn in chosen.items():
        setattr(getattr(new, cls), name, fn)


if __name__ == "__main__":
    torch.set_num_threads(2)
    versions = {"before": methods(load_old(sys.argv[2])), "after": methods(new)}
    model = load_model("reference")
    with open("/proc/loadavg") as f:
        print("load average", f.read().split()[:3], time.strftime("%Y-%m-%dT%H:%M:%S%z"), flush=True)
    ms = {(v, c): [] for v in versions for c in CELLS}
    for r in range(int(sys.argv[1])):
        for c in CELLS:
            for v in (("before", "after") if r % 2 == 0 else ("after", "before")):  # alternate who goes first
                use(versions[v])
                ms[v, c].append(1e3 * statistics.median(step_time(model, *c, repeats=7)))
    print("batch x window | before ms median (min-max) | after ms | x (before / after, min-max)")
    for c in CELLS:
        a, b = ms["before", c], ms["after", c]
        ratio = [x / y for x, y in zip(a, b)]
        print(f"{c[0]} x {c[1]} | {statistics.median(a):.2f} ({min(a):.2f}-{max(a):.2f}) | "
              f"{statistics.median(b):.2f} ({min(b):.2f}-{max(b):.2f}) | "
              f"x{statistics.median(ratio):.2f} ({min(ratio):.2f}-{max(ratio):.2f})", flush=True)
