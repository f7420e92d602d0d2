"""The output layout of a run on any fsspec URL, and the commit protocol that makes a shard "done".

    {out}/_config.json                                   run settings (no secrets); resume must match them
    {out}/_plan.json                                     a calibrated spec resolved once: its text + measurements
    {out}/_price.json                                    the price the last run that decoded was costed at
    {out}/_lease/{generation:08d}.json                   the running driver's lease (output.lease)
    {out}/shards/{shard:06d}/attempt-{uuid}/images.parquet   one row per prompt: image {bytes, path}, token grid, ...
    {out}/shards/{shard:06d}/attempt-{uuid}/stats.parquet    one row per prompt: status, error, error_reason, ...
    {out}/shards/{shard:06d}/attempt-{uuid}/audit.parquet    with --audit: one row per audited prompt (output.audit)
    {out}/shards/{shard:06d}/attempt-{uuid}/{shard:05d}.tar  with --format webdataset|both (formats/webdataset.py)
    {out}/shards/{shard:06d}/_SUCCESS.json               commit marker, written last, create-only
    {out}/shards/{shard:06d}/_DAMAGED-{uuid}.json        a marker whose files failed the check (output.damage)
    {out}/manifest.parquet                               one row per committed shard (file URLs, rows, sha256)
    {out}/summary.json                                   run totals and cost

Data files go under attempt-unique keys, so a retry never overwrites what another attempt wrote (S3 has no
rename, and a half-written object must never look done). The marker names the exact files, their row counts
and SHA-256, and is written create-only: the first attempt to commit wins, later ones are garbage. Readers
and resume trust only marked shards whose files pass the check; `gc` deletes unmarked attempts at the end of a
run. The run's own files (config, plan, manifest, summary) are replaced whole (`put`), never half-written.

A run may have millions of shards, so nothing here holds every marker at once: `committed_ids` reads only
the marker *names* (one listing), `iter_markers` streams the markers in shard order in chunks, and the
manifest is written from that stream (`write_manifest` takes any iterable of markers).
"""

from __future__ import annotations

import io
import json
import posixpath
import sys
import uuid
from dataclasses import asdict
from typing import Iterable, Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from ssdgen.decoders.sample_stats import stat_columns
from ssdgen.formats import written
from ssdgen.formats.hf import IMAGE_TYPE, hf_metadata
from ssdgen.storage.store import CorruptMarker, Store

from .cost import Price, recorded_price
from .marker import Marker, MarkerDigest

CONFIG, MANIFEST, SUMMARY, MARKER = "_config.json", "manifest.parquet", "summary.json", "_SUCCESS.json"
PLAN = "_plan.json"
ROW_DIGESTS = "row_digests"  # _config.json's key for its inputs' row digests (inputs.growth), by URL
PRICE = "_price.json"  # not in _config.json: a price decides no image, so a resume may change it
DIGEST_KEY = "ssdgen.markers"  # the manifest's metadata key for the commits it names (output.marker.MarkerDigest)
DAMAGED = "_DAMAGED"  # a marker whose files failed verification is moved to _DAMAGED-{uuid}.json beside it

# `image` is the struct `datasets` reads as its Image feature (formats/hf.py), with the features in the schema
# metadata; `image_format` says how the bytes are encoded.
_IMAGES_FIELDS = [
    ("prompt_id", pa.string()), ("prompt", pa.string()), ("seed", pa.int64()), ("decoder", pa.string()),
    ("model", pa.string()), ("image", IMAGE_TYPE), ("image_format", pa.string()), ("width", pa.int32()),
    ("height", pa.int32()), ("grid_height", pa.int32()), ("grid_width", pa.int32()), ("tokens", pa.list_(pa.int32())),
]
IMAGES_SCHEMA = pa.schema(_IMAGES_FIELDS, metadata=hf_metadata(_IMAGES_FIELDS))


