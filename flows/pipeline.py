"""The generation flow: Parquet prompts on any fsspec URL -> images and per-sample statistics as committed
Parquet shards (and/or WebDataset tars: formats/), on a pool of Ray actors, driven by Prefect.

    shards (metadata only) -> skip committed shards -> groups of shards as Prefect tasks with retries, a few at
    a time (flows.groups) -> a bounded window of shards over the actors (flows.dispatch): read its rows ->
    decode batches on an actor -> write images/stats under an attempt key -> commit marker
    -> gc unmarked attempts -> manifest + summary (cost, audit), streamed from the markers -> Prefect artifacts

Memory stays flat in the number of shards and prompts: shards exist only while in the window, a committed
shard is one byte in `done` and its marker in storage, and the summary and manifest stream the markers back.

Why Ray Core actors and not Ray Data: exactly-once output needs a unit of commit we control. A shard is read,
decoded, written under an attempt-unique key and committed by a create-only marker; Ray Data's writers name
files by a per-execution UUID (re-runs duplicate output in APPEND mode) and drop failed blocks rather than
retry them when errors are tolerated. With actors we keep Ray's part (placement by num_cpus/num_gpus, restarts
of dead actors, the object store) and do the commit ourselves. Inside a shard, batches already decoded survive
an actor crash: only the batches the dead actor held are resubmitted (to its restarted incarnation).

Retries: a group task retries with exponential backoff and jitter only on transient errors (storage I/O,
dead actors), and then runs only its uncommitted shards; configuration, schema and input errors fail at once.
A failed write is first retried in place (flows.commit). Per-sample failures are error rows.
Settings that change the images (model, decoder, sampling, seed, batch size, input files, shard size, image
format and quality, output format) are recorded in `_config.json`; a resume with other settings is refused.
A device-calibrated decoder (`calibrated=true`, ssd+csd's default) has its rows decided once, by one actor before
the first shard, and recorded in `_plan.json`: every actor, retry and resume decodes by that plan.

`--audit FRACTION` (output/audit.py) also scores a deterministic sample of the prompts against an `ar` sample
under the target; its rows are committed with their shard, and its cost is a line of its own.
"""

# no `from __future__ import annotations` here: Prefect builds the flow's parameter model from the signature's
# real types (a string `RunSettings` cannot be resolved where a served or deployed run validates it)
import contextlib
import logging
import os
import time
from collections import Counter
from contextlib import ExitStack, contextmanager
from dataclasses import asdict
from datetime import datetime, timezone

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from tqdm import tqdm

from ssdgen.decoders.recipes import pilot_rows
from ssdgen.decoders.spec import DecodeSpec
from ssdgen.inputs.files import InputError, InputFile
from ssdgen.inputs.growth import digests_for
from ssdgen.inputs.shards import Shards, read_shard
from ssdgen.output.audit import audit_rows
from ssdgen.output.audit import summarize as audit_summary, warning as audit_warning
from ssdgen.output.cost import Price, cost_table
from ssdgen.output.folder import clear, size as output_size
from ssdgen.output.layout import PLAN, ROW_DIGESTS, SUMMARY, Output, plan_words
from ssdgen.output.lease import LEASE_DIR, Lease
from ssdgen.output.reader import read_plan_at
from ssdgen.output.summary import committed_totals, this_run, unlisted_line, write_summary
from ssdgen.output.damage import set_aside
from ssdgen.workers.cpus import ThreadPolicy
from . import cluster, machine_record
from .dispatch import Dispatcher
from .groups import RunContext, run_groups
from .interrupts import Interrupted, StopSignals
from .prepare import Prepared, check_output, describe, prepare
from .settings import DEFAULT_BATCH, RunSettings

# How long a shard waits for its actor's restart. After a node loss the restart waits for free resources: an
# autoscaler's new GPU node takes minutes, and until then every call to the actor fails at once.
ACTOR_RESTART_WAIT_S = float(os.environ.get("SSDGEN_ACTOR_RESTART_WAIT_S", 900))


