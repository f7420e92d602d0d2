"""Output formats: which data files a shard's attempt holds besides its statistics, one module per format and
one registration each (registry.py). A format says which file it writes and how it encodes a shard into it, the
manifest columns it adds, how its images read back and how it exports:

    parquet     attempt-*/images.parquet      (parquet.py)    manifest images_url, images_sha256
    webdataset  attempt-*/{shard:05d}.tar     (webdataset.py) manifest tar_url, tar_sha256
    hf          export only: data/train-{shard:05d}.parquet, images and statistics in one table (hf.py)

The images themselves are encoded by images.py (png, webp, jpeg), on the actors, before any format places them.
Every shard also has its statistics (stats.parquet, the tar's sidecar in img2dataset's layout). `--format` takes
a registered name, or `both` (parquet and webdataset). A new format is one module that builds a `Format` and
calls `register`; nothing in output/ or flows/ dispatches on a format's name.
"""

from __future__ import annotations

from . import hf, parquet, webdataset  # noqa: F401 - the built-in formats register themselves
from .registry import (FORMATS, Format, check_export_format, check_format, register, run_formats, write_shard,
                       written)

__all__ = ["FORMATS", "Format", "check_export_format", "check_format", "register", "run_formats", "write_shard",
           "written"]
