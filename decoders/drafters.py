"""Where drafts come from: one `Drafter` interface, shared by the window loop (window.py: SJD, CSD, SSD) and SSD's
block decoder (block.py).

A drafter fills a run of positions of a sample's token buffer with draft tokens and returns the distribution
each was drawn from (p, which verification needs). The positions are given relative to a window: `start`
[B] is the index of window slot 0, and slots first_b .. end_b - 1 are drafted (first_b >= end_b: none).
  window: the window after the last committed token; its first `carried` slots hold Jacobi updates, the rest
       are fresh drafts (first = carried, end = K).
  block: a block of L_b positions after the committed prefix (first = 0, end = L).
Implementations:
  RandomDrafter       a uniform token, one-hot p (SJD's `init=random`)
  RepeatDrafter       the token `offset` positions back (1: repeat-left, W: repeat-above), one-hot p; a
                      uniform token where there is none
  HeadsDrafter        SSD's spatial heads (ssd_heads.py): drafts sampled from the model's own norm + head on
                      predicted hidden states, so p is a full distribution
`begin` and `observe` hand the drafter each forward's output (the heads keep the hidden states they draft
from); the guessing drafters ignore them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import numpy as np
import torch

from .protocol import StepOutput
from .sampling import model_device, processed_probs, sample_from
from .configs import SamplingConfig

if TYPE_CHECKING:  # the window loop imports this module for SJD too; only SSD loads heads
    from .ssd_heads import SpatialHeads


class Drafter(Protocol):
    name: str  # recorded in the statistics (SJD's "init")

    def begin(self, out: StepOutput) -> None:
        """The prefill's output (its last position is the hidden state before image index 0)."""

    def observe(self, out: StepOutput, idx: torch.Tensor, fed: torch.Tensor | None = None) -> None:
        """A forward's output; idx [B, S] the indices fed (out.hidden[:, s] is index idx[:, s]); fed [B, S]
        bool: which of them were real tokens (None: all; the rest is padding whose output is junk)."""

    def draft(self, buf: torch.Tensor, start: torch.Tensor, first: torch.Tensor, end: torch.Tensor,
              u: torch.Tensor) -> torch.Tensor:
        """Fill buf[b, start_b + o] for window slots first_b <= o < end_b, in place; return the draft
        distributions p [B, K, V] by window slot (slots outside [first_b, end_b) are meaningless).
        u [B, K]: uniforms keyed by each sample's seed (rng.py), at least one per drafted slot."""


class _GuessDrafter:
    """Drafts guessed without the model: one-hot p. Slot o uses u[:, o]."""

    name = ""

    def __init__(self, n_codes: int):
        self.V = n_codes

    def begin(self, out: StepOutput) -> None:
        pass

    def observe(self, out: StepOutput, idx: torch.Tensor, fed: torch.Tensor | None = None) -> None:
        pass

    def guess(self, buf: torch.Tensor, rows: torch.Tensor, idx: torch.Tensor, rand: torch.Tensor) -> torch.Tensor:
        """The draft at index idx [B] of each sample; rand [B]: a uniform random token."""
        raise NotImplementedError

    def draft(self, buf, start, first, end, u):
        B, K = u.shape
        rows = torch.arange(B, device=buf.device)
        for o in range(K):  # in slot order: a repeat may copy the draft just made to its left
            idx = start + o  # [B]
            fill = (o >= first) & (o < end)  # [B]
            if not fill.any():
                continue
            rand = (u[:, o] * self.V).long().clamp_(max=self.V - 1)  # [B]
            buf[rows, idx] = torch.where(fill, self.guess(buf, rows, idx, rand), buf[rows, idx])
        window = buf[rows[:, None], start[:, None] + torch.arange(K, device=buf.device)]  # [B, K]
        return torch.zeros(B, K, self.V, device=buf.device).scatter_(2, window.unsqueeze(-1), 1.0)


class RandomDrafter(_GuessDrafter):
    name = "random"

    def guess(self, buf, rows, idx, rand):
        return rand


class RepeatDrafter(_GuessDrafter):
    """The token `offset` indices back: 1 repeats the left neighbour, the grid's width W the one above."""

    def __init__(self, n_codes: int, offset: int, name: str):
        super().__init__(n_codes)
        self.offset, self.name = offset, name

    def guess(self, buf, rows, idx, rand):
        return torch.where(idx >= self.offset, buf[rows, (idx - self.offset).clamp(min=0)], rand)


def guess_drafter(init: str, grid: tuple[int, int], n_codes: int) -> _GuessDrafter:
    """SJD's draft initialisation by name (configs.INITS)."""
    if init == "random":
        return RandomDrafter(n_codes)
    return RepeatDrafter(n_codes, 1 if init == "repeat-left" else grid[1], init)


