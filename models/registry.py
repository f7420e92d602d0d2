"""Model specs -> loaded models. `reference` (the bundled default), `reference:/bundle`, or a Hugging Face
architecture from a local checkpoint (`janus:/ckpt`, `emu3:/ckpt`, `chameleon:/ckpt`).

Lives in `workers/` because the Ray actors load models here; the CLI uses the same function.
"""

from __future__ import annotations

HF_KINDS = ("janus", "emu3", "chameleon")


def load_model(spec: str | None, device: str = "cpu"):
    from models.reference import ReferenceModel
    if spec in (None, "", "reference"):
        return ReferenceModel(device=device)
    if spec.startswith("reference:"):
        return ReferenceModel(spec.split(":", 1)[1], device=device)
    if spec.split(":", 1)[0] in HF_KINDS:
        from models.hf import load_model as load_hf
        return load_hf(spec)
    raise ValueError(f"unknown model {spec!r}; use reference[:/path], janus:/path, emu3:/path or chameleon:/path")


def check_model_spec(spec: str | None) -> None:
    """Reject a malformed spec before any actor starts (the path itself is checked where it loads)."""
    if spec in (None, "", "reference") or spec.startswith("reference:") or spec.split(":", 1)[0] in HF_KINDS:
        return
    raise ValueError(f"unknown model {spec!r}; use reference[:/path], janus:/path, emu3:/path or chameleon:/path")
