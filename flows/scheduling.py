"""Scheduling shards onto actors, and the cost slicing of the actors' time.

Each actor holds up to `depth` shards: the next shard's batches are already queued on the actor when the
previous one's last batch returns, so the actor never waits for the driver to write. A ready shard goes to
the actor with the fewest shards, all its batches at once (Ray queues them in order); an actor that is being
restarted (flows.actor_health) gets none until it answers again.

Cost: an actor's time is cut at each batch completion and charged to the shard whose batch finished, from the
actor's previous completion (or from when it was given work after being idle). The slices partition the time
each actor had work, so summed shard `wall_s` is the actors' allocated time, not a multiple of it (shards in
flight together on one actor would otherwise each count the same seconds).
"""

from __future__ import annotations

import math
import time
from collections import deque
from datetime import datetime, timezone

from .events import Batch


class Actor:
    """One actor as the window sees it: the shards decoding on it, its batches out, where its time is charged."""

    def __init__(self, handle):
        self.handle = handle
        self.jobs: list = []  # shards decoding here (flows.inflight.Job)
        self.inflight = 0  # batches submitted and not yet back
        self.mark = 0.0  # perf_counter up to which this actor's time has been charged


class Scheduler:
    """The shards read and waiting for an actor (`ready`), and the actors; the dispatch thread owns it. `post`
    queues an event for the dispatch thread."""

    def __init__(self, handles: list, cfg, post):
        self.actors = [Actor(h) for h in handles]
        per_shard = math.ceil(cfg.shard_size / cfg.batch_size)
        # batches queued per actor: at least 3 (one running, two waiting), and at least 2 shards
        self.depth = max(2, math.ceil(3 / per_shard))
        self.ready: deque = deque()
        self.post = post

    def dispatch(self, restarting) -> None:
        """Give ready shards to the actors with the fewest shards, up to `depth` each, skipping the actors for
        which `restarting(actor)`."""
        while self.ready:
            free = [a for a in self.actors if not restarting(a) and len(a.jobs) < self.depth]
            if not free:
                return
            actor = min(free, key=lambda a: len(a.jobs))
            job = self.ready.popleft()
            job.actor = actor
            job.started_at = datetime.now(timezone.utc).isoformat()
            actor.jobs.append(job)
            self.send(job, range(len(job.batches)))

    def send(self, job, which) -> None:
        """Queue the batches `which` of `job` on its actor; each comes back as a `Batch` event."""
        actor = job.actor
        if actor.inflight == 0:
            actor.mark = time.perf_counter()  # the actor was idle until now: that gap is no shard's
        for i in which:
            ref = actor.handle.__call__.remote(job.batches[i])  # the actor decodes by the spec it was built with
            job.refs[i] = ref
            actor.inflight += 1
            ref.future().add_done_callback(lambda f, i=i, g=job.gen: self.post(Batch(job, i, g, f)))

    @staticmethod
    def charge(job) -> float:
        """A batch of `job` came back, decoded or not, current or stale: cut its actor's time here. Returns the
        cut (a perf_counter)."""
        actor, now = job.actor, time.perf_counter()
        actor.inflight -= 1
        job.alloc_s += now - actor.mark  # the actor's time since its previous batch came back is this batch's
        actor.mark = now
        return now
