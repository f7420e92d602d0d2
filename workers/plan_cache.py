"""The planner's measurements (its device profile and the pilot's acceptance), cached on this machine: measured
once per hardware, torch version, model weights, decode spec and batch, then read back in well under a second
(decoders/planner.py measures and decides; this module only stores). The cache is a folder of small JSON files,
`$SSDGEN_CACHE` or ~/.cache/ssdgen/profiles; a file that cannot be read or parsed is measured again and
overwritten, never trusted half-written (writes go through a temporary file and a rename).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
from pathlib import Path

VERSION = 1  # bump when the profile's shape or meaning changes


def cache_dir() -> Path:
    return Path(os.environ.get("SSDGEN_CACHE") or Path.home() / ".cache" / "ssdgen") / "profiles"


def hardware() -> str:
    """The CPU model and count, and the GPU's name where the model runs on one."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu} x{os.cpu_count()}"


def key(model, spec, batch: int | list[int], threads: int | None = None) -> str:
    """The cache key: hardware, torch version and threads (`threads`: the count the process runs when the
    machine is quiet, workers/cpus.py; default torch's now), device, model weights, KV cache precision and the
    attention kernel its steps run (the model's capabilities), spec text and batch (or the batch sizes a plan
    chooses among)."""
    import torch
    dev = str(getattr(model, "device", "cpu"))
    gpu = torch.cuda.get_device_name(torch.device(dev)) if dev.startswith("cuda") else ""
    parts = [VERSION, hardware(), gpu, torch.__version__, threads or torch.get_num_threads(), dev,
             str(getattr(model, "dtype", "")), model.name, model.capabilities.weights_digest, str(spec), batch]
    caps = model.capabilities
    if caps.kv_dtype is not None:  # a step's speed: plans measured with another cache differ
        parts.append(caps.kv_dtype)
    if caps.attention is not None:  # and a step with the decode-attention op from one with SDPA (#37: 1.38x)
        parts.append(f"attention={caps.attention}")
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:24]


def load(k: str) -> dict | None:
    """The cached {"profile", "acceptance"}, or None when there is none or it is unreadable."""
    from ssdgen.decoders.planner import Profile
    try:
        d = json.loads((cache_dir() / f"{k}.json").read_text())
        Profile.from_dict(d["profile"])  # its shape, checked
        if not isinstance(d["acceptance"], dict):
            return None
        return {"profile": d["profile"], "acceptance": d["acceptance"]}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def save(k: str, plan) -> None:
    """Store a plan's measurements (decoders.planner.Plan); a cache that cannot be written is skipped."""
    path = cache_dir() / f"{k}.json"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"profile": plan.profile, "acceptance": plan.acceptance}))
        os.replace(tmp, path)
    except OSError:
        pass
