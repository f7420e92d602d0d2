"""What it takes to read the decoders (#47), checked on the source with `ast`:

- one forward of `ssd+csd` reads in at most 8 modules of decoders/: the import closure of the window loop
  (decoders/window.py) inside decoders/, module-level and function-level imports alike, with no exemption for
  helpers, the loop itself counted;
- what a decoder is has one home: outside the recipe table (decoders/recipes.py) and the spec parser
  (decoders/spec.py), no module compares a decoder's family or drafter by name (`spec.family == "ar"`,
  `recipe.drafter == "heads"`): it asks the recipe.

The checkers are tried on modules written under a temporary folder, never into the source tree."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DECODERS = ROOT / "decoders"
MOST = 8  # modules one forward of the default decoder may take to read (#47)
PRODUCT = ("decoders", "reference", "models", "workers", "storage", "inputs", "formats", "output", "flows", "bench",
           "ssdgen")
PACKAGE = "ssdgen.decoders"  # decoders/ as installed (pyproject's package-dir)


def local_imports(path: Path, package: str = PACKAGE) -> set[str]:
    """The modules of the file's own folder it imports, anywhere in it (a function's body too): `from .x import`,
    `from . import x`, `import ssdgen.decoders.x`, `from ssdgen.decoders import x` and `from ssdgen.decoders.x
    import`; names that are not modules of the folder (`from . import name` of a package attribute) are dropped."""
    here = {p.stem for p in path.parent.glob("*.py")} - {"__init__"}
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name[len(package) + 1:].split(".")[0] for a in node.names if a.name.startswith(package + ".")}
        elif isinstance(node, ast.ImportFrom):
            absolute = node.level == 0 and (node.module or "").startswith(package)
            if node.level == 1 or absolute:
                module = (node.module or "")[len(package) + 1:] if absolute else (node.module or "")
                if module:
                    out.add(module.split(".")[0])
                else:  # `from . import x`: x is a module of the folder, or a name its __init__ exports
                    out |= {a.name for a in node.names}
    return out & here


def closure(folder: Path, start: str) -> set[str]:
    """The modules of `folder` that reading `start` takes: start and everything it imports there, transitively."""
    seen, todo = set(), [start]
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo += sorted(local_imports(folder / f"{name}.py"))
    return seen


def test_one_forward_of_the_default_decoder_reads_in_at_most_eight_modules():
    read = closure(DECODERS, "window")
    lines = sum(len((DECODERS / f"{m}.py").read_text().splitlines()) for m in read)
    assert len(read) <= MOST, f"the window loop reads {len(read)} modules of decoders/ ({lines} lines): {sorted(read)}"
    # the loop's own parts are in it: a merge must not hide one behind the package's lazy names
    assert {"window", "recipes", "protocol", "sampling", "verify", "drafters"} <= read, sorted(read)


def test_the_closure_follows_every_kind_of_import_and_counts_no_package_name(tmp_path):
    pkg = tmp_path / "decoders"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("LAZY = 1\n")
    (pkg / "loop.py").write_text("from . import a, LAZY\nfrom .b import f\n\ndef g():\n    import ssdgen.decoders.c\n")
    (pkg / "a.py").write_text("from ssdgen.decoders import d\n")
    (pkg / "b.py").write_text("def f():\n    from ssdgen.decoders.e import x\n")
    for name in ("c", "d", "e", "unread"):
        (pkg / f"{name}.py").write_text("import torch\n")
    assert closure(pkg, "loop") == {"loop", "a", "b", "c", "d", "e"}


def name_comparisons(path: Path) -> list[str]:
    """Lines that compare a decoder's family or drafter: a comparison with `<anything>.family` or
    `<anything>.drafter` on either side."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(isinstance(s, ast.Attribute) and s.attr in ("family", "drafter") for s in sides):
                out.append(f"{path.relative_to(path.parents[1])}:{node.lineno}")
    return out


def test_only_the_recipe_table_and_the_spec_parser_compare_a_family_or_drafter_by_name():
    allowed = {DECODERS / "recipes.py", DECODERS / "spec.py"}
    bad = [hit for folder in PRODUCT for p in sorted((ROOT / folder).rglob("*.py")) if p not in allowed
           for hit in name_comparisons(p)]
    assert not bad, bad


