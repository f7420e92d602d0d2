"""The shards in flight, bounded: one driver thread keeps every actor busy with a few shards at a time, and a small
fixed pool of I/O threads reads shards and writes and commits them.

    group task (flows.pipeline) --submit--> [in flight: at most `capacity` shards alive] --> read (I/O pool)
        --> ready --> an actor with room: all the shard's batches at once (Ray queues them in order)
        --> every batch back --> write + commit (I/O pool) while the actor decodes its next shard --> done

Why this shape: the driver's memory must not grow with the run (see the heap profile in the issue), so the
number of shards alive is bounded (flows.inflight), Arrow runs only on the fixed I/O threads (flows.io_pool), and
a finished shard leaves nothing behind but its marker in storage and one byte in `done`.

All Ray results arrive as events on one queue (`ObjectRef.future()` callbacks), so the dispatch thread never
blocks on one actor; they are typed (flows.events) and told apart in one `match`, `Dispatcher._handle`. Apart:
`depth` and cost slicing (flows.scheduling), deaths and restarts (flows.actor_health), commits (flows.commit).
"""

from __future__ import annotations

import queue
import threading

from ssdgen.inputs.shards import Shard
from ssdgen.output.layout import Output
from ssdgen.output.lease import LeaseLost
from ssdgen.output.marker import Marker
from .actor_health import Health, is_death
from .commit import Commit
from .events import Abort, Admit, Batch, Probe, Read, Stop, Written
from .io_pool import IOPool
from .scheduling import Scheduler
from .ticket import Ticket
from .inflight import Inflight, Job


