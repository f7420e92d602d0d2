"""#37: attention as two batched matmuls over rows x heads (q @ k^T, the boolean mask, softmax, @ v) against
SDPA (what reference/gpt.py calls), in the model at the head, for a second look after attention_layouts.py timed
the batched matmuls faster than SDPA alone at the batch-64 shapes. One `model.step` at MID_IMAGE
(lab/bench/roofline.py) with each forward, interleaved, ROUNDS rounds of the median of 7 steps per cell.

    .venv/bin/python -m lab.results.roofline_37.bmm_attention 7
"""
import math
import statistics
import sys
import time

import torch

import ssdgen.reference.gpt as G
from lab.bench.roofline import step_time
from ssdgen.models.registry import load_model

CELLS = [(1, 1), (16, 1), (64, 1), (128, 1), (256, 1), (64, 4)]
SDPA = G.Attention.forward


def bmm_forward(self, x, rot, slots=None, mask=None, ragged=None):
    """G.Attention.forward's cached path with SDPA replaced by two batched matmuls (fp32 cache only)."""
    qkv = self.wqkv(x)
    if ragged is not None:
        qkv = ragged.unpack(qkv)
    B, S, _ = qkv.shape
    qkv = qkv.view(B, S, 3, self.n_heads, self.head_dim)
    q, k = G.apply_rope(qkv[:, :, :2], rot).permute(2, 0, 3, 1, 4)
    v = qkv[:, :, 2].transpose(1, 2)
    k, v = self.kv_cache.update(slots, k, v)
    T = mask.shape[-1]
    s = torch.matmul(q, k[:, :, :T].transpose(-1, -2)).mul_(1 / math.sqrt(self.head_dim))  # [B, H, S, T]
    y = torch.matmul(s.masked_fill_(~mask, float("-inf")).softmax(-1), v[:, :, :T])
    y = y.transpose(1, 2).reshape(B, S, -1)
    return self.wo(y if ragged is None else ragged.pack(y))


def main(rounds: int) -> None:
    model = load_model("reference")
    forwards = {"sdpa": SDPA, "bmm": bmm_forward}
    ms = {(v, c): [] for v in forwards for c in CELLS}
    for r in range(rounds):
        for c in CELLS:
            for v in (("sdpa", "bmm") if r % 2 == 0 else ("bmm", "sdpa")):  # alternate who goes first
                G.Attention.forward = forwards[v]
                ms[v, c].append(1e3 * statistics.median(step_time(model, *c, repeats=7)))
    G.Attention.forward = SDPA
    print("batch x window | SDPA ms median (min-max) | batched matmuls ms | x (SDPA / bmm, min-max)")
    for c in CELLS:
        a, b = ms["sdpa", c], ms["bmm", c]
        ratio = [x / y for x, y in zip(a, b)]
        print(f"{c[0]} x {c[1]} | {statistics.median(a):.2f} ({min(a):.2f}-{max(a):.2f}) | "
              f"{statistics.median(b):.2f} ({min(b):.2f}-{max(b):.2f}) | "
              f"x{statistics.median(ratio):.2f} ({min(ratio):.2f}-{max(ratio):.2f})", flush=True)


if __name__ == "__main__":
    torch.set_num_threads(2)
    with open("/proc/loadavg") as f:
        print("load average", f.read().split()[:3], time.strftime("%Y-%m-%dT%H:%M:%S%z"), flush=True)
    main(int(sys.argv[1]))
