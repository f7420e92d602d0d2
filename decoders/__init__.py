"""Speculative decoders for AR image-token models: pure torch, no Ray, Prefect or storage.

A caller holds one `Decoder` (decoder.py), built once from a `DecodeSpec` (spec.py: family, parameters,
sampling, heads; parsed once from text such as `ssd+csd:rows=2:cfg=3`) for any model that implements
`protocol.ImageTokenModel`:

    dec = build(spec, model)                    # the recipe's heads loaded once
    dec = dec.resolve(prompts, seeds, batch)    # a calibrated spec (ssd+csd's default): the device's choice
    dec.decode(prompts, seeds)                  # -> DecodeResult; str(dec) is the spec that reproduces it

What a family is lives in one table, recipes.RECIPES: its loop (window.py, the default: SJD, CSD and SSD are
configurations of it; block.py, SSD's lossy block decoder with commit=block; ar.py), its drafter, its acceptance,
its typed config (WindowConfig, BlockConfig, in the same module) and its defaults. `decode(name, model, prompts,
seeds, sampling, params, heads)` decodes a concrete spec from a family name and flat params (tests, notebooks).

Importing the package loads no torch: the settings, the recipes and the spec are plain Python, so a driver that
validates and records runs stays small; `build`, `Decoder`, `decode`, `load_heads` and `Plan` load the engine
on first use.
"""

from __future__ import annotations

from .recipes import (DECODER_NAMES, RECIPES, BlockConfig, Relaxation, SamplingConfig, WindowConfig, decoder_config,
                      recipe)
from .spec import DecodeSpec

_LAZY = {"build": "decoder", "Decoder": "decoder", "decode": "engine", "load_heads": "engine", "Plan": "planner",
         "run": "engine", "resolve": "calibrate"}  # run, resolve: the Decoder's own steps, for tests


def __getattr__(name: str):
    if name in _LAZY:
        import importlib
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'ssdgen.decoders' has no attribute {name!r}")


__all__ = ["BlockConfig", "DECODER_NAMES", "DecodeSpec", "RECIPES", "Relaxation", "SamplingConfig", "WindowConfig",
           "decoder_config", "recipe", *_LAZY]