class HeadsDrafter:
    """SSD's spatial heads as a drafter. hb[b, i + 1] holds the best-known hidden state at index i (h(-1): the
    prompt's last position), conditional and, under CFG, unconditional (hbu): the model's own states where a
    forward has fed index i, the heads' predictions ĥ(i) where i was only drafted.

    A block is drafted in waves (`waves`): positions with a row above vertically, ĥ(t-1) = V(h(t-1-W),
    e(x_{t-1-W})), a whole row per wave, chaining V down the block; the rest (the first row of the image, or
    everything with `two_d=False`) horizontally, ĥ(t-1) = H(ĥ(t-2), e(x_{t-1})). Drafted slot first_b + o
    uses u[:, o] (the draft order, not the window slot)."""

    name = "heads"

    def __init__(self, model, heads: SpatialHeads, sc: SamplingConfig, two_d: bool, batch: int, size: int):
        """size: hidden-state slots per sample (indices -1 .. size - 2; writes past the end land on the last)."""
        dev = model_device(model)
        self.model, self.heads, self.sc, self.two_d, self.W = model, heads, sc, two_d, model.grid[1]
        # fp32 whatever the model's dtype: the heads chain their predictions in fp32 (ssd_heads.py)
        self.hb = torch.zeros(batch, size, model.hidden_dim, device=dev)  # [B, size, D]
        self.hbu = torch.zeros_like(self.hb) if sc.uses_cfg else None
        self.rows = torch.arange(batch, device=dev)

    def begin(self, out: StepOutput) -> None:
        self.hb[:, 0] = out.hidden[:, -1]
        if self.hbu is not None:
            self.hbu[:, 0] = out.hidden_uncond[:, -1]

    def observe(self, out: StepOutput, idx: torch.Tensor, fed: torch.Tensor | None = None) -> None:
        slot = (idx + 1).clamp(max=self.hb.shape[1] - 1)  # [B, S]
        for hs, new in ((self.hb, out.hidden), (self.hbu, out.hidden_uncond)):
            if hs is None:
                continue
            new = new.to(hs.dtype)  # an indexed write needs matching dtypes (a bf16 model's hidden states)
            if fed is None:
                hs[self.rows[:, None], slot] = new
            else:  # keep what padding positions would overwrite
                hs[self.rows[:, None], slot] = torch.where(fed[..., None], new, hs[self.rows[:, None], slot])

    def waves(self, n: np.ndarray, L: np.ndarray) -> np.ndarray:
        """[B, Lmax] wave index of each block position (-1 = none); a wave's inputs come from earlier waves."""
        B, Lmax, W = len(n), max(1, int(L.max())), self.W
        wave = np.full((B, Lmax), -1)
        for b in range(B):
            w = {}
            for o in range(L[b]):
                t = n[b] + o
                if self.two_d and t - 1 - W >= 0:
                    deps = (t - W, t - 1 - W)  # producers of ĥ(t-1-W) and of x_{t-1-W}
                else:
                    deps = (t - 1,)  # producer of ĥ(t-2) and x_{t-1}
                w[t] = 1 + max(w.get(d, -1) for d in deps)  # committed producers count as wave -1
                wave[b, o] = w[t]
        return wave

    def draft(self, buf, start, first, end, u):
        B, K, dev = buf.shape[0], u.shape[1], buf.device
        n0 = start + first  # [B] the first index drafted
        wave = self.waves(n0.cpu().numpy(), (end - first).cpu().numpy())  # the schedule is planned on the host
        p = torch.zeros(B, K, self.model.n_codes, device=dev)  # [B, K, V] by window slot
        for w in range(int(wave.max()) + 1):
            bs, os_ = np.nonzero(wave == w)
            bs_t, os_t = torch.from_numpy(bs).to(dev), torch.from_numpy(os_).to(dev)  # [P] each
            probs = self._wave(buf, bs_t, n0[bs_t] + os_t)  # [P, V]
            buf[bs_t, n0[bs_t] + os_t] = sample_from(probs, u[bs_t, os_t])
            p[bs_t, first[bs_t] + os_t] = probs
        return p

    def _wave(self, buf: torch.Tensor, bs: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """Draft distributions [P, V] of positions t [P] of samples bs [P], whose inputs are all known."""
        vertical = (t - 1 - self.W >= 0) & self.two_d
        src = torch.where(vertical, t - 1 - self.W, t - 2)  # index of the source hidden state
        tok_at = torch.where(vertical, t - 1 - self.W, t - 1)  # index of the source token
        e = self.model.embed(buf[bs, tok_at][None], tok_at[None])[0]  # [P, E]
        out_c = self._predict(self.hb, bs, t, src, e, vertical)
        logits_u = None
        if self.hbu is not None:
            logits_u = self.heads.draft_logits(self.model, self._predict(self.hbu, bs, t, src, e, vertical))
        return processed_probs(self.heads.draft_logits(self.model, out_c), logits_u, self.sc)

    def _predict(self, hs: torch.Tensor, bs: torch.Tensor, t: torch.Tensor, src: torch.Tensor, e: torch.Tensor,
                 vertical: torch.Tensor) -> torch.Tensor:
        """The heads' output [P, D or V] for ĥ(t - 1), from hs (hb or hbu); ĥ(t - 1) is stored at slot t."""
        h = hs[bs, src + 1]  # [P, D]
        out = torch.where(vertical[:, None], self.heads.vertical(h, e), self.heads.horizontal(h, e))
        # token heads (the ablation) predict no hidden state: a chained draft reuses its source's hidden state
        # with the new token's embedding
        hs[bs, t] = out if self.heads.cfg.kind == "latent" else h
        return out
