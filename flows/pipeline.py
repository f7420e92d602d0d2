"""The generation flow: Parquet prompts on any fsspec URL -> images and per-sample statistics as committed
Parquet shards, on a pool of Ray actors, driven by Prefect.

    plan (metadata only) -> skip committed shards -> per shard, a Prefect task with retries:
        read its rows -> decode batches on an actor -> write images/stats under an attempt key -> commit marker
    -> gc unmarked attempts -> manifest + summary (cost, audit) -> Prefect artifacts

Why Ray Core actors and not Ray Data: exactly-once output needs a unit of commit we control. A shard is read,
decoded, written under an attempt-unique key and committed by a create-only marker; Ray Data's writers name
files by a per-execution UUID (re-runs duplicate output in APPEND mode) and drop failed blocks rather than
retry them when errors are tolerated. With actors we keep Ray's part (placement by num_cpus/num_gpus, restarts
of dead actors, the object store) and do the commit ourselves. Inside a shard, batches already decoded survive
an actor crash: only the batches the dead actor held are resubmitted (to its restarted incarnation).

Retries: the shard task retries with exponential backoff and jitter only on transient errors (storage I/O,
dead actors); configuration, schema and input errors fail at once. Per-sample failures are error rows.
Settings that change the images (model, decoder, sampling, seed, batch size, input files, shard size) are
recorded in `_config.json`; a resume with other settings is refused.

`--audit FRACTION` (flows/audit.py) also scores a deterministic sample of the prompts against an `ar` sample
under the target; its rows are committed with their shard, and its cost is a line of its own.
"""

from __future__ import annotations

import math
import os
import queue
import threading
import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone

from decoders.spec import DecodeSpec
from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE
from prefect.tasks import exponential_backoff
from tqdm import tqdm

from .audit import AUDIT_FILE, DEFAULT_TOLERANCE, audit_rows, audit_table, check_audit, mark_rows
from .audit import shard_audit, summarize as audit_summary, warning as audit_warning
from .cost import Price, cost_table, price_for, run_summary
from .inputs import InputError, InputFile, check_unique_prompt_ids, list_inputs
from .layout import Output, shard_tables
from .plan import Shard, plan_shards, read_shard


class InjectedStorageError(OSError):
    """A storage error injected by a test (faults["storage_errors"])."""


class FlowCrash(RuntimeError):
    """An injected crash of the flow between shards (faults["crash_after_commits"])."""


NOT_TRANSIENT = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)


def is_transient(exc: BaseException) -> bool:
    """Storage I/O and dead or unreachable actors are worth retrying; everything else is a bug or bad config."""
    import ray.exceptions as rx
    if isinstance(exc, (rx.RayActorError, rx.ActorUnavailableError, rx.ObjectLostError, rx.GetTimeoutError)):
        return True
    if isinstance(exc, rx.RayTaskError):  # an exception inside the actor: judge its cause
        return is_transient(exc.cause) if exc.cause is not None else False
    return isinstance(exc, (OSError, TimeoutError, ConnectionError)) and not isinstance(exc, NOT_TRANSIENT)


def retry_transient(task, task_run, state) -> bool:
    exc = state.data if isinstance(state.data, BaseException) else state.result(raise_on_failure=False)
    return isinstance(exc, BaseException) and is_transient(exc)


