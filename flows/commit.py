"""Writing and committing a shard, on an I/O thread: the shard's tables and marker, its files under a new
attempt key, then the create-only commit of the marker (flows.layout), so a shard commits exactly once however
many attempts wrote it. The run's lease guard is called right before each commit: a driver whose lease was
taken over must commit nothing more (flows.lease), nor may an aborted run. Kept apart from the window
(flows.dispatch) because none of this touches the window's state: it runs on the I/O threads, and only its
outcome comes back, as an event."""

from __future__ import annotations

import time
from collections import Counter
from datetime import datetime, timezone

from .audit import AUDIT_FILE, audit_table, shard_audit
from .layout import Output, shard_tables
from .marker import Marker
from .ticket import is_transient
from .webdataset_shards import shard_files

WRITE_TRIES = 3  # a failed PUT is retried in place: re-decoding a shard for a storage hiccup wastes the devices


def shard_marker(job, cfg) -> tuple[dict, object, object, object | None]:
    """A decoded shard (flows.window.Job) as (its marker before the commit, the images table, the stats table,
    the audit table or None without an audit)."""
    dev = cfg.devices_per_actor
    samples = {pid: s for r in job.results for pid, s in r.samples.items()}
    images, stats = shard_tables(samples, job.rows, cfg.decoder.label, cfg.model, cfg.image_format, dev)
    audited, audit = shard_audit(job.results, dev)
    audit_t = audit_table(audited, cfg.audit_label) if cfg.audit > 0 else None
    errors = Counter(s.error for s in samples.values() if not s.ok)
    # the actor's audit seconds leave the shard's time: the images are costed without it, the audit apart
    wall = max(0.0, job.alloc_s - audit["seconds"])
    marker = {"shard": job.shard.id, "rows": len(samples), "ok": len(samples) - sum(errors.values()),
              "failed": sum(errors.values()), "errors": dict(errors.most_common(10)), "wall_s": wall,
              "busy_s": job.busy_s, "load_s": job.load_s, "devices": dev, "device_type": cfg.device_type,
              "device_seconds_allocated": (wall + job.load_s) * dev, "device_seconds_busy": job.busy_s * dev,
              "started_at": job.started_at, "actor_pid": job.where.get("pid"),
              "node_id": job.where.get("node_id"), "device": job.where.get("device"),
              "batches": len(job.batches)} | ({"audit": audit} if cfg.audit > 0 else {})
    return marker, images, stats, audit_t


class Commit:
    """Writes and commits a run's shards. `guard`, when given, is called before every commit and raises when the
    run may no longer commit; `aborted()` is the run's abort, None while it runs."""

    def __init__(self, cfg, out: Output, guard=None, aborted=lambda: None):
        self.cfg, self.out, self.guard, self.aborted = cfg, out, guard, aborted

    def write(self, job, decoded_at: float) -> tuple[Marker | None, float]:
        """Tables, files under a new attempt, marker. Returns (marker, or None when another attempt won the
        commit; seconds from the last batch to the commit)."""
        marker, images, stats, audit_t = shard_marker(job, self.cfg)
        for attempt_no in range(WRITE_TRIES):
            try:
                return self._put(job.shard.id, marker, images, stats, audit_t), time.perf_counter() - decoded_at
            except Exception as e:  # noqa: BLE001 - transient ones are retried here, under a new attempt key
                if attempt_no + 1 == WRITE_TRIES or not is_transient(e) or self.aborted() is not None:
                    raise
                time.sleep(0.2 * 2 ** attempt_no)

    def _put(self, shard: int, marker: dict, images, stats, audit_t) -> Marker | None:
        out = self.out
        attempt = out.new_attempt(shard)
        # images.parquet, stats.parquet and/or the WebDataset tar, as --format says
        files = shard_files(out, attempt, shard, images, stats, self.cfg.format, self.cfg.shard_size)
        if audit_t is not None:  # written even when empty: the marker then says this shard was audited
            files.append(out.write_table(f"{attempt}/{AUDIT_FILE}", audit_t))
        if (aborted := self.aborted()) is not None:  # an aborted run commits nothing more, as a crashed driver
            raise aborted
        if self.guard is not None:
            self.guard()
        marker = Marker.from_dict(marker | {"attempt": attempt.rsplit("/", 1)[-1], "files": files,
                                            "finished_at": datetime.now(timezone.utc).isoformat()})
        return marker if out.commit(marker) else None
