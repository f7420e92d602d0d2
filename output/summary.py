"""summary.json: what a run's summary holds, spelled in one place.

Two parts. `committed_totals` folds the commit markers once (output.reader.MarkerFold): the totals and cost over
every committed shard (output.cost.run_summary), the rows by decoder and by error reason, and the manifest written
from the same stream, with the digest of the commits it names (output.converge). A run passes the shards it knows
are committed (its own commits among them): where the store's listing does not show their markers yet (a listing
that lags), they are read by name and named in `commits_not_listed`, never dropped. The fold is checked against a
listing taken first (output.damage.FilesCheck), whose digest lets the next resume skip reading the markers.

`this_run` is what only the run itself measured: its wall time and start-up, its images and commits, its failures
and the settings that decided its images. A run writes both (flows.pipeline); `ssdgen verify --repair` rebuilds
the first and keeps the second as the last run recorded it (output.converge.rebuild).
"""

from __future__ import annotations

from datetime import datetime, timezone

from ssdgen.storage.store import StorageError

from .cost import Price, run_summary
from .layout import Output
from .reader import MarkerFold, plan_summary
from .damage import FilesCheck, listing


def committed_totals(out: Output, price: Price, wall_s: float, audit: bool = False,
                     known: bytearray | None = None) -> tuple[dict, MarkerFold]:
    """(the totals over every committed shard, with the manifest's URL; the fold, whose errors, reasons and
    audit rows the caller may use). Writes manifest.parquet. known: flags of the shards the caller knows are
    committed (a run's `done`), whose markers are read by name where the listing does not show them."""
    check = FilesCheck(out, listing(out))
    fold = MarkerFold(out, audit=audit, known=known)
    totals = run_summary((check.see(m).to_dict() for m in fold.markers()), price, wall_s)
    manifest = final_write(out, fold.manifest.close, totals["shards"])
    return totals | {"shards_committed": totals["shards"], "errors_by_reason": dict(fold.reasons.most_common()),
                     "rows_by_decoder": dict(fold.decoders.most_common()),
                     "markers_digest": fold.manifest.digest.value(), "manifest": manifest,
                     "listing_digest": None if fold.unlisted else check.digest(),
                     "commits_not_listed": fold.unlisted}, fold


def unlisted_line(shards: list[int]) -> str:
    """What a run says of commits the store's listing does not show (`commits_not_listed`), in one line."""
    few = ", ".join(map(str, shards[:20])) + (", ..." if len(shards) > 20 else "")
    return (f"the store's listing does not show {len(shards)} committed shard(s) yet ({few}): a listing that lags; "
            "their markers read back by name, so manifest.parquet and summary.json name them")


def this_run(cfg, ran: dict, wall_s: float, shards_total: int, redecoded: list[int], removed: int,
             plan: dict | None) -> dict:
    """What the run measured of itself. cfg: its settings (flows.settings.RunSettings); ran: what its pool did
    (flows.pipeline: images, commits, startup_s, failed, commit_latency_s, interrupted, batch_size, before_flow_s:
    the command's seconds before the flow); redecoded: the damaged shards it set aside; removed: the attempts its
    gc removed; plan: `_plan.json`. wall_s is the flow's; the end-to-end figures add what came before it."""
    images, startup_s = ran["images"], ran["startup_s"]
    steady = wall_s - startup_s  # start-up (plan, Ray, actors, model loads) is paid once; steady state is not
    end_to_end = wall_s + ran.get("before_flow_s", 0.0)  # from the command's start, as the user waited
    return {"images_this_run": images, "images_per_s": images / wall_s if wall_s > 0 else None,
            "startup_s": startup_s, "wall_s_end_to_end": end_to_end, "startup_s_end_to_end": end_to_end - steady,
            "images_per_s_end_to_end": images / end_to_end if end_to_end > 0 else None,
            "images_per_s_steady": images / steady if ran["commits"] and steady > 0 else None,
            "out": cfg.out, "shards_total": shards_total, "shards_run_now": ran["commits"],
            "shards_failed": {str(k): v for k, v in ran["failed"].items()}, "shards_redecoded": redecoded,
            "attempts_removed": removed, "decoder": str(cfg.decoder), "model": cfg.model,
            "batch_size": ran.get("batch_size", cfg.batch_size), "image_format": cfg.image_format,
            "format": cfg.format, "actors": cfg.actors, "device_type": cfg.device_type,
            "commit_latency_s": ran["commit_latency_s"], "decode_plan": plan_summary(plan),
            "interrupted": ran.get("interrupted") is not None,
            # other processes' CPU on the machine while it decoded (workers/cpus.py RunLoad), with its warning
            "machine_load": ran.get("machine_load"), "finished_at": datetime.now(timezone.utc).isoformat()}


def write_summary(out: Output, summary: dict) -> str:
    """summary.json replaced whole; its URL."""
    return final_write(out, out.write_summary, summary.get("shards_committed", 0), summary)


def final_write(out: Output, write, shards: int, *args) -> str:
    """The manifest's or the summary's write (already retried through transient faults, storage.retry); when it
    still fails, one line that says the commits are safe and how the files come back (output.converge)."""
    try:
        return write(*args)
    except OSError as e:
        raise StorageError(e.errno, f"{e}: could not write manifest.parquet and summary.json; the {shards} "
                           f"committed shards are safe, and the next `ssdgen generate` with the same arguments, "
                           f"or `ssdgen verify --repair {out.url}`, rebuilds them from the commit markers") from None
