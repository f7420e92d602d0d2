"""The run's settings: one frozen pydantic `RunSettings`, the flow's one parameter. The CLI builds it once from
its options (ssdgen/cli/run_options.py makes `generate`'s and `serve`'s options from these fields, help
included); a deployment passes it nested (`settings:` in infra/prefect.yaml), and Prefect validates it and
renders it as a form. It extends the worker's part (workers/settings.py: model, decoder, encoding, precision),
which the actors receive as `worker()`. `check` tests every value against the rest before anything starts;
`recorded` is what `_config.json` pins once a shard commits (the settings that decide the images, and the
inputs' identities).
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Annotated

import pyarrow as pa
from pydantic import BeforeValidator, Field

from ssdgen.decoders.recipes import OBJECTIVES
from ssdgen.formats import check_format
from ssdgen.inputs.columns import kept_schema
from ssdgen.inputs.files import InputFile
from ssdgen.inputs.text import ReadAs
from ssdgen.output.audit import DEFAULT_TOLERANCE, check_audit
from ssdgen.output.cost import Price, price_from
from ssdgen.output.layout import RESERVED_COLUMNS
from ssdgen.workers.settings import WorkerSettings, option as _option


def _names(value) -> tuple[str, ...]:
    """Column names as given: repeated, comma-separated, or both."""
    values = [value] if isinstance(value, str) else list(value or ())
    return tuple(n.strip() for v in values for n in str(v).split(",") if n.strip())


Columns = Annotated[tuple[str, ...], BeforeValidator(_names)]
DEFAULT_BATCH = 16  # prompts per decoder call of a concrete decoder when the user sets none


class RunSettings(WorkerSettings):
    """Every setting of a run, parsed once at the edge and passed whole: the worker's part and the run's own."""

    prompts: tuple[str, ...] = _option(..., "prompt file (Parquet, CSV, TSV, JSON, JSONL or txt), folder, prefix or "
                                            "glob at any fsspec URL; repeatable; `{date}` becomes the run's date, "
                                            "as in --out")
    input_format: str | None = _option(None, "read --prompts as this format: parquet, csv, tsv, json, jsonl or txt "
                                             "(one prompt a line); default: by each file's suffix, and a folder's "
                                             "*.parquet")
    prompt_column: str = _option("prompt", "the input column that holds the prompt")
    out: str = _option("out/run", "output URL (local path, s3://, gs://, ...); `{date}` becomes the run's date "
                                  "(a scheduled run's scheduled date), YYYY-MM-DD")
    seed: int = _option(0, "run seed; a row's own `seed` column wins")
    shard_size: int = _option(256, "rows per shard")
    batch_size: int | None = _option(None, "prompts per decoder call (default: a calibrated decoder's plan "
                                           "chooses it for --objective, up to what memory holds; 16 for a "
                                           "concrete decoder)")
    objective: str = _option("throughput", "what a calibrated decoder is planned for: throughput (the most "
                                           "images/s) or latency (the fastest image)")
    plan: str | None = _option(None, "replay another run's decode plan: its output URL, or a _plan.json file "
                                     "(the same prompts and seeds then give the same images)")
    actors: int = _option(2, "Ray actors (each loads the model once)")
    cpus_per_actor: float = _option(1.0, "Ray num_cpus per actor (= torch threads on CPU)")
    gpus_per_actor: float = _option(0.0, "Ray num_gpus per actor (0 on CPU)")
    device_type: str = _option("cpu", "price row in the shipped price table (cpu, l4, h100, ...), or in --prices")
    prices: str | None = _option(None, "your price table instead of the shipped one: a CSV with the shipped table's "
                                       "columns (local path or fsspec URL); --device-type names its row")
    # read as text by the CLI (run_options), so a value that is not a number is one `error:` line from pydantic
    usd_per_hour: float | None = Field(None, description="your on-demand price in USD per device-hour of "
                                       "--device-type, instead of the table's: per GPU-hour, or per vCPU-hour for "
                                       "a vcpu type such as cpu", json_schema_extra={"cli_text": True})
    spot_usd_per_hour: float | None = Field(None, description="with --usd-per-hour: your spot price, per the same "
                                            "device-hour (else the run has no spot cost)",
                                            json_schema_extra={"cli_text": True})
    ray_address: str | None = _option(None, "attach to a Ray cluster (default: RAY_ADDRESS, else a local Ray)")
    cluster_limit: str | None = _option(None, "Prefect global concurrency limit to hold a slot of per GPU (per "
                                              "actor on CPUs)")
    audit: float = _option(0.0, "also decode this fraction of the prompts (chosen by prompt_id) with ar and report "
                                "the NLL gap to it in summary.json; 0 = no audit")
    audit_tolerance: float = _option(DEFAULT_TOLERANCE, "allowed |NLL gap| of the audit, nats/token (95% interval)")
    format: str = _option("parquet", "output files per shard: parquet (images + stats Parquet), webdataset "
                                     "(img2dataset-style tar + stats Parquet) or both")
    keep_columns: Columns = _option(("*",), "input columns carried into images.parquet and the WebDataset JSON "
                                            "with their types, besides prompt, prompt_id and seed: names, "
                                            "comma-separated or repeated; * keeps every one")
    drop_columns: Columns = _option((), "input columns not carried through: names, comma-separated or repeated; "
                                        "* drops every one")
    incremental: bool = _option(False, "take rows added to the inputs since the last run into --out (rows appended "
                                       "to a file, new files) as new shards; committed shards stay as they are, and "
                                       "changed or removed rows are refused")

    def check(self) -> Price:
        """Every value against the others and the price table; the run's price."""
        from ssdgen.formats.images import check_image_format
        from ssdgen.models.registry import ModelSpec, check_dtype, check_kv, check_model_spec

        from .cluster import check_address
        if not self.prompts:
            raise ValueError("--prompts: give at least one prompt file or prefix")
        ReadAs(self.input_format, self.prompt_column)  # a bad --input-format or --prompt-column: one line
        for name in ("shard_size", "batch_size", "actors"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.cpus_per_actor <= 0 or self.gpus_per_actor < 0:
            raise ValueError("--cpus-per-actor must be > 0 and --gpus-per-actor >= 0")
        check_model_spec(self.model, self.decoder)  # and the heads a decoder spec names
        if self.objective not in OBJECTIVES:
            raise ValueError(f"--objective must be one of {', '.join(OBJECTIVES)}, got {self.objective!r}")
        if self.plan is not None and not self.decoder.calibrated:
            raise ValueError(f"--plan replays a calibrated decoder's plan, but --decoder {self.decoder} is concrete "
                             "already: drop --plan, or use a calibrated decoder (the default)")
        check_audit(self.audit, self.audit_tolerance)
        check_image_format(self.image_format, self.quality)
        check_format(self.format)
        check_address(self.ray_address)
        check_dtype(self.dtype, on_gpu=self.gpus_per_actor > 0)
        check_kv(ModelSpec.parse(self.model), on_gpu=self.gpus_per_actor > 0)
        price = price_from(self.device_type, self.prices, self.usd_per_hour, self.spot_usd_per_hour)
        if price.unit == "gpu" and self.gpus_per_actor <= 0:
            raise ValueError(f"--device-type {self.device_type} is priced per GPU, but actors get no GPU "
                             "(set --gpus-per-actor)")
        if price.unit != "gpu" and self.gpus_per_actor > 0:
            raise ValueError(f"--device-type {self.device_type} is a CPU type, but actors get GPUs; "
                             "name the GPU type (e.g. --device-type l4)")
        return price

    @property
    def fixed_batch(self) -> int | None:
        """The batch size the run decodes with when no plan chooses it: the user's, or a concrete decoder's
        DEFAULT_BATCH; None: a calibrated decoder's plan chooses (flows/pipeline.py `_decode_plan`)."""
        if self.batch_size is not None or self.decoder.calibrated:
            return self.batch_size
        return DEFAULT_BATCH

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

    def dated(self, when: datetime) -> "RunSettings":
        """These settings with `{date}` in --out and --prompts filled with `when` (YYYY-MM-DD): a nightly job
        reads the day's prompts and renders into the day's folder."""
        day = when.strftime("%Y-%m-%d")
        return self.model_copy(update={"out": self.out.replace("{date}", day),
                                       "prompts": tuple(p.replace("{date}", day) for p in self.prompts)})

    def worker(self) -> WorkerSettings:
        """The part an actor decodes and encodes by (its torch threads come apart: `threads`)."""
        return WorkerSettings(**{k: getattr(self, k) for k in WorkerSettings.model_fields})

    def recorded(self, files: list[InputFile]) -> dict:
        """What `_config.json` holds: everything that decides which images come out, and the output format (a
        resume must not mix shards with and without tars). Every key always, whatever its value. No credentials.
        Not the prices (--prices, --usd-per-hour): they decide no image, so a resume may change them; the run
        records its price in _price.json (output.layout) instead. flows.prepare adds the shard plan's `segments`
        once the inputs grew (--incremental: inputs.shards), and the flow the inputs' row digests (inputs.growth)."""
        keys = ("model", "seed", "shard_size", "batch_size", "audit", "audit_tolerance", "image_format", "quality",
                "format", "dtype")
        # png ignores --quality: recorded as null there, so another --quality resumes a png run
        quality = {"quality": None} if self.image_format == "png" else {}
        columns = {"columns": self.kept_columns(files).names}  # a resume must not mix shards with other columns
        return {k: getattr(self, k) for k in keys} | quality | {"decoder": str(self.decoder)} | columns | {
            "inputs": [_input(f) for f in files]}

    @property
    def read_as(self) -> ReadAs:
        """How the prompt files are read (inputs.text): their format and the prompt's column."""
        return ReadAs(self.input_format, self.prompt_column)

    def kept_columns(self, files: list[InputFile]) -> pa.Schema:
        """The input columns this run carries through, with their types (inputs.columns); raises InputError on a
        clash with an output column, a type two files disagree on, or a name no input has."""
        return kept_schema(files, self.keep_columns, self.drop_columns, RESERVED_COLUMNS)

    @property
    def audit_label(self) -> str:
        return self.decoder.label


def _input(f: InputFile) -> dict:
    """A file as _config.json records it; format and prompt column only where they are not the default, so a run
    recorded before they could be chosen resumes."""
    return ({"url": f.url, "rows": f.num_rows, "bytes": f.size} | ({"content": f.identity} if f.identity else {})
            | ({"format": f.format} if f.format != "parquet" else {})
            | ({"prompt_column": f.prompt_column} if f.prompt_column != "prompt" else {}))
