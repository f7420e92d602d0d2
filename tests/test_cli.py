"""The CLI: its shape (fast, in process: users' commands in panels, the maintainers' in the lab, help on
every option, -h, --version, the listings, no default output inside the repository), and, in a subprocess,
bad input turned into one clear error line and exit code 2, never a stack trace; a bug said as one, with its
traceback."""

import os
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from ssdgen.cli.app import PANELS, app

ROOT = Path(__file__).resolve().parents[1]
GOOD = "a large red circle at the center on a flat gray background"


def run(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "ssdgen.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.integration
@pytest.mark.parametrize("args, message", [
    (["sample", "--prompt", ""], "empty caption"),
    (["sample", "--prompt", "a large magenta circle at the center on a flat gray background"], "unknown words"),
    (["sample", "--prompt", " ".join([GOOD] * 4)], "at most 36"),
    (["sample", "--prompt", GOOD, "--decoder", "nope"], "unknown decoder 'nope'"),
    (["sample", "--prompt", GOOD, "--decoder", "ar:top_k=-3"], "top_k"),
    (["sample", "--prompt", GOOD, "--decoder", "csd:lam"], "expected key=value"),
    (["sample", "--prompt", GOOD, "--decoder", "sjd:lam=1"], "has no parameter(s) ['lam']"),
    (["generate", "--prompts", "x.parquet", "--decoder", "ssd+csd:commit=block:token_budget=64"],
     "calibrated and token_budget"),
    (["generate", "--prompts", "x.parquet", "--decoder", "ssd+csd:token_budget=64"],
     "token_budget belong(s) to the block decoder"),
    (["bench", "--decoders", "ar:cfg=2,csd"], "must share their sampling"),
    (["sample", "--prompt", GOOD, "--model", "reference:/nonexistent"], "not a model bundle"),
    (["eval", "--n", "0"], "--n must be in 1..1024"),
    (["calibrate", "--decoder", "csd"], "is not calibrated"),
    (["calibrate", "--batch-sizes", "0"], "--batch-sizes must be integers in 1..1024"),
    (["sample", "--prompt", GOOD, "--dtype", "fp16"], "fp16 is not supported on the CPU"),
    (["train-heads", "--dtype", "fp64", "--out", "/nonexistent/heads"], "--dtype must be one of"),
    (["generate", "--prompts", "/nonexistent/prompts.parquet"], "/nonexistent/prompts.parquet"),
    (["generate", "--prompts", "x.parquet", "--device-type", "tpu-v9"], "known"),
    (["generate", "--prompts", "x.parquet", "--batch-size", "0"], "--batch-size must be >= 1"),
    (["generate", "--prompts", "x.parquet", "--device-type", "h100"], "priced per GPU"),
    (["generate", "--prompts", "x.parquet", "--image-format", "gif"], "--image-format must be one of png, webp"),
    (["generate", "--prompts", "x.parquet", "--image-format", "jpeg", "--quality", "0"], "--quality must be in"),
    (["generate", "--prompts", "x.parquet", "--format", "zip"], "--format must be one of parquet, webdataset"),
    (["status", "/nonexistent/run"], "no ssdgen run here"),
    (["generate", "--prompts", "x.parquet", "--dtype", "fp16"], "--dtype fp16 is not supported on the CPU"),
    (["generate", "--prompts", "x.parquet", "--model", "reference:kv=fp16"], "kv=fp16 is not supported on the CPU"),
    (["generate", "--prompts", "x.parquet", "--model", "reference:kv=int8"], "kv must be one of fp32, bf16, fp16"),
    (["serve", "--prompts", "x.parquet", "--out", "o", "--dtype", "fp8"], "--dtype must be one of"),
    (["serve", "--prompts", "x.parquet", "--out", "o", "--cron", "every night"], "--cron 'every night': Invalid"),
    (["export", "/nonexistent/run", "--to", "x"], "no ssdgen run here"),
    (["train-heads", "--kind", "latent,pixel", "--out", "/nonexistent/heads"],
     "--kind must be latent, token or latent,token"),
    (["train-heads", "--kind", "latent", "--out", "/nonexistent/a,/nonexistent/b"],
     "--out names 2 path(s) for 1 kind(s)"),
])
def test_bad_input_gets_a_clear_error(args, message, tmp_path):
    r = run(*args, *([] if args[0] != "sample" else ["--out", str(tmp_path / "x.png")]))
    assert r.returncode == 2, r.stderr
    assert message in r.stderr
    assert "Traceback" not in r.stderr + r.stdout
    assert len(r.stderr.splitlines()) == 1 and r.stderr.startswith("error: "), r.stderr


NOT_JSON, NO_ROWS = "not json", "{}"


@pytest.mark.parametrize("args, message", [
    # what Typer refuses itself (a value it cannot convert, an unknown option or command) is one line too
    (["generate", "--prompts", "x.parquet", "--shard-size", "abc"], "Invalid value for '--shard-size'"),
    (["generate", "--prompts", "x.parquet", "--nosuchflag"], "No such option: --nosuchflag"),
    (["nosuchcommand"], "No such command 'nosuchcommand'"),
    (["projection"], "Missing option '--bench-json'"),
    # values checked before anything starts (the flow, a model load, an eval that ends by writing --json)
    (["generate", "--prompts", "x.parquet", "--ray-address", "notaurl"], "--ray-address 'notaurl': not a Ray"),
    (["sample", "--prompt", GOOD, "--device", "cuda:99"], "--device cuda:99: this machine has"),
    (["sample", "--prompt", GOOD, "--out", "/nonexistent/dir/g.png"], "--out /nonexistent/dir/g.png: no folder"),
    (["sample"], "give a prompt: ssdgen sample \"a large red circle"),
    (["sample", "--prompt", GOOD, "--decoder", "sdd+csd"], "unknown decoder 'sdd+csd' (did you mean 'ssd+csd'?)"),
    (["generate", "--prompts", "x.parquet", "--decoder", "sjdd:window=8"], "unknown decoder 'sjdd' (did you mean"),
    (["eval", "--n", "1", "--json", "/nonexistent/dir/x.json"], "--json /nonexistent/dir/x.json: no folder"),
    (["bench", "--tolerance", "-1"], "--tolerance must be > 0"),
    (["bench", "--n", "1", "--html", "/nonexistent/dir/b.html"], "--html /nonexistent/dir/b.html: no folder"),
    (["fidelity", "--json", "/nonexistent/dir/x.json"], "--json /nonexistent/dir/x.json: no folder"),
    (["calibrate", "--objective", "speed"], "--objective must be one of throughput, latency"),
    (["projection", "--bench-json", NOT_JSON], "not a bench JSON (Expecting"),
    (["projection", "--bench-json", NO_ROWS], "not a bench JSON (no rows)"),
    (["train-heads", "--n-images", "0", "--out", "/nonexistent/h"], "--n-images must be >= 1, got 0"),
    (["train-heads", "--steps", "-1", "--out", "/nonexistent/h"], "--steps must be >= 1, got -1"),
    (["eval-heads", "--n", "0"], "--n must be in 1..1024"),
    (["report", "/nonexistent/run", "--html", "/nonexistent/dir/r.html"], "--html /nonexistent/dir/r.html: no"),
], ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_every_refused_value_is_one_error_line(args, message, tmp_path):
    """A bad value given the way a user would (a typo, a negative number, a folder that is not there) is one
    `error:` line and exit code 2, whichever layer refuses it: Typer's parsing or the command's own checks."""
    files = {NOT_JSON: "[1, 2", NO_ROWS: "{}"}
    for i, a in enumerate(args):
        if a in files:
            (tmp_path / f"{i}.json").write_text(files[a])
            args = args[:i] + [str(tmp_path / f"{i}.json")] + args[i + 1:]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 2, r.output
    assert r.stderr.startswith("error: ") and len(r.stderr.splitlines()) == 1, r.stderr
    assert message in r.stderr and not r.stdout, r.output


def _raising(exc: BaseException) -> typer.Typer:
    """A one-command app whose command, wrapped as every ssdgen command is, raises `exc`."""
    from ssdgen.cli.options import friendly
    one = typer.Typer()

    @one.command()
    @friendly
    def boom():
        raise exc
    return one


def _project_errors():
    from ssdgen.flows.prefect_server import NoPrefectServer
    from ssdgen.inputs.pinned import InputError
    from ssdgen.output.lease import LeaseHeld
    from ssdgen.storage.store import StorageError
    return [InputError("p.parquet: the file changed since the run started"), LeaseHeld("run: held by pid 7"),
            NoPrefectServer("a schedule needs a Prefect server"), StorageError(28, "No space left", "out/x")]


@pytest.mark.parametrize("exc", _project_errors(), ids=lambda e: type(e).__name__)
def test_a_project_error_is_one_line_and_exit_2(exc):
    r = CliRunner().invoke(_raising(exc), [])
    assert r.exit_code == 2, r.output
    assert len(r.stderr.splitlines()) == 1 and r.stderr.startswith("error: "), r.stderr
    assert "Traceback" not in r.output


@pytest.mark.parametrize("exc", [KeyError("seed"), RuntimeError("shape mismatch"), TypeError("bad operand")],
                         ids=lambda e: type(e).__name__)
def test_any_other_exception_is_a_bug_with_its_traceback_and_a_way_to_report_it(exc):
    """A KeyError or RuntimeError is no bad input: said as a bug, with what a report needs, and its own exit code."""
    from ssdgen.cli.options import BUG_EXIT
    r = CliRunner().invoke(_raising(exc), [])
    assert r.exit_code == BUG_EXIT != 2, r.output
    lines = r.stderr.splitlines()
    assert lines[0] == "Traceback (most recent call last):" and "in boom" in r.stderr, r.stderr
    assert lines[-1].startswith(f"error: internal error (a bug in ssdgen, not in your input): {type(exc).__name__}")
    assert "please report it with the traceback above" in lines[-1]


def test_every_named_project_error_exists():
    """options.OWN_ERRORS names classes by text (looked up only once imported): a rename must not drop one."""
    import importlib
    from ssdgen.cli.options import OWN_ERRORS
    for module, name in OWN_ERRORS:
        cls = getattr(importlib.import_module(module), name)
        assert issubclass(cls, Exception) and not issubclass(cls, (ValueError, OSError)), (module, name)


@pytest.mark.integration
def test_no_object_store_credentials_is_one_line(tmp_path):
    """botocore's NoCredentialsError is no OSError; it reached the user as a traceback from status and generate."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env |= {"AWS_EC2_METADATA_DISABLED": "true", "AWS_CONFIG_FILE": str(tmp_path / "none"),
            "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none")}
    r = subprocess.run([sys.executable, "-m", "ssdgen.cli", "status", "s3://ssdgen-no-such-bucket/run"],
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1, r.stderr
    assert r.stderr.startswith("error: the object store found no credentials"), r.stderr


@pytest.mark.integration
def test_sample_writes_a_captioned_grid_where_it_says(tmp_path):
    """#49: `sample` wrote an uncaptioned grid.png into the current folder. The prompt may be an argument; the
    default --out is out/samples.png under the current folder (made), said in one line; each image has its
    caption."""
    import numpy as np
    from PIL import Image

    from ssdgen.reference.grid import PAD, TILE
    r = subprocess.run([sys.executable, "-m", "ssdgen.cli", "sample", GOOD, "--n", "2"], capture_output=True,
                       text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    out = tmp_path / "out" / "samples.png"
    assert r.stdout.splitlines() == [f"wrote {out}: 2 images of 1 prompt(s), 2 per row (ar, 256.0 forwards per "
                                     "image)"], r.stdout
    grid = Image.open(out)
    assert grid.width == 2 * (TILE + 2 * PAD) and grid.height > TILE + 4
    band = np.asarray(grid.convert("L"))[TILE + 8:, :]  # under the images: their captions, in dark pixels
    assert (band < 128).any(axis=1).sum() >= 2 * 8, "no caption under the images"


def test_sample_grid_captions_each_image_with_its_prompt_and_seed(monkeypatch):
    import numpy as np

    import ssdgen.reference.grid as grid
    from ssdgen.cli.decode import _sample_grid
    seen = {}
    monkeypatch.setattr(grid, "captioned_grid", lambda images, captions, cols, tile: seen.update(
        captions=captions, cols=cols, tile=tile))
    _sample_grid(np.zeros((4, 64, 64, 3), np.uint8), ["a", "a", "b", "b"], [0, 1, 2, 3], 2)
    assert seen == {"captions": ["a (seed 0)", "a (seed 1)", "b (seed 2)", "b (seed 3)"], "cols": 2,
                    "tile": grid.TILE}


@pytest.mark.integration
def test_calibrate_says_what_the_device_decides(tmp_path):
    out = tmp_path / "plans.json"
    r = run("calibrate", "--decoder", "ssd+csd", "--batch-sizes", "1", "--json", str(out))
    assert r.returncode == 0, r.stderr
    import json
    plan = json.loads(out.read_text())["plans"][0]
    assert plan["batch"] == 1 and plan["choice"] in ("ar", "w3", "w4", "w5", "w6", "w8", "r1", "r2")
    assert set(plan["estimates"]) == {f"{c}@1" for c in ("ar", "w3", "w4", "w5", "w6", "w8", "r1", "r2")}
    assert f"batch    1: {plan['why']}" in r.stdout and plan["seconds"] > 0


@pytest.mark.integration
def test_train_heads_trains_both_kinds_from_one_sample_set(tmp_path):
    from ssdgen.reference.tiny import tiny_model
    tiny_model(tmp_path / "tiny")
    heads = f"{tmp_path / 'tiny' / 'heads'},{tmp_path / 'tiny' / 'heads-token'}"
    r = run("train-heads", "--model", f"reference:{tmp_path / 'tiny'}", "--kind", "latent,token", "--n-images", "4",
            "--steps", "2", "--out", heads)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.count("\"shared_collect_s\"") == 2  # both kinds report the one shared sampling pass
    for name in ("heads", "heads-token"):
        assert (tmp_path / "tiny" / f"{name}.safetensors").exists(), name


@pytest.mark.slow
@pytest.mark.integration
def test_demo_runs_the_flow_on_local_ray_and_writes_committed_images(tmp_path):
    """What `make demo` runs: Prefect's ephemeral API, a local Ray, local files, the bundled model."""
    import pyarrow.parquet as pq
    r = run("demo", "--out", str(tmp_path / "run"), timeout=900)  # Prefect's first start, Ray, two actors
    assert r.returncode == 0, r.stderr[-3000:]
    man = pq.read_table(tmp_path / "run" / "manifest.parquet").to_pylist()
    assert sum(m["ok"] for m in man) == 8 and (tmp_path / "grid.png").exists()
    s = run("status", str(tmp_path / "run"))
    assert s.returncode == 0 and "2 done, 0 pending, 0 failed of 2 shards" in s.stdout, s.stdout + s.stderr


# ---- the CLI's shape: fast, in process (nothing runs past option parsing) ------------------------------------

def commands(group=None, path=()):
    """(path, command) of every leaf command under `group` (default: the whole `ssdgen` tree)."""
    group = group or typer.main.get_command(app)
    for name, cmd in group.commands.items():
        if hasattr(cmd, "commands"):
            yield from commands(cmd, path + (name,))
        else:
            yield path + (name,), cmd


def test_every_option_and_argument_has_help_text():
    missing = [(" ".join(path), p.name) for path, cmd in commands() for p in cmd.params
               if not (getattr(p, "help", None) or "").strip()]
    assert len(list(commands())) == sum(map(len, PANELS.values())) and missing == []


@pytest.mark.parametrize("path", [()] + [path for path, _ in commands()], ids=" ".join)
def test_dash_h_is_help_on_the_app_and_every_command(path):
    short, long = (CliRunner().invoke(app, [*path, flag]) for flag in ("-h", "--help"))
    assert short.exit_code == 0 and long.exit_code == 0, short.output
    assert "Usage: " in short.output and short.output == long.output


@pytest.mark.integration
def test_shell_completion_is_offered_for_the_installed_command():
    """`ssdgen --install-completion` / `--show-completion SHELL`, as Typer apps offer them."""
    r = subprocess.run([str(Path(sys.executable).parent / "ssdgen"), "--show-completion", "bash"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "_SSDGEN_COMPLETE" in r.stdout and "complete " in r.stdout, r.stderr[-2000:]


def test_version_is_the_installed_distributions():
    r = CliRunner().invoke(app, ["--version"])
    assert r.exit_code == 0 and r.output == f"ssdgen {version('ssdgen')}\n"


def test_help_lists_every_users_command_in_panels_and_no_maintainers_command():
    """The maintainers' commands are the lab's (`python -m lab`, tests/test_lab.py): `ssdgen` has none of them."""
    root = typer.main.get_command(app)
    users = [n for names in PANELS.values() for n in names]
    assert list(root.commands) == users  # every command placed: none left in the default panel
    assert {root.commands[n].rich_help_panel for n in users} == set(PANELS)
    out = CliRunner().invoke(app, ["--help"]).output
    order = [out.index(s) for s in ("─ Run ", " generate ", "─ Decode and measure ", " sample ", " models ")]
    assert order == sorted(order) and all(f" {n} " in out for n in users)
    assert " dev " not in out and " bench-sharding " not in out and " train-reference " not in out


def test_help_says_every_input_format_the_run_reads():
    """`ssdgen --help` once said "Parquet prompts" (#49): the app's help and generate's line name every format
    inputs/text.py reads, and no command calls its prompts Parquet-only."""
    from ssdgen.inputs.text import FORMATS
    names = {"parquet": "Parquet", "csv": "CSV", "tsv": "TSV", "json": "JSON", "jsonl": "JSON Lines", "txt": "text"}
    assert set(names) == set(FORMATS)  # a new input format gets a name here, and in the help
    out = " ".join(CliRunner().invoke(app, ["--help"]).output.replace("│", " ").split())
    top, generate = out.split(" Options ")[0], out.split(" generate ")[1].split(" serve ")[0]
    assert all(n in top and n in generate for n in names.values()), out
    assert "Parquet prompts" not in out


def test_serve_takes_every_setting_generate_takes_and_checks_them_first():
    root = typer.main.get_command(app)
    names = {c: {p.name for p in root.commands[c].params} for c in ("generate", "serve")}
    own = {"overwrite", "progress", "dry_run"}  # generate's own: what one run does now
    assert names["generate"] - own <= names["serve"], names["generate"] - names["serve"]
    # --seed and --ray-address reach the settings serve validates before Prefect (a stray key: a TypeError)
    r = CliRunner().invoke(app, ["serve", "--prompts", "x.parquet", "--out", "o", "--seed", "7", "--ray-address",
                                 "127.0.0.1:1", "--audit", "2"])
    assert r.exit_code == 2, r.output
    assert r.output.strip() == "error: --audit must be a fraction in [0, 1] (0 = no audit), got 2.0"


def test_decoders_lists_every_family_with_its_parameters_and_defaults():
    from ssdgen.decoders.recipes import RECIPES as FAMILIES
    r = CliRunner().invoke(app, ["decoders"])
    assert r.exit_code == 0, r.output
    blocks, name = {}, None
    for line in r.output.splitlines():
        if line and not line.startswith(" ") and line.split(":")[0] in FAMILIES:
            name = line.split(":")[0]
        if name:
            blocks[name] = blocks.get(name, "") + f" {line} "
    assert set(blocks) == set(FAMILIES)
    for fam, info in FAMILIES.items():
        assert all(f" {p}=" in blocks[fam] for p in info.params), fam
        assert not info.relaxed or " lam=" in blocks[fam]
    # the families' own defaults, not the engine's: csd's coupled 33-token window, ssd+csd calibrated
    assert " window=33 " in blocks["csd"] and " lam=2.0 " in blocks["csd"] and " window=16 " in blocks["sjd"]
    assert " calibrated=true " in blocks["ssd+csd"] and " calibrated=false " in blocks["ssd"]
    assert "no parameters" in blocks["ar"] and "cfg=3.0" in r.output


def test_models_lists_every_kind_with_a_spec_syntax_the_registry_parses():
    from ssdgen.models.registry import KINDS as OPTIONS, ModelSpec
    r = CliRunner().invoke(app, ["models"])
    assert r.exit_code == 0, r.output
    syntax = {line.split(":")[0].split("[")[0]: line for line in r.output.splitlines()
              if line and not line.startswith((" ", "--"))}
    assert set(syntax) == set(OPTIONS)
    for kind, line in syntax.items():
        plain, _, opts = line.partition("[")
        if opts.startswith(":/"):  # the reference's optional bundle path, then its options
            path, _, opts = opts.partition("]")
            plain, opts = plain + path, opts.removeprefix("[")
        for opt in [o for o in opts.rstrip("]").split("|") if o] or [""]:  # every option the line offers
            text = plain + opt.replace("RxC", "4x4").replace("=N", "=64").replace("DTYPE", "bf16")
            assert ModelSpec.parse(text).kind == kind, text
    assert ModelSpec.parse("reference:kv=bf16") == ModelSpec("reference", None, kv="bf16")  # the path is optional


OUTPUTS = {"out", "plot", "html", "json_path", "work", "workdir", "to"}


def test_no_default_output_path_writes_into_the_repository():
    # the checkout's folders (packages, docs, infra); out/ and runs/ are scratch the .gitignore keeps out
    repo = {p.name for p in ROOT.iterdir() if p.is_dir() and not p.name.startswith(".")} - {"out", "runs"}
    inside = [(" ".join(path), p.name, p.default) for path, cmd in commands() for p in cmd.params
              if p.name in OUTPUTS and p.default is not None and Path(str(p.default)).parts[0] in repo]
    assert inside == []
    r = CliRunner().invoke(app, ["train-heads"])
    assert r.exit_code == 2 and "Missing option '--out'" in r.output


def test_no_default_input_path_reads_from_the_checkout():
    # an installed wheel has no checkout around it (issue #33): a default such as reference/weights/vq.safetensors
    # worked only from the repository's root; bundled files are found from the package instead
    repo = {p.name for p in ROOT.iterdir() if p.is_dir() and not p.name.startswith(".")} - {"out", "runs"}
    inside = [(" ".join(path), p.name, p.default) for path, cmd in commands() for p in cmd.params
              if p.name not in OUTPUTS and isinstance(p.default, (str, Path))
              and any("/" in part and Path(part.strip()).parts[0] in repo  # a path, not a name like `reference`
                      for part in str(p.default).split(","))]
    assert inside == []


def test_generate_and_serve_take_every_run_setting_from_the_settings_class():
    """The options are made from RunSettings' fields (ssdgen/cli/run_options.py): every field is an option of both
    commands, with the field's description as its help, and nothing else is a setting there."""
    from ssdgen.flows.settings import RunSettings
    root = typer.main.get_command(app)
    own = {"generate": {"overwrite", "progress", "dry_run"}, "serve": {"cron", "name"}}
    for cmd, extra in own.items():
        opts = {p.name: p for p in root.commands[cmd].params}
        assert set(opts) == set(RunSettings.model_fields) | extra, cmd
        for name, info in RunSettings.model_fields.items():
            assert opts[name].help == info.description, (cmd, name)
    assert root.commands["serve"].params[[p.name for p in root.commands["serve"].params].index("out")].required


def test_a_setting_pydantic_refuses_is_one_line_naming_its_option():
    from ssdgen.cli.run_options import build_settings
    with pytest.raises(ValueError, match=r"^--shard-size: Input should be a valid integer"):
        build_settings({"prompts": ["x.parquet"], "decoder": "ar", "shard_size": "many"})
