"""A format added the way a user adds one: this module and its `register` call, nothing else (tests/test_formats.py).
JSON Lines, one object per prompt: prompt_id, prompt, seed, status and the image as base64 (null for a failed
prompt), as {shard:05d}.jsonl; exported flat beside its statistics."""

import base64
import json

import pyarrow as pa

from ssdgen.formats import Format, register


def encode(shard: int, images: pa.Table, stats: pa.Table, shard_size: int) -> tuple[bytes, int]:
    status = dict(zip(stats.column("prompt_id").to_pylist(), stats.column("status").to_pylist()))
    lines = [json.dumps({"prompt_id": r["prompt_id"], "prompt": r["prompt"], "seed": r["seed"],
                         "status": status[r["prompt_id"]], "width": r["width"], "height": r["height"],
                         "image": base64.b64encode(r["image"]["bytes"]).decode() if r["image"] else None})
             for r in images.to_pylist()]
    return ("\n".join(lines) + "\n").encode(), len(lines)


def read_images(f) -> list[dict]:
    rows = [json.loads(line) for line in f.read().decode().splitlines() if line]
    return [{k: r[k] for k in ("prompt_id", "prompt", "seed", "width", "height")}
            | {"image": base64.b64decode(r["image"]) if r["image"] else None} for r in rows]


JSONL = register(Format(name="jsonl", kind="jsonl", file_name=lambda shard: f"{shard:05d}.jsonl", encode=encode,
                        export_name=lambda shard: f"{shard:05d}.jsonl",
                        stats_export_name=lambda shard: f"{shard:05d}.parquet", read_images=read_images))
