"""The `ssdgen` command line, the only package that imports Typer: run commands (run.py), decode and measure
commands (decode.py), maintainer commands under `ssdgen dev` (dev.py), the listings (catalog.py), and the parsing
of options into typed settings (options.py). app.py puts them on one app."""

from ssdgen.cli.app import app, main

__all__ = ["app", "main"]
