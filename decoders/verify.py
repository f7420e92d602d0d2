"""Speculative verification as pure tensor functions: no model, cache or I/O inside.

Glossary (SJD's and HF's naming; gpt-fast calls the draft p too):
  p         the draft distribution a draft token was sampled from (one-hot for deterministic drafts)
  q         the target distribution: the model's processed distribution at that position, this forward
  accepted  a draft token kept by the acceptance test
  resampled the token at the first rejection, drawn from the residual norm(max(0, q - p)) (q if empty)
  bonus     the token after a fully accepted window, drawn from q at the window's end

Standard (lossless) acceptance: accept x with probability min(1, q(x) / p(x)).
CSD acceptance: where the draft and target distributions agree, TV(p, q) < delta, accept with probability
min(1, q(x) / p(x) + lam * H(q) / norm), and by the standard rule elsewhere. H is the entropy of q in nats;
`entropy_norm` says what it is divided by, so that lam * H / norm lies in [0, lam]:
  "support"  log of the number of tokens q gives mass to (after top-k / top-p), at least log 2;
  "vocab"    log V;
  "none"     1 (raw nats).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .recipes import Relaxation
from .sampling import sample_from


@dataclass
class Verdict:
    n_accepted: torch.Tensor  # [B] leading drafts accepted
    next_token: torch.Tensor  # [B] resampled token at the first rejection, or the bonus token
    accepted: torch.Tensor  # [B, K] bool, the accepted prefix
    relaxed: torch.Tensor  # [B, K] bool, accepted only thanks to the relaxation
    tv: torch.Tensor  # [B, K] total variation between p and q at each draft


def entropy(q: torch.Tensor) -> torch.Tensor:
    """Entropy in nats over the last dim (q clamped to 1e-30 under the log: a zero term stays 0, not nan)."""
    return -(q * q.clamp_min(1e-30).log()).sum(-1)


def normalised_entropy(q: torch.Tensor, how: str) -> torch.Tensor:
    h = entropy(q)
    if how == "none":
        return h
    if how == "vocab":
        return h / math.log(q.shape[-1])
    support = (q > 0).sum(-1).clamp_min(2).to(q.dtype)
    return h / support.log()


def total_variation(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """TV(p, q) = ½ Σ |p - q| over the last dim."""
    return 0.5 * (p - q).abs().sum(-1)


def accept(draft: torch.Tensor, p: torch.Tensor, q: torch.Tensor, u: torch.Tensor, relax: Relaxation,
           tv: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The acceptance test at every position, independently: draft [...], p / q [..., V] (the draft's and the
    target's distributions at its position), u [...] uniforms; tv: TV(p, q) when the caller has it already.
    -> (accepted [...] bool, by either rule; relaxed [...] bool, accepted only thanks to CSD's relaxation).
    TV and the entropy bonus are computed only when the relaxation is active: they cost a pass over V."""
    qx = q.gather(-1, draft.unsqueeze(-1)).squeeze(-1)
    px = p.gather(-1, draft.unsqueeze(-1)).squeeze(-1)
    ratio = qx / px.clamp_min(1e-30)
    standard = u < ratio.clamp(max=1.0)  # the lossless rule: min(1, q(x) / p(x))
    if not relax.active:
        return standard, torch.zeros_like(standard)
    tv = total_variation(p, q) if tv is None else tv
    bonus = relax.lam * normalised_entropy(q, relax.entropy_norm)
    relaxed = (tv < relax.delta) & (u < (ratio + bonus).clamp(max=1.0)) & ~standard
    return standard | relaxed, relaxed


