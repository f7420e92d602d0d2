"""The output's lease (output/lease.py): one driver per output, on a local disk and on moto's S3 server (behind the
fault proxy where an answer gets lost); holders judged on the observer's clock; fencing of a driver that lost it.
"""

import json
import os
import socket
import subprocess
import threading
import time

import pytest

from ssdgen.output.layout import Output
from ssdgen.output.lease import LEASE_DIR, Lease, LeaseHeld, LeaseLost
from ssdgen.output.marker import FileRecord, Marker


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def _record(out: Output, gen: int, **kw) -> None:
    rec = {"owner": "x", "host": socket.gethostname(), "pid": os.getpid(), "started_at": "then",
           "heartbeat": time.time()} | kw
    out.store.put(out.path(LEASE_DIR, f"{gen:08d}.json"), json.dumps(rec).encode())


def test_a_held_lease_refuses_a_second_driver_naming_the_holder(tmp_path):
    out = Output(str(tmp_path / "run"))
    with Lease(out):
        with pytest.raises(LeaseHeld, match=f"pid {os.getpid()} on {socket.gethostname()}"):
            Lease(out).acquire()
        with pytest.raises(LeaseHeld):
            Lease(out).check_free()
    assert list((tmp_path / "run" / LEASE_DIR).iterdir()) == []  # given back
    with Lease(out) as again:  # and free again
        assert again.gen == 1


@pytest.mark.parametrize("holder", [{"pid": "dead"}, {"host": "elsewhere", "heartbeat": 0.0}])
def test_a_dead_or_silent_holder_is_taken_over(tmp_path, holder):
    out = Output(str(tmp_path / "run"))
    _record(out, 1, **({"pid": _dead_pid()} if holder.get("pid") == "dead" else holder))
    with Lease(out, ttl=0.5, say=lambda line: None) as taken:
        assert taken.gen == 2


class _Beating(threading.Thread):
    """A holder on another host that keeps renewing its record (its pid means nothing here)."""

    def __init__(self, out: Output, **kw):
        super().__init__(daemon=True)
        self.out, self.kw, self.stop = out, kw, threading.Event()

    def run(self):
        beat = 0
        while not self.stop.wait(0.1):
            beat += 1
            _record(self.out, 1, host="elsewhere", pid=12345, beat=beat, **self.kw)


@pytest.mark.parametrize("ahead_s", [0, 3600])
def test_a_live_holder_on_another_host_is_not_taken_over(tmp_path, ahead_s):
    """Its record changes while watched: alive, whatever its clock says."""
    out = Output(str(tmp_path / "run"))
    _record(out, 1, host="elsewhere", heartbeat=time.time() + ahead_s)
    holder = _Beating(out, heartbeat=time.time() + ahead_s)
    holder.start()
    try:
        t0 = time.monotonic()
        with pytest.raises(LeaseHeld, match="elsewhere.*changed while this driver watched it"):
            Lease(out, ttl=5, say=lambda line: None).acquire()
        assert time.monotonic() - t0 < 4  # refused at its first beat, not after the ttl
    finally:
        holder.stop.set()
        holder.join()


def test_a_holder_an_hour_ahead_on_another_host_is_taken_over_after_the_ttl(tmp_path):
    """Its clock is an hour ahead and it is gone: the observer takes over once the record has stayed unchanged
    for the ttl on the observer's own clock, and says the skew in words."""
    out = Output(str(tmp_path / "run"))
    _record(out, 1, host="elsewhere", heartbeat=time.time() + 3600)
    said = []
    t0 = time.monotonic()
    with Lease(out, ttl=1, say=said.append) as taken:
        assert taken.gen == 2
    assert time.monotonic() - t0 >= 1  # watched for the ttl, not taken at once
    assert "1 h ahead of this machine's clock" in said[0] and "-3" not in said[0], said


@pytest.mark.parametrize("content, problem", [
    (b'{"host": "elsewhere", "pid": 7, "heartbeat": "yesterday"}', 'heartbeat is "yesterday", not a number'),
    (b'{"host": "elsewhere", "pid"', "not JSON"),
])
def test_a_corrupt_lease_is_named_and_taken_over_after_the_ttl(tmp_path, content, problem):
    out = Output(str(tmp_path / "run"))
    out.store.put(out.path(LEASE_DIR, "00000001.json"), content)
    said = []
    t0 = time.monotonic()
    with Lease(out, ttl=1, say=said.append) as taken:
        assert taken.gen == 2
    assert time.monotonic() - t0 >= 1
    assert f"{out.full_url(out.path(LEASE_DIR, '00000001.json'))} is not a lease record" in said[0], said
    assert problem in said[0], said


