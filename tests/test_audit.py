"""`ssdgen generate --audit FRACTION`: the deterministic sample, the settings, the summary of committed audit
rows, and (slow) a crashed then resumed csd run on moto's S3 server whose audit rows are committed exactly once."""

import json
import math

import numpy as np
import pyarrow.parquet as pq
import pytest
from pipeline_helpers import eval_rows, write_parquet

from ssdgen.output.audit import AUDIT_FILE, audit_table, is_audited, mark_rows, summarize, warning
from ssdgen.output.marker import Marker


def test_selection_is_deterministic_and_takes_about_the_fraction():
    ids = [f"prompt-{i}" for i in range(2000)]
    assert [is_audited(i, 0.3) for i in ids] == [is_audited(i, 0.3) for i in ids]
    assert not any(is_audited(i, 0.0) for i in ids) and all(is_audited(i, 1.0) for i in ids)
    for f in (0.05, 0.5):
        n = sum(is_audited(i, f) for i in ids)
        assert abs(n - 2000 * f) <= 5 * math.sqrt(2000 * f * (1 - f)), (f, n)  # binomial, 5 sd
    # nested: a prompt audited at 5% is audited at 50% (the hash is compared with the fraction)
    assert all(is_audited(i, 0.5) for i in ids if is_audited(i, 0.05))


def test_mark_rows_skips_bad_rows_and_gives_the_reference_seed():
    from ssdgen.decoders.recipes import REFERENCE_SEED_OFFSET
    rows = [{"prompt_id": f"p{i}", "seed": i, "error": None} for i in range(50)]
    rows.append({"prompt_id": "bad", "seed": 1, "error": "prompt is null"})
    assert mark_rows(rows, 1.0) == 50 and "audit_seed" not in rows[-1]
    assert all(r["audit_seed"] == r["seed"] + REFERENCE_SEED_OFFSET for r in rows[:50])
    top = [{"prompt_id": "x", "seed": 2**63 - 1, "error": None}]
    mark_rows(top, 1.0)
    assert 0 <= top[0]["audit_seed"] < 2**63  # still an int64


@pytest.mark.parametrize("audit, tolerance, message", [
    (1.5, 0.15, "--audit must be a fraction in [0, 1]"), (-0.1, 0.15, "--audit must"),
    (float("nan"), 0.15, "--audit must"), (0.1, 0.0, "--audit-tolerance")])
def test_bad_audit_settings_are_refused(audit, tolerance, message):
    from ssdgen.flows.pipeline import RunSettings
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        RunSettings(prompts=("x",), audit=audit, audit_tolerance=tolerance).check()


@pytest.mark.parametrize("command", ["generate", "serve"])
def test_cli_refuses_a_bad_fraction_in_one_line(command):
    r = _cli(command, "--prompts", "x.parquet", "--out", "out/x", "--audit", "2")
    assert r.exit_code == 2 and r.output.strip().splitlines() == [
        "error: --audit must be a fraction in [0, 1] (0 = no audit), got 2.0"]


def test_audit_settings_are_recorded_whether_or_not_auditing():
    from ssdgen.flows.pipeline import RunSettings
    off = RunSettings(prompts=("x",)).recorded([])
    assert (off["audit"], off["audit_tolerance"]) == (0.0, RunSettings.model_fields["audit_tolerance"].default)
    rec = RunSettings(prompts=("x",), audit=0.05, audit_tolerance=0.2).recorded([])
    assert rec == off | {"audit": 0.05, "audit_tolerance": 0.2}


def _commit(out, shard, rows, seconds):
    attempt = out.new_attempt(shard)
    f = out.store.write_table(f"{attempt}/{AUDIT_FILE}", audit_table(rows, "csd"))
    out.commit(Marker.from_dict({"shard": shard, "files": [f], "audit": {"rows": len(rows), "seconds": seconds,
                                                                         "device_seconds": 2 * seconds}}))
    return attempt


def _rows(gaps, start=0):
    return [{"prompt_id": f"p{start + i}", "seed": i, "nll_per_token": 2.0 + g, "ar_seed": i + 7_000_000,
             "ar_nll_per_token": 2.0, "forwards": 5, "ar_forwards": 16, "audit_seconds": 0.1}
            for i, g in enumerate(gaps)]


def test_summary_reads_only_committed_audit_rows_and_costs_them_apart(tmp_path):
    from ssdgen.output.cost import price_for
    from ssdgen.output.layout import Output
    out = Output(str(tmp_path / "run"))
    rng = np.random.default_rng(0)
    _commit(out, 0, _rows(0.4 + 0.05 * rng.standard_normal(20)), 3.0)
    _commit(out, 1, _rows(0.4 + 0.05 * rng.standard_normal(20), start=20), 1.0)
    stray = out.new_attempt(2)  # an attempt that never committed: its rows must not count
    out.store.write_table(f"{stray}/{AUDIT_FILE}", audit_table(_rows([9.0] * 5, start=40), "csd"))
    price = price_for("cpu")
    a = summarize(out, out.committed(), 0.05, 0.15, price)
    assert a["n"] == 40 and a["decoder"] == "csd" and a["fd"] is None
    assert a["nll_gap"] == pytest.approx(0.4, abs=0.03)
    lo, hi = a["nll_gap_ci"]
    assert lo < a["nll_gap"] < hi and a["within_tolerance"] is False
    assert a["audit_seconds"] == 4.0 and a["device_seconds"] == 8.0
    assert a["usd_on_demand"] == pytest.approx(8.0 * price.on_demand_usd_per_hour / 3600)
    assert "is not within +-0.15" in warning(a)
    ok = summarize(out, out.committed(), 0.05, 1.0, price)
    assert ok["within_tolerance"] is True and warning(ok) is None


