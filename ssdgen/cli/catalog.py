"""What a command line can name: `ssdgen decoders` (the decoder families, their parameters and defaults, read
from the recipe table of decoders/recipes.py) and `ssdgen models` (the model kinds and their spec syntax, from
models/registry.py). Both print from those tables, so the listing cannot drift from what the parsers accept.
"""

from __future__ import annotations

import textwrap
from dataclasses import fields

import typer

app = typer.Typer()



def _fill(text: str, indent: str = "") -> str:
    return textwrap.fill(text, width=100, initial_indent=indent, subsequent_indent=indent or "    ",
                         break_on_hyphens=False)


def _text(v) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


def family_params(name: str, block: bool = False) -> list[tuple[str, str]]:
    """(parameter, default) of a family (with `block`: of its commit=block recipe), its recipe's defaults
    applied as `decoder_config` applies them; a str field with fixed choices shows them."""
    from ssdgen.decoders.recipes import CHOICES
    from ssdgen.decoders.recipes import decoder_config, recipe
    given = {"commit": "block"} if block else {}
    cfg, r = decoder_config(name, given), recipe(name, given)
    if cfg is None:
        return []
    values = {f.name: getattr(cfg, f.name) for f in fields(cfg) if f.name != "relax"}
    values |= {f.name: getattr(cfg.relax, f.name) for f in fields(cfg.relax)}
    params = r.params | (values.keys() & {f.name for f in fields(cfg.relax)} if r.relaxed else set())
    return [(p, _text(values[p]) + (f" ({'|'.join(CHOICES[p])})" if p in CHOICES else "")) for p in sorted(params)]


@app.command("decoders")
def decoders_cmd():
    """The decoder families of a decode spec (--decoder family[:key=value]...), their parameters and defaults."""
    from ssdgen.decoders.recipes import SamplingConfig
    from ssdgen.decoders.recipes import BLOCK_RECIPES, RECIPES
    from ssdgen.decoders.spec import SAMPLING_KEYS
    for name, fam in RECIPES.items():
        typer.echo(_fill(f"{name}: {fam.describe()}"))
        params = "  ".join(f"{p}={v}" for p, v in family_params(name)) or "no parameters of its own"
        typer.echo(_fill(params, "    "))
        if name in BLOCK_RECIPES:
            typer.echo(_fill("with commit=block: " + "  ".join(f"{p}={v}" for p, v in family_params(name, True)
                                                                if p != "commit"), "    "))
    sc = SamplingConfig()
    sampling = "  ".join(f"{k}={_text(getattr(sc, f))}" for k, f in SAMPLING_KEYS.items())
    typer.echo(_fill(f"every family also takes the sampling settings {sampling}; ssd and ssd+csd take "
                     "heads=PATH (default: the model's own heads)"))
    typer.echo("e.g. --decoder ssd+csd:rows=2:cfg=3 or --decoder csd:lam=1 (docs/decoders.md)")


@app.command("models")
def models_cmd():
    """The model kinds --model names, their spec syntax and options, and the precisions --dtype takes."""
    from ssdgen.models.registry import DTYPES, KINDS
    for kind in KINDS.values():
        typer.echo(kind.syntax)
        typer.echo(_fill(kind.about, "    "))
    typer.echo(_fill(f"--dtype {'|'.join(DTYPES)} (auto: fp32 on the CPU; on a GPU bf16 for Hugging Face "
                     "checkpoints, fp32 for the reference model); --device cpu|cuda[:N]"))
