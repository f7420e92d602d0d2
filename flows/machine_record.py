"""What the last run with the same settings measured on this machine, kept for `ssdgen generate --dry-run` (#49:
a dry run of a new output said "unknown until the first shards are decoded", although the machine's device
profile was cached and the real run planned from it in 0.0 s, and it left start-up out).

A record holds the run's start-up end to end (the command's start to its actors' readiness: imports, checks,
Prefect's server, Ray, model loads, the plan), its decode rate per actor after start-up, and its decode plan
(`_plan.json`: the concrete spec and the measurements it was made from, the device profile and acceptance among
them: workers/plan_cache.py's cached ones, or measured then and cached). It is keyed by what decides those
figures and is known before any model loads: this machine's hardware, torch's version, the decode spec, the
model and its precision, the objective, the batch size asked for, the actors' CPUs and GPUs and the device type;
not the prompts or the output. One small JSON file per key under $SSDGEN_CACHE (default ~/.cache/ssdgen)/runs,
written whole through a rename at a run's end, best effort; a file that cannot be read is no record.
"""

from __future__ import annotations

import hashlib
import json
import os
from datetime import datetime, timezone
from pathlib import Path

VERSION = 1  # bump when a record's shape or meaning changes
SETTINGS = ("model", "dtype", "objective", "batch_size", "cpus_per_actor", "gpus_per_actor", "device_type")


def folder() -> Path:
    return Path(os.environ.get("SSDGEN_CACHE") or Path.home() / ".cache" / "ssdgen") / "runs"


def key(cfg) -> str:
    """The settings' key on this machine (module doc). cfg: flows.settings.RunSettings."""
    from importlib.metadata import PackageNotFoundError, version

    from ssdgen.workers.plan_cache import hardware
    try:
        torch = version("torch")
    except PackageNotFoundError:
        torch = ""
    parts = [VERSION, hardware(), torch, str(cfg.decoder), *(getattr(cfg, k) for k in SETTINGS)]
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:24]


def save(cfg, summary: dict, plan: dict | None) -> None:
    """Record a finished run's figures (its summary.json, its `_plan.json`); a run that decoded nothing, or was
    stopped, records nothing. A cache that cannot be written is skipped."""
    images, shards = summary.get("images_this_run") or 0, summary.get("shards_run_now") or 0
    steady = summary.get("images_per_s_steady")
    if not images or not shards or summary.get("interrupted") or summary.get("startup_s_end_to_end") is None:
        return
    record = {"version": VERSION, "written_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "startup_s_end_to_end": summary["startup_s_end_to_end"], "images": images,
              # the pool ran one actor per shard at most (flows.pipeline._pool_size)
              "images_per_s_per_actor": steady / min(cfg.actors, shards) if steady else None,
              "batch_size": summary.get("batch_size"), "plan": plan}
    path = folder() / f"{key(cfg)}.json"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(record, default=str))
        os.replace(tmp, path)
    except OSError:
        pass


def load(cfg) -> dict | None:
    """The record of the last run with these settings on this machine, or None."""
    try:
        record = json.loads((folder() / f"{key(cfg)}.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("version") != VERSION:
        return None
    return record