@dataclass(frozen=True)
class GenerateConfig:
    """Run settings, parsed at the edge (CLI or flow parameters)."""
    prompts: tuple[str, ...]
    out: str = "out"
    model: str = "reference"
    decoder: DecodeSpec = field(default_factory=DecodeSpec)  # decoder, its parameters, sampling, heads
    seed: int = 0
    shard_size: int = 256
    batch_size: int = 16
    actors: int = 2
    cpus_per_actor: float = 1.0
    gpus_per_actor: float = 0.0
    device_type: str = "cpu"
    ray_address: str | None = None
    cluster_limit: str | None = None  # a Prefect global concurrency limit; the run holds `cluster_slots` of it
    audit: float = 0.0  # fraction of prompts also decoded with `ar` to measure the NLL gap (0 = no audit)
    audit_tolerance: float = DEFAULT_TOLERANCE

    def validate(self) -> Price:
        from workers.models import check_model_spec
        if not self.prompts:
            raise ValueError("--prompts: give at least one Parquet file or prefix")
        for name in ("shard_size", "batch_size", "actors"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.cpus_per_actor <= 0 or self.gpus_per_actor < 0:
            raise ValueError("--cpus-per-actor must be > 0 and --gpus-per-actor >= 0")
        check_model_spec(self.model)
        check_audit(self.audit, self.audit_tolerance)
        price = price_for(self.device_type)
        if price.unit == "gpu" and self.gpus_per_actor <= 0:
            raise ValueError(f"--device-type {self.device_type} is priced per GPU, but actors get no GPU "
                             "(set --gpus-per-actor)")
        if price.unit != "gpu" and self.gpus_per_actor > 0:
            raise ValueError(f"--device-type {self.device_type} is a CPU type, but actors get GPUs; "
                             "name the GPU type (e.g. --device-type l4)")
        return price

    @property
    def devices_per_actor(self) -> float:
        return self.gpus_per_actor if self.gpus_per_actor > 0 else self.cpus_per_actor

    @property
    def cluster_slots(self) -> int:
        """Slots this run takes from `cluster_limit`: the GPUs its actors hold, rounded up (2 actors at 0.5 GPU
        take 1), or one per actor when the actors get no GPU."""
        return max(1, math.ceil(self.actors * self.gpus_per_actor)) if self.gpus_per_actor > 0 else self.actors

    @property
    def threads(self) -> int:
        return max(1, int(self.cpus_per_actor))

    def worker_spec(self) -> dict:
        return {"model": self.model, "decode": self.decoder.to_dict(), "threads": self.threads}

    def recorded(self, files: list[InputFile]) -> dict:
        """What `_config.json` holds: everything that decides which images come out. No credentials."""
        keys = ("model", "seed", "shard_size", "batch_size")
        # audit keys only when auditing: a run from before the audit existed still resumes without one
        audit = {"audit": self.audit, "audit_tolerance": self.audit_tolerance} if self.audit > 0 else {}
        return {k: getattr(self, k) for k in keys} | {"decoder": str(self.decoder)} | audit | {
            "inputs": [{"url": f.url, "rows": f.num_rows, "bytes": f.size} for f in files]}

    @property
    def audit_label(self) -> str:
        return self.decoder.label


class ActorPool:
    """Idle actors in a queue: a shard task takes one for the whole shard and gives it back."""

    def __init__(self, actors: list):
        self.actors = actors
        self.idle: queue.Queue = queue.Queue()
        for a in actors:
            self.idle.put(a)

    def acquire(self):
        return self.idle.get()

    def release(self, actor) -> None:
        self.idle.put(actor)


class RunContext:
    """What every shard task shares. A plain class: Prefect passes it through without hashing or walking it."""

    def __init__(self, cfg: GenerateConfig, files: list[InputFile], out: Output, pool: ActorPool,
                 bar: tqdm | None, faults: dict):
        self.cfg, self.files, self.out, self.pool, self.bar, self.faults = cfg, files, out, pool, bar, faults
        self.lock = threading.Lock()
        self.commits = 0
        self.storage_errors_left = int(faults.get("storage_errors", 0))

    def maybe_fail_write(self) -> None:
        with self.lock:
            if self.storage_errors_left > 0:
                self.storage_errors_left -= 1
                raise InjectedStorageError("injected transient storage error on write")

    def advance(self, n: int) -> None:
        if self.bar is not None:
            with self.lock:
                self.bar.update(n)


MAX_ACTOR_DEATHS_PER_TRY = 3
# How long a shard waits for its actor's restart. After a node loss the restart waits for free resources: an
# autoscaler's new GPU node takes minutes, and until then every call to the actor fails at once.
ACTOR_RESTART_WAIT_S = float(os.environ.get("SSDGEN_ACTOR_RESTART_WAIT_S", 900))


def _await_restart(actor) -> None:
    """Return once a restarted actor answers; raise ActorUnavailableError after ACTOR_RESTART_WAIT_S. Without
    this wait, resubmitting to a restarting actor fails at once and spends the shard's death budget and its
    retries in seconds, so one lost node failed the shards its actors held."""
    import ray
    import ray.exceptions as rx
    deadline = time.monotonic() + ACTOR_RESTART_WAIT_S
    while True:
        try:
            ray.get(actor.info.remote(), timeout=60)
            return
        except (rx.ActorUnavailableError, rx.GetTimeoutError):
            if time.monotonic() > deadline:
                raise
            time.sleep(1.0)


def _decode_batches(actor, batches: list[list[dict]], shard_id: int, ctx: RunContext) -> list[dict]:
    """Every batch's result from one actor. Ray restarts a dead actor (max_restarts=-1); only the batches it
    held are resubmitted, to its restarted incarnation."""
    import ray
    import ray.exceptions as rx
    results: list[dict | None] = [None] * len(batches)
    deaths = 0
    while any(r is None for r in results):
        todo = [i for i, r in enumerate(results) if r is None]
        refs = {i: actor.decode.remote(batches[i], {"shard": shard_id, "batch": i}) for i in todo}
        try:
            for i in todo:
                results[i] = ray.get(refs[i])
                ctx.advance(len(batches[i]))
        except (rx.RayActorError, rx.ActorUnavailableError) as e:
            deaths += 1
            if deaths > MAX_ACTOR_DEATHS_PER_TRY:
                raise
            get_run_logger().warning(f"shard {shard_id}: actor died ({type(e).__name__}); waiting for its "
                                     f"restart to resubmit {sum(r is None for r in results)} batch(es)")
            _await_restart(actor)
    return results


@task(name="shard", task_run_name="shard-{shard_id}", retries=4, retry_delay_seconds=exponential_backoff(0.5),
      retry_jitter_factor=0.5, retry_condition_fn=retry_transient, cache_policy=NO_CACHE)
def run_shard(shard_id: int, shard: Shard, ctx: RunContext) -> dict:
    import ray
    out, cfg = ctx.out, ctx.cfg
    if out.fs.exists(f"{out.shard_dir(shard_id)}/_SUCCESS.json"):
        return {"shard": shard_id, "skipped": True}  # committed by an earlier try that lost its reply
    rows = [asdict(r) for r in read_shard(ctx.files, shard, cfg.seed)]  # read while waiting for an actor
    mark_rows(rows, cfg.audit)  # by prompt_id alone, so every try of this shard audits the same prompts
    batches = [rows[i:i + cfg.batch_size] for i in range(0, len(rows), cfg.batch_size)]
    actor = ctx.pool.acquire()  # tasks start at once and queue here for an idle actor
    t0 = time.perf_counter()  # the shard holds the actor's devices from here: its allocated time starts now
    started = datetime.now(timezone.utc).isoformat()
    try:
        crash_after = ctx.faults.get("crash_after_commits")
        if crash_after is not None and ctx.commits >= crash_after:
            raise FlowCrash(f"injected flow crash after {ctx.commits} commits")
        results = _decode_batches(actor, batches, shard_id, ctx)
        load_s = ray.get(actor.take_load_seconds.remote())
        info = ray.get(actor.info.remote())
    finally:
        ctx.pool.release(actor)
    busy = sum(r["busy_s"] for r in results)
    samples = [s for r in results for s in r["samples"]]
    for s in samples:
        s["device_seconds"] = s["latency_s"] * cfg.devices_per_actor
    images, stats = shard_tables(samples, rows, cfg.decoder.label, cfg.model)
    dev = cfg.devices_per_actor
    audited, audit = shard_audit(results, dev)
    attempt = out.new_attempt(shard_id)
    ctx.maybe_fail_write()
    files = [out.write_table(f"{attempt}/images.parquet", images), out.write_table(f"{attempt}/stats.parquet", stats)]
    if cfg.audit > 0:  # written even when empty: the marker then says this shard was audited
        files.append(out.write_table(f"{attempt}/{AUDIT_FILE}", audit_table(audited, cfg.audit_label)))
    # the actor's audit seconds leave the shard's time: the images are costed without it, the audit on its own
    wall = max(0.0, time.perf_counter() - t0 - audit["seconds"])
    errors = Counter(s["error"] for s in samples if s["status"] != "ok")
    marker = {"shard": shard_id, "attempt": attempt.rsplit("/", 1)[-1], "files": files, "rows": len(samples),
              "ok": len(samples) - sum(errors.values()), "failed": sum(errors.values()),
              "errors": dict(errors.most_common(10)), "wall_s": wall, "busy_s": busy, "load_s": load_s,
              "devices": dev, "device_type": cfg.device_type, "device_seconds_allocated": (wall + load_s) * dev,
              "device_seconds_busy": busy * dev, "started_at": started,
              "finished_at": datetime.now(timezone.utc).isoformat(), "actor_pid": info["pid"],
              "node_id": info.get("node_id"), "device": info["device"]} | ({"audit": audit} if cfg.audit > 0 else {})
    ctx.maybe_fail_write()
    if not out.commit(shard_id, marker):
        return {"shard": shard_id, "skipped": True}  # another attempt won the commit; ours is garbage
    with ctx.lock:
        ctx.commits += 1
    return marker


def _start_ray(cfg: GenerateConfig) -> bool:
    """Attach to a cluster (--ray-address / RAY_ADDRESS) or start a local Ray. True if we started it."""
    import ray
    if ray.is_initialized():
        return False
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    address = cfg.ray_address or os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, log_to_driver=False)
    else:
        ray.init(include_dashboard=False, log_to_driver=False,
                 object_store_memory=int(os.environ.get("SSDGEN_OBJECT_STORE_BYTES", 512 * 2**20)))
    return True


