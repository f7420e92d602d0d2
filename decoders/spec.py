"""One typed decode spec: the decoder family, its own parameters, the sampling settings and the heads.

Written as `family[:key=value]...`, e.g. `ssd+csd:rows=2:calibrated=false:cfg=3` or `csd:lam=1:coupled=true`.
Keys are the decoder's own parameters (see `decoders.decoder_config`), the sampling settings (`cfg`,
`temperature`, `top_k`, `top_p`) and, for SSD, `heads=PATH`. A command parses the text once, at the edge,
into a frozen `DecodeSpec`; that object (or its dict, across a process boundary) is what configs hold and
actors receive, and `str(spec)` is its canonical text: parameters sorted, every sampling setting written,
so two runs compare equal exactly when they decode alike.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .recipes import DECODER_NAMES, Recipe, SamplingConfig, decoder_config, recipe, unknown_decoder

SAMPLING_KEYS = {"cfg": "cfg_scale", "temperature": "temperature", "top_k": "top_k", "top_p": "top_p"}


def _value(v: str):
    if v.lower() in ("true", "false"):
        return v.lower() == "true"
    for cast in (int, float):
        try:
            return cast(v)
        except ValueError:
            pass
    return v


def _number(key: str, v: str, text: str):
    try:
        return int(v) if key == "top_k" else float(v)
    except ValueError:
        raise ValueError(f"decoder spec {text!r}: {key} must be a number, got {v!r}") from None


@dataclass(frozen=True)
class DecodeSpec:
    family: str = "ar"
    params: tuple[tuple[str, object], ...] = ()  # the decoder's own parameters as given, sorted by key
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    heads: str | None = None  # SSD heads path (default: the model's own)

    def __post_init__(self):
        object.__setattr__(self, "params", tuple(sorted(self.params)))
        try:
            _check(self.family, dict(self.params), self.heads)
        except ValueError as e:  # a Python caller's spec is named by its label (parse names the text given)
            raise ValueError(f"decoder spec {self.label!r}: {e}") from None

    # ------------------------------------------------------------------ construction
    @classmethod
    def parse(cls, text: str) -> "DecodeSpec":
        """`family[:key=value]...` -> DecodeSpec; a malformed piece raises ValueError quoting the spec."""
        family, *kvs = text.strip().split(":")
        params, sampling, heads = {}, {}, None
        for kv in kvs:
            if "=" not in kv:
                raise ValueError(f"decoder spec {text!r}: expected key=value, got {kv!r}")
            k, v = (s.strip() for s in kv.split("=", 1))
            if k in params or k in sampling or (k == "heads" and heads is not None):
                raise ValueError(f"decoder spec {text!r}: {k!r} given twice")
            if k == "heads":
                if not v:
                    raise ValueError(f"decoder spec {text!r}: heads needs a path (heads=PATH)")
                heads = v
            elif k in SAMPLING_KEYS:
                sampling[SAMPLING_KEYS[k]] = _number(k, v, text)
            else:
                params[k] = _value(v)
        try:
            sc = SamplingConfig(**sampling)
        except (TypeError, ValueError) as e:
            raise ValueError(f"decoder spec {text!r}: {e}") from None
        try:  # checked here too, so the message quotes the text the user wrote
            _check(family.strip(), params, heads)
        except ValueError as e:
            raise ValueError(f"decoder spec {text!r}: {e}") from None
        return cls(family.strip(), tuple(params.items()), sc, heads)

    @classmethod
    def of(cls, family: str, params: dict | None = None, sampling: SamplingConfig | None = None) -> "DecodeSpec":
        """From a family and a flat params dict (which may hold `heads`), as a Python caller has them."""
        params = dict(params or {})
        heads = params.pop("heads", None)
        return cls(family, tuple(params.items()), sampling or SamplingConfig(), None if heads is None else str(heads))

    @classmethod
    def from_dict(cls, d: dict) -> "DecodeSpec":
        return cls(d["family"], tuple(d.get("params", {}).items()), SamplingConfig(**d.get("sampling", {})),
                   d.get("heads"))

    # ------------------------------------------------------------------ views
    def config(self):
        """The decoder's typed config (None for ar)."""
        return decoder_config(self.family, dict(self.params))

    def tokens(self, W: int) -> int:
        """Tokens one forward feeds each sample, for an image W tokens wide, as its config says (1 for ar)."""
        cfg = self.config()
        return 1 if cfg is None else cfg.tokens(W)

    @property
    def recipe(self) -> Recipe:
        """What this spec's family is, as it configures it (recipes.py): its loop, drafter and acceptance."""
        return recipe(self.family, dict(self.params))

    def to_dict(self) -> dict:
        return {"family": self.family, "params": dict(self.params), "sampling": dict(self.sampling.__dict__),
                "heads": self.heads}

    @property
    def calibrated(self) -> bool:
        """Whether the device picks this spec's rows (`calibrated=true`): `calibrate.resolve` turns it into the
        concrete spec it decodes as, once per run, recorded, since the choice changes a lossy decoder's tokens."""
        cfg = self.config()
        return cfg is not None and cfg.calibrated

    @property
    def lossless(self) -> bool:
        """Whether its tokens are samples of plain AR's distribution by construction: AR, and the window loop with
        the exact rule (no relaxation, or one that relaxes nothing: lam or delta 0). CSD's relaxation and the block
        decoder (commit=block, which commits whole blocks) are lossy: only a fidelity measurement says how far."""
        cfg = self.config()
        if cfg is None:
            return True
        return self.recipe.loop != "block" and not cfg.relax.active

    @property
    def label(self) -> str:
        """The decoder and its parameters, without sampling: how tables name a row (`csd:lam=0.5`)."""
        heads = f":heads={self.heads}" if self.heads else ""
        return self.family + "".join(f":{k}={_text(v)}" for k, v in self.params) + heads

    def __str__(self) -> str:
        s = self.sampling
        return (self.label + f":cfg={_text(s.cfg_scale)}:temperature={_text(s.temperature)}:top_k={s.top_k}"
                f":top_p={_text(s.top_p)}")


def _check(family: str, params: dict, heads: str | None) -> None:
    """The family, its parameters (names, types and ranges: `decoder_config`) and the heads; ValueError naming
    the key, the expected type and the value."""
    if family not in DECODER_NAMES:
        raise unknown_decoder(family)
    if heads is not None and recipe(family).weights != "heads":
        raise ValueError(f"decoder {family!r} takes no heads (only ssd and ssd+csd do)")
    decoder_config(family, params)


def _text(v) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


def speculative_rows(spec: DecodeSpec) -> int:
    """How far a (resolved) spec speculates, as a calibration counts its choices: an SSD spec's rows per window
    (the block decoder: its cap, max_rows); 0 for plain ar. (Other families draft by window, not by rows: 0.)"""
    cfg = spec.config()
    return 0 if cfg is None else cfg.speculative_rows


def common_sampling(specs: list[DecodeSpec]) -> SamplingConfig:
    """Commands that compare decoders need one sampling setting for all of them (and for their `ar`)."""
    distinct = {s.sampling for s in specs}
    if len(distinct) > 1:
        raise ValueError("decoders compared in one run must share their sampling settings (cfg, temperature, "
                         f"top_k, top_p); got {sorted(str(s) for s in specs)}")
    return distinct.pop() if distinct else SamplingConfig()
