"""`ssdgen generate --audit FRACTION`: a fidelity audit of a lossy decoder inside the pipeline.

A prompt is audited when a hash of its prompt_id falls below FRACTION (`is_audited`): the choice depends on
the id alone, not on sharding, batch-mates or attempts, so a retried or resumed shard audits exactly the same
prompts. For each audited prompt the actor (workers.decode_worker) scores the main decoder's tokens under the
target (`decoders.fidelity.target_nll`) and decodes the prompt again with `ar` from an independent seed
(seed + decoders.recipes.REFERENCE_SEED_OFFSET, the seeds `ssdgen fidelity` gives its AR reference set) and
scores those. The rows go to `{attempt}/audit.parquet`, listed in the shard's commit marker like its images
and stats, so they are committed exactly once with the shard; a resume skips committed shards and so never
audits a prompt twice.

The audit's seconds are timed apart inside the actor and taken out of the shard's allocated time: the
images' cost is what they cost, and the audit is its own line (`output.cost.shard_cost` at the same price).
The summary reads the committed audit files back from storage (via the markers) and reports the mean
per-prompt NLL gap (decoder - ar, nats/token) with a 95% paired-bootstrap interval over prompts; the gap is
within tolerance when the whole interval lies inside +-tolerance. FD is not computed here ("fd": null): it
needs the scorer and many more samples than an audit usually holds.
"""

from __future__ import annotations

import hashlib

import pyarrow as pa
import pyarrow.parquet as pq

from ssdgen.decoders.recipes import REFERENCE_SEED_OFFSET

from .cost import Price, shard_cost, usd

AUDIT_FILE = "audit.parquet"
DEFAULT_TOLERANCE = 0.15  # nats/token, as `ssdgen fidelity --tolerance`
AUDIT_SCHEMA = pa.schema([
    ("prompt_id", pa.string()), ("seed", pa.int64()), ("decoder", pa.string()), ("nll_per_token", pa.float64()),
    ("ar_seed", pa.int64()), ("ar_nll_per_token", pa.float64()), ("forwards", pa.int32()),
    ("ar_forwards", pa.int32()), ("audit_seconds", pa.float64()),
])
# A bootstrap costs n_boot x n draws: cap them so a large audit's interval takes seconds, not minutes; a
# percentile interval is stable well before 10,000 resamples.
MAX_BOOT_INDICES = 20_000_000


def audit_key(prompt_id: str) -> float:
    """The prompt's place in [0, 1): the first 8 bytes of sha256(prompt_id) as an integer / 2**64."""
    return int.from_bytes(hashlib.sha256(prompt_id.encode()).digest()[:8], "big") / 2**64


def is_audited(prompt_id: str, fraction: float) -> bool:
    return fraction > 0 and audit_key(prompt_id) < fraction


def check_audit(fraction: float, tolerance: float) -> None:
    """`not a <= x <= b` also rejects NaN."""
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"--audit must be a fraction in [0, 1] (0 = no audit), got {fraction}")
    if not tolerance > 0 or tolerance == float("inf"):
        raise ValueError(f"--audit-tolerance must be a finite number > 0 (nats/token), got {tolerance}")


def mark_rows(rows: list[dict], fraction: float) -> int:
    """Give each audited row (with no input error) its AR seed, `audit_seed`; the actor audits exactly these.
    Returns how many were marked."""
    n = 0
    for r in rows:
        if not r.get("error") and is_audited(r["prompt_id"], fraction):
            seed = int(r["seed"]) + REFERENCE_SEED_OFFSET
            # derived seeds use 63 bits; wrap the few near the top so the AR seed still fits an int64
            r["audit_seed"] = seed - 2**63 if seed >= 2**63 else seed
            n += 1
    return n


def write_audit(out, attempt: str, table: pa.Table) -> dict:
    """A shard's audit rows as `audit.parquet` under its attempt (output.layout.Output); its record for the
    marker."""
    return out.store.write_table(f"{attempt}/{AUDIT_FILE}", table)


def audit_table(rows: list[dict], label: str) -> pa.Table:
    return pa.Table.from_pylist([r | {"decoder": label} for r in rows], schema=AUDIT_SCHEMA)


def shard_audit(results: list, devices: float) -> tuple[list[dict], dict]:
    """A shard's batch results (workers.results.BatchResult) -> its audit rows and the marker's `audit` record
    (seconds, device-seconds)."""
    rows = [a for r in results for a in r.audit]
    seconds = sum(r.audit_s for r in results)
    return rows, {"rows": len(rows), "seconds": seconds, "device_seconds": seconds * devices}


