"""The settings an actor decodes and encodes by: the part of a run's settings the worker needs. The run's own
(flows.settings.RunSettings) extends this class, so each of these fields is spelled once, here, and the flow
hands the actor `RunSettings.worker()`: this part, typed, validated once.

The decode spec is text such as `ssd+csd:rows=2:cfg=3` on the way in, parsed once by the field's validator, and
its canonical text on the way out (Prefect's form, `_config.json`, the summary). The model spec is kept as text,
its checkpoint folder spelled one way (a trailing `/`, `.` or `..` make no other model on resume).
"""

from __future__ import annotations

import dataclasses
from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PlainSerializer, WithJsonSchema

from ssdgen.decoders.spec import DecodeSpec
from ssdgen.models.checkpoints import one_folder
from ssdgen.models.registry import MODEL_HELP, ModelSpec


def _spec(value) -> DecodeSpec:
    return value if isinstance(value, DecodeSpec) else DecodeSpec.parse(str(value))


def _model(value):
    """--model with its folder spelled one way (models.checkpoints.one_folder), so `_config.json`, each row's
    `model` and the actors see one text for one model and a resume with `reference:/m/` is not another model's."""
    if not isinstance(value, str):
        return value
    try:
        spec = ModelSpec.parse(value)
    except ValueError:
        return value  # RunSettings.check refuses it in one line
    return str(dataclasses.replace(spec, path=one_folder(spec.path)) if spec.path else spec)


Spec = Annotated[DecodeSpec, BeforeValidator(_spec), PlainSerializer(str, return_type=str),
                 WithJsonSchema({"type": "string", "default": "ssd+csd"})]


def option(default, help: str, flag: str | None = None):
    """A setting's default and help, the same for the CLI option (`flag`, else --the-name) and Prefect's form.
    Defaults are validated too: the decode spec's is its text."""
    return Field(default, description=help, json_schema_extra={"flag": flag} if flag else None, validate_default=True)


class WorkerSettings(BaseModel):
    """What decides an actor's images: the model, the decode spec, the encoding and the model's precision."""

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    model: Annotated[str, BeforeValidator(_model)] = option("reference", MODEL_HELP)
    decoder: Spec = option("ssd+csd", "decode spec FAMILY[:key=value...], e.g. ar, sjd, csd:lam=0.5, "
                           "ssd+csd:rows=2 (`ssdgen decoders` lists them); the default ssd+csd decides once per run "
                           "whether and how far to speculate on this device (_plan.json)")
    image_format: str = option("png", "encoding of the stored images: png (lossless), webp or jpeg")
    quality: int = option(90, "webp/jpeg quality, 1..100 (png ignores it)")
    dtype: str = option("auto", "model precision: fp32, bf16, fp16 (GPU only) or auto (fp32 on the CPU; on a GPU "
                                "bf16 for Hugging Face checkpoints, fp32 for the reference model)")
