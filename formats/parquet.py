"""The Parquet format: a shard's image rows as `images.parquet` (output/layout.py IMAGES_SCHEMA: the image as the
struct Hugging Face `datasets` reads as its Image feature, the token grid, the prompt and the provenance), its
statistics beside it; exported as images/{shard:05d}.parquet and stats/{shard:05d}.parquet."""

from __future__ import annotations

import pyarrow.parquet as pq

from ssdgen.storage.store import parquet_bytes

from .registry import Format, register

IMAGE_COLS = ["prompt_id", "prompt", "seed", "image", "width", "height"]  # what a reader takes back


def _read_images(f) -> list[dict]:
    rows = pq.ParquetFile(f).read(columns=IMAGE_COLS, use_threads=False).to_pylist()  # inputs.files._given_ids says why
    for r in rows:
        r["image"] = (r["image"] or {}).get("bytes")
    return rows


PARQUET = register(Format(
    name="parquet", kind="images", file_name=lambda shard: "images.parquet",
    encode=lambda shard, images, stats, shard_size: (parquet_bytes(images), images.num_rows),
    export_name=lambda shard: f"images/{shard:05d}.parquet",
    stats_export_name=lambda shard: f"stats/{shard:05d}.parquet", read_images=_read_images,
    card_files="images/*.parquet", card_stats="stats/*.parquet"))
