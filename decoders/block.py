"""The block decoder: SSD's auto-correcting block verification, reached only by naming `commit=block`. LOSSY: it
commits every drafted token of a block after r correction rounds, whether or not it was verified exactly, and
measured +1.7 nats/token against AR on the reference model, outside the fidelity tolerance (0.15), which breaks
images. The default SSD decoders (ssd, ssd+csd: commit=prefix) run the window loop (window.py) instead.

Per block and sample b, with n_b tokens committed (docs/algorithms.md §3):
  1. Draft the next `rows` raster rows (L_b <= rows * W tokens). Positions with a row above are drafted
     vertically, ĥ(t-1) = V(h(t-1-W), e(x_{t-1-W})), a whole row per wave, chaining V down the block;
     the rest (the first row of the image, or everything with `two_d=False`) horizontally,
     ĥ(t-1) = H(ĥ(t-2), e(x_{t-1})). Drafts are sampled from the processed distribution of the model's own
     norm + head applied to ĥ (both CFG branches), so p is known exactly (drafters.HeadsDrafter).
  2. Verify with up to r + 1 forwards (r auto-correction rounds). Each forward judges every position not yet
     exact: keep the draft or resample it from norm(max(0, q - p)) (verify_all). Everything before the first
     rejection, and the resampled first rejection itself, is now exact; the next round re-feeds from that
     first rejection, and the tokens after it (each now a sample from the last q) are judged again.
     A round with no rejection ends the block with a bonus token.
  3. Commit all L_b tokens (lossy after r rounds); the next forward re-feeds from the first position whose
     KV is stale.
Each sample advances by its own amount; KV caches are position-indexed, so re-feeding is the rollback.
A block's uniforms are keyed by (the sample's seed, its own block number, the block offset) (sampling.py): the
same for a sample alone or in any batch, whatever the batch's largest block.

The rows per block are fixed, or adapted per sample (`adaptive`, AdaptivePolicy), and capped by a token budget
(`token_budget`): when the batch alone fills the budget, the batch decodes as plain AR (`ar_fallback` says so).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from .ar import decode_ar
from .recipes import BlockConfig, Relaxation, SamplingConfig
from .drafters import Drafter, HeadsDrafter, SpatialHeads
from .protocol import ImageTokenModel, check_request
from .sampling import Purpose, Streams, model_device, prefill, processed_probs, sample_from
from .stats import DecodeResult, Tally
from .sample_stats import COMMIT_ACCEPTED, COMMIT_BONUS, COMMIT_RELAXED, COMMIT_RESAMPLED
from .verify import entropy, verify_all

BUDGET_FULL = "batch fills the token budget"  # why a budgeted batch decodes as plain AR (statistics)


def budget_rows(cfg: BlockConfig, batch: int, W: int) -> int:
    """Rows per sample that the batch's token budget allows (0: the batch alone fills the device)."""
    return cfg.token_budget // max(1, batch * W) if cfg.token_budget else cfg.max_rows


class AdaptivePolicy:
    """Rows drafted per block, per sample, bounded to [1, cap]:
      - content: after a block whose drafts were mostly kept (>= 75% of the block exact or accepted before
        the last round) and whose target entropy was low (mean normalised entropy < 0.5: smooth content),
        draft one more row; after a block with < 40% kept, or high entropy, one fewer;
      - compute headroom: cap = min(max_rows, token_budget // (batch * W)) when a budget is set, so a big
        batch, which already fills the device, speculates less; when not even one row per sample fits
        (cap 0), `decode_block` decodes the batch as plain AR, which is what a full device does best. A
        calibrated config arrives here resolved (calibrate.resolve): its chosen cap as max_rows.
    The rows chosen are recorded per block in the statistics (block_sizes)."""

    def __init__(self, cfg: BlockConfig, batch: int, W: int, device: torch.device | str = "cpu"):
        """device: the model's (rows per sample sit with the decoder's other per-sample tensors)."""
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


