"""Spatially speculative decoding (SSD): 2D block drafting with latent heads, auto-correcting verification.

Per block and sample b, with n_b tokens committed (docs/algorithms.md §3):
  1. Draft the next `rows` raster rows (L_b <= rows * W tokens). Positions with a row above are drafted
     vertically, ĥ(t-1) = V(h(t-1-W), e(x_{t-1-W})), a whole row per wave, chaining V down the block;
     the rest (the first row of the image, or everything with `two_d=False`) horizontally,
     ĥ(t-1) = H(ĥ(t-2), e(x_{t-1})). Drafts are sampled from the processed distribution of the model's own
     norm + head applied to ĥ (both CFG branches), so p is known exactly.
  2. Verify with up to r + 1 forwards (r auto-correction rounds). Each forward judges every position not yet
     exact: keep the draft or resample it from norm(max(0, q - p)) (verify_all). Everything before the first
     rejection, and the resampled first rejection itself, is now exact; the next round re-feeds from that
     first rejection, and the tokens after it (each now a sample from the last q) are judged again.
     A round with no rejection ends the block with a bonus token.
  3. Commit all L_b tokens (lossy after r rounds); the next forward re-feeds from the first position whose
     KV is stale.
Each sample advances by its own amount; KV caches are position-indexed, so re-feeding is the rollback.

`commit="prefix"` commits only the verified raster prefix: SJD semantics with SSD drafts (`lossless=True` is
this engine without CSD's relaxation; with it, CSD's TV-filtered relaxation applies to every judgement). It runs the SJD
engine over a sliding window of `rows` rows, whose tail is topped up with the heads' 2D drafts and whose
other positions carry Gumbel-coupled Jacobi updates (sjd.py): what a block verifies but cannot yet commit
is kept for the next forward instead of being drafted again. `rounds`, `adaptive` and the token budget
belong to the block decoder and do not apply.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import torch

from .ar import decode_ar
from .configs import SSDConfig
from .cost_curve import best_rows, cost_curve_for
from .protocol import ImageTokenModel, check_request
from .sampling import SamplingConfig, make_generators, model_device, processed_probs, sample_from, uniforms
from .sjd import SJDConfig, decode_sjd
from .ssd_heads import SpatialHeads
from .stats import (COMMIT_ACCEPTED, COMMIT_AR, COMMIT_BONUS, COMMIT_RELAXED, COMMIT_RESAMPLED, DecodeResult,
                    SampleStats)
from .verify import Relaxation, entropy, verify_all


def budget_rows(cfg: SSDConfig, batch: int, W: int) -> int:
    """Rows per sample that the batch's token budget allows (0: the batch alone fills the device)."""
    return cfg.token_budget // max(1, batch * W) if cfg.token_budget else cfg.max_rows


class AdaptivePolicy:
    """Rows drafted per block, per sample, bounded to [1, cap]:
      - calibrated: cap = the rows that maximise expected committed tokens per second on this device at this
        batch size (cost_curve.best_rows); with 0, `decode_ssd` decodes the batch as plain AR;
      - content: after a block whose drafts were mostly kept (>= 75% of the block exact or accepted before
        the last round) and whose target entropy was low (mean normalised entropy < 0.5: smooth content),
        draft one more row; after a block with < 40% kept, or high entropy, one fewer;
      - otherwise, compute headroom: cap = min(max_rows, token_budget // (batch * W)) when a budget is set, so a big
        batch, which already fills the device, speculates less; when not even one row per sample fits
        (cap 0), `decode_ssd` decodes the batch as plain AR, which is what a full device does best.
    The rows chosen are recorded per block in the statistics (block_sizes)."""

    def __init__(self, cfg: SSDConfig, batch: int, W: int, cap: int | None = None, device: torch.device | str = "cpu"):
        """cap: rows chosen from the device's cost curve (calibrated), overriding the budget's cap. device: the
        model's (rows per sample sit with the decoder's other per-sample tensors)."""
        if cap is None:
            cap = cfg.max_rows if cfg.adaptive else cfg.rows
            if cfg.token_budget:
                cap = max(1, min(cap, budget_rows(cfg, batch, W)))
        self.cap, self.adaptive = cap, cfg.adaptive
        self.rows = torch.full((batch,), min(cfg.rows, cap), dtype=torch.long, device=device)

    def update(self, kept_frac: torch.Tensor, norm_entropy: torch.Tensor, active: torch.Tensor) -> None:
        if not self.adaptive:
            return
        up = (kept_frac >= 0.75) & (norm_entropy < 0.5)
        down = (kept_frac < 0.4) | (norm_entropy >= 0.8)
        step = up.long() - (down & ~up).long()
        self.rows = torch.where(active, (self.rows + step).clamp(1, self.cap), self.rows)