def _stop(pool: ActorPool | None, started_ray: bool) -> None:
    import ray
    for a in pool.actors if pool else []:
        ray.kill(a, no_restart=True)
    if started_ray:
        ray.shutdown()


@contextmanager
def _cluster_slots(cfg: GenerateConfig):
    """Hold `cfg.cluster_slots` slots of the Prefect global concurrency limit `cfg.cluster_limit` while the run
    has actors, so runs that share a cluster (scheduled, ad hoc, other deployments) queue instead of overbooking
    it. Waits for free slots; a limit that does not exist is an error (strict), not a silently uncapped run."""
    if not cfg.cluster_limit:
        yield
        return
    from prefect.concurrency.sync import concurrency
    get_run_logger().info(f"waiting for {cfg.cluster_slots} slot(s) of concurrency limit {cfg.cluster_limit!r}")
    with concurrency(cfg.cluster_limit, occupy=cfg.cluster_slots, strict=True):
        yield


def _actors(cfg: GenerateConfig, faults: dict) -> list:
    import ray
    from workers.decode_worker import DecodeWorker
    cls = ray.remote(DecodeWorker).options(num_cpus=cfg.cpus_per_actor, num_gpus=cfg.gpus_per_actor,
                                           max_restarts=-1, max_task_retries=0)
    actors = [cls.remote(cfg.worker_spec(), faults or None) for _ in range(cfg.actors)]
    ray.get([a.info.remote() for a in actors])  # wait for the loads; a config error surfaces here, once
    return actors


