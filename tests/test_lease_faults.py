"""The lease under real faults, with `ssdgen generate` as a process of its own, as an operator meets them:

- a driver frozen (SIGSTOP) after its first commit while a second one takes the output over and finishes it,
  then woken (SIGCONT): it changes nothing (no attempt folder, no summary or manifest) and exits with one line;
- a run on S3 behind the fault proxy (tests/s3_proxy.py) that finds a corrupt lease left behind, loses the answers
  to its own lease and commit PUTs, and is throttled: it names the corrupt lease, takes it over after the ttl,
  never refuses itself, and counts every commit as its own.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline_helpers import committed_tables, eval_rows, write_parquet
from test_operations import RUN_ARGS, ROOT, cli_env, no_traceback, one_error, ssdgen, wait_for

pytestmark = pytest.mark.integration

TTL_S = 5  # short, so the takeover comes soon; long enough that a loaded machine's driver renews in time


def _files(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under the run: its size and mtime, so any write shows."""
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")
            if p.is_file()}


@pytest.mark.slow
def test_a_frozen_driver_changes_nothing_once_it_wakes(tmp_path):
    write_parquet(None, tmp_path / "p.parquet", eval_rows(12))
    out, log = tmp_path / "run", tmp_path / "a.log"
    args = ["generate", "--prompts", str(tmp_path / "p.parquet"), "--out", str(out), *RUN_ARGS]
    env = cli_env(SSDGEN_LEASE_TTL_S=str(TTL_S))
    with open(log, "wb") as f:
        a = subprocess.Popen([sys.executable, "-m", "ssdgen.cli", *args], env=env, cwd=ROOT, stdout=f,
                             stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for(lambda: any(out.glob("shards/*/_SUCCESS.json")), a, log, timeout=240)
        os.kill(a.pid, signal.SIGSTOP)  # the driver alone: its Ray and Prefect server run on, as a stalled one's do
        assert len(list(out.glob("shards/*/_SUCCESS.json"))) < 3, "the first driver finished before it froze"
        time.sleep(TTL_S + 1)  # its heartbeat is now over the ttl old, on this host's clock
        b = ssdgen(*args, env=env)
        no_traceback(b)
        assert b.returncode == 0, b.stderr[-3000:]
        assert f"took the lease over: held by pid {a.pid}" in b.stderr, b.stderr[-3000:]
        finished = _files(out)
        assert not any(p.startswith("_lease") for p in finished)  # the second driver gave the lease back
        os.kill(a.pid, signal.SIGCONT)
        a.wait(timeout=180)
    finally:
        if a.poll() is None:
            os.killpg(a.pid, signal.SIGCONT)
            os.killpg(a.pid, signal.SIGKILL)
            a.wait(timeout=60)
    text = log.read_text(errors="replace")
    assert "Traceback" not in text, text[-4000:]
    errors = [line for line in text.splitlines() if line.startswith("error:")]
    assert a.returncode != 0 and len(errors) == 1, text[-3000:]
    assert "lost the run's lease" in errors[0] and "writing anything more" in errors[0], errors[0]
    assert _files(out) == finished  # no attempt folder, summary, manifest or lease of its own: nothing changed
    summary = json.loads((out / "summary.json").read_text())
    assert summary["shards_committed"] == 3 and not summary["shards_failed"], summary
    ids = committed_tables(str(out))[0].column("prompt_id").to_pylist()
    assert sorted(ids) == sorted(r["prompt_id"] for r in eval_rows(12))


@pytest.mark.slow
def test_an_s3_run_survives_lost_answers_throttling_and_a_corrupt_lease(s3_faults, s3):
    """The corrupt lease is named and taken over after the ttl; the lost answers to the run's own lease PUT and
    to a commit PUT do not make it refuse itself or count the commit as another attempt's."""
    write_parquet(s3, "ssdgen-test/p.parquet", eval_rows(12))
    s3.pipe_file("ssdgen-test/run/_lease/00000001.json", b'{"host": "gone", "pid": 7, "heartbeat": "then"}')
    s3_faults.add("PUT", r"/run/_lease/00000002\.json", "lose")
    s3_faults.add("PUT", r"/run/shards/000001/_SUCCESS\.json", "lose")
    s3_faults.add("PUT", r"/attempt-[0-9a-f]+/images\.parquet", "slowdown", times=2)
    s3_faults.add("*", r"/run/_config\.json", "error")
    t0 = time.monotonic()
    p = ssdgen("generate", "--prompts", "s3://ssdgen-test/p.parquet", "--out", "s3://ssdgen-test/run", *RUN_ARGS,
               env=cli_env(SSDGEN_LEASE_TTL_S=str(TTL_S)))
    no_traceback(p)
    assert p.returncode == 0, p.stderr[-3000:]
    assert time.monotonic() - t0 > TTL_S
    lease = "s3://ssdgen-test/run/_lease/00000001.json is not a lease record"
    assert f'{lease} (heartbeat is "then", not a number)' in p.stderr, p.stderr[-3000:]
    assert "another ssdgen run is writing here" not in p.stdout + p.stderr
    assert (s3_faults.fired("lose"), s3_faults.fired("slowdown"), s3_faults.fired("error")) == (2, 2, 1), \
        s3_faults.log
    summary = json.loads(s3.cat_file("ssdgen-test/run/summary.json"))
    assert summary["shards_run_now"] == summary["shards_committed"] == 3, summary  # the lost answer's commit too
    ids = committed_tables("s3://ssdgen-test/run")[0].column("prompt_id").to_pylist()
    assert sorted(ids) == sorted(r["prompt_id"] for r in eval_rows(12))
    assert not s3.find("ssdgen-test/run/_lease")  # given back, the corrupt one with it


def test_a_corrupt_lease_on_a_live_run_is_refused_naming_it(tmp_path):
    """A lease file that is not a record and keeps changing (another program writes there) is not taken over:
    one error line names it."""
    write_parquet(None, tmp_path / "p.parquet", eval_rows(4))
    lease = tmp_path / "run" / "_lease" / "00000001.json"
    lease.parent.mkdir(parents=True)
    code = ("import sys, time\nn = 0\nwhile True:\n    n += 1\n    open(sys.argv[1] + '.tmp', 'w').write(str(n))\n"
            "    __import__('os').replace(sys.argv[1] + '.tmp', sys.argv[1])\n    time.sleep(0.2)\n")
    lease.write_text("0")
    writer = subprocess.Popen([sys.executable, "-c", code, str(lease)])
    try:
        p = ssdgen("generate", "--prompts", str(tmp_path / "p.parquet"), "--out", str(tmp_path / "run"), *RUN_ARGS,
                   env=cli_env(SSDGEN_LEASE_TTL_S=str(TTL_S)), timeout=60)
    finally:
        writer.kill()
        writer.wait()
    one_error(p, "another ssdgen run is writing here", f"{lease} is not a lease record", "changed while")
