"""The `Tally` every decoder (ar, window, block) keeps a batch's statistics in while it decodes, and the result
it returns, with the batch's slot occupancy (`Occupancy`); a sample's statistics themselves are `SampleStats`
(sample_stats.py, torch-free).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .sample_stats import COMMIT_AR, SampleStats


@dataclass
class Occupancy:
    """How much of a decode call's batch did work: over the model forwards it ran (prefills included), the share
    of slot-forwards in which the slot fed a sample's tokens or prefilled a prompt. A slot is idle when its sample
    has finished and nothing took its place: in a fixed batch until the batch's slowest sample is done, in a
    stream (slots.py) once the queue is empty, or during a prefill forward of other slots only."""

    slots: int  # the batch's rows (a stream's B; a fixed batch's B)
    forwards: int  # model forwards the call ran, prefills included
    busy: int  # slot-forwards that did work

    @property
    def share(self) -> float:
        return self.busy / max(1, self.slots * self.forwards)


@dataclass
class DecodeResult:
    tokens: torch.Tensor  # [B, H*W] image token ids
    stats: list[SampleStats]
    occupancy: Occupancy | None = None  # None: the loop does not count it (the block decoder)


class Tally:
    """A batch's per-sample counters, kept on the model's device while a decoder runs (no host sync per forward)
    and turned into `SampleStats` with one host copy at the end.

    The decoder adds to the counters as it commits tokens: `commit` (COMMIT_* per index; `mark`), `forwards`,
    `ent_sum` (target entropy in nats of each committed token's distribution), `drafted` (drafts verified),
    `accepted`, `relaxed`; and either the tokens committed by each forward (`forward`: a histogram, SJD and AR)
    or each block's size and forwards (`block`: SSD's block decoder, whose histogram spreads a block's tokens
    over its forwards). Both count the prefill: one forward that commits token 0. `fed` counts the query tokens
    per CFG row the model computed for each sample (`forward`'s width, `ar_forwards`, or added by the decoder);
    the prefill is its one query position, so a sample's `tokens_fed` is fed x (2 with CFG, else 1)."""

    def __init__(self, batch: int, width: int, device: torch.device | str, hist_bins: int = 0, *, cfg: bool):
        """width: commit-code slots (the image's H*W and any spare slots past it, which are dropped); hist_bins:
        the most tokens one forward can commit, plus 1 (0: the decoder records blocks instead); cfg: whether
        every forward runs the unconditional row too (it doubles the tokens computed)."""
        self.cfg_rows = 2 if cfg else 1
        self.rows = torch.arange(batch, device=device)
        self.commit = torch.full((batch, width), COMMIT_AR, dtype=torch.int8, device=device)  # [B, width]
        self.forwards = torch.ones(batch, dtype=torch.long, device=device)  # [B]; the prefill samples token 0
        self.fed = torch.ones(batch, dtype=torch.long, device=device)  # [B] per row; the prefill's last position
        self.ent_sum = torch.zeros(batch, device=device)  # [B]
        self.drafted, self.accepted, self.relaxed = (torch.zeros(batch, dtype=torch.long, device=device)
                                                     for _ in range(3))  # [B] each
        self.hist = None  # [B, hist_bins]: hist[b, m] = forwards that committed m tokens
        if hist_bins:
            self.hist = torch.zeros(batch, hist_bins, dtype=torch.long, device=device)
            self.hist[:, 1] = 1
        self.blocks: list[list[int]] = [[] for _ in range(batch)]  # tokens drafted per block
        self.rounds: list[list[int]] = [[] for _ in range(batch)]  # forwards per block

    def mark(self, pos: torch.Tensor, code, where: torch.Tensor) -> None:
        """Set the commit code at indices pos ([B] or [B, S]) where `where` (the same shape) holds; code: one
        COMMIT_* value or an int8 tensor of them, shaped like pos."""
        rows = self.rows if pos.dim() == 1 else self.rows[:, None]
        if not isinstance(code, torch.Tensor):
            code = torch.tensor(code, dtype=torch.int8, device=self.commit.device)
        self.commit[rows, pos] = torch.where(where, code, self.commit[rows, pos])

    def forward(self, committed: torch.Tensor, active: torch.Tensor, width: int) -> None:
        """One forward of `width` query tokens per row that committed `committed` [B] tokens, counted for the
        samples still decoding [B] bool (a finished sample's row still rides along, charged to nobody)."""
        self.forwards += active.long()
        self.fed += active.long() * width
        self.hist[self.rows, committed] += active.long()

    def ar_forwards(self, count: int) -> None:
        """`count` more forwards of one token each, for every sample (plain AR after its prefill)."""
        self.forwards += count
        self.fed += count
        self.hist[:, 1] += count

    def block(self, samples: list[int], sizes: torch.Tensor, rounds: torch.Tensor) -> None:
        """A block of sizes[b] drafted tokens verified in rounds[b] forwards ([B] each), for each b in samples."""
        sizes_host, rounds_host = sizes.tolist(), rounds.tolist()  # one transfer each, not one per sample
        for b in samples:
            self.blocks[b].append(sizes_host[b])
            self.rounds[b].append(rounds_host[b])

    def reset(self, rows: list[int]) -> None:
        """Slots `rows` take new samples (continuous batching, slots.py): their counters start again, as a fresh
        batch's do."""
        r = torch.tensor(rows, dtype=torch.long, device=self.commit.device)
        self.commit[r] = COMMIT_AR
        self.forwards[r], self.fed[r] = 1, 1
        for t in (self.ent_sum, self.drafted, self.accepted, self.relaxed):
            t[r] = 0
        if self.hist is not None:
            self.hist[r] = 0
            self.hist[r, 1] = 1
        for b in rows:
            self.blocks[b], self.rounds[b] = [], []

    def stats(self, grid: tuple[int, int], seconds: float, extra: dict,
              rows: list[int] | None = None) -> list[SampleStats]:
        """Per-sample statistics of `rows` (None: every row); `extra` (decoder settings) goes to every sample."""
        N = grid[0] * grid[1]
        rows = list(range(len(self.rows))) if rows is None else rows
        r = torch.tensor(rows, dtype=torch.long, device=self.commit.device)
        commit = self.commit[r, :N].cpu().numpy()
        forwards, ent_sum, drafted, accepted, relaxed, fed = (
            t[r].cpu() for t in (self.forwards, self.ent_sum, self.drafted, self.accepted, self.relaxed, self.fed))
        hist = None if self.hist is None else self.hist[r].cpu()
        blocks, rounds = [self.blocks[b] for b in rows], [self.rounds[b] for b in rows]
        stats = []
        for b in range(commit.shape[0]):
            by_block = hist is None  # the block decoder records its blocks, the others a histogram
            stats.append(SampleStats(
                forwards=int(forwards[b]),
                tokens_per_forward_hist=_trimmed(hist[b].tolist()) if hist is not None else
                _spread(blocks[b], rounds[b]),
                acceptance_rate=float(accepted[b] / drafted[b]) if drafted[b] else float("nan"),
                commit_map=commit[b].reshape(grid), mean_entropy=float(ent_sum[b] / N),
                relaxed=int(relaxed[b]), tokens_fed=int(fed[b]) * self.cfg_rows,
                block_sizes=blocks[b] if by_block else None,
                rounds_per_block=rounds[b] if by_block else None, seconds=seconds, extra=extra))
        return stats


def _trimmed(h: list[int]) -> list[int]:
    """A per-forward histogram without its empty tail (never shorter than [0, prefill])."""
    while len(h) > 2 and h[-1] == 0:
        h.pop()
    return h


def _spread(blocks: list[int], rounds: list[int]) -> list[int]:
    """Tokens per forward, spreading each block's tokens over its forwards (prefill counted as 1 token)."""
    h = [0, 1]
    for size, r in zip(blocks, rounds):
        k = max(1, round(size / max(1, r)))
        h += [0] * (k + 1 - len(h))
        h[k] += r
    return h
