"""The user's prices (output/cost.py `price_from`): --prices FILE and --usd-per-hour / --spot-usd-per-hour, on
generate, status and report. Fast: the resolution, its one-line errors and the arithmetic; integration: one tiny
run costed at the user's price, viewed at the price it recorded and at another, and resumed at another."""

import dataclasses
import json

import pytest
from typer.testing import CliRunner

from ssdgen.cli.app import app
from ssdgen.output.cost import (COLUMNS, DEFAULT_PRICES, Price, cost_table, load_prices, price_from, recorded_price,
                               reprice, run_summary)

CUSTOM = "my-box,gpu,4,on-prem rack 7,0.8,0.3,our finance sheet,2026-01-05"
HEADER = ",".join(COLUMNS)


def _table(tmp_path, *rows, header=HEADER):
    p = tmp_path / "prices.csv"
    p.write_text("\n".join([header, *rows]) + "\n")
    return p


def _records():
    # two shards: 150 + 40 ok images on 120 + 80 allocated device-seconds
    return [{"shard": i, "ok": ok, "failed": 0, "wall_s": s, "busy_s": s, "load_s": 0.0, "devices": 1.0,
             "device_seconds_allocated": s, "device_seconds_busy": s} for i, (ok, s) in enumerate([(150, 120.0),
                                                                                                   (40, 80.0)])]


# ------------------------------------------------------------------------------------------ resolution

def test_shipped_row_says_it_is_the_shipped_table():
    p = price_from("CPU")
    row = load_prices()["cpu"]
    assert dataclasses.replace(p, origin="") == row
    assert p.origin == f"shipped table (as of {row.as_of})"


def test_usd_per_hour_replaces_the_rows_price_and_keeps_its_unit():
    p = price_from("cpu", usd_per_hour="2.5")
    assert (p.unit, p.on_demand_usd_per_hour, p.spot_usd_per_hour) == ("vcpu", 2.5, None)  # per vCPU-hour
    assert p.origin == "--usd-per-hour" and "--usd-per-hour" in p.source
    both = price_from("h100", usd_per_hour=4, spot_usd_per_hour=1.5)
    assert (both.unit, both.on_demand_usd_per_hour, both.spot_usd_per_hour) == ("gpu", 4.0, 1.5)
    assert both.origin == "--usd-per-hour, --spot-usd-per-hour"


def test_a_prices_file_with_a_custom_row(tmp_path):
    f = _table(tmp_path, CUSTOM)
    p = price_from("my-box", prices=str(f))
    assert p == Price("my-box", "gpu", 4, "on-prem rack 7", 0.8, 0.3, "our finance sheet", "2026-01-05",
                      origin=f"--prices {f}")
    over = price_from("my-box", prices=f, usd_per_hour=2)
    assert over.instance_type == "on-prem rack 7" and over.on_demand_usd_per_hour == 2.0
    assert over.origin == f"--usd-per-hour (device row from --prices {f})"


def test_a_prices_file_at_an_fsspec_url():
    import fsspec
    fs = fsspec.filesystem("memory")
    fs.pipe("/ssdgen-test-prices.csv", f"{HEADER}\n{CUSTOM}\n".encode())
    try:
        assert price_from("my-box", prices="memory://ssdgen-test-prices.csv").on_demand_usd_per_hour == 0.8
    finally:
        fs.rm("/ssdgen-test-prices.csv")


@pytest.mark.parametrize("kw, message", [
    ({"usd_per_hour": 0}, "--usd-per-hour must be a positive finite number"),
    ({"usd_per_hour": "-3"}, "--usd-per-hour must be a positive finite number"),
    ({"usd_per_hour": float("nan")}, "--usd-per-hour must be a positive finite number"),
    ({"usd_per_hour": "inf"}, "--usd-per-hour must be a positive finite number"),
    ({"usd_per_hour": "three"}, "--usd-per-hour: not a number: 'three'"),
    ({"usd_per_hour": 1, "spot_usd_per_hour": "0"}, "--spot-usd-per-hour must be a positive"),
    ({"spot_usd_per_hour": 1}, "--spot-usd-per-hour needs --usd-per-hour"),
    ({"prices": "/nonexistent/prices.csv"}, "--prices /nonexistent/prices.csv: no such file"),
])
def test_bad_values_are_one_error_naming_the_option(kw, message):
    with pytest.raises(ValueError) as e:
        price_from("cpu", **kw)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_a_file_missing_a_column_names_it(tmp_path):
    f = _table(tmp_path, "my-box,gpu,4,rack,0.8,on-prem,2026-01-05",
               header=",".join(c for c in COLUMNS if c != "spot_usd_per_hour"))
    with pytest.raises(ValueError, match=rf"^--prices {f}: line 1, column 'spot_usd_per_hour': missing"):
        price_from("my-box", prices=f)


