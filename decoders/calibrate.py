"""The device calibration of a `calibrated=true` spec: `resolve` turns it into a concrete spec (plain `ar` with the
same sampling, or the window loop with a window of L tokens or of r rows) at a batch size, for an objective, and
says what it measured; the planner (planner.py) does the measuring and deciding.

Why resolve. A lossy decoder's tokens depend on its window, so a choice that followed the timing of every batch
would give a sample other tokens on a retry, in another batch or on another actor. The standard is that a sample's
tokens depend on its seed only. So the choice is made once, before the first shard (flows/pipeline.py), and
recorded as the concrete spec's text (`_plan.json`), which the actors then decode by: the text alone reproduces
the tokens, whatever the batch, the retry or the actor. `run` refuses a spec still calibrated.
"""

from __future__ import annotations

from .engine import heads_for, run
from .planner import AR, Plan, candidates, plan
from .spec import DecodeSpec

AR_FASTER = "plain AR is faster on this device at this batch size"


def choices(spec: DecodeSpec) -> dict[str, DecodeSpec]:
    """A calibrated spec's speculative choices, {choice: its concrete spec} ("w<L>", "r<rows>"); {} for any
    other spec. (A grid width of 16 sizes the rows' windows for listing only: the choice's spec is the same.)"""
    if not spec.calibrated:
        return {}
    return {c: s for c, (s, _) in candidates(spec, 16).items() if c != AR}


def resolve(spec: DecodeSpec, model, prompts: list[str], seeds: list[int], batch: int | list[int],
            heads=None, objective: str = "throughput", cached: dict | None = None
            ) -> tuple[DecodeSpec, Plan | None]:
    """A calibrated spec -> (the concrete spec this device decodes it as, the plan), planned on `prompts`
    (planner.py); batch: the batch size, or the sizes the planner may choose among. Any other spec with a fixed
    batch -> (itself, None). heads: an SSD spec's (default: loaded); cached: a cached plan's measurements
    (workers/plan_cache.py), which then are not measured again."""
    batches = [batch] if isinstance(batch, int) else sorted(batch)
    if not spec.calibrated and len(batches) == 1:
        return spec, None
    if heads is None:
        heads = heads_for(spec, model)
    return plan(spec, model, prompts, seeds, objective, batches, heads, cached, run)
