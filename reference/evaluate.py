"""`ssdgen eval`: decode the fixed eval prompts, then score scene accuracy and FD.

"Real" images for FD are renders of the same eval captions, with jitter and textures drawn from each
prompt's seed; a second set of renders with other seeds gives the FD that real images themselves reach
(the noise floor), reported beside the model's. The held-out renders passed through the model's own VQ-VAE
give the FD that any transformer on these tokens can reach at best (the tokenizer's floor).
"""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np
import torch
from tqdm import tqdm

from ssdgen.decoders import build
from ssdgen.decoders.decoder import Decoder
from ssdgen.decoders.spec import DecodeSpec

from . import captions as cap
from .fd import frechet_distance
from .prompts import eval_prompts, eval_seed
from .scenes import JITTER, Scene, render
from .scorer import load_scorer, predict, score


def real_scene(prompt: str, seed: int) -> Scene:
    """A ground-truth scene for a caption: its spec plus jitter and texture drawn from the seed."""
    spec = cap.parse(prompt)
    rng = np.random.default_rng([seed, 17])
    objs = tuple(replace(o, dx=float(rng.uniform(-JITTER, JITTER)), dy=float(rng.uniform(-JITTER, JITTER)))
                 for o in spec.objects)
    return replace(spec, objects=objs, texture_seed=int(rng.integers(2**31)))


def real_images(prompts: list[str], seeds: list[int], size: int = 64) -> np.ndarray:
    return np.stack([render(real_scene(p, s), size=size) for p, s in zip(prompts, seeds)])


def generate(model, prompts: list[str], seeds: list[int], dec: Decoder, batch_size: int, desc: str = "decode"):
    """Decode prompts in batches with a decoder built once (`decoders.build`) -> (uint8 images [N, px, px, 3],
    per-sample stats, seconds)."""
    images, stats = [], []
    t0 = time.perf_counter()
    with tqdm(total=len(prompts), desc=desc, unit="img") as bar:
        for i in range(0, len(prompts), batch_size):
            res = dec.decode(prompts[i:i + batch_size], seeds[i:i + batch_size])
            images.append(model.decode_images(res.tokens).numpy())
            stats.extend(res.stats)
            bar.update(len(res.stats))
    return np.concatenate(images), stats, time.perf_counter() - t0


def evaluate(model, spec: DecodeSpec = DecodeSpec(), n: int = 1024, batch_size: int = 64, seed: int = 0) -> dict:
    rows = eval_prompts(n)
    prompts = [r["prompt"] for r in rows]
    seeds = [eval_seed(seed, r["seed"]) for r in rows]
    dec = build(spec, model).resolve(prompts, seeds, batch_size)  # a calibrated spec: as a run resolves it
    images, stats, seconds = generate(model, prompts, seeds, dec, batch_size)
    net = load_scorer()
    report = score(net, images, prompts)
    size = images.shape[1]  # real renders at the model's own resolution; the scorer sees all at 64 pixels
    real = real_images(prompts, [r["seed"] for r in rows], size)
    held_out = real_images(prompts, [r["seed"] + 500_000 for r in rows], size)
    f_real = predict(net, real)["features"]
    fd = frechet_distance(predict(net, images)["features"], f_real)
    fd_floor = frechet_distance(predict(net, held_out)["features"], f_real)
    recon = torch.cat([model.vq.decode(model.vq.encode(torch.from_numpy(held_out[i:i + batch_size]).to(model.device)))
                       for i in range(0, len(held_out), batch_size)]).cpu().numpy()
    fd_tokenizer = frechet_distance(predict(net, recon)["features"], f_real)
    return {
        "model": model.name, "decoder": spec.label, "spec": str(spec), "params": dict(spec.params), "n": len(prompts),
        "resolved": str(dec), "measurements": None if dec.plan is None else dec.plan.to_dict(),
        "batch_size": batch_size, "seed": seed, "sampling": spec.sampling.__dict__,
        "scene_accuracy": report["scene_accuracy"], "object_accuracy": report["object_accuracy"],
        "fd": fd, "fd_real_heldout": fd_floor, "fd_tokenizer_floor": fd_tokenizer,
        "forwards_per_image": float(np.mean([s.forwards for s in stats])),
        "seconds_per_image": seconds / len(prompts),
        "threads": torch.get_num_threads(),
        "scorer": report,
    }
