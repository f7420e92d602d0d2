"""A shard's commit marker as a typed record: what `_SUCCESS.json` holds, written once (flows.commit) and read by
everything that trusts a shard as done (resume, verify, the manifest, cost, audit, the reader and the report).

On storage it is JSON (sorted keys, so the bytes of one marker are stable); in memory it is a frozen `Marker`
whose `files` are `FileRecord`s. A marker that is not JSON (or nested too deeply to parse), lacks `shard` or
`files`, or has a field of the wrong kind fails `from_json` with a ValueError naming what is wrong; the layout
turns that into `CorruptMarker` with the marker's URL (output.layout), and the run sets the shard aside.

A marker is trusted only as far as it stays in its shard (`read`): it is in the folder of the shard it names, it
names at least one file, each with a SHA-256, and each inside an attempt folder of that shard. A marker copied
into another shard's folder, or naming a file elsewhere (`../../`, an absolute path), is damage, never read
through: nothing outside the run's folder is read because a marker says so.
"""

from __future__ import annotations

import hashlib
import json
import math
import posixpath
import re
from collections import Counter
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime, timezone

from ssdgen.workers.results import UNRECORDED


SHA256 = re.compile(r"[0-9a-f]{64}")
# a file a marker of shard N may name: shards/{N:06d}/attempt-{name}/{file}, no `.`, `..` or empty part
_NAME = r"[A-Za-z0-9_-][A-Za-z0-9_.-]*"
COUNTS = ("rows", "ok", "failed")
SECONDS = ("wall_s", "busy_s", "load_s", "devices", "device_seconds_allocated", "device_seconds_busy")


def in_shard(path: str, shard: int) -> bool:
    """Whether `path` (relative to the run's root) is a file in one of shard `shard`'s attempt folders, and
    nowhere else (no `..`, no absolute path, no other shard's folder)."""
    return re.fullmatch(rf"shards/{shard:06d}/attempt-{_NAME}/{_NAME}", path) is not None


def file_kind(path: str) -> str:
    """A data file's kind from its name: its stem (images, stats, audit), or its extension where the stem is the
    shard's number (tar for {shard:05d}.tar; a format's kind, formats/)."""
    stem, _, ext = posixpath.basename(path).partition(".")
    return ext if stem.isdigit() and ext else stem


@dataclass(frozen=True)
class FileRecord:
    """One file a marker names, as storage.store.Store.write_bytes recorded it."""

    path: str  # relative to the run's root
    rows: int
    bytes: int
    sha256: str
    md5: str | None = None  # what an S3 ETag is for a single-part PUT (output.damage's cheap check)
    mtime: float | None = None  # a local file's, at the commit

    @property
    def kind(self) -> str:
        return file_kind(self.path)

    @property
    def attempt_dir(self) -> str:
        return posixpath.dirname(self.path)


@dataclass(frozen=True)
class Marker:
    """A committed shard: its files and its accounting (output.cost's shard record: ok, failed, wall_s, busy_s,
    load_s, devices, device_seconds_allocated, device_seconds_busy)."""

    shard: int
    files: tuple[FileRecord, ...]
    attempt: str = ""
    rows: int = 0
    ok: int = 0
    failed: int = 0
    errors: dict = field(default_factory=dict)  # message -> count, the 10 most common
    error_reasons: dict = field(default_factory=dict)  # error_reason -> count, every reason (none before it existed)
    wall_s: float = 0.0
    busy_s: float = 0.0
    load_s: float = 0.0
    devices: float = 1.0
    device_type: str = "cpu"
    device_seconds_allocated: float = 0.0
    device_seconds_busy: float = 0.0
    started_at: float | None = None
    finished_at: str | None = None
    actor_pid: int | None = None
    node_id: str | None = None
    device: str | None = None
    batches: int = 0
    audit: dict | None = None  # with --audit: {rows, seconds, device_seconds} (output.audit)
    decoder: str | None = None  # the resolved spec text that decoded the shard (None: committed before it was kept)

    def file(self, kind: str) -> FileRecord | None:
        """The file of a kind (images, stats, audit, tar), or None when the run does not write it."""
        return next((f for f in self.files if f.kind == kind), None)

    def to_dict(self) -> dict:
        return asdict(self) | {"files": [asdict(f) for f in self.files]}

    def to_json(self) -> bytes:
        return json.dumps(self.to_dict(), indent=1, sort_keys=True).encode()

    @classmethod
    def from_dict(cls, d: dict) -> "Marker":
        if not isinstance(d, dict) or not {"shard", "files"} <= d.keys():
            raise ValueError("not a commit marker (no shard or files)")
        unknown = set(d) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"unknown field(s) {', '.join(sorted(unknown))}")
        if not _count(d["shard"]) or not isinstance(d["files"], list):
            raise ValueError("shard must be an integer and files a list")
        if (problem := _kinds(d)) is not None:
            raise ValueError(problem)
        try:
            files = tuple(FileRecord(**f) for f in d["files"])
        except TypeError as e:
            raise ValueError(f"a file record is malformed ({e})") from None
        return cls(**(d | {"files": files}))

    @classmethod
    def from_json(cls, data: bytes) -> "Marker":
        try:
            d = json.loads(data)
        except RecursionError:  # 100,000 nested brackets: the parser's stack, not a marker
            raise ValueError("nested too deeply to be a commit marker") from None
        return cls.from_dict(d)

    @classmethod
    def read(cls, data: bytes, shard: int) -> "Marker":
        """The marker found in shard `shard`'s folder, trusted only inside it (the module's docstring); a
        ValueError names what is wrong."""
        m = cls.from_json(data)
        if m.shard != shard:
            raise ValueError(f"it names shard {m.shard} but is in shard {shard}'s folder")
        if not m.files:
            raise ValueError("it names no file")
        for f in m.files:
            if not in_shard(f.path, shard):
                raise ValueError(f"it names {f.path!r}, outside its shard's attempt folders")
            if not SHA256.fullmatch(f.sha256):
                raise ValueError(f"it names {f.path} without a SHA-256")
        if m.attempt and {f.attempt_dir.rsplit("/", 1)[-1] for f in m.files} != {m.attempt}:
            raise ValueError(f"its files are not all in its attempt {m.attempt}")
        return m


