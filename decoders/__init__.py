"""Speculative decoders for AR image-token models: pure torch, no Ray, Prefect or storage.

`run(spec, model, prompts, seeds)` decodes as a `DecodeSpec` says (decoders/spec.py: family, parameters,
sampling, heads; parsed once from text such as `ssd+csd:rows=2:cfg=3`) on any model that implements
`protocol.ImageTokenModel`. `decode(name, model, prompts, seeds, sampling, params)` is the same for a caller
holding a family name and a flat params dict. `decoder_config` turns a family's flat parameters into its
typed config, with the family's defaults, and rejects unknown keys.

Importing the package loads no torch: the settings (configs.py) and the spec are plain Python, so a driver
that validates and records runs stays small; `run`, `decode`, `load_heads` and
the calibration helpers load the engine on first use.
"""

from __future__ import annotations

from .configs import (CSD_DEFAULTS, DECODER_NAMES, FAMILIES, SSD_CSD_DEFAULTS, Relaxation, SamplingConfig,
                      SJDConfig, SSDConfig, decoder_config)
from .spec import DecodeSpec

_ENGINE = ("run", "decode", "load_heads", "calibrate_spec", "install_spec_plan", "plan_of")


def __getattr__(name: str):
    if name in _ENGINE:
        from . import engine
        return getattr(engine, name)
    raise AttributeError(f"module 'ssdgen.decoders' has no attribute {name!r}")


__all__ = ["CSD_DEFAULTS", "DECODER_NAMES", "FAMILIES", "SSD_CSD_DEFAULTS", "DecodeSpec", "Relaxation",
           "SamplingConfig", "SJDConfig", "SSDConfig", "decoder_config", *_ENGINE]
