"""What every `ssdgen` command shares: user errors as one line, the decode-spec and model options, and the
edge where their text is parsed into typed configs (the commands live in run.py, decode.py and catalog.py;
app.py puts them on one app).

Errors users can cause (bad captions, bad parameters, missing files: the project's own error types) print one
clear line and exit 2; they never end in a raw stack trace. Any other exception is a bug and is said to be one:
its traceback, a line asking for a report, exit 70.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import sys
from typing import Optional

import typer

from ssdgen.models.registry import MODEL_HELP


# The project's own error types that are neither a ValueError nor an OSError, by module and class. They are
# looked up among the modules already imported (no instance exists before its class is imported), so a refused
# value never waits for torch or Prefect to import; tests/test_cli.py checks that every name is there.
OWN_ERRORS = (("ssdgen.reference.weights", "BundleError"), ("ssdgen.output.lease", "LeaseHeld"),
              ("ssdgen.output.lease", "LeaseLost"), ("ssdgen.flows.commit", "ProvenanceError"),
              ("ssdgen.flows.pipeline", "ShardsFailed"), ("ssdgen.flows.cluster", "ClusterError"),
              ("ssdgen.flows.prefect_server", "NoPrefectServer"))
BUG_EXIT = 70  # sysexits' EX_SOFTWARE: neither 2 (the user's to fix) nor 1 (verify's "damaged")


def is_user_error(e: BaseException) -> bool:
    """Whether `e` is the user's to fix: a refused value (ValueError, the project's convention for a bad
    setting, spec or row, pydantic's ValidationError included), a path or store that refused (OSError, the
    project's StorageError included) or another of the project's own errors. Anything else is a bug."""
    if isinstance(e, (ValueError, OSError)):
        return True
    return any(isinstance(e, getattr(sys.modules[m], name)) for m, name in OWN_ERRORS if m in sys.modules)


def _user_message(e: BaseException) -> str:
    if isinstance(e, OSError) and e.strerror:  # "[Errno 28] ..." is for programs, not people
        return e.strerror if e.filename is None else f"{e.filename}: {e.strerror}"
    return str(e)


def friendly(fn):
    """A user error becomes one `error: ...` line and exit code 2; any other exception is a bug: its traceback,
    an `error: internal error` line asking for a report, and exit code 70. A run stopped by Ctrl-C or SIGTERM
    ends in its `interrupted: ...` line and exit code 128 + the signal (flows/interrupts.py)."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        from typer._click.exceptions import ClickException
        from ssdgen.flows.interrupts import Interrupted
        try:
            return fn(*args, **kwargs)
        except (typer.Exit, typer.Abort, ClickException):  # Typer's own: its exit code, its usage line (app.py)
            raise
        except Interrupted as e:
            typer.echo(f"\n{e}", err=True)
            raise typer.Exit(128 + int(e.signum))
        except KeyboardInterrupt:  # before the run started: nothing was written
            typer.echo("\ninterrupted before the run started; nothing was committed", err=True)
            raise typer.Exit(130)
        except Exception as e:
            _report(e)
    return wrapper


def _report(e: Exception):
    """Say `e` (the exception being handled) the way `friendly` promises, and exit."""
    from ssdgen.storage.endpoints import no_credentials
    if is_user_error(e):
        typer.echo(f"error: {_user_message(e)}", err=True)
        raise typer.Exit(2) from None
    if no_credentials(e):  # botocore's NoCredentialsError is no OSError, yet the user's to fix
        typer.echo("error: the object store found no credentials to sign with: set AWS_ACCESS_KEY_ID and "
                   "AWS_SECRET_ACCESS_KEY, or AWS_PROFILE (or run where an instance role provides them)", err=True)
        raise typer.Exit(2) from None
    import traceback
    traceback.print_exception(e)  # a bug: its traceback is what a report needs
    typer.echo(f"error: internal error (a bug in ssdgen, not in your input): {type(e).__name__}: {e}; please "
               "report it with the traceback above and the command you ran", err=True)
    raise typer.Exit(BUG_EXIT) from None


