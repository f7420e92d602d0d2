"""The lab (lab/, `python -m lab` from a checkout) keeps what `ssdgen dev` had, and stays out of the product.

Its command line has the same commands and options as `ssdgen dev` had, each with help, -h and one-line errors;
no module of the installed packages imports it, and pyproject's packages leave it and docs/ out, so the wheel
holds none of it (infra/wheel-smoke.sh lists the built wheel's files and refuses any lab or training code)."""

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from lab.cli import app

ROOT = Path(__file__).resolve().parents[1]
# what `ssdgen dev` held before #47: the same names, so the documented commands run as `python -m lab NAME`
COMMANDS = {"train-reference", "train-scorer", "eval-scorer", "tokenizer-report", "figures", "bench-sharding",
            "bench-pipeline", "bench-scaling", "bench-scale", "shard-overhead", "formats", "shape-replay",
            "projection-check", "host-time", "roofline", "screenshot", "eval-set"}
OUTPUTS = {"out", "plot", "html", "json_path", "work", "workdir", "to"}


def commands() -> dict:
    return dict(typer.main.get_command(app).commands)


def test_the_lab_has_the_commands_ssdgen_dev_had_and_the_product_has_none_of_them():
    from ssdgen.cli.app import app as product
    assert set(commands()) == COMMANDS
    assert not COMMANDS & set(typer.main.get_command(product).commands)


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_lab_command_has_help_on_every_option_and_dash_h(name):
    missing = [p.name for p in commands()[name].params if not (getattr(p, "help", None) or "").strip()]
    assert missing == []
    short, long = (CliRunner().invoke(app, [name, flag]) for flag in ("-h", "--help"))
    assert short.exit_code == 0 and "Usage: " in short.output and short.output == long.output


@pytest.mark.parametrize("args, message", [
    (["nosuch"], "No such command 'nosuch'"),
    (["host-time", "--batches", "x"], "--batches must be comma-separated integers, got 'x'"),
    (["bench-sharding", "--rows", "-1"], "--rows and --files must be >= 1"),
    (["roofline", "--windows", "0"], "--windows must be comma-separated integers >= 1, got '0'"),
    (["roofline", "--profile", "64"], "--profile must be BATCHxWINDOW, e.g. 64x1, got '64'"),
    (["roofline", "--json", "/nonexistent/dir/r.json"], "--json /nonexistent/dir/r.json: no folder"),
], ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_a_refused_value_is_one_error_line(args, message):
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 2, r.output
    assert r.stderr.startswith("error: ") and len(r.stderr.splitlines()) == 1, r.stderr
    assert message in r.stderr and not r.stdout, r.output


def test_no_default_output_path_writes_into_the_repository():
    repo = {p.name for p in ROOT.iterdir() if p.is_dir() and not p.name.startswith(".")} - {"out", "runs"}
    inside = [(name, p.name, p.default) for name, cmd in commands().items() for p in cmd.params
              if p.name in OUTPUTS and p.default is not None and Path(str(p.default)).parts[0] in repo]
    assert inside == []
    for name in ("figures", "train-reference", "train-scorer"):
        r = CliRunner().invoke(app, [name])
        assert r.exit_code == 2 and "Missing option '--out'" in r.output, name


def test_pyproject_installs_neither_the_lab_nor_docs():
    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = {conf["package-dir"].get(p, p.replace(".", "/")) for p in conf["packages"]}
    assert not {f for f in folders if f.split("/")[0] in ("lab", "docs", "tests")}, folders
    assert not [p for p in conf["packages"] if p.split(".")[0] != "ssdgen"], conf["packages"]


@pytest.mark.integration
def test_python_m_lab_runs_from_the_checkout():
    r = subprocess.run([sys.executable, "-m", "lab", "--help"], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert all(f" {name} " in r.stdout for name in ("train-reference", "roofline", "bench-scale")), r.stdout


def test_docs_hold_no_code():
    """docs/ holds pages and data (json, txt, logs, png, html): the scripts that made them are the lab's
    (lab/results/), and no copy of shipped code (decode attention's C loop) lives there."""
    code = {".py", ".sh", ".c", ".cc", ".cpp", ".h"}
    found = [str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*") if p.suffix in code]
    assert found == []