def read_audit(out, committed: dict) -> pa.Table:
    """The committed audit rows: the audit file each marker (output.marker.Marker) names, never an unmarked
    attempt's."""
    tables = []
    for sid in sorted(committed):
        if (f := committed[sid].file("audit")) is not None:
            with out.store.fs.open(out.path(f.path), "rb") as fh:
                # use_threads=False: a Python file (inputs.files._given_ids says why)
                tables.append(pq.read_table(fh, use_threads=False).cast(AUDIT_SCHEMA))
    return pa.concat_tables(tables) if tables else AUDIT_SCHEMA.empty_table()


def _cost(committed: dict, price: Price | None) -> dict:
    seconds = dev_s = od = 0.0
    spot = None if price is None or price.spot_usd_per_hour is None else 0.0
    for sid, m in committed.items():
        a = m.audit or {}
        seconds += a.get("seconds", 0.0)
        dev_s += a.get("device_seconds", 0.0)
        if price is not None:
            c = shard_cost({"shard": sid, "device_seconds_allocated": a.get("device_seconds", 0.0)}, price)
            od += c["usd_on_demand"]
            spot = None if spot is None else spot + c["usd_spot"]
    return {"audit_seconds": seconds, "device_seconds": dev_s,
            "usd_on_demand": od if price is not None else None, "usd_spot": spot}


def summarize(out, committed: dict, fraction: float, tolerance: float, price: Price | None) -> dict:
    """summary.json's "audit": the NLL gap of the committed audit rows with its 95% interval, and the cost."""
    import numpy as np
    from ssdgen.decoders.fidelity import paired_gap
    t = read_audit(out, committed)
    nll, ar = (np.asarray(t.column(c).to_pylist(), np.float64) for c in ("nll_per_token", "ar_nll_per_token"))
    n = len(nll)
    res = {"n": n, "fraction": fraction, "tolerance": tolerance, "nll_per_token": None, "ar_nll_per_token": None,
           "nll_gap": None, "nll_gap_ci": None, "within_tolerance": None, "fd": None,
           "decoder": t.column("decoder")[0].as_py() if n else None}
    if n:
        res |= {"nll_per_token": float(nll.mean()), "ar_nll_per_token": float(ar.mean()),
                "nll_gap": float((nll - ar).mean())}
    if n >= 2:  # one prompt has no spread: no interval, no verdict
        g = paired_gap(nll, ar, 0.95, n_boot=max(200, min(10_000, MAX_BOOT_INDICES // n)))
        lo, hi = g["ci"]
        res |= {"nll_gap_ci": [lo, hi], "within_tolerance": bool(-tolerance <= lo and hi <= tolerance)}
    return res | _cost(committed, price)


def warning(a: dict | None) -> str | None:
    """The WARNING line for a gap whose interval is not inside the tolerance (None when there is nothing to say)."""
    if not a or a["n"] == 0:
        return None
    if a["within_tolerance"] is None:
        return (f"audit: only {a['n']} audited prompt(s), too few for an interval; NLL gap "
                f"{a['nll_gap']:+.4f} nats/token is unchecked against the tolerance {a['tolerance']}")
    if a["within_tolerance"]:
        return None
    lo, hi = a["nll_gap_ci"]
    return (f"audit: {a['decoder']} NLL gap {a['nll_gap']:+.4f} nats/token, 95% CI [{lo:+.4f}, {hi:+.4f}] over "
            f"{a['n']} prompts, is not within +-{a['tolerance']}: its images depart from the target's distribution")


def audit_rows(a: dict | None) -> list[dict]:
    """{"metric", "value"} rows for the cost artifact and the CLI (nothing when the run has no audit)."""
    if not a:
        return []
    cost = usd(a["usd_on_demand"])
    gap = "n/a" if a["nll_gap"] is None else f"{a['nll_gap']:+.4f} nats/token"
    ci = "n/a" if a["nll_gap_ci"] is None else f"[{a['nll_gap_ci'][0]:+.4f}, {a['nll_gap_ci'][1]:+.4f}]"
    verdict = {None: "n/a", True: "yes", False: "NO"}[a["within_tolerance"]]
    rows = [("audit prompts", f"{a['n']:,} (fraction {a['fraction']})"),
            ("audit NLL gap (decoder - ar)", gap), ("audit NLL gap 95% CI", ci),
            (f"audit within +-{a['tolerance']}", verdict), ("audit seconds", f"{a['audit_seconds']:,.1f} s"),
            ("audit cost on-demand", f"{cost} (apart from the images' cost)")]
    return [{"metric": m, "value": v} for m, v in rows]
