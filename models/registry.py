"""Model specs -> loaded models. `reference` (the bundled default), `reference:/bundle`, or a Hugging Face
architecture from a local checkpoint (`janus:/ckpt`, `emu3:/ckpt`, `chameleon:/ckpt`), on a device and in a
precision (`--device`, `--dtype`).

Precision. `dtype` is fp32, bf16, fp16 or auto. auto is fp32 on the CPU; on a GPU, bf16 for the Hugging Face
checkpoints (the precision they are published in) and fp32 for the reference model (small: its forward is
not what bf16 would speed up, and its quality figures are fp32's). fp16 on the CPU is refused: half-precision
matmuls there are missing or far slower than fp32. Whatever the model's precision, the decoders compute the
processed distribution and verification in fp32 (decoders/sampling.py), and SSD heads stay fp32.

The Ray actors load models here (workers/decode_worker.py); the CLI uses the same function.
"""

from __future__ import annotations

HF_KINDS = ("janus", "emu3", "chameleon")
DTYPES = ("auto", "fp32", "bf16", "fp16")


def check_dtype(name: str, on_gpu: bool) -> None:
    """The checks of `resolve_dtype` without torch, for the flow's settings (the driver never loads torch)."""
    if name not in DTYPES:
        raise ValueError(f"--dtype must be one of {', '.join(DTYPES)}, got {name!r}")
    if name == "fp16" and not on_gpu:
        raise ValueError("--dtype fp16 is not supported on the CPU (half-precision matmuls there are missing or "
                         "slow); use fp32 or bf16 on the CPU, or fp16 with --gpus-per-actor")


def resolve_dtype(name: str, device: str, hf: bool = False):
    """'auto' | 'fp32' | 'bf16' | 'fp16' on `device` -> a torch dtype; a ValueError with one clear line for an
    unknown name or fp16 on the CPU. hf: the model is a Hugging Face checkpoint (auto picks bf16 on a GPU)."""
    import torch
    if name not in DTYPES:
        raise ValueError(f"--dtype must be one of {', '.join(DTYPES)}, got {name!r}")
    on_cpu = torch.device(device).type == "cpu"
    if name == "auto":
        return torch.float32 if on_cpu or not hf else torch.bfloat16
    if name == "fp16" and on_cpu:
        raise ValueError("--dtype fp16 is not supported on the CPU (half-precision matmuls there are missing or "
                         "slow); use fp32 or bf16 on the CPU, or fp16 with --device cuda")
    return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[name]


def load_model(spec: str | None, device: str = "cpu", dtype: str = "auto"):
    """The model a spec names, its weights on `device` in `dtype` (see the module doc)."""
    from models.reference import ReferenceModel
    hf = spec not in (None, "") and spec.split(":", 1)[0] in HF_KINDS
    torch_dtype = resolve_dtype(dtype, device, hf)
    if spec in (None, "", "reference"):
        return ReferenceModel(device=device, dtype=torch_dtype)
    if spec.startswith("reference:"):
        return ReferenceModel(spec.split(":", 1)[1], device=device, dtype=torch_dtype)
    if hf:
        from models.hf import load_model as load_hf
        return load_hf(spec, device=device, dtype=torch_dtype)
    raise ValueError(f"unknown model {spec!r}; use reference[:/path], janus:/path, emu3:/path or chameleon:/path")


def check_model_spec(spec: str | None) -> None:
    """Reject a malformed spec before any actor starts (the path itself is checked where it loads)."""
    if spec in (None, "", "reference") or spec.startswith("reference:") or spec.split(":", 1)[0] in HF_KINDS:
        return
    raise ValueError(f"unknown model {spec!r}; use reference[:/path], janus:/path, emu3:/path or chameleon:/path")
