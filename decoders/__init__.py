"""Speculative decoders for AR image-token models: pure torch, no Ray, Prefect or storage.

`decode(name, model, prompts, seeds, sampling, params)` runs the named decoder on any model that
implements `protocol.ImageTokenModel`. `params` is a flat dict of the decoder's own parameters (as a CLI
or a config file gives them); `decoder_config` parses it into the decoder's typed config and rejects
unknown keys.
"""

from __future__ import annotations

from dataclasses import fields

from .ar import decode_ar
from .protocol import ImageTokenModel
from .sampling import SamplingConfig
from .sjd import SJDConfig, decode_sjd
from .stats import DecodeResult
from .verify import Relaxation

CSD_DEFAULTS = {"lam": 0.5, "delta": 0.5}  # chosen on a validation slice, see README (Benchmarks)
DECODER_NAMES = ("ar", "sjd", "csd")


def decoder_config(name: str, params: dict | None = None):
    """Flat params -> the decoder's typed config (None for ar). Raises ValueError naming the parameter."""
    params = dict(params or {})
    if name not in DECODER_NAMES:
        raise ValueError(f"unknown decoder {name!r}; choose one of: {', '.join(DECODER_NAMES)}")
    if name == "ar":
        allowed = set()
    else:
        allowed = {f.name for f in fields(SJDConfig)} - {"relax"}
        if name == "csd":
            allowed |= {f.name for f in fields(Relaxation)}
    unknown = sorted(set(params) - allowed)
    if unknown:
        raise ValueError(f"decoder {name!r} has no parameter(s) {unknown}; it takes {sorted(allowed) or 'none'}")
    if name == "ar":
        return None
    relax = Relaxation(**(CSD_DEFAULTS | {k: params.pop(k) for k in list(params)
                                          if k in {"lam", "delta", "entropy_norm"}})) if name == "csd" \
        else Relaxation()
    return SJDConfig(relax=relax, **params)


def decode(name: str, model: ImageTokenModel, prompts: list[str], seeds: list[int], sc: SamplingConfig,
           params: dict | None = None) -> DecodeResult:
    cfg = decoder_config(name, params)
    if name == "ar":
        return decode_ar(model, prompts, seeds, sc)
    return decode_sjd(model, prompts, seeds, sc, cfg)