def test_a_corrupt_lease_that_changes_is_refused_naming_the_file(tmp_path):
    """Something rewrites it (another program, a newer ssdgen): not taken over; the error names the file."""
    out = Output(str(tmp_path / "run"))
    path = out.path(LEASE_DIR, "00000001.json")
    out.store.put(path, b"garbage 0")
    stop = threading.Event()

    def rewrite():
        n = 0
        while not stop.wait(0.1):
            n += 1
            out.store.put(path, f"garbage {n}".encode())
    t = threading.Thread(target=rewrite, daemon=True)
    t.start()
    try:
        with pytest.raises(LeaseHeld, match=f"{out.full_url(path)} is not a lease record"):
            Lease(out, ttl=5, say=lambda line: None).acquire()
    finally:
        stop.set()
        t.join()


def test_a_holder_whose_lease_was_taken_over_stops_committing(tmp_path):
    out = Output(str(tmp_path / "run"))
    lease = Lease(out, ttl=0.4).acquire()
    try:
        lease.check()
        _record(out, lease.gen + 1, host="elsewhere")  # another driver took it over
        deadline = time.monotonic() + 5
        while not lease.lost.is_set() and time.monotonic() < deadline:
            time.sleep(0.05)
        with pytest.raises(LeaseLost):
            lease.check()
    finally:
        lease.release()
    assert (tmp_path / "run" / LEASE_DIR / "00000002.json").exists()  # the new holder's lease stays


def test_the_lease_heartbeats(tmp_path):
    out = Output(str(tmp_path / "run"))
    with Lease(out, ttl=0.4) as lease:
        first = json.loads(out.store.fs.cat_file(lease._path(lease.gen)))["heartbeat"]
        time.sleep(0.5)
        assert json.loads(out.store.fs.cat_file(lease._path(lease.gen)))["heartbeat"] > first


def test_on_s3_one_of_two_drivers_takes_a_generation(s3):
    out = Output("s3://ssdgen-test/run")
    a = Lease(out).acquire()
    try:
        assert not out.store.create(a._path(a.gen), b"{}")  # create-only: the same generation cannot be taken twice
        with pytest.raises(LeaseHeld, match=f"pid {os.getpid()}"):
            Lease(Output("s3://ssdgen-test/run")).acquire()
    finally:
        a.release()
    assert not s3.exists(f"ssdgen-test/run/{LEASE_DIR}/00000001.json")


def test_a_hard_exit_gives_the_lease_back(tmp_path):
    """The second signal, or a run that has not exited GRACE_S after the first, ends with os._exit
    (flows.interrupts.hard_exit): the lease is still given back on the way out, so the next run needs no
    takeover."""
    import subprocess
    import sys
    code = ("import sys\nfrom ssdgen.flows.interrupts import hard_exit\nfrom ssdgen.output.layout import Output\n"
            "from ssdgen.output.lease import Lease\n"
            "lease = Lease(Output(sys.argv[1])).acquire()\n"
            "hard_exit(15, lambda: 'interrupted: 0/1 shards committed', [lease.give_back])\n")
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path / "run")], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 143 and "interrupted: 0/1" in r.stderr, r.stderr
    assert not list((tmp_path / "run").glob("_lease/*.json"))


# --- fencing: a driver that lost the lease writes nothing more ---------------------------------------------

def _frozen(lease: Lease) -> None:
    """What SIGSTOP does to the holder, as far as its lease can tell: its heartbeat stops."""
    lease._stop.set()
    lease._thread.join()


def test_a_driver_that_slept_through_a_takeover_writes_nothing(tmp_path):
    url = str(tmp_path / "run")
    a = Lease(Output(url), ttl=1).acquire()
    run = Output(url)
    run.fence = a.check  # as the flow sets it
    run.store.put(run.path("summary.json"), b"{}")  # held: writes go through
    _frozen(a)
    time.sleep(1.1)  # the ttl passes without a heartbeat
    b = Lease(Output(url), ttl=1).acquire()  # same host, heartbeat over the ttl old: taken over at once
    assert b.gen == 2
    for write in (lambda: run.store.put(run.path("summary.json"), b"late"),
                  lambda: run.store.write_bytes(run.path("shards", "000000", "attempt-x", "images.parquet"), b"x", 1),
                  lambda: run.store.create(run.path("shards", "000000", "_SUCCESS.json"), b"{}"),
                  lambda: run.store.remove_tree(run.path("shards"))):
        with pytest.raises(LeaseLost, match="lost the run's lease"):
            write()
    assert (tmp_path / "run" / "summary.json").read_bytes() == b"{}"
    assert not (tmp_path / "run" / "shards").exists()  # not even the attempt's folder
    b.release()
    a.release()  # lost: gives nothing back, deletes nothing
    assert not list((tmp_path / "run" / LEASE_DIR).iterdir())


