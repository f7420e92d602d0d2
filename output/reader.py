"""The one reader of a run's committed output: only what the commit markers name, never an uncommitted or
losing attempt, and never a file twice. Everything that reads a run goes through here: `ssdgen.open_run` and
`committed_shards` (Python), `read_run` (`ssdgen report`), `open_run` (`ssdgen demo`'s grid), `run_status` and
`MarkerFold` (`ssdgen status`, and the run's own summary at its end), `shard_images` (Parquet or tar), and
output/export.py (`ssdgen export`).

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

import json
from collections import Counter

import fsspec
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from ssdgen.decoders.spec import DecodeSpec, speculative_rows
from ssdgen.formats import written
from ssdgen.inputs.shards import recorded_segments, shard_count
from ssdgen.workers.results import UNRECORDED

from .audit import DEFAULT_TOLERANCE, summarize as audit_summary
from .cost import Price, check_price_options, price_from, run_summary
from .layout import (IMAGES_SCHEMA, MANIFEST, STATS_SCHEMA, Output, images_schema, manifest_row,
                     manifest_schema)
from .marker import SHA256, in_shard
from .damage import damaged_shards


def committed_shards(url: str, fresh: bool = False) -> pa.Table:
    """One row per committed shard (output.layout.manifest_schema: shard, rows, stats_url, images_url, tar_url,
    their SHA-256, ...), in shard order. From manifest.parquet, or from the markers when there is none or
    `fresh`. Raises FileNotFoundError when the URL holds no run, ValueError naming the row when the manifest
    names a file outside its shard's folders or without its SHA-256 (`manifest_problem`): never read through."""
    out = Output(url)
    out.read_config()  # a clear error when the URL is not a run
    if not fresh and (man := read_manifest(out)) is not None:
        if (problem := manifest_problem(out, man)) is not None:
            raise ValueError(f"{out.full_url(out.path(MANIFEST))}: damaged: {problem}; nothing is read through it: "
                             f"`ssdgen verify {url}` rebuilds it from the commit markers (or give --fresh)")
        return man
    return pa.Table.from_pylist([manifest_row(out, m) for m in out.iter_markers()], schema=manifest_schema())


def read_manifest(out: Output) -> pa.Table | None:
    """manifest.parquet in the project's schema (a manifest from before a column existed, tar_url, ..., gets it
    as nulls), or None when there is none."""
    try:
        with out.store.fs.open(out.path(MANIFEST), "rb") as f:
            man = pq.read_table(f, use_threads=False)  # a Python file: inputs.files._given_ids says why
        schema = manifest_schema()
        cols = [man.column(n) if n in man.column_names else pa.nulls(man.num_rows, schema.field(n).type)
                for n in schema.names]
        return pa.Table.from_arrays(cols, schema=schema)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:  # truncated, overwritten, or columns of other types: pyarrow says which
        raise ValueError(f"{out.full_url(out.path(MANIFEST))}: not a readable manifest ({e}); `ssdgen verify "
                         f"{out.url}` rebuilds it from the commit markers") from None


def manifest_problem(out: Output, man: pa.Table) -> str | None:
    """What makes a manifest untrustworthy, naming the row, or None: each row names its shard once, and files of
    this run only, in that shard's attempt folders, each (but the audit) with its SHA-256. A manifest is a
    derived file (output.converge); an edited one is never followed outside the run."""
    pairs = [("stats_url", "stats_sha256"), ("audit_url", None)] + [tuple(f.manifest_columns) for f in written()]
    root, seen = out.full_url(out.root) + "/", set()
    for row in man.to_pylist():
        shard = row["shard"]
        if shard is None or shard < 0 or shard in seen:
            return f"shard {shard} is named twice, or is not a shard's number"
        seen.add(shard)
        if row["stats_url"] is None:
            return f"shard {shard} names no statistics file"
        for col, sha in pairs:
            if (u := row[col]) is not None and not (u.startswith(root) and in_shard(u[len(root):], shard)):
                return f"shard {shard}'s {col} {u} is not in its shard's attempt folders in {out.url}"
            if u is not None and sha is not None and not (row[sha] and SHA256.fullmatch(row[sha])):
                return f"shard {shard}'s {col} {u} has no SHA-256 ({sha} is {row[sha]!r})"
    return None