@flow(name="ssdgen-generate")
def generate(prompts: list[str], out: str = "out", model: str = "reference", decoder: str = "ar",
             seed: int = 0, shard_size: int = 256, batch_size: int = 16, actors: int = 2,
             cpus_per_actor: float = 1.0, gpus_per_actor: float = 0.0, device_type: str = "cpu",
             ray_address: str | None = None, cluster_limit: str | None = None, audit: float = 0.0,
             audit_tolerance: float = DEFAULT_TOLERANCE, progress: bool = True, faults: dict | None = None) -> dict:
    """Generate an image for every prompt row; resumable. `decoder` is a decode spec (decoders/spec.py), e.g.
    `ssd+csd:token_budget=0:cfg=3`, parsed here: the flow is the edge for deployments. `out` may hold `{date}`, filled with the run's
    scheduled date (YYYY-MM-DD), so a scheduled deployment renders into one folder per day. `cluster_limit`
    names a Prefect global concurrency limit (`prefect gcl create NAME --limit N`) that the run holds one slot
    of per GPU (per actor on CPUs) while its actors exist. `audit` is the fraction of prompts whose NLL gap to
    `ar` is measured (flows/audit.py), `audit_tolerance` the allowed gap. `faults` is for tests (injected
    crashes)."""
    if "{date}" in out:
        from prefect.runtime import flow_run
        when = flow_run.scheduled_start_time or datetime.now(timezone.utc)
        out = out.replace("{date}", when.strftime("%Y-%m-%d"))
    cfg = GenerateConfig(prompts=tuple(prompts), out=out, model=model, decoder=DecodeSpec.parse(decoder), seed=seed,
                         shard_size=shard_size, batch_size=batch_size, actors=actors, cpus_per_actor=cpus_per_actor,
                         gpus_per_actor=gpus_per_actor, device_type=device_type, ray_address=ray_address,
                         cluster_limit=cluster_limit, audit=audit, audit_tolerance=audit_tolerance)
    return execute(cfg, progress=progress, faults=faults or {})


