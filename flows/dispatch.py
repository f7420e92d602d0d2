"""The bounded shard window: one driver thread keeps every actor busy with a few shards at a time, and a small
fixed pool of I/O threads reads shards and writes and commits them.

    group task (flows.pipeline) --submit--> [window: at most `capacity` shards alive] --> read (I/O pool)
        --> ready --> an actor with room: all the shard's batches at once (Ray queues them in order)
        --> every batch back --> write + commit (I/O pool) while the actor decodes its next shard --> done

Why this shape (see the heap profile in the issue): one Prefect task per shard, all submitted at once, put one
thread per shard in Prefect's unbounded thread pool; every thread read and wrote Parquet, and pyarrow's default
allocator (mimalloc) keeps a heap per thread that it never gives back, so the driver grew by ~2.5 MB per thread.
Here the number of shards alive is bounded (a semaphore), Arrow runs only on the fixed I/O threads, and a
finished shard leaves nothing behind but its marker in storage and one byte in `done`.

Each actor holds up to `depth` shards: the next shard's batches are already queued on the actor when the
previous one's last batch returns, so the actor never waits for the driver to write. All Ray results arrive as
events on one queue (`ObjectRef.future()` callbacks), so the dispatch thread never blocks on one actor.

Cost: an actor's time is cut at each batch completion and charged to the shard whose batch finished, from the
actor's previous completion (or from when it was given work after being idle). The slices partition the time
each actor had work, so summed shard `wall_s` is the actors' allocated time, not a multiple of it (shards in
flight together on one actor would otherwise each count the same seconds).

Actor deaths: Ray restarts the actor (max_restarts=-1); the shards it held wait for the restart, probed with
`info()` every second for up to `restart_wait_s`, and only their missing batches are resubmitted, to the new
incarnation. A shard that sees more than MAX_ACTOR_DEATHS_PER_TRY deaths fails (transient: its group retries).
"""

from __future__ import annotations

import errno
import heapq
import itertools
import math
import queue
import threading
import time
from collections import Counter, deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from datetime import datetime, timezone

from .audit import AUDIT_FILE, audit_table, mark_rows, shard_audit
from .layout import Output, shard_tables
from .plan import RowGroupCache, Shard, read_shard
from .webdataset_shards import shard_files


NOT_TRANSIENT = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)
# a full disk, a quota, a read-only or missing store: retrying the write in a second changes nothing
PERMANENT_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM}
MAX_ACTOR_DEATHS_PER_TRY = 3
WRITE_TRIES = 3  # a failed PUT is retried in place: re-decoding a shard for a storage hiccup wastes the devices


def is_transient(exc: BaseException) -> bool:
    """Storage I/O and dead or unreachable actors are worth retrying; everything else is a bug or bad config."""
    import ray.exceptions as rx
    if isinstance(exc, (rx.RayActorError, rx.ActorUnavailableError, rx.ObjectLostError, rx.GetTimeoutError)):
        return True
    if isinstance(exc, rx.RayTaskError):  # an exception inside the actor: judge its cause
        return is_transient(exc.cause) if exc.cause is not None else False
    if isinstance(exc, OSError) and exc.errno in PERMANENT_ERRNOS:
        return False
    return isinstance(exc, (OSError, TimeoutError, ConnectionError)) and not isinstance(exc, NOT_TRANSIENT)


def _is_death(exc: BaseException) -> bool:
    import ray.exceptions as rx
    return isinstance(exc, (rx.RayActorError, rx.ActorUnavailableError))


