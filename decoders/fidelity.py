"""Fidelity against the target model: what a decoder's committed tokens cost under the target itself.

`target_nll` teacher-forces the target on decoded tokens and returns each sample's mean negative
log-likelihood per token under the processed distribution the decoders sample (CFG, temperature, top-k/p:
`sampling.processed_probs`, the same function AR, drafting and verification use). A lossless decoder's
tokens are samples of that distribution, so their NLL matches AR's in distribution; a lossy decoder that
commits improbable tokens shows a positive gap, a mode-seeking one a negative gap.

The intervals are percentile bootstraps over prompts. Decoder and AR decode the same prompts with
independent seeds, so per-prompt differences are independent draws whose mean is the gap; resampling
prompts keeps the pairing and removes the prompt-to-prompt spread from the interval.
"""

from __future__ import annotations

import numpy as np
import torch

from .protocol import ImageTokenModel
from .sampling import processed_probs
from .recipes import SamplingConfig

LOG_FLOOR = 1e-12  # a token outside the processed support costs -log(1e-12) = 27.6 nats, not infinity


def _nll_sum(cond: torch.Tensor, uncond: torch.Tensor | None, tokens: torch.Tensor, sc: SamplingConfig):
    """logits [B, S, V] predicting tokens [B, S] -> summed NLL per sample [B]."""
    p = processed_probs(cond, uncond, sc).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)  # [B, S]
    return -p.clamp_min(LOG_FLOOR).log().sum(-1)


@torch.no_grad()
def target_nll(model: ImageTokenModel, prompts: list[str], tokens: torch.Tensor, sc: SamplingConfig,
               chunk: int = 256) -> torch.Tensor:
    """tokens [B, N] decoded for prompts -> mean NLL per token under the target, [B] (fp32, on the CPU).

    Positions are fed in chunks: the cache is position-indexed, so a chunk sees the earlier ones as
    context, and at most [B, chunk, V] probabilities exist at once (Emu3: 8,100 positions x 32k codes)."""
    B, N = tokens.shape
    tokens = tokens.to(model.device)
    out = model.start(prompts, sc.uses_cfg)  # predicts index 0
    total = _nll_sum(out.cond[:, -1:], None if out.uncond is None else out.uncond[:, -1:], tokens[:, :1], sc)
    for start in range(0, N - 1, chunk):
        stop = min(N - 1, start + chunk)
        idx = torch.arange(start, stop, device=tokens.device).expand(B, -1)
        out = model.step(tokens[:, start:stop], idx)  # predicts indices start + 1 .. stop
        total += _nll_sum(out.cond, out.uncond, tokens[:, start + 1:stop + 1], sc)
    return (total / N).float().cpu()


def bootstrap_ci(values: np.ndarray, level: float = 0.95, n_boot: int = 10_000, seed: int = 0,
                 stat=np.mean) -> tuple[float, float]:
    """Percentile bootstrap interval of stat(values) (values [n] or [n, k]: resampled along rows)."""
    values = np.asarray(values, dtype=np.float64)
    rng = np.random.default_rng(seed)
    chunk = max(1, 4_000_000 // max(1, len(values)))  # resamples drawn a chunk at a time: memory stays bounded
    boots = []
    for start in range(0, n_boot, chunk):
        idx = rng.integers(0, len(values), size=(min(chunk, n_boot - start), len(values)))
        boots.append(values[idx].mean(axis=1) if stat is np.mean else np.array([stat(values[i]) for i in idx]))
    boots = np.concatenate(boots)
    a = (1 - level) / 2
    lo, hi = np.quantile(boots, [a, 1 - a])
    return float(lo), float(hi)


def paired_gap(decoder: np.ndarray, reference: np.ndarray, level: float = 0.95, n_boot: int = 10_000,
               seed: int = 0) -> dict:
    """Mean of decoder - reference over prompts (same prompts, independent seeds) with its interval."""
    d = np.asarray(decoder, np.float64) - np.asarray(reference, np.float64)
    return {"gap": float(d.mean()), "ci": bootstrap_ci(d, level, n_boot, seed)}


def ratio_gap(num_a: np.ndarray, num_b: np.ndarray, den: np.ndarray, level: float = 0.95,
              n_boot: int = 10_000, seed: int = 0) -> dict:
    """Difference of two pooled rates over the same prompts, sum(a)/sum(den) - sum(b)/sum(den) (e.g. object
    accuracy: correct objects over named objects), with a paired bootstrap interval over prompts."""
    cols = np.stack([num_a, num_b, den], axis=1).astype(np.float64)

    def stat(x):
        return (x[:, 0].sum() - x[:, 1].sum()) / max(x[:, 2].sum(), 1e-12)
    return {"gap": float(stat(cols)), "ci": bootstrap_ci(cols, level, n_boot, seed, stat=stat)}