def _budget_full(model, prompts, seeds, sc) -> DecodeResult:
    """Plain AR for a batch that fills the token budget alone: speculation would only add work."""
    res = decode_ar(model, prompts, seeds, sc)
    for st in res.stats:
        st.extra = {"policy": f"ar: {BUDGET_FULL}"}
        st.ar_fallback = BUDGET_FULL
    return res


@torch.no_grad()
def decode_block(model: ImageTokenModel, prompts: list[str], seeds: list[int], sc: SamplingConfig,
                 cfg: BlockConfig, heads: SpatialHeads) -> DecodeResult:
    """The block decoder (module doc; lossy) with `heads`, or plain AR when the token budget leaves no rows."""
    check_request(model, prompts, seeds, sc.greedy, cfg.relax.active)
    W = model.grid[1]
    if budget_rows(cfg, len(prompts), W) == 0:
        return _budget_full(model, prompts, seeds, sc)
    t0 = time.perf_counter()
    dev = model_device(model)  # every buffer and key below lives on it
    streams = Streams(seeds, dev)
    B, N = len(prompts), model.grid[0] * W
    policy = AdaptivePolicy(cfg, B, W, device=dev)
    Lmax = policy.cap * W
    if Lmax >= 2 ** 16:  # the uniforms' counter holds a block's offset in its low 16 bits
        raise ValueError(f"SSD blocks of {Lmax} tokens are too long (at most 65,535); draft fewer rows")
    size = N + Lmax + 2  # index slots: the image, a block running past its end, the bonus's and a junk slot
    drafter = HeadsDrafter(model, heads, sc, cfg.two_d, B, size)
    tally = Tally(B, size, dev, cfg=sc.uses_cfg)
    buf = torch.zeros(B, size, dtype=torch.long, device=dev)  # committed tokens, then the block's drafts
    out, q0, buf[:, 0] = prefill(model, prompts, sc, streams)
    tally.ent_sum += entropy(q0)
    drafter.begin(out)
    _blocks(model, sc, cfg, streams, drafter, policy, buf, tally, N)
    fixed = {"rows": cfg.rows, "rounds": cfg.rounds, "lossless": False, "two_d": cfg.two_d, "adaptive": cfg.adaptive,
             "lam": cfg.relax.lam, "delta": cfg.relax.delta, "policy": "token budget" if cfg.token_budget else "fixed"}
    return DecodeResult(buf[:, :N].clone(), tally.stats(model.grid, (time.perf_counter() - t0) / B, fixed))


def _blocks(model, sc: SamplingConfig, cfg: BlockConfig, streams: Streams, drafter: Drafter,
            policy: "AdaptivePolicy", buf: torch.Tensor, tally: Tally, N: int) -> None:
    """Draft, verify and commit blocks (module doc, steps 1-3) until every sample holds N tokens in buf."""
    B, W, dev = buf.shape[0], model.grid[1], buf.device
    Lmax = policy.cap * W
    n = torch.ones(B, dtype=torch.long, device=dev)  # committed tokens
    feed = torch.zeros(B, dtype=torch.long, device=dev)  # first index whose KV is not current
    block = torch.zeros(B, dtype=torch.long, device=dev)  # blocks per sample: its uniforms' counter
    offsets = torch.arange(Lmax, device=dev)  # [Lmax]
    while (n < N).any():
        active = n < N
        L = torch.where(active, torch.minimum(N - n, policy.rows * W), 0)  # [B] block lengths
        # per sample and block offset: draft, then accept / resample per round, bonus (offset 0's last)
        u = streams.uniform(Purpose.SSD_BLOCK, block[:, None] * 2 ** 16 + offsets,
                            width=3 + 2 * (cfg.rounds + 1))  # [B, Lmax, 3 + 2 (rounds + 1)]
        block = block + active.long()  # finished samples' numbers are never used
        p = drafter.draft(buf, n, torch.zeros_like(n), L, u[:, :, 0])  # [B, Lmax, V]
        original = buf.clone()  # the drafts: a committed token that differs from its draft was resampled
        blk = _Block.start(n, L, p, feed)
        for rnd in range(cfg.rounds + 1):
            _round(model, sc, cfg.relax, drafter, buf, blk, tally, u[:, :, 1 + 2 * rnd], u[:, :, 2 + 2 * rnd])
            if blk.done.all():
                break
        n, feed = _commit(blk, buf, original, u[:, 0, -1], tally, policy, N)