class Ticket:
    """A group's shards in the window: how many are still alive, what they committed, the errors they ended
    with (the first of each kind, not one per shard)."""

    def __init__(self):
        self.cond = threading.Condition()
        self.alive = self.committed = self.images = 0
        self.errors: dict[str, BaseException] = {}

    def add(self) -> None:
        with self.cond:
            self.alive += 1

    def done(self, images: int | None, exc: BaseException | None) -> None:
        with self.cond:
            self.alive -= 1
            if exc is not None:
                kind = "transient" if is_transient(exc) else "fatal"
                self.errors.setdefault(kind, exc)
            elif images is not None:
                self.committed += 1
                self.images += images
            self.cond.notify_all()

    def wait(self) -> None:
        """Block until every shard given to this ticket is done, then raise the worst error: one that retrying
        cannot fix (the group fails at once), else a transient one (the group retries)."""
        with self.cond:
            while self.alive:
                self.cond.wait()
        for kind in ("fatal", "transient"):
            if kind in self.errors:
                raise self.errors[kind]


class _Job:
    """One shard in the window; the dispatch thread owns it. Dropped (and its rows and images with it) when
    the shard is done."""

    def __init__(self, shard: Shard, ticket: Ticket):
        self.shard, self.ticket = shard, ticket
        self.rows: list[dict] = []
        self.batches: list[list[dict]] = []
        self.results: list[dict | None] = []
        self.refs: dict[int, object] = {}  # batch -> its ObjectRef, kept alive until its event is handled
        self.actor: _Actor | None = None
        self.gen = self.deaths = 0  # gen: bumped on each resubmission; late events of an older one are ignored
        self.waiting = self.finished = False
        self.alloc_s = self.busy_s = self.load_s = 0.0
        self.started_at: str | None = None
        self.where: dict = {}


class _Actor:
    def __init__(self, handle):
        self.handle = handle
        self.jobs: list[_Job] = []  # shards decoding here
        self.inflight = 0  # batches submitted and not yet back
        self.mark = 0.0  # perf_counter up to which this actor's time has been charged
        self.restarting = False
        self.deadline = 0.0
        self.waiting: list[_Job] = []


