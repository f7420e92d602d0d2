"""Faults injected from the tests, through the parts a real fault goes through; flows/ and workers/ know
nothing of them.

- Storage errors and a hung storage: `FaultyLocal` and `FaultyS3` are fsspec's own local and S3 filesystems
  under test-only protocols (`faultyfile://`, `faultys3://`), so a test opts in by its output URL alone.
  While `STORAGE.errors_left` > 0, a write into an attempt folder fails with a ConnectionError (what a reset
  connection raises); with `STORAGE.hang_after_commits` set, every commit after that many hangs for good.
- Actor crashes: `ActorKiller` SIGKILLs the process of a busy `DecodeWorker` actor of this test's Ray, as the
  kernel's OOM killer or a lost node would; Ray restarts the actor.
- Driver crashes: `crash_driver` runs `ssdgen generate` as a process of its own on hanging storage and
  SIGKILLs it once it hangs, so exactly N shards are committed and others are in flight.
- Stores that do not behave as expected (#49), on `faultyfile://`: `deny_deletes` refuses every delete as a role
  without DeleteObject does (PermissionError, "Access Denied"); `list_lag_s` makes listings omit the files written
  in the last seconds, as an object store whose index lags, while reads by name see them; `drop_after_commits`
  moves the run's folder away as commit N+1 begins, as a dropped mount does (the path then names the empty disk
  beneath, and the writer's auto_mkdir makes the folders again). `run_driver` runs `ssdgen` with them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import fsspec
import psutil
from fsspec.implementations.local import LocalFileSystem
from s3fs import S3FileSystem

ROOT = Path(__file__).resolve().parents[1]
HANG_ENV, FLAG_ENV = "SSDGEN_TEST_HANG_AFTER_COMMITS", "SSDGEN_TEST_HANG_FLAG"
DENY_ENV, LAG_ENV, DROP_ENV = "SSDGEN_TEST_DENY_DELETES", "SSDGEN_TEST_LIST_LAG_S", "SSDGEN_TEST_DROP_AFTER_COMMITS"


@dataclass
class StorageFaults:
    """What the faulty filesystems do, shared by every instance (fsspec caches instances) and I/O thread."""
    errors_left: int = 0  # writes into attempt folders still to fail
    errors_raised: int = 0
    commits: int = 0  # commit markers begun (create-only opens of _SUCCESS.json)
    hang_after_commits: int | None = None
    hang_flag: str | None = None  # a local file created when the storage starts to hang
    deny_deletes: bool = False  # every delete refused (a role without DeleteObject)
    denied: int = 0
    list_lag_s: float = 0.0  # listings omit files written in the last list_lag_s seconds
    drop_after_commits: int | None = None  # the run's folder moved away as commit N+1 begins (a dropped mount)
    dropped: str | None = None  # where it went
    lock: threading.Lock = field(default_factory=threading.Lock)

    def before_delete(self, path: str) -> None:
        if self.deny_deletes:
            with self.lock:
                self.denied += 1
            raise PermissionError(13, "Access Denied", path)

    def listed(self, infos: list[dict]) -> list[dict]:
        """What a listing that lags shows: files written in the last list_lag_s seconds are not there yet."""
        if not self.list_lag_s:
            return infos
        now = time.time()
        return [i for i in infos if i.get("type") != "file" or now - i.get("mtime", 0) >= self.list_lag_s]

    def drop(self, path: str) -> None:
        """Move the run's folder (the part of `path` before /shards/) away: the mount under it went."""
        root = path.split("/shards/")[0]
        with self.lock:
            if self.dropped is None:
                self.dropped = root + ".dropped"
                os.rename(root, self.dropped)

    def before_write(self, path: str) -> None:
        if "/attempt-" not in path:  # the run's config, manifest and summary are not the write path retried
            return
        with self.lock:
            if self.errors_left <= 0:
                return
            self.errors_left -= 1
            self.errors_raised += 1
        raise ConnectionError(f"injected: connection reset while writing {path}")

    def before_open(self, path: str, mode: str) -> None:
        if mode != "xb" or not path.endswith("_SUCCESS.json"):
            return
        with self.lock:
            self.commits += 1
            hang = self.hang_after_commits is not None and self.commits > self.hang_after_commits
            drop = self.drop_after_commits is not None and self.commits > self.drop_after_commits
        if drop:
            self.drop(path)
        if hang:
            Path(self.hang_flag).touch()
            threading.Event().wait()  # never returns: the test kills this process


