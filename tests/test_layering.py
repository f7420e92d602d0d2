"""The dependency rules the README states, checked on the source: decoding algorithms are pure torch (no Ray,
Prefect or storage, and nothing from the layers above); workers never import flows; nothing below the CLI
imports the CLI. Imports inside functions count too."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# package -> top-level modules it must never import (directly or inside a function)
FORBIDDEN = {
    "decoders": {"flows", "workers", "ray", "prefect", "prefect_ray", "fsspec", "s3fs", "pyarrow", "boto3"},
    "workers": {"flows", "prefect", "prefect_ray", "fsspec", "s3fs"},
}


def imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module.split(".")[0])
    return out


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_lower_layers_do_not_import_upper_ones(package):
    bad = {f"{p.relative_to(ROOT)}: {m}" for p in (ROOT / package).rglob("*.py")
           for m in imports(p) & FORBIDDEN[package]}
    assert not bad, sorted(bad)


def test_only_the_cli_imports_the_cli():
    users = {str(p.relative_to(ROOT)) for pkg in ("decoders", "workers", "reference", "flows")
             for p in (ROOT / pkg).rglob("*.py")
             if any(m in ("flows.cli", "flows.cli_reference") for m in _modules(p))}
    assert users <= {"flows/cli.py", "flows/cli_reference.py"}, users


def _modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module} | {
        a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}


def test_the_rule_checker_sees_a_violation(tmp_path):
    p = tmp_path / "x.py"
    p.write_text("def f():\n    import prefect\n    from flows.pipeline import generate\n")
    assert imports(p) == {"prefect", "flows"}