class Dispatcher:
    """Run shards on `actors` through a window of `capacity` shards. `submit` blocks while the window is full;
    `done[i]` is set when shard i commits. Start with `start()`, end with `close()`."""

    def __init__(self, cfg, files, out: Output, actors: list, done: bytearray, log, restart_wait_s: float,
                 bar=None, decode_plan: dict | None = None, guard=None):
        """decode_plan: a calibrated decoder's plan (flows.pipeline), sent with every batch. guard: called before
        every commit; it raises when the run may no longer commit (its lease was taken over, flows.lease)."""
        self.guard = guard
        self.cfg, self.files, self.out, self.done = cfg, files, out, done
        self.decode_plan = decode_plan
        self.log, self.bar = log, bar
        self.restart_wait_s = restart_wait_s
        self.actors = [_Actor(a) for a in actors]
        per_shard = math.ceil(cfg.shard_size / cfg.batch_size)
        # batches queued per actor: at least 3 (one running, two waiting), and at least 2 shards
        self.depth = max(2, math.ceil(3 / per_shard))
        self.io_threads = min(8, max(2, len(actors)))
        self.capacity = len(actors) * (self.depth + 1) + self.io_threads  # decoding + read ahead + writing
        self.slots = threading.Semaphore(self.capacity)
        self.events: queue.Queue = queue.Queue()
        self.io = ThreadPoolExecutor(self.io_threads, thread_name_prefix="ssdgen-io")
        self.cache = RowGroupCache(2)
        self.ready: deque[_Job] = deque()
        self.live: set[_Job] = set()
        self.timers: list = []  # heap of (when, seq, actor): restart probes
        self.seq = itertools.count()
        self.aborted: BaseException | None = None
        self.commits = self.images = 0
        # driver seconds from a shard's last batch coming back to its commit being visible: count, sum, max
        self.write_n, self.write_total, self.write_max = 0, 0.0, 0.0
        self.closed = False
        self.close_lock = threading.Lock()  # an admit is queued before the stop, or refused: never lost after it
        self.thread = threading.Thread(target=self._loop, name="ssdgen-dispatch", daemon=True)

    # --- called from other threads -------------------------------------------------------------------------
    def start(self) -> "Dispatcher":
        self.thread.start()
        return self

    def submit(self, shard: Shard, ticket: Ticket) -> None:
        """Hand a shard to the window; blocks while `capacity` shards are alive. Raises if the run aborted."""
        while not self.slots.acquire(timeout=0.5):
            if self.aborted is not None:
                raise self.aborted
        with self.close_lock:
            if self.aborted is not None or self.closed:
                self.slots.release()
                raise self.aborted or RuntimeError("the dispatcher is closed")
            ticket.add()
            self.events.put(("admit", shard, ticket))

    def interrupt(self, exc: BaseException) -> None:
        """Stop now (Ctrl-C, SIGTERM): every shard alive ends with `exc`, uncommitted; safe from a signal
        handler (it only queues an event)."""
        self.events.put(("abort", exc))

    def close(self) -> None:
        with self.close_lock:
            self.closed = True
            self.events.put(("stop",))
        self.thread.join()
        self.io.shutdown(wait=True)

    # --- the dispatch thread ------------------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            timeout = max(0.0, self.timers[0][0] - time.monotonic()) if self.timers else 1.0
            try:
                ev = self.events.get(timeout=timeout)
            except queue.Empty:
                ev = None
            if ev is not None and ev[0] == "stop":
                self._abort(RuntimeError("the dispatcher was closed with shards in flight"), quiet=True)
                return
            try:
                if ev is not None:
                    getattr(self, f"_on_{ev[0]}")(*ev[1:])
                self._timers()
                self._dispatch()
            except Exception as e:  # noqa: BLE001 - a bug here must fail the run, not hang it
                self._abort(e)

    def _on_abort(self, exc: BaseException) -> None:
        self._abort(exc, quiet=True)

    def _on_admit(self, shard: Shard, ticket: Ticket) -> None:
        job = _Job(shard, ticket)
        self.live.add(job)
        if self.aborted is not None:
            return self._finish(job, exc=self.aborted)
        self._io(self._read, job, "read")

    def _io(self, fn, job: _Job, event: str, *args) -> None:
        fut = self.io.submit(fn, job, *args)
        fut.add_done_callback(lambda f: self.events.put((event, job, f)))

    def _read(self, job: _Job) -> list[dict]:  # an I/O thread
        rows = [asdict(r) for r in read_shard(self.files, job.shard, self.cfg.seed, cache=self.cache)]
        mark_rows(rows, self.cfg.audit)  # by prompt_id alone, so every try of this shard audits the same prompts
        return rows

    def _on_read(self, job: _Job, fut) -> None:
        if job.finished:
            return
        if (exc := fut.exception()) is not None:
            return self._finish(job, exc=exc)
        job.rows = fut.result()
        b = self.cfg.batch_size
        job.batches = [job.rows[i:i + b] for i in range(0, len(job.rows), b)]
        job.results = [None] * len(job.batches)
        self.ready.append(job)

    def _dispatch(self) -> None:
        """Give ready shards to the actors with the fewest shards, up to `depth` each."""
        while self.ready and self.aborted is None:
            free = [a for a in self.actors if not a.restarting and len(a.jobs) < self.depth]
            if not free:
                return
            actor = min(free, key=lambda a: len(a.jobs))
            job = self.ready.popleft()
            job.actor = actor
            job.started_at = datetime.now(timezone.utc).isoformat()
            actor.jobs.append(job)
            self._send(job, range(len(job.batches)))

    def _send(self, job: _Job, which) -> None:
        actor = job.actor
        if actor.inflight == 0:
            actor.mark = time.perf_counter()  # the actor was idle until now: that gap is no shard's
        for i in which:
            ref = actor.handle.decode.remote(job.batches[i], self.decode_plan)
            job.refs[i] = ref
            actor.inflight += 1
            ref.future().add_done_callback(lambda f, i=i, g=job.gen: self.events.put(("batch", job, i, g, f)))

    def _on_batch(self, job: _Job, i: int, gen: int, fut) -> None:
        actor, now = job.actor, time.perf_counter()
        actor.inflight -= 1
        job.alloc_s += now - actor.mark  # the actor's time since its previous batch came back is this batch's
        actor.mark = now
        if job.finished or gen != job.gen:
            return
        job.refs.pop(i, None)
        if (exc := fut.exception()) is not None:
            return self._on_death(job, exc) if _is_death(exc) else self._finish(job, exc=exc)
        r = fut.result()
        job.results[i] = r
        job.busy_s += r["busy_s"]
        job.load_s += r.get("load_s", 0.0)
        job.where = r.get("worker", job.where)
        if self.bar is not None:
            self.bar.update(len(job.batches[i]))
        if all(x is not None for x in job.results):
            actor.jobs.remove(job)  # the actor has room again: the next ready shard goes to it now
            self._io(self._write, job, "written", now)

    def _on_death(self, job: _Job, exc: BaseException) -> None:
        if job.waiting:
            return  # the same death, seen through another of this shard's batches
        job.deaths += 1
        if job.deaths > MAX_ACTOR_DEATHS_PER_TRY:
            return self._finish(job, exc=exc)
        actor = job.actor
        job.waiting = True
        actor.waiting.append(job)
        missing = sum(r is None for r in job.results)
        self.log.warning(f"shard {job.shard.id}: actor died ({type(exc).__name__}); waiting for its restart to "
                         f"resubmit {missing} batch(es)")
        if not actor.restarting:
            actor.restarting = True
            actor.deadline = time.monotonic() + self.restart_wait_s
            self._probe(actor)

    def _probe(self, actor: _Actor) -> None:
        ref = actor.handle.info.remote()
        ref.future().add_done_callback(lambda f: self.events.put(("probe", actor, f, ref)))

    def _on_probe(self, actor: _Actor, fut, ref) -> None:
        if not actor.restarting:
            return
        if fut.exception() is None:  # the restarted actor answers: resubmit what its shards still miss
            actor.restarting = False
            for job in actor.waiting:
                if not job.finished:
                    job.waiting = False
                    job.gen += 1
                    job.refs.clear()
                    self._send(job, [i for i, r in enumerate(job.results) if r is None])
            actor.waiting = []
        elif time.monotonic() < actor.deadline:
            heapq.heappush(self.timers, (time.monotonic() + 1.0, next(self.seq), actor))
        else:
            self._give_up(actor, fut.exception())

    def _timers(self) -> None:
        now = time.monotonic()
        while self.timers and self.timers[0][0] <= now:
            _, _, actor = heapq.heappop(self.timers)
            if actor.restarting:
                self._probe(actor)
        for actor in self.actors:  # a probe can hang while the restart waits for resources: the deadline holds
            if actor.restarting and now > actor.deadline:
                import ray.exceptions as rx
                self._give_up(actor, rx.GetTimeoutError(f"actor not back after {self.restart_wait_s:.0f} s"))

    def _give_up(self, actor: _Actor, exc: BaseException) -> None:
        """The actor did not come back in time: its shards fail (transient: their groups retry them)."""
        actor.restarting = False
        for job in actor.waiting:
            if not job.finished:
                self._finish(job, exc=exc)
        actor.waiting = []

    def _on_written(self, job: _Job, fut) -> None:
        if job.finished:
            return
        if (exc := fut.exception()) is not None:
            return self._finish(job, exc=exc)
        marker, write_s = fut.result()
        self.done[job.shard.id] = 1  # ours, or another attempt's that won the commit
        if marker is not None:
            self.commits += 1
            self.images += marker["ok"]
            self.write_n += 1
            self.write_total += write_s
            self.write_max = max(self.write_max, write_s)
        self._finish(job, images=marker["ok"] if marker else None)

    def _finish(self, job: _Job, images: int | None = None, exc: BaseException | None = None) -> None:
        if job.finished:
            return
        job.finished = True
        if job.actor is not None and job in job.actor.jobs:
            job.actor.jobs.remove(job)
        job.rows = job.batches = job.results = []
        job.refs = {}
        self.live.discard(job)
        self.slots.release()
        job.ticket.done(images, exc)

    def _abort(self, exc: BaseException, quiet: bool = False) -> None:
        """Stop the run as a crashed driver would: nothing more commits; every shard alive ends with `exc`."""
        if self.aborted is None:
            self.aborted = exc
            if not quiet:
                self.log.error(f"dispatcher: {type(exc).__name__}: {exc}")
        for job in list(self.live):
            self._finish(job, exc=self.aborted)
        self.ready.clear()

    # --- writing (an I/O thread) --------------------------------------------------------------------------
    def _write(self, job: _Job, decoded_at: float) -> tuple[dict | None, float]:
        """Tables, files under a new attempt, marker. Returns (marker, or None when another attempt won the
        commit; seconds from the last batch to the commit)."""
        cfg, dev = self.cfg, self.cfg.devices_per_actor
        samples = [s for r in job.results for s in r["samples"]]
        for s in samples:
            s["device_seconds"] = s["latency_s"] * dev
        images, stats = shard_tables(samples, job.rows, cfg.decoder.label, cfg.model, cfg.image_format)
        audited, audit = shard_audit(job.results, dev)
        audit_t = audit_table(audited, cfg.audit_label) if cfg.audit > 0 else None
        errors = Counter(s["error"] for s in samples if s["status"] != "ok")
        # the actor's audit seconds leave the shard's time: the images are costed without it, the audit apart
        wall = max(0.0, job.alloc_s - audit["seconds"])
        marker = {"shard": job.shard.id, "rows": len(samples), "ok": len(samples) - sum(errors.values()),
                  "failed": sum(errors.values()), "errors": dict(errors.most_common(10)), "wall_s": wall,
                  "busy_s": job.busy_s, "load_s": job.load_s, "devices": dev, "device_type": cfg.device_type,
                  "device_seconds_allocated": (wall + job.load_s) * dev, "device_seconds_busy": job.busy_s * dev,
                  "started_at": job.started_at, "actor_pid": job.where.get("pid"),
                  "node_id": job.where.get("node_id"), "device": job.where.get("device"),
                  "batches": len(job.batches)} | ({"audit": audit} if cfg.audit > 0 else {})
        for attempt_no in range(WRITE_TRIES):
            try:
                return self._put(job.shard.id, marker, images, stats, audit_t), time.perf_counter() - decoded_at
            except Exception as e:  # noqa: BLE001 - transient ones are retried here, under a new attempt key
                if attempt_no + 1 == WRITE_TRIES or not is_transient(e) or self.aborted is not None:
                    raise
                time.sleep(0.2 * 2 ** attempt_no)

    def _put(self, shard: int, marker: dict, images, stats, audit_t) -> dict | None:
        out = self.out
        attempt = out.new_attempt(shard)
        # images.parquet, stats.parquet and/or the WebDataset tar, as --format says
        files = shard_files(out, attempt, shard, images, stats, self.cfg.format, self.cfg.shard_size)
        if audit_t is not None:  # written even when empty: the marker then says this shard was audited
            files.append(out.write_table(f"{attempt}/{AUDIT_FILE}", audit_t))
        if self.aborted is not None:  # an aborted run commits nothing more, as a crashed driver
            raise self.aborted
        if self.guard is not None:
            self.guard()
        marker = marker | {"attempt": attempt.rsplit("/", 1)[-1], "files": files,
                           "finished_at": datetime.now(timezone.utc).isoformat()}
        return marker if out.commit(shard, marker) else None
