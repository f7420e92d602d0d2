"""The docs state the code's facts: a default decoder or a parameter count a page names is the one the code has.

Fast and offline: the CLI's options are read from the Typer app (no command runs) and the reference model's size
from its safetensors header. A page that names a command's default `--decoder`, or the reference model's
parameters in millions, is checked line by line; a mismatch names the page, the line and the code's value.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# "| `ssdgen sample`, `eval` | `--decoder SPEC` (default `ar`) |": the commands named before the default
TABLE_DEFAULT = re.compile(r"^\|(?P<cmds>[^|]*)\|[^|]*`--decoder[^`]*`[^|]*\(default `(?P<spec>[^`]+)`\)")
# "`ssd+csd` (the default of `generate`, `serve` and `demo` ...": the spec, then the commands
PROSE_DEFAULT = re.compile(r"`(?P<spec>[^`]+)` \(the default of (?P<cmds>(?:`[\w-]+`(?:, | and )?)+)")
PARAMS = re.compile(r"(\d+(?:\.\d+)?) ?M parameters")


def _decoder_defaults() -> dict[str, str]:
    """{command: its --decoder default}, for every command that takes one."""
    import click
    import typer.main
    from ssdgen.cli.app import app
    out = {}

    def walk(group, prefix=""):
        for name, cmd in group.commands.items():
            if isinstance(cmd, click.Group):
                walk(cmd, f"{prefix}{name} ")
                continue
            for p in cmd.params:
                if p.name == "decoder":
                    out[prefix + name] = str(p.default)
    walk(typer.main.get_command(app))
    return out


def _lines():
    for page in PAGES:
        for i, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            yield f"{page.relative_to(ROOT)}:{i}", line


def _claims(line: str) -> list[tuple[str, str]]:
    """(command, default spec) pairs the line states."""
    out = []
    for rx in (TABLE_DEFAULT, PROSE_DEFAULT):
        for m in rx.finditer(line):
            for cmd in re.findall(r"`(?:ssdgen )?([\w-]+(?: [\w-]+)?)`", m.group("cmds")):
                out.append((cmd, m.group("spec")))
    return out


def test_the_docs_name_each_commands_default_decoder_as_the_cli_has_it():
    defaults = _decoder_defaults()
    assert defaults["generate"] == "ssd+csd" and defaults["sample"] == "ar"  # the reader works
    claims = [(where, cmd, spec) for where, line in _lines() for cmd, spec in _claims(line)]
    assert len(claims) >= 5, claims  # the decoders page's table and the README's sentence are read
    wrong = [f"{where}: `{cmd}` defaults to `{defaults[cmd]}`, the page says `{spec}`"
             for where, cmd, spec in claims if cmd in defaults and defaults[cmd] != spec]
    assert not wrong, "\n".join(wrong)


def test_a_wrong_default_on_a_page_is_caught():
    """The check itself: the line the issue found (docs/decoders.md said generate's default was ar)."""
    old = "| `ssdgen sample`, `generate`, `serve`, `demo`, `eval` | `--decoder SPEC` (default `ar`) |"
    assert ("generate", "ar") in _claims(old) and ("sample", "ar") in _claims(old)
    assert ("serve", "ssd+csd") in _claims("`ssd+csd` (the default of `generate`, `serve` and `demo`: within")


def _params(part: str = "gpt") -> int:
    """Parameters of a bundled weights file: gpt (the AR transformer) or vq (the image tokenizer)."""
    import math
    from safetensors import safe_open
    with safe_open(str(ROOT / "reference" / "weights" / f"{part}.safetensors"), "pt") as f:
        return sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())


def _part(line: str, at: int) -> str:
    """Which bundled model a count describes: the VQ-VAE where its clause names it, else the transformer."""
    clause = re.split(r"[.;:(]\s", line[:at])[-1]
    return "vq" if "VQ" in clause else "gpt"


def test_the_docs_state_the_reference_models_parameter_count():
    sizes = {part: _params(part) for part in ("gpt", "vq")}
    seen, wrong = 0, []
    for where, line in _lines():
        if "reference" not in line.lower() and "VQ" not in line:
            continue
        for m in PARAMS.finditer(line):
            seen += 1
            text, n = m.group(1), sizes[_part(line, m.start())]
            decimals = len(text.split(".")[1]) if "." in text else 0
            if float(text) != round(n / 1e6, decimals):
                wrong.append(f"{where}: says {text} M parameters; the code's model has {n / 1e6:.2f} M")
    assert seen >= 3
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("text, ok", [("the reference model (3 M parameters)", False),
                                      ("the reference model (5.35 M parameters)", True)])
def test_a_wrong_parameter_count_is_caught(text, ok):
    n = _params("gpt")
    m = PARAMS.search(text)
    assert (float(m.group(1)) == round(n / 1e6, 2 if "." in m.group(1) else 0)) == ok
