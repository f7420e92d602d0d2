"""Speculative decoders for AR image-token models: pure torch, no Ray, Prefect or storage.

`decode(name, model, prompts, seeds, sampling, params)` runs the named decoder on any model that
implements `protocol.ImageTokenModel`.
"""

from __future__ import annotations

from typing import Callable

from .ar import decode_ar
from .protocol import ImageTokenModel
from .sampling import SamplingConfig
from .stats import DecodeResult

DECODERS: dict[str, Callable[..., DecodeResult]] = {
    "ar": lambda model, prompts, seeds, sc, params: decode_ar(model, prompts, seeds, sc),
}


def decode(name: str, model: ImageTokenModel, prompts: list[str], seeds: list[int], sc: SamplingConfig,
           params: dict | None = None) -> DecodeResult:
    if name not in DECODERS:
        raise ValueError(f"unknown decoder {name!r}; choose one of: {', '.join(DECODERS)}")
    return DECODERS[name](model, prompts, seeds, sc, params or {})