class ShardsFailed(RuntimeError):
    """The run ended with shards not committed; the message names the first's cause and that a rerun resumes."""


@contextmanager
def _cluster_slots(cfg: RunSettings):
    """Hold `cfg.cluster_slots` slots of the Prefect global concurrency limit `cfg.cluster_limit` while the run
    has actors, so runs that share a cluster (scheduled, ad hoc, other deployments) queue instead of overbooking
    it. Waits for free slots; a limit that does not exist is an error (strict), not a silently uncapped run."""
    if not cfg.cluster_limit:
        yield
        return
    from prefect.concurrency._asyncio import ConcurrencySlotAcquisitionError
    from prefect.concurrency.sync import concurrency
    get_run_logger().info(f"waiting for {cfg.cluster_slots} slot(s) of concurrency limit {cfg.cluster_limit!r}")
    with ExitStack() as held:
        try:  # only the acquisition's own error is re-worded: a limit never created is a user's typo
            held.enter_context(concurrency(cfg.cluster_limit, occupy=cfg.cluster_slots, strict=True))
        except ConcurrencySlotAcquisitionError as e:
            raise ValueError(f"--cluster-limit {cfg.cluster_limit!r}: {e}; create it first (prefect gcl create "
                             f"{cfg.cluster_limit} --limit N)") from None
        yield


def _decode_plan(cfg: RunSettings, files: list[InputFile], shards: Shards, out: Output, log,
                 stop: StopSignals) -> tuple[DecodeSpec | None, int, float]:
    """(the concrete spec a calibrated request resolves to, else None: the request decodes as it is; the batch
    size; the seconds a calibration actor took, charged with the first commit), decided once per run before the
    actors exist, so every actor, restarted ones and retries, is built with it: the recorded plan on a resume;
    another run's plan with `--plan`; else planned for the objective by one short-lived actor on the first
    shard's first prompts (decoders/planner.py), which also chooses the batch size unless the user set one. A new
    plan is recorded (`_plan.json`: the text and its measurements) before any shard decodes."""
    if not cfg.decoder.calibrated:
        return None, cfg.fixed_batch, 0.0
    if (recorded := out.read_plan()) is not None:
        spec = _recorded_spec(out, recorded)  # a damaged record fails here, before any shard decodes
        log.info(f"decode plan: {spec} (recorded)")
        return spec, _plan_batch(cfg, recorded), 0.0
    if cfg.plan is not None:
        decided = read_plan_at(cfg.plan)
        spec = _recorded_spec(out, decided, f"--plan {cfg.plan}")
        out.write_plan(decided)
        log.info(f"decode plan: {spec} (replayed from {cfg.plan})")
        return spec, _plan_batch(cfg, decided), 0.0
    pilot = pilot_rows(cfg.batch_size)  # what Decoder.resolve plans on, with room for invalid prompts
    rows = [asdict(r) for r in read_shard(files, shards[0], cfg.seed)][:pilot]
    # a batch holds at most a shard's rows, and the job's (a 40-prompt job never plans batch 128); the memory is
    # shared by all the run's actors (on one machine in a local run, a safe bound on a cluster)
    most = min(cfg.shard_size, shards.rows)
    decided, seconds = _calibrate(cfg, rows, most, stop)
    out.write_plan(decided)
    m = decided["measurements"]
    log.info(f"decode plan ({m['objective']}): {m['why']}; {decided['spec']}, planned in {m['seconds']:.1f} s"
             + (" (device profile from the cache)" if m.get("cached") else ""))
    return _recorded_spec(out, decided), _plan_batch(cfg, decided), seconds


