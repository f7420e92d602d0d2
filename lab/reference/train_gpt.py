"""The AR transformer's training loop: object-weighted loss, resumable checkpoints, a learning curve.

Resuming continues bit-identically to an uninterrupted run: every step draws its batch and its CFG
dropout from a generator seeded by (seed, step), so there is no data-order state to carry, and the
checkpoint holds the model, AdamW's moments and step counts exactly: two safetensors files (tensors plus a
JSON metadata string) in a folder per checkpoint, which a pointer file names once both are written, so a
run killed mid-write leaves the previous checkpoint intact.

A run may start warm from another bundle's transformer (v3 from v2): every tensor of the same shape is copied,
and the learned 2D image-position embedding is resized bilinearly to the new grid; the source's SHA-256 is part
of the settings, so a resume from another source is refused.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from tqdm import tqdm

from ssdgen.reference import captions as cap
from ssdgen.reference.gpt import GPT, GPTConfig

from .train_data import TokenizedSet

LATEST, MODEL_FILE, ADAM_FILE = "latest", "gpt.safetensors", "adamw.safetensors"


@dataclass(frozen=True)
class GPTTrainConfig:
    seed: int = 0
    steps: int = 4000
    batch: int = 32
    lr: float = 1.5e-3
    warmup: int = 200
    weight_decay: float = 0.05
    object_weight: float = 4.0  # token loss weight is 1 + object_weight * (object coverage of its 4x4 patch)
    checkpoint_minutes: float = 5.0
    eval_every: int = 500  # steps between learning-curve points (0 = none)
    # "bf16": matmuls and attention under CPU/GPU autocast, weights and AdamW in fp32 (2x the samples/s of fp32
    # on a CPU with AMX at a 32x32 grid, docs/reference-model.md); "fp32": no autocast (v1, v2)
    precision: str = "fp32"
    warm_from: str = ""  # SHA-256 of the gpt.safetensors the run starts from ("" = random initialisation)
    gpt: GPTConfig = GPTConfig(dim=256, n_layers=6, n_heads=8, mlp_hidden=688)

    def __post_init__(self):
        if self.precision not in ("fp32", "bf16"):
            raise ValueError(f"precision must be fp32 or bf16, got {self.precision!r}")

    def to_dict(self) -> dict:
        return asdict(self)


def cosine_lr(step: int, total: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, total - warmup))))


def make_optimizer(gpt: GPT, tc: GPTTrainConfig) -> torch.optim.AdamW:
    def decays(n: str, p: torch.nn.Parameter) -> bool:
        return p.dim() >= 2 and "emb" not in n and "pos" not in n
    decay = [p for n, p in gpt.named_parameters() if decays(n, p)]
    other = [p for n, p in gpt.named_parameters() if not decays(n, p)]
    return torch.optim.AdamW([{"params": decay, "weight_decay": tc.weight_decay},
                              {"params": other, "weight_decay": 0.0}], lr=tc.lr, betas=(0.9, 0.95))


def batch_for_step(data: TokenizedSet, tc: GPTTrainConfig, step: int, device: torch.device):
    """The step's batch, a function of (seed, step) only: captions [B, 36], codes [B, g*g], weights [B, g*g]."""
    gen = torch.Generator().manual_seed(tc.seed * 1_000_003 + step)
    idx = torch.randint(0, len(data.codes), (tc.batch,), generator=gen)
    c = data.captions[idx].long()
    c[torch.rand(tc.batch, generator=gen) < tc.gpt.cfg_dropout] = torch.tensor(cap.null_caption())
    w = 1.0 + tc.object_weight * data.coverage[idx].float() / 255
    return c.to(device), data.codes[idx].long().to(device), w.to(device)


