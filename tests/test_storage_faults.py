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

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from faults import DROP_ENV, LAG_ENV, run_driver, storage_faults
from pipeline_helpers import eval_rows, write_parquet
from ssdgen.output.layout import Output
from ssdgen.output.lease import LEASE_DIR, Lease, LeaseHeld
from ssdgen.output.marker import Marker
from ssdgen.output.damage import damaged_shards


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
    assert totals["listing_digest"] is None  # the next run checks every marker
    assert pq.read_table(tmp_path / "run" / "manifest.parquet").column("shard").to_pylist() == [0, 1]


# --- markers and manifests: nothing outside the run is read through them ----------------------------------------
def _marker_at(run: Path, shard: int, marker: dict | bytes) -> None:
    p = run / "shards" / f"{shard:06d}" / "_SUCCESS.json"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(marker if isinstance(marker, bytes) else json.dumps(marker).encode())


def test_a_marker_in_another_shards_folder_is_damage_and_the_manifest_names_each_shard_once(tmp_path):
    out = Output(str(tmp_path / "run"))
    m0 = _commit(out, 0)
    _marker_at(tmp_path / "run", 1, m0.to_dict())  # shard 0's marker copied into shard 1's folder
    found = list(damaged_shards(out))
    assert [(d.shard, d.url.endswith("000001/_SUCCESS.json")) for d in found] == [(1, True)], found
    assert "names shard 0 but is in shard 1's folder" in found[0].problem
    out.set_aside(1)
    out.write_manifest(out.iter_markers())
    assert pq.read_table(tmp_path / "run" / "manifest.parquet").column("shard").to_pylist() == [0]


@pytest.mark.parametrize("edit, problem", [
    (lambda m, other: m | {"files": []}, "names no file"),
    (lambda m, other: m | {"files": [m["files"][0] | {"sha256": None}]}, "wrong kind"),
    (lambda m, other: m | {"files": [m["files"][0] | {"sha256": ""}]}, "without a SHA-256"),
    (lambda m, other: m | {"files": [m["files"][0] | {"path": "shards/000000/attempt-x/../../../../etc/passwd"}]},
     "outside its shard's attempt folders"),
    (lambda m, other: m | {"files": other["files"]}, "outside its shard's attempt folders"),  # shard 0's file
    (lambda m, other: m | {"ok": "4"}, "ok is \"4\", not a count"),
])
def test_a_marker_that_names_no_file_or_a_file_outside_its_shard_is_damage(tmp_path, edit, problem):
    out = Output(str(tmp_path / "run"))
    m0 = _commit(out, 0)
    m1 = _commit(out, 1)
    _marker_at(tmp_path / "run", 1, edit(m1.to_dict(), m0.to_dict()))
    found = list(damaged_shards(out))
    assert [d.shard for d in found] == [1] and problem in found[0].problem, found


def test_a_hostile_marker_is_named_and_set_aside_never_fatal(tmp_path):
    """100,000 nested brackets: status, verify and a resume's check name the file (they stopped with
    'maximum recursion depth exceeded' naming none), and the shard is set aside like any damaged one."""
    from ssdgen.output.reader import run_status
    out = Output(str(tmp_path / "run"))
    out.write_config({"inputs": [{"url": "p.parquet", "rows": 8}], "shard_size": 4}, replacing=False)
    _commit(out, 0)
    _commit(out, 1)
    _marker_at(tmp_path / "run", 1, b"[" * 100_000)
    found = list(damaged_shards(out, deep=True))
    assert [d.shard for d in found] == [1] and "nested too deeply" in found[0].problem, found
    assert found[0].url == f"file://{tmp_path}/run/shards/000001/_SUCCESS.json"
    status = run_status(str(tmp_path / "run"))
    assert status["shards_done"] == 1 and [d.shard for d in status["damaged"]] == [1]
    out.set_aside(1)
    assert list(damaged_shards(out)) == [] and list((tmp_path / "run" / "shards" / "000001").glob("_DAMAGED-*"))