def test_the_comparison_checker_sees_both_kinds(tmp_path):
    probe = tmp_path / "pkg" / "probe.py"
    probe.parent.mkdir()
    probe.write_text("def f(spec, r):\n    return spec.family == 'ar' or 'heads' != r.recipe.drafter or r.loop == 1\n")
    assert name_comparisons(probe) == ["pkg/probe.py:2", "pkg/probe.py:2"]


def test_the_recipe_answers_what_a_decoder_loads_tunes_and_plans_on():
    from ssdgen.decoders.recipes import (BLOCK_RECIPES, CALIBRATION_PROMPTS, RECIPES, SHORT_WINDOW_LAM, WINDOWS,
                                         BlockConfig, pilot_rows)
    from ssdgen.decoders.spec import DecodeSpec
    # the weights a drafter loads besides the model, and whether a recipe speculates at all
    assert {f: r.weights for f, r in RECIPES.items()} == {"ar": None, "sjd": None, "csd": None, "ssd": "heads",
                                                         "ssd+csd": "heads"}
    assert all(r.weights == "heads" for r in BLOCK_RECIPES.values())
    assert [f for f, r in RECIPES.items() if not r.speculative] == ["ar"]
    # what each tuned word means: its choices, their parameters and their tokens per forward (a grid 16 wide)
    ssd_csd = DecodeSpec.parse("ssd+csd")
    got = ssd_csd.recipe.choices(ssd_csd.config(), {}, 16)
    assert got == {**{f"w{L}": ({"window": L, "lam": SHORT_WINDOW_LAM}, L) for L in WINDOWS},
                   "r1": ({"rows": 1, "window": 0}, 17), "r2": ({"rows": 2, "window": 0}, 33)}
    mine = DecodeSpec.parse("ssd+csd:lam=0.5")  # the short-window lam is the recipe's only where the user set none
    assert mine.recipe.choices(mine.config(), dict(mine.params), 16)["w5"] == ({"window": 5}, 5)
    ssd = DecodeSpec.parse("ssd")  # exact: its short windows take nothing more
    assert ssd.recipe.choices(ssd.config(), {}, 16)["w5"] == ({"window": 5}, 5)
    block = DecodeSpec.parse("ssd+csd:commit=block:max_rows=3")
    assert block.recipe.choices(block.config(), dict(block.params), 16) == {
        "r1": ({"rows": 1, "max_rows": 1}, 16), "r2": ({"rows": 2, "max_rows": 2}, 32),
        "r3": ({"rows": 2, "max_rows": 3}, 48)}
    # tokens one forward feeds: a window's L, a window of rows up to 64, the block decoder's rows (its cap when
    # adaptive) after the token it re-feeds from
    assert [DecodeSpec.parse(t).tokens(48) for t in ("ar", "sjd", "csd", "ssd", "ssd+csd:window=5")] == [1, 16, 33,
                                                                                                         64, 5]
    assert BlockConfig(rows=2).tokens(48) == 97 and BlockConfig(rows=1, max_rows=3, adaptive=True).tokens(16) == 49
    # the pilot-prompt rule: a batch's worth of rows, at least CALIBRATION_PROMPTS
    assert [pilot_rows(b) for b in (None, 1, 16, [1, 64])] == [CALIBRATION_PROMPTS, CALIBRATION_PROMPTS, 16, 64]


def test_decoder_resolve_plans_on_the_first_calibration_prompts(monkeypatch):
    import ssdgen.decoders.decoder as decoder_mod
    from ssdgen.decoders.recipes import CALIBRATION_PROMPTS
    from ssdgen.decoders.spec import DecodeSpec
    seen = {}

    def fake_resolve(spec, model, prompts, seeds, batch, heads, objective, cached):
        seen.update(prompts=prompts, seeds=seeds)
        return spec, None
    monkeypatch.setattr(decoder_mod, "resolve", fake_resolve)
    dec = decoder_mod.Decoder(DecodeSpec.parse("ssd+csd:calibrated=false"), model=None)
    prompts = [f"prompt {i}" for i in range(64)]
    assert dec.resolve(prompts, list(range(64)), 64) is dec
    assert seen == {"prompts": prompts[:CALIBRATION_PROMPTS], "seeds": list(range(CALIBRATION_PROMPTS))}