def open_run(url: str, columns: list[str] | None = None, fresh: bool = False) -> ds.Dataset:
    """The committed rows of the run at `url` (any fsspec URL): its images (output.layout.IMAGES_SCHEMA) with
    their statistics (STATS_SCHEMA) joined on `prompt_id`, as an in-memory `pyarrow.dataset.Dataset`. `columns`
    keeps only those (and `prompt_id`); a column both tables hold (decoder, grid size) is the images'."""
    out = Output(url)
    man = committed_shards(url, fresh)
    if man.num_rows == 0:
        raise FileNotFoundError(f"{url}: no committed shards yet")
    images_urls = [u for u in man.column("images_url").to_pylist() if u]
    img_schema = run_images_schema(out, images_urls)
    unknown = set(columns or ()) - set(img_schema.names) - set(STATS_SCHEMA.names)
    if unknown:
        raise ValueError(f"open_run: no column {', '.join(sorted(unknown))} (images: {', '.join(img_schema.names)}; "
                         f"statistics: {', '.join(STATS_SCHEMA.names)})")

    def wanted(schema: pa.Schema, skip=()) -> list[str]:
        return [n for n in schema.names if n == "prompt_id" or (n not in skip and (columns is None or n in columns))]

    img_cols = wanted(img_schema) if images_urls else []
    stats = read_columns(out, man.column("stats_url").to_pylist(), STATS_SCHEMA, wanted(STATS_SCHEMA, skip=img_cols))
    if not images_urls:  # --format webdataset alone: the images are in the tars
        return ds.dataset(stats)
    images = read_columns(out, images_urls, img_schema, img_cols)
    # a left join that keeps the images' order: every image row takes the stats row with its prompt_id
    at = pc.index_in(images.column("prompt_id"), value_set=stats.column("prompt_id"))
    matched = stats.drop_columns(["prompt_id"]).take(at)
    return ds.dataset(pa.Table.from_arrays(images.columns + matched.columns,
                                           names=images.column_names + matched.column_names))


def run_images_schema(out: Output, urls: list[str]) -> pa.Schema:
    """The run's images columns: the sample's own (IMAGES_SCHEMA) and the input columns the run kept
    (inputs.columns), which every shard of a run has alike (its config pins them): from the first file's footer."""
    if not urls:
        return IMAGES_SCHEMA
    with out.store.fs.open(fsspec.core.split_protocol(urls[0])[1], "rb") as f:
        found = pq.read_schema(f)
    return images_schema(pa.schema([f for f in found if f.name not in IMAGES_SCHEMA.names]))


def read_columns(out: Output, urls: list[str], schema: pa.Schema, names: list[str]) -> pa.Table:
    """Columns `names` of the Parquet files at `urls`, in order. The schema is the project's, so a file from
    before a column existed reads it as nulls."""
    paths = [fsspec.core.split_protocol(u)[1] for u in urls]
    sub = pa.schema([schema.field(n) for n in names])
    return ds.dataset(paths, schema=sub, format="parquet", filesystem=out.store.fs).to_table()


def shard_images(out: Output, row: dict) -> list[dict]:
    """A committed shard's image rows (formats.parquet.IMAGE_COLS, `image` as the encoded bytes or None), read
    back by the first format the run wrote that can (formats/: its images Parquet, else its WebDataset tar).
    `row` is its committed_shards row."""
    for f in written():
        url = row.get(f.manifest_columns[0])
        if url and f.read_images is not None:
            with out.store.fs.open(fsspec.core.split_protocol(url)[1], "rb") as fh:
                return f.read_images(fh)
    raise ValueError(f"{out.url}: shard {row['shard']} has no file its images read back from")


