"""Prefect's temporary API server for one run without a configured Prefect API (`ssdgen generate`, and
`ssdgen.generate` from Python alike: `temporary_api`, the `around` they give flows/run.py), started the moment the
run knows it has work, and waited for only when the flow starts (#36: an 8-prompt run in 20 s; #49: the Python API
let Prefect start its own, printing its banner, 4 s slower).

Prefect starts this server itself when a flow runs without PREFECT_API_URL (`SubprocessASGIServer`, "Starting
temporary server"), but only once the flow is called, after this process imported Prefect (1.6 s); it blocks
until the server answers (about 6 s here), and its client imports the server's whole application to do it
(2.4 s more, under the GIL the run's Ray start needs). Here the same command Prefect runs (uvicorn on
`prefect.server.api.server:create_app`, UI off, ephemeral flags, loopback only, this environment) starts before
this process imports Prefect, where the environment names no Prefect API; the run imports Prefect and starts its
local Ray meanwhile. Should Prefect's settings then name an API after all (a profile's PREFECT_API_URL) or turn
the temporary server off, it is stopped unused (`needed`). `api()` waits for /api/health and gives the settings
the flow runs under (its API URL), so Prefect's client talks to it as to any server and never starts its own.

The process inherits a blocked SIGINT: a Ctrl-C in the terminal reaches every process of the foreground group,
and a server that died of it would leave the stopping run without its API. The run stops it (`stop`, and at
exit); a run stopped by a signal kills it with the rest of its processes (flows/interrupts.py). Starts are one
at a time per Prefect home: each server migrates the same SQLite database at start, and two runs started
together raced on it (a uvicorn traceback).
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import os
import signal
import socket
import subprocess
import sys
import time

RESTART_CODE = 3  # uvicorn's exit when the port was taken between our pick and its bind: pick another


class NoPrefectServer(RuntimeError):
    """No Prefect API to run or schedule under; the message names the fix (one `error:` line, options.py)."""


def _free_port() -> int:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class TemporaryServer:
    """`start()` now, `api()` when the flow needs it (a context: the settings it runs under), `stop()` after."""

    def __init__(self):
        import importlib.util
        from pathlib import Path
        # where `import prefect` would find it, without importing it (uvicorn's --app-dir, as Prefect gives it)
        self.app_dir = str(Path(importlib.util.find_spec("prefect").origin).parent.parent)
        self.home = Path(os.environ.get("PREFECT_HOME") or "~/.prefect").expanduser()  # Prefect's default home
        self.process: subprocess.Popen | None = None
        self.lock = None
        self.port = 0
        self.ready = False
        self.limit = 20  # Prefect's default PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS; `needed` reads it

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    def start(self) -> "TemporaryServer":
        try:
            self.home.mkdir(parents=True, exist_ok=True)
            self.lock = open(self.home / "ssdgen-server-start.lock", "a")  # held until it answers
        except OSError as e:
            raise NoPrefectServer(self._no_home(e)) from None
        fcntl.flock(self.lock, fcntl.LOCK_EX)
        self._spawn()
        atexit.register(self.stop)
        return self

    def _no_home(self, e: OSError) -> str:
        """The error of a Prefect home that cannot be written, naming the setting that fixes it: the server keeps its
        database there, and without PREFECT_HOME it is under HOME (a container's or service's HOME often is not
        writable, and the OS's own message named only the path)."""
        why = f"{e.strerror or type(e).__name__}{f': {e.filename}' if e.filename else ''}"
        if os.environ.get("PREFECT_HOME"):
            return f"PREFECT_HOME={self.home} cannot be written ({why}); set PREFECT_HOME to a writable folder"
        return (f"Prefect's home {self.home} (under HOME, as PREFECT_HOME is not set) cannot be written ({why}); set "
                "PREFECT_HOME to a writable folder, or PREFECT_API_URL to a running Prefect server")

    def needed(self) -> bool:
        """Whether Prefect, now imported, would start a temporary server itself (no API in its settings, the
        ephemeral server on); if not, this one is stopped unused."""
        from prefect.settings import get_current_settings
        settings = get_current_settings()
        if settings.api.url or not settings.server.ephemeral.enabled:
            self.stop()
            return False
        self.limit = settings.server.ephemeral.startup_timeout_seconds
        return True

    def _spawn(self) -> None:
        self.port = _free_port()
        env = {**os.environ, "PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1",
               "PREFECT__SERVER_FINAL": "1"}
        old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "uvicorn", "--app-dir", self.app_dir, "--factory",
                 "prefect.server.api.server:create_app", "--host", "127.0.0.1", "--port", str(self.port),
                 "--log-level", "error", "--lifespan", "on"], env=env, stdin=subprocess.DEVNULL)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)

    def wait(self, check=lambda: None) -> None:
        """Until /api/health answers; RuntimeError in one line when it does not in Prefect's own start-up time.
        `check()` is called between tries (a run's stop checkpoint raises there)."""
        import httpx
        if self.ready:
            return
        limit = self.limit
        deadline = time.monotonic() + limit
        with httpx.Client() as client:
            while time.monotonic() < deadline:
                check()
                code = self.process.poll()
                if code == RESTART_CODE:
                    self._spawn()
                elif code is not None:
                    raise NoPrefectServer(f"Prefect's temporary API server exited with code {code} at start; set "
                                          "PREFECT_API_URL to a running Prefect server instead")
                with contextlib.suppress(httpx.HTTPError):
                    if client.get(f"{self.url}/health", timeout=1.0).status_code == 200:
                        self._unlock()
                        self.ready = True
                        return
                time.sleep(0.05)
        raise NoPrefectServer(f"Prefect's temporary API server did not answer within {limit} s "
                              "(PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS); set PREFECT_API_URL to a running "
                              "Prefect server instead")

    @contextlib.contextmanager
    def api(self):
        """The flow's Prefect settings: this server's API URL, and no UI (it serves none, and is gone after the run:
        no "View at" link)."""
        from prefect.settings import PREFECT_API_URL, PREFECT_UI_URL, temporary_settings
        self.wait()
        with temporary_settings(updates={PREFECT_API_URL: self.url, PREFECT_UI_URL: ""}):
            yield

    def _unlock(self) -> None:
        if self.lock is not None:
            self.lock.close()  # closing releases the flock
            self.lock = None

    def stop(self) -> None:
        self._unlock()
        p, self.process = self.process, None
        if p is None or p.poll() is not None:
            return
        p.terminate()
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


