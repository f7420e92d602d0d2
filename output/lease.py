"""One driver per output: a run holds a lease on its `--out` while it plans, calibrates and commits, and a driver
that lost it changes nothing more.

    {out}/_lease/{generation:08d}.json    {token, host, pid, started_at, heartbeat, beat}

The lease is the highest generation. Taking it is a create-only write of the next generation (the same
create-only write as a commit marker, storage.store.Store.create), so of two drivers racing for one generation
exactly one wins; the record's unique `token` tells the winner its own write when the store's answer was lost
and the client's retry found the object there.

Renewing (the heartbeat, every `ttl / 4`): read the top generation back, check it is still ours (its number and
our token), and rewrite it with `beat` counted up. A driver writes (data, markers, manifest, summary; every
write through the run's Output, whose fence is `check`) only within `ttl / 2` of its last renewal, measured on
its own monotonic clock; past that, `check` renews first. A frozen or stalled driver therefore learns of a
takeover before its next write, and one whose renewal did not land within `ttl` of the one before gives the
lease up (a watcher may have taken it over meanwhile). Its uncommitted attempts are removed (flows.commit).

Judging a holder, on the observer's clock (never the holder's): a holder on this host is stale when its process
is gone, or its heartbeat (this machine's clock) is over `ttl` old. A holder on another host, or a record that is
not a lease (named in what the driver says), is watched: if its object changes while watched, the holder is
alive and the run is refused in one line; if it stays unchanged for `ttl` as this process's monotonic clock
measures, it is taken over. A heartbeat ahead of this machine's clock is said in words ("1 h ahead"), never as a
negative age. `ttl` is 60 s by default (SSDGEN_LEASE_TTL_S).

No decision rests on a listing alone: some stores' listings omit the newest objects for a while (an index that
lags), where a read by name sees a write at once. The listing only says where to start; the generations above it
(and our own) are read by name (`_Records.top`). A store that refuses deletes (a role without s3:DeleteObject)
cannot take a lease back: the release says so in one line and rewrites the record as `released`, which the next
run takes at once, never watches. Before every commit (`guard`) the run also checks that its lease record and
_config.json are still there: a folder replaced under the run (a dropped mount: the path now names the disk
beneath) is the end of the run, in one line (`OutputGone`), not a new run begun in the empty folder.
"""

from __future__ import annotations

import json
import os
import posixpath
import socket
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone

from .layout import CONFIG, Output

LEASE_DIR = "_lease"
SAME_HOST_SLACK_S = 2.0  # a heartbeat this far ahead of our own clock is still our clock (rounding, a step)

# lease path -> (the bytes this process read there, monotonic time it first read them): what a watcher has seen
# unchanged, kept across Lease objects, so the flow's acquire does not watch again what the CLI just watched
_SEEN: dict[str, tuple[bytes, float]] = {}
_SEEN_LOCK = threading.Lock()


def _ttl() -> float:
    return float(os.environ.get("SSDGEN_LEASE_TTL_S", 60))


class LeaseHeld(RuntimeError):
    """Another live driver holds the output's lease."""


class LeaseLost(RuntimeError):
    """This driver's lease was taken over: it must not write anything more."""


class OutputGone(LeaseLost):
    """The run's folder was replaced under it (its lease record and _config.json are gone): it writes no more."""


@dataclass
class _Top:
    """One read of the highest generation: its record, or why it is not one (`problem`); raw None: none held."""
    gen: int
    path: str | None = None
    raw: bytes | None = None
    rec: dict | None = None
    problem: str | None = None


def _say(line: str) -> None:
    print(f"lease: {line}", file=sys.stderr, flush=True)


