"""Plain autoregressive decoding: one forward per image token, batched. Image token i of a sample is drawn with
number i of its TOKEN stream (sampling.py), whatever its batch; token 0 is the prefill's, as in every decoder."""

from __future__ import annotations

import time

import torch

from .protocol import ImageTokenModel, check_request
from .recipes import SamplingConfig
from .sampling import Purpose, Streams, model_device, next_probs, prefill, sample_from
from .stats import DecodeResult, Tally
from .verify import entropy


@torch.no_grad()
def decode_ar(model: ImageTokenModel, prompts: list[str], seeds: list[int], sc: SamplingConfig) -> DecodeResult:
    """Prompts and per-sample seeds -> tokens [B, H*W] (on the model's device) and per-sample statistics."""
    check_request(model, prompts, seeds)
    t0 = time.perf_counter()
    dev = model_device(model)
    streams = Streams(seeds, dev)
    B, n = len(prompts), model.grid[0] * model.grid[1]
    u = streams.uniform(Purpose.TOKEN, torch.arange(n, device=dev)[None])  # [B, H*W], all at once
    tokens = torch.zeros(B, n, dtype=torch.long, device=dev)  # [B, H*W]
    tally = Tally(B, n, dev, hist_bins=2, cfg=sc.uses_cfg)  # every forward commits one token
    out, q0, tokens[:, 0] = prefill(model, prompts, sc, streams)
    tally.ent_sum += entropy(q0)
    for i in range(1, n):
        out = model.step(tokens[:, i - 1:i], torch.full((B, 1), i - 1, dtype=torch.long, device=dev))
        probs = next_probs(out, sc)  # [B, V]
        tally.ent_sum += entropy(probs)
        tokens[:, i] = sample_from(probs, u[:, i])
    tally.ar_forwards(n - 1)
    return DecodeResult(tokens, tally.stats(model.grid, (time.perf_counter() - t0) / B, {}))
