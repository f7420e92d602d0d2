"""Shard groups: what the Prefect API sees of a run. Consecutive pending shards are grouped into one task run
each (`shards-{first}-{last}`), about TARGET_TASK_RUNS of them per run whatever its size, and submitted as a
bounded stream: only a few group task runs exist at a time, so a run of millions of prompts neither floods the
API with task runs nor holds their futures and states in the driver.

A group task hands its shards to the dispatcher's window (flows.dispatch) and waits for them. Retries stay
meaningful: a group retries with exponential backoff and jitter on transient errors (storage I/O, dead
actors) and then runs only its shards that did not commit; configuration, schema and input errors fail the
group at once. Progress: a Prefect progress artifact and one log line per finished group.
"""

from __future__ import annotations

import math
import time
from collections import deque

from prefect import get_run_logger, task
from prefect.artifacts import create_progress_artifact, update_progress_artifact
from prefect.cache_policies import NO_CACHE
from prefect.tasks import exponential_backoff

from ssdgen.inputs.shards import Shards
from .dispatch import Dispatcher
from .interrupts import Interrupted
from .ticket import Ticket, is_transient

TARGET_TASK_RUNS = 100  # group task runs per run: enough to follow progress and retry in parts, few for the API


def retry_transient(task, task_run, state) -> bool:
    exc = state.data if isinstance(state.data, BaseException) else state.result(raise_on_failure=False)
    return isinstance(exc, BaseException) and is_transient(exc)


class RunContext:
    """What every group task shares. A plain class: Prefect passes it through without hashing or walking it."""

    def __init__(self, shards: Shards, done: bytearray, dispatcher: Dispatcher):
        self.shards, self.done, self.dispatcher = shards, done, dispatcher


@task(name="shards", task_run_name="shards-{first}-{last}", retries=4, retry_delay_seconds=exponential_backoff(0.5),
      retry_jitter_factor=0.5, retry_condition_fn=retry_transient, cache_policy=NO_CACHE)
def run_shards(first: int, last: int, ctx: RunContext) -> dict:
    """Shards first..last that are not committed yet (a retry skips what the failed try committed)."""
    ticket = Ticket()
    try:
        for i in range(first, last + 1):
            if not ctx.done[i]:
                ctx.dispatcher.submit(ctx.shards[i], ticket)  # blocks while the dispatcher is full
    finally:
        ticket.wait()  # raises the worst error of the group's shards
    return {"first": first, "last": last, "committed": ticket.committed, "images": ticket.images}


def group_ranges(done: bytearray, size: int):
    """(first, last) shard ids of consecutive groups holding `size` pending shards each (the last fewer). Lazy:
    only shards of groups already yielded can commit meanwhile, and those lie behind the scan."""
    first = last = None
    count = 0
    for i, d in enumerate(done):
        if d:
            continue
        first = i if first is None else first
        last, count = i, count + 1
        if count == size:
            yield first, last
            first, count = None, 0
    if first is not None:
        yield first, last


def run_groups(ctx: RunContext, pending: int, total: int) -> dict[tuple[int, int], str]:
    """Every pending shard through group task runs, a few in flight at a time. Returns the failed groups'
    (first, last) -> error."""
    log = get_run_logger()
    size = max(1, math.ceil(pending / TARGET_TASK_RUNS))
    # enough groups in flight that their shards fill the window, plus one so it never drains between groups
    in_flight = max(2, math.ceil(ctx.dispatcher.capacity / size) + 1)
    log.info(f"{pending} shard(s) in task runs of {size} (at most {in_flight} at a time); window of "
             f"{ctx.dispatcher.capacity} shards, {ctx.dispatcher.depth} per actor")
    progress = Progress(ctx, total, pending)
    failed: dict[tuple[int, int], str] = {}
    futures: deque = deque()
    for first, last in group_ranges(ctx.done, size):
        if ctx.dispatcher.aborted is not None:  # interrupted or broken: no more task runs for shards that cannot run
            break
        futures.append((first, last, run_shards.submit(first, last, ctx)))
        if len(futures) >= in_flight:
            _collect(*futures.popleft(), failed, progress)
    while futures:
        _collect(*futures.popleft(), failed, progress)
    return failed


def _collect(first: int, last: int, future, failed: dict, progress: "Progress") -> None:
    try:
        future.result()
    except Interrupted:
        pass  # not failed: pending, and the run's own line says it was interrupted (flows.interrupts)
    except Exception as e:  # noqa: BLE001 - collect, report, and fail the run after the summary
        failed[(first, last)] = f"{type(e).__name__}: {e}"
    progress.update(first, last)


class Progress:
    """One log line per finished group and the Prefect UI's progress bar (a progress artifact), from counters
    only: nothing per shard is kept."""

    def __init__(self, ctx: RunContext, total: int, pending: int):
        self.ctx, self.total, self.pending = ctx, total, pending
        self.t0 = time.perf_counter()
        self.before = total - pending
        self.artifact = create_progress_artifact(progress=self._percent(), key=None,
                                                 description="shards committed")

    def _percent(self) -> float:
        return 100.0 * (self.before + self.ctx.dispatcher.commits) / max(1, self.total)

    def update(self, first: int, last: int) -> None:
        d = self.ctx.dispatcher
        el = time.perf_counter() - self.t0
        get_run_logger().info(f"shards {first}-{last} done: {self.before + d.commits}/{self.total} committed, "
                              f"{d.images} images this run, {d.images / el if el > 0 else 0:.1f} images/s")
        if self.artifact is not None:
            update_progress_artifact(artifact_id=self.artifact, progress=self._percent())
