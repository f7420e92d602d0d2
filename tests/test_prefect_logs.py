"""`ssdgen serve` while its Prefect server restarts (ssdgen/cli/prefect_logs.py, #49): Prefect's warning that its
events websocket dropped is one line with the reason, not a chained traceback; real errors keep theirs."""

import io
import logging

import pytest
from websockets.exceptions import ConnectionClosedError
from websockets.frames import Close

from ssdgen.cli.prefect_logs import OneLineReconnects, console_handlers, one_line_reconnects

DROPPED = ("The %s websocket failed with an exception. Switching to polling mode until it reconnects.",
           "FlowRunCancellingObserver")


def _restart() -> ConnectionClosedError:
    """The exception Prefect's observer logs when its server restarts: a close 1012, from a reset socket."""
    try:
        try:
            raise ConnectionResetError(104, "Connection reset by peer")
        except ConnectionResetError as reset:
            raise ConnectionClosedError(Close(1012, ""), Close(1012, ""), True) from reset
    except ConnectionClosedError as e:
        return e


def _logged(level: int, exc: BaseException, filtered: bool = True) -> str:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logging.Formatter("%(levelname)s | %(name)s - %(message)s"))
    if filtered:
        handler.addFilter(OneLineReconnects())
    logger = logging.getLogger("test.prefect.FlowRunCancellingObserver")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        logger.log(level, *DROPPED, exc_info=exc)
    finally:
        logger.removeHandler(handler)
    return out.getvalue()


def test_a_dropped_websocket_is_one_warning_line_with_its_reason():
    assert "Traceback" in _logged(logging.WARNING, _restart(), filtered=False)  # what serve printed before
    text = _logged(logging.WARNING, _restart())
    assert text.splitlines() == [
        "WARNING | test.prefect.FlowRunCancellingObserver - The FlowRunCancellingObserver websocket failed with an "
        "exception. Switching to polling mode until it reconnects. (ConnectionClosedError: received 1012 (service "
        "restart); then sent 1012 (service restart))"]


def _raised(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as e:
        return e


@pytest.mark.parametrize("level, exc", [
    (logging.ERROR, ConnectionResetError(104, "Connection reset by peer")),  # an error stays an error
    (logging.WARNING, ValueError("a bug, not a lost connection")),
])
def test_errors_and_other_exceptions_keep_their_traceback(level, exc):
    text = _logged(level, _raised(exc))
    assert "Traceback" in text and str(exc) in text.splitlines()[-1]


def test_serve_shortens_the_record_on_prefects_console_handler_and_only_while_it_serves():
    from prefect.logging.handlers import PrefectConsoleHandler
    out = io.StringIO()
    console = PrefectConsoleHandler(stream=out)
    prefect_logger = logging.getLogger("prefect")
    prefect_logger.addHandler(console)  # where Prefect's logging configuration puts it (or on the root)
    observer = logging.getLogger("prefect.FlowRunCancellingObserver")
    try:
        assert console in console_handlers()
        with one_line_reconnects():
            observer.warning(*DROPPED, exc_info=_restart())
        served = out.getvalue()
        observer.warning(*DROPPED, exc_info=_restart())
    finally:
        prefect_logger.removeHandler(console)
    assert "Traceback" not in served and "(ConnectionClosedError: received 1012 (service restart)" in served
    assert "Traceback" in out.getvalue()[len(served):] and not console.filters  # taken off after serve