def images_schema(kept: pa.Schema | None = None) -> pa.Schema:
    """images.parquet's columns: the sample's own, then the input columns the run keeps (inputs.columns)."""
    if kept is None or not len(kept):
        return IMAGES_SCHEMA
    fields = _IMAGES_FIELDS + [(f.name, f.type) for f in kept]
    return pa.schema(fields, metadata=hf_metadata(fields))
_ARROW = {"int8": pa.int8(), "int32": pa.int32(), "float64": pa.float64(), "list<int8>": pa.list_(pa.int8()),
          "list<int32>": pa.list_(pa.int32())}
# the sample's own columns, then every statistic as decoders/sample_stats.py defines it, then the pipeline's
# error_reason: a short code for why the row failed (workers/results.py, decoders/protocol.py); a run from before
# it existed reads it as null (output.reader reads by this schema)
_SAMPLE = [("prompt_id", pa.string()), ("status", pa.string()), ("error", pa.string()), ("error_reason", pa.string()),
           ("decoder", pa.string()), ("grid_height", pa.int32()), ("grid_width", pa.int32())]
STAT_COLUMNS = [(name, _ARROW[kind]) for name, kind in stat_columns()]
STATS_SCHEMA = pa.schema(_SAMPLE + STAT_COLUMNS + [("latency_s", pa.float64()), ("device_seconds", pa.float64())])
# names an input column the run keeps may not take: the images' and statistics' own (and the WebDataset JSON's
# key and shard: formats/webdataset.py), except the inputs' own prompt, prompt_id and seed
RESERVED_COLUMNS = frozenset(IMAGES_SCHEMA.names + STATS_SCHEMA.names + ["key", "shard"]) - {
    "prompt", "prompt_id", "seed"}


_MANIFEST_BASE = [
    ("shard", pa.int64()), ("attempt", pa.string()), ("rows", pa.int64()), ("ok", pa.int64()), ("failed", pa.int64()),
    ("stats_url", pa.string()), ("stats_sha256", pa.string()), ("audit_url", pa.string())]


def manifest_schema() -> pa.Schema:
    """The manifest's columns: the shard's, its statistics' and audit's, then each registered format's URL and
    SHA-256 (formats/: images_url with Parquet, tar_url with WebDataset; null where the run wrote no such file)."""
    return pa.schema(_MANIFEST_BASE + [(c, pa.string()) for f in written() for c in f.manifest_columns])


def _shard_of(path: str) -> int:
    """The shard id in a marker's or an attempt folder's path: .../shards/{id}/{name}."""
    return int(path.rstrip("/").split("/")[-2])


def _numbered(path: str) -> bool:
    """Whether the path is in a shard's folder, .../shards/{digits}/{name} (else `_shard_of` has no id to read)."""
    return path.rstrip("/").split("/")[-2].isdigit()


class ConfigMismatch(ValueError):
    """The output URL holds a run with other settings: resuming it would mix two runs."""


