"""Plain autoregressive decoding: one forward per image token, batched. Image token i of a sample is drawn with
number i of its TOKEN stream (sampling.py), whatever its batch; token 0 is the prefill's, as in every decoder.
`decode_ar` decodes a fixed batch; `ARSlots` is the same loop over B slots whose samples start at different steps
(continuous batching: slots.py drives it)."""

from __future__ import annotations

import time

import torch

from .protocol import ImageTokenModel, StepOutput, check_request
from .recipes import SamplingConfig
from .sample_stats import SampleStats
from .sampling import Purpose, Streams, model_device, next_probs, prefill, sample_from
from .stats import DecodeResult, Occupancy, Tally
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
    stats = tally.stats(model.grid, (time.perf_counter() - t0) / B, {})
    return DecodeResult(tokens, stats, Occupancy(B, n, B * n))  # every row works in every forward


class ARSlots:
    """Plain AR over B slots (continuous batching: slots.py's `SlotLoop`), each sample at its own image index. A
    sample's token i is still number i of its own TOKEN stream, so its tokens are decode_ar's."""

    # Every AR sample takes N - 1 steps after its prefill, so slots started together finish together: a free slot
    # never has a running one to pack its prefill beside, and the admissions' prefill is a forward of its own
    # (slots.stream) - in effect the next fixed batch's start. AR streams only so that a caller need not ask
    # which loop a spec runs.
    packs = False

    def __init__(self, model: ImageTokenModel, prompts: list[str], seeds: list[int], sc: SamplingConfig):
        """Prefill the first B prompts, one per slot."""
        dev = model_device(model)
        B, self.n = len(prompts), model.grid[0] * model.grid[1]
        self.model, self.sc, self.streams = model, sc, Streams(seeds, dev)
        self.rows = torch.arange(B, device=dev)
        self.tokens = torch.zeros(B, self.n, dtype=torch.long, device=dev)  # [B, H*W]
        self.at = torch.ones(B, dtype=torch.long, device=dev)  # [B] the index each slot draws next (n: done)
        self.at_host = [1] * B  # the same on the host: every sample advances one per step, so no sync tells it
        self.tally = Tally(B, self.n, dev, hist_bins=2, cfg=sc.uses_cfg)
        _, q0, self.tokens[:, 0] = prefill(model, prompts, sc, self.streams)
        self.tally.ent_sum += entropy(q0)

    def done(self) -> list[bool]:
        return [i >= self.n for i in self.at_host]

    def harvest(self, b: int) -> tuple[torch.Tensor, SampleStats]:
        return self.tokens[b].clone(), self.tally.stats(self.model.grid, 0.0, {}, rows=[b])[0]

    def idle_step(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(tokens, index [B, 1], lengths [B]) of a step in which no slot feeds anything: each row's padding at the
        index it feeds next, which that feed rewrites before any query reads it."""
        index = (self.at - 1)[:, None]
        return torch.zeros_like(index), index, torch.zeros_like(self.at)

    def forward(self) -> None:
        """One step: every running slot feeds its last token and draws the next."""
        n, at = self.n, self.at
        active = at < n  # [B]
        index = (at - 1)[:, None]  # [B, 1]
        lengths = None if all(i < n for i in self.at_host) else active.long()  # idle slots feed nothing
        out = self.model.step(self.tokens.gather(1, index), index, lengths)
        probs = next_probs(out, self.sc)  # [B, V]
        to = at.clamp(max=n - 1)
        drawn = sample_from(probs, self.streams.uniform(Purpose.TOKEN, to))  # [B] number `to` of each stream
        self.tokens[self.rows, to] = torch.where(active, drawn, self.tokens[self.rows, to])
        self.tally.ent_sum += torch.where(active, entropy(probs), 0.0)
        self.tally.forward(torch.ones_like(at), active, 1)
        self.at = at + active.long()
        self.at_host = [min(i + 1, n) for i in self.at_host]

    def admit(self, admit, pre: StepOutput) -> None:
        """Slots admit.rows start samples admit.seeds from their prefill's output pre [R, 1], as a fresh batch's."""
        rows = admit.rows
        self.streams.admit(rows, admit.seeds)
        q0 = next_probs(pre, self.sc)  # [R, V]
        self.tokens[rows] = 0
        self.tokens[rows, 0] = sample_from(q0, self.streams.uniform(Purpose.TOKEN, 0)[rows])
        self.tally.reset(admit.at)
        self.tally.ent_sum[rows] += entropy(q0)
        self.at[rows] = 1
        for b in admit.at:
            self.at_host[b] = 1
