"""Real runs (moto's S3 server, a local Ray, Prefect's test server, the tiny model) for inputs pinned at the run's
start, odd paths through every command, and the driver's memory on long prompts (inputs/pinned.py,
inputs/row_reader.py; the fast tests are in tests/test_inputs_pinned.py)."""

import logging
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pyarrow as pa
import pytest
from pipeline_helpers import committed_tables, eval_rows, run_flow, write_parquet
from typer.testing import CliRunner

ROOT = Path(__file__).resolve().parents[1]
ODD = "br[1] a#b%20c é"  # brackets (a glob's character class), a space, '#', '%' and unicode
TWIN = "br1 a#b%20c é"   # what `br[1]` matches as a glob

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_server", "local_ray")]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from ssdgen.reference.tiny import tiny_model
    path = tmp_path_factory.mktemp("tiny") / "model"
    tiny_model(path)  # 4x4 tokens: a shard decodes in a blink
    return f"reference:{path}"


def _versions(n: int = 32):
    """The prompts file's two versions: the same prompt_ids and row groups, other texts."""
    old = eval_rows(n)
    new = [{"prompt_id": r["prompt_id"], "prompt": x["prompt"]} for r, x in zip(old, eval_rows(n, start=n))]
    assert all(a["prompt"] != b["prompt"] for a, b in zip(old, new))
    return old, new


def _parquet(rows) -> bytes:
    import io
    import pyarrow.parquet as pq
    buf = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), buf, row_group_size=4)  # a row group per shard
    return buf.getvalue()


def _overwrite_after_first_commit(monkeypatch, fs, key: str, data: bytes) -> list:
    """Replace the prompts object right after the run's first shard commits; returns [that shard] once done."""
    from ssdgen.output.layout import Output
    orig, done, lock = Output.commit, [], threading.Lock()

    def commit(self, marker):
        won = orig(self, marker)
        with lock:
            if not done:
                fs.pipe_file(key, data)
                done.append(marker.shard)
        return won

    monkeypatch.setattr(Output, "commit", commit)
    return done


def _committed_prompts(out: str) -> dict[str, str]:
    images, _ = committed_tables(out)
    return dict(zip(images.column("prompt_id").to_pylist(), images.column("prompt").to_pylist()))


def test_an_s3_prompts_object_overwritten_mid_run_fails_the_shards_left_and_never_mixes(s3, tiny, monkeypatch):
    old, new = _versions()
    key, out = "ssdgen-test/in/p.parquet", "s3://ssdgen-test/run"
    s3.pipe_file(key, _parquet(old))
    replaced = _overwrite_after_first_commit(monkeypatch, s3, key, _parquet(new))
    with pytest.raises(RuntimeError) as e:
        run_flow(prompts=[f"s3://{key}"], out=out, model=tiny, shard_size=4, batch_size=4, actors=1)
    assert replaced, "the object was never replaced"
    msg = str(e.value)
    assert "\n" not in msg and f"s3://{key}: the file changed since the run started" in msg, msg
    got = _committed_prompts(out)
    assert 4 <= len(got) < 32  # the shards read before the overwrite committed, the others failed
    assert got == {r["prompt_id"]: r["prompt"] for r in old if r["prompt_id"] in got}  # old text only


def test_a_versioned_s3_prompts_object_overwritten_mid_run_is_read_at_its_pinned_version(s3, tiny, monkeypatch):
    old, new = _versions()
    key, out = "ssdgen-test/in/p.parquet", "s3://ssdgen-test/run"
    s3.make_bucket_versioned("ssdgen-test")
    s3.pipe_file(key, _parquet(old))
    replaced = _overwrite_after_first_commit(monkeypatch, s3, key, _parquet(new))
    s = run_flow(prompts=[f"s3://{key}"], out=out, model=tiny, shard_size=4, batch_size=4, actors=1)
    assert replaced and s["shards_committed"] == 8 and not s["shards_failed"]
    assert _committed_prompts(out) == {r["prompt_id"]: r["prompt"] for r in old}  # the old text throughout


def _cli(*args):
    from ssdgen.cli import app
    r = CliRunner().invoke(app, [str(a) for a in args])
    assert r.exit_code == 0, r.output
    assert "Traceback" not in r.output and "['" not in r.output, r.output  # no stack, no Python list
    return r.output