class Output:
    """A run's output: its layout, settings, plan, markers, manifest and summary, kept on a `Store` it holds
    (`store`). The run's code speaks of configs, plans, markers and attempts; only output/ and formats/ (which
    write a shard's files) use the store underneath."""

    def __init__(self, url: str):
        self.store = Store(url)
        self.url, self.root = url, self.store.root

    @property
    def fence(self):
        """A callable that raises when this driver may no longer write (the run's lease, output.lease)."""
        return self.store.fence

    @fence.setter
    def fence(self, check) -> None:
        self.store.fence = check

    def path(self, *parts: str) -> str:
        return self.store.path(*parts)

    def full_url(self, path: str) -> str:
        return self.store.full_url(path)

    # paths ------------------------------------------------------------------------------------------
    def shard_dir(self, shard: int) -> str:
        return self.path("shards", f"{shard:06d}")

    def new_attempt(self, shard: int) -> str:
        return posixpath.join(self.shard_dir(shard), f"attempt-{uuid.uuid4().hex[:12]}")

    # run config -------------------------------------------------------------------------------------
    def check_config(self, config: dict, old: dict | None, pinned: bool) -> str | None:
        """Compare the run's settings with the recorded ones (`old`, from _config.json). Settings are pinned only
        once a shard has committed (`pinned`): a run that committed nothing may take new ones. Returns the keys
        that differ (None when they match or nothing was recorded). Raises ConfigMismatch when pinned."""
        if old is None:
            return None
        # the row digests are the inputs' identities again, at a finer grain (inputs.growth): not compared
        diff = [k for k in sorted(set(old) | set(config)) if old.get(k) != config.get(k) and k != ROW_DIGESTS]
        if diff and pinned:
            raise ConfigMismatch(self._mismatch(self.path(CONFIG), old, config, diff))
        return ", ".join(diff) or None

    def write_config(self, config: dict, replacing: bool) -> None:
        """Record the settings; when `replacing` another run's (one that committed nothing), its plan goes too:
        it was measured for the old settings."""
        if replacing:
            self.store.remove(PLAN)
        self.store.put(self.path(CONFIG), json.dumps(config, indent=1, sort_keys=True).encode())

    def _mismatch(self, p: str, old: dict, config: dict, diff: list[str]) -> str:
        changed = _changed_input(old.get("inputs") or [], config.get("inputs") or [])
        if changed:
            return (f"{changed}: this input changed since the run at {self.url} started ({CONFIG} recorded other "
                    "content); resuming would mix old and new prompts. Restore it, use a new --out, or --overwrite "
                    "(if rows were only added, --incremental takes them as new shards)")
        k = diff[0]
        # a key one side lacks: the run was recorded by another ssdgen version (RunSettings.recorded)
        was, now = (repr(d[k]) if k in d else "not recorded" for d in (old, config))
        return (f"{self.full_url(p)}: this output holds a run with other settings ({', '.join(diff)} differ; "
                f"{k} was {was}, now {now}); use a new --out, the same settings to resume, or --overwrite")

    def recorded_config(self) -> dict | None:
        """What _config.json holds, or None before a run recorded its settings."""
        return self.store.read_json(CONFIG)

    def read_summary(self) -> dict | None:
        """summary.json, or None before a run wrote one."""
        return self.store.read_json(SUMMARY)

    def read_config(self) -> dict:
        conf = self.store.read_json(CONFIG)
        if conf is None:
            raise FileNotFoundError(f"{self.full_url(self.path(CONFIG))}: no ssdgen run here (no {CONFIG})")
        return conf

    def read_plan(self) -> dict | None:
        """A calibrated decoder's resolution, {"spec": the concrete spec's text, "measurements": {...}}
        (decoders/calibrate.py `resolve`), or None before one is made. A record of another shape (damaged, or
        from an older ssdgen) is one error naming the file, never a KeyError later."""
        plan = self.store.read_json(PLAN)
        if plan is not None and (not isinstance(plan, dict) or not isinstance(plan.get("spec"), str)
                                 or not isinstance(plan.get("measurements"), dict)):
            raise ValueError(f"{self.full_url(self.path(PLAN))}: not a resolved decode spec (no spec text and "
                             "measurements); delete it to resolve the decoder again, or --overwrite the run")
        return plan

    def write_plan(self, plan: dict) -> None:
        """Record the resolution before any shard decodes by it: a resume reads it back instead of re-measuring,
        and its spec text alone reproduces the run's tokens."""
        self.store.put(self.path(PLAN), json.dumps(plan, indent=1, sort_keys=True).encode())

    def read_price(self) -> Price | None:
        """The price the run recorded (`write_price`), else the one its summary was costed at, else None."""
        return recorded_price(self.store.read_json(PRICE)) or recorded_price((self.read_summary() or {}).get("price"))

    def write_price(self, price: Price) -> None:
        """Record the run's price as it starts decoding: `ssdgen status` and the report cost the run at it
        before its summary exists, and a later run with another price replaces it."""
        self.store.put(self.path(PRICE), json.dumps(asdict(price), indent=1, sort_keys=True).encode())

    # data and commit --------------------------------------------------------------------------------
    def commit(self, marker: Marker) -> bool:
        """Write the shard's marker create-only. False if another attempt committed first."""
        return self.store.create(posixpath.join(self.shard_dir(marker.shard), MARKER), marker.to_json())

    def marker_paths(self) -> list[str]:
        """Every commit marker's path, in shard order (by the id in the path, numerically): a folder not named by
        a shard's number (put there by hand) holds none."""
        return sorted((p for p in self.store.glob("shards", "*", MARKER) if _numbered(p)), key=_shard_of)

    def committed_ids(self, n_shards: int) -> bytearray:
        """flags[i] == 1 when shard i is committed: from the markers' names alone, one byte per shard."""
        flags = bytearray(n_shards)
        for p in self.marker_paths():
            i = _shard_of(p)
            if i < n_shards:
                flags[i] = 1
        return flags

    def iter_markers(self, chunk: int = 512, skip: frozenset = frozenset(), known: bytearray | None = None,
                     unlisted: list[int] | None = None) -> Iterator[Marker]:
        """The commit markers in shard order, read `chunk` at a time: memory is one chunk, not the run. Shards in
        `skip` (found damaged, output.damage) are left out. `known`: flags of the shards the caller knows are
        committed (a run's own commits), whose markers are read by name where the listing does not show them (a
        store whose listing lags); those shards are added to `unlisted`."""
        return _markers(self, chunk, skip, known, unlisted)

    def marker_of(self, shard: int) -> Marker | None:
        """Shard `shard`'s commit marker, or None while it is uncommitted."""
        p = posixpath.join(self.shard_dir(shard), MARKER)
        try:
            return self.parse_marker(p, self.store.fs.cat_file(p))
        except FileNotFoundError:
            return None

    def remove_attempt(self, attempt: str) -> str | None:
        """Remove an attempt folder this driver began and never committed, even after its lease was lost: None,
        or the line that says the store refused it (output.layout `warn_line`)."""
        return self.store.discard(attempt, "removing an attempt this driver never committed", tree=True, fenced=False)

    def parse_marker(self, path: str, data: bytes) -> Marker:
        """The marker at `path`, trusted only inside its shard's folder (output.marker `Marker.read`)."""
        try:
            return Marker.read(data, _shard_of(path))
        except ValueError as e:
            err = CorruptMarker(f"{self.full_url(path)}: corrupt commit marker ({e}); `ssdgen verify "
                                f"{self.url}` lists the damage, and the same generate re-decodes the shard")
            err.reason = f"corrupt commit marker ({e})"
            raise err from None

    def set_aside(self, shard: int) -> None:
        """Uncommit a damaged shard: its marker moves to _DAMAGED-{uuid}.json (kept for inspection), so the
        shard counts as pending and the next run re-decodes it; gc then removes the attempt it named."""
        p = posixpath.join(self.shard_dir(shard), MARKER)
        self.store.move(p, posixpath.join(self.shard_dir(shard), f"{DAMAGED}-{uuid.uuid4().hex[:8]}.json"))

    def committed(self) -> dict[int, Marker]:
        """shard id -> marker, for every committed shard. Holds them all: for tools and tests, not the flow."""
        return {m.shard: m for m in self.iter_markers()}

    def gc(self, committed: dict[int, Marker] | None = None, warn=None) -> int:
        """Delete attempt folders of committed shards that their marker does not name (crashed or losing
        attempts). Returns how many. Without `committed`, only shards with more than one attempt folder have
        their marker read: a committed shard's single folder is the one its marker names. A delete the store
        refuses is said through `warn` (one line naming the folder; default: stderr) and the rest goes on."""
        return _gc(self, committed, warn or warn_line)

    def manifest_writer(self) -> "ManifestWriter":
        return ManifestWriter(self)

    def write_manifest(self, markers: dict[int, Marker] | Iterable[Marker]) -> str:
        """One row per committed shard, from a dict (shard -> marker) or a stream of markers in shard order."""
        if isinstance(markers, dict):
            markers = (m for _, m in sorted(markers.items()))  # not markers[k]: the name is rebound here
        w = self.manifest_writer()
        for m in markers:
            w.add(m)
        return w.close()

    def write_summary(self, summary: dict) -> str:
        self.store.put(self.path(SUMMARY), json.dumps(summary, indent=1, sort_keys=True).encode())
        return self.full_url(self.path(SUMMARY))