def _calibrate(cfg: RunSettings, rows: list[dict], most: int, stop: StopSignals) -> tuple[dict, float]:
    """The plan, made by one actor of the pool's shape built with the request, removed once it answers ->
    (what `_plan.json` records, the actor's seconds: its model load and the planning)."""
    import ray
    from ssdgen.workers.decode_worker import DecodeWorker
    actor = ray.remote(DecodeWorker).options(num_cpus=cfg.cpus_per_actor, num_gpus=cfg.gpus_per_actor,
                                             max_restarts=0).remote(cfg.worker(), threads(cfg))
    try:
        decided = _get(actor.calibrate.remote(rows, cfg.batch_size, cfg.objective, most, cfg.actors), stop)
        return decided, _get(actor.take_load_seconds.remote(), stop)
    finally:
        ray.kill(actor)  # its CPUs or GPU go to the pool


@contextmanager
def _own_line(bar):
    """The progress bar on a line of its own: before Prefect's console prints a log line, the bar is cleared,
    so the line starts at the left edge, and the bar is drawn again below it at its next update."""
    from prefect.logging.handlers import PrefectConsoleHandler

    def clear_bar(record) -> bool:
        bar.clear()
        return True
    handlers = [h for name in ("", "prefect") for h in logging.getLogger(name).handlers
                if isinstance(h, PrefectConsoleHandler)]
    for h in handlers:
        h.addFilter(clear_bar)
    try:
        yield
    finally:
        for h in handlers:
            h.removeFilter(clear_bar)


def _plan_batch(cfg: RunSettings, decided: dict) -> int:
    """The batch size a plan decodes with: the user's, else the plan's (a plan recorded before plans chose the
    batch records none: the default)."""
    return cfg.batch_size or int((decided.get("measurements") or {}).get("batch") or DEFAULT_BATCH)


def _recorded_spec(out: Output, recorded: dict, where: str | None = None) -> DecodeSpec:
    """The concrete spec a plan records (its shape checked by Output.read_plan / read_plan_at); one line naming
    the file (or `where`) when the text is not a spec, or still a calibrated one."""
    where = where or out.full_url(out.path(PLAN))
    try:
        spec = DecodeSpec.parse(recorded["spec"])
    except ValueError as e:
        raise ValueError(f"{where}: not a resolved decode spec ({e!r}); delete it to resolve the decoder again, "
                         "or --overwrite the run") from None
    if spec.calibrated:
        raise ValueError(f"{where}: records {spec}, which is still calibrated; delete it to resolve the decoder "
                         "again")
    return spec


def _get(refs, stop: StopSignals | None):
    """ray.get that a Ctrl-C or SIGTERM stops within a quarter second (flows.interrupts)."""
    import ray
    from ray.exceptions import GetTimeoutError
    while True:
        if stop is not None:
            stop.check()
        try:
            return ray.get(refs, timeout=0.25)
        except GetTimeoutError:
            continue


def _pool_size(cfg: RunSettings, pending: int) -> int:
    """--actors, or as many as fit at once, and no more than the pending shards (an actor per shard at most: a
    small run does not load the model on actors that would get no shard). Checked before any actor is requested:
    one that fits no node would wait forever (flows/cluster.py)."""
    n = cluster.actors_to_start(cfg.cpus_per_actor, cfg.gpus_per_actor, cfg.actors)
    if pending < n:
        cluster.run_logger().info(f"--actors {cfg.actors}: {pending} shard(s) to run, so {pending} actor(s)")
        n = pending
    return n


def threads(cfg: RunSettings) -> ThreadPolicy:
    """An actor's torch threads: its CPUs, given up to other processes' load while it decodes, unless the
    user's environment (read here, in the driver: Ray sets OMP_NUM_THREADS in its workers) pins them."""
    return ThreadPolicy.from_env(cfg.threads)


def _actors(cfg: RunSettings, n: int, resolved: DecodeSpec | None, stop: StopSignals | None = None) -> list:
    """The run's n actors, loaded, each built with the run's decoder: the request and what it resolved to. Ray
    replays these arguments when it restarts an actor, so a restarted one decodes by the same spec."""
    import ray
    from ssdgen.workers.decode_worker import DecodeWorker
    cls = ray.remote(DecodeWorker).options(num_cpus=cfg.cpus_per_actor, num_gpus=cfg.gpus_per_actor,
                                           max_restarts=-1, max_task_retries=0)
    actors = [cls.remote(cfg.worker(), threads(cfg), resolved) for _ in range(n)]
    _get([a.info.remote() for a in actors], stop)  # wait for the loads; a config error surfaces here, once
    return actors


