"""The style guide's size limits, checked on the source, the lab's included (tests excepted): a file at most 500
lines, a function 60 (it fits a screen), a class 200. The linter (ruff, `make lint`) checks the rest before the
tests run."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("decoders", "reference", "models", "workers", "storage", "inputs", "formats", "output", "flows", "bench",
           "ssdgen", "lab")
LIMITS = {"file": 500, "function": 60, "class": 200}


def oversized(path: Path, root: Path = ROOT) -> list[str]:
    """What in `path` is over its limit, named by its place under `root`."""
    text = path.read_text()
    where = path.relative_to(root)
    out = [f"{where}: {n} lines" for n in [len(text.splitlines())] if n > LIMITS["file"]]
    for node in ast.walk(ast.parse(text)):
        kind = ("function" if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                else "class" if isinstance(node, ast.ClassDef) else None)
        if kind and (n := node.end_lineno - node.lineno + 1) > LIMITS[kind]:
            out.append(f"{where}:{node.lineno} {kind} {node.name}: {n} lines (limit {LIMITS[kind]})")
    return out


@pytest.mark.parametrize("folder", FOLDERS)
def test_files_functions_and_classes_keep_to_their_sizes(folder):
    bad = [m for p in sorted((ROOT / folder).rglob("*.py")) for m in oversized(p)]
    assert not bad, bad


def test_the_size_check_sees_a_long_function(tmp_path):
    p = tmp_path / "flows" / "_style_probe.py"
    p.parent.mkdir()
    p.write_text("def f():\n" + "    x = 1\n" * 61)
    assert oversized(p, root=tmp_path) == ["flows/_style_probe.py:1 function f: 62 lines (limit 60)"]
