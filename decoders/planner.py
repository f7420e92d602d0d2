"""The planner: which decoder configuration and which batch size a run decodes with, for the user's objective.

    throughput  the most images per second (per device): the batch size and configuration jointly
    latency     the fastest single image: batch 1 (or the batch the user fixed), the fastest configuration

What it chooses among. Plain AR always. For a calibrated spec (`calibrated=true`, ssd+csd's default) also what
its recipe lets it tune (recipes.py `tunes`, each word's meaning in recipes.TUNES): the window loop with a window
of 3, 4, 5, 6 or 8 tokens (`window=L`; ssd+csd at recipes.SHORT_WINDOW_LAM unless the spec sets lam: the recipe's
`short_window`) and of 1 .. rows raster rows (`rows=r`, L = r * W + 1), or the block decoder's cap on rows.
An uncalibrated spec is decoded as it is; only its batch is chosen.

How, in a few seconds (median of repeats, AR always timed):
  1. a device profile (`measure_profile`): one forward's time t_b(L) feeding L tokens to each of b samples,
     at a few batch sizes (PROFILE_BATCHES) and window sizes (the candidates'), on the run's first prompt;
     between batch sizes linear in b, beyond the largest along its last slope (a device already busy);
  2. a pilot decode of the run's first prompts with the widest window (`pilot`): its histogram of tokens
     committed per forward gives every narrower window's expected tokens per forward, a(L) = E[min(m, L)]
     (a window of L commits at most L per forward; the drafts and their acceptance are the same heads');
  3. each candidate's images per second at batch b: b * a(L) / (N * t_b(L) * (1 + host_L)), where host_L is
     the decoder's own work around a speculative forward (drafting, verification, bookkeeping) as a share of
     the model's step, measured in the pilot (`pilot`); 0 for plain AR; and divided by OPTIMISM, what full
     decodes measured the raw estimate to overstate (stragglers, spread positions).
The best estimate wins; a batch within BATCH_SLACK of the best goes to the smaller one (less memory, less latency
for the same throughput). The choice is made once per run and recorded as a concrete spec and a batch size
(flows/pipeline.py `_plan.json`), so a sample's tokens depend on its seed and that text only; the measurements
are recorded with it. Caching the profile is the worker's business (workers/plan_cache.py): this module
measures and decides, with no I/O.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, fields

import torch

from .recipes import OBJECTIVES
from .cost_curve import CostCurve, sync
from .spec import DecodeSpec

BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)  # batch sizes the throughput objective chooses among
PROFILE_BATCHES = (1, 64)  # the profile's batch sizes (others interpolated, beyond extrapolated)
# a fixed batch larger than this is profiled at this one and scaled linearly (Profile.time with one curve): the
# step is busy there, and the choice depends on the sizes' ratios, not on the batch (at 256 the profile took 14 s)
PROFILE_MAX = max(PROFILE_BATCHES)
INTERPOLATED = (3, 4, 6)  # window sizes read off the profile between their neighbours, not timed
PILOT_SPLIT = 8  # windows up to this size are read off a pilot of this size (`pilot`)
WIDE, WIDE_UP_TO = PILOT_SPLIT, 16  # windows wider than WIDE are timed at batches up to WIDE_UP_TO only; at larger
# ones they are extrapolated along the curve's last slope (the device is busy there: time grows linearly)
HOST = 1.1  # a speculative forward's decoder work on top of the model's step, where the pilot did not measure it
# What the profile and pilot do not see of a speculative batch, measured against full decodes (docs/benchmarks.md,
# 2026-12-02, two CPU cores): a batch runs until its slowest sample is done (the mean tokens per forward of the
# pilot overstates the batch's), its samples sit at spread positions (attention reads up to the furthest), and
# the decoder's fixed work per forward at small batches. The raw estimate of a 1-row window was 1.41x its measured
# speed at batch 1 and 1.40x at batch 16; so a speculative estimate is divided by this, and plain AR (exact, and
# timed as it decodes) wins what the raw estimates would call a close call.
OPTIMISM = 1.4
BATCH_SLACK = 0.03  # a smaller batch within 3% of the best estimate is chosen instead
AR = "ar"


@dataclass(frozen=True)
class Profile:
    """Forward times by batch size: {batch: CostCurve}, measured once (and cacheable: `to_dict`)."""

    curves: dict  # {batch: CostCurve}
    seconds: float  # what measuring it took

    def time(self, batch: int, tokens: int) -> float:
        """Seconds of one forward feeding `tokens` to each of `batch` samples (module doc, step 1)."""
        bs = sorted(self.curves)
        at = {b: self.curves[b].time(tokens) for b in bs}
        if batch in at:
            return at[batch]
        if len(bs) == 1:
            return at[bs[0]] * batch / bs[0]
        lo = max([b for b in bs if b < batch], default=bs[0])
        hi = min([b for b in bs if b > batch], default=None)
        if hi is None:  # beyond the largest: along the last segment's slope
            lo, hi = bs[-2], bs[-1]
        return at[lo] + (at[hi] - at[lo]) * (batch - lo) / (hi - lo)

    def to_dict(self) -> dict:
        curves = {str(b): {"batch": c.batch, "tokens": list(c.tokens), "seconds": list(c.seconds)}
                  for b, c in self.curves.items()}
        return {"curves": curves, "seconds": self.seconds}  # lists: the same after a JSON round trip

    @classmethod
    def from_dict(cls, d: dict) -> "Profile":
        curves = {int(b): CostCurve(c["batch"], tuple(c["tokens"]), tuple(c["seconds"])) for b, c in
                  d["curves"].items()}
        return cls(curves, float(d["seconds"]))


@dataclass(frozen=True)
class Plan:
    """What the planner decided and why: recorded with the concrete spec (`_plan.json`'s measurements)."""

    objective: str
    choice: str  # "ar", "w<L>" (a window of L tokens) or "r<rows>"
    batch: int  # the batch size chosen (or fixed by the user)
    why: str  # the choice in words, for the console and the summary
    estimates: dict  # {"<choice>@<batch>": images per second expected}
    acceptance: dict  # from the pilot: {"<L>": tokens per forward expected, "host:<L>": decoder work / model step}
    profile: dict  # Profile.to_dict()
    seconds: float  # planning time, the profile's and pilot's included (none when they came from the cache)
    cached: bool = False  # whether the profile and acceptance came from the cache (workers/plan_cache.py)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Plan":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})


def candidates(spec: DecodeSpec, W: int) -> dict[str, tuple[DecodeSpec, int]]:
    """{choice: (its concrete spec, tokens per forward L)}: plain AR, and what the spec's recipe lets the planner
    tune (`Recipe.choices`: windows of L tokens, windows of r rows, or the block decoder's caps on rows per
    block, as recipes.TUNES defines each)."""
    if not spec.calibrated:  # decoded as it is: only its batch is chosen
        return {"as-is" if spec.recipe.speculative else AR: (spec, spec.tokens(W))}
    out = {AR: (DecodeSpec("ar", (), spec.sampling), 1)}
    for choice, (chosen, L) in spec.recipe.choices(spec.config(), dict(spec.params), W).items():
        out[choice] = (_concrete(spec, chosen), L)
    return out


def _concrete(spec: DecodeSpec, chosen: dict) -> DecodeSpec:
    params = {k: v for k, v in dict(spec.params).items() if k != "window"} | {"calibrated": False} | chosen
    params = {k: v for k, v in params.items() if not (k == "window" and v == 0)}  # 0: the default, rows decide
    return DecodeSpec(spec.family, tuple(params.items()), spec.sampling, spec.heads)


@torch.no_grad()
def measure_profile(model, prompt: str, use_cfg: bool, batches: tuple[int, ...], tokens: tuple[int, ...],
                    reps: int = 3) -> Profile:
    """Time one forward of each size at each batch: the median of `reps`, taken in rounds over the sizes (this
    machine's speed drifts by tens of percent over seconds: each size's repeats then see the same moments, so
    their ratios, which decide, hold), after one warm-up round per batch."""
    t0, device = time.perf_counter(), torch.device(getattr(model, "device", "cpu"))
    curves = {}
    for B in batches:
        model.start([prompt] * B, use_cfg)
        sizes = sorted(s for s in tokens if B <= WIDE_UP_TO or s <= WIDE)
        feeds = [(torch.zeros(B, s, dtype=torch.long, device=device),
                  (torch.arange(s, device=device) + model.grid[0] * model.grid[1] // 2).expand(B, s)) for s in sizes]
        times: list[list[float]] = [[] for _ in sizes]
        for _ in range(reps + 1):  # the first round warms the allocator and kernels up
            for i, (tok, idx) in enumerate(feeds):
                sync(device)
                a = time.perf_counter()
                model.step(tok, idx)
                sync(device)
                times[i].append(time.perf_counter() - a)
        secs = [sorted(t[1:])[reps // 2] for t in times]
        curves[B] = CostCurve(B, tuple(sizes), tuple(secs))
    return Profile(curves, time.perf_counter() - t0)


def acceptance(hist: list[list[int]], windows: list[int]) -> dict[str, float]:
    """Expected tokens committed per forward by a window of L, from pilot histograms (hist[k] = forwards that
    committed k tokens; the prefill's one token left out): E[min(k, L)] over the pilot's forwards."""
    counts: dict[int, int] = {}
    for h in hist:
        for k, c in enumerate(h):
            counts[k] = counts.get(k, 0) + c - (k == 1)  # the prefill committed token 0
    total = sum(c for k, c in counts.items() if k > 0)
    return {str(L): sum(min(k, L) * c for k, c in counts.items() if k > 0) / max(1, total) for L in windows}


class _StepTimer:
    """The model, with the seconds spent in its `step` counted (everything else is the decoder's own work)."""

    def __init__(self, model):
        self.__dict__["_m"], self.__dict__["inside"] = model, 0.0

    def __getattr__(self, name):
        return getattr(self._m, name)

    def step(self, tokens, index, lengths=None, **kw):  # kw: tree= (window.py: Branches)
        sync(torch.device(getattr(self._m, "device", "cpu")))
        t0 = time.perf_counter()
        try:
            return self._m.step(tokens, index, lengths, **kw)
        finally:
            sync(torch.device(getattr(self._m, "device", "cpu")))
            self.__dict__["inside"] += time.perf_counter() - t0


def pilot(spec: DecodeSpec, model, prompts: list[str], seeds: list[int], heads, run) -> dict[str, float]:
    """Expected tokens per forward of every speculative candidate's window ("<L>"), and its decoder's own work
    per forward as a share of the model's step ("host:<L>"), from pilot decodes of the prompts (`Decoder.resolve`
    hands it the run's first CALIBRATION_PROMPTS): the widest window of at most PILOT_SPLIT tokens (for those
    windows) and the widest overall (for the rest), each on its share of them. A window's acceptance depends on
    how stale its drafts are (and on its relaxation), so each L is read off the narrowest pilot that holds it.
    The host share is measured at the pilot's small batch, where the decoder's fixed work per forward weighs
    most: an upper bound at larger ones."""
    cands = [c for k, c in candidates(spec, model.grid[1]).items() if k != AR]
    small = [c for c in cands if c[1] <= PILOT_SPLIT]
    pilots = sorted({max(group, key=lambda c: c[1]) for group in (small, [c for c in cands if c[1] > PILOT_SPLIT])
                     if group}, key=lambda c: c[1])
    k = len(prompts)
    share = max(1, k // len(pilots))
    out: dict[str, float] = {}
    for i, (widest, L_max) in enumerate(pilots):
        lo = min(i * share, k - share)  # fewer prompts than pilots: they share them
        timed = _StepTimer(model)
        t0 = time.perf_counter()
        res = run(widest, timed, prompts[lo:lo + share], seeds[lo:lo + share], heads)
        host = (time.perf_counter() - t0 - timed.inside) / max(timed.inside, 1e-9)
        mine = [L for _, L in cands if L <= L_max and str(L) not in out]
        out |= acceptance([s.tokens_per_forward_hist for s in res.stats], mine) | {f"host:{L}": host for L in mine}
    return out


def estimate(profile: Profile, accept: dict[str, float], L: int, batch: int, N: int) -> float:
    """Images per second expected of a window of L tokens (1: plain AR) at `batch` (module doc, step 3)."""
    if L == 1:
        return batch / (N * profile.time(batch, 1))
    host = 1.0 + accept.get(f"host:{L}", HOST - 1.0)
    return batch * accept[str(L)] / (N * profile.time(batch, L) * host * OPTIMISM)


def decide(spec: DecodeSpec, W: int, N: int, objective: str, batches: list[int], profile: Profile,
           accept: dict[str, float]) -> tuple[str, int, dict]:
    """(choice, batch, {"<choice>@<batch>": images/s}) that the objective prefers among the candidates."""
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {', '.join(OBJECTIVES)}, got {objective!r}")
    cands = candidates(spec, W)
    est = {f"{c}@{b}": estimate(profile, accept, L, b, N) for c, (_, L) in cands.items() for b in batches}
    if objective == "latency":  # the fastest image: the smallest batch allowed
        est = {k: v for k, v in est.items() if int(k.split("@")[1]) == min(batches)}
    best = max(est.values())
    # the smallest batch within the slack, then the fastest there; AR wins a tie (no drafting for the same speed)
    near = [k for k, v in est.items() if v >= (1 - BATCH_SLACK) * best]
    b = min(int(k.split("@")[1]) for k in near)
    choice = max((k for k in near if int(k.split("@")[1]) == b), key=lambda k: (est[k], k.startswith(AR)))
    return choice.split("@")[0], b, est


def why(choice: str, batch: int, est: dict, device: str) -> str:
    """The choice in words: what it is, at which batch, and how it compares with the runner-up family."""
    name = {"ar": "plain AR"}.get(choice) or (f"window {choice[1:]}" if choice[0] == "w" else
                                              f"a {choice[1:]}-row window" if choice[0] == "r" else "the decoder")
    mine = est[f"{choice}@{batch}"]
    if choice == AR:
        rivals = {k: v for k, v in est.items() if not k.startswith(AR)}
        vs = "the best window"
    else:
        rivals = {k: v for k, v in est.items() if k.startswith(AR)}
        vs = "plain AR's best batch"
    if not rivals:
        return f"{name} at batch {batch}: {mine:.2f} images/s expected on this {device}"
    k = max(rivals, key=rivals.get)
    return (f"{name} at batch {batch}: {mine / rivals[k]:.2f}x the images/s of {vs} ({k.replace('@', ' at batch ')})"
            f" on this {device}")


def plan(spec: DecodeSpec, model, prompts: list[str], seeds: list[int], objective: str, batches: list[int],
         heads=None, cached: dict | None = None, run=None) -> tuple[DecodeSpec, Plan]:
    """Measure (unless `cached` holds a cached plan's "profile" and "acceptance") and decide (module doc) ->
    (the concrete spec, the plan).
    batches: the batch sizes allowed (one: the user fixed it); run: the engine's `run` (passed in by the caller:
    the engine imports this module's callers)."""
    t0 = time.perf_counter()
    W, N = model.grid[1], model.grid[0] * model.grid[1]
    cands = candidates(spec, W)
    sizes = tuple(sorted({L for _, L in cands.values() if L not in INTERPOLATED} | {1}))
    profile = Profile.from_dict(cached["profile"]) if cached else None
    if profile is None:
        pb = (min(batches[0], PROFILE_MAX),) if len(batches) == 1 else (  # a fixed batch: only its own forwards
            (1,) if objective == "latency" else tuple(sorted({min(b, max(batches)) for b in PROFILE_BATCHES})))
        profile = measure_profile(model, prompts[0], spec.sampling.uses_cfg, pb, sizes)
    accept = cached["acceptance"] if cached else (
        pilot(spec, model, prompts, seeds, heads, run) if len(cands) > 1 or AR not in cands else {})
    choice, batch, est = decide(spec, W, N, objective, batches, profile, accept)
    device = "GPU" if torch.device(getattr(model, "device", "cpu")).type == "cuda" else "CPU"
    return cands[choice][0], Plan(objective, choice, batch, why(choice, batch, est, device), est, accept,
                                  profile.to_dict(), time.perf_counter() - t0, cached is not None)
