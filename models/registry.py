"""Model specs -> loaded models. `reference` (the bundled default), `reference:/bundle`, or a Hugging Face
architecture from a local checkpoint (`janus:/ckpt`, `emu3:/ckpt`, `chameleon:/ckpt`), on a device and in a
precision (`--device`, `--dtype`).

Spec options. A Hugging Face spec may end in `:key=value` options, parsed once into a `ModelSpec`:
`emu3:/ckpt:grid=32x32` (the token grid, rows x cols) or `emu3:/ckpt:image_area=262144` (a square image of that
many pixels, at the VQ's pixels per token: 512 x 512 -> 64 x 64 on Emu3-Gen); without either, Emu3 reads
`image_area` from the checkpoint's config.json (as the original Emu3 checkpoints state it), else decodes 90 x 90
tokens (Emu3-Gen's 720 x 720). `chameleon:` takes `grid=` (default 32 x 32); Janus's grid is fixed by its VQ.
`reference` takes `kv=fp32|bf16|fp16`: the precision its KV cache stores keys and values in (default: the
model's), `reference:kv=bf16` or `reference:/bundle:kv=bf16`. Half the cache's bytes; on this project's CPU (no
AMX) plain AR's step is 1.2-1.4x faster at batch 16-128, and it is not exact (its NLL gap to fp32 AR has a 95%
interval containing 0 at n = 256; docs/benchmarks.md, "The step at the roofline"). An option, not the default,
until a machine with AMX measures it too; fp16 is refused on the CPU as --dtype fp16 is.

Precision. `dtype` is fp32, bf16, fp16 or auto. auto is fp32 on the CPU; on a GPU, bf16 for the Hugging Face
checkpoints (the precision they are published in) and fp32 for the reference model (small: its forward is
not what bf16 would speed up, and its quality figures are fp32's). fp16 on the CPU is refused: half-precision
matmuls there are missing or far slower than fp32. Whatever the model's precision, the decoders compute the
processed distribution and verification in fp32 (decoders/sampling.py), and SSD heads stay fp32.

The Ray actors load models here (workers/decode_worker.py); the CLI uses the same function.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .checkpoints import check_checkpoint, check_heads_path

DTYPES = ("auto", "fp32", "bf16", "fp16")
OPTION_SYNTAX = {"grid": "grid=RxC", "image_area": "image_area=N", "kv": "kv=DTYPE"}  # as a spec writes it
KV_DTYPES = ("fp32", "bf16", "fp16")
_OPTION = re.compile(r"[a-z_]+=")


@dataclass(frozen=True)
class Kind:
    """One model kind --model names, declared once: the parser, the CLI's help and `ssdgen models` read it."""

    name: str
    hf: bool  # a Hugging Face checkpoint (models/hf.py ADAPTERS), else the reference model (a bundle folder)
    options: tuple[str, ...]  # OPTION_SYNTAX keys its spec may end in
    about: str  # one line for `ssdgen models`

    @property
    def syntax(self) -> str:
        """How a spec names it: `emu3:/path/to/checkpoint[:grid=RxC|:image_area=N]`."""
        path = ":/path/to/checkpoint" if self.hf else "[:/path/to/bundle]"
        opts = "[" + "|".join(f":{OPTION_SYNTAX[o]}" for o in self.options) + "]" if self.options else ""
        return self.name + path + opts


KINDS = {k.name: k for k in (
    Kind("reference", False, ("kv",), "the bundled reference model (the default), or a bundle from the lab's "
                                     "`python -m lab train-reference`; kv= fp32, bf16 or fp16 (the KV cache's "
                                     "precision; default the model's)"),
    Kind("janus", True, (), "a Janus checkpoint (local folder, safetensors)"),
    Kind("emu3", True, ("grid", "image_area"), "an Emu3 checkpoint; grid= (token rows x cols) or image_area= "
                                               "(pixels of a square image)"),
    Kind("chameleon", True, ("grid",), "a Chameleon checkpoint; grid= (token rows x cols, default 32x32)"),
)}
USAGE = "use " + ", ".join(k.syntax for k in KINDS.values())
MODEL_HELP = "model: " + ", ".join(k.syntax for k in KINDS.values()) + " (default: the bundled reference)"