class Lease:
    def __init__(self, out: Output, ttl: float | None = None, say=_say):
        """say: where a line about a watched holder goes (stderr: the CLI has no logger yet)."""
        self.out, self.ttl, self.say = out, ttl or _ttl(), say
        self.token = uuid.uuid4().hex
        self.me = {"token": self.token, "host": socket.gethostname(), "pid": os.getpid(),
                   "started_at": datetime.now(timezone.utc).isoformat()}
        self.gen = self.beat = 0
        self.renewed_at = 0.0  # monotonic start of the last renewal that landed
        self.lost = threading.Event()
        self.lost_why = ""
        self.gone: str | None = None  # what of the run's folder went missing, when it was replaced under the run
        self.records = _Records(out)
        self._lock = threading.Lock()  # one renewal at a time: the heartbeat's, or a writer's after a pause
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._stale: str | None = None  # the holder check_free found stale (said once the lease is ours)

    # ------------------------------------------------------------------ taking and giving back
    def check_free(self) -> int:
        """The current generation once the lease may be taken: free, or its holder stale. Raises LeaseHeld
        naming a live holder. A holder it cannot judge at once is watched, for up to `ttl`. Takes nothing: the
        CLI asks before it starts any server, the flow then takes the lease."""
        while True:
            top = self.records.top()
            # free, or given back by a driver whose store refused the delete (its record says released)
            if top.raw is None or (top.rec or {}).get("released"):
                self._stale = None
                return top.gen
            verdict, why = _judge(top, self.out.full_url(top.path), self.me["host"], self.ttl)
            if verdict == "watch":
                verdict = self._watch(top, why)
                why += {"alive": "; its lease changed while this driver watched it",
                        "stale": f"; it stayed unchanged for {self.ttl:.0f} s"}.get(verdict, "")
            if verdict == "stale":
                self._stale = why
                return top.gen
            if verdict == "alive":
                raise LeaseHeld(f"{self.out.url}: another ssdgen run is writing here ({why}); wait for it to "
                                f"finish, or stop it (if it died, its lease is taken over once it has not "
                                f"changed for {self.ttl:.0f} s)")
            # "moved": released or taken meanwhile: judge the new top

    def acquire(self) -> "Lease":
        """Take the lease, or raise LeaseHeld naming its live holder."""
        for _ in range(5):
            gen = self.check_free()
            t0 = time.monotonic()
            self.beat = 0
            if self.out.store.create(self._path(gen + 1), self._record()):
                self.gen, self.renewed_at = gen + 1, t0
                self._thread = threading.Thread(target=self._beat, name="ssdgen-lease", daemon=True)
                self._thread.start()
                if self._stale:
                    self.say(f"took the lease over: {self._stale}")
                return self
        raise LeaseHeld(f"{self.out.url}: other drivers keep taking the lease; is a second run starting?")

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._still_ours():
            self._give_back(range(self.gen, 0, -1))  # ours and the dead holders' before us

    def give_back(self) -> None:
        """Remove our lease now, without waiting for the heartbeat (a hard exit: flows.interrupts)."""
        if self._still_ours():
            self._give_back([self.gen])

    def _give_back(self, gens) -> None:
        """Delete these generations, ours first, down to the first one gone. A store that refuses the delete is
        said in one line, and our record is rewritten as released (a PUT it allows): the next run takes the lease
        at once instead of watching it for a ttl. Never raises for a refused delete: the run's work is done."""
        for gen in gens:
            path = self._path(gen)
            if gen != self.gen and not self.out.store.fs.exists(path):
                return
            line = self.out.store.discard(path, "releasing the run's lease", fenced=False)
            if line is None:
                continue
            if gen == self.gen:
                try:
                    self.out.store.put(path, self._record(released=True))
                    line += "; its record now says released, so the next run takes the lease at once"
                except (OSError, LeaseLost):
                    pass
            self.say(line)
            return  # the older generations would be refused alike

    def guard(self) -> None:
        """`check`, and the run's folder is still the one it started in: its _config.json and lease record are
        there (two reads by name: stats on a disk, HEADs on an object store). Called before every commit and
        before the manifest and summary (flows.pipeline): a folder replaced under the run stops it here."""
        self.check()
        lease, config = self._exists(self._path(self.gen)), self._exists(self.out.path(CONFIG))
        if not (lease and config):
            with self._lock:
                if not config:  # no run here any more: the folder was replaced (or emptied) under the run
                    self.gone = f"{CONFIG} {'is' if lease else 'and the lease record are'} gone"
                self._lose(f"the run's folder was replaced: {self.gone}" if self.gone else "its record is gone")
            self.check()

    def _exists(self, path: str) -> bool:
        self.out.store.fs.invalidate_cache(path)  # an object store's client answers from a cached listing else
        return self.out.store.fs.exists(path)

    def check(self) -> None:
        """Raise LeaseLost unless this driver may still write: the output's fence, called before every write
        (storage.store), and before every commit. Free while the last renewal is recent; after a pause it renews
        first, so a driver that slept through a takeover finds out before it writes."""
        if not self.lost.is_set() and time.monotonic() - self.renewed_at >= self.ttl / 2:
            with self._lock:
                if not self.lost.is_set() and time.monotonic() - self.renewed_at >= self.ttl / 2:
                    self._renew()
        if self.lost.is_set() and self.gone is not None:
            raise OutputGone(f"{self.out.url}: the run's folder was replaced while the run wrote to it ({self.gone}:"
                             " a dropped or remounted file system, or a deleted folder?); this driver stops without "
                             "writing a new run into it; once the folder is back, run the same command to resume")
        if self.lost.is_set():
            raise LeaseLost(f"{self.out.url}: this driver lost the run's lease ({self.lost_why}); it stops "
                            "without writing anything more (the driver that holds the lease finishes the run)")

    def __enter__(self) -> "Lease":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()

    # ------------------------------------------------------------------ renewing
    def _beat(self) -> None:
        while not self._stop.wait(self.ttl / 4):
            try:
                with self._lock:
                    self._renew()
            except OSError:  # a storage hiccup: the next beat tries again; `check` stops writes meanwhile
                continue
            if self.lost.is_set():
                return

    def _renew(self) -> None:
        """Confirm the top generation is still ours, then rewrite it; the lease is lost when another driver
        holds the top, or when this renewal lands `ttl` or more after the last one began (a watcher may have
        taken it over in between). Called with `_lock` held."""
        t0 = time.monotonic()
        if not self._still_ours():
            if not self._exists(self._path(self.gen)) and not self._exists(self.out.path(CONFIG)):
                self.gone = f"{CONFIG} and the lease record are gone"  # no other driver: no run here at all
                return self._lose(f"the run's folder was replaced: {self.gone}")
            return self._lose("another driver took it over")
        self.beat += 1
        self.out.store.put(self._path(self.gen), self._record())
        if (late := time.monotonic() - self.renewed_at) >= self.ttl:
            return self._lose(f"it went {late:.0f} s without a renewal, more than its {self.ttl:.0f} s time to "
                              "live, so another driver may have taken it over")
        self.renewed_at = t0

    def _still_ours(self) -> bool:
        if not self.gen or self.lost.is_set():
            return False
        top = self.records.top(known=self.gen)
        return top.gen == self.gen and (top.rec or {}).get("token") == self.token

    def _lose(self, why: str) -> None:
        self.lost_why = why
        self.lost.set()

    # ------------------------------------------------------------------ watching a holder
    def _watch(self, top: _Top, why: str) -> str:
        """"alive" if the record changes within `ttl` of when this process first saw it, "stale" if it does not,
        "moved" if it was released or another generation appeared meanwhile."""
        first = _first_seen(top.path, top.raw)
        left = first + self.ttl - time.monotonic()
        if left > 0:
            self.say(f"{why}; watching it: taken over if it stays unchanged for {left:.0f} s more")
        poll = min(1.0, self.ttl / 8)
        while (left := first + self.ttl - time.monotonic()) > 0:
            time.sleep(min(poll, left))
            now = self.records.top()
            if now.gen != top.gen or now.raw is None:
                return "moved"
            if now.raw != top.raw:
                return "alive"
        return "stale"

    # ------------------------------------------------------------------ the records
    def _path(self, gen: int) -> str:
        return self.records.path(gen)

    def _record(self, released: bool = False) -> bytes:
        return json.dumps(self.me | {"heartbeat": time.time(), "beat": self.beat}
                          | ({"released": True} if released else {})).encode()


