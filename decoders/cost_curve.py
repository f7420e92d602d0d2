"""How the time of one forward grows with the tokens in it, measured on the device, and the block size
that curve makes best.

Speculation pays only while a forward with more tokens costs little more than a forward with one: on a
GPU at batch 1 the curve is flat for hundreds of tokens, on two CPU cores it rises early, and at a large
batch every device is already busy. A constant (rows per block, a token budget) cannot follow that from
machine to machine, so `measure_cost_curve` times real forwards at start-up (a few seconds) and
`best_rows` picks the rows per block that maximise expected committed tokens per second:

    rows r (r x W drafted tokens per sample):  r * W / (forwards_per_block * t(r * W))
    plain AR:                                  1 / t(1)

where t(s) is the measured time of one forward feeding s tokens to each of the batch's rows, and
forwards_per_block the forwards a block takes (1 when every draft is kept, up to rounds + 1).
r = 0 means plain AR is faster on this device at this batch size.

The prefix engine (lossless SSD, `commit=prefix`) slides a window of L = rows x W + 1 tokens and commits a
verified prefix per forward, so `window_rates` compares windows of 1, 2, ... rows with AR:

    window of r rows:  tokens_per_forward(L) / t(L)          plain AR:  1 / t(1)

with tokens_per_forward(L) = 1 + L / 8 before any measurement (lossless SSD on the reference model commits
4.8 per forward with a 33-token window). These are estimates: calibrate.py times the plausible choices and
decides once.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class CostCurve:
    batch: int  # samples per forward the curve was measured at (CFG rows included in the timing)
    tokens: tuple[int, ...]  # tokens per sample in one forward, increasing
    seconds: tuple[float, ...]  # median seconds of that forward

    def time(self, tokens: float) -> float:
        """Seconds of a forward with `tokens` per sample: linear between measured points, and past the last
        one along the last segment's slope."""
        t, s = np.asarray(self.tokens, float), np.asarray(self.seconds, float)
        if tokens <= t[-1] or len(t) == 1:
            return float(np.interp(tokens, t, s))
        slope = (s[-1] - s[-2]) / (t[-1] - t[-2])
        return float(s[-1] + slope * (tokens - t[-1]))

    def to_dict(self) -> dict:
        return asdict(self)


def best_rows(curve: CostCurve, W: int, max_rows: int, forwards_per_block: float) -> tuple[int, dict]:
    """(rows per block, 0 = plain AR; and the expected committed tokens per second of each choice)."""
    rates = {0: 1.0 / curve.time(1)}
    for r in range(1, max_rows + 1):
        rates[r] = r * W / (max(1.0, forwards_per_block) * curve.time(r * W))
    best = max(rates, key=lambda r: (rates[r], -r))  # ties go to fewer rows: less work for the same speed
    return best, {str(r): v for r, v in rates.items()}


def window_prior(L: int) -> float:
    """Committed tokens per forward expected of an L-token window before any measurement (module doc)."""
    return 1.0 + L / 8


def window_rates(curve: CostCurve, W: int, max_rows: int) -> dict[str, float]:
    """{"0": plain AR, "r": a window of r rows (L = r * W + 1, at most 64)}: expected committed tokens per second
    per sample."""
    rates = {"0": 1.0 / curve.time(1)}
    for r in range(1, max_rows + 1):
        L = min(64, r * W + 1)
        rates[str(r)] = window_prior(L) / curve.time(L)
    return rates


def sync(device: torch.device) -> None:
    """Wait for the device's queued work, so wall-clock timings cover it (a no-op on a CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.no_grad()
def measure_cost_curve(model, prompts: list[str], use_cfg: bool, max_tokens: int,
                       reps: int = 3) -> CostCurve:
    """Time forwards feeding 1, 2, 4, ... max_tokens tokens per sample, for a batch of len(prompts)."""
    device = torch.device(getattr(model, "device", "cpu"))
    B = len(prompts)
    sizes = sorted({1, *[2 ** k for k in range(1, max_tokens.bit_length()) if 2 ** k < max_tokens], max_tokens})
    model.start(prompts, use_cfg)
    seconds = []
    for s in sizes:
        tokens = torch.zeros(B, s, dtype=torch.long, device=device)
        idx = torch.arange(s, device=device).expand(B, s)
        model.step(tokens, idx)  # warm-up: allocator, kernels
        times = []
        for _ in range(reps):
            sync(device)
            t0 = time.perf_counter()
            model.step(tokens, idx)
            sync(device)
            times.append(time.perf_counter() - t0)
        seconds.append(statistics.median(times))
    return CostCurve(B, tuple(sizes), tuple(seconds))