@dataclass(frozen=True)
class ModelSpec:
    """A parsed --model: kind (reference or a Hugging Face kind), checkpoint path (None: the bundled reference)
    and the options (module doc). `options()` is what the adapter's from_pretrained takes as keywords."""
    kind: str = "reference"
    path: str | None = None
    grid: tuple[int, int] | None = None
    image_area: int | None = None
    kv: str | None = None  # the reference model's KV cache precision (KV_DTYPES); None: the model's own

    @classmethod
    def parse(cls, text: str | None) -> "ModelSpec":
        """`kind[:path][:key=value]...` -> ModelSpec; a ValueError of one line naming the bad field."""
        if text in (None, "", "reference"):
            return cls()
        kind, _, rest = text.strip().partition(":")
        if kind not in KINDS:
            raise ValueError(f"unknown model {text!r}; {USAGE}")
        takes = KINDS[kind].options
        pieces = rest.split(":")
        n = len(pieces)
        least = 0 if not KINDS[kind].hf else 1  # the reference's path is optional: `reference:kv=bf16`
        while n > least and _OPTION.match(pieces[n - 1]):  # trailing key=value pieces; the path may hold ':'
            n -= 1
        path, opts = ":".join(pieces[:n]), {}
        if _OPTION.match(path):
            raise ValueError(f"model spec {text!r} has no checkpoint path before its options; write "
                             f"{kind}:/path/to/checkpoint:key=value")
        for kv in pieces[n:]:
            k, v = kv.split("=", 1)
            if k not in takes:
                says = f"takes {', '.join(takes)}" if takes else "takes no options"
                raise ValueError(f"model spec {text!r}: unknown option {k!r}; {kind} {says}")
            if k in opts:
                raise ValueError(f"model spec {text!r}: {k!r} given twice")
            opts[k] = _grid(v, text) if k == "grid" else _kv(v, text) if k == "kv" else _positive(k, v, text)
        if "grid" in opts and "image_area" in opts:
            raise ValueError(f"model spec {text!r}: give grid or image_area, not both")
        if kind != "reference" and not path:
            raise ValueError(f"model spec {text!r} has no checkpoint path; write {kind}:/path/to/checkpoint")
        return cls(kind, path or None, **opts)

    def options(self) -> dict:
        return {k: v for k, v in (("grid", self.grid), ("image_area", self.image_area), ("kv", self.kv))
                if v is not None}

    def __str__(self) -> str:
        opts = "".join(f":{k}={'x'.join(map(str, v)) if k == 'grid' else v}" for k, v in self.options().items())
        return self.kind + (f":{self.path}" if self.path else "") + opts


def _positive(key: str, v: str, text: str) -> int:
    if not v.strip().isdecimal() or int(v) < 1:
        raise ValueError(f"model spec {text!r}: {key} must be a positive integer, got {v!r}")
    return int(v)


def _kv(v: str, text: str) -> str:
    if v not in KV_DTYPES:
        raise ValueError(f"model spec {text!r}: kv must be one of {', '.join(KV_DTYPES)}, got {v!r}")
    return v


def _grid(v: str, text: str) -> tuple[int, int]:
    m = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+)\s*", v)
    if not m or min(int(m[1]), int(m[2])) < 1:
        raise ValueError(f"model spec {text!r}: grid must be ROWSxCOLS in tokens, e.g. grid=32x32, got {v!r}")
    return int(m[1]), int(m[2])


def check_dtype(name: str, on_gpu: bool) -> None:
    """The checks of `resolve_dtype` without torch, for the flow's settings (the driver never loads torch)."""
    if name not in DTYPES:
        raise ValueError(f"--dtype must be one of {', '.join(DTYPES)}, got {name!r}")
    if name == "fp16" and not on_gpu:
        raise ValueError("--dtype fp16 is not supported on the CPU (half-precision matmuls there are missing or "
                         "slow); use fp32 or bf16 on the CPU, or fp16 with --gpus-per-actor")


def check_kv(spec: ModelSpec, on_gpu: bool) -> None:
    """`kv=fp16` on the CPU is refused as --dtype fp16 is; checked by the settings before anything loads."""
    if spec.kv == "fp16" and not on_gpu:
        raise ValueError(f"model spec {str(spec)!r}: kv=fp16 is not supported on the CPU (half-precision "
                         "attention there is slow); use kv=bf16 or kv=fp32, or kv=fp16 with --gpus-per-actor")


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


def load_model(spec: str | ModelSpec | None, device: str = "cpu", dtype: str = "auto"):
    """The model a spec names, its weights on `device` in `dtype` (see the module doc)."""
    import torch
    ms = spec if isinstance(spec, ModelSpec) else ModelSpec.parse(spec)
    hf = KINDS[ms.kind].hf
    check_device(device)
    torch_dtype = resolve_dtype(dtype, device, hf)
    if not hf:
        from ssdgen.reference.model import ReferenceModel
        check_kv(ms, torch.device(device).type != "cpu")
        kv = None if ms.kv is None else resolve_dtype(ms.kv, device)
        return ReferenceModel(ms.path, device=device, dtype=torch_dtype, kv_dtype=kv)
    from ssdgen.models.hf import ADAPTERS
    return ADAPTERS[ms.kind].from_pretrained(ms.path, device=device, dtype=torch_dtype, **ms.options())


def check_device(device: str) -> None:
    """A --device this machine has, in one line: torch itself says `AssertionError: Torch not compiled with CUDA
    enabled` (with a traceback) for a CUDA device on a CPU-only build, and names no device count."""
    import torch
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError) as e:
        raise ValueError(f"--device {device!r}: {e}") from None
    if dev.type != "cuda":
        return
    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if not have or (dev.index or 0) >= have:
        raise ValueError(f"--device {device}: this machine has {have or 'no'} CUDA device(s)"
                         + ("" if have else " (or this torch is built without CUDA)") + "; use --device cpu")


def check_model_spec(spec: str | None, decoder=None) -> None:
    """Before any actor starts, reject a malformed spec (naming the bad field) and a checkpoint path that is
    missing or not what its loader opens; with `decoder` (a DecodeSpec), also the SSD heads an ssd family will
    load. One line naming the path and the spec; nothing is loaded (models/checkpoints.py)."""
    ms = ModelSpec.parse(spec)
    text = spec or "reference"
    check_checkpoint(ms.kind, ms.path, text)
    if decoder is not None and decoder.recipe.weights == "heads":  # its drafter loads SSD heads
        check_heads_path(decoder.heads, ms.kind, ms.path, text, decoder.label)
