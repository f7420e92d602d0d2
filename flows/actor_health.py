"""Actor health: deaths, restart probes with their timers, the deadline and the give-up.

Actor deaths: Ray restarts the actor (max_restarts=-1); the shards it held wait for the restart, probed with
`info()` every second for up to `restart_wait_s`, and only their missing batches are resubmitted, to the new
incarnation. A shard that sees more than MAX_ACTOR_DEATHS_PER_TRY deaths fails (transient: its group retries).
An actor not back by its deadline fails the shards waiting for it (transient too); the deadline is checked on
every tick, not only when a probe answers, because a probe can hang while the restart waits for resources.
Kept apart from the window (flows.dispatch) so that the restart state, and the timers only it needs, live in
one place; the window asks only whether an actor is restarting and when a probe is next due.
"""

from __future__ import annotations

import heapq
import itertools
import time

from .events import Probe

MAX_ACTOR_DEATHS_PER_TRY = 3


def is_death(exc: BaseException) -> bool:
    """The actor died or cannot be reached (Ray restarts it), as opposed to an error raised inside it."""
    import ray.exceptions as rx
    return isinstance(exc, (rx.RayActorError, rx.ActorUnavailableError))


class _Restart:
    """An actor being restarted: when to give up on it, and the shards waiting for it."""

    def __init__(self, deadline: float):
        self.deadline = deadline
        self.waiting: list = []  # flows.inflight.Job


class Health:
    """The actors being restarted and their probe timers; the dispatch thread owns it. `post` queues an event,
    `send(job, batches)` resubmits batches (flows.scheduling), `finish(job, exc=)` fails a shard (flows.inflight)."""

    def __init__(self, restart_wait_s: float, log, post, send, finish):
        self.restart_wait_s, self.log = restart_wait_s, log
        self.post, self.send, self.finish = post, send, finish
        self.restarts: dict = {}  # flows.scheduling.Actor -> _Restart
        self.timers: list = []  # heap of (when, seq, actor): restart probes
        self.seq = itertools.count()

    def restarting(self, actor) -> bool:
        return actor in self.restarts

    def next_wait(self) -> float:
        """How long the dispatch thread may wait for an event before a probe is due."""
        return max(0.0, self.timers[0][0] - time.monotonic()) if self.timers else 1.0

    def death(self, job, exc: BaseException) -> None:
        """A batch of `job` failed because its actor died: the shard waits for the restart, or fails."""
        restart = self.restarts.get(job.actor)
        if restart is not None and job in restart.waiting:
            return  # the same death, seen through another of this shard's batches
        job.deaths += 1
        if job.deaths > MAX_ACTOR_DEATHS_PER_TRY:
            return self.finish(job, exc=exc)
        self.log.warning(f"shard {job.shard.id}: actor died ({type(exc).__name__}); waiting for its restart to "
                         f"resubmit {len(job.missing())} batch(es)")
        if restart is None:  # the first of its shards to see this death: start waiting for the restart
            restart = self.restarts[job.actor] = _Restart(time.monotonic() + self.restart_wait_s)
            self._probe(job.actor)  # it only queues the probe: its answer is handled after this append
        restart.waiting.append(job)

    def answered(self, actor, fut) -> None:
        """A probe of `actor` came back (the `Probe` event): resubmit, probe again in a second, or give up."""
        restart = self.restarts.get(actor)
        if restart is None:
            return
        if fut.exception() is None:  # the restarted actor answers: resubmit what its shards still miss
            del self.restarts[actor]
            for job in restart.waiting:
                if not job.finished:
                    job.gen += 1
                    job.refs.clear()
                    self.send(job, job.missing())
        elif time.monotonic() < restart.deadline:
            heapq.heappush(self.timers, (time.monotonic() + 1.0, next(self.seq), actor))
        else:
            self._give_up(actor, fut.exception())

    def tick(self) -> None:
        """Send the probes that are due, and give up on the actors past their deadline."""
        now = time.monotonic()
        while self.timers and self.timers[0][0] <= now:
            _, _, actor = heapq.heappop(self.timers)
            if actor in self.restarts:
                self._probe(actor)
        for actor, restart in list(self.restarts.items()):  # a probe can hang while the restart waits for
            if now > restart.deadline:  # resources: the deadline holds
                import ray.exceptions as rx
                self._give_up(actor, rx.GetTimeoutError(f"actor not back after {self.restart_wait_s:.0f} s"))

    def _probe(self, actor) -> None:
        ref = actor.handle.info.remote()
        ref.future().add_done_callback(lambda f: self.post(Probe(actor, f, ref)))

    def _give_up(self, actor, exc: BaseException) -> None:
        """The actor did not come back in time: its shards fail (transient: their groups retry them)."""
        for job in self.restarts.pop(actor).waiting:
            if not job.finished:
                self.finish(job, exc=exc)