def read_run(url: str, samples: int = 24) -> dict:
    """Everything a report of the run shows, read as `open_run` reads: the committed shards but the damaged ones
    (left out and named, never read), their statistics, their image rows (bytes kept for the first `samples` ok
    images only), their markers, the summary, config, plan and recorded price. Raises FileNotFoundError with no
    committed shard."""
    out = Output(url)
    damaged = list(damaged_shards(out))
    markers = {m.shard: m for m in out.iter_markers(skip=frozenset(d.shard for d in damaged))}
    try:  # no markers: a copy of the run that kept its manifest
        man = [manifest_row(out, markers[k]) for k in sorted(markers)] if markers else committed_shards(url).to_pylist()
    except FileNotFoundError:
        man = []
    if not man:
        raise FileNotFoundError(f"{out.url}: no committed shards (no {MANIFEST} and no shards/*/_SUCCESS.json); "
                                "nothing to report: is this a run's --out URL, and has a shard finished?")
    stats = read_columns(out, [r["stats_url"] for r in man], STATS_SCHEMA, STATS_SCHEMA.names).to_pylist()
    images, kept = [], 0
    for r in man:
        for im in shard_images(out, r):
            keep = im["image"] is not None and kept < samples
            kept += keep
            images.append(im if keep else im | {"image": None})
    return {"url": url, "files": man, "markers": markers, "stats": stats, "images": images,
            "summary": out.read_summary(), "config": out.recorded_config(), "damaged": damaged,
            "plan": out.read_plan(), "price": out.read_price()}


