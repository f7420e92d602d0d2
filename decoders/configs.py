"""The decoders' settings as plain frozen dataclasses, with no torch: a driver that only plans, validates and
records runs (the Prefect flow) imports these and never loads torch. Each config checks its own fields, their
declared types first (`check_types`: a bool, an int, a number, one of a str field's CHOICES), then their
ranges; the family table (FAMILIES) says which loop decodes each family, with which drafter and acceptance, which
parameters it takes and its defaults; `decoder_config` turns a family's flat parameters into its typed config.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, fields

ENTROPY_NORMS = ("support", "vocab", "none")
INITS = ("random", "repeat-left", "repeat-above")
COMMITS = ("block", "prefix")
CHOICES = {"entropy_norm": ENTROPY_NORMS, "init": INITS, "commit": COMMITS}  # the str fields' allowed values
_KINDS = {"bool": "true or false", "int": "an integer", "float": "a number"}


def _is(kind: str, value) -> bool:
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "int":  # the range checks below take Python ints only; True is not a row count
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "float":
        return isinstance(value, numbers.Real) and not isinstance(value, bool)
    return isinstance(value, str)


def check_types(config) -> None:
    """Each field of a config against its declared type (bool, int, float, str with its CHOICES), so a value of
    the wrong kind fails with one line naming the field, the type and the value, never a TypeError deep in a
    range check. Annotations are strings here (`from __future__ import annotations`)."""
    for f in fields(config):
        kind, value = str(f.type), getattr(config, f.name)
        if kind not in ("bool", "int", "float", "str"):
            continue  # a nested config (relax) checks itself
        if kind == "str" and f.name in CHOICES and value not in CHOICES[f.name]:
            raise ValueError(f"{f.name} must be one of {', '.join(CHOICES[f.name])}, got {value!r}")
        if not _is(kind, value):
            raise ValueError(f"{f.name} must be {_KINDS.get(kind, 'text')}, got {value!r}")


@dataclass(frozen=True)
class SamplingConfig:
    """How logits become a distribution. temperature 0 means greedy (a one-hot at the arg-max)."""

    cfg_scale: float = 3.0
    temperature: float = 1.0
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off

    def __post_init__(self):
        check_types(self)
        if not math.isfinite(self.cfg_scale) or self.cfg_scale < 0:
            raise ValueError(f"cfg_scale must be a finite number >= 0, got {self.cfg_scale}")
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k must be an integer >= 1, or 0 for off; got {self.top_k}")
        if not (0 < self.top_p <= 1):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def uses_cfg(self) -> bool:
        return self.cfg_scale != 1.0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass(frozen=True)
class Relaxation:
    """CSD's content-aware relaxation. lam = 0 is the standard, lossless rule."""

    lam: float = 0.0
    delta: float = 0.0
    entropy_norm: str = "support"

    def __post_init__(self):
        check_types(self)
        if not math.isfinite(self.lam) or self.lam < 0:
            raise ValueError(f"lam (λ) must be >= 0, got {self.lam}")
        if not 0 <= self.delta <= 1:
            raise ValueError(f"delta (δ) must be in [0, 1], got {self.delta}")

    @property
    def active(self) -> bool:
        return self.lam > 0 and self.delta > 0


MAX_ENTRIES = 192  # what one forward may feed a sample, branches included (the model's spare cache slots)


