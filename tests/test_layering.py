"""The dependency rules the README states, checked on the source. The layers are a graph, drawn in
docs/architecture.md: two towers, decoders <- reference <- models <- workers and storage <- inputs, formats, that
meet at output (workers encode images with formats/images.py), with flows and bench on output and the CLI on both;
the lab (lab/, never installed) sits on the CLI. `GRAPH` names each layer's direct lower layers; a module imports
only its own layer and the layers reachable from it in the graph, each a package of the `ssdgen` namespace (the
lab excepted). The graph has no cycle, every edge drawn is used and none is implied by the others, and the page
draws the same graph. The decoding algorithms are pure torch, only the CLI and the lab import Typer, nothing
imports a layer by a bare top-level name (`import flows`), no product module imports the lab, and no module
imports itself back through others. Imports inside functions count too. There is no exception list."""

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# layer -> the layers it sits on directly; it may import those and everything below them
GRAPH = {
    "decoders": set(),
    "reference": {"decoders"},
    "models": {"reference"},
    "storage": set(),
    "inputs": {"storage"},
    "formats": {"storage"},
    "workers": {"models", "formats"},
    "output": {"workers", "inputs"},
    "flows": {"output"},
    "bench": {"output"},
    "cli": {"bench", "flows"},
    "lab": {"cli"},
}
ORDER = tuple(GRAPH)  # every layer, each after the layers it sits on
PRODUCT = ORDER[:-1]  # the installed layers: all but the lab
FOLDERS = {layer: ROOT / layer for layer in ORDER if layer != "cli"} | {"cli": ROOT / "ssdgen" / "cli"}
STORAGE = {"fsspec", "s3fs", "pyarrow", "boto3"}
SERVICES = {"ray", "prefect", "prefect_ray"}
# layer -> third-party top-level modules it must never import
THIRD_PARTY = {
    "decoders": SERVICES | STORAGE | {"transformers", "typer", "PIL"},
    "reference": SERVICES | STORAGE | {"typer"},
    "models": SERVICES | STORAGE | {"typer"},
    "workers": {"prefect", "prefect_ray", "typer"} | STORAGE,  # no storage I/O: the flow owns the output
    "storage": SERVICES | {"torch", "typer"},
    "inputs": SERVICES | {"torch", "typer"},
    "formats": SERVICES | {"torch", "typer"},
    "output": SERVICES | {"typer"},
    "flows": {"typer"},
    "bench": {"typer"},
}


def below(layer: str) -> set[str]:
    """Every layer reachable from `layer` in the graph: what it may import besides itself."""
    out, todo = set(), list(GRAPH[layer])
    while todo:
        n = todo.pop()
        if n not in out:
            out.add(n)
            todo += GRAPH[n]
    return out


def module_name(path: Path) -> str:
    """ssdgen.<layer>.<module>: the name the package is installed under (pyproject's package-dir); lab.<module>
    for the lab, imported from the checkout."""
    for layer, folder in FOLDERS.items():
        if path.is_relative_to(folder):
            parts = path.relative_to(folder).with_suffix("").parts
            parts = parts[:-1] if parts[-1] == "__init__" else parts
            return ".".join((*(("lab",) if layer == "lab" else ("ssdgen", layer)), *parts))
    if path == ROOT / "ssdgen" / "__init__.py":
        return "ssdgen"
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)  # tests/: named by their folder


def imported_modules(path: Path, name: str | None = None) -> set[str]:
    """Fully qualified modules a file imports; `from pkg import name` counts as pkg.name when that is a module.
    `name`: the module's name, for a file outside the tree (a test's probe); by default its place in the tree."""
    tree = ast.parse(path.read_text())
    me = (name or module_name(path)).split(".")
    package = me if path.name == "__init__.py" else me[:-1]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[:len(package) - node.level + 1] + ([base] if base else []))
            out.add(base)
            out |= {f"{base}.{a.name}" for a in node.names}
    return out


