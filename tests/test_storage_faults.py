"""Stores that do not behave as expected (#49): deletes refused, listings that lag, markers and manifests that
point elsewhere or are hostile, an output folder replaced under the run, and a no-op rerun that must stay cheap.
Fast tests on the faulty local file system (tests/faults.py, `faultyfile://`) first; then `ssdgen generate` as a
process of its own, on it and on moto's S3 behind the fault proxy (tests/s3_proxy.py), as an operator meets them.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from faults import LAG_ENV, run_driver, storage_faults
from pipeline_helpers import eval_rows, write_parquet
from ssdgen.output.layout import Output
from ssdgen.output.lease import LEASE_DIR, Lease, LeaseHeld
from ssdgen.output.marker import Marker


def _commit(out: Output, shard: int, data: bytes = b"stats", attempt: str | None = None) -> Marker:
    """A committed shard of one file (its statistics), as flows.commit writes one."""
    attempt = out.path("shards", f"{shard:06d}", attempt) if attempt else out.new_attempt(shard)
    rec = out.store.write_bytes(f"{attempt}/stats.parquet", data, rows=1)
    m = Marker.from_dict({"shard": shard, "attempt": attempt.rsplit("/", 1)[-1], "files": [rec], "rows": 1,
                          "ok": 1, "failed": 0})
    assert out.commit(m)
    return m


# --- deletes are best-effort --------------------------------------------------------------------------------
def test_a_refused_lease_release_is_one_line_and_the_next_run_takes_the_lease_at_once(tmp_path):
    """Every delete answered 'Access Denied': the release is tried again, said in one line naming the object
    and the operation, never raised; the record left says released, so the next driver takes the lease at once
    (it used to exit 2 with the store's bare message, and the next run waited out or refused a live-looking
    record of this very process)."""
    with storage_faults() as storage:
        storage.deny_deletes = True
        url = f"faultyfile://{tmp_path}/run"
        said: list[str] = []
        with Lease(Output(url), say=said.append) as lease:
            assert lease.gen == 1
        assert storage.denied == 3  # tried again, then reported
        path = f"file://{tmp_path}/run/{LEASE_DIR}/00000001.json"
        assert len(said) == 1 and said[0].startswith(f"could not delete {path} (releasing the run's lease): "
                                                     "Access Denied"), said
        assert json.loads((tmp_path / "run" / LEASE_DIR / "00000001.json").read_text())["released"] is True
        t0, again = time.monotonic(), []
        with Lease(Output(url), ttl=30, say=again.append) as second:
            assert second.gen == 2
        assert time.monotonic() - t0 < 10 and not any("watching" in line for line in again), again


def test_gc_the_store_refuses_is_one_line_and_the_run_goes_on(tmp_path, capsys):
    with storage_faults() as storage:
        out = Output(f"faultyfile://{tmp_path}/run")
        _commit(out, 0)
        stray = out.path("shards", "000000", "attempt-0123456789ab")
        out.store.write_bytes(f"{stray}/stats.parquet", b"a crashed attempt", rows=1)
        storage.deny_deletes = True
        assert out.gc() == 0
        lines = [line for line in capsys.readouterr().err.splitlines() if line]
        assert len(lines) == 1 and lines[0].startswith(f"warning: could not delete file://{stray} (gc: "), lines
        assert "Access Denied" in lines[0] and Path(stray).is_dir()


# --- a listing that lags --------------------------------------------------------------------------------------
def test_lease_decisions_read_by_name_where_the_listing_lags(tmp_path):
    """Listings omit every file written in the last hour; reads by name see them. The holder keeps its lease
    through its renewals, a second driver is told who holds it (not 'other drivers keep taking the lease'), and
    the release removes the lease (it used to think it had lost its own lease, and left it behind)."""
    with storage_faults() as storage:
        storage.list_lag_s = 3600
        url = f"faultyfile://{tmp_path}/run"
        a = Lease(Output(url), ttl=0.4).acquire()
        try:
            time.sleep(0.6)  # renewed on its heartbeat, past half a ttl
            a.check()
            with pytest.raises(LeaseHeld, match=f"another ssdgen run is writing here .held by pid {os.getpid()}"):
                Lease(Output(url), ttl=0.4).acquire()
        finally:
            a.release()
        assert not a.lost.is_set() and not list((tmp_path / "run" / LEASE_DIR).iterdir())
        with Lease(Output(url)) as b:
            assert b.gen == 1


def test_the_run_end_names_its_own_commits_the_listing_does_not_show(tmp_path):
    from ssdgen.output.cost import price_from
    from ssdgen.output.summary import committed_totals
    with storage_faults() as storage:
        storage.list_lag_s = 3600
        out = Output(f"faultyfile://{tmp_path}/run")
        for shard in (0, 1):
            _commit(out, shard)
        assert out.marker_paths() == []  # the store's listing does not show them yet
        totals, fold = committed_totals(out, price_from("cpu"), 1.0, known=bytearray([1, 1]))
    assert totals["shards_committed"] == 2 and totals["commits_not_listed"] == [0, 1], totals
    assert pq.read_table(tmp_path / "run" / "manifest.parquet").column("shard").to_pylist() == [0, 1]


# --- as an operator meets them: `ssdgen generate` as a process of its own ---------------------------------------
def _driver_env(**faults: str) -> dict:
    from test_operations import cli_env
    return cli_env(**faults)


def _errors(p) -> list[str]:
    return [line for line in p.stderr.splitlines() if line.startswith("error:")]


@pytest.mark.slow
@pytest.mark.integration
def test_generate_on_a_listing_that_lags_names_every_commit_it_made(tmp_path):
    """Listings omit every file written in the last hour: the run exits 0 and its manifest and summary name the 3
    shards it committed (they named none), and it says the listing does not show them."""
    from test_operations import RUN_ARGS, no_traceback
    write_parquet(None, tmp_path / "p.parquet", eval_rows(12))
    p = run_driver(["generate", "--prompts", str(tmp_path / "p.parquet"), "--out", f"faultyfile://{tmp_path}/run",
                    *RUN_ARGS], _driver_env(**{LAG_ENV: "3600"}))
    no_traceback(p)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "shards 3/3 committed (3 this run)" in p.stdout, p.stdout[-2000:]
    assert "the store's listing does not show 3 committed shard(s) yet (0, 1, 2)" in p.stdout + p.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["shards_committed"] == 3 and summary["images_ok"] == 12, summary
    assert sorted(pq.read_table(tmp_path / "run" / "manifest.parquet").column("shard").to_pylist()) == [0, 1, 2]
    assert not list((tmp_path / "run" / LEASE_DIR).iterdir())  # given back: it knew its own lease


@pytest.mark.slow
@pytest.mark.integration
def test_a_role_without_delete_rights_finishes_and_resumes_with_one_line_per_refusal(s3_faults, s3):
    """Every DELETE (and every key of a DeleteObjects) answered AccessDenied, as for a write-only role: a fresh
    run commits, writes its manifest and summary and exits 0, saying once that the lease could not be deleted
    (it exited 2 on the release); a resume whose gc cannot remove an old attempt says so in one line and still
    writes both (it failed before writing them, on every rerun)."""
    from test_operations import RUN_ARGS, cli_env, no_traceback, ssdgen
    write_parquet(s3, "ssdgen-test/p.parquet", eval_rows(8))
    s3_faults.add("DELETE", r"/ssdgen-test/run/", "deny", times=None)
    s3_faults.add("POST", r"\?delete", "deny", times=None)
    args = ["generate", "--prompts", "s3://ssdgen-test/p.parquet", "--out", "s3://ssdgen-test/run", *RUN_ARGS]
    p = ssdgen(*args, env=cli_env())
    no_traceback(p)
    assert p.returncode == 0 and not _errors(p), p.stderr[-3000:]
    said = [line for line in (p.stdout + p.stderr).splitlines() if "could not delete" in line]
    assert len(said) == 1 and "s3://ssdgen-test/run/_lease/00000001.json (releasing the run's lease)" in said[0]
    assert s3.exists("ssdgen-test/run/summary.json") and s3.exists("ssdgen-test/run/manifest.parquet")

    stray = "ssdgen-test/run/shards/000000/attempt-0123456789ab/stats.parquet"
    s3.pipe_file(stray, b"an attempt a crashed driver left")  # straight to moto: the proxy refuses deletes only
    s3.rm_file("ssdgen-test/run/summary.json")  # the rerun must rebuild it, after its gc
    p = ssdgen(*args, env=cli_env())
    no_traceback(p)
    assert p.returncode == 0 and not _errors(p), p.stderr[-3000:]
    said = [line for line in (p.stdout + p.stderr).splitlines() if "could not delete" in line]
    assert any("attempt-0123456789ab (gc: " in line and "AccessDenied" in line for line in said), said
    assert s3.exists(stray)
    summary = json.loads(s3.cat_file("ssdgen-test/run/summary.json"))
    assert summary["shards_committed"] == 2 and summary["images_ok"] == 8, summary
