"""The `ssdgen` command line, the only package of ssdgen that imports Typer: run commands (run.py), decode and
measure commands (decode.py), the listings (catalog.py), and the parsing of options into typed settings
(options.py). app.py puts them on one app. The maintainers' commands are the lab's (`python -m lab`, lab/cli.py)."""

import os as _os
import signal as _signal
import sys as _sys
import time as _time

_ENTERED = _time.time()  # first: a run's end-to-end figures count from the command's start (#49), imports included


def _interrupted_while_starting(signum, frame):
    # the imports below take a second or more (Typer, Prefect, torch): a Ctrl-C then ends the command with one
    # line, not a KeyboardInterrupt traceback; nothing has started yet, so there is nothing to stop or tidy
    _sys.stderr.write("interrupted: stopped while starting; nothing was run\n")
    _sys.stderr.flush()
    _os._exit(128 + signum)


# the very first thing the `ssdgen` script (ssdgen.cli:main) or `python -m ssdgen.cli` runs ("-m" while the module
# is located); main() hands SIGINT back to Python. A program that imports the CLI (a notebook, pytest) keeps its own.
_COMMAND = bool(_sys.argv) and (_sys.argv[0] == "-m" or _os.path.basename(_sys.argv[0]) in ("ssdgen", "ssdgen.exe"))
if _COMMAND:
    _signal.signal(_signal.SIGINT, _interrupted_while_starting)


def started() -> float | None:
    """When this `ssdgen` process entered the CLI (a Unix time, before its imports), or None where a program
    imported the CLI (a notebook, a test's CliRunner): a command then counts from its own start."""
    return _ENTERED if _COMMAND else None


from ssdgen.cli.app import app, main  # noqa: E402 - after the handler, on purpose

__all__ = ["app", "main", "started"]
