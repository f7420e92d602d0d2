"""Plain autoregressive decoding: one forward per image token, batched, a generator per sample."""

from __future__ import annotations

import time

import torch

from .protocol import ImageTokenModel, check_request
from .sampling import SamplingConfig, make_generators, processed_probs, sample
from .stats import COMMIT_AR, DecodeResult, SampleStats


@torch.no_grad()
def decode_ar(model: ImageTokenModel, prompts: list[str], seeds: list[int], sc: SamplingConfig) -> DecodeResult:
    """Prompts and per-sample seeds -> tokens [B, H*W] and per-sample statistics."""
    check_request(model, prompts, seeds)
    t0 = time.perf_counter()
    gens = make_generators(seeds)
    B, n = len(prompts), model.grid[0] * model.grid[1]
    tokens = torch.zeros(B, n, dtype=torch.long)
    entropy = torch.zeros(B)
    out = model.start(prompts, sc.uses_cfg)
    for i in range(n):
        probs = processed_probs(out.cond[:, -1], None if out.uncond is None else out.uncond[:, -1], sc)  # [B, V]
        entropy += -(probs * probs.clamp_min(1e-12).log()).sum(-1)
        tokens[:, i] = sample(probs, gens)
        if i + 1 < n:
            out = model.step(tokens[:, i:i + 1], torch.full((B, 1), i, dtype=torch.long))
    elapsed = time.perf_counter() - t0
    stats = [SampleStats.plain_ar(model.grid, forwards=n, mean_entropy=float(entropy[b] / n), seconds=elapsed / B)
             for b in range(B)]
    return DecodeResult(tokens, stats)
