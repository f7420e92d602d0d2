"""Ctrl-C and SIGTERM end a run cleanly, within seconds, with one line and nothing left running.

    first signal    the window abandons its in-flight shards (nothing more commits; a rerun decodes them again),
                    the actors and the local Ray stop, the manifest and summary are written, the flow fails with
                    `Interrupted`, and the CLI prints `interrupted: N/M shards committed[; K decoded images not
                    committed (...)]; run the same command to resume` (K: images decoded in shards that did not
                    commit, thrown away with them) and exits 128 + the signal (130 for SIGINT, 143 for SIGTERM)
    second signal,  now: the same line, every process this one started is killed, exit at once
    or 10 s later

While the run is still starting (Ray, model loads, calibration), the first signal stops it at its next checkpoint
(every wait on Ray is one, a quarter second at a time).
From the first signal on, Prefect's console output is dropped (it goes on to the API): the user asked to stop,
and the line above is the answer. Committed shards are safe at any point: every file is written whole or not at
all (output.layout), and a shard counts only once its marker exists.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from typing import Callable

GRACE_S = float(os.environ.get("SSDGEN_INTERRUPT_GRACE_S", 10))


class Interrupted(RuntimeError):
    """A signal stopped the run; `signum` says which (the exit code is 128 + signum)."""

    def __init__(self, message: str, signum: int = signal.SIGINT):
        super().__init__(message)
        self.signum = signum


class StopSignals:
    """`with StopSignals(line) as stop:` SIGINT and SIGTERM handled as the module docstring says. `line()` is
    the status line; set `stop.target` to a callable taking the Interrupted to stop cooperatively (the
    dispatcher); before that, `check()` raises it at the run's checkpoints. Outside the main thread it installs
    nothing (signals are the main thread's)."""

    def __init__(self, line: Callable[[], str]):
        self.line = line
        self.target: Callable[[Interrupted], None] | None = None
        self.signum: int | None = None
        # what a hard exit still does, each within a second (a lease given back: the next run needs no takeover)
        self.last_words: list[Callable[[], None]] = []
        self._old: dict = {}

    def __enter__(self) -> "StopSignals":
        self.install()
        return self

    def install(self) -> None:
        """(Re)install the handlers: Ray's init puts its own SIGTERM handler in place, so this runs after it."""
        if threading.current_thread() is not threading.main_thread():
            return
        for s in (signal.SIGINT, signal.SIGTERM):
            old = signal.signal(s, self._handle)
            self._old.setdefault(s, old)

    def __exit__(self, *exc) -> None:
        for s, old in self._old.items():
            signal.signal(s, old)

    @property
    def interrupted(self) -> Interrupted | None:
        return None if self.signum is None else Interrupted(self.line(), self.signum)

    def _handle(self, signum: int, frame) -> None:
        if self.signum is not None:
            hard_exit(signum, self.line, self.last_words)
        self.signum = signum
        quiet_console()
        t = threading.Timer(GRACE_S, hard_exit, (signum, self.line, self.last_words))
        t.daemon = True
        t.start()
        if self.target is not None:
            self.target(Interrupted(self.line(), signum))
        # else the run is still starting: its next checkpoint (`check`, every wait on Ray) raises. Raising here
        # instead would land wherever the main thread is, an import included, where Python swallows it.

    def check(self) -> None:
        """A checkpoint of the starting run: raise Interrupted once a signal came."""
        if self.signum is not None:
            raise Interrupted(self.line(), self.signum)


class _DropAll(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return False


def quiet_console() -> None:
    """Drop Prefect's console records from now on (the API handler still sends them)."""
    try:
        from prefect.logging.handlers import PrefectConsoleHandler
    except ImportError:
        return
    for name in ("", "prefect"):
        for h in logging.getLogger(name).handlers:
            if isinstance(h, PrefectConsoleHandler):
                h.addFilter(_DropAll())


def kill_children() -> None:
    """Every process this one started (the local Ray's, Prefect's temporary server): killed, waited for."""
    import psutil
    kids = psutil.Process().children(recursive=True)
    for p in kids:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(kids, timeout=5)


def hard_exit(signum: int, line: Callable[[], str], last_words: list[Callable[[], None]] = ()) -> None:
    try:
        text = line()
    except Exception:  # noqa: BLE001 - the line must not stop the exit
        text = "interrupted; run the same command to resume"
    sys.stderr.write(f"\n{text}\n")
    sys.stderr.flush()
    kill_children()
    for fn in last_words:  # on threads that cannot hold the exit up: a store that hangs is left as it is
        t = threading.Thread(target=_quietly, args=(fn,), daemon=True)
        t.start()
        t.join(timeout=1.0)
    os._exit(128 + signum)


def _quietly(fn: Callable[[], None]) -> None:
    try:
        fn()
    except Exception:  # noqa: BLE001 - best effort on the way out
        pass
