"""The `ssdgen` command line: one Typer app holding the run commands (run.py), the decode and measure commands
(decode.py) and the listings of what a spec can name (catalog.py). Arguments are parsed at that edge into typed
configs; errors users can cause print one clear line and exit 2 (options.py).

This module decides how `ssdgen --help` shows them: in the "Run" and "Decode and measure" panels. The
maintainers' commands (training the reference model, its scorer, the docs' figures, the research benchmarks) are
the lab's, run from a checkout (`python -m lab`, lab/cli.py), and not installed.
"""

from __future__ import annotations

import contextlib
import re
import sys

import typer
from typer.core import TyperGroup

from ssdgen.cli import catalog, decode as decode_commands, run as run_commands

HELP_OPTIONS = {"help_option_names": ["-h", "--help"]}
# panel -> its commands, in the order `ssdgen --help` lists them
PANELS = {
    "Run": ("generate", "serve", "status", "verify", "export", "report", "demo"),
    "Decode and measure": ("sample", "eval", "bench", "fidelity", "calibrate", "projection", "train-heads",
                           "eval-heads", "decoders", "models"),
}


class OneLineErrors(TyperGroup):
    """The app's group: a usage error (an unknown option or command, a value Typer cannot convert) is one
    `error: ...` line naming the command's help, like every other refused value, not Typer's boxed panel under
    the usage line. Help shown for a bare command (no_args_is_help) passes through as before."""

    def make_context(self, info_name, args, parent=None, **extra):
        with _one_line():  # the app's own options and the command's name
            return super().make_context(info_name, args, parent, **extra)

    def invoke(self, ctx):
        with _one_line():  # the command's options are parsed here, in its own context
            return super().invoke(ctx)


@contextlib.contextmanager
def _one_line():
    from typer._click.exceptions import ClickException, NoArgsIsHelpError
    try:
        yield
    except NoArgsIsHelpError:
        raise
    except ClickException as e:
        ctx = getattr(e, "ctx", None)
        hint = f" (see {ctx.command_path} -h)" if ctx is not None else ""
        typer.echo(f"error: {' '.join(e.format_message().split()).rstrip('.')}{hint}", err=True)
        raise typer.Exit(e.exit_code) from None


app = typer.Typer(cls=OneLineErrors, add_completion=True, no_args_is_help=True, pretty_exceptions_enable=False,
                  context_settings=HELP_OPTIONS,
                  help="ssdgen: batch image generation with speculative decoders for AR image transformers. "
                       "Prompts in from Parquet, CSV, TSV, JSON, JSON Lines or text files at any fsspec URL; images "
                       "and per-sample statistics out as Parquet or WebDataset shards.")


def command_name(info) -> str:
    return info.name or typer.main.get_command_name(info.callback.__name__)


def first_sentence(doc: str | None) -> str | None:
    """A docstring's first sentence on one line: the command lists show it, `COMMAND -h` the whole text."""
    if not doc:
        return None
    text = " ".join(doc.split("\n\n")[0].split())
    end = re.search(r"(?<!e\.g)(?<!i\.e)\.\s", text)  # "e.g. " ends no sentence
    return text if end is None else text[:end.start() + 1]


def _place(infos: list) -> None:
    """Every command onto `app`, in its panel, in PANELS' order; one that no panel names still goes on `app`, in
    the default panel, where tests/test_cli.py notices it."""
    by_name = {command_name(i): i for i in infos}
    placed = [(by_name.pop(n), panel) for panel, names in PANELS.items() for n in names if n in by_name]
    placed += [(i, None) for i in by_name.values()]
    for info, panel in placed:
        info.rich_help_panel = panel
        info.short_help = info.short_help or first_sentence(info.help or info.callback.__doc__)
        info.context_settings = {**(info.context_settings or {}), **HELP_OPTIONS}
        app.registered_commands.append(info)


def _version(value: bool) -> None:
    if not value:
        return
    from importlib.metadata import PackageNotFoundError, version
    try:
        typer.echo(f"ssdgen {version('ssdgen')}")
    except PackageNotFoundError:  # a source tree on sys.path, never installed: it has no version to state
        typer.echo("error: the ssdgen distribution is not installed (pip install -e .), so it has no version",
                   err=True)
        raise typer.Exit(2)
    raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", is_eager=True, callback=_version,
                                       help="print the installed ssdgen's version and exit")):
    """The app's own options (the help text is the Typer app's)."""


_place([i for group in (run_commands, decode_commands, catalog)
        for i in group.app.registered_commands])


def main():
    # no analytics switches here: importing the ssdgen package set their quiet defaults (ssdgen/__init__.py)
    import signal
    # the imports are done: Python's own SIGINT again (a run installs flows/interrupts.py's); a Ctrl-C that
    # still reaches here as KeyboardInterrupt (a command's start-up, before any handler) is one line, exit 130
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        app()  # no RAY_AUTH_MODE here: only the loopback-only local Ray runs without auth (flows/cluster.py)
    except KeyboardInterrupt:
        print("interrupted: stopped before the run started; nothing was committed", file=sys.stderr)
        sys.exit(128 + signal.SIGINT)


if __name__ == "__main__":
    sys.exit(main())