def branch_tokens(branches: int, branch_len: int, window: int) -> int:
    """Tokens per side branch (branches.py): branch_len, at most the window's drafts; 0 = as many as the window
    has drafts and the forward's MAX_ENTRIES leave room for."""
    if branches < 2:
        return 0
    if branch_len:
        return min(branch_len, window - 1)
    return max(1, min(window - 1, (MAX_ENTRIES - window) // (branches - 1)))


def check_branches(branches: int, branch_len: int, window: int | None) -> None:
    """Proactive drafting's settings (branches.py): their ranges, and that a window's entries fit the cache
    (window None: SSD's, which depends on the grid; an explicit branch_len is checked against the widest, 64)."""
    if not 1 <= branches <= 8:
        raise ValueError(f"branches must be an integer in [1, 8] (1 = off), got {branches}")
    if not 0 <= branch_len <= 63:
        raise ValueError(f"branch_len must be an integer in [0, 63] (0 = the window's drafts), got {branch_len}")
    what = f"window {window}" if window else "the widest ssd window, 64,"
    window = window or 64
    entries = window + (branches - 1) * branch_tokens(branches, branch_len, window)
    if entries > MAX_ENTRIES:
        raise ValueError(f"{what} with {branches} branches of {branch_len} tokens feeds {entries} "
                         f"entries per forward, more than {MAX_ENTRIES}: use fewer branches or a shorter branch_len "
                         "(0 fits them)")


@dataclass(frozen=True)
class SJDConfig:
    window: int = 16  # L: tokens per forward (the last committed token + L - 1 drafts)
    init: str = "random"
    relax: Relaxation = Relaxation()  # lam = 0: lossless SJD; lam > 0: CSD
    coupled: bool = False  # Jacobi updates by Gumbel-max with fixed per-position noise (see module doc)
    adaptive: bool = False  # each sample's window follows its own acceptance, up to `window` (window_sizes.py)
    packed: bool = True  # the model feeds each sample its own window only (False: every row the whole window)
    branches: int = 1  # candidates for the window's first draft, verified by tree attention (branches.py); 1 = off
    branch_len: int = 0  # tokens per side branch (0: the window's drafts, as many as fit: branch_tokens)
    continuation: bool = False  # drafts past the commit point: kept or resampled by the exact rule (window.py)

    def __post_init__(self):
        check_types(self)
        if not isinstance(self.window, int) or not 2 <= self.window <= 64:
            raise ValueError(f"window must be an integer in [2, 64], got {self.window}")
        check_branches(self.branches, self.branch_len, self.window)


@dataclass(frozen=True)
class SSDConfig:
    rows: int = 2  # rows drafted per block (the window loop: a window of rows * W + 1 tokens, unless `window`)
    window: int = 0  # the window loop: tokens per forward (2..64) instead of `rows` rows; 0 = rows * W + 1
    rounds: int = 2  # r: auto-correction rounds after the first verification forward (commit=block)
    lossless: bool = False  # the prefix engine (below) without relaxation: exactly the target's distribution
    # "prefix" (the default): commit the verified prefix only, the window loop (window.py), lossless unless relaxed;
    # "block": r rounds, then the whole block, the block decoder (block.py), lossy (+1.7 nats/token measured)
    commit: str = "prefix"
    two_d: bool = True  # False: horizontal-only drafting (ablation)
    relax: Relaxation = Relaxation()  # CSD acceptance (ssd+csd)
    # commit=block: adapt rows per sample and block (block.AdaptivePolicy) from `rows`; the window loop: each
    # sample's window follows its own acceptance, up to the window (window_sizes.py)
    adaptive: bool = False
    packed: bool = True  # the window loop: the model feeds each sample its own window only (False: padded)
    branches: int = 1  # the window loop: candidates for the first draft, by tree attention (branches.py); 1 = off
    branch_len: int = 0  # the window loop: tokens per side branch (0: the window's drafts)
    continuation: bool = False  # the window loop: drafts past the commit point kept or resampled (window.py)
    max_rows: int = 4
    token_budget: int = 0  # commit=block: drafted tokens per forward the batch may use (0 = unlimited)
    calibrated: bool = False  # cap rows from the device's measured cost curve (decoders/cost_curve.py)

    def __post_init__(self):
        check_types(self)
        if not isinstance(self.rows, int) or not 1 <= self.rows <= 4:
            raise ValueError(f"rows must be an integer in [1, 4], got {self.rows}")
        if self.window and not 2 <= self.window <= 64:
            raise ValueError(f"window must be an integer in [2, 64], or 0 for `rows` rows; got {self.window}")
        if self.window and not self.prefix_engine:
            raise ValueError("window sets the window loop's tokens per forward; the block decoder (commit=block) "
                             "drafts `rows` rows: set window=0")
        if not isinstance(self.max_rows, int) or not self.rows <= self.max_rows <= 4:
            raise ValueError(f"max_rows must be an integer in [rows, 4], got {self.max_rows}")
        if not isinstance(self.token_budget, int) or self.token_budget < 0:
            raise ValueError(f"token_budget must be an integer >= 0, got {self.token_budget}")
        if not isinstance(self.rounds, int) or not 0 <= self.rounds <= 8:
            raise ValueError(f"rounds must be an integer in [0, 8], got {self.rounds}")
        if self.lossless and self.relax.active:
            raise ValueError("lossless SSD cannot use CSD's relaxation (lam > 0; ssd+csd relaxes by default): "
                             "ssd:lossless=true is the lossless spatial decoder")
        if self.branches > 1 and not self.prefix_engine:
            raise ValueError("branches belong to the window loop (commit=prefix); the block decoder (commit=block) "
                             "has none: set branches=1")
        if self.prefix_engine:
            check_branches(self.branches, self.branch_len, self.window or None)
        if self.prefix_engine and self.token_budget:
            raise ValueError("the prefix engine (commit=prefix, the default, or lossless) sizes each sample's "
                             "window itself: token_budget is not supported (it belongs to the lossy block decoder, "
                             "commit=block); set token_budget=0")
        if self.calibrated and self.token_budget:
            raise ValueError("calibrated and token_budget both cap the rows: set one (token_budget=0 with "
                             "calibrated=true, or calibrated=false with a budget)")

    @property
    def prefix_engine(self) -> bool:
        """Whether the window loop decodes this config (window.py); else the block decoder (block.py)."""
        return self.lossless or self.commit == "prefix"


# The lossy defaults, chosen on the speed x fidelity frontier of the reference model v2 (docs/benchmarks.md):
# the fewest forwards whose NLL gap to AR stays within 0.15 nats/token (upper end of the 95% interval),
# `ssdgen fidelity` on 64 eval prompts (docs/results/tune_fidelity_v2_sweep*.json), confirmed on 256 by the bench.
CSD_DEFAULTS = {"lam": 2.0, "delta": 0.7}
# csd: SJD's coupled Jacobi drafts over a 33-token window, which CSD's relaxation then judges
CSD_SJD_DEFAULTS = {"coupled": True, "window": 33}
# ssd+csd: the prefix engine (commit only the verified prefix, carry the rest in a sliding 2-row window: SSDConfig's
# default commit), which stays within tolerance where committing whole blocks after r rounds does not (+1.1
# nats/token at lam 1); the device decides once per run whether the window holds 1 or 2 rows or plain AR is
# faster (decoders/calibrate.py `resolve`, which turns the spec into a concrete one).
SSD_CSD_DEFAULTS = {"commit": "prefix", "adaptive": False, "calibrated": True}
# A calibrated spec's choices are timed on at least this many prompts (a batch, when that is larger): at batch 1,
# one prompt's content would decide for a whole run (decoders/calibrate.py).
CALIBRATION_PROMPTS = 4
# What a calibrated spec is planned for (decoders/planner.py): the most images per second, or the fastest image.
OBJECTIVES = ("throughput", "latency")
_RELAX = {f.name for f in fields(Relaxation)}
_SJD = {f.name for f in fields(SJDConfig)} - {"relax"}
_SSD = {f.name for f in fields(SSDConfig)} - {"relax"}


LOOPS = ("ar", "window", "block")  # ar.py, window.py, block.py
DRAFTERS = ("none", "guess", "heads")  # drafters.py: cfg.init's guesses (random, repeat), or SSD's spatial heads
ACCEPTANCES = ("exact", "relaxed")  # verify.py: the lossless rule, or CSD's relaxation of it


@dataclass(frozen=True)
class Family:
    """What a decoder family is: the loop that decodes it, where its drafts come from and how they are accepted
    (its configuration of that loop), the typed config of its parameters, and its defaults. `commit=block`
    (ssd, ssd+csd) swaps the window loop for the block decoder: `loop_for`."""
    loop: str  # LOOPS
    drafter: str  # DRAFTERS
    acceptance: str  # ACCEPTANCES
    config: type | None  # SJDConfig, SSDConfig, or None (ar has no parameters)
    params: frozenset
    defaults: tuple = ()

    @property
    def relaxed(self) -> bool:
        return self.acceptance == "relaxed"

    def loop_for(self, cfg) -> str:
        """The loop that decodes `cfg` (this family's typed config): the block decoder when it says commit=block."""
        return "block" if isinstance(cfg, SSDConfig) and not cfg.prefix_engine else self.loop

    def describe(self) -> str:
        """One line for listings (`ssdgen decoders`): the loop, the drafter, the acceptance, and what is lossy."""
        if self.loop == "ar":
            return "one token per forward (decoders/ar.py)"
        drafts = {"guess": "guessed drafts (init)", "heads": "SSD heads' drafts"}[self.drafter]
        accept = {"exact": "exact acceptance: lossless",
                  "relaxed": "CSD's relaxed acceptance: within tolerance at the defaults"}[self.acceptance]
        text = f"{self.loop} loop (decoders/{self.loop}.py), {drafts}, {accept}"
        if self.config is SSDConfig:
            text += "; commit=block: the block decoder (decoders/block.py), lossy (+1.7 nats/token measured)"
        return text


FAMILIES = {
    "ar": Family("ar", "none", "exact", None, frozenset()),
    "sjd": Family("window", "guess", "exact", SJDConfig, frozenset(_SJD)),
    "csd": Family("window", "guess", "relaxed", SJDConfig, frozenset(_SJD | _RELAX),
                  defaults=tuple((CSD_DEFAULTS | CSD_SJD_DEFAULTS).items())),
    "ssd": Family("window", "heads", "exact", SSDConfig, frozenset(_SSD)),
    "ssd+csd": Family("window", "heads", "relaxed", SSDConfig, frozenset(_SSD | _RELAX),
                      defaults=tuple((CSD_DEFAULTS | SSD_CSD_DEFAULTS).items())),
}
DECODER_NAMES = tuple(FAMILIES)


def decoder_config(name: str, params: dict | None = None):
    """Flat params -> the decoder's typed config (None for ar). Raises ValueError naming the parameter."""
    fam = FAMILIES.get(name)
    if fam is None:
        raise ValueError(f"unknown decoder {name!r}; choose one of: {', '.join(DECODER_NAMES)}")
    params = dict(params or {})
    params.pop("heads", None)  # where the heads are, not how to decode: DecodeSpec.heads
    unknown = sorted(set(params) - fam.params)
    if unknown:
        raise ValueError(f"decoder {name!r} has no parameter(s) {unknown}; it takes {sorted(fam.params) or 'none'}")
    if fam.config is None:
        return None
    params = dict(fam.defaults) | params
    relax = Relaxation(**{k: params.pop(k) for k in list(params) if k in _RELAX}) if fam.relaxed else Relaxation()
    return fam.config(relax=relax, **params)

# The seeds of the AR reference set that fidelity measurements (`ssdgen fidelity`, `--audit`) compare a decoder
# with: seed + this offset, so the reference samples are independent of every decoder's own.
REFERENCE_SEED_OFFSET = 7_000_000
