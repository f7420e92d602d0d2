"""The dependency rules the README states, checked on the source: each layer imports only the layers below it
(decoders <- models <- workers <- flows <- bench <- ssdgen), the decoding algorithms are pure torch, only the
`commands.py` modules and ssdgen/ import the CLI's options, and no module imports itself back through others.
Imports inside functions count too."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("decoders", "models", "workers", "flows", "bench", "reference", "ssdgen")
STORAGE = {"fsspec", "s3fs", "pyarrow", "boto3"}
# package -> top-level modules it must never import (directly or inside a function)
FORBIDDEN = {
    "decoders": {"models", "workers", "flows", "bench", "reference", "ssdgen", "ray", "prefect",
                 "prefect_ray"} | STORAGE,
    "models": {"workers", "flows", "bench", "ssdgen", "ray", "prefect", "prefect_ray"} | STORAGE,
    "workers": {"flows", "bench", "reference", "ssdgen", "prefect", "prefect_ray", "fsspec", "s3fs"},
    "flows": {"bench", "reference", "ssdgen"},
    "bench": {"ssdgen"},
    "reference": {"workers", "flows", "bench", "ssdgen", "ray", "prefect", "prefect_ray"} | STORAGE,
}
CLI_EDGE = {"bench/commands.py", "reference/commands.py"}  # a package's commands use ssdgen/options.py


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path) -> set[str]:
    """Fully qualified modules a file imports; `from pkg import name` counts as pkg.name when that is a module."""
    tree = ast.parse(path.read_text())
    me = module_name(path).split(".")
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


def top_levels(path: Path) -> set[str]:
    return {m.split(".")[0] for m in imported_modules(path) if m}


def sources(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_lower_layers_do_not_import_upper_ones(package):
    bad = {f"{p.relative_to(ROOT)}: {m}" for p in sources(package)
           for m in top_levels(p) & FORBIDDEN[package] if str(p.relative_to(ROOT)) not in CLI_EDGE or m != "ssdgen"}
    assert not bad, sorted(bad)


def test_only_the_cli_edge_imports_the_cli():
    users = {str(p.relative_to(ROOT)) for pkg in PACKAGES for p in sources(pkg)
             if any(m.startswith("ssdgen.") for m in imported_modules(p))}
    assert users - CLI_EDGE <= {f"ssdgen/{p.name}" for p in sources("ssdgen")}, users
    assert not any("ssdgen.cli" in imported_modules(p) for pkg in PACKAGES for p in sources(pkg))


def import_graph() -> dict[str, set[str]]:
    files = {module_name(p): p for pkg in PACKAGES for p in sources(pkg)}
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
    # a package's __init__ importing its own modules is how packages re-export; the cycle test skips those edges
    graph = {m: {n for n in deps if not (n.startswith(m + ".") or m.startswith(n + ".") and n.count(".") == 0)}
             for m, deps in graph.items()}
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))


def test_the_rule_checkers_see_violations(tmp_path):
    p = ROOT / "decoders" / "_layering_probe.py"  # inside the tree so that module names resolve
    try:
        p.write_text("def f():\n    import prefect\n    from flows.pipeline import generate\n"
                     "    from . import verify\n")
        assert top_levels(p) == {"prefect", "flows", "decoders"}
        assert "decoders.verify" in imported_modules(p)
    finally:
        p.unlink()
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
