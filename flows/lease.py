"""One driver per output: a run holds a lease on its `--out` while it plans, calibrates and commits.

    {out}/_lease/{generation:08d}.json    {owner, host, pid, started_at, heartbeat}

The lease is the highest generation. Taking it is a create-only write of the next generation (the same
create-only write as a commit marker: a hard link on a local disk, `If-None-Match: *` on S3), so of two drivers
racing for one generation exactly one wins. The holder rewrites its own file every `ttl / 4` seconds (the
heartbeat) and, each time, checks that no higher generation exists; if one does, the lease was taken over and
the holder stops committing. A second driver on a held lease is refused with one line naming the holder. A
lease whose heartbeat is older than `ttl`, or whose holder was a process on this host that no longer exists (a
SIGKILLed driver), is taken over by writing the next generation.

Heartbeats are judged by the reader's clock against the holder's: clocks of a cluster's machines must agree to
well within `ttl` (60 s by default, SSDGEN_LEASE_TTL_S).
"""

from __future__ import annotations

import json
import os
import posixpath
import socket
import threading
import time
import uuid
from datetime import datetime, timezone

from .layout import Output

LEASE_DIR = "_lease"


def _ttl() -> float:
    return float(os.environ.get("SSDGEN_LEASE_TTL_S", 60))


class LeaseHeld(RuntimeError):
    """Another live driver holds the output's lease."""


class LeaseLost(RuntimeError):
    """This driver's lease was taken over: it must not commit anything more."""


class Lease:
    def __init__(self, out: Output, ttl: float | None = None):
        self.out, self.ttl = out, ttl or _ttl()
        self.me = {"owner": uuid.uuid4().hex[:12], "host": socket.gethostname(), "pid": os.getpid(),
                   "started_at": datetime.now(timezone.utc).isoformat()}
        self.gen = 0
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ taking and giving back
    def check_free(self) -> int:
        """Raise LeaseHeld naming the live holder, if there is one; else the current generation. Takes nothing:
        the CLI asks before it starts any server, the flow then takes the lease."""
        gen, holder = self._current()
        if holder is not None and (why := self._alive(holder)):
            raise LeaseHeld(f"{self.out.url}: another ssdgen run is writing here ({why}); wait for it to "
                            f"finish, or stop it (if it died, its lease expires {self.ttl:.0f} s after its last "
                            "heartbeat)")
        return gen

    def acquire(self) -> "Lease":
        """Take the lease, or raise LeaseHeld naming its live holder."""
        for _ in range(5):
            gen = self.check_free()
            if self.out.create(self._path(gen + 1), self._record()):
                self.gen = gen + 1
                self._thread = threading.Thread(target=self._beat, name="ssdgen-lease", daemon=True)
                self._thread.start()
                return self
        raise LeaseHeld(f"{self.out.url}: other drivers keep taking the lease; is a second run starting?")

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self.gen and not self.lost.is_set():
            for gen in range(self.gen, 0, -1):  # ours and the dead holders' before us
                try:
                    self.out.fs.rm_file(self._path(gen))
                except FileNotFoundError:
                    break

    def give_back(self) -> None:
        """Remove our lease now, without waiting for the heartbeat (a hard exit: flows.interrupts)."""
        if self.gen and not self.lost.is_set():
            self.out.fs.rm_file(self._path(self.gen))

    def check(self) -> None:
        """Raise LeaseLost if another driver took the lease over (called before every commit)."""
        if self.lost.is_set():
            raise LeaseLost(f"{self.out.url}: another driver took over this run's lease; stopping before it "
                            "commits anything more")

    def __enter__(self) -> "Lease":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()

    # ------------------------------------------------------------------ internals
    def _path(self, gen: int) -> str:
        return self.out.path(LEASE_DIR, f"{gen:08d}.json")

    def _record(self) -> bytes:
        return json.dumps(self.me | {"heartbeat": time.time()}).encode()

    def _generations(self) -> list[int]:
        try:
            # refresh: an object store's client caches listings, and a takeover must be seen by the holder
            names = self.out.fs.ls(self.out.path(LEASE_DIR), detail=False, refresh=True)
        except FileNotFoundError:
            return []
        return sorted(int(n) for n in (posixpath.basename(p).removesuffix(".json") for p in names) if n.isdigit())

    def _current(self) -> tuple[int, dict | None]:
        gens = self._generations()
        if not gens:
            return 0, None
        try:
            return gens[-1], json.loads(self.out.fs.cat_file(self._path(gens[-1])))
        except (FileNotFoundError, ValueError):  # released meanwhile, or a torn record: nobody holds it
            return gens[-1], None

    def _alive(self, h: dict) -> str | None:
        """Why the holder counts as alive (a line for the user), or None if its lease may be taken over."""
        age = time.time() - float(h.get("heartbeat", 0))
        if age > self.ttl:
            return None
        if h.get("host") == self.me["host"] and not _pid_alive(int(h.get("pid", -1))):
            return None
        return (f"held by pid {h.get('pid')} on {h.get('host')} since {h.get('started_at')}, last heartbeat "
                f"{age:.0f} s ago")

    def _beat(self) -> None:
        while not self._stop.wait(self.ttl / 4):
            try:
                if self._generations()[-1:] != [self.gen]:
                    self.lost.set()
                    return
                self.out.put(self._path(self.gen), self._record())  # atomic: a reader never sees half a record
            except OSError:  # a storage hiccup: the next beat tries again, well inside the ttl
                continue


def _pid_alive(pid: int) -> bool:
    import psutil
    try:
        return pid > 0 and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
