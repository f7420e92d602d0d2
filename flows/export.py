"""Copying a run's committed output into a flat folder a data loader takes (`ssdgen export`, `ssdgen.export`).

Only what the commit markers name is copied (through flows.reader), each file checked against the SHA-256 its
marker recorded as it streams; a run written without tars gets them built from its Parquet, as the flow builds
them (flows.webdataset_shards.shard_tar).
"""

from __future__ import annotations

import hashlib
import posixpath

import fsspec

from .layout import IMAGES_SCHEMA, STATS_SCHEMA, Output
from .reader import committed_shards, read_columns
from .webdataset_shards import index_digits, shard_tar

EXPORT_FORMATS = ("parquet", "webdataset")
CHUNK = 8 * 2**20  # bytes per read while copying a file


def export(url: str, to: str, fmt: str = "parquet", fresh: bool = False) -> dict:
    """Copy the committed files of the run at `url` into a flat folder `to` (any fsspec URL) for a loader:

        parquet     TO/images/{shard:05d}.parquet, TO/stats/{shard:05d}.parquet
        webdataset  TO/{shard:05d}.tar, TO/{shard:05d}.parquet (the statistics sidecar, as img2dataset writes)

    Each copy is checked against the SHA-256 in its marker. A run without tars (--format parquet) gets them
    built from its Parquet, as the flow would have written them. Returns {"shards", "files", "bytes", "to"}."""
    if fmt not in EXPORT_FORMATS:
        raise ValueError(f"--format must be one of {', '.join(EXPORT_FORMATS)}, got {fmt!r}")
    src, dst = Output(url), Output(to)
    man = committed_shards(url, fresh).to_pylist()
    if not man:
        raise FileNotFoundError(f"{url}: no committed shards yet")
    sizes, digits = [], index_digits(src.read_config()["shard_size"])
    for m in man:
        name = f"{m['shard']:05d}"
        if fmt == "parquet":
            if m["images_url"] is None:
                raise ValueError(f"{url}: shard {m['shard']} has no images Parquet (the run wrote --format "
                                 "webdataset); export it with --format webdataset")
            sizes.append(_copy(src, m["images_url"], m["images_sha256"], dst, dst.path("images", f"{name}.parquet")))
            sizes.append(_copy(src, m["stats_url"], m["stats_sha256"], dst, dst.path("stats", f"{name}.parquet")))
            continue
        if m["tar_url"] is not None:
            sizes.append(_copy(src, m["tar_url"], m["tar_sha256"], dst, dst.path(f"{name}.tar")))
        else:
            sizes.append(_build_tar(src, m, digits, dst, dst.path(f"{name}.tar")))
        sizes.append(_copy(src, m["stats_url"], m["stats_sha256"], dst, dst.path(f"{name}.parquet")))
    return {"shards": len(man), "files": len(sizes), "bytes": sum(sizes), "to": to}


def _copy(src: Output, url: str, sha256: str | None, dst: Output, path: str) -> int:
    """Stream one file across file systems (a tar may be a gigabyte), checking its SHA-256; returns its size."""
    h, n = hashlib.sha256(), 0
    _parent(dst, path)
    with src.fs.open(fsspec.core.split_protocol(url)[1], "rb") as r, dst.fs.open(path, "wb") as w:
        while chunk := r.read(CHUNK):
            h.update(chunk)
            w.write(chunk)
            n += len(chunk)
    if sha256 is not None and h.hexdigest() != sha256:
        dst.fs.rm_file(path)  # not rm: it would read glob characters in the path as a pattern
        raise OSError(f"{url}: its SHA-256 differs from its commit marker's; the file changed after the commit")
    return n


def _build_tar(src: Output, m: dict, digits: int, dst: Output, path: str) -> int:
    """A committed Parquet shard's tar, built as the flow builds it (flows.webdataset_shards.shard_tar)."""
    images = read_columns(src, [m["images_url"]], IMAGES_SCHEMA, IMAGES_SCHEMA.names)
    stats = read_columns(src, [m["stats_url"]], STATS_SCHEMA, STATS_SCHEMA.names)
    data, _ = shard_tar(int(m["shard"]), images, stats, digits)
    _parent(dst, path)
    dst.fs.pipe_file(path, data)
    return len(data)


def _parent(out: Output, path: str) -> None:
    """A local destination needs its folders; object stores have none (and must not get buckets made)."""
    if out.backend.folders:
        out.fs.makedirs(posixpath.dirname(path), exist_ok=True)