@pytest.mark.slow
@pytest.mark.parametrize("store", ["local", "s3"])
def test_odd_paths_work_for_prompts_and_out_in_every_command(store, tiny, tmp_path, request, caplog):
    if store == "s3":
        fs, base = request.getfixturevalue("s3"), "s3://ssdgen-test"
        # moto's request log would reach Prefect's console handler, whose stream CliRunner closed: not ours
        caplog.set_level(logging.ERROR, logger="werkzeug")
    else:
        import fsspec
        fs, base = fsspec.filesystem("file"), str(tmp_path)
    rows = eval_rows(8)
    prompts, out, twin = f"{base}/in[1] #%20 é/p[1].parquet", f"{base}/{ODD}", f"{base}/{TWIN}"
    decoy = f"{twin}/shards/000000/_SUCCESS.json".split("://")[-1]  # read, listed or deleted: a test failure
    for path in (prompts, decoy, f"{base}/in1 #%20 é/p1.parquet"):
        if store == "local":
            fs.makedirs(os.path.dirname(path), exist_ok=True)
    write_parquet(fs, f"{base}/in1 #%20 é/p1.parquet".split("://")[-1], eval_rows(3))  # what a glob would take
    write_parquet(fs, prompts.split("://")[-1], rows)
    fs.pipe_file(decoy, b"not a marker")
    args = ["--prompts", prompts, "--model", tiny, "--decoder", "ar", "--shard-size", 4, "--batch-size", 4,
            "--actors", 1, "--format", "both", "--no-progress"]
    assert "shards 2/2 committed (2 this run); images ok 8" in _cli("generate", *args, "--out", out)
    assert f"{out}: 2 done, 0 pending, 0 failed of 2 shards; images ok 8" in _cli("status", out)
    assert "ok: 2 committed shards checked" in _cli("verify", out)
    assert "2 committed shards, 8 images ok" in _cli("report", out, "--html", tmp_path / f"{ODD}.html")
    for fmt in ("webdataset", "parquet"):
        assert "exported 2 committed shards" in _cli("export", out, "--to", f"{base}/ex[1] é {fmt}", "--format", fmt)
    assert "nothing to do: all 2 shards" in _cli("generate", *args, "--out", out)
    assert sorted(_committed_prompts(out).items()) == sorted((r["prompt_id"], r["prompt"]) for r in rows)
    assert fs.cat_file(decoy) == b"not a marker"
    assert fs.find(twin.split("://")[-1]) == [decoy]


# ---- the driver's memory -------------------------------------------------------------------------------

WRITE = """import sys, numpy as np, pyarrow as pa, pyarrow.parquet as pq
path, n, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
letters = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz    ", dtype=np.uint8)
rows = np.tile(letters[np.random.default_rng(0).integers(0, len(letters), size)], (n, 1))
for k in range(7):  # each prompt starts with its row number: no two alike
    rows[:, 6 - k] = 48 + (np.arange(n) // 10**k) % 10
offsets = pa.array(np.arange(0, n * size + 1, size, dtype=np.int32))
prompts = pa.StringArray.from_buffers(n, offsets.buffers()[1], pa.py_buffer(rows.tobytes()))
ids = pa.array([f"p{j:07d}" for j in range(n)])
pq.write_table(pa.table({"prompt_id": ids, "prompt": prompts}), path, row_group_size=n)  # ONE row group
"""

# The peak is VmHWM, this process's own high-water mark. Not ru_maxrss: after a fork or vfork and exec it is
# at least the parent's peak (Linux carries the old image's high-water mark over), so in a long pytest session
# it reported pytest's 1.24 GB as the driver's.
DRIVER = """import sys
from ssdgen.cli import main
try:
    main()
finally:
    hwm = next(int(x.split()[1]) for x in open("/proc/self/status") if x.startswith("VmHWM:"))
    print(f"driver peak RSS {hwm // 1024} MB", file=sys.stderr)
"""


@pytest.mark.slow
def test_the_driver_holds_no_more_than_a_window_of_prompts_100k_of_10kb_in_one_row_group(tiny, tmp_path):
    """100,000 prompts of 10 KB (1 GB of text) in a single row group: the driver read whole row groups and
    peaked at 3.1-4.2 GB; streaming them in record batches it peaks under 1 GB (about 0.8 GB, of which ~0.35 GB
    is Prefect, Ray and the model code a run of short prompts also holds). The tiny model rejects such prompts
    (unknown words) without decoding, so the run measures reading, dispatch and writing."""
    import prefect.settings
    import ray
    src, out = tmp_path / "long.parquet", tmp_path / "run"
    subprocess.run([sys.executable, "-c", WRITE, str(src), "100000", "10000"], check=True)
    env = os.environ | {"PREFECT_API_URL": prefect.settings.PREFECT_API_URL.value(),
                        "RAY_ADDRESS": ray.get_runtime_context().gcs_address, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-c", DRIVER, "generate", "--prompts", str(src), "--out", str(out), "--model", tiny,
           "--decoder", "ar", "--shard-size", "1000", "--batch-size", "250", "--actors", "2", "--no-progress"]
    r = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=800)
    assert "shards 100/100 committed (100 this run); images ok 0, failed 100000" in r.stdout, r.stderr[-3000:]
    peak = int(re.search(r"driver peak RSS (\d+) MB", r.stderr).group(1))
    print(f"driver peak RSS: {peak} MB for 100,000 prompts of 10 KB in one row group")
    assert peak <= 1024, peak
