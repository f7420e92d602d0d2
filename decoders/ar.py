"""Plain autoregressive decoding: one forward per image token, batched, a generator per sample."""

from __future__ import annotations

import time

import torch

from .protocol import ImageTokenModel, check_request
from .sampling import SamplingConfig, make_generators, model_device, processed_probs, sample
from .stats import COMMIT_AR, DecodeResult, SampleStats


@torch.no_grad()
def decode_ar(model: ImageTokenModel, prompts: list[str], seeds: list[int], sc: SamplingConfig) -> DecodeResult:
    """Prompts and per-sample seeds -> tokens [B, H*W] (on the model's device) and per-sample statistics."""
    check_request(model, prompts, seeds)
    t0 = time.perf_counter()
    dev = model_device(model)
    gens = make_generators(seeds, dev)
    B, n = len(prompts), model.grid[0] * model.grid[1]
    tokens = torch.zeros(B, n, dtype=torch.long, device=dev)
    entropy = torch.zeros(B, device=dev)
    out = model.start(prompts, sc.uses_cfg)
    for i in range(n):
        probs = processed_probs(out.cond[:, -1], None if out.uncond is None else out.uncond[:, -1], sc)  # [B, V]
        entropy += -(probs * probs.clamp_min(1e-12).log()).sum(-1)
        tokens[:, i] = sample(probs, gens)
        if i + 1 < n:
            out = model.step(tokens[:, i:i + 1], torch.full((B, 1), i, dtype=torch.long, device=dev))
    elapsed = time.perf_counter() - t0
    mean_entropy = (entropy / n).tolist()  # one transfer, not one per sample
    stats = [SampleStats.plain_ar(model.grid, forwards=n, mean_entropy=mean_entropy[b], seconds=elapsed / B)
             for b in range(B)]
    return DecodeResult(tokens, stats)
