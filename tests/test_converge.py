"""The manifest and summary converge to the commit markers, and every write rides out transient faults
(output/converge.py, storage/retry.py, output/marker.py's MarkerDigest). Fast unit tests first; then real runs as an
operator meets the faults: an S3 store (moto behind tests/s3_proxy.py) that throttles longer than botocore's own
retries, or refuses every final write, and a bit flip that kept a file's size and mtime."""

from __future__ import annotations

import errno
import json
import os

import pyarrow.parquet as pq
import pytest

from ssdgen.output.converge import stale
from ssdgen.output.layout import SUMMARY, Output
from ssdgen.output.marker import Marker, MarkerDigest
from ssdgen.storage.retry import retrying, transient_io
from ssdgen.storage.store import StorageError


class _Flaky:
    def __init__(self, fails: list[BaseException]):
        self.fails, self.calls = list(fails), 0

    def __call__(self):
        self.calls += 1
        if self.fails:
            raise self.fails.pop(0)
        return "done"


def test_a_write_is_retried_through_transient_faults_with_growing_jittered_waits():
    waits: list[float] = []
    busy = StorageError(errno.EBUSY, "s3://b/run/summary.json: Device or resource busy")  # a 503 SlowDown
    fn = _Flaky([busy, ConnectionResetError(), TimeoutError(), busy])
    assert retrying(fn, deadline=60, sleep=waits.append) == "done" and fn.calls == 5
    assert len(waits) == 4 and all(0 <= w <= 0.2 * 2 ** i for i, w in enumerate(waits)), waits


@pytest.mark.parametrize("exc", [StorageError(errno.ENOSPC, "full"), StorageError(errno.EACCES, "denied"),
                                 FileNotFoundError("no bucket"), StorageError(errno.ENOENT, "no bucket"),
                                 ValueError("a bug"), RuntimeError("lost the run's lease")])
def test_what_a_retry_cannot_fix_fails_at_once(exc):
    fn = _Flaky([exc])
    with pytest.raises(type(exc)):
        retrying(fn, deadline=60, sleep=lambda s: pytest.fail("slept"))
    assert fn.calls == 1 and not transient_io(exc)


def test_retrying_stops_at_its_deadline_with_the_last_error():
    clock = [0.0]

    def sleep(s):
        clock[0] += s

    fn = _Flaky([ConnectionResetError(f"reset {i}") for i in range(10_000)])
    import ssdgen.storage.retry as retry
    real = retry.time.monotonic
    retry.time.monotonic = lambda: clock[0]
    try:
        with pytest.raises(ConnectionResetError):
            retrying(fn, deadline=30, sleep=sleep)
    finally:
        retry.time.monotonic = real
    assert clock[0] <= 30 and 5 < fn.calls < 200, (clock[0], fn.calls)


def _marker(shard: int, attempt: str) -> Marker:
    return Marker(shard=shard, files=(), attempt=attempt)


def test_the_digest_names_the_commits_whatever_their_order():
    a, b = MarkerDigest(), MarkerDigest()
    for m in [_marker(0, "x"), _marker(1, "y"), _marker(2, "z")]:
        a.add(m)
    for m in [_marker(2, "z"), _marker(0, "x"), _marker(1, "y")]:
        b.add(m)
    c = MarkerDigest()
    for m in [_marker(0, "x"), _marker(1, "y"), _marker(2, "other attempt")]:  # a re-decoded shard
        c.add(m)
    assert a.value() == b.value() != c.value() and a.value().startswith("3:")


def test_stale_says_which_file_lags_the_markers(tmp_path):
    out = Output(str(tmp_path / "run"))
    now = MarkerDigest()
    for m in [_marker(0, "a"), _marker(1, "b")]:
        now.add(m)
    assert stale(out, now.value()) == "summary.json is missing (2 shards committed)"
    out.write_summary({"shards_committed": 2, "markers_digest": now.value()})
    assert stale(out, now.value()) == "manifest.parquet is missing (2 shards committed)"
    out.write_manifest([_marker(0, "a")])  # written when one shard was committed
    assert stale(out, now.value()) == "manifest.parquet names 1 committed shards, the markers now say 2"
    out.write_manifest([_marker(0, "a"), _marker(1, "b")])
    assert stale(out, now.value()) is None
    out.write_summary({"shards_committed": 2})  # an older ssdgen's
    assert "does not record which commits" in stale(out, now.value())
    (tmp_path / "run" / SUMMARY).write_text('{"shards_committed": ')
    assert stale(out, now.value()) == "summary.json is not valid JSON"


# ---------------------------------------------------------------------------------------------------------- runs
def _manifest_shards(fs, path) -> list[int]:
    with fs.open(path, "rb") as f:
        return sorted(pq.read_table(f).column("shard").to_pylist())