def layer_of(module: str) -> str | None:
    """The layer a module belongs to: an ssdgen layer, "lab" for the lab, "root" for the namespace package itself
    and its Python API; None for any other module."""
    parts = module.split(".")
    if parts[0] == "lab":
        return "lab"
    if parts[0] != "ssdgen":
        return None
    return parts[1] if len(parts) > 1 and parts[1] in PRODUCT else "root"


def sources(layer: str) -> list[Path]:
    return sorted(FOLDERS[layer].rglob("*.py"))


def root_sources() -> list[Path]:
    """The namespace's root: ssdgen/__init__.py and the Python API (ssdgen/api.py), above every layer but the CLI."""
    return sorted((ROOT / "ssdgen").glob("*.py"))


def all_sources() -> list[Path]:
    return [p for layer in ORDER for p in sources(layer)] + root_sources()


@pytest.mark.parametrize("layer", ORDER)
def test_each_layer_imports_only_itself_and_the_layers_the_graph_puts_below_it(layer):
    allowed = below(layer) | {layer} | ({"root"} if layer == "lab" else set())
    bad = {f"{p.relative_to(ROOT)}: {m}" for p in sources(layer) for m in imported_modules(p)
           if layer_of(m) is not None and layer_of(m) not in allowed}
    assert not bad, sorted(bad)


def test_the_root_and_its_python_api_use_every_layer_but_the_cli_and_the_lab():
    bad = {f"{p.relative_to(ROOT)}: {m}" for p in root_sources() for m in imported_modules(p)
           if layer_of(m) in ("cli", "lab") or m.split(".")[0] == "typer"}
    assert not bad and ROOT / "ssdgen" / "api.py" in root_sources(), sorted(bad)


def test_the_graph_is_acyclic_and_minimal_and_every_edge_is_used():
    assert find_cycle(GRAPH) is None, find_cycle(GRAPH)
    assert all(FOLDERS[layer].is_dir() for layer in GRAPH) and all(GRAPH[n] <= set(GRAPH) for n in GRAPH)
    assert all(set(ORDER[:i]) >= GRAPH[n] for i, n in enumerate(ORDER))  # ORDER lists a layer after its lowers
    implied = {(n, m) for n in GRAPH for m in GRAPH[n] if any(m in below(o) for o in GRAPH[n] - {m})}
    assert not implied, f"edges the others imply already (drop them): {sorted(implied)}"
    used = {(layer, layer_of(m)) for layer in ORDER for p in sources(layer) for m in imported_modules(p)}
    unused = {(n, m) for n in GRAPH for m in GRAPH[n] if (n, m) not in used}
    assert not unused, f"edges no module uses (drop them, or draw what the code is): {sorted(unused)}"


def drawn_graph(page: Path) -> dict[str, set[str]]:
    """The edges a page draws in its graph block: lines `layer → lower, lower` (`→ nothing` for none)."""
    block = re.search(r"```\n(# layer → .*?)```", page.read_text(encoding="utf-8"), re.S)
    assert block, f"{page.relative_to(ROOT)}: no graph block (a fenced block starting `# layer → ...`)"
    out = {}
    for line in block.group(1).splitlines()[1:]:
        if "→" in line:
            layer, _, lowers = line.partition("→")
            out[layer.strip()] = {w.strip() for w in lowers.split(",") if w.strip() not in ("", "nothing")}
    return out


def test_the_architecture_page_draws_this_graph():
    assert drawn_graph(ROOT / "docs" / "architecture.md") == GRAPH


@pytest.mark.parametrize("layer", sorted(THIRD_PARTY))
def test_lower_layers_import_none_of_the_services(layer):
    bad = {f"{p.relative_to(ROOT)}: {m}" for p in sources(layer) for m in imported_modules(p)
           if m.split(".")[0] in THIRD_PARTY[layer]}
    assert not bad, sorted(bad)


