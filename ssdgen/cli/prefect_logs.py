"""Prefect's console records of a dropped connection, as one line (`ssdgen serve`, #49).

While a Prefect server restarts under a served deployment, Prefect's runner loses its events websocket and says
so at WARNING with the exception's whole chained traceback ("The FlowRunCancellingObserver websocket failed with
an exception. Switching to polling mode until it reconnects.", then ~20 lines ending in `ConnectionClosedError:
received 1012 (service restart)`); it reconnects by itself a moment later and says that too. The traceback
tells an operator nothing the one line does not, and reads like a crash. Here such a record keeps its words
and gets the exception's type and message on the same line instead of the traceback.

Only warnings and below whose exception is a lost connection are shortened (`websockets`' ConnectionClosed,
Python's ConnectionError, TimeoutError); an ERROR, or any other exception, keeps its traceback.
"""

from __future__ import annotations

import contextlib
import logging


def _connection_lost(exc: BaseException) -> bool:
    try:
        from websockets.exceptions import ConnectionClosed
    except ImportError:  # websockets comes with Prefect; without it, only Python's own kinds
        ConnectionClosed = ConnectionError  # noqa: N806
    return isinstance(exc, (ConnectionClosed, ConnectionError, TimeoutError))


class OneLineReconnects(logging.Filter):
    """A handler's filter: a WARNING (or lower) record carrying a lost connection is one line, its exception's
    type and message appended in place of the traceback. Nothing is dropped."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if exc is None or record.levelno > logging.WARNING or not _connection_lost(exc):
            return True
        reason = " ".join(str(exc).split()) or "connection lost"
        record.msg, record.args = f"{record.getMessage()} ({type(exc).__name__}: {reason})", None
        record.exc_info, record.exc_text, record.stack_info = None, None, None
        return True


def console_handlers() -> list[logging.Handler]:
    """Prefect's console handlers: on the root logger (the "prefect" logger only propagates to it) or on
    "prefect" itself, as its logging configuration puts them."""
    from prefect.logging.handlers import PrefectConsoleHandler
    return [h for name in ("", "prefect") for h in logging.getLogger(name).handlers
            if isinstance(h, PrefectConsoleHandler)]


@contextlib.contextmanager
def one_line_reconnects():
    """Around `flow.serve`: Prefect's console says a dropped and re-made connection in one line."""
    handlers, quiet = console_handlers(), OneLineReconnects()
    for h in handlers:
        h.addFilter(quiet)
    try:
        yield
    finally:
        for h in handlers:
            h.removeFilter(quiet)