class MarkerFold:
    """One streamed pass over the committed markers (output.layout.Output.iter_markers) feeds the cost summary,
    the manifest, the failure counts and the audit's index (shard -> marker, with --audit): no other marker is
    held after it is read. The run's end and `ssdgen status` fold the same way."""

    MAX_ERRORS = 10_000  # distinct error messages kept; the rarest are dropped beyond it

    def __init__(self, out: Output, audit: bool, manifest: bool = True, skip: frozenset = frozenset(),
                 known: bytearray | None = None):
        """known: flags of the shards the run knows are committed (its own commits and those it found), read by
        name where the store's listing does not show them yet (`unlisted` then names them)."""
        self.out, self.audit, self.skip, self.known = out, {} if audit else None, skip, known
        self.unlisted: list[int] = []
        self.manifest = out.manifest_writer() if manifest else None
        self.errors: Counter = Counter()
        self.reasons: Counter = Counter()  # error_reason -> rows; summing to the failed rows
        self.decoders: Counter = Counter()  # resolved spec text -> rows it decoded (UNRECORDED: older markers)
        self.wall_s = 0.0
        self.device_types: set = set()

    def markers(self):
        for m in self.out.iter_markers(skip=self.skip, known=self.known, unlisted=self.unlisted):
            if self.manifest is not None:
                self.manifest.add(m)
            self.errors.update(m.errors)
            self.reasons.update(m.error_reasons)
            self.decoders[m.decoder or UNRECORDED] += m.rows
            if (unrecorded := m.failed - sum(m.error_reasons.values())) > 0:  # a marker from before reasons
                self.reasons[UNRECORDED] += unrecorded
            if len(self.errors) > self.MAX_ERRORS:
                self.errors = Counter(dict(self.errors.most_common(self.MAX_ERRORS // 2)))
            self.wall_s += m.wall_s
            self.device_types.add(m.device_type)
            if self.audit is not None:  # what output.audit reads: the audit file and the audit seconds
                self.audit[m.shard] = m
            yield m


def plan_summary(plan: dict | None) -> dict | None:
    """The recorded plan (_plan.json) as summary.json shows it: the resolved spec, the objective, the choice and
    batch it was made for, why, and what planning took (the profile and estimates stay in _plan.json)."""
    if plan is None:
        return None
    m = plan["measurements"]
    return {"spec": plan["spec"], "rows": speculative_rows(DecodeSpec.parse(plan["spec"]))} | {
        k: m.get(k) for k in ("objective", "choice", "batch", "why", "seconds", "cached")}


def read_plan_at(url: str) -> dict:
    """Another run's decode plan, to replay (`--plan`): a run's output URL (its _plan.json) or a plan file's URL.
    One error line naming the URL when there is none, or it is not a plan."""
    if url.rstrip("/").endswith(".json"):
        try:
            with fsspec.open(url, "rb") as f:
                plan = json.loads(f.read())
        except FileNotFoundError:
            raise ValueError(f"--plan {url}: no such file") from None
        except (OSError, ValueError) as e:
            raise ValueError(f"--plan {url}: not a readable plan ({e})") from None
        if not isinstance(plan, dict) or not isinstance(plan.get("spec"), str) or \
                not isinstance(plan.get("measurements"), dict):
            raise ValueError(f"--plan {url}: not a resolved decode plan (no spec text and measurements)")
        return plan
    plan = Output(url).read_plan()
    if plan is None:
        raise ValueError(f"--plan {url}: that run has no decode plan (_plan.json): it decoded a concrete spec, "
                         "or never started; name a run that planned, or a plan file")
    return plan


def view_price(recorded: Price | None, device_type: str, prices=None, usd_per_hour=None,
               spot_usd_per_hour=None) -> tuple[Price, bool]:
    """The price a view of the run (`ssdgen status`, the report) costs it at, and whether the user gave it now:
    the user's (--prices, --usd-per-hour: output.cost.price_from), else the one the run `recorded`
    (Output.read_price), else (a run from before runs recorded prices) the shipped table's."""
    if (prices, usd_per_hour, spot_usd_per_hour) != (None, None, None):
        return price_from(device_type, prices, usd_per_hour, spot_usd_per_hour), True
    if recorded is not None and recorded.device_type == device_type.strip().lower():
        return recorded, False
    return price_from(device_type), False


def run_status(url: str, deep: bool = False, prices=None, usd_per_hour=None, spot_usd_per_hour=None) -> dict:
    """Shards done, pending, failed and damaged, the cost, the audit and the decode plan so far, from the
    markers (no Prefect, no Ray). Every committed file is checked cheaply (sizes, ETags), or read back and
    hashed with `deep`. Costed at the run's recorded price, or at the user's (`view_price`; "price_given")."""
    check_price_options(prices, usd_per_hour, spot_usd_per_hour)  # a bad value is an error, shards or none
    out = Output(url)
    conf = out.read_config()
    n_shards = shard_count(recorded_segments(conf["inputs"], conf.get("segments")), conf["shard_size"])
    done = out.committed_ids(n_shards)
    damaged = [d for d in damaged_shards(out, deep=deep) if d.shard < n_shards]
    for d in damaged:
        done[d.shard] = 0
    recorded = out.read_summary() or {}
    failed = {int(k): v for k, v in recorded.get("shards_failed", {}).items() if int(k) < n_shards and not done[int(k)]}
    bad = frozenset(d.shard for d in damaged)
    fold = MarkerFold(out, audit=bool(conf.get("audit")), manifest=False, skip=bad)
    ok = n_failed = 0
    for m in fold.markers():
        ok, n_failed = ok + m.ok, n_failed + m.failed
    cost = price = None
    given = False
    if len(fold.device_types) == 1:  # a second pass, only for a run on one device type
        price, given = view_price(out.read_price(), fold.device_types.pop(), prices, usd_per_hour, spot_usd_per_hour)
        cost = run_summary((m.to_dict() for m in out.iter_markers(skip=bad)), price, wall_s=fold.wall_s)
    audit = None
    if conf.get("audit"):
        audit = audit_summary(out, fold.audit, conf["audit"], conf.get("audit_tolerance", DEFAULT_TOLERANCE), price)
    committed = done.count(1)
    return {"out": url, "shards_total": n_shards, "shards_done": committed, "shards_failed": failed,
            "shards_pending": n_shards - committed - len(failed), "images_ok": ok, "images_failed": n_failed,
            "interrupted": bool(recorded.get("interrupted")) and committed < n_shards,
            "errors_by_reason": dict(fold.reasons.most_common()), "rows_by_decoder": dict(fold.decoders.most_common()),
            "damaged": damaged, "cost": cost,
            "price_given": given, "audit": audit, "decode_plan": plan_summary(out.read_plan())}


__all__ = ["open_run", "committed_shards", "read_run", "shard_images", "MarkerFold", "run_status", "plan_summary",
           "view_price"]
