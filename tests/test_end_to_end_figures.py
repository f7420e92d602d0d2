"""A run's end-to-end figures (#49 item 3): wall time and images/s from the command's start, start-up included,
beside the flow's own. An 8-prompt run took 14.0 s end to end; its summary said 4.9 s and 1.63 images/s, where
the truth was 0.57."""

import time
from types import SimpleNamespace

import pytest

from ssdgen.output.summary import this_run


def _ran(**kw):
    return {"images": 8, "commits": 1, "startup_s": 2.0, "failed": {}, "commit_latency_s": None} | kw


CFG = SimpleNamespace(out="out/run", decoder="ar", model=None, batch_size=8, image_format="png", format="parquet",
                      actors=1, device_type="cpu")


def test_the_end_to_end_figures_count_what_came_before_the_flow():
    s = this_run(CFG, _ran(before_flow_s=9.1), 4.9, 1, [], 0, None)
    assert s["wall_s_end_to_end"] == pytest.approx(14.0) and s["images_per_s_end_to_end"] == pytest.approx(8 / 14)
    assert s["startup_s_end_to_end"] == pytest.approx(11.1)  # the flow's 2.0 s and the 9.1 s before it
    assert s["images_per_s"] == pytest.approx(8 / 4.9)  # the flow's own, beside them
    # a flow started without a command (a served deployment): the end-to-end figures are the flow's
    s = this_run(CFG, _ran(), 4.9, 1, [], 0, None)
    assert s["wall_s_end_to_end"] == pytest.approx(4.9) and s["startup_s_end_to_end"] == pytest.approx(2.0)


def test_the_printed_summary_leads_with_the_end_to_end_figures():
    from ssdgen.output.cost import cost_table, price_from, run_summary
    s = run_summary([], price_from("cpu"), 4.9) | this_run(CFG, _ran(before_flow_s=9.1), 4.9, 1, [], 0, None)
    metrics = [r["metric"] for r in cost_table(s)]
    assert metrics.index("wall time (end to end)") < metrics.index("wall time (the flow, this run)")
    value = {r["metric"]: r["value"] for r in cost_table(s)}
    assert (value["wall time (end to end)"], value["images/s (end to end)"]) == ("14.0 s", "0.571")
    old = run_summary([], price_from("cpu"), 4.9) | {"images_per_s_steady": None}  # a summary from before
    assert "wall time (end to end)" not in [r["metric"] for r in cost_table(old)]


def test_the_returned_summary_counts_to_the_commands_end():
    """summary.json is written inside the flow; the CLI's and the API's summary count on past Ray's and Prefect's
    server's stop, to the command's end."""
    from ssdgen.flows.run import _to_the_end
    summary = {"wall_s_end_to_end": 5.0, "images_this_run": 8, "images_per_s_end_to_end": 1.6}
    s = _to_the_end(summary, time.time() - 12.0)
    assert s["wall_s_end_to_end"] == pytest.approx(12.0, abs=0.5)
    assert s["images_per_s_end_to_end"] == pytest.approx(8 / s["wall_s_end_to_end"])
    assert _to_the_end(summary | {"nothing_to_do": True}, 0.0)["wall_s_end_to_end"] == 5.0  # another run's


def test_the_cli_counts_from_its_process_entry_only_when_it_is_the_command():
    import subprocess
    import sys

    import ssdgen.cli
    assert ssdgen.cli.started() is None  # imported by pytest: a command counts from its own start
    code = "import time; t = time.time(); from ssdgen.cli import started; print(started() - t)"
    proc = subprocess.run([sys.executable, "-c", f"import sys; sys.argv = ['ssdgen']; {code}"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert 0 <= float(proc.stdout) < 1.0  # entered at once, before the CLI's imports


def test_the_flow_gets_the_commands_start(monkeypatch):
    """flows/run.py hands the flow the command's start (a name shadowed by the local Ray's flag once made it 1.0,
    and the figures 1.8e9 s)."""
    from ssdgen.flows import pipeline, run
    from ssdgen.flows.settings import RunSettings
    seen = {}
    monkeypatch.setattr(pipeline, "generate", lambda cfg, **kw: seen.update(kw) or {})
    run._flow(RunSettings(prompts=("p.parquet",), out="out/run"), False, False, None, since=1234.5)
    assert seen["started"] == 1234.5