class ManifestWriter:
    """manifest.parquet built from markers fed one at a time (in shard order), in row batches: the rows of a
    run are never all in memory as Python objects. One PUT at `close`."""

    BATCH = 4096

    def __init__(self, out: Output):
        self.out = out
        self.buf = io.BytesIO()
        self.schema = manifest_schema()
        self.writer = pq.ParquetWriter(self.buf, self.schema, compression="zstd")
        self.rows: list[dict] = []
        self.digest = MarkerDigest()  # which commits it names, kept in its metadata (output.converge)

    def add(self, m: Marker) -> None:
        self.rows.append(manifest_row(self.out, m))
        self.digest.add(m)
        if len(self.rows) >= self.BATCH:
            self._flush()

    def _flush(self) -> None:
        self.writer.write_table(pa.Table.from_pylist(self.rows, schema=self.schema))
        self.rows = []

    def close(self) -> str:
        """Write the manifest; returns its URL."""
        if self.rows:
            self._flush()
        self.writer.add_key_value_metadata({DIGEST_KEY: self.digest.value()})
        self.writer.close()
        p = self.out.path(MANIFEST)
        self.out.store.put(p, self.buf.getvalue())
        return self.out.full_url(p)


def _markers(out: Output, chunk: int, skip: frozenset, known: bytearray | None,
             unlisted: list[int] | None) -> Iterator[Marker]:
    """Output.iter_markers: the listed markers and the known ones the listing does not show, in shard order."""
    listed = {_shard_of(p): p for p in out.marker_paths()}
    extra = [i for i, done in enumerate(known or ()) if done and i not in listed]
    if unlisted is not None:
        unlisted.extend(extra)
    paths = sorted((p for i, p in listed.items() if i not in skip), key=_shard_of)
    paths = sorted(paths + [posixpath.join(out.shard_dir(i), MARKER) for i in extra if i not in skip], key=_shard_of)
    for i in range(0, len(paths), chunk):
        data = out.store.cat_files(paths[i:i + chunk], missing_ok=bool(extra))  # one set aside since: gone
        for p in sorted(data, key=_shard_of):
            yield out.parse_marker(p, data[p])