def residual(q: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """The distribution a rejected draft is resampled from: norm(max(0, q - p)) over the last dim, and q itself
    where that is empty (p covers q, so the draft could not have been rejected by the lossless rule)."""
    resid = (q - p).clamp_min(0)
    mass = resid.sum(-1, keepdim=True)
    return torch.where(mass > 0, resid / mass.clamp_min(1e-30), q)


def verify(draft: torch.Tensor, p: torch.Tensor, q: torch.Tensor, n_valid: torch.Tensor,
           u_accept: torch.Tensor, u_resample: torch.Tensor, relax: Relaxation = Relaxation()) -> Verdict:
    """Verify K drafts per sample, left to right, vectorised over batch and window (SJD, CSD, lossless SSD).

    draft [B, K] draft tokens; p [B, K, V] their draft distributions; q [B, K + 1, V] target distributions
    (q[:, j] for draft j, q[:, K] for the bonus); n_valid [B] how many drafts each sample may commit (the
    rest lie past the image's end); u_accept [B, K], u_resample [B] uniforms keyed by each sample's seed.
    """
    p, q = p.float(), q.float()  # fp32 always, whatever the model's dtype (a no-op for processed_probs' output)
    B, K = draft.shape
    qd = q[:, :K]  # [B, K, V]
    tv = total_variation(p, qd)  # [B, K]
    ok, relaxed = accept(draft, p, qd, u_accept, relax, tv)  # [B, K] each
    valid = torch.arange(K, device=draft.device)[None, :] < n_valid[:, None]
    prefix = (ok & valid).long().cumprod(1).bool()  # [B, K] accepted prefix
    n_acc = prefix.sum(1)  # [B]
    # the next token: residual at the first rejection, or the bonus from q at n_acc (p counts as 0 there)
    p_pad = torch.cat([p, p.new_zeros(B, 1, q.shape[-1])], dim=1)  # [B, K + 1, V] (K may be 0)
    at = n_acc.view(B, 1, 1).expand(B, 1, q.shape[-1])
    q_at, p_at = q.gather(1, at).squeeze(1), p_pad.gather(1, at).squeeze(1)  # [B, V]
    rejected = n_acc < n_valid
    resid = residual(q_at, torch.where(rejected[:, None], p_at, 0.0))  # [B, V]
    return Verdict(n_acc, sample_from(resid, u_resample), prefix, prefix & relaxed, tv)


def verify_all(draft: torch.Tensor, p: torch.Tensor, q: torch.Tensor, judge: torch.Tensor, u_accept: torch.Tensor,
               u_resample: torch.Tensor, relax: Relaxation = Relaxation()):
    """Judge every draft, not only up to the first rejection (SSD's auto-correction).

    draft [B, K], p / q [B, K, V], judge [B, K] bool (positions to judge; others keep their token),
    u_accept / u_resample [B, K]. Each judged position keeps its draft or is resampled from its residual,
    so its new token is a sample from q (given this forward's context) whatever p was.
    -> (tokens [B, K], rejected [B, K] bool, relaxed [B, K] bool: accepted only thanks to the relaxation).
    """
    p, q = p.float(), q.float()  # fp32 always (see verify)
    ok, relaxed = accept(draft, p, q, u_accept, relax)
    rejected = judge & ~ok
    tokens = torch.where(rejected, sample_from(residual(q, p), u_resample), draft)
    return tokens, rejected, relaxed & judge


def verify_candidates(r: torch.Tensor, cands: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """More candidates for one position after its draft was rejected (proactive drafting's first level; SpecInfer's
    recursive rejection sampling with deterministic drafts): candidate k is accepted with probability r_k(c_k),
    where r_0 = r is the residual left by the rejected draft and r_{k+1} is r_k with c_k's mass removed and
    renormalised. Each test is the lossless rule for a one-hot draft against the current residual, so the token
    this position ends with (the accepted candidate, or a draw from the last residual) is a sample from q.

    r [B, V] residual; cands [B, C] candidate tokens, fixed before this forward; u [B, C] uniforms.
    -> (won [B]: the index of the accepted candidate, -1 if none; r_last [B, V], the residual after them all).
    """
    B, C = cands.shape
    r = r.float().clone()
    won = torch.full((B,), -1, dtype=torch.long, device=r.device)
    for k in range(C):  # C is small (branches - 1); each step is vectorised over the batch
        c = cands[:, k:k + 1]  # [B, 1]
        mass = r.gather(1, c).squeeze(1)  # [B] r_k(c_k)
        take = (won < 0) & (u[:, k] < mass)
        won = torch.where(take, k, won)
        left = r.scatter(1, c, 0.0)
        total = left.sum(1, keepdim=True)
        r = torch.where(((won < 0) & (total.squeeze(1) > 0))[:, None], left / total.clamp_min(1e-30), r)
    return won, r
