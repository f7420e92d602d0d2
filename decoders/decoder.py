"""A decoder: a spec built once for a model, the one value every caller decodes with.

    dec = build(DecodeSpec.parse("ssd+csd"), model)        # the recipe's heads loaded once
    dec = dec.resolve(prompts, seeds, batch=16)             # a calibrated spec: the device's concrete choice
    res = dec.decode(prompts, seeds)                        # DecodeResult: tokens and per-sample statistics
    res = dec.decode(prompts, seeds, slots=16)              # the same tokens, streamed through 16 slots (slots.py)
    str(dec)                                                # the full resolved spec; it reproduces the tokens

`resolve` plans a calibrated spec once (calibrate.py) and returns the concrete decoder with its `plan`; any
other spec with a fixed batch resolves to itself. It owns the pilot-prompt rule: it plans on the first
CALIBRATION_PROMPTS of the prompts it is handed, and a caller hands it the run's first `pilot_rows(batch)` rows
(recipes.py: torch-free, for the driver that reads them), among which an actor's invalid prompts are dropped.
Falling back to plain AR is the decoder's property (`falls_back`): its samples' statistics say so
(`ar_fallback`), wherever it was decided. `decode` refuses a spec still calibrated. A decoder holds no state
between calls: a sample's tokens depend on its seed and `str(dec)` only, never on the batch it is decoded in.
"""

from __future__ import annotations

from .calibrate import AR_FASTER, resolve
from .engine import heads_for, run
from .planner import Plan
from .recipes import CALIBRATION_PROMPTS
from .spec import DecodeSpec
from .stats import DecodeResult


class Decoder:
    """`spec` built for `model` (use `build`): `requested` is what the user asked for, `spec` what decodes."""

    def __init__(self, spec: DecodeSpec, model, heads=None, requested: DecodeSpec | None = None,
                 plan: Plan | None = None):
        self.spec, self.model, self.plan = spec, model, plan
        self.requested = requested or spec
        self.heads = heads

    @property
    def falls_back(self) -> bool:
        """Whether a speculative request decodes as plain AR here (its plan chose AR)."""
        return not self.spec.recipe.speculative and self.requested.recipe.speculative

    def resolve(self, prompts: list[str], seeds: list[int], batch: int | list[int], objective: str = "throughput",
                cached: dict | None = None) -> "Decoder":
        """The concrete decoder this device decodes a calibrated spec as, planned (planner.py) for `objective`
        among the batch sizes `batch` on the first CALIBRATION_PROMPTS of `prompts` (the pilot-prompt rule: module
        doc; a caller hands it the run's first `pilot_rows(batch)`); `plan` says what was measured and why. Any
        other spec with a fixed batch: itself. cached: a cached plan's measurements (workers/plan_cache.py), not
        measured again."""
        k = CALIBRATION_PROMPTS
        spec, plan = resolve(self.spec, self.model, prompts[:k], seeds[:k], batch, self.heads, objective, cached)
        return self if plan is None else Decoder(spec, self.model, self.heads, self.requested, plan)

    def as_spec(self, spec: DecodeSpec) -> "Decoder":
        """This request decoded by a concrete spec decided elsewhere (a run's recorded plan), with the same heads."""
        if spec == self.spec:
            return self
        if spec.recipe.weights is None:  # its drafter loads nothing
            heads = None
        elif self.heads is not None and spec.heads == self.spec.heads:  # the same heads file: already loaded
            heads = self.heads
        else:
            heads = heads_for(spec, self.model)
        return Decoder(spec, self.model, heads, self.requested)

    def decode(self, prompts: list[str], seeds: list[int], slots: int | None = None) -> DecodeResult:
        """Decode prompts with per-sample seeds (engine.run); a fall-back to AR is said in each sample's stats.
        slots: stream them through this many slots (continuous batching, slots.py: the same tokens, in prompt
        order); None: one fixed batch."""
        res = run(self.spec, self.model, prompts, seeds, self.heads, slots)
        if self.falls_back:
            for st in res.stats:
                st.ar_fallback = AR_FASTER
        return res

    def __str__(self) -> str:
        return str(self.spec)

    def __repr__(self) -> str:
        return f"Decoder({str(self.spec)!r})"


def build(spec: DecodeSpec | str, model, heads=None) -> Decoder:
    """A spec (or its text) built once for `model`: its recipe's heads loaded (or `heads` given), nothing else
    kept. The spec is checked here: a bad one fails before any decoding."""
    spec = DecodeSpec.parse(spec) if isinstance(spec, str) else spec
    return Decoder(spec, model, heads if heads is not None else heads_for(spec, model))
