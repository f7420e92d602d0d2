"""output/cost.py: the shipped price table, its parser's errors, and run accounting by hand."""

import dataclasses
import datetime as dt
import json
import math
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest
from ssdgen.output.cost import (
    COLUMNS,
    DEFAULT_PRICES,
    Price,
    cost_table,
    load_prices,
    price_for,
    run_summary,
    shard_cost,
    usd,
)

REPO = Path(__file__).resolve().parents[1]
HEADER = ",".join(COLUMNS)


def _price(spot=1.8):
    # 3.6 $/device-hour = 0.001 $/device-second; spot 0.0005 $/device-second.
    return Price(device_type="test", unit="gpu", devices_per_instance=1, instance_type="t.x",
                 on_demand_usd_per_hour=3.6, spot_usd_per_hour=spot, source="hand-made",
                 as_of="2026-11-29")


def _record(shard, rows, ok, failed, wall_s, busy_s, load_s, devices):
    return {"shard": shard, "rows": rows, "ok": ok, "failed": failed, "wall_s": wall_s,
            "busy_s": busy_s, "load_s": load_s, "devices": devices,
            "device_seconds_allocated": (wall_s + load_s) * devices,
            "device_seconds_busy": busy_s * devices}


def _two_shards():
    return [_record(0, 100, 90, 10, wall_s=50.0, busy_s=40.0, load_s=10.0, devices=2),
            _record(1, 100, 100, 0, wall_s=30.0, busy_s=25.0, load_s=10.0, devices=1)]


def _write(tmp_path, text):
    p = tmp_path / "prices.csv"
    p.write_text(text)
    return p


GOOD_ROW = "x1,gpu,8,x1.big,2.5,1.0,https://example.com/p,2026-01-02"


# ------------------------------------------------------------------------------- the price table

def test_default_prices_path_is_the_package_table():
    # package data next to output/cost.py, so an installed wheel has it (pyproject ships it; infra/wheel-smoke.sh)
    assert DEFAULT_PRICES == REPO / "output" / "prices.csv"
    assert '"ssdgen.output" = ["prices.csv"]' in (REPO / "pyproject.toml").read_text()
    assert DEFAULT_PRICES.is_file()
    assert DEFAULT_PRICES.read_text().splitlines()[0] == HEADER


def test_shipped_prices_load_and_are_sane():
    prices = load_prices()
    for needed in ("h100", "a100-40gb", "l4", "a10g", "h200", "cpu"):
        assert needed in prices, needed
    for name, p in prices.items():
        assert p.device_type == name
        assert p.unit in ("gpu", "vcpu")
        assert p.devices_per_instance >= 1
        assert p.on_demand_usd_per_hour > 0 and math.isfinite(p.on_demand_usd_per_hour)
        if p.spot_usd_per_hour is not None:
            assert 0 < p.spot_usd_per_hour <= p.on_demand_usd_per_hour, name
        assert p.source.strip(), name
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", p.as_of), p.as_of
        dt.date.fromisoformat(p.as_of)
    assert prices["cpu"].unit == "vcpu"
    assert all(prices[k].unit == "gpu" for k in ("h100", "a100-40gb", "l4", "a10g", "h200"))


def test_price_for_known_and_unknown():
    assert price_for("h100").device_type == "h100"
    assert price_for(" H100 ").device_type == "h100"
    with pytest.raises(ValueError) as e:
        price_for("tpu-v9")
    msg = str(e.value)
    assert "tpu-v9" in msg
    for known in load_prices():
        assert known in msg


def test_custom_table_parses(tmp_path):
    p = _write(tmp_path, f"{HEADER}\n{GOOD_ROW}\ny1,vcpu,2,y1.small,0.05,,unverified: guess,2026-02-03\n")
    prices = load_prices(p)
    assert prices["x1"] == Price("x1", "gpu", 8, "x1.big", 2.5, 1.0, "https://example.com/p",
                                 "2026-01-02")
    assert prices["y1"].spot_usd_per_hour is None
    assert price_for("y1", p).on_demand_usd_per_hour == 0.05


def test_missing_column_names_file_line_and_column(tmp_path):
    header = HEADER.replace(",spot_usd_per_hour", "")
    p = _write(tmp_path, f"{header}\nx1,gpu,8,x1.big,2.5,src,2026-01-02\n")
    with pytest.raises(ValueError) as e:
        load_prices(p)
    msg = str(e.value)
    assert str(p) in msg and "line 1" in msg and "spot_usd_per_hour" in msg


def test_non_numeric_price_names_the_line(tmp_path):
    bad = "x2,gpu,8,x2.big,cheap,1.0,src,2026-01-02"
    p = _write(tmp_path, f"{HEADER}\n{GOOD_ROW}\n{bad}\n")
    with pytest.raises(ValueError) as e:
        load_prices(p)
    msg = str(e.value)
    assert str(p) in msg and "line 3" in msg and "on_demand_usd_per_hour" in msg and "cheap" in msg


