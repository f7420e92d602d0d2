"""The Python API (`ssdgen.generate`, `ssdgen.sample`: ssdgen/api.py), `ssdgen status --json` and
`ssdgen generate --dry-run` (flows/dry_run.py), as notebooks, scripts and nightly jobs use them (#36 items 5, 6)."""

import json
import subprocess
import sys

import pytest
from pipeline_helpers import eval_rows, write_parquet
from test_operations import ROOT, cli_env, ssdgen

import ssdgen as api


@pytest.mark.parametrize("settings, words", [
    ({"shard_size": 0}, "--shard-size must be >= 1"),
    ({"bogus": 1}, "bogus: Extra inputs are not permitted"),
    ({"decoder": "sjd:windw=4"}, "windw"),
])
def test_generate_refuses_a_bad_setting_in_one_line_before_anything_starts(tmp_path, settings, words):
    with pytest.raises(ValueError) as e:
        api.generate(prompts=str(tmp_path / "none.parquet"), out=str(tmp_path / "run"), **settings)
    assert words in str(e.value) and "\n" not in str(e.value) and not (tmp_path / "run").exists()
    assert "Value error" not in str(e.value)  # #49: pydantic's prefix before the validator's own words


def test_generate_runs_under_the_temporary_server_the_cli_starts(tmp_path, monkeypatch):
    """#49: `ssdgen.generate` let Prefect start its own server (its banner, 4 s slower than the CLI); it gives
    the run the CLI's `around` (flows/prefect_server.py; tests/test_prefect_server.py runs a flow under it)."""
    from ssdgen.flows import prefect_server, run
    seen = {}
    monkeypatch.setattr(run, "run", lambda cfg, **kw: seen.update(kw) or {})
    api.generate(prompts=str(tmp_path / "p.parquet"), out=str(tmp_path / "run"), decoder="ar")
    assert seen["around"] is prefect_server.temporary_api


def test_date_fills_prompts_and_out_alike():
    from datetime import datetime

    from ssdgen.flows.settings import RunSettings
    s = RunSettings(prompts=("s3://b/in/{date}/", "fixed.parquet"), out="s3://b/out/{date}")
    s = s.dated(datetime(2026, 12, 3))
    assert s.prompts == ("s3://b/in/2026-12-03/", "fixed.parquet") and s.out == "s3://b/out/2026-12-03"


def test_a_dry_run_checks_everything_and_starts_and_writes_nothing(tmp_path):
    """In a process of its own: neither Prefect nor Ray is imported or started, the output folder is not made;
    `{date}` in --prompts is today's, as a run started now reads it."""
    from datetime import datetime, timezone
    day = tmp_path / datetime.now(timezone.utc).strftime("%Y-%m-%d")
    day.mkdir()
    write_parquet(None, day / "p.parquet", eval_rows(10))
    code = ("import sys; from ssdgen.flows.dry_run import dry_run; from ssdgen.flows.settings import RunSettings; "
            f"d = dry_run(RunSettings(prompts=({str(tmp_path / '{date}' / 'p.parquet')!r},), "
            f"out={str(tmp_path / 'run')!r}, decoder='ar', shard_size=4)); "
            "import json; print(json.dumps([d['shards'], d['pending'], d['pending_rows'], d['seconds'], "
            "'prefect' in sys.modules, 'ray' in sys.modules and sys.modules['ray'].is_initialized()]))")
    proc = subprocess.run([sys.executable, "-c", code], env=cli_env(SSDGEN_CACHE=str(tmp_path / "cache")), cwd=ROOT,
                          capture_output=True, text=True, timeout=300)  # a cache of its own: no earlier run's record
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.splitlines()[-1]) == [3, 3, 10, None, False, False]
    assert not (tmp_path / "run").exists()


@pytest.mark.usefixtures("prefect_server", "local_ray")
def test_generate_from_python_then_status_json_dry_run_and_sample(tmp_path):
    write_parquet(None, tmp_path / "p.parquet", eval_rows(6))
    out = str(tmp_path / "run")
    s = api.generate(prompts=str(tmp_path / "p.parquet"), out=out, decoder="ar", shard_size=3, batch_size=3,
                     actors=1)
    assert s["images_ok"] == 6 and s["shards_committed"] == 2
    # #49: end to end, from the call's start (Prefect, Ray, the model loads and the flow's own start included)
    recorded = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert recorded["wall_s_end_to_end"] >= recorded["wall_s"] > 0
    assert recorded["startup_s_end_to_end"] >= recorded["startup_s"] > 0
    assert s["wall_s_end_to_end"] >= recorded["wall_s_end_to_end"]  # returned: to the call's end
    assert s["images_per_s_end_to_end"] == pytest.approx(6 / s["wall_s_end_to_end"])
    again = api.generate(prompts=[str(tmp_path / "p.parquet")], out=out, decoder="ar", shard_size=3, batch_size=3,
                         actors=1)
    assert again["shards_run_now"] == 0 and again["images_ok"] == 6  # nothing to do: the recorded totals
    proc = ssdgen("status", out, "--json")
    st = json.loads(proc.stdout)
    assert proc.returncode == 0 and (st["shards_done"], st["shards_pending"], st["images_ok"]) == (2, 0, 6)
    assert st["damaged"] == [] and st["cost"]["usd_on_demand"] > 0 and list(st["rows_by_decoder"].values()) == [6]
    proc = ssdgen("generate", "--prompts", str(tmp_path / "p.parquet"), "--out", out, "--decoder", "ar",
                  "--shard-size", "3", "--batch-size", "3", "--actors", "1", "--dry-run")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "6 prompts in 2 shards: 2 committed, 0 pending (0 prompts)" in proc.stdout
    assert "measured on this run's 2 committed shards" in proc.stdout
    images = api.sample(["a large red circle at the center on a flat gray background"], n=2, decoder="ar", seed=3)
    assert len(images) == 2 and images[0].size == (64, 64) and images[0].tobytes() != images[1].tobytes()