@flow(name="ssdgen-generate")
def generate(settings: RunSettings, progress: bool = True, overwrite: bool = False,
             started: float | None = None) -> dict:
    """Generate an image for every prompt row; resumable. `settings` are the run's (flows.settings.RunSettings:
    each field's description says what it does); a deployment passes them nested, as infra/prefect.yaml does.
    `settings.out` and `settings.prompts` may hold `{date}`, filled with the run's scheduled date (YYYY-MM-DD), so
    a scheduled deployment reads the day's prompts and renders into one folder per day. `overwrite` deletes what
    the output holds first (said in the log). `started`: when the command that called the flow began (a Unix
    time: flows/run.py), so the summary's end-to-end figures count from there; None: from the flow's start."""
    if "{date}" in settings.out or any("{date}" in p for p in settings.prompts):
        from prefect.runtime import flow_run
        settings = settings.dated(flow_run.scheduled_start_time or datetime.now(timezone.utc))
    return execute(settings, progress=progress, overwrite=overwrite, started=started)


def _run_pending(cfg: RunSettings, prep: Prepared, progress: bool, t0: float, lease, stop: StopSignals) -> dict:
    """Run the pending shards (done[i] == 0) on a pool of actors -> {failed shard -> error, startup seconds,
    images and commits this run, commit latency, the signal that interrupted it}. Ctrl-C and SIGTERM stop it
    as flows.interrupts says; the lease is checked before every commit."""
    log = get_run_logger()
    files, out, shards, done = prep.files, prep.out, prep.shards, prep.done
    pending = done.count(0)
    rows = prep.pending_rows
    disp = None
    with _cluster_slots(cfg):
        stop.check()
        started_ray = cluster.start(cfg.ray_address)
        stop.install()  # cluster.start keeps our SIGTERM handler through Ray's init; this covers any other way in
        actors = []
        try:
            n = _pool_size(cfg, pending)
            resolved, batch, planning_s = _decode_plan(cfg, files, shards, out, log, stop)
            cfg = cfg.model_copy(update={"batch_size": batch})  # what the dispatcher splits shards by
            actors = _actors(cfg, n, resolved, stop)
            load = _machine_load(actors, stop)
            startup_s = time.perf_counter() - t0
            log.info(f"{len(actors)} actor(s) ready {startup_s:.1f} s after the flow started")
            bar = tqdm(total=rows, unit="img", desc="generate", disable=not progress, smoothing=0.1)
            # the wait is read now, not at import: tests and operators may change it on the module
            disp = Dispatcher(cfg, files, out, actors, done, log, ACTOR_RESTART_WAIT_S, bar,
                              str(resolved or cfg.decoder), guard=lease.guard, planning_s=planning_s).start()
            stop.target = disp.interrupt  # from here a signal stops the window, not the main thread
            if isinstance(stop.line, _StatusLine):  # the line then says what decoded images a stop throws away
                stop.line.uncommitted = lambda: disp.uncommitted
            with _own_line(bar), load:
                failed_groups = run_groups(RunContext(shards, done, disp), pending, len(shards))
            bar.close()
        finally:
            stop.target = lambda exc: None  # a first signal during the clean-up must not cut it short
            if disp is not None:
                disp.close()
            cluster.stop(actors, started_ray)
    failed = {i: msg for (first, last), msg in failed_groups.items() for i in range(first, last + 1) if not done[i]}
    return {"failed": failed, "startup_s": startup_s, "images": disp.images, "commits": disp.commits,
            "batch_size": cfg.batch_size,
            "commit_latency_s": {"mean": disp.write_total / disp.write_n if disp.write_n else None,
                                 "max": disp.write_max if disp.write_n else None},
            "interrupted": stop.interrupted, "machine_load": _load_report(load, log)}