def test_a_device_the_table_lacks_points_to_prices(tmp_path):
    with pytest.raises(ValueError, match="unknown device type 'rtx-9090'.*--prices FILE"):
        price_from("rtx-9090", usd_per_hour=1)
    with pytest.raises(ValueError, match=r"known: my-box \(in --prices"):
        price_from("cpu", prices=_table(tmp_path, CUSTOM))


def test_recorded_price_round_trips_and_tolerates_older_records():
    p = price_from("l4", usd_per_hour=1.25)
    assert recorded_price(json.loads(json.dumps(dataclasses.asdict(p)))) == p
    older = {k: v for k, v in dataclasses.asdict(p).items() if k != "origin"}  # before prices said their origin
    assert recorded_price(older) == dataclasses.replace(p, origin="")
    assert recorded_price({"device_type": "l4"}) is None and recorded_price(None) is None


# ------------------------------------------------------------------------------------------ arithmetic

def test_per_1k_figures_scale_with_the_price_and_name_its_origin():
    one, hundred = (run_summary(_records(), price_from("cpu", usd_per_hour=x), wall_s=100.0) for x in (1, 100))
    assert one["usd_per_1k_images_on_demand"] == pytest.approx(200 / 3600 / 0.19, rel=1e-12)
    assert hundred["usd_per_1k_images_on_demand"] == pytest.approx(100 * one["usd_per_1k_images_on_demand"],
                                                                   rel=1e-12)
    assert one["usd_per_1k_images_spot"] is None and one["price"]["origin"] == "--usd-per-hour"
    assert one["reconciles"] and hundred["reconciles"]
    # a recorded summary costed at another price is the summary the run would have had at it
    again = reprice(one, price_from("cpu", usd_per_hour=100))
    for k in ("usd_on_demand", "usd_spot", "usd_per_1k_images_on_demand", "usd_per_1k_images_spot", "price"):
        assert again[k] == pytest.approx(hundred[k]) if isinstance(again[k], float) else again[k] == hundred[k]


def test_prices_are_not_in_the_resume_config_and_check_returns_the_users_price(tmp_path):
    from ssdgen.flows.settings import RunSettings
    a = RunSettings(prompts=("x.parquet",), decoder="ar")
    b = RunSettings(prompts=("x.parquet",), decoder="ar", prices=str(_table(tmp_path, "cpu,vcpu,1,box,0.5,,us,"
                                                                                      "2026-01-05")),
                    usd_per_hour=7.0, spot_usd_per_hour=2.0)
    assert a.recorded([]) == b.recorded([])  # another price resumes the same run
    price = b.check()
    assert (price.instance_type, price.on_demand_usd_per_hour, price.spot_usd_per_hour) == ("box", 7.0, 2.0)
    assert a.check().origin.startswith("shipped table")
    assert DEFAULT_PRICES.exists()


# ------------------------------------------------------------------------------------------ the CLI

def _one_error_line(r, needle):
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], r.stderr
    assert "Traceback" not in r.output


@pytest.mark.parametrize("args, needle", [
    (["--usd-per-hour", "abc"], "--usd-per-hour: Input should be a valid number"),
    (["--usd-per-hour", "nan"], "--usd-per-hour must be a positive finite number"),
    (["--usd-per-hour", "0"], "--usd-per-hour must be a positive finite number"),
    (["--usd-per-hour", "2", "--spot-usd-per-hour", "-1"], "--spot-usd-per-hour must be a positive"),
    (["--prices", "/nonexistent/prices.csv"], "--prices /nonexistent/prices.csv: no such file"),
])
def test_generate_bad_prices_are_one_error_line(args, needle):
    r = CliRunner().invoke(app, ["generate", "--prompts", "/nonexistent/x.parquet", "--decoder", "ar", *args])
    _one_error_line(r, needle)