def _exported_run(tmp_path: Path) -> Path:
    """A committed run of one shard with its images and statistics Parquet, its manifest and summary."""
    from ssdgen.output.cost import price_from
    from ssdgen.output.layout import IMAGES_SCHEMA, STATS_SCHEMA
    from ssdgen.output.summary import committed_totals, write_summary
    from ssdgen.storage.store import parquet_bytes
    out = Output(str(tmp_path / "run"))
    out.write_config({"inputs": [], "shard_size": 4, "model": "reference", "decoder": "ar"}, replacing=False)
    attempt = out.new_attempt(0)
    files = [out.store.write_bytes(f"{attempt}/{name}.parquet", parquet_bytes(schema.empty_table()), rows=0)
             for name, schema in (("images", IMAGES_SCHEMA), ("stats", STATS_SCHEMA))]
    assert out.commit(Marker.from_dict({"shard": 0, "attempt": attempt.rsplit("/", 1)[-1], "files": files}))
    totals, _ = committed_totals(out, price_from("cpu"), 1.0)
    write_summary(out, totals)
    return tmp_path / "run"


def test_a_manifest_row_naming_a_file_outside_the_run_is_never_read_through(tmp_path):
    """A manifest row whose images_url names a file outside the run, with a null SHA-256: export copied that
    file (rc 0) and verify noticed nothing. Now export refuses in one line naming the row, verify says the
    manifest is damaged and rebuilds it from the markers, and export then works."""
    from ssdgen.output.converge import check_run
    from ssdgen.output.export import export
    run = _exported_run(tmp_path)
    (tmp_path / "secret.parquet").write_bytes((run / "manifest.parquet").read_bytes())  # any file outside
    man = pq.read_table(run / "manifest.parquet")
    meta = pq.read_metadata(run / "manifest.parquet").metadata  # which commits it names: the same
    rows = [r | {"images_url": f"file://{tmp_path}/secret.parquet", "images_sha256": None} for r in man.to_pylist()]
    pq.write_table(pa.Table.from_pylist(rows, schema=man.schema.with_metadata(meta)), run / "manifest.parquet")
    with pytest.raises(ValueError) as e:
        export(str(run), str(tmp_path / "export"), "parquet")
    line = str(e.value)
    assert "manifest.parquet: damaged: shard 0's images_url" in line and "secret.parquet" in line, line
    assert "not in its shard's attempt folders" in line and "\n" not in line
    assert not (tmp_path / "export").exists() or not list((tmp_path / "export").rglob("*.parquet"))
    report = check_run(str(run), read_only=True)
    assert report["stale"] and "manifest.parquet is damaged" in report["stale"], report
    assert check_run(str(run))["rebuilt"] is not None
    assert export(str(run), str(tmp_path / "export"), "parquet")["shards"] == 1


def test_a_manifest_naming_a_shard_twice_is_damaged(tmp_path):
    from ssdgen.output.reader import committed_shards
    run = _exported_run(tmp_path)
    man = pq.read_table(run / "manifest.parquet")
    pq.write_table(pa.concat_tables([man, man]), run / "manifest.parquet")
    with pytest.raises(ValueError, match="shard 0 is named twice"):
        committed_shards(str(run))


# --- an output folder replaced under the run --------------------------------------------------------------------
def test_a_folder_replaced_under_the_run_stops_it_at_the_next_commit(tmp_path):
    from ssdgen.output.lease import OutputGone
    out = Output(str(tmp_path / "run"))
    out.write_config({"shard_size": 4}, replacing=False)
    lease = Lease(out).acquire()
    try:
        out.fence = lease.check
        lease.guard()  # the run's folder: its lease and config are there
        (tmp_path / "run").rename(tmp_path / "mounted")  # the mount went: the path names the disk beneath
        with pytest.raises(OutputGone, match="the run's folder was replaced while the run wrote to it .*"
                                             "_config.json and the lease record are gone"):
            lease.guard()
        with pytest.raises(OutputGone):
            out.store.put(out.path("summary.json"), b"{}")
    finally:
        lease.release()
    assert not (tmp_path / "run").exists()  # nothing written into the new folder, not even the lease's
    assert list((tmp_path / "mounted" / LEASE_DIR).iterdir())  # the old one is untouched