class _Drafter:
    """Drafts a block per sample with the heads; hb[b, i + 1] holds the best-known hidden state at index i
    (h(-1) = the prompt's last position), conditional and unconditional."""

    def __init__(self, model, heads: SpatialHeads, sc: SamplingConfig, two_d: bool):
        self.model, self.heads, self.sc, self.two_d = model, heads, sc, two_d
        self.W = model.grid[1]

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

    def draft(self, buf, hb, hbu, n, L, u, buf_len: int):
        """Fill buf[b, n_b:n_b+L_b] with drafts; return their draft distributions p [B, Lmax, V]."""
        B, V, W, dev = buf.shape[0], self.model.n_codes, self.W, buf.device
        wave = self.waves(n.cpu().numpy(), L.cpu().numpy())  # the schedule is planned on the host
        p = torch.zeros(B, buf_len, V, device=dev)
        for w in range(int(wave.max()) + 1):
            bs, os_ = np.nonzero(wave == w)
            bs_t, os_t = torch.from_numpy(bs).to(dev), torch.from_numpy(os_).to(dev)
            t = n[bs_t] + os_t  # draft positions
            vertical = (t - 1 - W >= 0) & self.two_d
            src = torch.where(vertical, t - 1 - W, t - 2)  # index of the source hidden state
            tok_at = torch.where(vertical, t - 1 - W, t - 1)  # index of the source token
            head = (self.heads.vertical, self.heads.horizontal)
            e = self.model.embed(buf[bs_t, tok_at][None], tok_at[None])[0]  # [P, E]
            out_c = torch.where(vertical[:, None], head[0](hb[bs_t, src + 1], e), head[1](hb[bs_t, src + 1], e))
            # ĥ(t - 1), at slot t. Token heads (the ablation) predict no hidden state: a chained draft reuses
            # its source's hidden state with the new token's embedding.
            latent = self.heads.cfg.kind == "latent"
            hb[bs_t, t] = out_c if latent else hb[bs_t, src + 1]
            logits_u = None
            if hbu is not None:
                out_u = torch.where(vertical[:, None], head[0](hbu[bs_t, src + 1], e),
                                    head[1](hbu[bs_t, src + 1], e))
                hbu[bs_t, t] = out_u if latent else hbu[bs_t, src + 1]
                logits_u = self.heads.draft_logits(self.model, out_u)
            probs = processed_probs(self.heads.draft_logits(self.model, out_c), logits_u, self.sc)  # [P, V]
            buf[bs_t, t] = sample_from(probs, u[bs_t, os_t])
            p[bs_t, os_t] = probs
        return p


class _WindowDrafter:
    """The heads as the SJD engine's source of fresh drafts (sjd.Drafter), for lossless SSD."""

    def __init__(self, model, heads: SpatialHeads, sc: SamplingConfig, two_d: bool, B: int, size: int):
        dev = model_device(model)
        self.drafter = _Drafter(model, heads, sc, two_d)
        self.hb = torch.zeros(B, size, model.hidden_dim, device=dev)  # slot i + 1: best-known hidden at index i
        self.hbu = torch.zeros_like(self.hb) if sc.uses_cfg else None
        self.ar = torch.arange(B, device=dev)

    def begin(self, out) -> None:
        self.hb[:, 0] = out.hidden[:, -1]
        if self.hbu is not None:
            self.hbu[:, 0] = out.hidden_uncond[:, -1]

    def observe(self, out, idx: torch.Tensor) -> None:
        slot = (idx + 1).clamp(max=self.hb.shape[1] - 1)  # [B, S]
        self.hb[self.ar[:, None], slot] = out.hidden
        if self.hbu is not None:
            self.hbu[self.ar[:, None], slot] = out.hidden_uncond

    def draft(self, buf, start, count, u, K: int) -> torch.Tensor:
        return self.drafter.draft(buf, self.hb, self.hbu, start, count, u, K)


