"""Saving and loading the reference model bundle: safetensors weights, a JSON config and SHA-256 checksums.

A bundle directory holds `vq.safetensors`, `gpt.safetensors`, `config.json` and `checksums.json`.
Loading verifies every checksum first and loads state dicts strictly, so a corrupted or mismatched
file is refused with an error that names it, never half-loaded.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from safetensors.torch import load_file, save_file

from . import captions as cap
from .gpt import GPT, GPTConfig
from .vqvae import VQVAE, VQConfig

DEFAULT_DIR = Path(__file__).parent / "weights"
FILES = ("vq.safetensors", "gpt.safetensors", "config.json")
BUNDLE_NAME = "scenes-reference-v2"  # v1 (scenes-reference) barely followed its prompts; its heads are refused


class BundleError(RuntimeError):
    """A model bundle that is missing, corrupt or does not match its config."""


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def save_bundle(out_dir: Path, vq: VQVAE, gpt: GPT, summary: dict, name: str = BUNDLE_NAME) -> None:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in vq.state_dict().items()}, out_dir / "vq.safetensors")
    save_file({k: v.contiguous() for k, v in gpt.state_dict().items()}, out_dir / "gpt.safetensors")
    config = {"name": name, "vq": vq.cfg.to_dict(), "gpt": gpt.cfg.to_dict(),
              "caption_vocab": cap.VOCAB, "summary": summary}
    (out_dir / "config.json").write_text(json.dumps(config, indent=1))
    sums = {f: sha256(out_dir / f) for f in FILES}
    (out_dir / "checksums.json").write_text(json.dumps(sums, indent=1))


@dataclass
class Bundle:
    vq: VQVAE
    gpt: GPT
    config: dict
    path: Path
    checksums: dict

    @property
    def name(self) -> str:
        return self.config.get("name", "scenes-reference")


def load_bundle(path: Path | str | None = None, verify: bool = True) -> Bundle:
    path = Path(path) if path else DEFAULT_DIR
    if not (path / "checksums.json").exists():
        raise BundleError(f"{path}: no checksums.json; not a model bundle (train one with "
                          "`python -m lab train-reference` in a checkout)")
    sums = json.loads((path / "checksums.json").read_text())
    for f in FILES:
        if not (path / f).exists():
            raise BundleError(f"{path / f}: missing")
        if verify and sha256(path / f) != sums.get(f):
            raise BundleError(f"{path / f}: SHA-256 does not match checksums.json (corrupt or replaced file)")
    config = json.loads((path / "config.json").read_text())
    if config["caption_vocab"] != cap.VOCAB:
        raise BundleError(f"{path / 'config.json'}: caption vocabulary differs from this code's grammar")
    vq = VQVAE(VQConfig.from_dict(config["vq"]))
    gpt = GPT(GPTConfig.from_dict(config["gpt"]))
    try:
        vq.load_state_dict(load_file(path / "vq.safetensors"), strict=True)
        gpt.load_state_dict(load_file(path / "gpt.safetensors"), strict=True)
    except RuntimeError as e:
        raise BundleError(f"{path}: weights do not match config.json: {e}") from None
    return Bundle(vq.eval(), gpt.eval(), config, path, sums)