class _Records:
    """The lease's records on the output's store, read so that a listing that lags cannot mislead: the listing
    says which generations it shows, and the next ones (and the caller's own) are read by name."""

    def __init__(self, out: Output):
        self.out = out

    def path(self, gen: int) -> str:
        return self.out.path(LEASE_DIR, f"{gen:08d}.json")

    def _listed(self) -> list[int]:
        try:
            # refresh: an object store's client caches listings, and a takeover must be seen by the holder
            names = self.out.store.fs.ls(self.out.path(LEASE_DIR), detail=False, refresh=True)
        except FileNotFoundError:
            return []
        return sorted(int(n) for n in (posixpath.basename(p).removesuffix(".json") for p in names) if n.isdigit())

    def _read(self, gen: int) -> bytes | None:
        try:
            return self.out.store.fs.cat_file(self.path(gen))
        except FileNotFoundError:
            return None

    def top(self, known: int = 0) -> _Top:
        """The highest generation: the listing's highest or `known` (the caller's own), then every next one
        that a read by name finds (a listing that lags omits the newest); its record, or raw None when it was
        released meanwhile (or the listing still shows it after its delete)."""
        listed = self._listed()
        gen = max(listed[-1] if listed else 0, known)
        raw = self._read(gen) if gen else None
        while (newer := self._read(gen + 1)) is not None:
            gen, raw = gen + 1, newer
        if gen == 0:
            return _Top(0)
        if raw is None:
            return _Top(gen, self.path(gen))
        rec, problem = _parse(raw)
        return _Top(gen, self.path(gen), raw, rec, problem)