STORAGE = StorageFaults()


class _Faulty:
    """The URLs a faulty filesystem hands out (manifest, summary) name the real storage: only the client that
    wrote them was faulty, and what a run committed reads back like any other run's."""
    real: str

    def unstrip_protocol(self, name: str) -> str:
        return f"{self.real}://{self._strip_protocol(name)}"


class FaultyLocal(_Faulty, LocalFileSystem):
    protocol, real = ("faultyfile",), "file"

    def __init__(self, *args, **kwargs):
        # Output makes folders only for the "file" protocol; a create-only marker needs its shard folder
        super().__init__(*args, **{"auto_mkdir": True} | kwargs)

    def pipe_file(self, path, value, *args, **kwargs):
        STORAGE.before_write(self._strip_protocol(path))
        return super().pipe_file(path, value, *args, **kwargs)

    def open(self, path, mode="rb", *args, **kwargs):
        STORAGE.before_open(self._strip_protocol(path), mode)
        return super().open(path, mode, *args, **kwargs)

    def rm_file(self, path):
        STORAGE.before_delete(self._strip_protocol(path))
        return super().rm_file(path)

    def rm(self, path, recursive=False, maxdepth=None):
        STORAGE.before_delete(path if isinstance(path, str) else path[0])
        return super().rm(path, recursive=recursive, maxdepth=maxdepth)

    def ls(self, path, detail=False, **kwargs):
        found = STORAGE.listed(super().ls(path, detail=True, **kwargs))
        return found if detail else [f["name"] for f in found]


class FaultyS3(_Faulty, S3FileSystem):
    protocol, real = ("faultys3",), "s3"

    async def _pipe_file(self, path, data, *args, **kwargs):  # s3fs's sync pipe_file runs this coroutine
        STORAGE.before_write(self._strip_protocol(path))
        return await super()._pipe_file(path, data, *args, **kwargs)

    def open(self, path, mode="rb", *args, **kwargs):
        STORAGE.before_open(self._strip_protocol(path), mode)
        return super().open(path, mode, *args, **kwargs)


def register() -> None:
    fsspec.register_implementation("faultyfile", FaultyLocal, clobber=True)
    fsspec.register_implementation("faultys3", FaultyS3, clobber=True)


class storage_faults:
    """`with storage_faults(errors=5) as storage:` the faulty protocols, fresh counters, cleared afterwards."""

    def __init__(self, errors: int = 0):
        self.errors = errors

    def __enter__(self) -> StorageFaults:
        global STORAGE
        register()
        STORAGE = StorageFaults(errors_left=self.errors)
        return STORAGE

    def __exit__(self, *exc) -> None:
        FaultyS3.clear_instance_cache()  # its clients hold this test's endpoint and credentials
        STORAGE.errors_left = 0


def from_env() -> None:
    """In a driver started by `crash_driver` or `run_driver`: register the protocols and take the faults it was
    told (hang after N commits; deny deletes; listings that lag; the folder dropped after N commits)."""
    register()
    if HANG_ENV in os.environ:
        STORAGE.hang_after_commits = int(os.environ[HANG_ENV])
        STORAGE.hang_flag = os.environ[FLAG_ENV]
    STORAGE.deny_deletes = os.environ.get(DENY_ENV) == "1"
    STORAGE.list_lag_s = float(os.environ.get(LAG_ENV, 0))
    if DROP_ENV in os.environ:
        STORAGE.drop_after_commits = int(os.environ[DROP_ENV])


