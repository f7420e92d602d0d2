"""`ssdgen generate --dry-run`: what a run would do, from every check a run makes first (flows.prepare) and
nothing more: the inputs, the shards, what is committed and what is pending, the input columns kept, the decode
plan where one is recorded (the run's _plan.json, or --plan's), with --incremental the rows added since the
last run and the shards they become, and the time and cost the pending shards take, start-up included. Neither
Prefect nor Ray starts, no model loads, and nothing is written.

The decode rate is measured, never assumed, and said where it comes from: this run's own committed shards
(images per actor-second of their markers); else the recorded plan's estimate for its choice
(decoders/planner.py measured it on this kind of device); else what the last run with the same settings on this
machine left (flows/machine_record.py): for a calibrated decoder the estimate of the plan it made from this
machine's cached device profile (workers/plan_cache.py), at the batch sizes this job allows; for a concrete one
its measured rate. Without any, the time is unknown until the first shards are decoded. Start-up (the command's
start to the actors' readiness: Prefect, Ray, model loads, the plan) is the last such run's, recorded end to
end, else this output's last run's (summary.json); without either it is left out, and the line says so (#49).
"""

from __future__ import annotations

from datetime import datetime, timezone

from . import machine_record
from .prepare import prepare
from .settings import RunSettings

NO_RATE = ("unknown until the first shards are decoded: no committed shard, no recorded plan, and no run with "
           "these settings on this machine has left a device profile or a rate (the first one does)")


def _rate(prep, plan: dict | None, cfg: RunSettings, record: dict | None) -> tuple[float | None, str]:
    """(images per second per actor, where that figure comes from)."""
    rows = wall = 0.0
    for m in prep.out.iter_markers():
        rows, wall = rows + m.rows, wall + m.wall_s
    if rows and wall > 0:
        return rows / wall, f"measured on this run's {prep.committed} committed shards"
    if plan is not None:
        m = plan["measurements"]
        est = (m.get("estimates") or {}).get(f"{m.get('choice')}@{m.get('batch')}")
        if est:
            return float(est), f"the decode plan's estimate for {m.get('choice')} at batch {m.get('batch')}"
    if record is None:
        return None, NO_RATE
    when = record.get("written_at", "")[:10]
    if cfg.decoder.calibrated and (record.get("plan") or {}).get("measurements"):
        return _planned(record["plan"]["measurements"], cfg, prep.pending_rows, when)
    if record.get("images_per_s_per_actor"):
        return (float(record["images_per_s_per_actor"]), f"measured by the last run with these settings on this "
                f"machine ({record.get('images')} images, {when})")
    return None, NO_RATE


def _planned(m: dict, cfg: RunSettings, rows: int, when: str) -> tuple[float | None, str]:
    """The best estimate the cached profile's plan gives among the batch sizes this job allows (a batch holds at
    most a shard's rows, and the job's: flows.pipeline), as the run would plan from the same profile."""
    most = cfg.batch_size or min(cfg.shard_size, max(1, rows))
    est = {k: float(v) for k, v in (m.get("estimates") or {}).items() if int(k.split("@")[1]) <= most}
    if not est:
        return None, NO_RATE
    best = max(est, key=est.get)
    choice, batch = best.split("@")
    cached = "cached" if m.get("cached") else "measured and cached"
    return est[best], (f"planned from this machine's device profile, {cached} by the last run with these settings "
                       f"on {when} (workers/plan_cache.py): {choice} at batch {batch}")


def _startup(prep, record: dict | None) -> tuple[float | None, str]:
    """(start-up seconds end to end, where that figure comes from)."""
    if record is not None and record.get("startup_s_end_to_end") is not None:
        return float(record["startup_s_end_to_end"]), (f"as the last run with these settings on this machine took "
                                                       f"it, on {record.get('written_at', '')[:10]}")
    recorded = prep.out.read_summary() or {}
    for k in ("startup_s_end_to_end", "startup_s"):  # an older summary has the flow's own only
        if recorded.get(k):
            return float(recorded[k]), f"as this output's last run took it (summary.json's {k})"
    return None, ("start-up not included: no run with these settings on this machine recorded one (Prefect, Ray "
                  "and the model loads take seconds to a minute)")


def _added(prep) -> dict | None:
    """With --incremental over grown inputs: the rows added since the last run and the shards they become."""
    if not prep.added:
        return None
    return {"rows": sum(b - a for _, a, b in prep.added), "shards": [prep.added_shards[0], prep.added_shards[-1]],
            "ranges": [{"url": u, "start": a, "stop": b} for u, a, b in prep.added]}


def dry_run(cfg: RunSettings) -> dict:
    """What `generate` would do with these settings, checked as a run checks them (errors are one line)."""
    from ssdgen.output.reader import read_plan_at
    cfg = cfg.dated(datetime.now(timezone.utc))  # `{date}` as a run started now fills it
    prep = prepare(cfg)
    plan = prep.out.read_plan() or (read_plan_at(cfg.plan) if cfg.plan else None)
    record = machine_record.load(cfg)
    rate, source = _rate(prep, plan, cfg, record)
    startup, startup_source = _startup(prep, record) if prep.pending else (0.0, "nothing to start")
    pending_rows = prep.pending_rows
    actors = max(1, min(cfg.actors, prep.pending))  # a run starts an actor per pending shard at most
    decode_s = 0.0 if not pending_rows else pending_rows / (rate * actors) if rate else None
    est_s = None if decode_s is None else decode_s + (startup or 0.0)
    usd = None
    if est_s is not None:  # the actors' devices for the whole time, start-up included (their model loads are)
        devices_h = est_s * actors * cfg.devices_per_actor / 3600
        usd = {"on_demand": devices_h * prep.price.on_demand_usd_per_hour,
               "spot": devices_h * prep.price.spot_usd_per_hour if prep.price.spot_usd_per_hour else None}
    return {"out": prep.out.url, "inputs": [{"url": f.url, "rows": f.num_rows} for f in prep.files],
            "rows": prep.shards.rows, "shards": len(prep.shards), "committed": prep.committed, "pending": prep.pending,
            "damaged": [str(d) for d in prep.damaged], "pending_rows": pending_rows,
            "columns": cfg.kept_columns(prep.files).names, "changed": prep.changed, "added": _added(prep),
            "plan": None if plan is None else {"spec": plan["spec"], "why": plan["measurements"].get("why")},
            "images_per_s_per_actor": rate, "rate_source": source, "actors": actors, "decode_s": decode_s,
            "startup_s": startup, "startup_source": startup_source, "seconds": est_s, "usd": usd,
            "device_type": cfg.device_type}
