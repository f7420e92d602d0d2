"""`ssdgen generate --dry-run`: what a run would do, from every check a run makes first (flows.prepare) and
nothing more: the inputs, the shards, what is committed and what is pending, the input columns kept, the decode
plan where one is recorded (the run's _plan.json, or --plan's), with --incremental the rows added since the
last run and the shards they become, and the time and cost the pending shards take at a measured rate. Neither
Prefect nor Ray starts, and nothing is written.

The rate is measured, never assumed: this run's own committed shards (images per actor-second of their
markers), else the recorded plan's estimate for its choice (decoders/planner.py measured it on this kind of
device); without either the time is unknown until the first shard ("decide by the first shards": the flow
measures as it goes).
"""

from __future__ import annotations

from datetime import datetime, timezone

from .prepare import prepare
from .settings import RunSettings


def _rate(prep, plan: dict | None) -> tuple[float | None, str]:
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
    return None, "unknown until the first shards are decoded (no committed shard and no recorded plan)"


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
    rate, source = _rate(prep, plan)
    pending_rows = prep.pending_rows
    est_s = pending_rows / (rate * cfg.actors) if rate else None
    usd = None
    if est_s is not None:
        devices_h = est_s * cfg.actors * cfg.devices_per_actor / 3600
        usd = {"on_demand": devices_h * prep.price.on_demand_usd_per_hour,
               "spot": devices_h * prep.price.spot_usd_per_hour if prep.price.spot_usd_per_hour else None}
    return {"out": prep.out.url, "inputs": [{"url": f.url, "rows": f.num_rows} for f in prep.files],
            "rows": prep.shards.rows, "shards": len(prep.shards), "committed": prep.committed, "pending": prep.pending,
            "damaged": [str(d) for d in prep.damaged], "pending_rows": pending_rows,
            "columns": cfg.kept_columns(prep.files).names, "changed": prep.changed, "added": _added(prep),
            "plan": None if plan is None else {"spec": plan["spec"], "why": plan["measurements"].get("why")},
            "images_per_s_per_actor": rate, "rate_source": source, "seconds": est_s, "usd": usd,
            "device_type": cfg.device_type}
