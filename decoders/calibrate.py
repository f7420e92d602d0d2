"""The device calibration of a `calibrated=true` SSD spec, decided once: how many rows a block (the block
decoder's cap) or the sliding window (the prefix engine) drafts on this device at this batch size, or 0 for
plain AR.

Why once. A lossy decoder's tokens depend on its rows, so a choice that followed the timing of every batch would
give a sample other tokens on a retry, in another batch or on another actor. The standard is that a sample's
tokens depend on its seed only. So the choice is a `Plan`, made at the first batch (`plan_for`), or by the
pipeline before its first shard and recorded with the run (`_plan.json`, flows/pipeline.py), kept on the model
object (`install_plan`) and written into every sample's statistics. Given the plan, the tokens follow from the
seeds, whatever the batch, the retry or the actor.

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
from dataclasses import asdict, dataclass, replace

import torch

from .configs import SSDConfig
from .cost_curve import best_rows, measure_cost_curve, sync, window_rates
from .sampling import SamplingConfig

WORTH_TIMING = 0.5  # time a choice whose estimate is at least this fraction of the best estimate
AR_FASTER = "plain AR is faster on this device at this batch size"  # a plan of 0 rows, in the statistics


@dataclass(frozen=True)
class Plan:
    rows: int  # rows per block (block decoder: the cap) or per window (prefix engine); 0 = plain AR
    batch: int  # the batch size it was calibrated at
    estimates: dict  # {"0" (AR), "1", ...: committed tokens per second per sample the cost curve expects}
    measured: dict  # {choice: images per second decoding the calibration prompts}, only the choices timed
    cost_curve: dict  # cost_curve.CostCurve.to_dict()
    seconds: float  # what the calibration took

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Plan":
        return cls(**d)

    @property
    def ar_fallback(self) -> str | None:
        """Why this plan decodes as plain AR (SampleStats.ar_fallback); None when it speculates."""
        return AR_FASTER if self.rows == 0 else None

    @property
    def policy(self) -> str:
        """What the statistics say: a fall-back to plain AR is reported, never silent."""
        return f"ar: {AR_FASTER}" if self.rows == 0 else f"calibrated: {self.rows} row(s)"


def planned(cfg: SSDConfig, rows: int) -> SSDConfig:
    """The uncalibrated config that decodes as a plan of `rows` (> 0) says."""
    if cfg.prefix_engine:
        return replace(cfg, calibrated=False, rows=rows)
    return replace(cfg, calibrated=False, rows=min(cfg.rows, rows), max_rows=rows)


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


def calibrate(model, cfg: SSDConfig, sc: SamplingConfig, prompts: list[str], seeds: list[int], batch: int,
              decode_as: Callable) -> Plan:
    """Measure the curve at `batch` and time the plausible choices on `prompts` (module doc); decode_as(prompts,
    seeds, rows) decodes a batch as a choice (ssd.choice_decoder: rows 0 is plain AR)."""
    t0 = time.perf_counter()
    batch = min(batch, len(prompts))  # a run's first shard may hold fewer prompts than a batch
    W = model.grid[1]
    most = min(64, cfg.rows * W + 1) if cfg.prefix_engine else cfg.max_rows * W  # tokens per sample, at most
    curve = measure_cost_curve(model, prompts[:batch], sc.uses_cfg, most)
    est = estimates(curve, cfg, W)
    trial = worth_timing(est)
    measured = _time_choices(model, prompts, seeds, batch, trial, decode_as) if len(trial) > 1 else {}
    rows = choose(measured) if measured else trial[0]
    return Plan(rows, batch, est, measured, curve.to_dict(), time.perf_counter() - t0)


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


def plan_key(cfg: SSDConfig, sc: SamplingConfig, heads) -> tuple:
    return cfg, sc, id(heads)  # heads stay loaded on the model object (engine.load_heads), so id is stable


def install_plan(model, cfg: SSDConfig, sc: SamplingConfig, heads, plan: Plan) -> None:
    """Decode this config on this model object by `plan` from now on (a run's recorded plan, a bench's)."""
    model.__dict__.setdefault("_ssd_plans", {})[plan_key(cfg, sc, heads)] = plan


def plan_for(model, cfg: SSDConfig, sc: SamplingConfig, heads, prompts: list[str], seeds: list[int],
             decode_as: Callable) -> Plan:
    """The installed plan, or one calibrated on this first batch and installed: never revised afterwards."""
    plans = model.__dict__.setdefault("_ssd_plans", {})
    key = plan_key(cfg, sc, heads)
    if key not in plans:
        plans[key] = calibrate(model, cfg, sc, prompts, seeds, len(prompts), decode_as)
    return plans[key]