@dataclass
class _Block:
    """One block's verification state, per sample (docs/algorithms.md §3, steps 2 and 3)."""
    n: torch.Tensor  # [B] tokens committed before the block: its first index
    L: torch.Tensor  # [B] its length (0 for a finished sample)
    p: torch.Tensor  # [B, Lmax, V] what each position's current token was drawn from
    q: torch.Tensor  # [B, Lmax + 1, V] the latest target distribution at each offset, and the bonus's
    feed: torch.Tensor  # [B] the next forward feeds from this index (its KV onwards is stale)
    exact_to: torch.Tensor  # [B] offsets < exact_to are exact
    done: torch.Tensor  # [B] bool: no further round (converged, or not decoding)
    relaxed: torch.Tensor  # [B, Lmax] bool: kept only thanks to CSD's relaxation
    rounds: torch.Tensor  # [B] forwards spent on the block

    @classmethod
    def start(cls, n: torch.Tensor, L: torch.Tensor, p: torch.Tensor, feed: torch.Tensor) -> "_Block":
        """A freshly drafted block: nothing exact yet, finished samples (L = 0) already done."""
        B, Lmax, V = p.shape
        return cls(n=n, L=L, p=p, q=torch.zeros(B, Lmax + 1, V, device=p.device), feed=feed,
                   exact_to=torch.zeros_like(n), done=L == 0,
                   relaxed=torch.zeros(B, Lmax, dtype=torch.bool, device=p.device), rounds=torch.zeros_like(n))

    @property
    def offsets(self) -> torch.Tensor:
        return torch.arange(self.p.shape[1], device=self.n.device)[None, :]  # [1, Lmax]

    @property
    def in_block(self) -> torch.Tensor:
        return self.offsets < self.L[:, None]  # [B, Lmax]


def _round(model: ImageTokenModel, sc: SamplingConfig, relax: Relaxation, drafter: Drafter, buf: torch.Tensor,
           blk: _Block, tally: Tally, ua: torch.Tensor, ur: torch.Tensor) -> None:
    """One verification forward of the block (ua, ur [B, Lmax]: accept and resample uniforms): feed
    [feed_b, n_b + L_b - 1], judge every position not yet exact, keep each draft or resample it (verify_all)."""
    n, L, done, slot, V = blk.n, blk.L, blk.done, blk.offsets, blk.q.shape[-1]
    rows = torch.arange(len(n), device=n.device)[:, None]
    # done samples feed one junk token past their block
    start = torch.where(done, n + L + 1, blk.feed)
    end = torch.where(done, n + L + 1, n + L - 1)
    S = int((end - start).max()) + 1
    idx = start[:, None] + torch.arange(S, device=n.device)[None, :]  # [B, S]; the pad past `end` is junk
    out = model.step(buf[rows, idx.clamp(max=buf.shape[1] - 1)], idx)
    tally.forwards += (~done).long()
    tally.fed += (~done).long() * S  # the batch's padded width is what the model computes for each row
    blk.rounds += (~done).long()
    drafter.observe(out, idx, (idx <= end[:, None]) & ~done[:, None])
    q = processed_probs(out.cond, out.uncond, sc)  # [B, S, V]: q[:, s] is for index idx[:, s] + 1
    # block offset o needs the output at input index n + o - 1
    offs = torch.arange(blk.q.shape[1], device=n.device)[None, :]  # block offsets and the bonus's
    src = (n[:, None] - 1 + offs - start[:, None]).clamp(0, S - 1)
    fresh = (n[:, None] - 1 + offs >= start[:, None]) & ~done[:, None]
    blk.q = torch.where(fresh[..., None], q.gather(1, src[..., None].expand(-1, -1, V)), blk.q)
    q_blk = blk.q[:, :slot.shape[1]]  # [B, Lmax, V]
    judge = blk.in_block & (slot >= blk.exact_to[:, None]) & ~done[:, None]
    cur = buf[rows, n[:, None] + slot]  # [B, Lmax]
    new, rejected, relaxed = verify_all(cur, blk.p, q_blk, judge, ua, ur, relax)
    buf[rows, n[:, None] + slot] = torch.where(blk.in_block, new, cur)
    blk.relaxed |= relaxed
    blk.p = torch.where(judge[..., None], q_blk, blk.p)  # judged tokens are now samples from q
    first = torch.where(rejected.any(1), rejected.float().argmax(1), L)  # first rejection, or L
    newly_done = ~done & (first >= L)
    blk.exact_to = torch.where(~done, torch.minimum(first + 1, L), blk.exact_to)
    blk.feed = torch.where(~done, n + first, blk.feed)  # re-feed from the first rejection
    blk.done = done | newly_done