def _machine_load(actors: list, stop: StopSignals):
    """What watches other processes' CPU while the pool decodes (workers/cpus.py RunLoad): on this machine,
    where at least one actor runs; a no-op context otherwise (a cluster's nodes are not seen from here)."""
    import ray
    from ssdgen.workers.cpus import RunLoad
    try:
        here = ray.get_runtime_context().get_node_id()
    except Exception:  # noqa: BLE001 - a Ray Client driver has no node of its own: nothing here to watch
        return contextlib.nullcontext()
    pids = {i["pid"] for i in _get([a.info.remote() for a in actors], stop) if i["node_id"] == here}
    return RunLoad(pids) if pids else contextlib.nullcontext()


def _load_report(load, log) -> dict | None:
    """The watch's report, its warning logged (and printed with the summary: ssdgen/cli/run.py)."""
    if not hasattr(load, "report"):
        return None
    rep = load.report()
    if rep["warning"]:
        log.warning(rep["warning"])
    return rep


def _audit(cfg: RunSettings, out: Output, committed: dict, price: Price) -> dict | None:
    """The audit of every committed shard (this run's and earlier ones'), read back from storage; logged."""
    if cfg.audit <= 0:
        return None
    a = audit_summary(out, committed, cfg.audit, cfg.audit_tolerance, price)
    log = get_run_logger()
    if (w := audit_warning(a)) is not None:
        log.warning(w)
    elif a["n"]:
        log.info(f"audit: NLL gap {a['nll_gap']:+.4f} nats/token, 95% CI [{a['nll_gap_ci'][0]:+.4f}, "
                 f"{a['nll_gap_ci'][1]:+.4f}] over {a['n']} prompts: within +-{a['tolerance']}")
    return a


def execute(cfg: RunSettings, progress: bool = True, overwrite: bool = False, started: float | None = None) -> dict:
    """The run: checks (flows.prepare), then under the output's lease (output.lease) the settings are recorded,
    damaged shards set aside, the pending shards decoded and committed, and the manifest and summary written.
    `started`: the command's start (`generate`)."""
    log = get_run_logger()
    t0 = time.perf_counter()
    # what came before the flow (the process's imports, the checks, Prefect's server, the local Ray): the user
    # waited for it too, so the summary's end-to-end figures count it (#49: 4.9 s said, 14.0 s taken)
    before = max(0.0, time.time() - started) if started is not None else 0.0
    line = _StatusLine()
    with StopSignals(line) as stop:
        check_output(cfg)
        with Lease(Output(cfg.out)) as lease:
            stop.last_words.append(lease.give_back)
            if overwrite:
                _overwrite(prepare(cfg, overwrite=True, leased=True).out, log, lease.check)
            prep = prepare(cfg, leased=True)  # read under the lease: what another driver committed before is seen
            prep.out.fence = lease.check  # every write of this run checks the lease first (storage.store)
            line.done = prep.done
            stop.check()
            _record(prep, log)
            log.info(describe(prep))
            if not prep.pending and prep.stale is None:  # the manifest and summary name every commit already
                return prep.out.read_summary() | {"shards_run_now": 0, "nothing_to_do": True,
                                                      "summary": prep.out.full_url(prep.out.path(SUMMARY))}
            if not prep.pending:
                log.warning(f"{prep.stale}: rebuilding manifest.parquet and summary.json from the commit markers")
            ran = _run_pending(cfg, prep, progress, t0, lease, stop) if prep.pending else \
                {"failed": {}, "startup_s": 0.0, "images": 0, "commits": 0, "commit_latency_s": None}
            lease.guard()  # the folder is still the run's (a dropped mount): else no manifest in the new one
            summary = _summarize(cfg, prep, ran | {"before_flow_s": before}, time.perf_counter() - t0)
    failed = ran["failed"]
    if (stopped := ran.get("interrupted")) is not None:
        raise stopped
    if failed:
        first = min(failed)
        raise ShardsFailed(f"{len(failed)} shard(s) failed (first: shard {first}: {failed[first]}); "
                           f"{summary['shards']}/{len(prep.shards)} committed; run again to resume")
    return summary