def _judge(top: _Top, url: str, host: str, ttl: float) -> tuple[str, str]:
    """("alive" | "stale" | "watch", why in words) for the holder of `top` (at `url`), judged on this machine
    (`host`) and its clock."""
    if top.rec is None:
        return "watch", f"{url} is not a lease record ({top.problem})"
    h = top.rec
    who = f"held by pid {h['pid']} on {h['host']} since {h.get('started_at')}"
    age = time.time() - h["heartbeat"]
    if h["host"] == host:  # one clock: its heartbeat can be read against ours
        if not _pid_alive(h["pid"]):
            return "stale", f"{who}, a process that no longer exists"
        if age > ttl:
            return "stale", f"{who}, last heartbeat {_words(age)} ago"
        if age >= -SAME_HOST_SLACK_S:
            return "alive", f"{who}, last heartbeat {_words(max(age, 0))} ago"
    if age < -SAME_HOST_SLACK_S:
        when = f"its last heartbeat is {_words(-age)} ahead of this machine's clock (the clocks disagree)"
    else:
        when = f"last heartbeat {_words(max(age, 0))} ago by this machine's clock"
    return "watch", f"{who}, {when}"


def _parse(raw: bytes) -> tuple[dict | None, str | None]:
    """A lease record, or None and what is wrong with it (in words)."""
    try:
        rec = json.loads(raw)
    except (ValueError, RecursionError) as e:  # RecursionError: nested too deeply for the parser
        return None, f"not JSON: {e}"
    if not isinstance(rec, dict):
        return None, "not a JSON object"
    for key, kinds, kind in (("host", str, "a string"), ("pid", int, "an integer"),
                             ("heartbeat", (int, float), "a number")):
        if not isinstance(rec.get(key), kinds) or isinstance(rec.get(key), bool):
            return None, f"{key} is {json.dumps(rec.get(key))}, not {kind}"
    return rec, None


def _first_seen(path: str, raw: bytes) -> float:
    now = time.monotonic()
    with _SEEN_LOCK:
        seen = _SEEN.get(path)
        if seen is None or seen[0] != raw:
            _SEEN[path] = seen = (raw, now)
        return seen[1]


def _words(seconds: float) -> str:
    """A duration as people say it: 12 s, 5 min, 1 h, 2 h 5 min."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    hours, minutes = divmod(round(seconds / 60), 60)
    return " ".join(p for p in (f"{hours} h" if hours else "", f"{minutes} min" if minutes else "") if p)


def _pid_alive(pid: int) -> bool:
    import psutil
    try:
        return pid > 0 and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