def run_driver(cli_args: list[str], env: dict, timeout_s: float = 600) -> subprocess.CompletedProcess:
    """`ssdgen CLI_ARGS` as a process of its own with the faulty protocols registered and the faults `env` names
    (DENY_ENV, LAG_ENV, DROP_ENV); stdout and stderr captured as text."""
    code = "import faults; faults.from_env(); from ssdgen.cli import main; main()"
    env = env | {"PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
    return subprocess.run([sys.executable, "-c", code, *cli_args], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout_s)


def decode_workers() -> list[tuple[int, str]]:
    """(pid, title) of this process's Ray's DecodeWorker actor processes. Ray titles an actor's process
    `ray::DecodeWorker` and, while a task runs, `ray::DecodeWorker.__call__`. Only our descendants count: the
    Ray of another test session on the same machine is left alone."""
    found = []
    for p in psutil.Process().children(recursive=True):
        try:
            cmd = p.cmdline()
        except psutil.Error:  # gone meanwhile
            continue
        if cmd and cmd[0].startswith("ray::DecodeWorker"):
            found.append((p.pid, cmd[0]))
    return found


class ActorKiller(threading.Thread):
    """SIGKILL a decode actor busy with a batch once `commits()` reaches each count in `after_commits`, one
    kill per count. `killed` holds the pids killed; `originals` the actor pids alive at the first kill, so a
    test can tell that restarted incarnations did the rest. Use as a context manager around the run."""

    def __init__(self, after_commits: list[int], commits: Callable[[], int]):
        super().__init__(name="actor-killer", daemon=True)
        self.after, self.commits = list(after_commits), commits
        self.killed: list[int] = []
        self.originals: set[int] = set()
        self.stop = threading.Event()

    def run(self) -> None:
        while len(self.killed) < len(self.after) and not self.stop.wait(0.05):
            if self.commits() < self.after[len(self.killed)]:
                continue
            workers = decode_workers()
            busy = [pid for pid, title in workers if title.endswith(".__call__") and pid not in self.killed]
            if busy:
                self.originals = self.originals or {pid for pid, _ in workers}
                os.kill(busy[0], signal.SIGKILL)
                self.killed.append(busy[0])

    def __enter__(self) -> "ActorKiller":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.join()


def crash_driver(cli_args: list[str], after_commits: int, tmp: Path, timeout_s: float = 600) -> None:
    """Run `ssdgen CLI_ARGS` (a generate on a faulty output URL) as a driver process of its own, on this test
    session's Prefect API and Ray, with storage that hangs once `after_commits` shards have committed; SIGKILL
    it (its whole session) once it hangs. Fails if the driver ends or stalls before."""
    import prefect.settings
    import ray
    flag, log = tmp / "storage-hung", tmp / "driver.log"
    env = os.environ | {"PREFECT_API_URL": prefect.settings.PREFECT_API_URL.value(),
                        "RAY_ADDRESS": ray.get_runtime_context().gcs_address,
                        "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")]),
                        HANG_ENV: str(after_commits), FLAG_ENV: str(flag)}
    code = "import faults; faults.from_env(); from ssdgen.cli import main; main()"
    with open(log, "wb") as err:  # a file, not a pipe: a chatty driver must not block on a full pipe
        proc = subprocess.Popen([sys.executable, "-c", code, *cli_args], env=env, cwd=ROOT,
                                start_new_session=True, stdout=err, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + timeout_s
        while not flag.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                break
            time.sleep(0.1)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # the driver's own session: it and anything it started
        proc.wait(timeout=60)
    tail = log.read_text(errors="replace")[-3000:]
    assert flag.exists(), f"the driver did not reach commit {after_commits + 1}: {tail}"
    assert proc.returncode == -signal.SIGKILL, f"the driver ended before it was killed: {tail}"
