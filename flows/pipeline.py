"""The generation flow: Parquet prompts on any fsspec URL -> images and per-sample statistics as committed
Parquet shards (and/or WebDataset tars, flows/webdataset_shards.py), on a pool of Ray actors, driven by Prefect.

    plan (metadata only) -> skip committed shards -> groups of shards as Prefect tasks with retries, a few at
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
A failed write is first retried in place (flows.dispatch). Per-sample failures are error rows.
Settings that change the images (model, decoder, sampling, seed, batch size, input files, shard size, image
format and quality, output format) are recorded in `_config.json`; a resume with other settings is refused.
A device-calibrated decoder (`calibrated=true`, ssd+csd's default) has its rows decided once, by one actor before
the first shard, and recorded in `_plan.json`: every actor, retry and resume decodes by that plan.

`--audit FRACTION` (flows/audit.py) also scores a deterministic sample of the prompts against an `ar` sample
under the target; its rows are committed with their shard, and its cost is a line of its own.
"""

from __future__ import annotations

import math
import os
import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone

from decoders.configs import CALIBRATION_PROMPTS
from decoders.spec import DecodeSpec
from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from tqdm import tqdm

from .audit import AUDIT_FILE, DEFAULT_TOLERANCE, audit_rows, check_audit
from .audit import summarize as audit_summary, warning as audit_warning
from .cost import Price, cost_table, price_for, run_summary
from .dispatch import Dispatcher
from .groups import RunContext, run_groups
from .inputs import InputError, InputFile, check_unique_prompt_ids, list_inputs
from .layout import Output
from .plan import ShardPlan, read_shard
from .webdataset_shards import check_format

