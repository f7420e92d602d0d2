"""The WebDataset format: a shard as a tar in img2dataset's layout, attempt-*/{shard:05d}.tar, with its statistics
(stats.parquet) as the tar's Parquet sidecar, as img2dataset writes {shard:05d}.parquet beside each tar; exported
flat as {shard:05d}.tar + {shard:05d}.parquet.

A tar holds one sample per ok prompt (a failed prompt has no image; its error row is in the sidecar), under the
key {shard:05d}{index:04d}, index being the prompt's row in the shard, so keys are unique in the run and sort in
input order:

    KEY.png | KEY.webp | KEY.jpg   the image, as encoded on the actor (--image-format)
    KEY.txt                        the prompt (the caption)
    KEY.json                       key, shard, prompt_id, prompt, seed, decoder, model, image_format, width,
                                   height, the input columns the run keeps (inputs.columns), and the sample's
                                   statistics (the stats.parquet row; NaN as null)

The tar is written, like the Parquet files, under the attempt's unique key and named by the shard's commit
marker (output.layout): a reader that follows the marker or the manifest's `tar_url` sees exactly one complete
tar per committed shard, never a retried shard's half-written one. `ssdgen export --format webdataset` copies
the committed tars into one flat folder ({shard:05d}.tar + {shard:05d}.parquet) for loaders that glob a folder.

The tar is built in memory with the standard library's `tarfile` (a shard is already in memory as its Parquet
tables) and put in one PUT. Every header field is fixed (mtime 0, owner root, mode 0644), so the tar's bytes
depend on the samples alone.
"""

from __future__ import annotations

import base64
import datetime
import io
import json
import math
import tarfile

import pyarrow as pa

from .parquet import IMAGE_COLS
from .registry import Format, register

EXTENSIONS = {"png": "png", "webp": "webp", "jpeg": "jpg"}  # img2dataset's (and webdataset's) extensions
INDEX_DIGITS = 4


def index_digits(shard_size: int) -> int:
    """Digits of a sample's index in its key: 4 as in img2dataset, more when a shard holds more than 10,000
    prompts, so every key of a run has the same width (and stays unique)."""
    return max(INDEX_DIGITS, len(str(shard_size - 1)))


def tar_name(shard: int) -> str:
    return f"{shard:05d}.tar"


def shard_tar(shard: int, images: pa.Table, stats: pa.Table, digits: int = INDEX_DIGITS) -> tuple[bytes, int]:
    """A shard's images and statistics tables (output.layout.shard_tables) -> (the tar's bytes, samples in it)."""
    stats_of = {r["prompt_id"]: r for r in stats.to_pylist()}
    buf = io.BytesIO()
    n = 0
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for index, row in enumerate(images.to_pylist()):
            if row["image"] is None or row["image"]["bytes"] is None:
                continue
            key = f"{shard:05d}{index:0{digits}d}"
            meta = {"key": key, "shard": shard} | {k: v for k, v in row.items() if k not in ("image", "tokens")}
            meta |= {k: v for k, v in stats_of.get(row["prompt_id"], {}).items() if k not in meta}
            _add(tar, f"{key}.{EXTENSIONS[row['image_format']]}", row["image"]["bytes"])
            _add(tar, f"{key}.txt", (row["prompt"] or "").encode())
            _add(tar, f"{key}.json", json.dumps(_strict(meta), sort_keys=True, allow_nan=False,
                                                default=_json_value).encode())
            n += 1
    return buf.getvalue(), n


def _strict(meta: dict) -> dict:
    """NaN (e.g. `ar`'s acceptance rate: it speculates nothing) as null: strict JSON readers reject NaN."""
    return {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in meta.items()}


def _json_value(v):
    """An input column's value JSON has no type for (inputs.columns keeps them with their Arrow types): dates and
    times as ISO 8601, bytes as base64, decimals and anything else as text."""
    if isinstance(v, (datetime.date, datetime.time)):
        return v.isoformat()
    if isinstance(v, bytes):
        return base64.b64encode(v).decode()
    return str(v)


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), 0o644, 0
    tar.addfile(info, io.BytesIO(data))


def _read_images(f) -> list[dict]:
    """The tar's image rows: KEY.json the row, KEY.{png,webp,jpg} the image, in key (input) order."""
    by_key: dict[str, dict] = {}
    with tarfile.open(fileobj=f, mode="r:") as tar:
        for m in tar.getmembers():
            key, ext = m.name.rsplit(".", 1)
            data = tar.extractfile(m).read()
            r = by_key.setdefault(key, {})
            if ext == "json":
                meta = json.loads(data)
                r |= {c: meta.get(c) for c in IMAGE_COLS if c != "image"}
            elif ext != "txt":
                r["image"] = data
    return [by_key[k] for k in sorted(by_key)]


WEBDATASET = register(Format(
    name="webdataset", kind="tar", file_name=tar_name,
    encode=lambda shard, images, stats, shard_size: shard_tar(shard, images, stats, index_digits(shard_size)),
    export_name=tar_name, stats_export_name=lambda shard: f"{shard:05d}.parquet", read_images=_read_images,
    card_files="*.tar", card_stats="*.parquet"))
