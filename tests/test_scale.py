"""Millions of prompts in one run: the lazy shard plan, the streaming row reader, markers streamed from storage, the
group ranges and errors of the bounded window (fast); and, slow, 2,000 shards with the tiny model: the driver's
memory stays flat (through `python -m lab bench-scale`), and a driver killed mid-run then rerun commits every
prompt_id exactly once."""

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ssdgen.inputs.files import InputFile, list_inputs
from ssdgen.inputs.shards import Piece, Shard, Shards, read_shard
from ssdgen.inputs.row_reader import RowReader
from ssdgen.output.marker import Marker

ROOT = Path(__file__).resolve().parents[1]


def _fake(n: int) -> InputFile:
    return InputFile(url=f"file:///f{n}", num_rows=n, row_groups=(n,) if n else (), size=1, has_prompt_id=False,
                     has_seed=False)


def plan_shards(files: list[InputFile], shard_size: int) -> list[Shard]:
    """The oracle: consecutive shards of `shard_size` rows over all files, built as one list, the simplest way."""
    shards, pieces, need = [], [], shard_size
    for index, f in enumerate(files):
        pos = 0
        while pos < f.num_rows:
            take = min(need, f.num_rows - pos)
            pieces.append(Piece(index, pos, pos + take))
            pos, need = pos + take, need - take
            if need == 0:
                shards.append(Shard(len(shards), tuple(pieces)))
                pieces, need = [], shard_size
    return shards + ([Shard(len(shards), tuple(pieces))] if pieces else [])


