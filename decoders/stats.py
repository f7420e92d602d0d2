"""Per-sample decoding statistics, kept as plain numbers and arrays so they go straight into Parquet.

Commit codes in `commit_map` (one per image token, raster order):
  0 COMMIT_AR        plain autoregressive sample (one token from one forward)
  1 COMMIT_ACCEPTED  a draft token accepted by verification
  2 COMMIT_RESAMPLED a rejected draft replaced by a sample from the residual distribution
  3 COMMIT_BONUS     the extra token sampled after a fully accepted window
  4 COMMIT_RELAXED   a draft token accepted only thanks to CSD's relaxation (the lossless test rejected it)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np
import torch

COMMIT_AR, COMMIT_ACCEPTED, COMMIT_RESAMPLED, COMMIT_BONUS, COMMIT_RELAXED = 0, 1, 2, 3, 4
COMMIT_NAMES = ("ar", "accepted", "resampled", "bonus", "relaxed")


@dataclass
class SampleStats:
    forwards: int  # sequential forward passes spent on this sample (prefill included)
    tokens_per_forward_hist: list[int]  # hist[k] = forwards that committed k tokens
    acceptance_rate: float  # accepted drafts / drafts verified (nan when nothing was drafted)
    commit_map: np.ndarray  # [H, W] int8, COMMIT_* codes
    mean_entropy: float  # mean entropy (nats) of the processed target distribution per token
    relaxed: int = 0  # acceptances that needed a relaxation (CSD) rather than the lossless rule
    seconds: float = 0.0  # wall-clock share of this sample (batch time / batch size)
    extra: dict = field(default_factory=dict)  # decoder-specific (block sizes, rounds, ...)

    @classmethod
    def plain_ar(cls, grid: tuple[int, int], forwards: int, mean_entropy: float, seconds: float) -> "SampleStats":
        return cls(forwards=forwards, tokens_per_forward_hist=[0, forwards], acceptance_rate=float("nan"),
                   commit_map=np.zeros(grid, np.int8), mean_entropy=mean_entropy, seconds=seconds)

    @property
    def tokens_per_forward(self) -> float:
        return int(self.commit_map.size) / max(1, self.forwards)

    def to_row(self) -> dict:
        """A flat dict of plain Python / numpy values (the commit map as a flat int8 list)."""
        row = asdict(self)
        row["commit_map"] = self.commit_map.reshape(-1).astype(np.int8).tolist()
        row["tokens_per_forward"] = self.tokens_per_forward
        return row


@dataclass
class DecodeResult:
    tokens: torch.Tensor  # [B, H*W] image token ids
    stats: list[SampleStats]
