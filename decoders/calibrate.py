"""The device calibration of a `calibrated=true` SSD spec: `resolve` turns it into a concrete spec, with the rows
that are fastest on this device at this batch size (per sliding window for the prefix engine, the cap per block
for the block decoder), or into plain `ar` with the same sampling, and says what it measured.

Why resolve. A lossy decoder's tokens depend on its rows, so a choice that followed the timing of every batch would
give a sample other tokens on a retry, in another batch or on another actor. The standard is that a sample's
tokens depend on its seed only. So the choice is made once, before the first shard (flows/pipeline.py), and
recorded as the concrete spec's text (`_plan.json`), which the actors then decode by: the text alone reproduces
the tokens, whatever the batch, the retry or the actor. `run` refuses a spec still calibrated.

How. `cost_curve.measure_cost_curve` times the model's forwards at 1, 2, 4, ... tokens per sample, and the
curve gives each choice's expected committed tokens per second (`estimates`: cost_curve.best_rows,
cost_curve.window_rates). The curve times forwards only; on a CPU the drafting and verification around them
decide a close call (at batch 4 on two cores the curve said the window wins and it lost). So every choice whose
estimate is at least half the best one decodes the calibration prompts, interleaved batch by batch, wall clock,
everything included (`measured`, images per second), and the fastest wins; a tie goes to fewer rows, which is
less work for the same speed. A choice the curve rules out is never timed: at batch 64 on a CPU that saves a
half-minute decode of a window that cannot win.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

from .configs import SSDConfig
from .cost_curve import best_rows, measure_cost_curve, sync, window_rates
from .engine import load_heads, run
from .spec import DecodeSpec

WORTH_TIMING = 0.5  # time a choice whose estimate is at least this fraction of the best estimate
AR_FASTER = "plain AR is faster on this device at this batch size"  # a plan of 0 rows, in the statistics


@dataclass(frozen=True)
class Measurements:
    """What a calibration measured and why it chose as it did (recorded with the resolved spec, `_plan.json`)."""
    batch: int  # the batch size it was calibrated at
    estimates: dict  # {"0" (AR), "1", ...: committed tokens per second per sample the cost curve expects}
    measured: dict  # {choice: images per second decoding the calibration prompts}, only the choices timed
    cost_curve: dict  # cost_curve.CostCurve.to_dict()
    seconds: float  # what the calibration took
    why: str | None = None  # why it resolved to plain AR (AR_FASTER); None when it speculates

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Measurements":
        return cls(**d)


def concrete(spec: DecodeSpec, rows: int) -> DecodeSpec:
    """The uncalibrated spec that decodes as the choice `rows` of a calibrated spec: 0 is plain `ar` with the same
    sampling; else the same family and parameters with calibrated=false and rows=K (the block decoder: its cap,
    max_rows=K, with rows=min(rows, K) to start from)."""
    if rows == 0:
        return DecodeSpec("ar", (), spec.sampling)
    cfg = spec.config()
    chosen = {"calibrated": False, "rows": rows} if cfg.prefix_engine else \
        {"calibrated": False, "rows": min(cfg.rows, rows), "max_rows": rows}
    return DecodeSpec(spec.family, tuple((dict(spec.params) | chosen).items()), spec.sampling, spec.heads)


def choices(spec: DecodeSpec) -> dict[int, DecodeSpec]:
    """A calibrated spec's speculative choices, {rows: concrete(spec, rows)}; {} for any other spec."""
    if not spec.calibrated:
        return {}
    cfg = spec.config()
    return {r: concrete(spec, r) for r in range(1, (cfg.rows if cfg.prefix_engine else cfg.max_rows) + 1)}


def estimates(curve, cfg: SSDConfig, W: int) -> dict[str, float]:
    """The cost curve's expected committed tokens per second per sample of every choice, "0" = plain AR."""
    if cfg.prefix_engine:  # windows of 1 .. rows rows
        return window_rates(curve, W, cfg.rows)
    # the block decoder: before any history, a block is assumed to take half its rounds
    return best_rows(curve, W, cfg.max_rows, 1 + cfg.rounds / 2)[1]


def worth_timing(est: dict[str, float]) -> list[int]:
    best = max(est.values())
    return sorted(int(k) for k, v in est.items() if v >= WORTH_TIMING * best)


def choose(measured: dict[str, float]) -> int:
    """The fastest choice; a tie goes to fewer rows."""
    return max((int(k) for k in measured), key=lambda r: (measured[str(r)], -r))


def resolve(spec: DecodeSpec, model, prompts: list[str], seeds: list[int], batch: int,
            heads=None) -> tuple[DecodeSpec, Measurements | None]:
    """A calibrated spec -> (the concrete spec this device decodes it as at `batch`, what was measured), timed on
    `prompts` (module doc); any other spec -> (itself, None). heads: an SSD spec's (default: loaded)."""
    if not spec.calibrated:
        return spec, None
    t0 = time.perf_counter()
    cfg = spec.config()
    batch = min(batch, len(prompts))  # a run's first shard may hold fewer prompts than a batch
    W = model.grid[1]
    most = min(64, cfg.rows * W + 1) if cfg.prefix_engine else cfg.max_rows * W  # tokens per sample, at most
    curve = measure_cost_curve(model, prompts[:batch], spec.sampling.uses_cfg, most)
    est = estimates(curve, cfg, W)
    trial = worth_timing(est)
    if len(trial) > 1:
        heads = heads if heads is not None else load_heads(model, spec.heads)  # loaded once for every choice

        def decode_as(p: list[str], s: list[int], rows: int):
            return run(concrete(spec, rows), model, p, s, heads)
        measured = _time_choices(model, prompts, seeds, batch, trial, decode_as)
    else:
        measured = {}
    rows = choose(measured) if measured else trial[0]
    return concrete(spec, rows), Measurements(batch, est, measured, curve.to_dict(), time.perf_counter() - t0,
                                              AR_FASTER if rows == 0 else None)


def _time_choices(model, prompts, seeds, batch, trial: list[int], decode_as: Callable) -> dict[str, float]:
    """{choice: images per second}, each choice decoding every batch of `prompts`, interleaved batch by batch so
    that a slow spell of the machine falls on all choices alike."""
    seconds = dict.fromkeys(trial, 0.0)
    device = torch.device(getattr(model, "device", "cpu"))
    for i in range(0, len(prompts), batch):
        p, s = prompts[i:i + batch], seeds[i:i + batch]
        for r in trial:
            sync(device)
            t0 = time.perf_counter()
            decode_as(p, s, r)
            sync(device)
            seconds[r] += time.perf_counter() - t0
    return {str(r): len(prompts) / seconds[r] for r in trial}