@contextlib.contextmanager
def temporary_api():
    """The `around` of a run (flows/run.py): Prefect's temporary server, started before Prefect is imported and
    given to the flow (`server.api()`), stopped after it, its run logs sent first; None where the environment or
    Prefect's settings name an API (a real server, a test harness: left alone) or this is not the main thread
    (signals, the server's SIGINT mask). Without it Prefect starts its own server once the flow is called: later,
    printing its banner, and blocking until it answers (#49: `ssdgen.generate` took 17.9 s against the CLI's 14)."""
    import threading
    server = None
    if not os.environ.get("PREFECT_API_URL") and threading.current_thread() is threading.main_thread():
        server = TemporaryServer().start()
    try:
        from prefect import flow  # noqa: F401 - Prefect's settings and logging, set up once imported
        if server is not None and not server.needed():
            server = None
        yield server
    finally:
        if server is not None:
            flush_run_logs()  # the run's last logs reach the server before it stops, whatever the outcome
            server.stop()


def flush_run_logs() -> None:
    """Send the queued run logs (a failure's traceback among them) to the API before its server stops. Best
    effort."""
    import logging
    try:
        from prefect.logging.handlers import APILogHandler
        for h in logging.getLogger("prefect.flow_runs").handlers:
            if isinstance(h, APILogHandler):
                h.flush()
    except Exception:  # noqa: BLE001 - only tidies the console
        pass
