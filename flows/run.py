"""A run from start to summary, as `ssdgen generate` and `ssdgen.generate` start it: every check before
Prefect or Ray start (flows.prepare), an end at once when nothing is left to do and the manifest and summary
name every commit, else the flow (which decodes what is pending and rebuilds both, output.converge)."""

from __future__ import annotations

import contextlib
import os
import time
from datetime import datetime, timezone
from typing import Callable

from ssdgen.output.folder import size as output_size

from .prepare import prepare
from .settings import RunSettings


def run(cfg: RunSettings, overwrite: bool = False, progress: bool = True,
        say: Callable[[str], None] = lambda line: None, around=contextlib.nullcontext,
        started: float | None = None) -> dict:
    """The run's summary (summary.json's content, with `shards_run_now`). `say`: where the lines a user reads
    before the flow's own output go (what --overwrite deletes, "nothing to do"). `around`: a context the flow
    runs in, entered only when there is something to run (the CLI's console handling, Prefect's temporary
    server). `started`: when the command began (a Unix time: the CLI's process, else this call): the summary's
    end-to-end figures count from it; summary.json's to its own write, the one returned to this call's end."""
    started = time.time() if started is None else started
    from ssdgen.output.layout import SUMMARY
    cfg = cfg.dated(datetime.now(timezone.utc))  # `{date}`: today's (a scheduled run's flow fills its own)
    prep = prepare(cfg, overwrite)
    if overwrite and (found := output_size(prep.out))[0]:
        say(f"--overwrite: deleting the run at {prep.out.url} ({found[0]} files, {found[1] / 2**20:.1f} MiB) "
            "before starting")
    elif not overwrite and not prep.pending and prep.stale is None:
        say(f"nothing to do: all {len(prep.shards)} shards of {prep.out.url} are committed and their files check out "
            "(ssdgen verify reads them all back)")
        recorded = prep.out.read_summary()
        if recorded is not None:
            say("the run's recorded totals (summary.json, unchanged):")
            return recorded | {"shards_run_now": 0, "summary": prep.out.full_url(prep.out.path(SUMMARY))}
        return {"shards_run_now": 0, "shards_committed": len(prep.shards), "shards_total": len(prep.shards)}
    elif not overwrite and not prep.pending:  # the flow rebuilds them from the markers, under the lease
        say(f"nothing to decode, but {prep.stale}: rebuilding manifest.parquet and summary.json")
    with around() as server:
        summary = _flow(cfg, progress, overwrite, server, since=started)
    return _to_the_end(summary, started)


def _to_the_end(summary: dict, started: float) -> dict:
    """The summary with its end-to-end figures counted to now: after the flow, the local Ray and Prefect's
    temporary server stopped (seconds on a small run), which summary.json, written inside the flow, cannot count."""
    if "wall_s_end_to_end" not in summary or summary.get("nothing_to_do"):  # older, or another run's figures
        return summary
    took = time.time() - started
    return summary | {"wall_s_end_to_end": took, "images_per_s_end_to_end": summary["images_this_run"] / took}


def _flow(cfg: RunSettings, progress: bool, overwrite: bool, server, since: float) -> dict:
    """The flow, under the Prefect API `server` gives (`server.api()`: a temporary server starting, from the
    CLI's `around`; None: Prefect's own settings). While a temporary server starts, a run that would start a
    local Ray starts it meanwhile: each takes seconds (#36); the flow then finds Ray running, and Ray is stopped
    here after it. A signal meanwhile stops the start as one inside the flow would (flows.interrupts). `since`:
    the command's start, handed to the flow for its end-to-end figures."""
    from . import cluster
    from .interrupts import Interrupted, StopSignals
    from .pipeline import generate as flow
    local = server is not None and not (cfg.ray_address or os.environ.get("RAY_ADDRESS") or cfg.cluster_limit)
    started = False
    stop = StopSignals(lambda: "interrupted before any shard ran; run the same command to resume")
    try:
        with stop:
            started = local and cluster.start(None)
            stop.check()
            if server is not None:
                server.wait(stop.check)
        with server.api() if server is not None else contextlib.nullcontext():
            return flow(cfg, progress=progress, overwrite=overwrite, started=since)
    except Interrupted as e:  # from here on a signal is a second one: it ends everything at once, with this line
        line = str(e)
        stop.line, stop.signum = (lambda: line), e.signum
        raise
    finally:
        if started:
            with stop:  # shutting the local Ray down takes seconds: a signal meanwhile is handled, never a bare
                cluster.stop([], started)  # KeyboardInterrupt that would hide the run's line
