"""Copying a run's committed output into a flat folder a data loader takes (`ssdgen export`, `ssdgen.export`).

Only what the commit markers name is copied (through output.reader), each file checked against the SHA-256 its
marker recorded as it streams. An export in a format the run did not write gets its files built from the run's
images Parquet, as the flow builds them (the format's `encode`, formats/).
"""

from __future__ import annotations

import hashlib
import posixpath

import fsspec

from ssdgen.formats import FORMATS, check_export_format

from .layout import IMAGES_SCHEMA, STATS_SCHEMA, Output
from .reader import committed_shards, read_columns

CHUNK = 8 * 2**20  # bytes per read while copying a file


def export(url: str, to: str, fmt: str = "parquet", fresh: bool = False) -> dict:
    """Copy the committed files of the run at `url` into a flat folder `to` (any fsspec URL) for a loader, in
    the layout of the format `fmt` (formats/):

        parquet     TO/images/{shard:05d}.parquet, TO/stats/{shard:05d}.parquet
        webdataset  TO/{shard:05d}.tar, TO/{shard:05d}.parquet (the statistics sidecar, as img2dataset writes)

    Each copy is checked against the SHA-256 in its marker. A run without the format's files gets them built
    from its images Parquet, as the flow would have written them. Returns {"shards", "files", "bytes", "to"}."""
    check_export_format(fmt)
    f = FORMATS[fmt]
    src, dst = Output(url), Output(to)
    man = committed_shards(url, fresh).to_pylist()
    if not man:
        raise FileNotFoundError(f"{url}: no committed shards yet")
    shard_size, (col, sha) = src.read_config()["shard_size"], f.manifest_columns
    sizes = []
    for m in man:
        shard = int(m["shard"])
        if m[col] is not None:
            sizes.append(_copy(src, m[col], m[sha], dst, dst.path(f.export_name(shard))))
        elif m.get("images_url") is not None:
            sizes.append(_build(src, m, f, shard_size, dst, dst.path(f.export_name(shard))))
        else:
            has = [g.name for g in FORMATS.values() if m.get(g.manifest_columns[0]) is not None]
            raise ValueError(f"{url}: shard {shard} has no {fmt} file and no images Parquet to build it from; "
                             f"export it with --format {' or '.join(has) or 'the format the run wrote'}")
        sizes.append(_copy(src, m["stats_url"], m["stats_sha256"], dst, dst.path(f.stats_export_name(shard))))
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


def _build(src: Output, m: dict, f, shard_size: int, dst: Output, path: str) -> int:
    """A committed shard's file in format `f`, built from its images Parquet as the flow builds it."""
    images = read_columns(src, [m["images_url"]], IMAGES_SCHEMA, IMAGES_SCHEMA.names)
    stats = read_columns(src, [m["stats_url"]], STATS_SCHEMA, STATS_SCHEMA.names)
    data, _ = f.encode(int(m["shard"]), images, stats, shard_size)
    _parent(dst, path)
    dst.fs.pipe_file(path, data)
    return len(data)


def _parent(out: Output, path: str) -> None:
    """A local destination needs its folders; object stores have none (and must not get buckets made)."""
    if out.backend.folders:
        out.fs.makedirs(posixpath.dirname(path), exist_ok=True)
