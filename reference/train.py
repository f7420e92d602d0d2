"""`ssdgen train-reference`: train the VQ tokenizer and the AR model from scratch on this machine's CPU.

Stages, each deterministic from the seed: render a training set of scenes (eval captions held out), train
the VQ-VAE, tokenize the set, train the AR transformer with the caption dropped `cfg_dropout` of the time.
Weights are written as safetensors with a JSON config and a SHA-256 manifest that loading checks.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from multiprocessing import Pool
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from tqdm import tqdm

from . import captions as cap
from .gpt import GPT, GPTConfig
from .prompts import eval_captions
from .scenes import render, sample_scene
from .vqvae import VQVAE, VQConfig
from .weights import save_bundle


@dataclass(frozen=True)
class TrainConfig:
    seed: int = 0
    n_images: int = 60_000
    vq_steps: int = 1100
    vq_batch: int = 64
    vq_crop: int = 32  # train on random crops: convolutions don't care, and a step costs a quarter
    vq_fg_weight: float = 6.0  # extra loss weight on object pixels
    vq_lr: float = 2e-3
    gpt_steps: int = 1400
    gpt_batch: int = 24
    gpt_lr: float = 2e-3
    gpt_warmup: int = 100
    gpt: GPTConfig = GPTConfig(dim=192, n_layers=6, n_heads=6, mlp_hidden=512)
    vq: VQConfig = VQConfig()


def _render_chunk(args: tuple[int, int, int]) -> tuple[np.ndarray, np.ndarray, list[str]]:
    seed, start, count = args
    held_out = eval_captions()
    imgs, masks, caps = [], [], []
    rng = np.random.default_rng([seed, start])
    while len(caps) < count:
        scene = sample_scene(rng)
        if scene.caption in held_out:
            continue
        img, mask = render(scene, with_mask=True)
        imgs.append(img)
        masks.append(mask)
        caps.append(scene.caption)
    return np.stack(imgs), np.stack(masks), caps


def build_dataset(n: int, seed: int, workers: int = 2) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Render n training scenes -> (uint8 images [n, 64, 64, 3], object masks [n, 64, 64], captions).
    Chunks are seeded, so the result does not depend on the number of workers."""
    chunk = 2000
    jobs = [(seed, s, min(chunk, n - s)) for s in range(0, n, chunk)]
    with Pool(workers) as pool:
        parts = list(tqdm(pool.imap(_render_chunk, jobs), total=len(jobs), desc="render", unit="chunk"))
    return (np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]),
            [c for p in parts for c in p[2]])


def cosine_lr(step: int, total: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, total - warmup))))


