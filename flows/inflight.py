"""The shards in flight: their bound and the shards alive. At most `capacity` shards are alive at once: `submit` waits
for a slot (a semaphore), and a shard gives its slot back when it is done, committed or failed, leaving nothing
behind but its marker in storage and one byte in `done`; so the driver's memory stays flat however long the
run. An abort (Ctrl-C, SIGTERM, a bug in the dispatch thread) ends every shard alive with one error, as a
crashed driver would: nothing more commits, and no shard is admitted after it or after `close`.
Kept apart from flows.dispatch, which moves a shard along (read, decode, write); this part only says which
shards are alive and how each one ends."""

from __future__ import annotations

import threading

from ssdgen.inputs.shards import Shard
from .events import Admit, Stop
from .ticket import Ticket


class Job:
    """One shard in flight; the dispatch thread owns it. Dropped (and its rows and images with it) when
    the shard is done."""

    def __init__(self, shard: Shard, ticket: Ticket):
        self.shard, self.ticket = shard, ticket
        self.rows: list[dict] = []
        self.kept = None  # the input columns the run carries through, a row per row (a pyarrow.Table)
        self.batches: list[list[dict]] = []
        self.results: list = []  # a workers.results.BatchResult per batch, None until it is back
        self.refs: dict[int, object] = {}  # batch -> its ObjectRef, kept alive until its event is handled
        self.actor = None  # the flows.scheduling.Actor it was given to
        self.gen = self.deaths = 0  # gen: bumped on each resubmission; late events of an older one are ignored
        self.finished = False
        self.alloc_s = self.busy_s = self.load_s = 0.0
        self.started_at: str | None = None
        self.where: dict = {}

    def split(self, rows: list[dict], batch_size: int) -> None:
        """The shard's rows, read: cut into batches, none decoded yet."""
        self.rows = rows
        self.batches = [rows[i:i + batch_size] for i in range(0, len(rows), batch_size)]
        self.results = [None] * len(self.batches)

    def take(self, i: int, r) -> bool:
        """Batch i came back decoded (a BatchResult); True when it was the shard's last one missing."""
        self.results[i] = r
        self.busy_s += r.busy_s
        self.load_s += r.load_s
        self.where = r.worker or self.where
        return all(x is not None for x in self.results)

    def missing(self) -> list[int]:
        """The batches not back yet."""
        return [i for i, r in enumerate(self.results) if r is None]


class Inflight:
    """The slots, the shards alive and the abort. `enter` and `close` run on other threads (group tasks, the
    flow); everything else on the dispatch thread. `post` queues an event for the dispatch thread."""

    def __init__(self, capacity: int, post, log):
        self.post, self.log = post, log
        self.slots = threading.Semaphore(capacity)
        self.live: set[Job] = set()
        self.aborted: BaseException | None = None
        self.closed = False
        self.close_lock = threading.Lock()  # an admit is queued before the stop, or refused: never lost after it

    def enter(self, shard: Shard, ticket: Ticket) -> None:
        """Queue the shard's admission once a slot is free. Raises if the run aborted or the dispatcher closed."""
        while not self.slots.acquire(timeout=0.5):
            if self.aborted is not None:
                raise self.aborted
        with self.close_lock:
            if self.aborted is not None or self.closed:
                self.slots.release()
                raise self.aborted or RuntimeError("the dispatcher is closed")
            ticket.add()
            self.post(Admit(shard, ticket))

    def close(self) -> None:
        """Refuse admissions from now on; the stop is queued after every admission already queued."""
        with self.close_lock:
            self.closed = True
            self.post(Stop())

    def admit(self, shard: Shard, ticket: Ticket) -> Job | None:
        """An admitted shard's job, or None when the run aborted meanwhile (the shard has then ended with it)."""
        job = Job(shard, ticket)
        self.live.add(job)
        if self.aborted is not None:
            self.finish(job, exc=self.aborted)
            return None
        return job

    def finish(self, job: Job, images: int | None = None, exc: BaseException | None = None) -> None:
        """The shard is done: failed with `exc`, committed `images` (None: another attempt's commit won), and its
        slot is free. Once only: late events of a finished shard change nothing."""
        if job.finished:
            return
        job.finished = True
        if job.actor is not None and job in job.actor.jobs:
            job.actor.jobs.remove(job)
        job.rows = job.batches = job.results = []
        job.refs, job.kept = {}, None
        self.live.discard(job)
        self.slots.release()
        job.ticket.done(images, exc)

    def abort(self, exc: BaseException, quiet: bool = False) -> None:
        """Stop the run as a crashed driver would: nothing more commits; every shard alive ends with `exc`."""
        if self.aborted is None:
            self.aborted = exc
            if not quiet:
                self.log.error(f"dispatcher: {type(exc).__name__}: {exc}")
        for job in list(self.live):
            self.finish(job, exc=self.aborted)
