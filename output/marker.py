"""A shard's commit marker as a typed record: what `_SUCCESS.json` holds, written once (flows.commit) and read by
everything that trusts a shard as done (resume, verify, the manifest, cost, audit, the reader and the report).

On storage it is JSON (sorted keys, so the bytes of one marker are stable); in memory it is a frozen `Marker`
whose `files` are `FileRecord`s. A marker that is not JSON, lacks `shard` or `files`, or has a field of the wrong
kind fails `from_json` with a ValueError naming what is wrong; the layout turns that into `CorruptMarker` with
the marker's URL (output.layout).
"""

from __future__ import annotations

import hashlib
import json
import posixpath
from collections import Counter
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime, timezone

from ssdgen.workers.results import UNRECORDED


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
    md5: str | None = None  # what an S3 ETag is for a single-part PUT (output.verify's cheap check)
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
        if not isinstance(d["shard"], int) or not isinstance(d["files"], list):
            raise ValueError("shard must be an integer and files a list")
        try:
            files = tuple(FileRecord(**f) for f in d["files"])
        except TypeError as e:
            raise ValueError(f"a file record is malformed ({e})") from None
        return cls(**(d | {"files": files}))

    @classmethod
    def from_json(cls, data: bytes) -> "Marker":
        return cls.from_dict(json.loads(data))


@dataclass(frozen=True)
class ShardWork:
    """What a shard's decoding cost and where it ran, as the flow measured it (flows.window.Job): the marker's
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
