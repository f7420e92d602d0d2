"""Speculative Jacobi decoding (SJD), and CSD on top of it, with per-sample ragged progress.

One iteration, per sample b with n_b tokens committed (see docs/algorithms.md §1):
  1. window = [last committed token] + K = L - 1 drafts for indices n_b .. n_b + K - 1;
  2. one forward over the window gives q for each draft and for the bonus position;
  3. `verify` accepts a prefix of the drafts and draws the resampled or bonus token after it;
  4. commit; the target's own samples at the positions after the commit point (Jacobi updates) become
     the next drafts, with their q as draft distribution; the window is topped up with fresh drafts
     (random: uniform token, one-hot p; repeat-left / repeat-above: the neighbouring token, one-hot p;
     or a `Drafter`'s drafts with their distributions: lossless SSD tops up with its spatial heads).
`coupled=True` draws the Jacobi updates by Gumbel-max with one fixed noise vector per position instead of
fresh noise. A draft whose context has settled then stops changing from one forward to the next, so the
drafts ahead of the commit point converge to the tokens they will be judged as, instead of being redrawn
every forward. It stays lossless: the noise at index j only ever draws the draft of j, and the draft
distribution q_j at judgement depends only on indices < j, so the draft is an exact sample of q_j; the
accept test and the residual draw use fresh uniforms.
Each sample advances by its own accepted length: no minimum over the batch. The KV cache is
position-indexed, so a sample's rollback is just its next window starting at its own n_b.
Randomness is drawn per sample, only while the sample is still decoding, so a sample's tokens do not
depend on its batch-mates.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol

import torch

from .configs import INITS, SJDConfig  # noqa: F401 - re-exported
from .protocol import ImageTokenModel, StepOutput, check_request
from .sampling import (PositionNoise, SamplingConfig, gumbel_sample, make_generators, model_device, processed_probs,
                       sample_from, uniforms)
from .stats import (COMMIT_ACCEPTED, COMMIT_AR, COMMIT_BONUS, COMMIT_RELAXED, COMMIT_RESAMPLED, DecodeResult,
                    SampleStats)
from .verify import Relaxation, entropy, verify



class Drafter(Protocol):
    """Fresh drafts for the window's tail from a model's hidden states (lossless SSD's spatial heads)."""

    def begin(self, out: StepOutput) -> None:
        """The prefill's output (its last position is the hidden state before image index 0)."""

    def observe(self, out: StepOutput, idx: torch.Tensor) -> None:
        """A window forward's output; idx [B, S] the indices fed (out.hidden[:, s] is index idx[:, s])."""

    def draft(self, buf: torch.Tensor, start: torch.Tensor, count: torch.Tensor, u: torch.Tensor,
              K: int) -> torch.Tensor:
        """Fill buf[b, start_b : start_b + count_b]; return their draft distributions [B, K, V] (slot o is
        index start_b + o; slots >= count_b are ignored). u [B, K]: the sample's uniforms for drawing them."""


def _fresh_drafts(buf: torch.Tensor, start: torch.Tensor, first_new: torch.Tensor, K: int, cols: int,
                  init: str, u: torch.Tensor, V: int) -> torch.Tensor:
    """Fill window slots i >= first_new[b] of sample b (index start[b] + i) in place in buf [B, N + K]."""
    B = buf.shape[0]
    rows = torch.arange(B, device=buf.device)
    for i in range(K):
        idx = start + i  # [B]
        fill = (i >= first_new)
        if not fill.any():
            continue
        rand = (u[:, i] * V).long().clamp_(max=V - 1)
        if init == "random":
            tok = rand
        elif init == "repeat-left":
            tok = torch.where(idx >= 1, buf[rows, (idx - 1).clamp(min=0)], rand)
        else:  # repeat-above
            tok = torch.where(idx >= cols, buf[rows, (idx - cols).clamp(min=0)], rand)
        buf[rows, idx] = torch.where(fill, tok, buf[rows, idx])
    return buf


@torch.no_grad()
def decode_sjd(model: ImageTokenModel, prompts: list[str], seeds: list[int], sc: SamplingConfig,
               cfg: SJDConfig = SJDConfig(), drafter: Drafter | None = None) -> DecodeResult:
    check_request(model, prompts, seeds, sc.greedy, cfg.relax.active)
    t0 = time.perf_counter()
    dev = model_device(model)  # every buffer and generator below lives on it
    gens = make_generators(seeds, dev)
    B, (rows_, cols) = len(prompts), model.grid
    N, K, V = rows_ * cols, cfg.window - 1, model.n_codes
    ar = torch.arange(B, device=dev)
    gumbel = PositionNoise(gens, N + K + 1, V, span=K + 1, device=dev) if cfg.coupled else None  # row j: index j

    buf = torch.zeros(B, N + K + 1, dtype=torch.long, device=dev)  # committed tokens, then the current drafts
    p_draft = torch.zeros(B, K, V, device=dev)  # draft distribution of each window slot
    commit = torch.full((B, N + K + 1), COMMIT_AR, dtype=torch.int8, device=dev)
    ent_sum = torch.zeros(B, device=dev)
    forwards = torch.ones(B, dtype=torch.long, device=dev)  # the prefill forward samples token 0
    hist = torch.zeros(B, K + 2, dtype=torch.long, device=dev)  # hist[b, m]: forwards that committed m tokens
    hist[:, 1] = 1
    n_drafted, n_accepted, n_relaxed = (torch.zeros(B, dtype=torch.long, device=dev) for _ in range(3))
    slots = torch.arange(K + 1, device=dev)
    offsets = slots[:K]  # 0 .. K - 1

    out = model.start(prompts, sc.uses_cfg)
    q0 = processed_probs(out.cond[:, -1], None if out.uncond is None else out.uncond[:, -1], sc)  # [B, V]
    buf[:, 0] = sample_from(q0, uniforms(gens, device=q0.device))
    ent_sum += entropy(q0)
    n = torch.ones(B, dtype=torch.long, device=dev)  # tokens committed per sample
    carried = torch.zeros(B, dtype=torch.long, device=dev)  # how many leading window slots hold carried-over drafts
    u_init = torch.stack([uniforms([g], K)[0] for g in gens])
    if drafter is not None:
        drafter.begin(out)
        p_draft = drafter.draft(buf, n, torch.full((B,), K, device=dev), u_init, K)
    else:
        buf = _fresh_drafts(buf, n, carried, K, cols, cfg.init, u_init, V)
        p_draft.zero_().scatter_(2, buf[ar[:, None], n[:, None] + offsets].unsqueeze(-1), 1.0)

    while (n < N).any():
        active = n < N
        act = active.nonzero().squeeze(1).tolist()  # who draws randomness this forward
        idx = (n - 1)[:, None] + slots  # [B, K+1] window indices, may run past N
        tokens = buf[ar[:, None], idx]
        out = model.step(tokens, idx)
        if drafter is not None:
            drafter.observe(out, idx)
        q = processed_probs(out.cond, out.uncond, sc)  # [B, K+1, V]
        # per-sample randomness, only for samples still decoding: accept K, resample 1, Jacobi K+1, init K
        u = torch.zeros(B, 3 * K + 2, device=dev)
        u[act] = uniforms([gens[b] for b in act], 3 * K + 2)
        u_acc, u_res, u_jac, u_init = u[:, :K], u[:, K], u[:, K + 1:2 * K + 2], u[:, 2 * K + 2:]
        drafts = tokens[:, 1:]  # [B, K]
        n_valid = (N - n).clamp(max=K)
        v = verify(drafts, p_draft, q, n_valid, u_acc, u_res, cfg.relax)
        if gumbel is not None:  # q[:, s] is the distribution of index idx[:, s] + 1
            jacobi = gumbel_sample(q, gumbel.rows((idx + 1).clamp(max=N + K), active))  # [B, K+1]
        else:
            jacobi = sample_from(q, u_jac)  # [B, K+1] the target's own sample at every window position
        # ---- statistics, vectorised over the batch
        n_acc = torch.where(active, v.n_accepted, 0)
        m = torch.where(active, torch.minimum(n_acc + 1, N - n), 0)  # tokens committed this forward
        pos = n[:, None] + slots  # [B, K+1] indices covered by this window
        relaxed = torch.cat([v.relaxed, torch.zeros_like(v.relaxed[:, :1])], 1)  # [B, K+1]
        kind = torch.where(relaxed, COMMIT_RELAXED, COMMIT_ACCEPTED).to(torch.int8)
        commit[ar[:, None], pos] = torch.where(slots < n_acc[:, None], kind, commit[ar[:, None], pos])
        last = torch.where(n_acc < n_valid, COMMIT_RESAMPLED, COMMIT_BONUS).to(torch.int8)
        at = (n + n_acc).clamp(max=N + K)
        commit[ar, at] = torch.where(n_acc < m, last, commit[ar, at])
        ent_sum += (entropy(q) * (slots < m[:, None])).sum(1)
        forwards += active.long()
        hist[ar, m] += active.long()
        n_drafted += torch.where(active, torch.minimum(n_acc + 1, n_valid), 0)
        n_accepted += n_acc
        n_relaxed += (v.relaxed & active[:, None]).sum(1)
        # ---- commit: accepted drafts are already in buf; write the resampled / bonus token
        pos_next = (n + n_acc).clamp(max=N + K)
        buf[ar, pos_next] = torch.where(active, v.next_token, buf[ar, pos_next])
        new_n = torch.where(active, (n + n_acc + 1).clamp(max=N), n)
        # ---- next window: carry the Jacobi samples after the commit point, top up with fresh drafts
        shift = n_acc + 1  # window slot j of the next window is slot j + shift of this q / jacobi
        src = (offsets[None, :] + shift[:, None]).clamp(max=K)  # [B, K]
        carry_ok = (offsets[None, :] + shift[:, None]) <= K
        carried = carry_ok.sum(1)
        widx = new_n[:, None] + offsets  # [B, K] indices of the next drafts
        new_tok = torch.where(carry_ok, jacobi.gather(1, src), 0)
        buf[ar[:, None], widx] = torch.where(active[:, None], new_tok, buf[ar[:, None], widx])
        q_src = q.gather(1, src.unsqueeze(-1).expand(B, K, V))
        if drafter is not None:
            fresh = torch.where(active, K - carried, 0)
            p_new = drafter.draft(buf, new_n + carried, fresh, u_init, K)  # slot o is window slot carried + o
            back = (offsets[None, :] - carried[:, None]).clamp(min=0)  # [B, K]
            fresh_p = p_new.gather(1, back.unsqueeze(-1).expand(B, K, V))
        else:
            buf = _fresh_drafts(buf, new_n, torch.where(active, carried, K), K, cols, cfg.init, u_init, V)
            fresh_p = torch.zeros_like(p_draft).scatter_(2, buf[ar[:, None], widx].unsqueeze(-1), 1.0)
        p_draft = torch.where(active[:, None, None], torch.where(carry_ok[..., None], q_src, fresh_p), p_draft)
        n = new_n

    stats = _stats(model.grid, commit[:, :N], hist, forwards, n_accepted, n_drafted, n_relaxed, ent_sum,
                   (time.perf_counter() - t0) / B,
                   {"window": cfg.window, "init": cfg.init if drafter is None else "heads", "coupled": cfg.coupled,
                    "lam": cfg.relax.lam, "delta": cfg.relax.delta})
    return DecodeResult(buf[:, :N].clone(), stats)


def _stats(grid, commit, hist, forwards, n_accepted, n_drafted, n_relaxed, ent_sum, seconds: float,
           extra: dict) -> list[SampleStats]:
    """Per-sample statistics from the decoder's counters, copied to the host once (not one sync per value)."""
    commit, hist, forwards, n_accepted, n_drafted, n_relaxed, ent_sum = (
        t.cpu() for t in (commit, hist, forwards, n_accepted, n_drafted, n_relaxed, ent_sum))
    N = grid[0] * grid[1]
    stats = []
    for b in range(commit.shape[0]):
        h = hist[b].tolist()
        while len(h) > 2 and h[-1] == 0:
            h.pop()
        stats.append(SampleStats(
            forwards=int(forwards[b]), tokens_per_forward_hist=h,
            acceptance_rate=float(n_accepted[b] / n_drafted[b]) if n_drafted[b] else float("nan"),
            commit_map=commit[b].numpy().reshape(grid), mean_entropy=float(ent_sum[b] / N),
            relaxed=int(n_relaxed[b]), seconds=seconds, extra=dict(extra)))
    return stats