def _audit_files(fs, out):
    """prompt_id -> how many committed audit rows hold it, and the committed audit files' (path, sha256)."""
    from ssdgen.output.layout import Output
    o = Output(out)
    counts, files = {}, []
    for m in o.committed().values():
        for f in m.files:
            if f.path.endswith(AUDIT_FILE):
                files.append((f.path, f.sha256))
                for pid in pq.read_table(fs.open(o.path(f.path), "rb")).column("prompt_id").to_pylist():
                    counts[pid] = counts.get(pid, 0) + 1
    return counts, sorted(files)


def _cli(*args):
    from typer.testing import CliRunner
    from ssdgen.cli import app
    return CliRunner().invoke(app, list(args))


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_server", "local_ray")
def test_s3_audit_rows_are_committed_once_and_a_resume_does_not_audit_again(s3, tmp_path):
    from faults import crash_driver
    from ssdgen.output.layout import Output
    from ssdgen.reference.tiny import tiny_model
    tiny_model(tmp_path / "tiny")  # 4x4 tokens: a csd run is seconds
    rows = eval_rows(12)
    write_parquet(s3, "ssdgen-test/in/p.parquet", rows)
    chosen = {r["prompt_id"] for r in rows if is_audited(r["prompt_id"], 0.5)}
    assert 2 <= len(chosen) < 12  # the sample is a real subset with an interval
    out = "s3://ssdgen-test/run"
    args = ["generate", "--prompts", "s3://ssdgen-test/in/", "--out", out, "--decoder", "csd", "--model",
            f"reference:{tmp_path / 'tiny'}", "--shard-size", "4", "--batch-size", "4", "--actors", "1",
            "--audit", "0.5", "--no-progress"]
    # a driver killed after the first commit (its storage hangs at the second) leaves a partly audited run
    crash_driver([x if x != out else "faultys3://ssdgen-test/run" for x in args], after_commits=1, tmp=tmp_path)
    assert len(Output(out).committed()) == 1
    first, _ = _audit_files(s3, out)
    r = _cli(*args)  # resume: only the missing shards, and only they are audited
    assert r.exit_code == 0, r.output
    counts, files = _audit_files(s3, out)
    assert set(counts) == chosen and set(counts.values()) == {1} and set(first) <= chosen
    assert len(files) == 3 and len(s3.glob("ssdgen-test/run/shards/*/attempt-*/audit.parquet")) == 3
    summary = json.loads(s3.cat_file("ssdgen-test/run/summary.json"))
    a = summary["audit"]
    assert a["n"] == len(chosen) and a["fraction"] == 0.5 and math.isfinite(a["nll_gap"])
    assert len(a["nll_gap_ci"]) == 2 and a["nll_gap_ci"][0] <= a["nll_gap"] <= a["nll_gap_ci"][1]
    assert a["audit_seconds"] > 0 and a["usd_on_demand"] > 0 and "audit NLL gap" in r.output
    _check_rows(s3, out, chosen)
    again = _cli(*args)  # a finished run: nothing to run, nothing audited again
    assert again.exit_code == 0 and _audit_files(s3, out) == (counts, files)
    assert json.loads(s3.cat_file("ssdgen-test/run/summary.json"))["audit"]["n"] == len(chosen)
    other = _cli(*[x if x != "0.5" else "0.25" for x in args])
    assert other.exit_code == 2 and "audit" in other.output  # another fraction is another run
    st = _cli("status", out)
    assert st.exit_code == 0 and "audit NLL gap" in st.output and f"{len(chosen)} (fraction 0.5)" in st.output
    assert _artifact_has("audit NLL gap")


def _check_rows(fs, out, chosen):
    """Audit rows carry the image's seed, the reference seed, the target NLLs and the forwards."""
    from ssdgen.output.layout import Output
    o = Output(out)
    man = pq.read_table(fs.open(o.path("manifest.parquet"), "rb")).to_pylist()
    assert all(m["audit_url"] for m in man)
    seeds = {x["prompt_id"]: x["seed"] for m in man
             for x in pq.read_table(fs.open(m["images_url"], "rb"), columns=["prompt_id", "seed"]).to_pylist()}
    audit = [r for m in man for r in pq.read_table(fs.open(m["audit_url"], "rb")).to_pylist()]
    assert {r["prompt_id"] for r in audit} == chosen
    for r in audit:
        assert r["decoder"] == "csd" and r["seed"] == seeds[r["prompt_id"]] and r["ar_seed"] == r["seed"] + 7_000_000
        assert r["nll_per_token"] > 0 and r["ar_nll_per_token"] > 0 and r["audit_seconds"] > 0
        assert r["ar_forwards"] == 16 and r["forwards"] >= 1  # ar: one forward per token of the 4x4 grid


def _artifact_has(text: str) -> bool:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
    with get_client(sync_client=True) as c:
        arts = c.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["ssdgen-cost"])))
    return any(text in json.dumps(a.data) for a in arts)