def test_nothing_imports_a_layer_by_a_bare_top_level_name():
    bare = set(PRODUCT) - {"cli"} | {"api", "options", "commands"}
    bad = {f"{p.relative_to(ROOT)}: {m}" for p in all_sources() + sorted((ROOT / "tests").glob("*.py"))
           for m in imported_modules(p) if m.split(".")[0] in bare}
    assert not bad, sorted(bad)


def import_graph() -> dict[str, set[str]]:
    files = {module_name(p): p for p in all_sources()}
    return {m: {i for i in imported_modules(p) if i in files and i != m} for m, p in files.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state, stack = {}, []

    def visit(m):
        state[m] = "open"
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == "open":
                return stack[stack.index(n):] + [n]
            if n not in state and (c := visit(n)):
                return c
        state[m] = "done"
        stack.pop()
        return None

    for m in sorted(graph):
        if m not in state and (c := visit(m)):
            return c
    return None


def test_no_import_cycle():
    graph = import_graph()
    # a package's __init__ importing its own modules is how packages re-export; the cycle test skips the edges
    # from a module up to the package that contains it
    graph = {m: {n for n in deps if not m.startswith(n + ".")} for m, deps in graph.items()}
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))


def test_the_rule_checkers_see_violations(tmp_path):
    p = tmp_path / "_layering_probe.py"  # named as if it sat in decoders/, so that `from . import` resolves
    p.write_text("def f():\n    import prefect\n    from ssdgen.flows.pipeline import generate\n"
                 "    from . import verify\n    import models\n")
    got = imported_modules(p, "ssdgen.decoders._layering_probe")
    assert {"prefect", "ssdgen.flows.pipeline", "ssdgen.decoders.verify", "models"} <= got
    assert layer_of("ssdgen.flows.pipeline") == "flows" and layer_of("ssdgen") == "root"
    assert module_name(ROOT / "decoders" / "verify.py") == "ssdgen.decoders.verify"
    assert module_name(ROOT / "ssdgen" / "cli" / "app.py") == "ssdgen.cli.app"
    assert module_name(ROOT / "lab" / "bench" / "roofline.py") == "lab.bench.roofline"
    assert layer_of("lab.cli") == "lab" and "lab" not in set().union(*(below(n) for n in PRODUCT))
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


CONFIGS = {"WindowConfig", "BlockConfig"}  # decoders/recipes.py: one config per loop


def config_dispatch(path: Path) -> list[str]:
    """Lines of a module that branch on a loop's config class: isinstance(..., XConfig) or `is XConfig`."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance" and len(node.args) == 2:
            named = {n.id for n in ast.walk(node.args[1]) if isinstance(n, ast.Name)}
            if named & CONFIGS:
                out.append(f"{path.name}:{node.lineno}")
        elif isinstance(node, ast.Compare) and any(isinstance(o, (ast.Is, ast.IsNot)) for o in node.ops):
            if {n.id for c in node.comparators for n in ast.walk(c) if isinstance(n, ast.Name)} & CONFIGS:
                out.append(f"{path.name}:{node.lineno}")
    return out


def test_only_the_recipe_table_says_which_config_a_decoder_has(tmp_path):
    """What a decoder is has one home, decoders/recipes.py (#35): no other module of the decoders dispatches on
    a config class; they read the recipe (its loop, drafter, acceptance, tunes) or the config's own fields."""
    bad = [hit for p in sources("decoders") if p.name != "recipes.py" for hit in config_dispatch(p)]
    assert not bad, bad
    probe = tmp_path / "_dispatch_probe.py"
    probe.write_text("def f(cfg, WindowConfig, BlockConfig):\n    return isinstance(cfg, (WindowConfig, int))"
                     " or type(cfg) is BlockConfig\n")
    assert len(config_dispatch(probe)) == 2  # the checker sees both kinds