def _decode_prefix(model, prompts, seeds, sc, heads, cfg: SSDConfig) -> DecodeResult:
    W = model.grid[1]
    window = min(64, cfg.rows * W + 1)  # the last committed token + `rows` rows of drafts
    N = model.grid[0] * W
    drafter = _WindowDrafter(model, heads, sc, cfg.two_d, len(prompts), N + window + 2)
    res = decode_sjd(model, prompts, seeds, sc, SJDConfig(window=window, coupled=True, relax=cfg.relax),
                     drafter=drafter)
    for st in res.stats:
        st.extra |= {"rows": cfg.rows, "lossless": not cfg.relax.active, "commit": "prefix", "two_d": cfg.two_d,
                     "block_sizes": [], "rounds_per_block": [], "lam": cfg.relax.lam, "delta": cfg.relax.delta}
    return res


@torch.no_grad()
def decode_ssd(model: ImageTokenModel, prompts: list[str], seeds: list[int], sc: SamplingConfig,
               heads: SpatialHeads, cfg: SSDConfig = SSDConfig()) -> DecodeResult:
    check_request(model, prompts, seeds, sc.greedy, cfg.relax.active)
    if cfg.prefix_engine:
        return _decode_prefix(model, prompts, seeds, sc, heads, cfg)
    cap, plan = _plan_rows(model, prompts, sc, cfg)
    if cap == 0:
        res = decode_ar(model, prompts, seeds, sc)  # no headroom: speculation would only add work
        for st in res.stats:
            st.extra = {"block_sizes": [], "rounds_per_block": []} | plan
        return res
    t0 = time.perf_counter()
    dev = model_device(model)  # every buffer and generator below lives on it
    gens = make_generators(seeds, dev)
    B, (H, W) = len(prompts), model.grid
    policy = AdaptivePolicy(cfg, B, W, cap if cfg.calibrated else None, device=dev)
    N, V, Lmax = H * W, model.n_codes, policy.cap * W
    ar = torch.arange(B, device=dev)
    drafter = _Drafter(model, heads, sc, cfg.two_d)

    spare = Lmax + 2
    buf = torch.zeros(B, N + spare, dtype=torch.long, device=dev)
    commit = torch.full((B, N + spare), COMMIT_AR, dtype=torch.int8, device=dev)
    hb = torch.zeros(B, N + spare, model.hidden_dim, device=dev)  # slot i + 1: hidden at index i
    hbu = torch.zeros_like(hb) if sc.uses_cfg else None
    forwards = torch.ones(B, dtype=torch.long, device=dev)
    ent_sum = torch.zeros(B, device=dev)
    n_drafted, n_accepted, n_relaxed = (torch.zeros(B, dtype=torch.long, device=dev) for _ in range(3))
    blocks: list[list[int]] = [[] for _ in range(B)]
    rounds_used: list[list[int]] = [[] for _ in range(B)]

    out = model.start(prompts, sc.uses_cfg)
    hb[:, 0] = out.hidden[:, -1]
    if hbu is not None:
        hbu[:, 0] = out.hidden_uncond[:, -1]
    q0 = processed_probs(out.cond[:, -1], None if out.uncond is None else out.uncond[:, -1], sc)
    buf[:, 0] = sample_from(q0, uniforms(gens, device=dev))
    ent_sum += entropy(q0)
    n = torch.ones(B, dtype=torch.long, device=dev)  # committed tokens
    feed = torch.zeros(B, dtype=torch.long, device=dev)  # first index whose KV is not current
    slot = torch.arange(Lmax, device=dev)[None, :]  # block offsets
    offs = torch.arange(Lmax + 1, device=dev)[None, :]  # block offsets and the bonus's

    while (n < N).any():
        active = n < N
        act = active.nonzero().squeeze(1).tolist()
        L = torch.where(active, torch.minimum(N - n, policy.rows * W), 0)
        u = torch.zeros(B, Lmax, 3 + 2 * (cfg.rounds + 1), device=dev)  # draft, then accept/resample per round, bonus
        u[act] = uniforms([gens[b] for b in act], Lmax, u.shape[-1])
        p = drafter.draft(buf, hb, hbu, n, L, u[:, :, 0], Lmax)  # [B, Lmax, V]
        original = buf[:, :N + spare].clone()
        in_block = slot < L[:, None]
        exact_to = torch.zeros(B, dtype=torch.long, device=dev)  # block offsets < exact_to are exact
        done = ~active
        q_blk = torch.zeros(B, Lmax + 1, V, device=dev)
        relaxed_blk = torch.zeros(B, Lmax, dtype=torch.bool, device=dev)
        r_used = torch.zeros(B, dtype=torch.long, device=dev)
        for rnd in range(cfg.rounds + 1):
            # feed [feed_b, n_b + L_b - 1]; done samples feed one junk token past their block
            start = torch.where(done, n + L + 1, feed)
            end = torch.where(done, n + L + 1, n + L - 1)
            S = int((end - start).max()) + 1
            # [B, S]; the pad past `end` is junk, never attended
            idx = start[:, None] + torch.arange(S, device=dev)[None, :]
            out = model.step(buf[ar[:, None], idx.clamp(max=N + spare - 1)], idx)
            forwards += (~done).long()
            r_used += (~done).long()
            valid = (idx <= end[:, None]) & ~done[:, None]
            hb[ar[:, None], (idx + 1).clamp(max=N + spare - 1)] = torch.where(
                valid[..., None], out.hidden, hb[ar[:, None], (idx + 1).clamp(max=N + spare - 1)])
            if hbu is not None:
                hbu[ar[:, None], (idx + 1).clamp(max=N + spare - 1)] = torch.where(
                    valid[..., None], out.hidden_uncond, hbu[ar[:, None], (idx + 1).clamp(max=N + spare - 1)])
            q = processed_probs(out.cond, out.uncond, sc)  # [B, S, V]: q[:, s] is for index idx[:, s] + 1
            # block offset o needs the output at input index n + o - 1
            src = (n[:, None] - 1 + offs - start[:, None]).clamp(0, S - 1)
            fresh = (n[:, None] - 1 + offs >= start[:, None]) & ~done[:, None]
            q_blk = torch.where(fresh[..., None], q.gather(1, src[..., None].expand(-1, -1, V)), q_blk)
            judge = in_block & (slot >= exact_to[:, None]) & ~done[:, None]
            cur = buf[ar[:, None], n[:, None] + slot]
            ua = u[:, :, 1 + 2 * rnd]
            ur = u[:, :, 2 + 2 * rnd]
            new, rejected, relaxed = verify_all(cur, p, q_blk[:, :Lmax], judge, ua, ur, cfg.relax)
            buf[ar[:, None], n[:, None] + slot] = torch.where(in_block, new, cur)
            relaxed_blk |= relaxed
            p = torch.where(judge[..., None], q_blk[:, :Lmax], p)  # judged tokens are now samples from q
            first = torch.where(rejected.any(1), rejected.float().argmax(1), L)  # first rejection, or L
            newly_done = ~done & (first >= L)
            exact_to = torch.where(~done, torch.minimum(first + 1, L), exact_to)
            feed = torch.where(~done, n + first, feed)  # re-feed from the first rejection
            done = done | newly_done
            if done.all():
                break
        # ---- commit
        converged = active & done & (exact_to >= L)  # the last forward rejected nothing: a bonus exists
        bonus_ok = converged & (n + L < N)
        ub = u[:, 0, -1]
        bonus = sample_from(q_blk.gather(1, L.view(B, 1, 1).expand(B, 1, V)).squeeze(1), ub)
        at = (n + L).clamp(max=N + spare - 1)  # the bonus's index
        buf[ar, at] = torch.where(bonus_ok, bonus, buf[ar, at])
        take = torch.where(active, L, 0)  # tokens committed from the block (lossy)
        changed = buf[:, :N + spare] != original
        kinds = torch.where(changed[ar[:, None], n[:, None] + slot], COMMIT_RESAMPLED,
                            torch.where(relaxed_blk, COMMIT_RELAXED, COMMIT_ACCEPTED)).to(torch.int8)
        pos = (n[:, None] + slot).clamp(max=N + spare - 1)
        commit[ar[:, None], pos] = torch.where(slot < take[:, None], kinds, commit[ar[:, None], pos])
        commit[ar, at] = torch.where(bonus_ok, torch.tensor(COMMIT_BONUS, dtype=torch.int8, device=dev), commit[ar, at])
        ents = entropy(q_blk[:, :Lmax])
        ent_sum += (ents * (slot < take[:, None])).sum(1) + torch.where(bonus_ok, entropy(q_blk[ar, L]), 0)
        n_drafted += torch.where(active, L, 0)
        n_accepted += ((~changed[ar[:, None], n[:, None] + slot]) & (slot < take[:, None])).sum(1)
        n_relaxed += (relaxed_blk & (slot < take[:, None])).sum(1)
        L_host, r_host = L.tolist(), r_used.tolist()  # one transfer each, not one per sample
        for b in act:
            blocks[b].append(L_host[b])
            rounds_used[b].append(r_host[b])
        kept = torch.where(active, (~changed[ar[:, None], n[:, None] + slot] & in_block).sum(1), 0)
        h_norm = (ents / math.log(V) * in_block).sum(1) / L.clamp(min=1)
        policy.update(kept / L.clamp(min=1), h_norm, active)
        new_n = n + take + bonus_ok.long()
        feed = torch.where(active, torch.where(converged, new_n - 1, feed), feed)
        n = torch.where(active, new_n.clamp(max=N), n)

    _note_forwards_per_block(model, rounds_used)
    fixed = {"rows": cfg.rows, "rounds": cfg.rounds, "lossless": False, "two_d": cfg.two_d, "adaptive": cfg.adaptive,
             "lam": cfg.relax.lam, "delta": cfg.relax.delta} | plan
    stats = _stats(model.grid, commit[:, :N], (forwards, n_accepted, n_drafted, n_relaxed, ent_sum), blocks,
                   rounds_used, (time.perf_counter() - t0) / B, fixed)
    return DecodeResult(buf[:, :N].clone(), stats)


