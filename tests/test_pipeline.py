"""The generation pipeline end to end with real parts: moto's S3 server, a local Ray, Prefect's test server,
and the bundled reference model. Faults are the tests' own (tests/faults.py): actor processes SIGKILLed
mid-batch, storage writes that fail, a driver process killed mid-run; the flow takes no fault parameter."""

import json

import pyarrow as pa
import pytest
from faults import ActorKiller, crash_driver, storage_faults
from pipeline_helpers import committed_tables as _committed
from pipeline_helpers import eval_rows as _prompts
from pipeline_helpers import run_flow as _run
from pipeline_helpers import write_parquet as _write

pytestmark = pytest.mark.usefixtures("prefect_server", "local_ray")


@pytest.mark.slow
def test_s3_run_with_killed_actors_and_failed_writes_commits_each_prompt_once_with_identical_images(s3,
                                                                                                   monkeypatch):
    from ssdgen.flows import pipeline as flows_pipeline
    from ssdgen.output.layout import Output
    monkeypatch.setattr(flows_pipeline, "ACTOR_RESTART_WAIT_S", 180)  # a restart that cannot happen fails fast
    rows = _prompts(256)
    _write(s3, "ssdgen-test/in/part-0.parquet", rows[:128])
    _write(s3, "ssdgen-test/in/part-1.parquet", rows[128:])
    # the default decoder, calibrated: the clean run resolves it before its actors start, and records the plan
    clean = _run(prompts=["s3://ssdgen-test/in/"], out="s3://ssdgen-test/clean", decoder="ssd+csd")
    assert clean["images_ok"] == 256 and clean["shards_committed"] == 8 and clean["reconciles"]
    planned = Output("s3://ssdgen-test/clean").read_plan()["spec"]
    # the same run replaying that plan on storage whose first 5 data writes fail, with a busy actor SIGKILLed at
    # the start and after 2 and 4 of the 8 shards committed: Ray rebuilds each with the plan's spec
    with storage_faults(errors=5) as storage, \
            ActorKiller(after_commits=[0, 2, 4], commits=lambda: storage.commits) as killer:
        faulty = _run(prompts=["s3://ssdgen-test/in/"], out="faultys3://ssdgen-test/faulty", decoder="ssd+csd",
                      plan="s3://ssdgen-test/clean")
    assert storage.errors_raised == 5 and len(killer.killed) == 3  # the faults happened
    assert faulty["images_ok"] == 256 and faulty["shards_committed"] == 8
    a, _ = _committed("s3://ssdgen-test/clean")
    b, stats = _committed("s3://ssdgen-test/faulty")
    ids = b.column("prompt_id").to_pylist()
    assert sorted(ids) == sorted(r["prompt_id"] for r in rows) and len(set(ids)) == 256  # each exactly once
    png_a = dict(zip(a.column("prompt_id").to_pylist(), a.column("image").to_pylist()))
    png_b = dict(zip(ids, b.column("image").to_pylist()))
    assert png_a == png_b  # byte-identical despite 3 actor deaths and 5 storage errors
    assert set(stats.column("status").to_pylist()) == {"ok"}
    # every row, the restarted actors' too, says it was decoded by the plan: what the actors reported
    assert set(b.column("decoder").to_pylist()) == set(a.column("decoder").to_pylist()) == {planned}
    # restarted incarnations of the killed actors decoded shards that committed
    pids = {m.actor_pid for m in Output("s3://ssdgen-test/faulty").committed().values()}
    assert pids - killer.originals, (pids, killer.originals, killer.killed)
    # no uncommitted attempt survives the run's garbage collection
    assert len(s3.glob("ssdgen-test/faulty/shards/*/attempt-*")) == 8


def test_a_driver_killed_mid_run_then_rerun_runs_only_the_missing_shards(tmp_path):
    from ssdgen.output.layout import Output
    src = tmp_path / "prompts.parquet"
    rows = _prompts(24)
    _write(None, src, rows)
    out = tmp_path / "run"
    args = ["--prompts", str(src), "--decoder", "ar", "--shard-size", "4", "--batch-size", "4", "--actors", "1",
            "--no-progress"]
    # a driver process whose storage hangs at its third commit, SIGKILLed there: two shards are committed
    crash_driver(["generate", *args, "--out", f"faultyfile://{out}"], after_commits=2, tmp=tmp_path)
    first = set(Output(str(out)).committed())
    assert len(first) == 2
    again = _run(prompts=[str(src)], out=str(out), shard_size=4, batch_size=4, actors=1)
    assert again["shards_run_now"] == 6 - len(first) and again["shards_committed"] == 6
    images, _ = _committed(str(out))
    assert sorted(images.column("prompt_id").to_pylist()) == sorted(r["prompt_id"] for r in rows)
    # a third run has nothing to do and changes nothing
    third = _run(prompts=[str(src)], out=str(out), shard_size=4, batch_size=4, actors=1)
    assert third["shards_run_now"] == 0 and third["images_ok"] == 24


