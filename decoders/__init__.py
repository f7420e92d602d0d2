"""Speculative decoders for AR image-token models: pure torch, no Ray, Prefect or storage.

`decode(name, model, prompts, seeds, sampling, params)` runs the named decoder on any model that
implements `protocol.ImageTokenModel`. `params` is a flat dict of the decoder's own parameters (as a CLI
or a config file gives them); `decoder_config` parses it into the decoder's typed config and rejects
unknown keys. SSD decoders also take `heads`: a path to trained heads (default: the model's own).
"""

from __future__ import annotations

from dataclasses import fields

from .ar import decode_ar
from .protocol import ImageTokenModel
from .sampling import SamplingConfig
from .sjd import SJDConfig, decode_sjd
from .ssd import SSDConfig, decode_ssd
from .ssd_heads import SpatialHeads
from .stats import DecodeResult
from .verify import Relaxation

CSD_DEFAULTS = {"lam": 2.0, "delta": 0.9}  # tuned for forwards on 32 eval prompts, see README (Benchmarks)
# ssd+csd is the adaptive decoder: block sizes follow content, and their cap follows the device: the rows
# that maximise expected committed tokens per second on the forward-cost curve the model's device shows at
# this batch size (decoders/cost_curve.py), with plain AR when that is faster (reported in the stats).
SSD_CSD_DEFAULTS = {"adaptive": True, "max_rows": 4, "calibrated": True}
DECODER_NAMES = ("ar", "sjd", "csd", "ssd", "ssd+csd")
_RELAX = {f.name for f in fields(Relaxation)}


def decoder_config(name: str, params: dict | None = None):
    """Flat params -> the decoder's typed config (None for ar). Raises ValueError naming the parameter."""
    params = dict(params or {})
    if name not in DECODER_NAMES:
        raise ValueError(f"unknown decoder {name!r}; choose one of: {', '.join(DECODER_NAMES)}")
    base = {"ar": set(), "sjd": {f.name for f in fields(SJDConfig)} - {"relax"},
            "ssd": ({f.name for f in fields(SSDConfig)} - {"relax"}) | {"heads"}}
    allowed = base[name.split("+")[0] if name != "csd" else "sjd"] | (_RELAX if name.endswith("csd") else set())
    unknown = sorted(set(params) - allowed)
    if unknown:
        raise ValueError(f"decoder {name!r} has no parameter(s) {unknown}; it takes {sorted(allowed) or 'none'}")
    if name == "ar":
        return None
    relax = Relaxation(**(CSD_DEFAULTS | {k: params.pop(k) for k in list(params) if k in _RELAX})) \
        if name.endswith("csd") else Relaxation()
    params.pop("heads", None)
    if name == "ssd+csd":
        params = SSD_CSD_DEFAULTS | params
    if name.startswith("ssd"):
        return SSDConfig(relax=relax, **params)
    return SJDConfig(relax=relax, **params)


def load_heads(model, path=None) -> SpatialHeads:
    """The model's SSD heads, loaded once and kept on the model object."""
    path = path or getattr(model, "default_heads", None)
    if path is None:
        raise ValueError(f"model {model.name!r} has no default SSD heads; pass heads=PATH")
    cache = model.__dict__.setdefault("_ssd_heads", {})
    if str(path) not in cache:
        cache[str(path)] = SpatialHeads.load(path, model)
    return cache[str(path)]


def decode(name: str, model: ImageTokenModel, prompts: list[str], seeds: list[int], sc: SamplingConfig,
           params: dict | None = None) -> DecodeResult:
    cfg = decoder_config(name, params)
    if name == "ar":
        return decode_ar(model, prompts, seeds, sc)
    if name.startswith("ssd"):
        return decode_ssd(model, prompts, seeds, sc, load_heads(model, (params or {}).get("heads")), cfg)
    return decode_sjd(model, prompts, seeds, sc, cfg)
