"""Copying a run's committed output into a flat folder a data loader takes (`ssdgen export`, `ssdgen.export`),
with a dataset card (output.card) that `datasets` and the Hugging Face Hub read.

Only what the commit markers name is copied (through output.reader), each file checked against the SHA-256 its
marker recorded as it streams. An export in a format the run did not write gets its files built from the run's
images Parquet, as the flow builds them (the format's `encode`, formats/).
"""

from __future__ import annotations

import hashlib
import posixpath
from collections import Counter

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq

from ssdgen.formats import FORMATS, check_export_format

from .card import CARD, card
from .layout import STATS_SCHEMA, Output
from .reader import committed_shards, read_columns, run_images_schema

CHUNK = 8 * 2**20  # bytes per read while copying a file


def export(url: str, to: str, fmt: str = "parquet", fresh: bool = False) -> dict:
    """Copy the committed files of the run at `url` into a flat folder `to` (any fsspec URL) for a loader, in
    the layout of the format `fmt` (formats/), with a dataset card (README.md, output.card) so that
    `datasets.load_dataset(to)` loads it:

        parquet     TO/images/{shard:05d}.parquet, TO/stats/{shard:05d}.parquet (the card's `stats` config)
        webdataset  TO/{shard:05d}.tar, TO/{shard:05d}.parquet (the statistics sidecar, as img2dataset writes)
        hf          TO/data/train-{shard:05d}.parquet: images and statistics in one table, ok rows only

    Each copy is checked against the SHA-256 in its marker. A run without the format's files (hf always) gets
    them built from its images Parquet, as the flow would have written them. Returns {"shards", "files",
    "bytes", "rows", "to"}."""
    check_export_format(fmt)
    f = FORMATS[fmt]
    src, dst = Output(url), Output(to)
    man = committed_shards(url, fresh).to_pylist()
    if not man:
        raise FileNotFoundError(f"{url}: no committed shards yet")
    conf = src.read_config()
    sizes, rows, table_bytes = [], 0, 0
    for m in man:
        size, n, in_table = _shard(src, m, f, conf["shard_size"], dst)
        sizes.append(size)
        rows += n
        table_bytes += in_table or 0
        if f.stats_export_name is not None:
            sizes.append(_copy(src, m["stats_url"], m["stats_sha256"], dst, dst.path(f.stats_export_name(int(
                m["shard"])))))
    schema = _schema(dst, dst.path(f.export_name(int(man[0]["shard"])))) if f.stats_export_name is None else None
    one_table = schema is not None  # the card gives the table's rows and bytes (hf)
    text = card(src, conf, f, man, schema, rows if one_table else None,
                (table_bytes, sum(sizes)) if one_table else None, _licenses(src, conf, man)).encode()
    dst.store.fs.pipe_file(dst.path(CARD), text)
    return {"shards": len(man), "files": len(sizes) + 1, "bytes": sum(sizes) + len(text), "rows": rows, "to": to}


def _shard(src: Output, m: dict, f, shard_size: int, dst: Output) -> tuple[int, int, int | None]:
    """A committed shard's file in format `f` in the export folder: copied, or built -> (bytes, rows, its size
    as an Arrow table, for a built Parquet file; else None)."""
    shard, path = int(m["shard"]), dst.path(f.export_name(int(m["shard"])))
    col, sha = f.manifest_columns
    if f.run and m.get(col) is not None:
        return _copy(src, m[col], m[sha], dst, path), int(m["rows"]), None
    if m.get("images_url") is not None:
        return _build(src, m, f, shard_size, dst, path)
    has = [g.name for g in FORMATS.values() if m.get(g.manifest_columns[0]) is not None]
    raise ValueError(f"{src.url}: shard {shard} has no {f.name} file and no images Parquet to build it from; "
                     f"export it with --format {' or '.join(has) or 'the format the run wrote'}")


def _schema(dst: Output, path: str):
    with dst.store.fs.open(path, "rb") as fh:
        return pq.read_schema(fh)


def _copy(src: Output, url: str, sha256: str, dst: Output, path: str) -> int:
    """Stream one file across file systems (a tar may be a gigabyte), checking its SHA-256 (the manifest's rows
    are checked to name files of the run with one: output.reader.manifest_problem); returns its size."""
    h, n = hashlib.sha256(), 0
    _parent(dst, path)
    with src.store.fs.open(fsspec.core.split_protocol(url)[1], "rb") as r, dst.store.fs.open(path, "wb") as w:
        while chunk := r.read(CHUNK):
            h.update(chunk)
            w.write(chunk)
            n += len(chunk)
    if h.hexdigest() != sha256:  # a file without a recorded SHA-256 is never copied unchecked
        dst.store.fs.rm_file(path)  # not rm: it would read glob characters in the path as a pattern
        raise OSError(f"{url}: its SHA-256 differs from its commit marker's ({sha256}); the file changed after the "
                      "commit")
    return n


def _build(src: Output, m: dict, f, shard_size: int, dst: Output, path: str) -> tuple[int, int, int | None]:
    """A committed shard's file in format `f`, built from its images Parquet as the flow builds it -> (bytes,
    rows, its size as a table where it is Parquet: the card's `num_bytes`)."""
    schema = run_images_schema(src, [m["images_url"]])  # with the input columns the run kept
    images = read_columns(src, [m["images_url"]], schema, schema.names)
    stats = read_columns(src, [m["stats_url"]], STATS_SCHEMA, STATS_SCHEMA.names)
    data, rows = f.encode(int(m["shard"]), images, stats, shard_size)
    _parent(dst, path)
    dst.store.fs.pipe_file(path, data)
    return len(data), rows, _table_bytes(data)


def _table_bytes(data: bytes) -> int | None:
    """A built Parquet file's size as an Arrow table, read back from memory: what `datasets` counts as a split's
    `num_bytes`; None for a file that is not Parquet (a tar)."""
    return pq.read_table(pa.BufferReader(data)).nbytes if data[:4] == b"PAR1" else None


def _licenses(src: Output, conf: dict, man: list[dict]) -> dict[str, int]:
    """{license: rows} of the rows' `license` input column where the run kept one (any case), read from the
    committed images Parquet; {} without the column or the files (a WebDataset-only run)."""
    col = next((c for c in conf.get("columns") or [] if c.lower() == "license"), None)
    urls = [m["images_url"] for m in man if m.get("images_url")]
    if col is None or not urls:
        return {}
    values = read_columns(src, urls, run_images_schema(src, urls), [col]).column(col).to_pylist()
    return dict(Counter(str(v).strip() for v in values if v is not None and str(v).strip()))


def _parent(out: Output, path: str) -> None:
    """A local destination needs its folders; object stores have none (and must not get buckets made)."""
    if out.store.backend.folders:
        out.store.fs.makedirs(posixpath.dirname(path), exist_ok=True)