def test_a_run_starts_no_more_actors_than_it_has_shards_to_run(tmp_path, monkeypatch):
    """--actors 2 for one shard: one actor loads the model (#36: a small run does not pay for an idle one)."""
    from ssdgen.flows import pipeline
    started: list[int] = []
    real = pipeline._actors

    def spy(cfg, n, resolved, stop=None):
        actors = real(cfg, n, resolved, stop)
        started.append(len(actors))
        return actors
    monkeypatch.setattr(pipeline, "_actors", spy)
    _write(None, tmp_path / "p.parquet", _prompts(3))
    s = _run(prompts=[str(tmp_path / "p.parquet")], out=str(tmp_path / "run"), shard_size=8, actors=2)
    assert s["images_ok"] == 3 and started == [1]
    # other processes' CPU was watched while the actor decoded (#49: a busy machine is said in the summary)
    assert s["machine_load"]["seconds"] > 0 and s["machine_load"]["other_cores_mean"] >= 0


def test_bad_rows_become_error_rows_and_the_shard_commits(tmp_path):
    src = tmp_path / "p.parquet"
    good = _prompts(2)
    rows = good + [{"prompt_id": "null", "prompt": None},
                   {"prompt_id": "unknown-words",
                    "prompt": "a large red zeppelin at the center on a flat gray background"},
                   {"prompt_id": "huge", "prompt": "a " * 50_000}]
    _write(None, src, rows)
    s = _run(prompts=[str(src)], out=str(tmp_path / "run"), shard_size=8, batch_size=8, actors=1)
    assert s["images_ok"] == 2 and s["images_failed"] == 3 and s["shards_committed"] == 1
    images, stats = _committed(str(tmp_path / "run"))
    st = {r["prompt_id"]: r for r in stats.to_pylist()}
    assert st["null"]["status"] == "error" and "null" in st["null"]["error"]
    assert "zeppelin" in st["unknown-words"]["error"]
    assert st["huge"]["status"] == "error" and "token" in st["huge"]["error"]
    assert {k: st[k]["error_reason"] for k in ("null", "unknown-words", "huge")} == \
        {"null": "bad_input", "unknown-words": "unknown_words", "huge": "too_long"}
    assert s["errors_by_reason"] == {"bad_input": 1, "unknown_words": 1, "too_long": 1}
    assert all(st[r["prompt_id"]]["status"] == "ok" and st[r["prompt_id"]]["forwards"] == 256 for r in good)
    png = {r["prompt_id"]: r["image"] for r in images.to_pylist()}
    assert png["null"] is None and png[good[0]["prompt_id"]]["bytes"][:8] == b"\x89PNG\r\n\x1a\n"
    assert set(images.column("image_format").to_pylist()) == {"png"}


def test_prompts_the_model_cannot_draw_are_error_rows_counted_by_reason(tmp_path):
    """Issue #33: the reference model drew these from an empty or partial caption and committed them as ok."""
    from ssdgen.bench.report import write_report
    from ssdgen.output.layout import Output
    from ssdgen.output.reader import run_status
    odd = {"japanese": ("大きな赤い円が中央にある", "no_known_words"), "emoji": ("🔴🟦🌈", "no_known_words"),
           "digits": ("12345", "no_known_words"), "punctuation": ("!!! ... ???", "no_known_words"),
           "whitespace": (" \t ", "empty"), "no-background": ("a large red circle at the center", "grammar")}
    good = _prompts(2)
    src, out = tmp_path / "p.parquet", str(tmp_path / "run")
    _write(None, src, good + [{"prompt_id": k, "prompt": p} for k, (p, _) in odd.items()])
    s = _run(prompts=[str(src)], out=out, shard_size=8, batch_size=8, actors=1)
    assert (s["images_ok"], s["images_failed"]) == (2, 6)
    _, stats = _committed(out)
    st = {r["prompt_id"]: r for r in stats.to_pylist()}
    for k, (_, reason) in odd.items():
        assert (st[k]["status"], st[k]["error_reason"]) == ("error", reason), st[k]
        assert st[k]["error"].startswith("invalid prompt: ")
    assert all((st[r["prompt_id"]]["status"], st[r["prompt_id"]]["error_reason"]) == ("ok", None) for r in good)
    by_reason = {"no_known_words": 4, "empty": 1, "grammar": 1}
    assert s["errors_by_reason"] == by_reason and Output(out).read_summary()["errors_by_reason"] == by_reason
    assert run_status(out)["errors_by_reason"] == by_reason
    html = tmp_path / "report.html"
    write_report(out, html)
    text = html.read_text(encoding="utf-8")
    assert "6 failed samples; by reason:" in text
    for reason, n in by_reason.items():  # the report's by-reason table: samples, reason
        assert f'<tr><td class="">{n}</td><td class="l">{reason}</td></tr>' in text