def train_vq(images: np.ndarray, masks: np.ndarray, tc: TrainConfig) -> VQVAE:
    """Reconstruction loss is weighted up on objects (they are ~10% of pixels but all of the scene's
    meaning), and the codebook's EMA k-means is weighted alike, so object patches get their share of codes."""
    gen = torch.Generator().manual_seed(tc.seed)
    torch.manual_seed(tc.seed)
    vq = VQVAE(tc.vq)
    opt = torch.optim.Adam([p for p in vq.parameters() if p.requires_grad], lr=tc.vq_lr)
    data, fg = torch.from_numpy(images), torch.from_numpy(masks)
    bar = tqdm(range(tc.vq_steps), desc="vq-vae", unit="step")
    for step in bar:
        for g in opt.param_groups:
            g["lr"] = cosine_lr(step, tc.vq_steps, tc.vq_lr, 50)
        idx = torch.randint(0, len(data), (tc.vq_batch,), generator=gen)
        ox, oy = (torch.randint(0, (64 - tc.vq_crop) // 4 + 1, (2,), generator=gen) * 4).tolist()
        crop = (idx, slice(oy, oy + tc.vq_crop), slice(ox, ox + tc.vq_crop))
        x = VQVAE.to_input(data[crop])
        w = 1.0 + tc.vq_fg_weight * fg[crop].float().unsqueeze(1) / 255  # [B, 1, crop, crop]
        rec, commit, codes = vq(x, token_weight=F.avg_pool2d(w, 4).squeeze(1))
        err = rec - x
        loss = (w * (err ** 2 + 0.5 * err.abs())).mean() / w.mean() + tc.vq.commitment * commit
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % 25 == 0 and step < tc.vq_steps * 0.8:  # step 0 seeds the whole codebook from data
            with torch.no_grad():
                vq.restart_dead_codes(vq.encoder(x), gen, min_count=float("inf") if step == 0 else 0.5)
        if step % 10 == 0:
            psnr = 10 * math.log10(4.0 / F.mse_loss(rec, x).item())
            bar.set_postfix(psnr=f"{psnr:.1f}", used=int((vq.ema_count > 0.5).sum()))
    return vq.eval()


@torch.no_grad()
def tokenize(vq: VQVAE, images: np.ndarray, batch: int = 128) -> np.ndarray:
    out = [vq.encode(torch.from_numpy(images[i:i + batch])).to(torch.int16).numpy()
           for i in tqdm(range(0, len(images), batch), desc="tokenize", unit="batch")]
    return np.concatenate(out)  # [N, 16, 16]


def train_gpt(caption_ids: np.ndarray, codes: np.ndarray, tc: TrainConfig) -> GPT:
    gen = torch.Generator().manual_seed(tc.seed + 1)
    torch.manual_seed(tc.seed + 1)
    gpt = GPT(tc.gpt)
    decay = [p for n, p in gpt.named_parameters() if p.dim() >= 2 and "emb" not in n and "pos" not in n]
    other = [p for n, p in gpt.named_parameters() if not (p.dim() >= 2 and "emb" not in n and "pos" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.05}, {"params": other, "weight_decay": 0.0}],
                            lr=tc.gpt_lr, betas=(0.9, 0.95))
    caps_t = torch.from_numpy(caption_ids).long()
    codes_t = torch.from_numpy(codes.reshape(len(codes), -1)).long()
    null = torch.tensor(cap.null_caption())
    bar = tqdm(range(tc.gpt_steps), desc="ar-model", unit="step")
    ema = None
    for step in bar:
        for g in opt.param_groups:
            g["lr"] = cosine_lr(step, tc.gpt_steps, tc.gpt_lr, tc.gpt_warmup)
        idx = torch.randint(0, len(codes_t), (tc.gpt_batch,), generator=gen)
        c = caps_t[idx]
        drop = torch.rand(tc.gpt_batch, generator=gen) < tc.gpt.cfg_dropout
        c[drop] = null
        loss = gpt.training_loss(c, codes_t[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(gpt.parameters(), 1.0)
        opt.step()
        ema = loss.item() if ema is None else 0.98 * ema + 0.02 * loss.item()
        if step % 10 == 0:
            bar.set_postfix(loss=f"{ema:.3f}", lr=f"{opt.param_groups[0]['lr']:.1e}")
    return gpt.eval()


def train_reference(out_dir: Path, tc: TrainConfig = TrainConfig()) -> dict:
    """Run all stages and write the bundle to out_dir; returns the timing/summary record."""
    torch.manual_seed(tc.seed)
    t0 = time.time()
    times = {}
    images, masks, captions = build_dataset(tc.n_images, tc.seed)
    times["render_s"] = time.time() - t0
    t = time.time()
    vq = train_vq(images, masks, tc)
    del masks
    times["vq_s"] = time.time() - t
    out_dir.mkdir(parents=True, exist_ok=True)  # early copy, so the scorer can train while the AR model does
    save_file({k: v.contiguous() for k, v in vq.state_dict().items()}, out_dir / "vq.safetensors")
    t = time.time()
    codes = tokenize(vq, images)
    times["tokenize_s"] = time.time() - t
    caption_ids = np.array([cap.encode(c) for c in captions], dtype=np.int16)
    t = time.time()
    gpt = train_gpt(caption_ids, codes, tc)
    times["gpt_s"] = time.time() - t
    times["total_s"] = time.time() - t0
    summary = {"train_config": {k: v for k, v in tc.__dict__.items() if k not in ("gpt", "vq")},
               "timing": times, "torch_threads": torch.get_num_threads(),
               "gpt_params": sum(p.numel() for p in gpt.parameters()),
               "vq_params": sum(p.numel() for p in vq.parameters())}
    save_bundle(out_dir, vq, gpt, summary)
    return summary


if __name__ == "__main__":
    print(json.dumps(train_reference(Path("reference/weights")), indent=1))
