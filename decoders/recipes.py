"""What a decoder is, in one place: the typed settings of each loop and the recipe table, the only dispatch on
them. Plain Python, no torch: a driver that only plans, validates and records runs (the Prefect flow) imports
this and never loads torch.

Settings, one config per loop: `WindowConfig` (the window loop, window.py) and `BlockConfig` (the block decoder,
block.py), and the sampling and relaxation they share. Each config checks its own fields, their declared types
first (`check_types`: a bool, an int, a number, one of a str field's CHOICES), then their ranges.

The recipe table (`RECIPES`, `recipe`): a recipe is a loop (ar.py, window.py or block.py), where its drafts come
from (`drafter`: none, cfg.init's guesses, or SSD's spatial heads, drafters.DRAFTERS; what each loads besides
the model and whether it drafts in raster rows: DRAFTER_KINDS), how they are accepted (`acceptance`: the exact
rule, or CSD's relaxation of it, verify.py), the typed config of that loop, the parameters a spec may set, the
defaults over the config's own, what the planner may tune for a calibrated spec (`tunes`; what each word lets
it choose and what that choice feeds per forward: TUNES) and what its short windows take (`short_window`). A new
family or drafter is one entry here (and its drafter one entry in drafters.DRAFTERS); nothing else asks which
config class a spec has, nor compares a family's or a drafter's name.

    family          loop    drafter  weights  acceptance  defaults                                   tunes
    ar              ar      none     -        exact
    sjd             window  guess    -        exact       (window 16: WindowConfig's own)
    csd             window  guess    -        relaxed     lam 2, delta 0.7, coupled, window 33
    ssd             window  heads    heads    exact       coupled, window 0 (= rows rows: 2)         window, rows
    ssd+csd         window  heads    heads    relaxed     lam 2, delta 0.7, coupled, window 0,       window (lam 1
      (the default)                                       calibrated                                 unless set), rows
    ssd, ssd+csd with commit=block: the block decoder (block.py), lossy (+1.7 nats/token measured); tunes max_rows

The planner's rule for the prompts a calibrated spec is planned on is here too (CALIBRATION_PROMPTS,
`pilot_rows`), so that a driver reads them without torch; `Decoder.resolve` (decoder.py) applies it.
"""

from __future__ import annotations

import difflib
import math
import numbers
from collections.abc import Callable, Iterable, Sequence
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
MAX_ROW_WINDOW = 64  # the most tokens a window of raster rows holds (window.py)


def row_window(rows: int, W: int) -> int:
    """Tokens one forward of a window of `rows` raster rows feeds a sample (the last committed token and the rows
    after it), for an image W tokens wide: at most MAX_ROW_WINDOW."""
    return min(MAX_ROW_WINDOW, rows * W + 1)