def test_status_and_report_check_the_prices_before_reading_the_run(tmp_path):
    bad = _table(tmp_path, "cpu,vcpu,1,box,cheap,,us,2026-01-05")
    for cmd in (["status", str(tmp_path / "run")], ["report", str(tmp_path / "run"), "--html",
                                                   str(tmp_path / "r.html")]):
        _one_error_line(CliRunner().invoke(app, [*cmd, "--usd-per-hour", "-2"]), "--usd-per-hour must be")
        _one_error_line(CliRunner().invoke(app, [*cmd, "--prices", str(bad)]),
                        f"--prices {bad}: line 2, column 'on_demand_usd_per_hour': not a number: 'cheap'")


# ------------------------------------------------------------------------------------------ a real run

@pytest.mark.integration
@pytest.mark.usefixtures("prefect_server", "local_ray")
def test_a_run_records_the_users_price_and_views_recompute_at_another(tmp_path):
    from pipeline_helpers import eval_rows, run_flow, write_parquet

    from ssdgen.bench.report import write_report
    from ssdgen.output.reader import run_status
    src, out = tmp_path / "p.parquet", tmp_path / "run"
    write_parquet(None, src, eval_rows(4))
    kw = dict(prompts=[str(src)], out=str(out), shard_size=2, batch_size=2, actors=1)
    s = run_flow(usd_per_hour=1.0, **kw)
    assert s["images_ok"] == 4 and s["price"]["origin"] == "--usd-per-hour"
    assert s["price"]["on_demand_usd_per_hour"] == 1.0 and s["usd_per_1k_images_spot"] is None
    on_disk = json.loads((out / "summary.json").read_text())
    assert on_disk["price"] == s["price"] and json.loads((out / "_price.json").read_text()) == s["price"]
    per_1k = s["usd_per_1k_images_on_demand"]
    assert per_1k > 0

    recorded = run_status(str(out))  # no flags: the price the run recorded, not the shipped table's
    assert not recorded["price_given"] and recorded["cost"]["price"] == s["price"]
    assert recorded["cost"]["usd_per_1k_images_on_demand"] == pytest.approx(per_1k, rel=1e-12)
    given = run_status(str(out), usd_per_hour="100")
    assert given["price_given"] and given["cost"]["price"]["on_demand_usd_per_hour"] == 100.0
    assert given["cost"]["usd_per_1k_images_on_demand"] == pytest.approx(100 * per_1k, rel=1e-12)

    r = CliRunner().invoke(app, ["status", str(out)])
    assert r.exit_code == 0 and "from --usd-per-hour); as the run recorded it" in r.output, r.output
    r = CliRunner().invoke(app, ["status", str(out), "--usd-per-hour", "100"])
    assert r.exit_code == 0 and "$100.00 per vcpu-hour" in r.output and "given now" in r.output, r.output

    write_report(str(out), tmp_path / "a.html")
    assert "--usd-per-hour" in (tmp_path / "a.html").read_text(encoding="utf-8")
    write_report(str(out), tmp_path / "b.html", usd_per_hour=100)
    html = (tmp_path / "b.html").read_text(encoding="utf-8")
    rows = {r["metric"]: r["value"] for r in cost_table(reprice(s, price_from("cpu", usd_per_hour=100)))}
    assert "recomputed at your price" in html and rows["$ per 1k images on-demand"] in html

    # a resume at another price is not refused: the shard it re-decodes and the summary are costed at it
    (out / "shards" / "000001" / "_SUCCESS.json").unlink()
    again = run_flow(usd_per_hour=100.0, spot_usd_per_hour=40.0, **kw)
    assert again["shards_run_now"] == 1 and again["images_ok"] == 4
    assert again["price"]["on_demand_usd_per_hour"] == 100.0 and again["price"]["spot_usd_per_hour"] == 40.0
    assert json.loads((out / "_price.json").read_text()) == again["price"]
    assert again["usd_per_1k_images_spot"] == pytest.approx(0.4 * again["usd_per_1k_images_on_demand"])