class _QuietUserErrors(logging.Filter):
    """Drops, on the console only, Prefect's "Encountered exception" record of a user error: its traceback
    stays in the Prefect logs (the API handler sits on a child logger and has already sent it), and the
    console ends with `friendly`'s one `error:` line."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return exc is None or not is_user_error(exc)


@contextlib.contextmanager
def flow_console():
    """Around a flow call: keep user errors' tracebacks off the console, under the Prefect API the run starts
    itself (flows/prefect_server.py `temporary_api`: without a Prefect API the temporary server starts here
    first, before Prefect is imported, and the context gives the one the flow runs under, None when an API is
    configured; the run starts its local Ray meanwhile, flows/run.py)."""
    from ssdgen.flows.prefect_server import flush_run_logs, temporary_api
    with temporary_api() as server:
        from prefect.logging.handlers import PrefectConsoleHandler
        # Prefect's console handler sits on the root logger (the "prefect" logger only propagates to it)
        handlers = [h for name in ("", "prefect") for h in logging.getLogger(name).handlers
                    if isinstance(h, PrefectConsoleHandler)]
        quiet = _QuietUserErrors()
        for h in handlers:
            h.addFilter(quiet)
        try:
            yield server
        except Exception as e:
            if is_user_error(e):
                flush_run_logs()
            raise
        finally:
            for h in handlers:
                h.removeFilter(quiet)


def check_out_files(flags: dict) -> None:
    """Each named output file ({"--json": path or None, ...}) goes into a folder that exists: checked before the
    work starts, so a typo in the folder does not cost a whole eval or bench and then fail at its last line."""
    from pathlib import Path
    for flag, path in flags.items():
        if path is not None and not Path(path).parent.is_dir():
            raise ValueError(f"{flag} {path}: no folder {Path(path).parent} to write it in")


def sampling_of(cfg: float, temperature: float, top_k: int, top_p: float):
    from ssdgen.decoders.recipes import SamplingConfig
    return SamplingConfig(cfg_scale=cfg, temperature=temperature, top_k=top_k, top_p=top_p)


def spec_of(text: str):
    """The one place a decode spec is parsed (decoders/spec.py); errors name the spec and the key."""
    from ssdgen.decoders.spec import DecodeSpec
    return DecodeSpec.parse(text)


def specs_of(text: str) -> list:
    return [spec_of(t) for t in text.split(",") if t.strip()]


SPEC_HELP = ("decode spec: family[:key=value]..., family one of ar, sjd, csd, ssd, ssd+csd; keys are the "
             "decoder's parameters, cfg, temperature, top_k, top_p and heads (docs/decoders.md), "
             "e.g. ssd+csd:rows=2:cfg=3")
DECODER = typer.Option("ar", "--decoder", help=SPEC_HELP)
# generate, serve and demo default to ssd+csd: within 0.15 nats/token of AR, and on each device and batch size
# as fast as its calibrated plan makes it (docs/benchmarks.md); plain AR where speculation does not pay
RUN_DECODER = typer.Option("ssd+csd", "--decoder", help=SPEC_HELP + "; the default ssd+csd decides once per run "
                           "whether and how far to speculate on this device (_plan.json)")
CFG = typer.Option(3.0, "--cfg", help="classifier-free guidance scale (1 = off)")
TOPK = typer.Option(0, "--top-k", help="keep the k most likely tokens (0 = off)")
MODEL = typer.Option(None, help=MODEL_HELP)
DEVICE = typer.Option("cpu", "--device", help="torch device for the model: cpu or cuda[:N]")
DTYPE = typer.Option("auto", "--dtype", help="model precision: fp32, bf16, fp16 (GPU only) or auto (fp32 on the "
                                            "CPU; on a GPU bf16 for Hugging Face checkpoints, fp32 for the "
                                            "reference model); sampling and verification are fp32 always")


def model_on(model: Optional[str], device: str = "cpu", dtype: str = "auto"):
    """The one loader of every command that loads a model (--model, --device, --dtype: models/registry.py)."""
    from ssdgen.models.registry import load_model
    return load_model(model, device=device, dtype=dtype)