def _commit(blk: _Block, buf: torch.Tensor, original: torch.Tensor, ub: torch.Tensor, tally: Tally,
            policy: "AdaptivePolicy", N: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Commit the block (lossy), with a bonus token where the last round rejected nothing; record it; let the
    policy adapt the rows. ub [B]: the bonus uniforms. -> (committed tokens [B], the next feed index [B])."""
    n, L, slot, V = blk.n, blk.L, blk.offsets, blk.q.shape[-1]
    rows = torch.arange(len(n), device=n.device)
    active = L > 0
    converged = active & blk.done & (blk.exact_to >= L)  # the last forward rejected nothing: a bonus exists
    bonus_ok = converged & (n + L < N)
    bonus = sample_from(blk.q.gather(1, L.view(-1, 1, 1).expand(-1, 1, V)).squeeze(1), ub)
    at = (n + L).clamp(max=buf.shape[1] - 1)  # the bonus's index
    buf[rows, at] = torch.where(bonus_ok, bonus, buf[rows, at])
    take = torch.where(active, L, 0)  # tokens committed from the block (lossy)
    committed = slot < take[:, None]  # [B, Lmax]
    changed = (buf != original)[rows[:, None], n[:, None] + slot]  # [B, Lmax]: resampled in some round
    kinds = torch.where(changed, COMMIT_RESAMPLED, torch.where(blk.relaxed, COMMIT_RELAXED, COMMIT_ACCEPTED))
    tally.mark((n[:, None] + slot).clamp(max=buf.shape[1] - 1), kinds.to(torch.int8), committed)
    tally.mark(at, COMMIT_BONUS, bonus_ok)
    ents = entropy(blk.q[:, :slot.shape[1]])  # [B, Lmax]
    tally.ent_sum += (ents * committed).sum(1) + torch.where(bonus_ok, entropy(blk.q[rows, L]), 0)
    tally.drafted += torch.where(active, L, 0)
    tally.accepted += (~changed & committed).sum(1)
    tally.relaxed += (blk.relaxed & committed).sum(1)
    tally.block(active.nonzero().squeeze(1).tolist(), L, blk.rounds)
    kept = torch.where(active, (~changed & blk.in_block).sum(1), 0)
    h_norm = (ents / math.log(V) * blk.in_block).sum(1) / L.clamp(min=1)
    policy.update(kept / L.clamp(min=1), h_norm, active)
    new_n = n + take + bonus_ok.long()
    feed = torch.where(active, torch.where(converged, new_n - 1, blk.feed), blk.feed)
    return torch.where(active, new_n.clamp(max=N), n), feed