def warm_state(gpt: GPT, source: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """gpt's state dict with source's tensors where they fit: same-shaped tensors copied, the image-position
    embedding [g*g, dim] resized bilinearly from the source's grid to gpt's. A tensor missing from source, or of
    another shape, is an error: a warm start that silently kept random weights would be a cold start."""
    out, g = gpt.state_dict(), gpt.cfg.grid
    for name, own in out.items():
        if name not in source:
            raise ValueError(f"warm start: the source has no {name}")
        src = source[name]
        if name == "img_pos" and src.shape != own.shape:
            side = int(round(src.shape[0] ** 0.5))
            grid = src.T.reshape(1, -1, side, side)  # [1, dim, side, side]
            src = F.interpolate(grid, size=(g, g), mode="bilinear", align_corners=False).reshape(-1, g * g).T
        if src.shape != own.shape:
            raise ValueError(f"warm start: {name} is {tuple(src.shape)} in the source, {tuple(own.shape)} here")
        out[name] = src.to(own.dtype).contiguous()
    return out


# --------------------------------------------------------------------------- checkpoints

def save_checkpoint(work: Path, gpt: GPT, opt: torch.optim.Optimizer, state: dict) -> None:
    """work/checkpoint-{step}/ holds the weights and AdamW's state as two safetensors files (each well under
    the size a repository takes comfortably); `work/latest` names the newest complete one, replaced only once
    both files are written, so a run killed mid-save resumes from the previous checkpoint."""
    folder = work / f"checkpoint-{state['step']:06d}"
    folder.mkdir(parents=True, exist_ok=True)
    meta = {"state": json.dumps(state)}
    save_file({k: v.detach().contiguous().cpu() for k, v in gpt.state_dict().items()}, folder / MODEL_FILE, meta)
    adam = {f"{i}.{k}": torch.as_tensor(v).detach().contiguous().cpu()
            for i, s in opt.state_dict()["state"].items() for k, v in s.items()}
    save_file(adam, folder / ADAM_FILE, meta)
    tmp = work / "latest.tmp"
    tmp.write_text(folder.name)
    os.replace(tmp, work / LATEST)
    for old in work.glob("checkpoint-*"):
        if old != folder:
            shutil.rmtree(old, ignore_errors=True)


def load_checkpoint(work: Path, gpt: GPT, opt: torch.optim.Optimizer, tc: GPTTrainConfig) -> dict:
    from safetensors import safe_open
    folder = work / (work / LATEST).read_text().strip()
    with safe_open(folder / MODEL_FILE, "pt") as f:
        state = json.loads(f.metadata()["state"])
    if state["config"] != json.loads(json.dumps(tc.to_dict())):
        raise ValueError(f"{folder}: checkpoint was written with other training settings; "
                         f"start afresh without --resume or use its settings")
    device = str(next(gpt.parameters()).device)
    gpt.load_state_dict(load_file(folder / MODEL_FILE, device=device), strict=True)
    adam = load_file(folder / ADAM_FILE, device=device)
    sd = opt.state_dict()
    for i in {int(k.split(".")[0]) for k in adam}:
        sd["state"][i] = {k.split(".", 1)[1]: v for k, v in adam.items() if k.split(".")[0] == str(i)}
    opt.load_state_dict(sd)
    return state


# --------------------------------------------------------------------------- the loop

def train_gpt(data: TokenizedSet, tc: GPTTrainConfig, work: Path, resume: bool = False,
              device: str | torch.device = "cpu", until_step: int | None = None,
              evaluate: Callable[[GPT], dict] | None = None,
              warm: dict[str, torch.Tensor] | None = None) -> tuple[GPT, dict]:
    """Train (or continue) the AR model; returns it and the run state (step, elapsed seconds, curve).

    until_step stops this sitting early (a later `resume` continues); evaluate(gpt) gives a curve point;
    warm: the source transformer's state dict when tc.warm_from names one (its SHA-256)."""
    device = torch.device(device)
    work.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(tc.seed + 1)
    gpt = GPT(tc.gpt)
    if tc.warm_from:
        if warm is None:
            raise ValueError("the settings name a warm-start source, but none was given")
        gpt.load_state_dict(warm_state(gpt, warm), strict=True)
    gpt = gpt.to(device)
    opt = make_optimizer(gpt, tc)
    # train_seconds is wall time; cpu_seconds the process's CPU time (all threads), which other work on the
    # machine does not inflate
    state = {"step": 0, "train_seconds": 0.0, "cpu_seconds": 0.0, "curve": [], "config": tc.to_dict()}
    if resume and (work / LATEST).exists():
        state = load_checkpoint(work, gpt, opt, tc)
        print(f"resumed from {work} at step {state['step']}", flush=True)
    stop = min(tc.steps, until_step if until_step is not None else tc.steps)
    last_save, t_start, seconds0 = time.time(), time.time(), state["train_seconds"]
    c_start, cpu0 = time.process_time(), state["cpu_seconds"]
    ema = state.get("loss_ema")
    bar = tqdm(range(state["step"], stop), initial=state["step"], total=tc.steps, desc="ar-model", unit="step")
    for step in bar:
        for g in opt.param_groups:
            g["lr"] = cosine_lr(step, tc.steps, tc.lr, tc.warmup)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=tc.precision == "bf16"):
            loss = gpt.training_loss(*batch_for_step(data, tc, step, device))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(gpt.parameters(), 1.0)
        opt.step()
        ema = loss.item() if ema is None else 0.98 * ema + 0.02 * loss.item()
        bar.set_postfix(loss=f"{ema:.3f}", lr=f"{opt.param_groups[0]['lr']:.1e}", refresh=False)
        state["step"], state["train_seconds"] = step + 1, seconds0 + time.time() - t_start
        state["loss_ema"], state["cpu_seconds"] = ema, cpu0 + time.process_time() - c_start
        at_eval = evaluate is not None and tc.eval_every and (step + 1) % tc.eval_every == 0
        if at_eval:
            point = {"step": step + 1, "samples_seen": (step + 1) * tc.batch, "loss_ema": ema,
                     "train_seconds": state["train_seconds"]} | evaluate(gpt)
            state["curve"].append(point)
            print(json.dumps(point), flush=True)
            # curve sampling is not training time
            t_start, seconds0 = time.time(), state["train_seconds"]
            c_start, cpu0 = time.process_time(), state["cpu_seconds"]
        if at_eval or time.time() - last_save > 60 * tc.checkpoint_minutes or step + 1 == stop:
            save_checkpoint(work, gpt, opt, state)
            last_save = time.time()
    return gpt.eval(), state