def test_input_errors_name_the_file_and_commit_nothing(tmp_path, s3):
    from ssdgen.inputs.files import InputError
    bad = tmp_path / "bad.parquet"
    _write(None, bad, [{"text": "a"}], pa.schema([("text", pa.string())]))
    with pytest.raises(InputError, match=r"bad\.parquet.*prompt"):
        _run(prompts=[str(bad)], out=str(tmp_path / "r1"))
    dup = tmp_path / "dup.parquet"
    _write(None, dup, [{"prompt_id": "x", "prompt": "a red circle"}, {"prompt_id": "x", "prompt": "a red circle"}])
    with pytest.raises(InputError, match="duplicate"):
        _run(prompts=[str(dup)], out=str(tmp_path / "r2"))
    with pytest.raises(InputError, match="no-such-bucket"):
        _run(prompts=["s3://no-such-bucket/prompts/"], out=str(tmp_path / "r3"))
    for r in ("r1", "r2", "r3"):
        assert not (tmp_path / r / "shards").exists()


def test_bad_credentials_get_a_clear_error_without_the_secret(s3, tmp_path, monkeypatch):
    import moto.settings
    import s3fs
    from ssdgen.inputs.files import InputError
    _write(s3, "ssdgen-test/in/p.parquet", _prompts(2))
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret-4c1b9")
    monkeypatch.setattr(moto.settings, "INITIAL_NO_AUTH_ACTION_COUNT", 0)  # moto now checks signatures
    s3fs.S3FileSystem.clear_instance_cache()
    with pytest.raises(InputError) as e:
        _run(prompts=["s3://ssdgen-test/in/"], out=str(tmp_path / "r"))
    assert "s3://ssdgen-test/in" in str(e.value) and "wrong-secret-4c1b9" not in str(e.value)


def test_credentials_never_appear_in_logs_artifacts_or_outputs(s3, tmp_path, monkeypatch, capfd, caplog):
    import s3fs
    secret, key_id = "sEcReT-value-91f3c7a2", "AKIDSSDGENLEAKCHECK7"
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", key_id)
    s3fs.S3FileSystem.clear_instance_cache()
    fs = s3fs.S3FileSystem()
    _write(fs, "ssdgen-test/in/p.parquet", _prompts(4) + [{"prompt_id": "bad", "prompt": None}])
    s = _run(prompts=["s3://ssdgen-test/in/"], out="s3://ssdgen-test/run", shard_size=8, batch_size=8, actors=1,
             progress=True)
    assert s["images_ok"] == 4
    blobs = [fs.cat_file(p) for p in fs.find("ssdgen-test/run")]
    blobs.append(json.dumps(s).encode())
    out, err = capfd.readouterr()
    blobs += [out.encode(), err.encode(), caplog.text.encode()]
    blobs += _artifact_texts()
    for needle in (secret, key_id):
        assert not any(needle.encode() in b for b in blobs), needle


def _artifact_texts() -> list[bytes]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
    with get_client(sync_client=True) as c:
        arts = c.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["ssdgen-cost",
                                                                                            "ssdgen-failures"])))
    assert arts, "the run published its artifacts"
    return [json.dumps(a.data).encode() for a in arts]


def test_resume_with_other_settings_is_refused(tmp_path):
    from ssdgen.output.layout import ConfigMismatch
    src = tmp_path / "p.parquet"
    _write(None, src, _prompts(2))
    _run(prompts=[str(src)], out=str(tmp_path / "run"), shard_size=2, batch_size=2, actors=1)
    with pytest.raises(ConfigMismatch, match="top_k=5"):  # the recorded decode spec differs
        _run(prompts=[str(src)], out=str(tmp_path / "run"), shard_size=2, batch_size=2, actors=1,
             decoder="ar:top_k=5")


