"""`ssdgen generate --dry-run`'s time and cost (#49 item 3): for a new output it said "unknown until the first
shards are decoded" although the machine's device profile was cached (the real run planned from it in 0.0 s),
printed "0.0 min, $0.0000" for small runs, and left start-up out. It now estimates from what the last run with the
same settings left on this machine (flows/machine_record.py: its plan from the cached profile, its rate, its
start-up), says where each figure comes from and when there is none, and prints the digits that matter."""

import re

import pytest
from pipeline_helpers import eval_rows, write_parquet

from ssdgen.flows import machine_record
from ssdgen.flows.dry_run import dry_run
from ssdgen.flows.settings import RunSettings


@pytest.fixture
def job(tmp_path, monkeypatch):
    """10 prompts in shards of 4 (3 shards, so 2 actors), a new output, an empty cache."""
    monkeypatch.setenv("SSDGEN_CACHE", str(tmp_path / "cache"))
    write_parquet(None, tmp_path / "p.parquet", eval_rows(10))
    return lambda **kw: RunSettings(prompts=(str(tmp_path / "p.parquet"),), out=str(tmp_path / "run"),
                                    shard_size=4, **kw)


def _ran(summary: dict) -> dict:
    return {"images_this_run": 8, "shards_run_now": 2, "images_per_s_steady": 3.0, "startup_s_end_to_end": 9.5,
            "batch_size": 4} | summary


def test_without_a_record_the_time_is_unknown_and_says_why(job):
    d = dry_run(job(decoder="ar"))
    assert d["seconds"] is None and d["rate_source"].startswith("unknown until the first shards are decoded")
    assert "no run with these settings on this machine" in d["rate_source"]
    assert d["startup_s"] is None and d["startup_source"].startswith("start-up not included")


def test_a_calibrated_decoder_is_estimated_from_the_cached_profiles_plan_at_the_batches_this_job_allows(job):
    cfg = job()  # ssd+csd, calibrated
    plan = {"spec": "ssd+csd:calibrated=false:rows=1", "measurements": {
        "choice": "w5", "batch": 8, "cached": True,
        "estimates": {"ar@1": 0.5, "ar@4": 1.5, "w5@4": 2.5, "w5@8": 5.0}}}  # batch 8 > a shard's 4 rows
    machine_record.save(cfg, _ran({}), plan)
    d = dry_run(cfg)
    assert d["images_per_s_per_actor"] == 2.5 and d["actors"] == 2
    assert d["rate_source"].startswith("planned from this machine's device profile, cached by the last run with "
                                       "these settings on ") and d["rate_source"].endswith(": w5 at batch 4")
    assert d["startup_s"] == 9.5 and "the last run with these settings on this machine" in d["startup_source"]
    assert d["decode_s"] == pytest.approx(10 / (2.5 * 2)) and d["seconds"] == pytest.approx(9.5 + 2.0)
    per_h = d["usd"]["on_demand"] / (d["seconds"] * 2 / 3600)  # 2 actors x 1 vCPU, start-up included
    assert per_h == pytest.approx(cfg.check().on_demand_usd_per_hour)


def test_a_concrete_decoder_is_estimated_from_the_last_runs_measured_rate(job):
    cfg = job(decoder="ar")
    machine_record.save(cfg, _ran({}), None)
    d = dry_run(cfg)
    assert d["images_per_s_per_actor"] == pytest.approx(3.0 / 2)  # the pool's 3 images/s over its 2 actors
    assert d["rate_source"].startswith("measured by the last run with these settings on this machine (8 images")
    machine_record.save(cfg, _ran({"interrupted": True, "startup_s_end_to_end": 1.0}), None)  # not recorded
    assert dry_run(cfg)["startup_s"] == 9.5
    assert dry_run(job(decoder="ar", batch_size=2))["seconds"] is None  # other settings: another record


def test_the_estimate_prints_with_the_digits_that_matter(job, capsys):
    from ssdgen.cli.run import _print_estimate
    cfg = job(decoder="ar")
    machine_record.save(cfg, _ran({"images_per_s_steady": 30.0, "startup_s_end_to_end": 8.04}), None)
    _print_estimate(dry_run(cfg))
    out = capsys.readouterr().out
    assert "estimate: about 8.4 s on 2 actor(s), start-up included" in out
    assert "start-up 8 s (as the last run with these settings on this machine took it, on " in out
    assert "decoding 10 prompts: 0.33 s at 15 images/s per actor" in out
    assert "0.0 min" not in out and not re.search(r"\$0\.0000\b", out) and "cost: $0.000" in out
