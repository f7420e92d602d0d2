"""The output's lease (flows/lease.py): one driver per output, on a local disk and on moto's S3 server."""

import json
import os
import socket
import subprocess
import time

import pytest

from ssdgen.flows.layout import Output
from ssdgen.flows.lease import LEASE_DIR, Lease, LeaseHeld, LeaseLost


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def _record(out: Output, gen: int, **kw) -> None:
    rec = {"owner": "x", "host": socket.gethostname(), "pid": os.getpid(), "started_at": "then",
           "heartbeat": time.time()} | kw
    out.put(out.path(LEASE_DIR, f"{gen:08d}.json"), json.dumps(rec).encode())


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
    with Lease(out) as taken:
        assert taken.gen == 2


def test_a_live_holder_on_another_host_is_not_taken_over(tmp_path):
    out = Output(str(tmp_path / "run"))
    _record(out, 1, host="elsewhere", pid=_dead_pid())  # its pid means nothing here; its heartbeat is fresh
    with pytest.raises(LeaseHeld, match="elsewhere"):
        Lease(out).acquire()


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
        first = json.loads(out.fs.cat_file(lease._path(lease.gen)))["heartbeat"]
        time.sleep(0.5)
        assert json.loads(out.fs.cat_file(lease._path(lease.gen)))["heartbeat"] > first


def test_on_s3_one_of_two_drivers_takes_a_generation(s3):
    out = Output("s3://ssdgen-test/run")
    a = Lease(out).acquire()
    try:
        assert not out.create(a._path(a.gen), b"{}")  # create-only: the same generation cannot be taken twice
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
    code = ("import sys\nfrom ssdgen.flows.interrupts import hard_exit\nfrom ssdgen.flows.layout import Output\n"
            "from ssdgen.flows.lease import Lease\n"
            "lease = Lease(Output(sys.argv[1])).acquire()\n"
            "hard_exit(15, lambda: 'interrupted: 0/1 shards committed', [lease.give_back])\n")
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path / "run")], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 143 and "interrupted: 0/1" in r.stderr, r.stderr
    assert not list((tmp_path / "run").glob("_lease/*.json"))