def test_a_driver_that_loses_the_lease_mid_shard_leaves_no_attempt(tmp_path, monkeypatch):
    """Its first file landed (a write under way when it froze), then the fence stops the next: the attempt it
    began is removed, and nothing commits."""
    from types import SimpleNamespace
    from ssdgen.flows import commit
    out = Output(str(tmp_path / "run"))
    lost = threading.Event()

    def fence():
        if lost.is_set():
            raise LeaseLost("taken over")

    def files(out, attempt, shard, *rest):
        first = out.store.write_bytes(f"{attempt}/images.parquet", b"x", 1)
        lost.set()  # meanwhile another driver took the output over
        return [first, out.store.write_bytes(f"{attempt}/stats.parquet", b"y", 1)]

    out.fence = fence
    monkeypatch.setattr(commit, "shard_marker", lambda job, cfg, spec, planning_s=0.0: ({"shard": 0}, None, None, None))
    monkeypatch.setattr(commit, "write_shard", files)
    with pytest.raises(LeaseLost):
        commit.Commit(SimpleNamespace(format="parquet", shard_size=4), out, "ar").write(
            SimpleNamespace(shard=SimpleNamespace(id=0)), time.perf_counter())
    assert (tmp_path / "run" / "shards" / "000000").is_dir() and not list((tmp_path / "run").rglob("*.parquet"))
    assert not list((tmp_path / "run").rglob("attempt-*")) and not list((tmp_path / "run").rglob("_SUCCESS.json"))


def test_a_reused_generation_is_not_mistaken_for_ours(tmp_path):
    """The driver that took over finished and gave the lease back (every generation file gone), and a third one
    took generation 1 again: the frozen first holder, generation 1 too, tells by the token that it is not its."""
    url = str(tmp_path / "run")
    a = Lease(Output(url), ttl=1).acquire()
    _frozen(a)
    time.sleep(1.1)
    Lease(Output(url), ttl=1).acquire().release()
    c = Lease(Output(url), ttl=1).acquire()
    try:
        assert c.gen == a.gen == 1
        with pytest.raises(LeaseLost):
            a.check()
        a.release()
        c.check()  # the third driver's lease is intact
        assert (tmp_path / "run" / LEASE_DIR / "00000001.json").exists()
    finally:
        c.release()


def test_a_renewal_that_lands_a_ttl_late_gives_the_lease_up(tmp_path):
    """No one took it over yet, but a watcher may be about to: a holder that went a ttl without renewing (a
    pause, a store that did not answer) stops writing."""
    lease = Lease(Output(str(tmp_path / "run")), ttl=1).acquire()
    try:
        _frozen(lease)
        time.sleep(1.1)
        with pytest.raises(LeaseLost, match="without a renewal"):
            lease.check()
    finally:
        lease.release()


# --- lost answers (tests/s3_proxy.py in front of moto) -----------------------------------------------------

def test_a_lost_answer_to_the_lease_put_is_not_another_driver(s3_faults):
    """The create-only PUT lands, its answer is lost, botocore retries and gets 412: the object holds our token,
    so the lease is ours, not another run's (it used to refuse itself, naming its own pid)."""
    s3_faults.add("PUT", rf"/{LEASE_DIR}/00000001\.json", "lose")
    out = Output("s3://ssdgen-test/run")
    with Lease(out) as lease:
        assert lease.gen == 1 and s3_faults.fired("lose") == 1
        lease.check()
        with pytest.raises(LeaseHeld, match=f"pid {os.getpid()}"):  # and it is held, by us
            Lease(Output("s3://ssdgen-test/run")).acquire()


def _named(attempt: str) -> Marker:
    """Shard 3's marker for `attempt`, naming one file (a marker that names none is damage: output.marker)."""
    f = FileRecord(path=f"shards/000003/{attempt}/stats.parquet", rows=0, bytes=0, sha256="0" * 64)
    return Marker(shard=3, files=(f,), attempt=attempt)


def test_a_lost_answer_to_a_commit_marker_is_our_commit(s3_faults):
    out = Output("s3://ssdgen-test/run")
    ours = _named("attempt-aaaaaaaaaaaa")
    s3_faults.add("PUT", r"/shards/000003/_SUCCESS\.json", "lose")
    assert out.commit(ours) and s3_faults.fired("lose") == 1
    assert not out.commit(_named("attempt-bbbbbbbbbbbb"))  # another attempt's: refused
    assert out.committed()[3].attempt == "attempt-aaaaaaaaaaaa"


def test_throttling_and_server_errors_on_the_lease_are_retried(s3_faults):
    s3_faults.add("PUT", rf"/{LEASE_DIR}/", "slowdown", times=2)
    s3_faults.add("GET", rf"prefix=run%2F{LEASE_DIR}", "error")
    with Lease(Output("s3://ssdgen-test/run")) as lease:
        assert lease.gen == 1
    assert s3_faults.fired("slowdown") == 2 and s3_faults.fired("error") == 1