def warn_line(line: str) -> None:
    """A warning a run goes on after (a delete the store refused), on stderr, where no logger is given."""
    print(f"warning: {line}", file=sys.stderr, flush=True)


def _gc(out: Output, committed: dict[int, Marker] | None, warn) -> int:
    """Output.gc. After the store refuses one delete, the rest are not tried (each would be refused alike, a
    few seconds apiece): one line says the first and how many more are left."""
    by_shard: dict[int, list[str]] = {}
    for d in filter(_numbered, out.store.glob("shards", "*", "attempt-*")):
        by_shard.setdefault(_shard_of(d), []).append(d)
    doomed = []
    for shard, dirs in sorted(by_shard.items()):
        try:
            if committed is not None:
                marker = committed.get(shard)
            elif len(dirs) > 1 and out.store.fs.exists(p := posixpath.join(out.shard_dir(shard), MARKER)):
                marker = out.parse_marker(p, out.store.fs.cat_file(p))
            else:
                continue
        except CorruptMarker:  # damage the next run's check sets aside; its attempts wait until then
            continue
        keep = {f.attempt_dir for f in marker.files} if marker is not None else None
        doomed += [d for d in dirs if keep is not None and posixpath.relpath(d, out.root) not in keep]
    for n, d in enumerate(doomed):
        line = out.store.discard(d, "gc: removing an attempt its shard's commit does not name", tree=True)
        if line is not None:
            more = len(doomed) - n - 1
            warn(line + (f"; {more} more such attempt folder(s) left in place, untried" if more else ""))
            return n
    return len(doomed)


