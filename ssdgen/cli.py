"""The `ssdgen` command line: one Typer app holding the pipeline's commands (ssdgen/commands.py), the
measuring ones (bench/commands.py) and the reference model's (reference/commands.py). Arguments are parsed at
that edge into typed configs; errors users can cause print one clear line and exit 2 (ssdgen/options.py).
"""

from __future__ import annotations

import os
import sys

import typer

from bench import commands as bench_commands
from reference import commands as reference_commands
from ssdgen import commands as run_commands

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="ssdgen: batch image generation with speculative decoders for AR image transformers.")
for group in (run_commands, bench_commands, reference_commands):
    app.registered_commands += group.app.registered_commands


def main():
    # Prefect's temporary server would send usage telemetry and, with two runs at once on one machine, log
    # its database-lock tracebacks from that heartbeat on the user's console; the user may turn it back on
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    app()  # no RAY_AUTH_MODE here: only the loopback-only local Ray runs without auth (flows/cluster.py)


if __name__ == "__main__":
    sys.exit(main())
