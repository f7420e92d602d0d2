"""Decoding as a spec says: its recipe (recipes.py) names the loop, and `run` calls it with the recipe's typed
config. A spec's every input is an argument (the spec, the model, the prompts and seeds, the heads): nothing is
kept on the model object, so a sample's tokens follow from its seed and the spec's text. Callers hold a
`Decoder` (decoder.py), which calls `run`. With `slots=B` fewer than the prompts, `run` streams them through B slots
(continuous batching, slots.py): the same tokens as a fixed batch, the slots kept busy."""

from __future__ import annotations

from .ar import decode_ar
from .block import decode_block
from .recipes import SamplingConfig
from .protocol import ImageTokenModel
from .spec import DecodeSpec
from .drafters import SpatialHeads
from .slots import decode_slots
from .stats import DecodeResult
from .window import decode_window


def _ar(model, prompts, seeds, sc, cfg, heads) -> DecodeResult:
    return decode_ar(model, prompts, seeds, sc)


# a recipe's loop (recipes.LOOP_NAMES) -> (model, prompts, seeds, sampling, typed config, heads) -> DecodeResult
LOOPS = {"ar": _ar, "window": decode_window, "block": decode_block}


def load_heads(model, path=None) -> SpatialHeads:
    """SSD heads for this model: those at `path`, or the model's own (`capabilities.heads`). Loaded on each call; a
    caller that decodes many batches (the worker, a bench) loads them once and passes them to `run`."""
    path = path or model.capabilities.heads
    if path is None:
        raise ValueError(f"model {model.name!r} has no default SSD heads; pass heads=PATH")
    return SpatialHeads.load(path, model)


def heads_for(spec: DecodeSpec, model) -> SpatialHeads | None:
    """The heads a spec drafts with (its recipe's drafter loads them: `Recipe.weights`), loaded; None for any
    other spec."""
    return None if spec.recipe.weights is None else load_heads(model, spec.heads)


def run(spec: DecodeSpec, model: ImageTokenModel, prompts: list[str], seeds: list[int],
        heads: SpatialHeads | None = None, slots: int | None = None) -> DecodeResult:
    """Decode prompts with per-sample seeds as the spec says; heads: an SSD spec's (default: loaded from
    spec.heads, or the model's own). A calibrated spec must be resolved first (calibrate.resolve): which rows it
    decodes with is the device's choice, made once and recorded, never here. slots: stream the prompts through
    this many slots (slots.py; tokens in prompt order, as a fixed batch gives them); None, or at least as many as
    the prompts: one fixed batch."""
    if spec.calibrated:
        raise ValueError(f"decoder spec {str(spec)!r} is calibrated (calibrated=true): resolve it first "
                         "(ssdgen.decoders.resolve) into the concrete spec the device chose, and run that")
    if slots is not None and slots < 1:
        raise ValueError(f"slots must be at least 1, got {slots}")
    if heads is None:
        heads = heads_for(spec, model)
    if slots is not None and slots < len(prompts):
        return decode_slots(spec.recipe.loop, model, prompts, seeds, spec.sampling, spec.config(), heads, slots)
    return LOOPS[spec.recipe.loop](model, prompts, seeds, spec.sampling, spec.config(), heads)


def decode(name: str, model: ImageTokenModel, prompts: list[str], seeds: list[int], sc: SamplingConfig,
           params: dict | None = None, heads: SpatialHeads | None = None, slots: int | None = None) -> DecodeResult:
    """`run` for a caller holding a family name and a flat params dict (tests, notebooks)."""
    return run(DecodeSpec.of(name, params, sc), model, prompts, seeds, heads, slots)