class _StatusLine:
    """The line a signal prints (flows.interrupts): what is committed, once the run knows, and what was decoded
    and not committed, once the pool decodes (#49: the bar showed 8/32 and the line "0/4 shards committed")."""
    done: bytearray | None = None
    uncommitted = None  # () -> images decoded this run whose shard did not commit (flows.dispatch)

    def __call__(self) -> str:
        if self.done is None:
            return "interrupted before any shard ran; run the same command to resume"
        lost = self.uncommitted() if self.uncommitted is not None else 0
        thrown = (f"; {lost} decoded image{'s' if lost != 1 else ''} not committed (a shard commits whole: the "
                  "same command decodes them again)") if lost else ""
        return (f"interrupted: {self.done.count(1)}/{len(self.done)} shards committed{thrown}; run the same command "
                "to resume")


def _overwrite(out: Output, log, fence) -> None:
    out.fence = fence
    files, size = output_size(out)
    log.warning(f"--overwrite: deleting the run at {out.url} ({files} files, {size / 2**20:.1f} MiB)")
    clear(out, keep=LEASE_DIR)


def _record(prep: Prepared, log) -> None:
    """Pin the settings (a run that committed nothing takes new ones, said in the log), record the price, and set
    damaged shards aside, so this run re-decodes them."""
    if prep.changed:
        log.warning(f"{prep.out.url}: no shard was committed with the recorded settings; taking the new ones "
                    f"({prep.changed} differ)")
    if prep.changed or prep.added is not None or prep.out.recorded_config() is None:
        old = prep.old or {}
        digests = digests_for(prep.files, prep.record["inputs"], old.get("inputs") or [], old.get(ROW_DIGESTS))
        prep.out.write_config(prep.record | {ROW_DIGESTS: digests}, replacing=bool(prep.changed))
    if prep.pending:  # a run with nothing to decode keeps its summary, so the price that summary was costed at
        prep.out.write_price(prep.price)
    set_aside(prep.out, prep.damaged, log)


def _summarize(cfg: RunSettings, prep: Prepared, ran: dict, wall: float) -> dict:
    """manifest.parquet and summary.json (output.summary): cost over every committed shard, speed over this run's
    own work and wall time (each images/s labelled by what it divides)."""
    out, log = prep.out, get_run_logger()
    removed = out.gc(warn=log.warning)  # a delete the store refuses is one line, never the run's end
    # the shards this run knows are committed (its own among them) count even where the listing lags
    summary, fold = committed_totals(out, prep.price, wall, audit=cfg.audit > 0, known=prep.done)
    if fold.unlisted:
        log.warning(unlisted_line(fold.unlisted))
    plan = out.read_plan()
    summary |= this_run(cfg, ran, wall, len(prep.shards), [d.shard for d in prep.damaged], removed, plan)
    summary["audit"] = _audit(cfg, out, fold.audit, prep.price)
    summary["summary"] = write_summary(out, summary)
    machine_record.save(cfg, summary, plan)  # what a later dry run with these settings estimates from
    _artifacts(summary, fold.errors, fold.reasons)
    return summary


def _artifacts(summary: dict, errors: Counter, reasons: Counter) -> None:
    create_table_artifact(table=cost_table(summary) + audit_rows(summary.get("audit")), key="ssdgen-cost",
                          description=f"Cost and throughput of {summary['out']}")
    lines = [f"- {n} × {msg}" for msg, n in errors.most_common(20)] or ["- none"]
    if reasons:
        lines = [f"By reason: {', '.join(f'{r} {n}' for r, n in reasons.most_common())}", ""] + lines
    create_markdown_artifact(markdown="## Failed samples\n" + "\n".join(lines), key="ssdgen-failures",
                             description="Per-sample errors in committed shards")


__all__ = ["RunSettings", "generate", "execute", "plan_words", "InputError", "Interrupted"]
