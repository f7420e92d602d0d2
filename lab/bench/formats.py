"""Stored bytes per image for each --image-format: the same images encoded as png, webp and jpeg by the pipeline's
own encoder (formats/images.py encode_image) at the CLI's default quality.

    python -m lab formats [--n 256] [--quality 90] [--batch-size 32] [--model reference] [--out sizes.json]

The images are decoded once, with `ar`, from the first n eval prompts at their own seeds, so every format encodes
the same pixels; the decode is not timed. Encoding is deterministic (fixed encoder options, no metadata), so the
sizes repeat exactly for the same model and prompts.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ssdgen.formats.images import IMAGE_FORMATS, encode_image


def decode(n: int, model_spec: str | None = None, batch_size: int = 32) -> list[np.ndarray]:
    """The first n eval prompts decoded with `ar` -> uint8 HxWx3 images."""
    from ssdgen.decoders import build
    from ssdgen.models.registry import load_model
    from ssdgen.reference.prompts import eval_prompts
    model = load_model(model_spec)
    dec = build("ar", model)
    rows = eval_prompts(n)
    images = []
    for i in range(0, len(rows), batch_size):
        batch = rows[i:i + batch_size]
        res = dec.decode([r["prompt"] for r in batch], [r["seed"] for r in batch])
        images.extend(model.decode_images(res.tokens).numpy())
    return images


def sizes(images: list[np.ndarray], quality: int = 90) -> list[dict]:
    """One row per format: images, bytes in total and per image, and the size relative to png."""
    rows = []
    for fmt in IMAGE_FORMATS:
        total = sum(len(encode_image(img, fmt, quality)) for img in images)
        rows.append({"format": fmt, "quality": None if fmt == "png" else quality, "images": len(images),
                     "bytes_total": total, "bytes_per_image": total / len(images)})
    png = rows[0]["bytes_total"]
    for r in rows:
        r["relative_to_png"] = r["bytes_total"] / png
    return rows


def report(n: int = 256, quality: int = 90, batch_size: int = 32, model: str | None = None,
           out: Path | None = None, echo=print) -> list[dict]:
    """Decode n eval prompts once, encode them in every format, print the table and return its rows."""
    images = decode(n, model, batch_size)
    h, w = images[0].shape[:2]
    rows = sizes(images, quality)
    echo(f"{len(images)} images of {w}x{h} px, decoded with ar")
    echo(f"{'format':<8} {'quality':>7} {'bytes/image':>12} {'total bytes':>12} {'vs png':>7}")
    for r in rows:
        q = "-" if r["quality"] is None else r["quality"]
        echo(f"{r['format']:<8} {q:>7} {r['bytes_per_image']:>12.0f} {r['bytes_total']:>12} "
             f"{r['relative_to_png']:>7.2f}")
    if out:
        out.write_text(json.dumps({"image_size": [w, h], "rows": rows}, indent=1))
    return rows