def test_output_reads_with_pandas_polars_duckdb_and_ray_data(tmp_path):
    import duckdb
    import pandas as pd
    import polars as pl
    import ray
    src = tmp_path / "p.parquet"
    _write(None, src, _prompts(6))
    out = tmp_path / "run"
    _run(prompts=[str(src)], out=str(out), shard_size=3, batch_size=3, actors=2)
    man = pd.read_parquet(out / "manifest.parquet")
    paths = [u.removeprefix("file://") for u in man.images_url]
    assert len(pd.concat([pd.read_parquet(p) for p in paths])) == 6
    assert pl.read_parquet(str(out / "shards/*/attempt-*/images.parquet")).height == 6
    assert duckdb.sql(f"select count(*) from read_parquet('{out}/shards/*/attempt-*/stats.parquet') "
                      "where status = 'ok'").fetchall()[0][0] == 6
    assert ray.data.read_parquet([u.removeprefix("file://") for u in man.stats_url]).count() == 6
    st = pd.read_parquet(paths[0].replace("images.parquet", "stats.parquet"))
    assert len(st.commit_map[0]) == 256 and st.forwards[0] == 256


def test_status_reports_done_pending_and_cost(tmp_path):
    from ssdgen.output.reader import run_status
    src = tmp_path / "p.parquet"
    _write(None, src, _prompts(4))
    out = str(tmp_path / "run")
    s = _run(prompts=[str(src)], out=out, shard_size=2, batch_size=2, actors=1)
    st = run_status(out)
    assert (st["shards_done"], st["shards_pending"], st["images_ok"]) == (2, 0, 4)
    assert st["cost"]["usd_on_demand"] == pytest.approx(s["usd_on_demand"])


def test_a_calibrated_decoder_decides_once_and_a_rerun_replays_the_plan(tmp_path):
    """ssd+csd (calibrated by default): one actor resolves it to a concrete spec before the first shard and
    `_plan.json` records the spec's text with its measurements; a shard lost and rerun on fresh actors decodes by
    the recorded spec to the same tokens, and a spec put there by hand is what decodes (no second calibration)."""
    import fsspec
    from ssdgen.output.layout import Output
    src, out = tmp_path / "p.parquet", tmp_path / "run"
    _write(None, src, _prompts(8))
    kw = dict(prompts=[str(src)], out=str(out), decoder="ssd+csd", shard_size=4, batch_size=4, actors=1)
    first = _run(**kw)
    plan = json.loads((out / "_plan.json").read_text())
    assert first["decode_plan"]["spec"] == plan["spec"] and plan["measurements"]["batch"] == 4
    assert plan["measurements"]["seconds"] > 0
    assert plan["spec"].startswith("ar:") or "calibrated=false" in plan["spec"]  # concrete: no second calibration
    before = _committed(str(out))[0].to_pydict()
    fs = fsspec.filesystem("file")
    fs.rm(str(out / "shards" / "000001"), recursive=True)  # shard 1 lost: rerun on fresh actors
    fs.rm(str(out / "manifest.parquet"))
    assert _run(**kw)["shards_run_now"] == 1
    after = _committed(str(out))[0].to_pydict()
    assert after["prompt_id"] == before["prompt_id"] and after["tokens"] == before["tokens"]
    # plain AR, as if the device had chosen it
    forced = {"spec": "ar:cfg=3.0:temperature=1.0:top_k=0:top_p=1.0", "measurements": plan["measurements"]}
    (out / "_plan.json").write_text(json.dumps(forced))
    fs.rm(str(out / "shards" / "000001"), recursive=True)
    fs.rm(str(out / "manifest.parquet"))
    again = _run(**kw)
    assert again["decode_plan"]["rows"] == 0 and json.loads((out / "_plan.json").read_text()) == forced
    _, stats = _committed(str(out))
    assert set(stats.column("forwards").to_pylist()[4:]) == {256}  # shard 1 decoded as AR: one token a forward
    assert len(Output(str(out)).committed()) == 2