def manifest_row(out: Output, m: Marker) -> dict:
    """A committed shard's manifest row, from its marker: the URLs and SHA-256 of the files it names. A file
    the run does not write (a format it was not asked for, audit without --audit) is null."""
    def url(kind):
        return out.full_url(out.path(f.path)) if (f := m.file(kind)) else None

    def sha(kind):
        return f.sha256 if (f := m.file(kind)) else None

    row = {"shard": m.shard, "attempt": m.attempt, "rows": m.rows, "ok": m.ok, "failed": m.failed,
           "stats_url": url("stats"), "stats_sha256": sha("stats"), "audit_url": url("audit")}
    for f in written():
        row |= dict(zip(f.manifest_columns, (url(f.kind), sha(f.kind))))
    return row


def plan_words(plan: dict | None) -> str | None:
    """What a calibrated decoder's plan decided, in words (console, status, report); None without one.
    plan: the record (_plan.json: spec and measurements) or summary.json's view of it (spec, why, ...)."""
    if plan is None:
        return None
    from ssdgen.decoders.spec import DecodeSpec  # torch-free: the spec and its settings
    m = plan.get("measurements", plan)
    spec = DecodeSpec.parse(plan["spec"])
    how = f"speculating as {spec.label}" if spec.recipe.speculative else "decoded as plain AR"
    return f"{how}: {m['why']}" if m.get("why") else how


def _changed_input(old: list[dict], new: list[dict]) -> str | None:
    """The URL of the first input file whose recorded identity (rows, bytes, content) differs, or that is new."""
    before = {i["url"]: i for i in old}
    for i in new:
        if before.get(i["url"]) != i:
            return i["url"]
    gone = set(before) - {i["url"] for i in new}
    return min(gone) if gone else None


def shard_tables(samples: dict, rows: list[dict], decoder: str, model: str, image_format: str = "png",
                 devices: float = 1.0, kept: pa.Table | None = None) -> tuple[pa.Table, pa.Table]:
    """Decoded samples (prompt_id -> workers.results.Sample) + their input rows -> (images table, stats table), a
    row per input row, paired by prompt_id. A failed sample's `image` is null (not a struct of nulls), so
    readers filter it with an ordinary null check. devices: an actor's, for each sample's device-seconds.
    kept: the input columns the run keeps, a row per input row in order (inputs.shards.read_shard_columns)."""
    img_rows, stat_rows = [], []
    for r in rows:
        s = samples[r["prompt_id"]]
        grid = s.grid or (None, None)
        img_rows.append({"prompt_id": r["prompt_id"], "prompt": r["prompt"], "seed": r["seed"], "decoder": decoder,
                         "model": model, "image": None if s.image is None else {"bytes": s.image, "path": None},
                         "image_format": image_format, "width": s.width, "height": s.height,
                         "grid_height": grid[0], "grid_width": grid[1], "tokens": s.tokens})
        st = s.stats or {}  # SampleStats.to_row(), or none for a failed sample
        stat_rows.append({"prompt_id": r["prompt_id"], "status": s.status, "error": s.error,
                          "error_reason": s.error_reason, "decoder": decoder, "grid_height": grid[0],
                          "grid_width": grid[1]}
                         | {name: st.get(name) for name, _ in STAT_COLUMNS}
                         | {"latency_s": s.latency_s, "device_seconds": s.latency_s * devices})
    images = pa.Table.from_pylist(img_rows, schema=IMAGES_SCHEMA)
    if kept is not None and kept.num_columns:
        images = pa.Table.from_arrays(images.columns + kept.columns, schema=images_schema(kept.schema))
    return images, pa.Table.from_pylist(stat_rows, schema=STATS_SCHEMA)