@pytest.mark.slow
@pytest.mark.integration
def test_failed_final_writes_exit_in_one_line_and_the_next_run_rebuilds_them(s3_faults, s3):
    """The issue's run: every PUT of summary.json and manifest.parquet answered 503 (past botocore's retries and
    ours); then the same command on a healthy store brings both up to date; then there is nothing to do."""
    from pipeline_helpers import eval_rows, write_parquet
    from test_operations import RUN_ARGS, cli_env, no_traceback, one_error, ssdgen
    write_parquet(s3, "ssdgen-test/p.parquet", eval_rows(12))
    args = ["generate", "--prompts", "s3://ssdgen-test/p.parquet", "--out", "s3://ssdgen-test/run", *RUN_ARGS]
    env = cli_env(SSDGEN_WRITE_DEADLINE_S="3")
    s3_faults.add("PUT", r"/run/(summary\.json|manifest\.parquet)", "slowdown", times=None)
    p = ssdgen(*args, env=env)
    line = one_error(p, "could not write manifest.parquet and summary.json", "3 committed shards are safe",
                     "verify --repair")
    assert "s3://ssdgen-test/run/manifest.parquet" in line, line
    assert len(s3.find("ssdgen-test/run/shards", maxdepth=None)) and not s3.exists("ssdgen-test/run/summary.json")
    assert len([k for k in s3.find("ssdgen-test/run/shards") if k.endswith("_SUCCESS.json")]) == 3

    s3_faults.clear()
    before = s3_faults.fired("slowdown")
    s3_faults.add("PUT", r"/run/summary\.json", "slowdown", times=8)  # throttled longer than botocore retries
    p = ssdgen(*args, env=env)
    no_traceback(p)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "rebuilding manifest.parquet and summary.json" in p.stdout, p.stdout[-2000:]
    assert s3_faults.fired("slowdown") - before == 8
    summary = json.loads(s3.cat_file("ssdgen-test/run/summary.json"))
    assert summary["shards_committed"] == 3 and summary["images_ok"] == 12, summary
    assert _manifest_shards(s3, "ssdgen-test/run/manifest.parquet") == [0, 1, 2]

    p = ssdgen(*args, env=env)
    no_traceback(p)
    assert p.returncode == 0 and "nothing to do" in p.stdout, p.stdout[-2000:] + p.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.integration
def test_verify_records_a_flip_the_cheap_check_misses_and_repairs_a_stale_manifest(tmp_path):
    """A bit flip that kept the file's size and mtime: `verify` finds it and sets the shard aside, so the next
    `generate` re-decodes it (its cheap check alone would say "nothing to do"). `verify --repair` rebuilds a
    manifest left behind."""
    import fsspec
    from pipeline_helpers import eval_rows, write_parquet
    from test_operations import RUN_ARGS, no_traceback, one_error, ssdgen
    write_parquet(None, tmp_path / "p.parquet", eval_rows(8))
    run = tmp_path / "run"
    args = ["generate", "--prompts", str(tmp_path / "p.parquet"), "--out", str(run), *RUN_ARGS]
    assert ssdgen(*args).returncode == 0
    stats = next(run.glob("shards/000001/attempt-*/stats.parquet"))
    st = stats.stat()
    data = bytearray(stats.read_bytes())
    data[len(data) // 2] ^= 0x01
    stats.write_bytes(bytes(data))
    os.utime(stats, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert "nothing to do" in ssdgen(*args).stdout  # the cheap check cannot see it

    p = ssdgen("verify", "--read-only", str(run))
    assert p.returncode == 1 and "damaged: shard 1" in p.stdout and not list(run.glob("shards/*/_DAMAGED-*"))
    p = ssdgen("verify", str(run))
    no_traceback(p)
    assert p.returncode == 1 and "damaged: shard 1" in p.stdout and "(set aside)" in p.stdout, p.stdout
    assert list(run.glob("shards/000001/_DAMAGED-*.json")) and not (run / "shards/000001/_SUCCESS.json").exists()
    assert "rebuilt manifest.parquet and summary.json from 1 commit markers" in p.stdout, p.stdout
    assert _manifest_shards(fsspec.filesystem("file"), str(run / "manifest.parquet")) == [0]

    p = ssdgen(*args)
    no_traceback(p)
    assert p.returncode == 0 and "shards 2/2 committed (1 this run)" in p.stdout, p.stdout[-2000:]
    assert ssdgen("verify", str(run)).returncode == 0

    (run / "manifest.parquet").unlink()
    p = ssdgen("verify", "--read-only", str(run))
    assert p.returncode == 0 and "out of date: manifest.parquet is missing" in p.stderr, p.stderr
    assert not (run / "manifest.parquet").exists()
    one_error(ssdgen("verify", "--read-only", "--repair", str(run)), "--repair", "--read-only")
    p = ssdgen("verify", "--repair", str(run))
    no_traceback(p)
    assert p.returncode == 0 and "rebuilt manifest.parquet and summary.json from 2 commit markers" in p.stdout
    assert _manifest_shards(fsspec.filesystem("file"), str(run / "manifest.parquet")) == [0, 1]
    assert "nothing to do" in ssdgen(*args).stdout