# How long a shard waits for its actor's restart. After a node loss the restart waits for free resources: an
# autoscaler's new GPU node takes minutes, and until then every call to the actor fails at once.
ACTOR_RESTART_WAIT_S = float(os.environ.get("SSDGEN_ACTOR_RESTART_WAIT_S", 900))


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
    image_format: str = "png"  # png | webp | jpeg, encoded on the actors (workers.decode_worker.encode_image)
    quality: int = 90  # webp/jpeg only
    format: str = "parquet"  # parquet | webdataset | both: the shard's data files (flows/webdataset_shards.py)
    dtype: str = "auto"  # the model's precision on the actors (models/registry.py; auto: bf16 for HF on a GPU)

    def validate(self) -> Price:
        from workers.decode_worker import check_image_format
        from models.registry import check_dtype, check_model_spec
        if not self.prompts:
            raise ValueError("--prompts: give at least one Parquet file or prefix")
        for name in ("shard_size", "batch_size", "actors"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.cpus_per_actor <= 0 or self.gpus_per_actor < 0:
            raise ValueError("--cpus-per-actor must be > 0 and --gpus-per-actor >= 0")
        check_model_spec(self.model)
        check_audit(self.audit, self.audit_tolerance)
        check_image_format(self.image_format, self.quality)
        check_format(self.format)
        check_dtype(self.dtype, on_gpu=self.gpus_per_actor > 0)
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
        return {"model": self.model, "decode": self.decoder.to_dict(), "threads": self.threads,
                "image_format": self.image_format, "quality": self.quality, "dtype": self.dtype}

    def recorded(self, files: list[InputFile]) -> dict:
        """What `_config.json` holds: everything that decides which images come out. No credentials."""
        keys = ("model", "seed", "shard_size", "batch_size")
        # audit keys only when auditing: a run from before the audit existed still resumes without one
        audit = {"audit": self.audit, "audit_tolerance": self.audit_tolerance} if self.audit > 0 else {}
        # likewise the encoding only when not png, so a run from before --image-format still resumes; quality
        # only where it changes the bytes (png ignores it)
        image = {"image_format": self.image_format, "quality": self.quality} if self.image_format != "png" else {}
        # and the output format only when not parquet: a resume must not mix shards with and without tars
        fmt = {"format": self.format} if self.format != "parquet" else {}
        dtype = {"dtype": self.dtype} if self.dtype != "auto" else {}  # a precision changes the images
        return {k: getattr(self, k) for k in keys} | {"decoder": str(self.decoder)} | audit | image | fmt | dtype | {
            "inputs": [{"url": f.url, "rows": f.num_rows, "bytes": f.size} for f in files]}

    @property
    def audit_label(self) -> str:
        return self.decoder.label


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


def _stop(actors: list, started_ray: bool) -> None:
    import ray
    for a in actors:
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


def _decode_plan(cfg: GenerateConfig, files: list[InputFile], plan: ShardPlan, out: Output, actors: list,
                 log) -> dict | None:
    """A calibrated decoder's plan, decided once per run (decoders/calibrate.py): the recorded one on a resume,
    else measured by one actor on the first shard's first prompts and recorded before any shard decodes. Every
    batch carries it to its actor, so all actors, restarted ones and retries decode alike."""
    if not cfg.decoder.calibrated:
        return None
    if (recorded := out.read_plan()) is not None:
        log.info(f"decode plan: {recorded['rows']} row(s) (recorded; 0 = plain AR)")
        return recorded
    import ray
    rows = [asdict(r) for r in read_shard(files, plan[0], cfg.seed)][:max(cfg.batch_size, CALIBRATION_PROMPTS)]
    decided = ray.get(actors[0].calibrate.remote(rows, cfg.batch_size))
    out.write_plan(decided)
    log.info(f"decode plan: {decided['rows']} row(s) (0 = plain AR), measured in {decided['seconds']:.1f} s: "
             f"images/s {decided['measured'] or 'not timed: the cost curve left one choice'}")
    return decided


def _actors(cfg: GenerateConfig) -> list:
    import ray
    from workers.decode_worker import DecodeWorker
    cls = ray.remote(DecodeWorker).options(num_cpus=cfg.cpus_per_actor, num_gpus=cfg.gpus_per_actor,
                                           max_restarts=-1, max_task_retries=0)
    actors = [cls.remote(cfg.worker_spec()) for _ in range(cfg.actors)]
    ray.get([a.info.remote() for a in actors])  # wait for the loads; a config error surfaces here, once
    return actors


@flow(name="ssdgen-generate")
def generate(prompts: list[str], out: str = "out", model: str = "reference", decoder: str = "ssd+csd",
             seed: int = 0, shard_size: int = 256, batch_size: int = 16, actors: int = 2,
             cpus_per_actor: float = 1.0, gpus_per_actor: float = 0.0, device_type: str = "cpu",
             ray_address: str | None = None, cluster_limit: str | None = None, audit: float = 0.0,
             audit_tolerance: float = DEFAULT_TOLERANCE, image_format: str = "png", quality: int = 90,
             format: str = "parquet", dtype: str = "auto", progress: bool = True) -> dict:
    """Generate an image for every prompt row; resumable. `decoder` is a decode spec (decoders/spec.py), e.g.
    `ssd+csd:token_budget=0:cfg=3`, parsed here: the flow is the edge for deployments. `out` may hold `{date}`, filled with the run's
    scheduled date (YYYY-MM-DD), so a scheduled deployment renders into one folder per day. `cluster_limit`
    names a Prefect global concurrency limit (`prefect gcl create NAME --limit N`) that the run holds one slot
    of per GPU (per actor on CPUs) while its actors exist. `audit` is the fraction of prompts whose NLL gap to
    `ar` is measured (flows/audit.py), `audit_tolerance` the allowed gap. `image_format` (png, webp, jpeg) and
    `quality` (webp/jpeg) choose how the images are encoded, `format` (parquet, webdataset, both) which files
    a shard holds (flows/webdataset_shards.py), `dtype` the model's precision on the actors (auto, fp32, bf16, fp16)."""
    if "{date}" in out:
        from prefect.runtime import flow_run
        when = flow_run.scheduled_start_time or datetime.now(timezone.utc)
        out = out.replace("{date}", when.strftime("%Y-%m-%d"))
    cfg = GenerateConfig(prompts=tuple(prompts), out=out, model=model, decoder=DecodeSpec.parse(decoder), seed=seed,
                         shard_size=shard_size, batch_size=batch_size, actors=actors, cpus_per_actor=cpus_per_actor,
                         gpus_per_actor=gpus_per_actor, device_type=device_type, ray_address=ray_address,
                         cluster_limit=cluster_limit, audit=audit, audit_tolerance=audit_tolerance,
                         image_format=image_format, quality=quality, format=format, dtype=dtype)
    return execute(cfg, progress=progress)


def _run_pending(cfg: GenerateConfig, files: list[InputFile], out: Output, plan: ShardPlan, done: bytearray,
                 progress: bool, t0: float) -> dict:
    """Run the pending shards (done[i] == 0) on a pool of actors -> {failed shard -> error, startup seconds,
    images and commits this run, commit latency}."""
    log = get_run_logger()
    pending = done.count(0)
    rows = pending * cfg.shard_size - (cfg.shard_size * len(plan) - plan.rows if not done[-1] else 0)
    with _cluster_slots(cfg):
        started_ray = _start_ray(cfg)
        actors, disp = [], None
        try:
            actors = _actors(cfg)
            decode_plan = _decode_plan(cfg, files, plan, out, actors, log)
            startup_s = time.perf_counter() - t0
            log.info(f"{cfg.actors} actor(s) ready {startup_s:.1f} s after the flow started")
            bar = tqdm(total=rows, unit="img", desc="generate", disable=not progress, smoothing=0.1)
            # the wait is read now, not at import: tests and operators may change it on the module
            disp = Dispatcher(cfg, files, out, actors, done, log, ACTOR_RESTART_WAIT_S, bar,
                              decode_plan).start()
            failed_groups = run_groups(RunContext(plan, done, disp), pending, len(plan))
            bar.close()
        finally:
            if disp is not None:
                disp.close()
            _stop(actors, started_ray)
    failed = {i: msg for (first, last), msg in failed_groups.items() for i in range(first, last + 1) if not done[i]}
    return {"failed": failed, "startup_s": startup_s, "images": disp.images, "commits": disp.commits,
            "commit_latency_s": {"mean": disp.write_total / disp.write_n if disp.write_n else None,
                                 "max": disp.write_max if disp.write_n else None}}


class _Fold:
    """One streamed pass over the committed markers (flows.layout.Output.iter_markers) feeds the cost summary,
    the manifest, the failure counts and the audit's index: no marker is held after it is read."""

    MAX_ERRORS = 10_000  # distinct error messages kept; the rarest are dropped beyond it

    def __init__(self, out: Output, audit: bool, manifest: bool = True):
        self.out, self.audit = out, {} if audit else None
        self.manifest = out.manifest_writer() if manifest else None
        self.errors: Counter = Counter()
        self.wall_s = 0.0
        self.device_types: set = set()

    def markers(self):
        for m in self.out.iter_markers():
            if self.manifest is not None:
                self.manifest.add(m)
            self.errors.update(m.get("errors", {}))
            if len(self.errors) > self.MAX_ERRORS:
                self.errors = Counter(dict(self.errors.most_common(self.MAX_ERRORS // 2)))
            self.wall_s += m["wall_s"]
            self.device_types.add(m["device_type"])
            if self.audit is not None:  # what flows.audit reads: the audit file and the audit seconds
                self.audit[int(m["shard"])] = {"files": [f for f in m["files"] if f["path"].endswith(AUDIT_FILE)],
                                               "audit": m.get("audit")}
            yield m


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


def execute(cfg: GenerateConfig, progress: bool = True) -> dict:
    log = get_run_logger()
    t0 = time.perf_counter()
    price = cfg.validate()
    files = list_inputs(list(cfg.prompts))
    check_unique_prompt_ids(files)
    plan = ShardPlan(files, cfg.shard_size)
    out = Output(cfg.out)
    out.ensure_config(cfg.recorded(files))
    done = out.committed_ids(len(plan))
    pending = done.count(0)
    log.info(f"{plan.rows} prompts in {len(files)} file(s): {len(plan)} shards, {len(plan) - pending} already "
             f"committed, {pending} to run")
    ran = _run_pending(cfg, files, out, plan, done, progress, t0) if pending else \
        {"failed": {}, "startup_s": 0.0, "images": 0, "commits": 0, "commit_latency_s": None}
    failed = ran["failed"]
    removed = out.gc()
    wall = time.perf_counter() - t0
    fold = _Fold(out, audit=cfg.audit > 0)
    summary = run_summary(fold.markers(), price, wall)
    manifest = fold.manifest.close()
    # cost covers every committed shard; speed only this run's own work against this run's wall time
    summary["images_this_run"] = ran["images"]
    summary["images_per_s"] = summary["images_this_run"] / wall if wall > 0 else None
    # startup (plan, Ray, actors, model loads) is paid once per run; steady state is what a long run sees
    summary["startup_s"] = startup_s = ran["startup_s"]
    steady = wall - startup_s
    summary["images_per_s_steady"] = summary["images_this_run"] / steady if pending and steady > 0 else None
    summary |= {"out": out.url, "shards_total": len(plan), "shards_committed": summary["shards"],
                "shards_run_now": pending - len(failed), "shards_failed": {str(k): v for k, v in failed.items()},
                "attempts_removed": removed, "decoder": str(cfg.decoder), "model": cfg.model,
                "batch_size": cfg.batch_size, "image_format": cfg.image_format, "format": cfg.format, "actors": cfg.actors, "device_type": cfg.device_type,
                "commit_latency_s": ran["commit_latency_s"], "audit": _audit(cfg, out, fold.audit, price),
                "decode_plan": _plan_summary(out.read_plan()),
                "manifest": manifest, "finished_at": datetime.now(timezone.utc).isoformat()}
    summary["summary"] = out.write_summary(summary)
    _artifacts(summary, fold.errors)
    if failed:
        first = min(failed)
        raise RuntimeError(f"{len(failed)} shard(s) failed (first: shard {first}: {failed[first]}); "
                           f"{summary['shards']}/{len(plan)} committed; run again to resume")
    return summary


def _plan_summary(plan: dict | None) -> dict | None:
    """The plan as summary.json shows it: the rows chosen and the rates that chose them (the cost curve stays in
    _plan.json and in every sample's statistics)."""
    if plan is None:
        return None
    return {k: plan[k] for k in ("rows", "batch", "estimates", "measured", "seconds")}


def _artifacts(summary: dict, errors: Counter) -> None:
    create_table_artifact(table=cost_table(summary) + audit_rows(summary.get("audit")), key="ssdgen-cost",
                          description=f"Cost and throughput of {summary['out']}")
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
    done = out.committed_ids(n_shards)
    failed = {}
    if out.fs.exists(out.path("summary.json")):
        failed = {int(k): v for k, v in json.loads(out.fs.cat_file(out.path("summary.json")))
                  .get("shards_failed", {}).items() if int(k) < n_shards and not done[int(k)]}
    fold = _Fold(out, audit=bool(conf.get("audit")), manifest=False)
    ok = n_failed = 0
    for m in fold.markers():
        ok, n_failed = ok + m["ok"], n_failed + m["failed"]
    cost = price = None
    if len(fold.device_types) == 1:  # a second pass, only for a run on one device type
        price = price_for(fold.device_types.pop())
        cost = run_summary(out.iter_markers(), price, wall_s=fold.wall_s)
    audit = None
    if conf.get("audit"):
        audit = audit_summary(out, fold.audit, conf["audit"], conf.get("audit_tolerance", DEFAULT_TOLERANCE), price)
    committed = done.count(1)
    return {"out": url, "shards_total": n_shards, "shards_done": committed, "shards_failed": failed,
            "shards_pending": n_shards - committed - len(failed), "images_ok": ok, "images_failed": n_failed,
            "cost": cost, "audit": audit}


__all__ = ["GenerateConfig", "generate", "execute", "run_status", "InputError"]