@pytest.mark.parametrize("row, column", [
    ("x2,gpu,8,x2.big,0,1.0,src,2026-01-02", "on_demand_usd_per_hour"),
    ("x2,gpu,8,x2.big,-1,1.0,src,2026-01-02", "on_demand_usd_per_hour"),
    ("x2,gpu,8,x2.big,2.5,nan,src,2026-01-02", "spot_usd_per_hour"),
    ("x2,gpu,eight,x2.big,2.5,1.0,src,2026-01-02", "devices_per_instance"),
    ("x2,gpu,0,x2.big,2.5,1.0,src,2026-01-02", "devices_per_instance"),
    ("x2,tpu,8,x2.big,2.5,1.0,src,2026-01-02", "unit"),
    ("x2,gpu,8,x2.big,2.5,1.0,,2026-01-02", "source"),
    ("x2,gpu,8,x2.big,2.5,1.0,src,29/11/2026", "as_of"),
    ("x1,gpu,8,x1.big,2.5,1.0,src,2026-01-02", "device_type"),  # duplicate of GOOD_ROW
])
def test_malformed_rows_name_line_and_column(tmp_path, row, column):
    p = _write(tmp_path, f"{HEADER}\n{GOOD_ROW}\n{row}\n")
    with pytest.raises(ValueError) as e:
        load_prices(p)
    msg = str(e.value)
    assert str(p) in msg and "line 3" in msg and repr(column) in msg


def test_empty_table_is_an_error(tmp_path):
    with pytest.raises(ValueError):
        load_prices(_write(tmp_path, ""))
    with pytest.raises(ValueError):
        load_prices(_write(tmp_path, HEADER + "\n"))


# ------------------------------------------------------------------------------------ accounting

def test_shard_cost_by_hand():
    r0, r1 = _two_shards()
    # shard 0: (50 + 10) s x 2 devices = 120 device-s x $0.001 = $0.12; spot $0.06
    assert shard_cost(r0, _price()) == pytest.approx({"usd_on_demand": 0.12, "usd_spot": 0.06})
    # shard 1: (30 + 10) x 1 = 40 device-s -> $0.04 / $0.02
    assert shard_cost(r1, _price()) == pytest.approx({"usd_on_demand": 0.04, "usd_spot": 0.02})
    assert shard_cost(r0, _price(spot=None)) == {"usd_on_demand": pytest.approx(0.12),
                                                 "usd_spot": None}


def test_run_summary_by_hand():
    s = run_summary(_two_shards(), _price(), wall_s=70.0)
    # allocated = 120 + 40 = 160 device-s; busy = 40*2 + 25*1 = 105; load = 10*2 + 10*1 = 30
    # ok = 190, failed = 10; cost = 160 x $0.001 = $0.16 (spot $0.08)
    assert s["shards"] == 2
    assert s["images_ok"] == 190 and s["images_failed"] == 10
    assert s["wall_s"] == 70.0
    assert s["device_seconds_allocated"] == pytest.approx(160.0)
    assert s["device_seconds_busy"] == pytest.approx(105.0)
    assert s["model_load_device_seconds"] == pytest.approx(30.0)
    assert s["images_per_s"] == pytest.approx(190 / 70)
    assert s["images_per_s_per_device"] == pytest.approx(190 / 160)  # 1.1875
    assert s["utilization"] == pytest.approx(105 / 160)  # 0.65625
    assert s["overhead_share"] == pytest.approx(55 / 160)  # 0.34375
    assert s["usd_on_demand"] == pytest.approx(0.16)
    assert s["usd_spot"] == pytest.approx(0.08)
    assert s["usd_per_1k_images_on_demand"] == pytest.approx(0.16 / 0.19)  # $0.8421 per 1k
    assert s["usd_per_1k_images_spot"] == pytest.approx(0.08 / 0.19)
    assert s["price"] == dataclasses.asdict(_price())
    assert s["reconciles"] is True
    json.dumps(s, allow_nan=False)


def test_failed_samples_cost_money():
    """Same device time, fewer good images: $ per 1k goes up, the bill does not go down."""
    good = [_record(0, 100, 100, 0, 50.0, 40.0, 10.0, 1)]
    bad = [_record(0, 100, 50, 50, 50.0, 40.0, 10.0, 1)]
    s_good, s_bad = (run_summary(r, _price(), 60.0) for r in (good, bad))
    assert s_bad["usd_on_demand"] == s_good["usd_on_demand"]
    assert s_bad["usd_per_1k_images_on_demand"] == pytest.approx(
        2 * s_good["usd_per_1k_images_on_demand"])


def test_reconciles_for_random_records():
    rng = random.Random(1234)
    prices = load_prices()
    for trial in range(20):
        recs = []
        for i in range(rng.randint(1, 60)):
            wall, load = rng.uniform(0.01, 5e4), rng.uniform(0, 600)
            busy = rng.uniform(0, wall)
            recs.append(_record(i, 1000, rng.randint(0, 1000), rng.randint(0, 50), wall, busy,
                                load, rng.choice([1, 2, 4, 8, 0.5, 1.25])))
        price = prices[rng.choice(sorted(prices))]
        s = run_summary(recs, price, wall_s=rng.uniform(1, 1e5))
        assert s["reconciles"] is True, trial
        by_shard = math.fsum(shard_cost(r, price)["usd_on_demand"] for r in recs)
        assert math.isclose(by_shard, s["usd_on_demand"], rel_tol=1e-9)
        assert 0 <= s["utilization"] <= 1
        json.dumps(s, allow_nan=False)


