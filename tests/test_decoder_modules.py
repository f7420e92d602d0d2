"""What it takes to read the decoders (#47), checked on the source with `ast`: one forward of `ssd+csd` reads in
at most 8 modules of decoders/, the import closure of the window loop (decoders/window.py) inside decoders/,
module-level and function-level imports alike, with no exemption for helpers, the loop itself counted.

The checker is tried on modules written under a temporary folder, never into the source tree."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DECODERS = ROOT / "decoders"
MOST = 8  # modules one forward of the default decoder may take to read (#47)
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