def _stats(grid, commit, counters, blocks: list[list[int]], rounds_used: list[list[int]], seconds: float,
           fixed: dict) -> list[SampleStats]:
    """Per-sample statistics; the device counters are copied to the host once, not one sync per value."""
    commit = commit.cpu().numpy()
    forwards, n_accepted, n_drafted, n_relaxed, ent_sum = (t.cpu() for t in counters)
    N, stats = grid[0] * grid[1], []
    for b in range(commit.shape[0]):
        stats.append(SampleStats(
            forwards=int(forwards[b]), tokens_per_forward_hist=_hist(blocks[b], rounds_used[b]),
            acceptance_rate=float(n_accepted[b] / n_drafted[b]) if n_drafted[b] else float("nan"),
            commit_map=commit[b].reshape(grid), mean_entropy=float(ent_sum[b] / N),
            relaxed=int(n_relaxed[b]), seconds=seconds,
            extra={"block_sizes": blocks[b], "rounds_per_block": rounds_used[b]} | fixed))
    return stats


def _plan_rows(model, prompts, sc: SamplingConfig, cfg: SSDConfig) -> tuple[int, dict]:
    """(the batch's cap on rows per block, 0 = plain AR; and what decided it, for the statistics)."""
    W = model.grid[1]
    if not cfg.calibrated:
        cap = budget_rows(cfg, len(prompts), W)
        return cap, {"policy": "ar: batch fills the token budget" if cap == 0 else "token budget" if
                     cfg.token_budget else "fixed"}
    curve = cost_curve_for(model, prompts, sc.uses_cfg, cfg.max_rows * W)
    fpb = model.__dict__.get("_ssd_forwards_per_block", cfg.rounds + 1.0)  # no history yet: the worst case
    cap, rates = best_rows(curve, W, cfg.max_rows, fpb)
    policy = "ar: plain AR is faster on this device at this batch size" if cap == 0 else "cost curve"
    return cap, {"policy": policy, "rows_cap": cap, "forwards_per_block_estimate": fpb,
                 "expected_tokens_per_s": rates, "cost_curve": curve.to_dict()}


def _note_forwards_per_block(model, rounds_used: list[list[int]]) -> None:
    """The running mean of forwards per block that the next batch's plan uses (kept on the model object)."""
    blocks = [r for per in rounds_used for r in per]
    if blocks:
        old = model.__dict__.get("_ssd_forwards_per_block")
        new = float(np.mean(blocks))
        model.__dict__["_ssd_forwards_per_block"] = new if old is None else 0.7 * old + 0.3 * new


def _hist(blocks: list[int], rounds: list[int]) -> list[int]:
    """Tokens per forward, spreading each block's tokens over its forwards (prefill counted as 1 token)."""
    h = [0, 1]
    for size, r in zip(blocks, rounds):
        k = max(1, round(size / max(1, r)))
        h += [0] * (k + 1 - len(h))
        h[k] += r
    return h
