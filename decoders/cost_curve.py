"""How the time of one forward grows with the tokens in it, as the device measured it (planner.py measures and
uses it).

Speculation pays only while a forward with more tokens costs little more than a forward with one: on a GPU at
batch 1 the curve is flat for hundreds of tokens, on two CPU cores it rises early, and at a large batch every
device is already busy. A constant cannot follow that from machine to machine, so the planner times real
forwards once per run (or reads them from the cache) and decides from the curve.
"""

from __future__ import annotations

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


def sync(device: torch.device) -> None:
    """Wait for the device's queued work, so wall-clock timings cover it (a no-op on a CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