def _run_pending(cfg: GenerateConfig, files: list[InputFile], out: Output, pending: list[Shard], progress: bool,
                 faults: dict, t0: float) -> tuple[dict[int, str], float]:
    """Run the pending shards on a pool of actors -> (failed shard -> error, startup seconds)."""
    log = get_run_logger()
    failed: dict[int, str] = {}
    startup_s = 0.0
    with _cluster_slots(cfg):
        started_ray = _start_ray(cfg)
        pool = None
        try:
            pool = ActorPool(_actors(cfg, faults))
            startup_s = time.perf_counter() - t0
            log.info(f"{cfg.actors} actor(s) ready {startup_s:.1f} s after the flow started")
            bar = tqdm(total=sum(s.rows for s in pending), unit="img", desc="generate", disable=not progress,
                       smoothing=0.1)
            ctx = RunContext(cfg, files, out, pool, bar, faults)
            futures = [run_shard.submit(s.id, s, ctx) for s in pending]
            for s, fut in zip(pending, futures):
                try:
                    fut.result()
                except FlowCrash:
                    raise
                except Exception as e:  # noqa: BLE001 - collect, report, and fail the run after the summary
                    failed[s.id] = f"{type(e).__name__}: {e}"
            bar.close()
        finally:
            _stop(pool, started_ray)
    return failed, startup_s


def _audit(cfg: GenerateConfig, out: Output, committed: dict, price: Price) -> dict | None:
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


