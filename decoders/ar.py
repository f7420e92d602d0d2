"""Plain autoregressive decoding: one forward per image token, batched; and the prefill every decoder starts
with (image token 0 is an AR sample in all of them). Image token i of a sample is drawn with number i of its
TOKEN stream (rng.py), whatever its batch."""

from __future__ import annotations

import time

import torch

from . import rng
from .protocol import ImageTokenModel, StepOutput, check_request
from .sampling import model_device, next_probs, sample_from
from .recipes import SamplingConfig
from .stats import DecodeResult, Tally
from .verify import entropy


def prefill(model: ImageTokenModel, prompts: list[str], sc: SamplingConfig, streams: rng.Streams,
            tally: Tally) -> tuple[StepOutput, torch.Tensor]:
    """Prefill the prompts (with the unconditional branch under CFG) and draw image token 0 with number 0 of
    each sample's TOKEN stream; its entropy goes to the tally. -> (the prefill's output, token 0 [B])."""
    out = model.start(prompts, sc.uses_cfg)
    q0 = next_probs(out, sc)  # [B, V]
    tally.ent_sum += entropy(q0)
    return out, sample_from(q0, streams.uniform(rng.Purpose.TOKEN, 0))


@torch.no_grad()
def decode_ar(model: ImageTokenModel, prompts: list[str], seeds: list[int], sc: SamplingConfig) -> DecodeResult:
    """Prompts and per-sample seeds -> tokens [B, H*W] (on the model's device) and per-sample statistics."""
    check_request(model, prompts, seeds)
    t0 = time.perf_counter()
    dev = model_device(model)
    streams = rng.Streams(seeds, dev)
    B, n = len(prompts), model.grid[0] * model.grid[1]
    u = streams.uniform(rng.Purpose.TOKEN, torch.arange(n, device=dev)[None])  # [B, H*W], all at once
    tokens = torch.zeros(B, n, dtype=torch.long, device=dev)  # [B, H*W]
    tally = Tally(B, n, dev, hist_bins=2, cfg=sc.uses_cfg)  # every forward commits one token
    out, tokens[:, 0] = prefill(model, prompts, sc, streams, tally)
    for i in range(1, n):
        out = model.step(tokens[:, i - 1:i], torch.full((B, 1), i - 1, dtype=torch.long, device=dev))
        probs = next_probs(out, sc)  # [B, V]
        tally.ent_sum += entropy(probs)
        tokens[:, i] = sample_from(probs, u[:, i])
    tally.ar_forwards(n - 1)
    return DecodeResult(tokens, tally.stats(model.grid, (time.perf_counter() - t0) / B, {}))
