"""Speculative decoders for AR image-token models: pure torch, no Ray, Prefect or storage.

`run(spec, model, prompts, seeds)` decodes as a `DecodeSpec` says (decoders/spec.py: family, parameters,
sampling, heads; parsed once from text such as `ssd+csd:rows=2:cfg=3`) on any model that implements
`protocol.ImageTokenModel`. `decode(name, model, prompts, seeds, sampling, params)` is the same for a caller
holding a family name and a flat params dict. `decoder_config` turns a family's flat parameters into its
typed config, with the family's defaults, and rejects unknown keys.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from .ar import decode_ar
from .protocol import ImageTokenModel
from .sampling import SamplingConfig
from .sjd import SJDConfig, decode_sjd
from .spec import DecodeSpec
from .ssd import SSDConfig, decode_ssd
from .ssd_heads import SpatialHeads
from .stats import DecodeResult
from .verify import Relaxation

CSD_DEFAULTS = {"lam": 2.0, "delta": 0.9}  # tuned for forwards on 32 eval prompts, see README (Benchmarks)
# ssd+csd is the adaptive decoder: block sizes follow content, and their cap follows the device: the rows
# that maximise expected committed tokens per second on the forward-cost curve the model's device shows at
# this batch size (decoders/cost_curve.py), with plain AR when that is faster (reported in the stats).
SSD_CSD_DEFAULTS = {"adaptive": True, "max_rows": 4, "calibrated": True}
_RELAX = {f.name for f in fields(Relaxation)}
_SJD = {f.name for f in fields(SJDConfig)} - {"relax"}
_SSD = {f.name for f in fields(SSDConfig)} - {"relax"}


@dataclass(frozen=True)
class Family:
    """What a decoder family is: its engine, its parameters, whether CSD relaxes it, its defaults."""
    engine: str  # "ar", "sjd" or "ssd"
    params: frozenset
    relaxed: bool = False
    defaults: tuple = ()


FAMILIES = {
    "ar": Family("ar", frozenset()),
    "sjd": Family("sjd", frozenset(_SJD)),
    "csd": Family("sjd", frozenset(_SJD | _RELAX), relaxed=True, defaults=tuple(CSD_DEFAULTS.items())),
    "ssd": Family("ssd", frozenset(_SSD)),
    "ssd+csd": Family("ssd", frozenset(_SSD | _RELAX), relaxed=True,
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
    if fam.engine == "ar":
        return None
    params = dict(fam.defaults) | params
    relax = Relaxation(**{k: params.pop(k) for k in list(params) if k in _RELAX}) if fam.relaxed else Relaxation()
    return (SSDConfig if fam.engine == "ssd" else SJDConfig)(relax=relax, **params)


def load_heads(model, path=None) -> SpatialHeads:
    """The model's SSD heads, loaded once and kept on the model object."""
    path = path or getattr(model, "default_heads", None)
    if path is None:
        raise ValueError(f"model {model.name!r} has no default SSD heads; pass heads=PATH")
    cache = model.__dict__.setdefault("_ssd_heads", {})
    if str(path) not in cache:
        cache[str(path)] = SpatialHeads.load(path, model)
    return cache[str(path)]


def run(spec: DecodeSpec, model: ImageTokenModel, prompts: list[str], seeds: list[int]) -> DecodeResult:
    """Decode prompts with per-sample seeds as the spec says."""
    engine, cfg, sc = FAMILIES[spec.family].engine, spec.config(), spec.sampling
    if engine == "ar":
        return decode_ar(model, prompts, seeds, sc)
    if engine == "ssd":
        return decode_ssd(model, prompts, seeds, sc, load_heads(model, spec.heads), cfg)
    return decode_sjd(model, prompts, seeds, sc, cfg)


def decode(name: str, model: ImageTokenModel, prompts: list[str], seeds: list[int], sc: SamplingConfig,
           params: dict | None = None) -> DecodeResult:
    """`run` for a caller holding a family name and a flat params dict (tests, notebooks)."""
    return run(DecodeSpec.of(name, params, sc), model, prompts, seeds)