def execute(cfg: GenerateConfig, progress: bool = True, faults: dict | None = None) -> dict:
    faults = faults or {}
    log = get_run_logger()
    t0 = time.perf_counter()
    price = cfg.validate()
    files = list_inputs(list(cfg.prompts))
    check_unique_prompt_ids(files)
    shards = plan_shards(files, cfg.shard_size)
    out = Output(cfg.out)
    out.ensure_config(cfg.recorded(files))
    done = out.committed()
    pending = [s for s in shards if s.id not in done]
    log.info(f"{sum(f.num_rows for f in files)} prompts in {len(files)} file(s): {len(shards)} shards, "
             f"{len(done)} already committed, {len(pending)} to run")
    failed, startup_s = _run_pending(cfg, files, out, pending, progress, faults, t0) if pending else ({}, 0.0)
    committed = out.committed()
    removed = out.gc(committed)
    wall = time.perf_counter() - t0
    summary = run_summary([committed[k] for k in sorted(committed)], price, wall)
    ran_now = [committed[s.id] for s in pending if s.id in committed]
    # cost covers every committed shard; speed only this run's own work against this run's wall time
    summary["images_this_run"] = sum(m["ok"] for m in ran_now)
    summary["images_per_s"] = summary["images_this_run"] / wall if wall > 0 else None
    # startup (plan, Ray, actors, model loads) is paid once per run; steady state is what a long run sees
    summary["startup_s"] = startup_s
    steady = wall - startup_s
    summary["images_per_s_steady"] = summary["images_this_run"] / steady if pending and steady > 0 else None
    summary |= {"out": out.url, "shards_total": len(shards), "shards_committed": len(committed),
                "shards_run_now": len(pending) - len(failed), "shards_failed": {str(k): v for k, v in failed.items()},
                "attempts_removed": removed, "decoder": str(cfg.decoder), "model": cfg.model,
                "batch_size": cfg.batch_size, "actors": cfg.actors, "device_type": cfg.device_type,
                "audit": _audit(cfg, out, committed, price),
                "manifest": out.write_manifest(committed), "finished_at": datetime.now(timezone.utc).isoformat()}
    summary["summary"] = out.write_summary(summary)
    _artifacts(summary, committed)
    if failed:
        first = min(failed)
        raise RuntimeError(f"{len(failed)} shard(s) failed (first: shard {first}: {failed[first]}); "
                           f"{len(committed)}/{len(shards)} committed; run again to resume")
    return summary


def _artifacts(summary: dict, committed: dict) -> None:
    create_table_artifact(table=cost_table(summary) + audit_rows(summary.get("audit")), key="ssdgen-cost",
                          description=f"Cost and throughput of {summary['out']}")
    errors = Counter()
    for m in committed.values():
        errors.update(m.get("errors", {}))
    lines = [f"- {n} × {msg}" for msg, n in errors.most_common(20)] or ["- none"]
    create_markdown_artifact(markdown="## Failed samples\n" + "\n".join(lines), key="ssdgen-failures",
                             description="Per-sample errors in committed shards")


def run_status(url: str) -> dict:
    """Shards done, pending and failed, the cost and the audit so far, from the markers (no Prefect, no Ray)."""
    import json
    out = Output(url)
    conf = out.read_config()
    total_rows = sum(i["rows"] for i in conf["inputs"])
    n_shards = -(-total_rows // conf["shard_size"])
    committed = out.committed()
    failed = {}
    if out.fs.exists(out.path("summary.json")):
        failed = {int(k): v for k, v in json.loads(out.fs.cat_file(out.path("summary.json")))
                  .get("shards_failed", {}).items() if int(k) not in committed}
    device_types = {m["device_type"] for m in committed.values()}
    cost = price = None
    if len(device_types) == 1:
        price = price_for(device_types.pop())
        cost = run_summary([committed[k] for k in sorted(committed)], price,
                           wall_s=sum(m["wall_s"] for m in committed.values()))
    audit = None
    if conf.get("audit"):
        audit = audit_summary(out, committed, conf["audit"], conf.get("audit_tolerance", DEFAULT_TOLERANCE), price)
    return {"out": url, "shards_total": n_shards, "shards_done": len(committed), "shards_failed": failed,
            "shards_pending": n_shards - len(committed) - len(failed),
            "images_ok": sum(m["ok"] for m in committed.values()),
            "images_failed": sum(m["failed"] for m in committed.values()), "cost": cost, "audit": audit}


__all__ = ["GenerateConfig", "generate", "execute", "run_status", "InputError"]