def test_lazy_plan_gives_the_same_shards_as_the_list():
    rng = random.Random(0)
    for _ in range(200):
        files = [_fake(rng.choice([0, 0, 1, 3, 7, 10, 25])) for _ in range(rng.randint(0, 6))]
        size = rng.randint(1, 12)
        plan = Shards(files, size)
        assert [plan[i] for i in range(len(plan))] == plan_shards(files, size), (files, size)
    big = Shards([_fake(10_000_000 // 100)] * 100, 1000)  # 10M rows: nothing per shard is built up front
    assert len(big) == 10_000 and big[9_999].pieces[-1].stop == 100_000
    with pytest.raises(IndexError):
        big[10_000]


def test_row_reader_reads_the_same_rows_and_stays_bounded(tmp_path):
    src = tmp_path / "p.parquet"
    pq.write_table(pa.table({"prompt": [f"a red circle {i}" for i in range(100)],
                             "prompt_id": [f"id{i}" for i in range(100)]}), src, row_group_size=30)
    files = list_inputs([str(src)])
    reader = RowReader(cursors=2)
    for shard in plan_shards(files, 7):  # shards span row-group boundaries
        assert read_shard(files, shard, 0, reader=reader) == read_shard(files, shard, 0)
        assert len(reader.cursors) <= 2
    reader.close()


def _commit(out, shard: int, attempts: int = 1) -> None:
    from ssdgen.output.layout import shard_tables
    rows = [{"prompt_id": f"s{shard}", "prompt": "x", "seed": 1}]
    from ssdgen.workers.results import Sample
    images, stats = shard_tables({f"s{shard}": Sample(f"s{shard}", "ok", latency_s=0.1)}, rows, "ar", "tiny")
    for _ in range(attempts):  # earlier attempts lose: only the last commits
        a = out.new_attempt(shard)
        files = [out.store.write_table(f"{a}/images.parquet", images),
                 out.store.write_table(f"{a}/stats.parquet", stats)]
    out.commit(Marker.from_dict({"shard": shard, "attempt": a.rsplit("/", 1)[-1], "files": files, "rows": 1,
                                 "ok": 1, "failed": 0, "wall_s": 1.0, "busy_s": 0.5, "load_s": 0.0, "devices": 1.0,
                                 "device_seconds_allocated": 1.0, "device_seconds_busy": 0.5, "device_type": "cpu"}))


def test_markers_stream_into_ids_summary_manifest_and_gc(tmp_path):
    from ssdgen.output.cost import price_for, run_summary
    from ssdgen.output.layout import Output
    out = Output(str(tmp_path / "run"))
    for s in (0, 2, 3, 11):
        _commit(out, s, attempts=2 if s == 3 else 1)
    out.new_attempt(5)  # a folder name only; an uncommitted shard's attempts stay for its retry
    assert list(out.committed_ids(12)) == [1, 0, 1, 1] + [0] * 7 + [1]
    assert [m.shard for m in out.iter_markers(chunk=3)] == [0, 2, 3, 11]
    streamed = run_summary((m.to_dict() for m in out.iter_markers(chunk=2)), price_for("cpu"), 10.0)
    assert streamed == run_summary([m.to_dict() for m in out.committed().values()], price_for("cpu"), 10.0)
    assert streamed["shards"] == 4 and streamed["reconciles"]
    url = out.write_manifest(out.iter_markers(chunk=2))
    man = pq.read_table(url.removeprefix("file://")).to_pylist()
    assert [m["shard"] for m in man] == [0, 2, 3, 11] and all(m["audit_url"] is None for m in man)
    assert out.gc() == 1  # shard 3's losing attempt; one folder per committed shard is left
    assert len(list((tmp_path / "run").glob("shards/*/attempt-*"))) == 4


def test_group_ranges_cover_each_pending_shard_once():
    from ssdgen.flows.groups import group_ranges
    rng = random.Random(1)
    for _ in range(100):
        done = bytearray(rng.random() < 0.4 for _ in range(rng.randint(0, 60)))
        size = rng.randint(1, 9)
        ranges = list(group_ranges(done, size))
        pending = [i for i, d in enumerate(done) if not d]
        covered = [i for a, b in ranges for i in range(a, b + 1) if not done[i]]
        assert covered == pending
        assert all(sum(not done[i] for i in range(a, b + 1)) == size for a, b in ranges[:-1])


def test_a_group_raises_the_worst_error_of_its_shards():
    from ssdgen.flows.ticket import Ticket
    for errors, expected in [([OSError("put"), ValueError("bad")], ValueError), ([OSError("put")], OSError),
                             ([ValueError("y"), OSError("put")], ValueError), ([], None)]:
        t = Ticket()
        for e in errors + [None]:
            t.add()
            t.done(None if e else 10, e)
        if expected is None:
            t.wait()
            assert (t.committed, t.images) == (1, 10)
        else:
            with pytest.raises(expected):
                t.wait()


# ---- 2,000 shards with the tiny model ------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.usefixtures("prefect_server", "local_ray")
@pytest.mark.integration
def test_driver_memory_stays_flat_over_2000_shards(tmp_path):
    """Today's (per-shard Prefect tasks) driver grew ~5 GB over this run; the bound is a tenth of that."""
    from typer.testing import CliRunner
    from lab.cli import app
    js, png = tmp_path / "bs.json", tmp_path / "rss.png"
    r = CliRunner().invoke(app, ["bench-scale", "--n", "20000", "--shard-size", "10", "--actors",
                                 "2", "--json", str(js), "--plot", str(png)])
    assert r.exit_code == 0, r.output
    res = json.loads(js.read_text())
    assert res["shards"] == 2000 and res["images_ok"] == 20000
    for key in ("n", "wall_s", "images_per_s", "per_shard_overhead_ms", "actor_utilization", "driver_peak_rss_mb"):
        assert res[key] is not None, key
    growth = res["driver_rss_mb_last_tenth"] - res["driver_rss_mb_first_tenth"]
    assert growth < 500, res
    assert res["driver_peak_rss_mb"] - res["driver_rss_mb_first_tenth"] < 500, res
    assert len(res["actor_peak_rss_mb"]) >= 2 and png.stat().st_size > 10_000


def _write_prompts(path: Path, n: int) -> list[str]:
    from ssdgen.reference.prompts import eval_prompts
    caps = [r["prompt"] for r in eval_prompts()]
    ids = [f"p{i:06d}" for i in range(n)]
    pq.write_table(pa.table({"prompt_id": ids, "prompt": [caps[i % len(caps)] for i in range(n)]}), path)
    return ids


def _committed_ids(out: Path) -> list[str]:
    man = pq.read_table(out / "manifest.parquet").to_pylist()
    return [i for m in man for i in pq.read_table(m["images_url"].removeprefix("file://"),
                                                   columns=["prompt_id"]).column(0).to_pylist()]


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_server", "local_ray")
@pytest.mark.integration
def test_a_driver_killed_mid_run_then_rerun_commits_every_prompt_once(tmp_path):
    import prefect.settings
    import ray
    from pipeline_helpers import run_flow
    from ssdgen.reference.tiny import tiny_model
    tiny_model(tmp_path / "tiny")
    src, out = tmp_path / "p.parquet", tmp_path / "run"
    ids = _write_prompts(src, 10_000)
    model = f"reference:{tmp_path / 'tiny'}"
    # the driver in its own process (and session), on this session's Prefect server and Ray cluster, so killing
    # it kills a real driver with its Prefect task runs and Ray actors, and leaves nothing of its own behind
    env = os.environ | {"PREFECT_API_URL": prefect.settings.PREFECT_API_URL.value(),
                        "RAY_ADDRESS": ray.get_runtime_context().gcs_address, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "ssdgen.cli", "generate", "--prompts", str(src), "--out", str(out), "--model", model,
           "--decoder", "ar", "--shard-size", "5", "--batch-size", "16", "--actors", "2", "--no-progress"]
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 300
        while len(list(out.glob("shards/*/_SUCCESS.json"))) < 400 and proc.poll() is None:
            assert time.monotonic() < deadline, "the driver committed too little in 5 minutes"
            time.sleep(0.2)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # the driver's own session: it and anything it started
        err = proc.communicate(timeout=60)[1].decode(errors="replace")
    assert proc.returncode == -signal.SIGKILL, f"the driver ended before it was killed: {err[-3000:]}"
    before = len(list(out.glob("shards/*/_SUCCESS.json")))
    assert 400 <= before < 2000
    s = run_flow(prompts=[str(src)], out=str(out), model=model, shard_size=5, batch_size=16, actors=2)
    assert s["shards_total"] == s["shards_committed"] == 2000 and not s["shards_failed"]
    assert s["shards_run_now"] == 2000 - before and s["images_ok"] == 10_000
    assert s["images_this_run"] == 5 * (2000 - before)
    assert s["reconciles"] and s["device_seconds_allocated"] > 0 and s["usd_on_demand"] > 0
    got = _committed_ids(out)
    assert len(got) == 10_000 and sorted(got) == ids  # every prompt_id exactly once
    assert len(list(out.glob("shards/*/attempt-*"))) == 2000  # the killed driver's half-written attempts are gone