def branch_tokens(branches: int, branch_len: int, window: int) -> int:
    """Tokens per side branch (window.py: Branches): branch_len, at most the window's drafts; 0 = as many as the window
    has drafts and the forward's MAX_ENTRIES leave room for."""
    if branches < 2:
        return 0
    if branch_len:
        return min(branch_len, window - 1)
    return max(1, min(window - 1, (MAX_ENTRIES - window) // (branches - 1)))


def check_branches(branches: int, branch_len: int, window: int | None) -> None:
    """Proactive drafting's settings (window.py: Branches): their ranges, and that a window's entries fit the cache
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
class DrafterKind:
    """What a drafter is beyond its name (drafters.DRAFTERS builds it): the weights it loads besides the model, and
    whether it drafts in raster rows of the image, so that a window of it may be sized in rows."""

    weights: str | None = None  # "heads": SSD's spatial heads (`heads=PATH`, else the model's own); None: nothing
    spatial: bool = False  # drafts right and below: window=0 means `rows` raster rows; rows, two_d are its settings


# drafters.py: cfg.init's guesses, or SSD's spatial heads (a recipe sets which); plain AR's "none" is neither
DRAFTER_KINDS = {"guess": DrafterKind(), "heads": DrafterKind(weights="heads", spatial=True)}


@dataclass(frozen=True)
class WindowConfig:
    """The window loop's settings (window.py). Every family it decodes (sjd, csd, ssd, ssd+csd) is a recipe
    (recipes.py): a drafter, an acceptance (`relax`) and defaults over these fields."""

    drafter: str = "guess"  # set by the recipe, not a parameter: guess (init) or heads (SSD's spatial heads)
    window: int = 16  # L: tokens per forward (the last committed token + L - 1 drafts); heads: 0 = `rows` rows
    rows: int = 2  # heads with window=0: a window of rows * W + 1 tokens after the last committed one (at most 64)
    init: str = "random"  # guess: how a fresh draft is guessed (INITS)
    two_d: bool = True  # heads: False drafts horizontally only (ablation)
    coupled: bool = False  # Jacobi updates by Gumbel-max with fixed per-position noise (window.py)
    relax: Relaxation = Relaxation()  # lam = 0: the exact (lossless) rule; lam > 0: CSD's relaxation
    lossless: bool = False  # says the same as lam = 0, and refuses a relaxation (`ssd:lossless=true`)
    adaptive: bool = False  # each sample's window follows its own acceptance, up to the window (window.py: WindowSizes)
    packed: bool = True  # the model feeds each sample its own window only (False: every row the whole window)
    branches: int = 1  # candidates for the window's first draft, verified by tree attention (window.py); 1 = off
    branch_len: int = 0  # tokens per side branch (0: the window's drafts, as many as fit: branch_tokens)
    continuation: bool = False  # drafts past the commit point: kept or resampled by the exact rule (window.py)
    commit: str = "prefix"  # commit the verified prefix only; "block" is the block decoder's recipe (recipes.py)
    calibrated: bool = False  # the planner picks the window for the device, once per run (calibrate.py)

    def __post_init__(self):
        check_types(self)
        if self.drafter not in DRAFTER_KINDS:
            raise ValueError(f"drafter must be one of {', '.join(DRAFTER_KINDS)}, got {self.drafter!r}")
        by_rows = self.spatial
        if not (2 <= self.window <= 64 or by_rows and self.window == 0):
            raise ValueError(f"window must be an integer in [2, 64]{', or 0 for `rows` rows' if by_rows else ''}; "
                             f"got {self.window}")
        if not 1 <= self.rows <= 4:
            raise ValueError(f"rows must be an integer in [1, 4], got {self.rows}")
        if self.commit != "prefix":
            raise ValueError("commit=block is the block decoder's (recipes.py), not the window loop's")
        if self.lossless and self.relax.active:
            raise ValueError("lossless SSD cannot use CSD's relaxation (lam > 0; ssd+csd relaxes by default): "
                             "ssd:lossless=true is the lossless spatial decoder")
        check_branches(self.branches, self.branch_len, self.window or None)

    def tokens(self, W: int) -> int:
        """Tokens one forward feeds a sample (L), for an image W tokens wide."""
        return self.window or row_window(self.rows, W)

    @property
    def spatial(self) -> bool:
        """Whether its drafter drafts in raster rows (DRAFTER_KINDS): window=0, rows and two_d are its settings."""
        return DRAFTER_KINDS[self.drafter].spatial

    @property
    def speculative_rows(self) -> int:
        """How far it speculates, as a calibration counts its choices: the heads' rows; 0 for guessed drafts."""
        return self.rows if self.spatial else 0


@dataclass(frozen=True)
class BlockConfig:
    """The block decoder's settings (block.py: SSD's auto-correcting blocks, lossy), reached by `commit=block`."""

    drafter: str = "heads"  # set by the recipe: the block decoder drafts with SSD's heads only
    rows: int = 2  # rows drafted per block
    rounds: int = 2  # r: auto-correction rounds after the first verification forward
    two_d: bool = True  # False: horizontal-only drafting (ablation)
    relax: Relaxation = Relaxation()  # CSD acceptance (ssd+csd)
    adaptive: bool = False  # adapt rows per sample and block (block.AdaptivePolicy), from `rows` up to max_rows
    max_rows: int = 4
    token_budget: int = 0  # drafted tokens per forward the batch may use (0 = unlimited)
    lossless: bool = False  # the block decoder is never lossless: true is refused (ssd:lossless=true is)
    commit: str = "block"
    calibrated: bool = False  # cap rows from the device's measured cost curve (decoders/cost_curve.py)

    def __post_init__(self):
        check_types(self)
        if self.drafter != "heads":
            raise ValueError(f"the block decoder drafts with SSD's heads, not {self.drafter!r}")
        if not 1 <= self.rows <= 4:
            raise ValueError(f"rows must be an integer in [1, 4], got {self.rows}")
        if not self.rows <= self.max_rows <= 4:
            raise ValueError(f"max_rows must be an integer in [rows, 4], got {self.max_rows}")
        if self.token_budget < 0:
            raise ValueError(f"token_budget must be an integer >= 0, got {self.token_budget}")
        if not 0 <= self.rounds <= 8:
            raise ValueError(f"rounds must be an integer in [0, 8], got {self.rounds}")
        if self.lossless:
            raise ValueError("commit=block commits whole blocks and is lossy: ssd:lossless=true (without "
                             "commit=block) is the lossless spatial decoder")
        if self.commit != "block":
            raise ValueError("commit=prefix is the window loop's (recipes.py), not the block decoder's")
        if self.calibrated and self.token_budget:
            raise ValueError("calibrated and token_budget both cap the rows: set one (token_budget=0 with "
                             "calibrated=true, or calibrated=false with a budget)")

    def tokens(self, W: int) -> int:
        """The most tokens one forward feeds a sample, for an image W tokens wide: a block's rows of W drafted
        tokens (its cap, max_rows, when adaptive) and the token before them (block.py re-feeds from there)."""
        return (self.max_rows if self.adaptive else self.rows) * W + 1

    @property
    def speculative_rows(self) -> int:
        return self.max_rows


# A calibrated spec's choices are timed on the run's first CALIBRATION_PROMPTS valid prompts (`Decoder.resolve`
# takes them; at batch 1, one prompt's content would decide for a whole run), found among its first
# `pilot_rows(batch)` rows, which a caller reads and hands to `Decoder.resolve`.
CALIBRATION_PROMPTS = 4


def pilot_rows(batch: int | Sequence[int] | None) -> int:
    """How many of a run's first rows to hand `Decoder.resolve` (decoder.py) for it to plan a calibrated spec on: a
    batch's worth (the largest batch allowed; None: none fixed), and at least CALIBRATION_PROMPTS, so that invalid
    prompts among them (an actor drops those) still leave it CALIBRATION_PROMPTS valid ones where the batch has."""
    most = max(batch) if isinstance(batch, Sequence) else (batch or 0)
    return max(most, CALIBRATION_PROMPTS)
# What a calibrated spec is planned for (decoders/planner.py): the most images per second, or the fastest image.
OBJECTIVES = ("throughput", "latency")

# The seeds of the AR reference set that fidelity measurements (`ssdgen fidelity`, `--audit`) compare a decoder
# with: seed + this offset, so the reference samples are independent of every decoder's own.
REFERENCE_SEED_OFFSET = 7_000_000


# The lossy defaults, chosen on the speed x fidelity frontier of the reference model v2 (docs/benchmarks.md):
# the fewest forwards whose NLL gap to AR stays within 0.15 nats/token (upper end of the 95% interval),
# `ssdgen fidelity` on 64 eval prompts (docs/results/tune_fidelity_v2_sweep*.json), confirmed on 256 by the bench.
CSD_DEFAULTS = (("lam", 2.0), ("delta", 0.7))
# A short window is judged more often per token than a row's: at lam 2 it drifts past the tolerance (+0.21
# nats/token at window 4), at lam 1 it stays within (+0.08 [+0.06, +0.11] at window 5; `ssdgen fidelity`,
# docs/benchmarks.md). The planner's windows of a relaxed recipe take this lam unless the user set one (the
# recipe's `short_window`).
SHORT_WINDOW_LAM = 1.0
WINDOWS = (3, 4, 5, 6, 8)  # window sizes (tokens per forward) the planner may decode a calibrated spec with


@dataclass(frozen=True)
class Tune:
    """What one word of a recipe's `tunes` lets the planner choose for a calibrated spec (planner.py): the values,
    the parameters each one's concrete spec sets, and the tokens one of its forwards feeds a sample (the L the
    planner times it at and reads its acceptance for)."""

    prefix: str  # a choice is named prefix + value: "w5" (a window of 5 tokens), "r2" (2 rows)
    values: Callable[[object], Iterable[int]]  # the spec's typed config -> the values to choose among
    params: Callable[[object, int], dict]  # (config, value) -> the parameters the concrete spec sets
    tokens: Callable[[int, int], int]  # (value, grid width W) -> tokens one forward feeds a sample
    short: bool = False  # its choices are short windows, which take the recipe's `short_window` parameters


TUNES = {
    # the block decoder's cap on rows per block (commit=block): blocks of up to r rows of W drafted tokens
    "max_rows": Tune("r", lambda c: range(1, c.max_rows + 1), lambda c, r: {"rows": min(c.rows, r), "max_rows": r},
                     lambda r, W: r * W),
    # a window of L tokens, whatever the grid's width
    "window": Tune("w", lambda c: WINDOWS, lambda c, L: {"window": L}, lambda L, W: L, short=True),
    # a window of r raster rows (window=0), up to the spec's own rows
    "rows": Tune("r", lambda c: range(1, c.rows + 1), lambda c, r: {"rows": r, "window": 0}, row_window),
}

LOOP_NAMES = ("ar", "window", "block")  # ar.py, window.py, block.py: what a recipe's `loop` may name
ACCEPTANCES = ("exact", "relaxed")  # verify.py

_RELAX = frozenset(f.name for f in fields(Relaxation))
_WINDOW = frozenset({"window", "adaptive", "packed", "branches", "branch_len", "continuation"})
_GUESS = _WINDOW | {"init", "coupled"}
_HEADS = _WINDOW | {"rows", "two_d", "lossless", "commit", "calibrated"}
_BLOCK = frozenset(f.name for f in fields(BlockConfig)) - {"relax", "drafter"}


@dataclass(frozen=True)
class Recipe:
    """One family's configuration of a loop (module doc)."""

    loop: str  # LOOP_NAMES
    drafter: str  # DRAFTER_KINDS (drafters.DRAFTERS), or "none" for ar
    acceptance: str  # ACCEPTANCES
    config: type | None  # WindowConfig, BlockConfig, or None (ar has no parameters)
    params: frozenset = frozenset()  # what a spec may set (with the relaxation's, for a relaxed recipe)
    defaults: tuple = ()  # (key, value) over the config's own defaults
    tunes: tuple = ()  # what the planner may choose for a calibrated spec: TUNES' words, in the order it lists them
    short_window: tuple = ()  # (key, value) a short window (TUNES' "window") takes unless the spec sets the key

    @property
    def relaxed(self) -> bool:
        return self.acceptance == "relaxed"

    @property
    def speculative(self) -> bool:
        """Whether it drafts and verifies: every loop but plain AR's."""
        return self.loop != "ar"

    @property
    def weights(self) -> str | None:
        """What its drafter loads besides the model (DRAFTER_KINDS): "heads" (SSD's spatial heads), or None."""
        return DRAFTER_KINDS[self.drafter].weights if self.drafter in DRAFTER_KINDS else None

    def choices(self, config, given: dict, W: int) -> dict[str, tuple[dict, int]]:
        """What the planner may choose for a calibrated spec of this recipe (its `tunes`, as TUNES defines them),
        for an image W tokens wide: {choice: (the parameters its concrete spec sets over the spec's, the tokens
        one of its forwards feeds a sample)}. config: the spec's typed config; given: the parameters the spec set,
        whose values a short window keeps over `short_window`'s."""
        out = {}
        for word in self.tunes:
            tune = TUNES[word]
            extra = {k: v for k, v in self.short_window if k not in given} if tune.short else {}
            for v in tune.values(config):
                out[f"{tune.prefix}{v}"] = (tune.params(config, v) | extra, tune.tokens(v, W))
        return out

    def build(self, family: str, params: dict):
        """A spec's flat parameters -> this recipe's typed config (None for ar). Raises ValueError naming the
        family and the parameter."""
        allowed = self.params | (_RELAX if self.relaxed else frozenset())
        unknown = sorted(set(params) - allowed)
        if unknown and self.loop == "window" and self.drafter == "heads" and set(unknown) <= _BLOCK:
            raise ValueError(f"{', '.join(unknown)} belong(s) to the block decoder (commit=block), not the window "
                             "loop (commit=prefix, the default), which sizes each sample's window itself")
        if unknown and self.loop == "block" and set(unknown) <= _HEADS:
            raise ValueError(f"{', '.join(unknown)} belong(s) to the window loop (commit=prefix, the default), not "
                             "the block decoder (commit=block), which drafts whole rows")
        if unknown:
            raise ValueError(f"decoder {family!r} has no parameter(s) {unknown}{did_you_mean(unknown[0], allowed)}; "
                             f"it takes {sorted(allowed) or 'none'}")
        if self.config is None:
            return None
        values = dict(self.defaults) | params
        relax = Relaxation(**{k: values.pop(k) for k in list(values) if k in _RELAX})
        return self.config(drafter=self.drafter, relax=relax, **values)

    def describe(self) -> str:
        """One line for listings (`ssdgen decoders`): the loop, the drafter, the acceptance, and what is lossy."""
        if self.loop == "ar":
            return "one token per forward (decoders/ar.py)"
        drafts = {"guess": "guessed drafts (init)", "heads": "SSD heads' drafts"}[self.drafter]
        accept = {"exact": "exact acceptance: lossless",
                  "relaxed": "CSD's relaxed acceptance: within tolerance at the defaults"}[self.acceptance]
        text = f"{self.loop} loop (decoders/{self.loop}.py), {drafts}, {accept}"
        if self.drafter == "heads" and self.loop == "window":
            text += "; commit=block: the block decoder (decoders/block.py), lossy (+1.7 nats/token measured)"
        return text


_COUPLED = (("coupled", True),)
RECIPES = {
    "ar": Recipe("ar", "none", "exact", None),
    "sjd": Recipe("window", "guess", "exact", WindowConfig, _GUESS),
    "csd": Recipe("window", "guess", "relaxed", WindowConfig, _GUESS, CSD_DEFAULTS + _COUPLED + (("window", 33),)),
    "ssd": Recipe("window", "heads", "exact", WindowConfig, _HEADS, _COUPLED + (("window", 0),),
                  tunes=("window", "rows")),
    "ssd+csd": Recipe("window", "heads", "relaxed", WindowConfig, _HEADS,
                      CSD_DEFAULTS + _COUPLED + (("window", 0), ("calibrated", True)), tunes=("window", "rows"),
                      short_window=(("lam", SHORT_WINDOW_LAM),)),
}
# commit=block: the same families on the block decoder
BLOCK_RECIPES = {
    "ssd": Recipe("block", "heads", "exact", BlockConfig, _BLOCK, tunes=("max_rows",)),
    "ssd+csd": Recipe("block", "heads", "relaxed", BlockConfig, _BLOCK, CSD_DEFAULTS + (("calibrated", True),),
                      tunes=("max_rows",)),
}
DECODER_NAMES = tuple(RECIPES)


def did_you_mean(word: str, known: Iterable[str]) -> str:
    """" (did you mean 'x'?)" naming the known names closest to a mistyped one (`sdd+csd`, `lamb`), or "" when
    none is close: a typo is then fixed from the error line, without reading the whole list."""
    word = word.strip().lower()
    score = {k: difflib.SequenceMatcher(None, word, k).ratio() for k in sorted(known)}
    best = max(score.values(), default=0.0)
    close = [k for k, r in score.items() if r >= 0.6 and r == best]  # the closest, and only those tied with it
    return f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""


def unknown_decoder(family: str) -> ValueError:
    """The error for a family that is not one: the closest names first, then every name."""
    return ValueError(f"unknown decoder {family!r}{did_you_mean(family, DECODER_NAMES)}; choose one of: "
                      f"{', '.join(DECODER_NAMES)}")


def recipe(family: str, params: dict | None = None) -> Recipe:
    """The recipe a family's spec decodes by: its entry, or the block decoder's where it says commit=block."""
    if family not in RECIPES:
        raise unknown_decoder(family)
    if (params or {}).get("commit") == "block" and family in BLOCK_RECIPES:
        return BLOCK_RECIPES[family]
    return RECIPES[family]


def decoder_config(name: str, params: dict | None = None):
    """Flat params -> the decoder's typed config (None for ar), the recipe's defaults applied. Raises ValueError
    naming the parameter."""
    params = dict(params or {})
    params.pop("heads", None)  # where the heads are, not how to decode: DecodeSpec.heads
    return recipe(name, params).build(name, params)