def test_each_row_records_the_resolved_spec_that_decoded_it_and_that_spec_reproduces_its_tokens(tmp_path):
    """A calibrated run (ssd+csd) whose shard 1 was re-decoded under a plan that chose plain AR: each row's
    `decoder` column, each marker, the summary and the status name the resolved spec that decoded it, never the
    requested ssd+csd (the run config keeps that); and that spec's text given back as --decoder decodes the same
    tokens."""
    import fsspec
    from ssdgen.decoders.spec import DecodeSpec
    from ssdgen.output.layout import Output
    from ssdgen.output.reader import run_status
    src, out = tmp_path / "p.parquet", tmp_path / "run"
    _write(None, src, _prompts(8))
    kw = dict(prompts=[str(src)], out=str(out), decoder="ssd+csd", shard_size=4, batch_size=4, actors=1)
    _run(**kw)
    planned = str(DecodeSpec.parse(json.loads((out / "_plan.json").read_text())["spec"]))
    plan = json.loads((out / "_plan.json").read_text())
    ar = "ar:cfg=3.0:temperature=1.0:top_k=0:top_p=1.0"
    (out / "_plan.json").write_text(json.dumps({"spec": ar, "measurements": plan["measurements"]}))
    fsspec.filesystem("file").rm(str(out / "shards" / "000001"), recursive=True)
    s = _run(**kw)
    images, stats = _committed(str(out))
    want = [planned] * 4 + [ar] * 4
    assert images.column("decoder").to_pylist() == want and stats.column("decoder").to_pylist() == want
    assert [m.decoder for _, m in sorted(Output(str(out)).committed().items())] == [planned, ar]
    by = {planned: 4, ar: 4} if planned != ar else {ar: 8}
    assert s["rows_by_decoder"] == by and run_status(str(out))["rows_by_decoder"] == by
    assert json.loads((out / "_config.json").read_text())["decoder"].startswith("ssd+csd")  # what was asked
    again = _run(**(kw | {"out": str(tmp_path / "again"), "decoder": ar}))
    assert again["rows_by_decoder"] == {ar: 8}
    tokens = _committed(str(tmp_path / "again"))[0].column("tokens").to_pylist()
    assert tokens[4:] == images.column("tokens").to_pylist()[4:]


def test_a_calibrated_run_without_a_batch_size_decodes_at_the_batch_its_plan_chose(tmp_path):
    """No --batch-size: the plan chooses the batch with the decoder, among the sizes a shard holds (4 rows here:
    1, 2 or 4); the run decodes at it, says so in its summary, and a resume takes it from `_plan.json`. A
    concrete decoder without a batch size decodes at the default, 16."""
    src, out = tmp_path / "p.parquet", tmp_path / "run"
    _write(None, src, _prompts(8))
    kw = dict(prompts=[str(src)], out=str(out), decoder="ssd+csd", shard_size=4, batch_size=None, actors=1)
    s = _run(**kw)
    m = json.loads((out / "_plan.json").read_text())["measurements"]
    assert {k.split("@")[1] for k in m["estimates"]} == {"1", "2", "4"} and m["batch"] in (1, 2, 4)
    assert s["batch_size"] == m["batch"] and s["decode_plan"]["batch"] == m["batch"]
    assert json.loads((out / "_config.json").read_text())["batch_size"] is None  # the user's setting: none
    assert _run(**kw)["nothing_to_do"]
    from ssdgen.flows.settings import RunSettings
    assert RunSettings(prompts=[str(src)], decoder="ar").fixed_batch == 16
    assert RunSettings(prompts=[str(src)]).fixed_batch is None  # ssd+csd, calibrated: its plan chooses
    assert RunSettings(prompts=[str(src)], batch_size=8).fixed_batch == 8


def test_a_plan_replayed_into_another_folder_gives_the_same_tokens(tmp_path):
    """`--plan RUN`: a second run of the same prompts and seeds into another folder decodes by the first run's
    plan (recorded as its own), not a new one, so its tokens are the first run's; a plan file works the same, and
    a missing plan, a damaged one, a bad objective or --plan with a concrete decoder is one clear error."""
    src, a, b, c = tmp_path / "p.parquet", tmp_path / "a", tmp_path / "b", tmp_path / "c"
    _write(None, src, _prompts(4))
    kw = dict(prompts=[str(src)], decoder="ssd+csd", shard_size=4, batch_size=2, actors=1)
    _run(out=str(a), **kw)
    plan = json.loads((a / "_plan.json").read_text())
    replayed = _run(out=str(b), plan=str(a), **kw)
    assert json.loads((b / "_plan.json").read_text()) == plan and replayed["decode_plan"]["spec"] == plan["spec"]
    assert _committed(str(b))[0].column("tokens").to_pylist() == _committed(str(a))[0].column("tokens").to_pylist()
    _run(out=str(c), plan=str(a / "_plan.json"), **kw)
    assert json.loads((c / "_plan.json").read_text()) == plan
    (tmp_path / "bad.json").write_text('{"spec": 3}')
    for bad, match in (({"plan": str(tmp_path / "none")}, "has no decode plan"),
                       ({"plan": str(tmp_path / "bad.json")}, "not a resolved decode plan"),
                       ({"objective": "cheap"}, "--objective must be one of throughput, latency"),
                       ({"plan": str(a), "decoder": "ar"}, "--plan replays a calibrated decoder's plan")):
        with pytest.raises(ValueError, match=match):
            _run(out=str(tmp_path / "x"), **(kw | bad))
