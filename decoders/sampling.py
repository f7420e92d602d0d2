"""The one processed distribution, and sampling from it given uniforms.

`processed_probs` turns raw logits into the distribution every decoder samples from and verifies
against: CFG mix -> temperature -> top-k -> top-p -> softmax, always in fp32 (a bf16 model's logits are cast
first). AR sampling, drafting and verification all call it, because speculative acceptance is lossless only
when draft and target are processed alike.

Sampling is deterministic given its uniforms (`sample_from`, `gumbel_sample`); the uniforms are counter-based,
keyed by each sample's seed (rng.py), so a sample's tokens do not depend on which other samples share its
batch.
"""

from __future__ import annotations


import torch

from .recipes import SamplingConfig


def cfg_mix(cond: torch.Tensor, uncond: torch.Tensor | None, scale: float) -> torch.Tensor:
    """Classifier-free guidance on logits: u + s * (c - u). scale 1 (or no uncond) returns cond."""
    if uncond is None or scale == 1.0:
        return cond
    return uncond + scale * (cond - uncond)


def processed_probs(cond: torch.Tensor, uncond: torch.Tensor | None, sc: SamplingConfig) -> torch.Tensor:
    """Logits [..., V] (conditional, and unconditional for CFG) -> probabilities [..., V]."""
    logits = cfg_mix(cond.float(), None if uncond is None else uncond.float(), sc.cfg_scale)
    if sc.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).to(logits.dtype)
    logits = logits / sc.temperature
    if sc.top_k and sc.top_k < logits.shape[-1]:
        kth = torch.topk(logits, sc.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if sc.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        cum = torch.softmax(sorted_logits, dim=-1).cumsum(-1)
        drop_sorted = (cum - torch.softmax(sorted_logits, dim=-1)) >= sc.top_p  # keep the smallest prefix >= p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return torch.softmax(logits, dim=-1)


def next_probs(out, sc: SamplingConfig) -> torch.Tensor:
    """The processed distribution of the token after each sample's last fed position: a `StepOutput`'s logits
    [B, S, V] -> [B, V] (AR's step, and every decoder's prefill)."""
    return processed_probs(out.cond[:, -1], None if out.uncond is None else out.uncond[:, -1], sc)


def model_device(model) -> torch.device:
    """Where a model's tensors live: every decoder buffer, key and uniform goes there (CPU for a model that does
    not say)."""
    return torch.device(getattr(model, "device", "cpu"))


def model_dtype(model) -> torch.dtype:
    """The precision of a model's weights and outputs (fp32 for a model that does not say). Probabilities are
    fp32 whatever it is: `processed_probs` casts the logits first."""
    return getattr(model, "dtype", torch.float32)


def sample_from(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF sampling: probs [..., V], u [...] -> token ids [...]. Deterministic given u."""
    cdf = probs.cumsum(-1)
    cdf = cdf / cdf[..., -1:]  # guard against rounding: the last bin ends at exactly 1
    idx = torch.searchsorted(cdf, u.unsqueeze(-1).to(cdf.dtype).contiguous(), right=True).squeeze(-1)
    return idx.clamp_(max=probs.shape[-1] - 1)


def gumbel_sample(probs: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """Gumbel-max sampling: argmax(log probs + g), probs [..., V], g [..., V] -> [...]. An exact sample of
    probs when g is fresh Gumbel noise; with g fixed per position, two similar distributions give the same
    token with probability at least (1 - TV) / (1 + TV) (the Gumbel coupling)."""
    logp = torch.where(probs > 0, probs.clamp_min(1e-38).log(), float("-inf"))
    return (logp + g).argmax(-1)