class Dispatcher:
    """Run shards on `actors` with at most `capacity` shards in flight. `submit` blocks while that many are;
    `done[i]` is set when shard i commits. Start with `start()`, end with `close()`. Public methods are called
    from other threads (group tasks, the flow, a signal handler), private ones run on the dispatch thread."""

    def __init__(self, cfg, files, out: Output, actors: list, done: bytearray, log, restart_wait_s: float,
                 bar=None, decoder: str | None = None, guard=None, planning_s: float = 0.0):
        """decoder: the run's resolved spec text (flows.pipeline), which every batch's results must report. guard:
        called before every commit; it raises when the run may no longer commit (its lease was taken over,
        output.lease). planning_s: a calibration actor's seconds, charged with the first commit."""
        self.cfg, self.done, self.bar = cfg, done, bar
        self.events: queue.Queue = queue.Queue()
        self.sched = Scheduler(actors, cfg, self.events.put)
        self.depth = self.sched.depth
        self.io_threads = min(8, max(2, len(actors)))
        self.capacity = len(actors) * (self.depth + 1) + self.io_threads  # decoding + read ahead + writing
        self.inflight = Inflight(self.capacity, self.events.put, log)
        self.health = Health(restart_wait_s, log, self.events.put, self.sched.send, self.inflight.finish)
        commit = Commit(cfg, out, decoder or str(cfg.decoder), guard, lambda: self.inflight.aborted, planning_s)
        self.io = IOPool(cfg, files, self.io_threads, self.events.put, commit.write)
        self.commits = self.images = 0
        # rows whose batches came back decoded, and rows of shards that committed (ours, or another attempt's): the
        # difference is what an interrupt or a failed shard throws away, decoded again on resume
        self.decoded = self.settled = 0
        # driver seconds from a shard's last batch coming back to its commit being visible: count, sum, max
        self.write_n, self.write_total, self.write_max = 0, 0.0, 0.0
        self.thread = threading.Thread(target=self._loop, name="ssdgen-dispatch", daemon=True)

    @property
    def aborted(self) -> BaseException | None:
        """What the run aborted with (an interrupt, a bug in the dispatch thread, the close), or None."""
        return self.inflight.aborted

    def start(self) -> "Dispatcher":
        self.thread.start()
        return self

    def submit(self, shard: Shard, ticket: Ticket) -> None:
        """Hand a shard to the dispatcher; blocks while `capacity` shards are alive. Raises if the run aborted."""
        self.inflight.enter(shard, ticket)

    def interrupt(self, exc: BaseException) -> None:
        """Stop now (Ctrl-C, SIGTERM): every shard alive ends with `exc`, uncommitted; safe from a signal
        handler (it only queues an event)."""
        self.events.put(Abort(exc))

    @property
    def uncommitted(self) -> int:
        """Images decoded this run whose shard did not commit (an interrupt, a failed write): the next run decodes
        them again. Read after `close`, or as a snapshot."""
        return self.decoded - self.settled

    def close(self) -> None:
        self.inflight.close()
        self.thread.join()
        self.io.shutdown()

    def _loop(self) -> None:
        while True:
            try:
                ev = self.events.get(timeout=self.health.next_wait())
            except queue.Empty:
                ev = None  # a restart probe is due
            if isinstance(ev, Stop):  # outside the handlers' `try`: the thread ends even if a handler keeps failing
                self._abort(RuntimeError("the dispatcher was closed with shards in flight"), quiet=True)
                return
            try:
                self._handle(ev)
                self.health.tick()
                if self.inflight.aborted is None:
                    self.sched.dispatch(self.health.restarting)
            except Exception as e:  # noqa: BLE001 - a bug here must fail the run, not hang it
                self._abort(e)

    def _handle(self, ev) -> None:
        match ev:
            case None:
                pass  # no event: only the probe timers (`health.tick`) are due
            case Admit(shard, ticket):
                if (job := self.inflight.admit(shard, ticket)) is not None:  # None: the run aborted meanwhile
                    self.io.read(job)
            case Read(job) | Written(job) if job.finished:
                pass  # the shard ended meanwhile (an abort, a failed batch): its late I/O changes nothing
            case Written(job, fut) if isinstance(fut.exception(), LeaseLost):
                self._abort(fut.exception(), quiet=True)  # another driver holds the output: no shard may commit
            case Read(job, fut) | Written(job, fut) if fut.exception() is not None:
                self.inflight.finish(job, exc=fut.exception())
            case Read(job, fut):
                self._on_read(job, *fut.result())
            case Batch(job, i, gen, fut):
                self._on_batch(job, i, gen, fut)
            case Probe(actor, fut, _):
                self.health.answered(actor, fut)
            case Written(job, fut):
                self._on_written(job, *fut.result())
            case Abort(exc):
                self._abort(exc, quiet=True)
            case _:
                raise TypeError(f"the dispatcher got an unknown event: {ev!r}")

    def _on_read(self, job: Job, rows: list[dict], kept) -> None:
        job.split(rows, self.cfg.batch_size)
        job.kept = kept
        self.sched.ready.append(job)

    def _on_batch(self, job: Job, i: int, gen: int, fut) -> None:
        now = self.sched.charge(job)
        if job.finished or gen != job.gen:
            return
        job.refs.pop(i, None)
        if (exc := fut.exception()) is not None:
            return self.health.death(job, exc) if is_death(exc) else self.inflight.finish(job, exc=exc)
        self.decoded += len(job.batches[i])
        if self.bar is not None:
            self.bar.update(len(job.batches[i]))
        if job.take(i, fut.result()):
            job.actor.jobs.remove(job)  # the actor has room again: the next ready shard goes to it now
            self.io.write(job, now)

    def _on_written(self, job: Job, marker: Marker | None, write_s: float) -> None:
        self.done[job.shard.id] = 1  # ours, or another attempt's that won the commit
        self.settled += len(job.rows)
        if marker is not None:
            self.commits += 1
            self.images += marker.ok
            self.write_n += 1
            self.write_total += write_s
            self.write_max = max(self.write_max, write_s)
        self.inflight.finish(job, images=marker.ok if marker else None)

    def _abort(self, exc: BaseException, quiet: bool = False) -> None:
        self.inflight.abort(exc, quiet)
        self.sched.ready.clear()