def _count(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _file_kinds(f: dict) -> bool:
    return (isinstance(f.get("path"), str) and isinstance(f.get("sha256"), str) and _count(f.get("rows"))
            and _count(f.get("bytes")) and isinstance(f.get("md5"), (str, type(None)))
            and (f.get("mtime") is None or _number(f["mtime"])))


# (fields, their check, what they must be): the fields the run counts, costs and names shards by
_KINDS = ((COUNTS, _count, "a count"), (SECONDS, _number, "a number"),
          (("errors", "error_reasons"), lambda v: isinstance(v, dict) and all(map(_count, v.values())),
           "counts by message"),
          (("audit",), lambda v: v is None or isinstance(v, dict), "an object"),
          (("attempt", "device_type"), lambda v: isinstance(v, str), "a string"),
          (("decoder",), lambda v: v is None or isinstance(v, str), "a string"))


def _kinds(d: dict) -> str | None:
    """What is of the wrong kind in a marker's fields or its files' records, in words, or None: a hand-edited
    marker is damage named here, never a TypeError in the summary later."""
    for keys, ok, kind in _KINDS:
        for k in keys:
            if k in d and not ok(d[k]):
                return f"{k} is {json.dumps(d[k])[:40]}, not {kind}"
    for f in d["files"]:
        if not isinstance(f, dict) or not _file_kinds(f):
            return f"the file record {json.dumps(f)[:80]} has a field of the wrong kind"
    return None


@dataclass(frozen=True)
class ShardWork:
    """What a shard's decoding cost and where it ran, as the flow measured it (flows.inflight.Job): the marker's
    accounting is computed from this in one place (`shard_fields`)."""

    shard: int
    alloc_s: float  # the actor's time charged to the shard (flows.scheduling), audit included
    busy_s: float
    load_s: float  # model load (and a calibration actor's seconds, charged with the first commit)
    devices: float
    device_type: str
    started_at: str | None
    where: dict  # {pid, node_id, device} of the actor (workers.results.BatchResult.worker)
    batches: int


def shard_fields(work: ShardWork, samples: dict, decoder: str, audit: dict | None) -> dict:
    """A decoded shard's marker before its files exist: its rows' outcomes counted from `samples` (prompt_id ->
    workers.results.Sample), its accounting, its decoder (what the results reported) and, with --audit, the
    audit's {rows, seconds, device_seconds} (output.audit), whose seconds leave the images' time."""
    errors = Counter(s.error for s in samples.values() if not s.ok)
    reasons = Counter(s.error_reason or UNRECORDED for s in samples.values() if not s.ok)
    wall = max(0.0, work.alloc_s - (audit or {}).get("seconds", 0.0))
    dev = work.devices
    return {"shard": work.shard, "rows": len(samples), "ok": len(samples) - sum(errors.values()),
            "failed": sum(errors.values()), "errors": dict(errors.most_common(10)),
            "error_reasons": dict(reasons.most_common()), "wall_s": wall, "busy_s": work.busy_s,
            "load_s": work.load_s, "devices": dev, "device_type": work.device_type,
            "device_seconds_allocated": (wall + work.load_s) * dev, "device_seconds_busy": work.busy_s * dev,
            "started_at": work.started_at, "actor_pid": work.where.get("pid"), "node_id": work.where.get("node_id"),
            "device": work.where.get("device"), "batches": work.batches, "decoder": decoder} \
        | ({"audit": audit} if audit is not None else {})


def committed_marker(pending: dict, attempt: str, files: list[dict]) -> Marker:
    """The marker `shard_fields` began, completed with the attempt whose files it names, at the commit."""
    return Marker.from_dict(pending | {"attempt": attempt.rsplit("/", 1)[-1], "files": files,
                                       "finished_at": datetime.now(timezone.utc).isoformat()})


class MarkerDigest:
    """Which commits a manifest or summary was built from, in one short string: the count and an
    order-independent hash of every (shard, attempt). The manifest (in its Parquet metadata) and the summary
    record it; a run compares it with the markers it finds (output.converge), so a manifest that misses a
    shard, or names an attempt a re-decode replaced, is seen and rebuilt."""

    def __init__(self):
        self.n, self.total = 0, 0

    def add(self, m: "Marker") -> None:
        h = hashlib.sha256(f"{m.shard}:{m.attempt}".encode()).digest()
        self.n += 1
        self.total = (self.total + int.from_bytes(h, "big")) % 2**256  # a sum: the order markers come in is free

    def value(self) -> str:
        return f"{self.n}:{self.total:064x}"
