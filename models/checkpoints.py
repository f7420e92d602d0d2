"""Up-front checks of the paths a run loads from: `--model`'s checkpoint and the SSD heads (`heads=PATH` in the
decode spec, else the model's own). A missing or wrong path fails here in one line naming the path and the
spec, before Prefect or Ray start, instead of in every actor after the cluster is up.

Fast and torch-free (the driver never loads torch, and this runs on every `generate`): only `stat`s and a
directory listing, nothing is opened or loaded. What is checked is what the loaders open:
- `reference[:/bundle]` (reference/weights.py `load_bundle`): a folder with checksums.json, config.json,
  vq.safetensors and gpt.safetensors (checksums are verified where it loads);
- `janus:`, `emu3:`, `chameleon:` (models/hf.py): a folder with config.json and .safetensors weights (pickled
  weights alone are refused, as `check_safetensors` does where it loads);
- SSD heads (decoders/drafters.py `SpatialHeads.load`): PATH.json and PATH.safetensors.
The loaders open local paths only (`Path(path)`), so a URL is refused with the fix, and models/ reads no storage
(tests/test_layering.py).
"""

from __future__ import annotations

import importlib.util
import os
import posixpath
from pathlib import Path

# reference/weights.py FILES plus its checksums.json (not imported: it imports torch); tests/test_spec_paths.py
# keeps the two in step
BUNDLE_FILES = ("checksums.json", "config.json", "vq.safetensors", "gpt.safetensors")
PICKLED = (".bin", ".pt", ".pth", ".ckpt", ".pkl")  # models/hf.py PICKLED


def default_bundle() -> Path | None:
    """The bundled reference model's folder (reference/weights/), found without importing the package (None
    where the package is not installed: its loader then says so)."""
    spec = importlib.util.find_spec("ssdgen.reference")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]) / "weights"


def one_folder(path: str) -> str:
    """A checkpoint folder's path as one text however it was written, for a resume to compare models, not
    spellings (`reference:/m/` and `reference:/m` are one model): absolute, without `.`, doubled or trailing
    slashes, and `..` taken as the operating system takes it, the parent of the real folder reached so far (not the
    one the text names when a part before it is a symbolic link). Other links are kept as the user named them. The
    rule of inputs/paths.py, which the layering keeps apart from models/. A URL is kept as written (refused below)."""
    if "://" in path:
        return path
    out = "/"
    for part in (path if path.startswith("/") else posixpath.join(os.getcwd(), path)).split("/"):
        if part == "..":
            out = posixpath.dirname(os.path.realpath(out))
        elif part not in ("", "."):
            out = posixpath.join(out, part)
    return out


def _local(path: str, what: str, spec: str) -> Path:
    if "://" in path:
        raise ValueError(f"{what} {spec!r}: {path} is a URL, but checkpoints load from a local folder; copy it "
                         "to the same local path on every node and give that path")
    return Path(path)


def _names(folder: Path, what: str, spec: str, kind: str) -> list[str]:
    """The folder's entry names; one line for a missing folder, a file, or one that cannot be listed."""
    if not folder.exists():
        if kind == "reference":
            raise FileNotFoundError(f"{what} {spec!r}: {folder}: no such folder, so not a model bundle; train one "
                                    "with `python -m lab train-reference` in a checkout")
        raise FileNotFoundError(f"{what} {spec!r}: {folder}: no such checkpoint folder")
    if not folder.is_dir():
        raise ValueError(f"{what} {spec!r}: {folder} is a file; give the checkpoint's folder")
    try:
        return sorted(p.name for p in folder.iterdir())
    except OSError as e:
        raise ValueError(f"{what} {spec!r}: cannot list {folder} ({e.strerror or type(e).__name__})") from None


def check_checkpoint(kind: str, path: str | None, spec: str) -> None:
    """The checkpoint folder of a parsed model spec looks like what its loader opens (module doc)."""
    what = "model"
    folder = default_bundle() if path is None else _local(path, what, spec)
    if folder is None:
        return
    names = _names(folder, what, spec, kind)
    if kind == "reference":
        missing = [f for f in BUNDLE_FILES if f not in names]
        if missing:
            raise FileNotFoundError(f"{what} {spec!r}: {folder} is not a model bundle (no {', '.join(missing)}); "
                                    "train one with `python -m lab train-reference` in a checkout")
        return
    if "config.json" not in names:
        raise FileNotFoundError(f"{what} {spec!r}: {folder} has no config.json; give a Hugging Face checkpoint "
                                "folder (as save_pretrained writes it)")
    if not any(n.endswith(".safetensors") for n in names):
        pickled = [n for n in names if n.endswith(PICKLED)]
        if pickled:
            raise ValueError(f"{what} {spec!r}: {folder} holds only pickled weights ({', '.join(pickled[:3])}); "
                             "ssdgen loads safetensors only; convert the checkpoint to .safetensors first")
        raise FileNotFoundError(f"{what} {spec!r}: {folder} has no .safetensors weights")


def check_heads_path(heads: str | None, kind: str, path: str | None, model: str, decoder: str) -> None:
    """The SSD heads a decoder will load exist: `heads` (PATH.json + PATH.safetensors), else the reference
    bundle's own heads/ (a Hugging Face model has none: heads=PATH is required)."""
    what = "decoder spec"
    if heads is None:
        if kind != "reference":
            raise ValueError(f"{what} {decoder!r}: model {model!r} has no default SSD heads; train them with "
                             f"`ssdgen train-heads --model {model} --out PATH` and pass heads=PATH")
        bundle = default_bundle() if path is None else Path(path)
        if bundle is None:
            return
        base = bundle / "heads"
    else:
        base = _local(heads, what, decoder)
    need = [base.with_suffix(".json"), base.with_suffix(".safetensors")]
    if not all(p.is_file() for p in need):
        raise FileNotFoundError(f"{what} {decoder!r}: no SSD heads at {base} (they need {need[0].name} and "
                                f"{need[1].name}; train them with `ssdgen train-heads`)")