# --- a rerun with nothing to do stays cheap -----------------------------------------------------------------------
def _synthetic_run(tmp_path: Path, shards: int):
    """A committed run of `shards` one-row shards, made the way a run's end makes it (no decoding)."""
    from ssdgen.flows.prepare import prepare
    from ssdgen.flows.settings import RunSettings
    from ssdgen.inputs.growth import digests_for
    from ssdgen.output.cost import price_from
    from ssdgen.output.layout import ROW_DIGESTS
    from ssdgen.output.summary import committed_totals, write_summary
    write_parquet(None, tmp_path / "p.parquet", eval_rows(shards))
    cfg = RunSettings(prompts=(str(tmp_path / "p.parquet"),), out=str(tmp_path / "run"), decoder="ar",
                      shard_size=1, batch_size=1)
    prep = prepare(cfg)
    prep.out.write_config(prep.record | {ROW_DIGESTS: digests_for(prep.files, prep.record["inputs"], [], None)},
                          replacing=False)
    for i in range(shards):
        _commit(prep.out, i)
    totals, _ = committed_totals(prep.out, price_from("cpu"), 1.0)
    write_summary(prep.out, totals | {"shards_total": shards})
    return cfg


def test_a_rerun_with_nothing_to_do_reads_no_marker(tmp_path, monkeypatch):
    """Over 200 shards the no-op rerun's check is one listing and the run's own small files: it read every
    marker (the issue's 37 s over 1,010 shards). Any change under shards/ brings the full check back."""
    from fsspec.implementations.local import LocalFileSystem
    from ssdgen.flows.prepare import prepare
    cfg = _synthetic_run(tmp_path, 200)
    reads: list[str] = []
    real = LocalFileSystem._open

    def counted(self, path, *a, **k):
        reads.append(str(path))
        return real(self, path, *a, **k)
    monkeypatch.setattr(LocalFileSystem, "_open", counted)
    prep = prepare(cfg)
    assert prep.pending == 0 and prep.stale is None and not prep.damaged
    assert [p for p in reads if "/shards/" in p] == [], len(reads)
    stats = next((tmp_path / "run" / "shards" / "000007").glob("attempt-*/stats.parquet"))
    stats.write_bytes(b"statz")  # the same size, another mtime and content: the listing differs
    reads.clear()
    prep = prepare(cfg)
    assert [d.shard for d in prep.damaged] == [7] and "SHA-256" in prep.damaged[0].problem
    assert len([p for p in reads if p.endswith("_SUCCESS.json")]) == 200


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
def test_generate_stops_in_one_line_when_its_folder_is_replaced_under_it(tmp_path):
    """The output's mount goes as the second commit begins: the run stops in one line at its next commit (or
    before its manifest), and writes no config, manifest or summary into the folder beneath (it used to end
    'Completed' there)."""
    from test_operations import RUN_ARGS, no_traceback
    write_parquet(None, tmp_path / "p.parquet", eval_rows(12))
    p = run_driver(["generate", "--prompts", str(tmp_path / "p.parquet"), "--out", f"faultyfile://{tmp_path}/run",
                    *RUN_ARGS], _driver_env(**{DROP_ENV: "1"}))
    no_traceback(p)
    errors = _errors(p)
    assert p.returncode == 2 and len(errors) == 1, p.stdout[-2000:] + p.stderr[-3000:]
    assert "the run's folder was replaced while the run wrote to it" in errors[0], errors
    assert "run the same command to resume" in errors[0], errors
    new, old = tmp_path / "run", tmp_path / "run.dropped"
    assert not any((new / name).exists() for name in ("_config.json", "summary.json", "manifest.parquet"))
    assert (old / "_config.json").exists() and len(list(old.glob("shards/*/_SUCCESS.json"))) == 1


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
