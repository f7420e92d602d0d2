"""The run's settings: one frozen `GenerateConfig`, parsed at the edge (the CLI, or the flow's parameters for a
deployment) and passed whole. `validate` checks every value before anything starts; `recorded` is what
`_config.json` pins once a shard commits (the settings that decide the images, and the inputs' identities).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

from ssdgen.decoders.spec import DecodeSpec

from .audit import DEFAULT_TOLERANCE, check_audit
from .cost import Price, price_for
from .inputs import InputFile
from .webdataset_shards import check_format


@dataclass(frozen=True)
class GenerateConfig:
    """Run settings, parsed at the edge (CLI or flow parameters)."""
    prompts: tuple[str, ...]
    out: str = "out"
    model: str = "reference"
    decoder: DecodeSpec = field(default_factory=DecodeSpec)  # decoder, its parameters, sampling, heads
    seed: int = 0
    shard_size: int = 256
    batch_size: int = 16
    actors: int = 2
    cpus_per_actor: float = 1.0
    gpus_per_actor: float = 0.0
    device_type: str = "cpu"
    ray_address: str | None = None
    cluster_limit: str | None = None  # a Prefect global concurrency limit; the run holds `cluster_slots` of it
    audit: float = 0.0  # fraction of prompts also decoded with `ar` to measure the NLL gap (0 = no audit)
    audit_tolerance: float = DEFAULT_TOLERANCE
    image_format: str = "png"  # png | webp | jpeg, encoded on the actors (workers.decode_worker.encode_image)
    quality: int = 90  # webp/jpeg only
    format: str = "parquet"  # parquet | webdataset | both: the shard's data files (flows/webdataset_shards.py)
    dtype: str = "auto"  # the model's precision on the actors (models/registry.py; auto: bf16 for HF on a GPU)

    def validate(self) -> Price:
        from ssdgen.workers.decode_worker import check_image_format
        from ssdgen.models.registry import check_dtype, check_model_spec
        if not self.prompts:
            raise ValueError("--prompts: give at least one Parquet file or prefix")
        for name in ("shard_size", "batch_size", "actors"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.cpus_per_actor <= 0 or self.gpus_per_actor < 0:
            raise ValueError("--cpus-per-actor must be > 0 and --gpus-per-actor >= 0")
        check_model_spec(self.model, self.decoder)  # and the heads a decoder spec names
        check_audit(self.audit, self.audit_tolerance)
        check_image_format(self.image_format, self.quality)
        check_format(self.format)
        check_dtype(self.dtype, on_gpu=self.gpus_per_actor > 0)
        price = price_for(self.device_type)
        if price.unit == "gpu" and self.gpus_per_actor <= 0:
            raise ValueError(f"--device-type {self.device_type} is priced per GPU, but actors get no GPU "
                             "(set --gpus-per-actor)")
        if price.unit != "gpu" and self.gpus_per_actor > 0:
            raise ValueError(f"--device-type {self.device_type} is a CPU type, but actors get GPUs; "
                             "name the GPU type (e.g. --device-type l4)")
        return price

    @property
    def devices_per_actor(self) -> float:
        return self.gpus_per_actor if self.gpus_per_actor > 0 else self.cpus_per_actor

    @property
    def cluster_slots(self) -> int:
        """Slots this run takes from `cluster_limit`: the GPUs its actors hold, rounded up (2 actors at 0.5 GPU
        take 1), or one per actor when the actors get no GPU."""
        return max(1, math.ceil(self.actors * self.gpus_per_actor)) if self.gpus_per_actor > 0 else self.actors

    @property
    def threads(self) -> int:
        return max(1, int(self.cpus_per_actor))

    def parameters(self) -> dict:
        """The flow's parameters (flows.pipeline.generate) for these settings: the deployment's edge, where the
        decode spec travels as its canonical text."""
        return {f.name: getattr(self, f.name) for f in fields(self)} | {"prompts": list(self.prompts),
                                                                          "decoder": str(self.decoder)}

    def worker_spec(self) -> dict:
        return {"model": self.model, "decode": self.decoder.to_dict(), "threads": self.threads,
                "image_format": self.image_format, "quality": self.quality, "dtype": self.dtype}

    def recorded(self, files: list[InputFile]) -> dict:
        """What `_config.json` holds: everything that decides which images come out, and the output format (a
        resume must not mix shards with and without tars). Every key always, whatever its value. No credentials."""
        keys = ("model", "seed", "shard_size", "batch_size", "audit", "audit_tolerance", "image_format", "quality",
                "format", "dtype")
        # png ignores --quality: recorded as null there, so another --quality resumes a png run
        quality = {"quality": None} if self.image_format == "png" else {}
        return {k: getattr(self, k) for k in keys} | quality | {"decoder": str(self.decoder)} | {
            "inputs": [{"url": f.url, "rows": f.num_rows, "bytes": f.size} | ({"content": f.identity} if f.identity
                                                                              else {}) for f in files]}

    @property
    def audit_label(self) -> str:
        return self.decoder.label
