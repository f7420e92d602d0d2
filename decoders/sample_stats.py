"""A sample's decoding statistics: the one definition of each statistic, torch-free, so the flow that writes
`stats.parquet` derives its columns from here (output/layout.py STATS_SCHEMA) without loading torch. A field with a
`column` (an Arrow type's name) is a column of the stats table; `tokens_per_forward` and `waste`, computed, are
columns too.
Adding a statistic touches this class and the `Tally` that counts it (stats.py), nothing else.

Commit codes in `commit_map` (one per image token, raster order):
  0 COMMIT_AR        plain autoregressive sample (one token from one forward)
  1 COMMIT_ACCEPTED  a draft token accepted by verification
  2 COMMIT_RESAMPLED a rejected draft replaced by a sample from the residual distribution
  3 COMMIT_BONUS     the extra token sampled after a fully accepted window
  4 COMMIT_RELAXED   a draft token accepted only thanks to CSD's relaxation (the lossless test rejected it)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

import numpy as np

COMMIT_AR, COMMIT_ACCEPTED, COMMIT_RESAMPLED, COMMIT_BONUS, COMMIT_RELAXED = 0, 1, 2, 3, 4
COMMIT_NAMES = ("ar", "accepted", "resampled", "bonus", "relaxed")


def _col(kind: str, **kw):
    return field(metadata={"column": kind}, **kw)


@dataclass
class SampleStats:
    forwards: int = _col("int32")  # sequential forward passes spent on this sample (prefill included)
    tokens_per_forward_hist: list[int] = _col("list<int32>")  # hist[k] = forwards that committed k tokens
    acceptance_rate: float = _col("float64")  # accepted drafts / drafts verified (nan when nothing was drafted)
    commit_map: np.ndarray = _col("list<int8>")  # [H, W] int8, COMMIT_* codes (a flat list in the table)
    mean_entropy: float = _col("float64")  # mean entropy (nats) of the processed target distribution per token
    relaxed: int = _col("int32", default=0)  # acceptances that needed CSD's relaxation rather than the exact rule
    # query tokens the model computed for this sample, in both CFG rows (a forward of L tokens with CFG: 2L); the
    # prefill counts as the one query position that draws token 0 (its prompt tokens are not counted), so plain
    # AR feeds exactly N per row. Padding a batched forward adds to every sample it is computed for.
    tokens_fed: int = _col("int32", default=0)
    block_sizes: list[int] | None = _col("list<int32>", default=None)  # block decoder: tokens drafted per block
    rounds_per_block: list[int] | None = _col("list<int32>", default=None)  # block decoder: forwards per block
    seconds: float = 0.0  # wall-clock share of this sample (batch time / batch size)
    ar_fallback: str | None = None  # why a speculative decoder decoded it as plain AR; None: it did not
    extra: dict = field(default_factory=dict)  # decoder settings (window, rows, ...): not columns

    @property
    def tokens_per_forward(self) -> float:
        return int(self.commit_map.size) / max(1, self.forwards)

    @property
    def waste(self) -> float:
        """Tokens computed per committed token: `tokens_fed` / N (plain AR: 2.0 with CFG, 1.0 without)."""
        return self.tokens_fed / max(1, int(self.commit_map.size))

    def to_row(self) -> dict:
        """A flat dict of plain Python values (the commit map as a flat int8 list)."""
        row = asdict(self)
        row["commit_map"] = self.commit_map.reshape(-1).astype(np.int8).tolist()
        row["tokens_per_forward"] = self.tokens_per_forward
        row["waste"] = self.waste
        return row


# the computed statistics that are columns too
COMPUTED_COLUMNS = {"tokens_per_forward": "float64", "waste": "float64"}


def stat_columns() -> list[tuple[str, str]]:
    """(name, Arrow type name) of every statistic the stats table holds, in the class's order."""
    cols = [(f.name, f.metadata["column"]) for f in fields(SampleStats) if "column" in f.metadata]
    return cols[:3] + list(COMPUTED_COLUMNS.items()) + cols[3:]