def test_zero_images_gives_none_not_nan():
    recs = [_record(0, 10, 0, 10, 20.0, 5.0, 5.0, 1)]
    s = run_summary(recs, _price(), wall_s=25.0)
    assert s["images_ok"] == 0
    assert s["usd_on_demand"] == pytest.approx(0.025)
    assert s["usd_per_1k_images_on_demand"] is None
    assert s["usd_per_1k_images_spot"] is None
    assert s["images_per_s"] == 0.0 and s["images_per_s_per_device"] == 0.0
    json.dumps(s, allow_nan=False)
    assert all(r["value"] for r in cost_table(s))


def test_no_records_and_zero_wall():
    s = run_summary([], _price(), wall_s=0.0)
    assert s["shards"] == 0 and s["images_ok"] == 0
    assert s["images_per_s"] is None and s["images_per_s_per_device"] is None
    assert s["utilization"] is None and s["overhead_share"] is None
    assert s["usd_on_demand"] == 0.0 and s["usd_spot"] == 0.0
    assert s["reconciles"] is True
    json.dumps(s, allow_nan=False)


def test_no_spot_price():
    s = run_summary(_two_shards(), _price(spot=None), wall_s=70.0)
    assert s["usd_spot"] is None and s["usd_per_1k_images_spot"] is None
    assert s["usd_on_demand"] == pytest.approx(0.16)
    assert s["reconciles"] is True
    rows = {r["metric"]: r["value"] for r in cost_table(s)}
    assert rows["cost spot"] == "n/a" and rows["$ per 1k images spot"] == "n/a"


@pytest.mark.parametrize("mutate", [
    lambda r: r.pop("device_seconds_allocated"),
    lambda r: r.update(ok="many"),
    lambda r: r.update(busy_s=-1.0),
    lambda r: r.update(wall_s=float("nan")),
])
def test_bad_records_raise(mutate):
    recs = _two_shards()
    mutate(recs[1])
    with pytest.raises(ValueError, match="shard record 1"):
        run_summary(recs, _price(), wall_s=70.0)


def test_bad_wall_raises():
    with pytest.raises(ValueError):
        run_summary(_two_shards(), _price(), wall_s=-1.0)


def test_cost_table_rows():
    s = run_summary(_two_shards(), _price(), wall_s=70.0)
    rows = cost_table(s)
    assert all(set(r) == {"metric", "value"} and isinstance(r["value"], str) for r in rows)
    by = {r["metric"]: r["value"] for r in rows}
    assert by["images ok"] == "190"
    assert by["utilization"] == "65.6 %"
    assert by["cost on-demand"] == "$0.16"
    assert by["$ per 1k images on-demand"] == "$0.8421"
    assert by["per-shard costs reconcile"] == "yes"
    assert "hand-made" in by["price source"] and "2026-11-29" in by["price source"]
    json.dumps(rows)


@pytest.mark.parametrize("v, text", [
    (0.00012, "$0.00012"), (0.000123456, "$0.0001235"), (1.2e-9, "$0.0000000012"), (0.16, "$0.16"),
    (0.1, "$0.10"), (0.8421052, "$0.8421"), (0.99995, "$1.00"), (1234.5, "$1,234.50"), (0, "$0.00"),
    (None, "n/a"), (float("nan"), "n/a"),
])
def test_dollars_keep_significant_digits_in_plain_decimals(v, text):
    """#49: `status` printed a small run's cost as $0.0000; a nonzero cost keeps four significant digits."""
    assert usd(v) == text


def test_status_shows_a_small_runs_cost_with_significant_digits(monkeypatch):
    from typer.testing import CliRunner

    import ssdgen.output.reader as reader
    from ssdgen.cli.app import app
    price = dataclasses.asdict(_price())
    cost = {"usd_on_demand": 0.000123, "usd_spot": 0.0000615, "device_seconds_allocated": 0.123, "price": price}
    st = {"interrupted": False, "shards_done": 1, "shards_pending": 0, "shards_failed": {}, "shards_total": 1,
          "images_ok": 2, "images_failed": 0, "damaged": [], "decode_plan": None, "cost": cost,
          "price_given": False, "audit": None}
    monkeypatch.setattr(reader, "run_status", lambda url, **kw: st)
    r = CliRunner().invoke(app, ["status", "run"])
    assert r.exit_code == 0, r.output
    assert "cost so far: $0.000123 on demand, $0.0000615 spot" in r.stdout and "$0.0000 " not in r.stdout


@pytest.mark.integration
def test_cost_module_is_pure_python():
    code = ("import sys, output.cost; "
            "print([m for m in ('ray', 'prefect', 'torch', 'numpy') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]"
