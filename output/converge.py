"""manifest.parquet and summary.json always come back to the commit markers, the run's only truth.

Both are derived: a run writes them last, from the markers. A run whose last writes failed (a store that
throttled past every retry, a full disk, a Ctrl-C at the end) leaves them naming fewer shards than are
committed, or an attempt a re-decode replaced. So both record which commits they were built from (a
`MarkerDigest`: the count and a hash of every (shard, attempt)), and whoever finds the markers moved on
rebuilds them:

- a run, at its end, always (flows.pipeline);
- a rerun with nothing to decode, when `stale` says they differ from the markers (the CLI then starts the
  flow, which rebuilds them under the lease, instead of saying "nothing to do");
- `ssdgen verify` (`verify` here; `--repair` rebuilds even when they look current), without Prefect or Ray:
  `rebuild`, under the lease.
"""

from __future__ import annotations

from datetime import datetime, timezone

import pyarrow.parquet as pq

from ssdgen.storage.store import CorruptMarker
from .cost import price_from
from .layout import DIGEST_KEY, MANIFEST, Output
from .lease import Lease
from .marker import MarkerDigest
from .reader import manifest_problem, read_manifest
from .summary import committed_totals
from .damage import damaged_shards


def manifest_damage(out: Output) -> str | None:
    """Why manifest.parquet cannot be trusted though it names the right commits (a row edited to name a file
    outside the run, or without its SHA-256: output.reader.manifest_problem), or None."""
    try:
        man = read_manifest(out)
    except ValueError as e:
        return str(e)
    problem = man is not None and manifest_problem(out, man)
    return f"manifest.parquet is damaged: {problem}" if problem else None


def _count(digest: str | None) -> str:
    return "no" if not digest else digest.split(":", 1)[0]


def stale(out: Output, digest: str) -> str | None:
    """Why the manifest or summary does not name exactly the committed shards `digest` stands for; None when
    both do."""
    try:
        summary = out.read_summary()
    except CorruptMarker:
        return "summary.json is not valid JSON"
    n = _count(digest)
    if summary is None:
        return f"summary.json is missing ({n} shards committed)"
    if summary.get("markers_digest") != digest:
        return (f"summary.json was written for {_count(summary.get('markers_digest'))} committed shards, "
                f"the markers now say {n}" if summary.get("markers_digest") else
                "summary.json does not record which commits it counts (written by an older ssdgen)")
    try:
        with out.store.fs.open(out.path(MANIFEST), "rb") as f:
            meta = pq.ParquetFile(f).metadata.metadata or {}
    except FileNotFoundError:
        return f"manifest.parquet is missing ({n} shards committed)"
    except (OSError, ValueError) as e:  # a truncated or overwritten file: pyarrow says so
        return f"manifest.parquet cannot be read ({e})"
    found = meta.get(DIGEST_KEY.encode(), b"").decode()
    if found != digest:
        return f"manifest.parquet names {_count(found)} committed shards, the markers now say {n}"
    return None


def rebuild(out: Output, why: str, by: str) -> dict:
    """Write the manifest and summary again from the markers, outside a run (`ssdgen verify`): the totals and
    cost over every committed shard; what the last run measured of its own speed stays as it recorded it.
    The caller holds the output's lease. Returns the new summary."""
    try:
        old = out.read_summary() or {}
    except CorruptMarker:  # rewritten whole below
        old = {}
    price = out.read_price() or price_from(old.get("device_type") or out.read_config().get("device_type") or "cpu")
    totals, _ = committed_totals(out, price, 0.0)
    speed = ("wall_s", "images_per_s")  # the last run's own figures, which the markers alone cannot give
    summary = old | {k: v for k, v in totals.items() if k not in speed or k not in old}
    summary["rebuilt"] = {"by": by, "why": why, "at": datetime.now(timezone.utc).isoformat()}
    summary.setdefault("shards_total", old.get("shards_total"))
    summary.setdefault("out", out.url)
    summary["summary"] = out.write_summary(summary)
    return summary


def check_run(url: str, deep: bool = True, read_only: bool = False, repair: bool = False) -> dict:
    """`ssdgen verify`: every committed shard checked. Unless `read_only`, under the output's lease (refused
    while a run writes there): damaged shards are set aside, so the next run re-decodes them, and the manifest
    and summary are rebuilt from the markers when they lag them (always with `repair`; output.converge).
    -> {url, shards, damaged: [Damage], deep, stale: why they lagged or None, rebuilt: the summary or None}"""
    out = Output(url)
    out.read_config()  # a clear error where no run is
    sound = MarkerDigest()
    damage = list(damaged_shards(out, deep=deep, sound=sound))
    res = {"url": url, "shards": sound.n + len(damage), "damaged": damage, "deep": deep, "rebuilt": None}
    if read_only:
        return res | {"stale": stale(out, sound.value()) or manifest_damage(out)}
    with Lease(out) as lease:
        out.fence = lease.check
        for d in damage:
            out.set_aside(d.shard)
        res["stale"] = why = stale(out, sound.value()) or manifest_damage(out)
        if why is not None or repair:
            res["rebuilt"] = rebuild(out, why or "asked for (--repair)", by="ssdgen verify")
    return res
