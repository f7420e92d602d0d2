"""Reading a run's committed output from Python: only what the commit markers name, never an uncommitted or
losing attempt, and never a file twice.

    import ssdgen
    ds = ssdgen.open_run("s3://bucket/run")                # images joined with their statistics
    ds.to_table(filter=pyarrow.compute.field("status") == "ok")
    ssdgen.export("s3://bucket/run", "/data/wds", "webdataset")   # /data/wds/00000.tar, 00000.parquet, ...

Which shards are committed comes from `manifest.parquet` (one row per committed shard, with the URLs of its
files; every run writes it at its end, a failed one too), or, where a run has none yet or `fresh=True`, from the
commit markers themselves (a run still going, or one whose driver crashed). A stale manifest only lags: every
shard it names is committed.

`open_run` returns a `pyarrow.dataset.Dataset` held in memory: the images and statistics of every committed shard
joined on `prompt_id` (a left join, in shard and row order). Arrow cannot join lazily, so for a large run pass
`columns=` (Parquet reads only those columns; leave out `image` and the rest is small), or read the files
`committed_shards` names with `pyarrow.dataset.dataset(...)` yourself, which is lazy. A run written with
`--format webdataset` alone has no images Parquet: `open_run` then gives the statistics, and the images are in
the tars (`committed_shards(url)["tar_url"]`, or `export`).
"""

from __future__ import annotations

import hashlib
import posixpath

import fsspec
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from ssdgen.flows.layout import IMAGES_SCHEMA, MANIFEST, MANIFEST_SCHEMA, STATS_SCHEMA, Output, manifest_row
from ssdgen.flows.webdataset_shards import index_digits, shard_tar

EXPORT_FORMATS = ("parquet", "webdataset")
CHUNK = 8 * 2**20  # bytes per read while copying a file


def committed_shards(url: str, fresh: bool = False) -> pa.Table:
    """One row per committed shard (flows.layout.MANIFEST_SCHEMA: shard, rows, images_url, stats_url, tar_url,
    their SHA-256, ...), in shard order. From manifest.parquet, or from the markers when there is none or
    `fresh`. Raises FileNotFoundError when the URL holds no run."""
    out = Output(url)
    out.read_config()  # a clear error when the URL is not a run
    if not fresh and out.fs.exists(out.path(MANIFEST)):
        with out.fs.open(out.path(MANIFEST), "rb") as f:
            man = pq.read_table(f)
        # a manifest from before a column existed (tar_url, ...) gets it as nulls
        cols = [man.column(n) if n in man.column_names else pa.nulls(man.num_rows, MANIFEST_SCHEMA.field(n).type)
                for n in MANIFEST_SCHEMA.names]
        return pa.Table.from_arrays(cols, schema=MANIFEST_SCHEMA)
    return pa.Table.from_pylist([manifest_row(out, m) for m in out.iter_markers()], schema=MANIFEST_SCHEMA)


def open_run(url: str, columns: list[str] | None = None, fresh: bool = False) -> ds.Dataset:
    """The committed rows of the run at `url` (any fsspec URL): its images (flows.layout.IMAGES_SCHEMA) with
    their statistics (STATS_SCHEMA) joined on `prompt_id`, as an in-memory `pyarrow.dataset.Dataset`. `columns`
    keeps only those (and `prompt_id`); a column both tables hold (decoder, grid size) is the images'."""
    out = Output(url)
    man = committed_shards(url, fresh)
    if man.num_rows == 0:
        raise FileNotFoundError(f"{url}: no committed shards yet")
    unknown = set(columns or ()) - set(IMAGES_SCHEMA.names) - set(STATS_SCHEMA.names)
    if unknown:
        raise ValueError(f"open_run: no column {', '.join(sorted(unknown))} (images: {', '.join(IMAGES_SCHEMA.names)}; "
                         f"statistics: {', '.join(STATS_SCHEMA.names)})")
    images_urls = [u for u in man.column("images_url").to_pylist() if u]

    def wanted(schema: pa.Schema, skip=()) -> list[str]:
        return [n for n in schema.names if n == "prompt_id" or (n not in skip and (columns is None or n in columns))]

    img_cols = wanted(IMAGES_SCHEMA) if images_urls else []
    stats = _read(out, man.column("stats_url").to_pylist(), STATS_SCHEMA, wanted(STATS_SCHEMA, skip=img_cols))
    if not images_urls:  # --format webdataset alone: the images are in the tars
        return ds.dataset(stats)
    images = _read(out, images_urls, IMAGES_SCHEMA, img_cols)
    # a left join that keeps the images' order: every image row takes the stats row with its prompt_id
    at = pc.index_in(images.column("prompt_id"), value_set=stats.column("prompt_id"))
    matched = stats.drop_columns(["prompt_id"]).take(at)
    return ds.dataset(pa.Table.from_arrays(images.columns + matched.columns,
                                           names=images.column_names + matched.column_names))


def _read(out: Output, urls: list[str], schema: pa.Schema, names: list[str]) -> pa.Table:
    """Columns `names` of the Parquet files at `urls`, in order. The schema is the project's, so a file from
    before a column existed reads it as nulls."""
    paths = [fsspec.core.split_protocol(u)[1] for u in urls]
    sub = pa.schema([schema.field(n) for n in names])
    return ds.dataset(paths, schema=sub, format="parquet", filesystem=out.fs).to_table()


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
        dst.fs.rm(path)
        raise OSError(f"{url}: its SHA-256 differs from its commit marker's; the file changed after the commit")
    return n


def _build_tar(src: Output, m: dict, digits: int, dst: Output, path: str) -> int:
    """A committed Parquet shard's tar, built as the flow builds it (flows.webdataset_shards.shard_tar)."""
    images = _read(src, [m["images_url"]], IMAGES_SCHEMA, IMAGES_SCHEMA.names)
    stats = _read(src, [m["stats_url"]], STATS_SCHEMA, STATS_SCHEMA.names)
    data, _ = shard_tar(int(m["shard"]), images, stats, digits)
    _parent(dst, path)
    dst.fs.pipe_file(path, data)
    return len(data)


def _parent(out: Output, path: str) -> None:
    """A local destination needs its folders; object stores have none (and must not get buckets made)."""
    if out.protocol in ("file", "local"):
        out.fs.makedirs(posixpath.dirname(path), exist_ok=True)


__all__ = ["open_run", "export", "committed_shards"]
