"""Speculative decoders for AR image-token models: pure torch, no Ray, Prefect or storage.

`run(spec, model, prompts, seeds, heads=None)` decodes as a `DecodeSpec` says (decoders/spec.py: family,
parameters, sampling, heads; parsed once from text such as `ssd+csd:rows=2:cfg=3`) on any model that implements
`protocol.ImageTokenModel`: the family table (configs.FAMILIES) names its loop, window.py (the default; SJD, CSD
and SSD are configurations of it) or block.py (SSD's lossy block decoder, only with commit=block), and run calls
it. A `calibrated=true` spec (ssd+csd's default) is first turned into a concrete one by `resolve(spec, model,
prompts, seeds, batch, heads)` (calibrate.py), which returns it with its `Plan` (planner.py); `run` refuses a spec still
calibrated. `load_heads(model, path)` loads SSD heads; nothing is kept on the model object. `decode(name, model,
prompts, seeds, sampling, params, heads)` is `run` for a caller holding a family name and a flat params dict.
`decoder_config` turns a family's flat parameters into its typed config, with the family's defaults.

Importing the package loads no torch: the settings (configs.py) and the spec are plain Python, so a driver
that validates and records runs stays small; `run`, `decode`, `load_heads`, `resolve` and `Plan` load
the engine on first use.
"""

from __future__ import annotations

from .configs import (CSD_DEFAULTS, DECODER_NAMES, FAMILIES, SSD_CSD_DEFAULTS, Relaxation, SamplingConfig,
                      SJDConfig, SSDConfig, decoder_config)
from .spec import DecodeSpec

_ENGINE = ("run", "decode", "load_heads", "heads_for")  # engine.py
_CALIBRATE = ("resolve", "Plan")  # calibrate.py


def __getattr__(name: str):
    if name in _ENGINE:
        from . import engine
        return getattr(engine, name)
    if name in _CALIBRATE:
        from . import calibrate
        return getattr(calibrate, name)
    raise AttributeError(f"module 'ssdgen.decoders' has no attribute {name!r}")


__all__ = ["CSD_DEFAULTS", "DECODER_NAMES", "FAMILIES", "SSD_CSD_DEFAULTS", "DecodeSpec", "Relaxation",
           "SamplingConfig", "SJDConfig", "SSDConfig", "decoder_config", *_ENGINE, *_CALIBRATE]
