"""Writing and committing a shard, on an I/O thread: the shard's tables and marker, its files under a new
attempt key, then the create-only commit of the marker (output.layout), so a shard commits exactly once however
many attempts wrote it. The run's lease guard is called right before each commit, and the output's fence before
every write: a driver whose lease was taken over must write nothing more (output.lease), and removes the attempts
it had begun; nor may an aborted run commit. Kept apart from the window
(flows.dispatch) because none of this touches the window's state: it runs on the I/O threads, and only its
outcome comes back, as an event."""

from __future__ import annotations

import threading
import time

from ssdgen.formats import write_shard
from ssdgen.output.audit import audit_table, shard_audit, write_audit
from ssdgen.output.layout import Output, shard_tables, warn_line
from ssdgen.output.lease import LeaseLost
from ssdgen.output.marker import Marker, ShardWork, committed_marker, shard_fields

from .ticket import is_transient

WRITE_TRIES = 3  # a failed PUT is retried in place: re-decoding a shard for a storage hiccup wastes the devices


class ProvenanceError(RuntimeError):
    """An actor reports a decoder other than the run's plan: its rows are not committed."""


def decoded_by(job, spec: str) -> str:
    """The decoder every batch of `job` reports (workers.results.BatchResult.decoder): the provenance its rows
    and marker record. It must be `spec`, the run's plan; any other is refused, never committed under the plan's
    name (a stale actor, a bug in resolving)."""
    if others := {r.decoder for r in job.results} - {spec}:
        others = ", ".join(sorted(others))
        raise ProvenanceError(f"shard {job.shard.id}: decoded by {others}, but the run's plan is {spec}; "
                              "not committed")
    return spec


def shard_marker(job, cfg, spec: str, planning_s: float = 0.0) -> tuple[dict, object, object, object | None]:
    """A decoded shard (flows.inflight.Job) as (its marker before the commit, the images table, the stats table,
    the audit table or None without an audit). spec: the run's resolved spec text, which the results must report
    (`decoded_by`); the rows and marker record what the results say (a calibrated run's requested spec is only
    in its config). planning_s: a calibration actor's seconds, charged here as model load is."""
    dev = cfg.devices_per_actor
    spec = decoded_by(job, spec)
    samples = {pid: s for r in job.results for pid, s in r.samples.items()}
    images, stats = shard_tables(samples, job.rows, spec, cfg.model, cfg.image_format, dev, job.kept)
    audited, audit = shard_audit(job.results, dev)
    audit_t = audit_table(audited, cfg.audit_label) if cfg.audit > 0 else None
    work = ShardWork(job.shard.id, job.alloc_s, job.busy_s, job.load_s + planning_s, dev, cfg.device_type,
                     job.started_at, job.where, len(job.batches))
    return shard_fields(work, samples, spec, audit if cfg.audit > 0 else None), images, stats, audit_t


class Commit:
    """Writes and commits a run's shards. `guard`, when given, is called before a shard's files are written and
    before its commit, and raises when the run may no longer commit (output.lease `Lease.guard`); `aborted()` is
    the run's abort, None while it runs. spec: the run's resolved spec text (flows.pipeline), which every batch's
    results must report. planning_s: a calibration actor's seconds, charged to the first shard this run
    commits."""

    def __init__(self, cfg, out: Output, spec: str, guard=None, aborted=lambda: None, planning_s: float = 0.0):
        self.cfg, self.out, self.spec, self.guard, self.aborted = cfg, out, spec, guard, aborted
        self._planning_s, self._lock = planning_s, threading.Lock()

    def write(self, job, decoded_at: float) -> tuple[Marker | None, float]:
        """Tables, files under a new attempt, marker. Returns (marker, or None when another attempt won the
        commit; seconds from the last batch to the commit)."""
        with self._lock:  # the I/O threads commit in parallel: one of them takes the planning seconds
            planning_s, self._planning_s = self._planning_s, 0.0
        try:
            done = self._write(job, decoded_at, planning_s)
        except BaseException:
            with self._lock:
                self._planning_s += planning_s  # not committed: the next shard carries them
            raise
        if done[0] is None and planning_s:  # another attempt's commit won: ours carried nothing
            with self._lock:
                self._planning_s += planning_s
        return done

    def _write(self, job, decoded_at: float, planning_s: float) -> tuple[Marker | None, float]:
        marker, images, stats, audit_t = shard_marker(job, self.cfg, self.spec, planning_s)
        attempts = []
        for attempt_no in range(WRITE_TRIES):
            attempts.append(self.out.new_attempt(job.shard.id))
            try:
                return (self._put(job.shard.id, attempts[-1], marker, images, stats, audit_t),
                        time.perf_counter() - decoded_at)
            except LeaseLost:
                self._discard(job.shard.id, attempts)
                raise
            except Exception as e:  # noqa: BLE001 - transient ones are retried here, under a new attempt key
                if attempt_no + 1 == WRITE_TRIES or not is_transient(e) or self.aborted() is not None:
                    raise
                time.sleep(0.2 * 2 ** attempt_no)

    def _discard(self, shard: int, attempts: list[str]) -> None:
        """A driver that lost the lease leaves no attempt behind. The last one was never committed (the lease's
        check, the output's fence, raised before its marker's write); an earlier, transiently failed one is kept
        if the shard's marker names it. No other driver writes under these names, and a write that was under
        way when the driver froze may have landed since: removed too."""
        try:
            marker = self.out.marker_of(shard)
            keep = set() if marker is None else {self.out.path(f.attempt_dir) for f in marker.files}
        except (OSError, ValueError):  # cannot tell which one it names: remove only the one never committed
            keep = set(attempts[:-1])
        for attempt in attempts:
            if attempt not in keep and (line := self.out.remove_attempt(attempt)) is not None:
                warn_line(line)  # refused (no delete permission): said, and the holder's gc tries again

    def _put(self, shard: int, attempt: str, marker: dict, images, stats, audit_t) -> Marker | None:
        out = self.out
        if self.guard is not None:  # before the files too: a folder replaced under the run gets none of them
            self.guard()
        # each --format's file (formats/: images.parquet, the WebDataset tar, ...) and stats.parquet
        files = write_shard(out, attempt, shard, images, stats, self.cfg.format, self.cfg.shard_size)
        if audit_t is not None:  # written even when empty: the marker then says this shard was audited
            files.append(write_audit(out, attempt, audit_t))
        if (aborted := self.aborted()) is not None:  # an aborted run commits nothing more, as a crashed driver
            raise aborted
        if self.guard is not None:
            self.guard()
        marker = committed_marker(marker, attempt, files)
        return marker if out.commit(marker) else None
