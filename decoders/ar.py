"""Plain autoregressive decoding: one forward per image token, batched, a generator per sample; and the
prefill every decoder starts with (image token 0 is an AR sample in all of them)."""

from __future__ import annotations

import time

import torch

from .protocol import ImageTokenModel, StepOutput, check_request
from .sampling import SamplingConfig, make_generators, model_device, next_probs, sample
from .stats import DecodeResult, Tally
from .verify import entropy


def prefill(model: ImageTokenModel, prompts: list[str], sc: SamplingConfig, gens: list[torch.Generator],
            tally: Tally) -> tuple[StepOutput, torch.Tensor]:
    """Prefill the prompts (with the unconditional branch under CFG) and draw image token 0 from each sample's
    generator; its entropy goes to the tally. -> (the prefill's output, token 0 [B])."""
    out = model.start(prompts, sc.uses_cfg)
    q0 = next_probs(out, sc)  # [B, V]
    tally.ent_sum += entropy(q0, tally.entropy_floor)
    return out, sample(q0, gens)


@torch.no_grad()
def decode_ar(model: ImageTokenModel, prompts: list[str], seeds: list[int], sc: SamplingConfig) -> DecodeResult:
    """Prompts and per-sample seeds -> tokens [B, H*W] (on the model's device) and per-sample statistics."""
    check_request(model, prompts, seeds)
    t0 = time.perf_counter()
    dev = model_device(model)
    gens = make_generators(seeds, dev)
    B, n = len(prompts), model.grid[0] * model.grid[1]
    tokens = torch.zeros(B, n, dtype=torch.long, device=dev)  # [B, H*W]
    tally = Tally(B, n, dev, hist_bins=2, entropy_floor=1e-12)  # every forward commits one token
    out, tokens[:, 0] = prefill(model, prompts, sc, gens, tally)
    for i in range(1, n):
        out = model.step(tokens[:, i - 1:i], torch.full((B, 1), i - 1, dtype=torch.long, device=dev))
        probs = next_probs(out, sc)  # [B, V]
        tally.ent_sum += entropy(probs, tally.entropy_floor)
        tokens[:, i] = sample(probs, gens)
    tally.ar_forwards(n - 1)
    return DecodeResult(tokens, tally.stats(model.grid, (time.perf_counter() - t0) / B, {}))
