"""Image encoding: a decoded image's pixels to the bytes a run stores (`--image-format png|webp|jpeg`,
`--quality`). The actors encode with it (workers/decode_worker.py), so what travels back to the driver is already
the stored file's bytes; the formats only place those bytes (parquet.py's image column, webdataset.py's
KEY.png/.webp/.jpg). It needs PIL and numpy only: no storage, no pyarrow.
"""

from __future__ import annotations

import io

import numpy as np

IMAGE_FORMATS = ("png", "webp", "jpeg")


def check_image_format(image_format: str, quality: int) -> None:
    """Reject an unknown format or a quality outside 1..100 (a user error, before any work starts)."""
    if image_format not in IMAGE_FORMATS:
        raise ValueError(f"--image-format must be one of {', '.join(IMAGE_FORMATS)}, got {image_format!r}")
    if not 1 <= quality <= 100:
        raise ValueError(f"--quality must be in 1..100, got {quality}")


def encode_image(img: np.ndarray, image_format: str = "png", quality: int = 90) -> bytes:
    """Deterministic image bytes: every encoder option is pinned and no metadata (EXIF, ICC, timestamps) is
    written, so a retried shard is byte-identical to the first attempt in every format."""
    from PIL import Image
    buf = io.BytesIO()
    im = Image.fromarray(img)
    if image_format == "png":
        im.save(buf, format="PNG", compress_level=6)
    elif image_format == "webp":
        # method 4 is libwebp's default speed/size trade-off, pinned so a Pillow upgrade cannot change it
        im.save(buf, format="WEBP", quality=quality, method=4, lossless=False, exact=False)
    elif image_format == "jpeg":
        # fixed chroma subsampling (4:2:0) and no optimizer pass or progressive scan: one encoding per input
        im.save(buf, format="JPEG", quality=quality, subsampling=2, optimize=False, progressive=False)
    else:
        raise ValueError(f"unknown image format {image_format!r} (expected one of {', '.join(IMAGE_FORMATS)})")
    return buf.getvalue()
