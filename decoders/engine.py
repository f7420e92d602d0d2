"""Decoding as a spec says: the one dispatch from a `DecodeSpec` to the decoder that runs it, the SSD heads a
model decodes with, loaded once per model object, and a calibrated spec's plan (calibrate.py)."""

from __future__ import annotations

from .ar import decode_ar
from .calibrate import Plan, calibrate, install_plan, plan_key
from .configs import FAMILIES, SamplingConfig
from .protocol import ImageTokenModel
from .sjd import decode_sjd
from .spec import DecodeSpec
from .ssd import choice_decoder, decode_ssd
from .ssd_heads import SpatialHeads
from .stats import DecodeResult


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


def calibrate_spec(spec: DecodeSpec, model, prompts: list[str], seeds: list[int], batch: int) -> Plan:
    """The plan of a calibrated spec at `batch` on this model's device, timed on `prompts` (calibrate.py)."""
    cfg, sc = spec.config(), spec.sampling
    decode_as = choice_decoder(model, sc, load_heads(model, spec.heads), cfg)
    return calibrate(model, cfg, sc, prompts, seeds, batch, decode_as)


def install_spec_plan(spec: DecodeSpec, model, plan: Plan | dict) -> None:
    """Decode `spec` on this model object by `plan` from now on, whatever the batch (a run's recorded plan)."""
    plan = plan if isinstance(plan, Plan) else Plan.from_dict(plan)
    install_plan(model, spec.config(), spec.sampling, load_heads(model, spec.heads), plan)


def plan_of(spec: DecodeSpec, model) -> Plan | None:
    """The plan a calibrated spec decodes by on this model object (installed, or made at its first batch)."""
    if not spec.calibrated:
        return None
    cfg, sc = spec.config(), spec.sampling
    return model.__dict__.get("_ssd_plans", {}).get(plan_key(cfg, sc, load_heads(model, spec.heads)))


def decode(name: str, model: ImageTokenModel, prompts: list[str], seeds: list[int], sc: SamplingConfig,
           params: dict | None = None) -> DecodeResult:
    """`run` for a caller holding a family name and a flat params dict (tests, notebooks)."""
    return run(DecodeSpec.of(name, params, sc), model, prompts, seeds)
