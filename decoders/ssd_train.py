"""Self-distillation of SSD's spatial heads on the frozen backbone's own generations.

1. Sample images from the backbone with CFG (plain AR, the sampling config users decode with).
2. One teacher-forced pass over each image gives the pre-norm hidden states h(i) of both CFG branches.
3. Train the heads on (h(i), e(x_{i+1})) -> h(i+1) and (h(i), e(x_i)) -> h(i+W): a regression in latent
   space (MSE, scaled by the mean square of h) plus a KL term through the backbone's frozen norm + head
   that asks the drafted distribution to match the backbone's. Token heads (the ablation) train on the
   KL term alone.
The backbone is never updated. It may be bf16 (a GPU checkpoint): its hidden states are kept in its dtype
(half the memory), the heads and the losses are fp32 (drafters.py).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from tqdm import tqdm

from .ar import decode_ar
from .sampling import processed_probs
from .recipes import SamplingConfig
from .drafters import HeadsConfig, SpatialHeads, model_fingerprint


@dataclass(frozen=True)
class DistillConfig:
    n_images: int = 2048
    sample_batch: int = 64
    steps: int = 1500
    batch: int = 2048  # (position, branch) pairs per step and head
    lr: float = 2e-3
    kl_weight: float = 1.0
    seed: int = 0
    kind: str = "latent"
    rollout: int = 1  # chained steps per training pair: the head learns from its own predictions (below)

    def __post_init__(self):
        if self.rollout < 1:
            raise ValueError(f"rollout must be >= 1, got {self.rollout}")

    def check_grid(self, grid: tuple[int, int]) -> None:
        """The vertical head's chain of `rollout` rows must fit the grid: checked before any sampling."""
        if grid[0] * grid[1] - 1 - self.rollout * grid[1] < 1:
            raise ValueError(f"rollout {self.rollout} chains the vertical head past a {tuple(grid)} grid")


@torch.no_grad()
def teacher_forced(model, prompts: list[str], seeds: list[int], sc: SamplingConfig):
    """The backbone's own samples and one teacher-forced pass over them: (StepOutput over indices 0..N-2,
    whose hidden [B, N-1, D] at index i gives x_{i+1}; input embeddings e [B, N, E] of all N tokens)."""
    N, B = model.grid[0] * model.grid[1], len(prompts)
    tokens = decode_ar(model, prompts, seeds, sc).tokens  # [B, N], on the model's device
    index = torch.arange(N, device=tokens.device).expand(B, N)
    model.start(prompts, sc.uses_cfg)
    out = model.step(tokens[:, :-1], index[:, :-1])
    return out, model.embed(tokens, index)


@torch.no_grad()
def collect(model, prompts: list[str], sc: SamplingConfig, dc: DistillConfig) -> dict[str, torch.Tensor]:
    """Sample images and gather (hidden, embedding) tensors for both branches: h [M, N-1, D], e [M, N, E]."""
    hs, es = [], []
    for i in tqdm(range(0, len(prompts), dc.sample_batch), desc="self-distillation data", unit="batch"):
        batch = prompts[i:i + dc.sample_batch]
        out, e = teacher_forced(model, batch, [dc.seed * 1_000_003 + i + j for j in range(len(batch))], sc)
        hs.append(out.hidden)
        es.append(e)
        if out.hidden_uncond is not None:  # the heads also draft the unconditional branch
            hs.append(out.hidden_uncond)
            es.append(e)
    return {"h": torch.cat(hs), "e": torch.cat(es)}


def _rollout_loss(model, heads: SpatialHeads, head, h: torch.Tensor, e: torch.Tensor, m: torch.Tensor,
                  i: torch.Tensor, off: int, e_off: int, dc: DistillConfig, scale: torch.Tensor) -> torch.Tensor:
    """The loss of one head on pairs (m, i) [batch], chained dc.rollout times as the decoder chains it: step r
    maps the previous step's prediction (the exact h(i) first) and e(x_{i + r·off + e_off}) to h(i + (r+1)·off).
    Chaining in training (EAGLE-3's training-time test) lets a head learn to correct its own errors; with
    rollout 1 it is plain teacher forcing. Token heads chain by reusing the source state, as the drafter does."""
    src, total = h[m, i], 0.0
    for r in range(dc.rollout):
        target = h[m, i + (r + 1) * off]  # [batch, D], the backbone's dtype
        out = head(src, e[m, i + r * off + e_off])  # [batch, D or V], fp32
        with torch.no_grad():
            p_t = F.softmax(model.logits_from_hidden(target).float(), -1)
        logp = F.log_softmax(heads.draft_logits(model, out).float(), -1)
        kl = F.kl_div(logp, p_t, reduction="batchmean")
        latent = heads.cfg.kind == "latent"
        mse = F.mse_loss(out, target.float()) / scale if latent else torch.zeros((), device=out.device)
        total = total + mse + dc.kl_weight * kl
        src = out if latent else src
    return total / dc.rollout


def train_heads(model, prompts: list[str], sc: SamplingConfig = SamplingConfig(),
                dc: DistillConfig = DistillConfig(), log=print,
                data: dict[str, torch.Tensor] | None = None) -> tuple[SpatialHeads, dict]:
    """Self-distil heads of kind dc.kind on the frozen model's samples of `prompts`. `data` is `collect`'s
    result when the caller already has it (latent and token heads can learn from one set of samples)."""
    dc.check_grid(model.grid)
    t0 = time.perf_counter()
    for part in vars(model).values():  # the backbone is frozen: gradients flow through it to the heads only
        if isinstance(part, torch.nn.Module):
            part.requires_grad_(False)
    if data is None:
        data = collect(model, prompts[:dc.n_images], sc, dc)
    t_collect = time.perf_counter() - t0
    h, e = data["h"], data["e"]  # [M, N-1, D], [M, N, E]
    M, W = h.shape[0], model.grid[1]
    cfg = HeadsConfig(dim=model.hidden_dim, emb_dim=e.shape[-1], n_codes=model.n_codes, grid=tuple(model.grid),
                      model=model_fingerprint(model), kind=dc.kind)
    torch.manual_seed(dc.seed)
    with torch.device(h.device):  # the heads train where the backbone and its hidden states live
        heads = SpatialHeads(cfg)
    opt = torch.optim.AdamW(heads.parameters(), lr=dc.lr, weight_decay=0.0)
    scale = h.float().pow(2).mean()
    gen = torch.Generator(device=h.device).manual_seed(dc.seed)  # the pairs each step trains on
    # pair index sets: horizontal i in [0, N-3] (target h(i+1) exists), vertical i in [0, N-2-W]
    n_h, n_v = h.shape[1] - 1, h.shape[1] - W
    bar = tqdm(range(dc.steps), desc="heads", unit="step")
    for step in bar:
        lr = dc.lr * 0.5 * (1 + math.cos(math.pi * step / dc.steps))
        for g in opt.param_groups:
            g["lr"] = lr
        losses = {}
        for name, head, n_pos, off, e_off in (("h", heads.horizontal, n_h, 1, 1), ("v", heads.vertical, n_v, W, 0)):
            m = torch.randint(0, M, (dc.batch,), generator=gen, device=h.device)
            i = torch.randint(0, n_pos - (dc.rollout - 1) * off, (dc.batch,), generator=gen, device=h.device)
            losses[name] = _rollout_loss(model, heads, head, h, e, m, i, off, e_off, dc, scale)
        loss = losses["h"] + losses["v"]
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % 20 == 0:
            bar.set_postfix(h=f"{losses['h'].item():.3f}", v=f"{losses['v'].item():.3f}")
    info = {"n_images": len(prompts[:dc.n_images]), "pairs": int(M * (n_h + n_v)), "rollout": dc.rollout,
            "collect_s": t_collect, "total_s": time.perf_counter() - t0, "params": heads.n_params(),
            "flops_per_token_per_head": heads.flops_per_token()}
    return heads.eval(), info


@torch.no_grad()
def draft_acceptance(model, heads: SpatialHeads, prompts: list[str], seeds: list[int],
                     sc: SamplingConfig = SamplingConfig()) -> dict[str, float]:
    """How well the heads draft, on the backbone's own samples with every context exact (teacher forcing).

    Per head, the mean over positions of sum_x min(p(x), q(x)), p the backbone's processed distribution and
    q the drafted one (both CFG branches, the same processed_probs): the probability that a draft sampled
    from q passes the lossless test, i.e. its acceptance before any error compounds. The same measure for
    latent and token heads makes the SSD paper's comparison."""
    N, W = model.grid[0] * model.grid[1], model.grid[1]
    out, e = teacher_forced(model, prompts, seeds, sc)  # e [B, N, E]
    hc, hu = out.hidden, out.hidden_uncond  # [B, N-1, D]: index i's hidden gives x_{i+1}
    p = processed_probs(out.cond, out.uncond, sc)  # [B, N-1, V]

    def drafted(head, src: slice, emb: slice) -> torch.Tensor:
        lc = heads.draft_logits(model, head(hc[:, src], e[:, emb]))
        lu = None if hu is None else heads.draft_logits(model, head(hu[:, src], e[:, emb]))
        return processed_probs(lc, lu, sc)

    # horizontal: ĥ(i+1) = H(h(i), e(x_{i+1})) drafts x_{i+2}; vertical: ĥ(i+W) = V(h(i), e(x_i)) drafts x_{i+W+1}
    q_h = drafted(heads.horizontal, slice(0, N - 2), slice(1, N - 1))
    q_v = drafted(heads.vertical, slice(0, N - 1 - W), slice(0, N - 1 - W))
    return {"horizontal": float(torch.minimum(q_h, p[:, 1:]).sum(-1).mean()),
            "vertical": float(torch.minimum(q_v, p[:, W:]).sum(-1).mean()),
            "target_entropy_nats": float(-(p * p.clamp_min(1e-30).log()).sum(-1).mean())}


@torch.no_grad()
def chain_acceptance(model, heads: SpatialHeads, prompts: list[str], seeds: list[int],
                     sc: SamplingConfig = SamplingConfig(), depth: int = 4) -> dict[str, dict[str, list[float]]]:
    """Acceptance by offset, as the decoder chains the heads: per head and offset k = 1..depth, the mean of
    sum_x min(p, q) over the same target positions with exact context (the head applied once to the
    backbone's own hidden state) and with drafted context (the head applied k times, each on its own
    previous prediction; the tokens fed are the backbone's samples, the context an accepted prefix has).
    Horizontal offset k drafts x_{s+k+1} from h(s); vertical offset k drafts x_{s+kW+1} from h(s)."""
    N, W = model.grid[0] * model.grid[1], model.grid[1]
    if not 1 <= depth <= (N - 2) // W:
        raise ValueError(f"depth must be in 1..{(N - 2) // W} for a {tuple(model.grid)} grid, got {depth}")
    out, e = teacher_forced(model, prompts, seeds, sc)  # e [B, N, E]
    branches = [out.hidden] + ([out.hidden_uncond] if out.hidden_uncond is not None else [])  # [B, N-1, D] each
    p = processed_probs(out.cond, out.uncond, sc)  # [B, N-1, V]: p[:, j] is x_{j+1}'s
    latent = heads.cfg.kind == "latent"

    def probs(outs: list[torch.Tensor]) -> torch.Tensor:
        logits = [heads.draft_logits(model, o) for o in outs]
        return processed_probs(logits[0], logits[1] if len(logits) > 1 else None, sc)

    res = {}
    for name, head, step in (("horizontal", heads.horizontal, 1), ("vertical", heads.vertical, W)):
        L = N - 1 - depth * step  # sources s = 0..L-1: every offset's target exists (>= 1: checked above)
        chain = [h[:, :L] for h in branches]  # ĥ(s + (k-1)·step), [B, L, D] per CFG branch
        exact, drafted = [], []
        for k in range(1, depth + 1):
            src, tok = (k - 1) * step, (k - 1) * step + (step == 1)  # the source index and the fed token's
            emb = e[:, tok:tok + L]  # [B, L, E]
            once = [head(h[:, src:src + L], emb) for h in branches]
            chain = [head(c, emb) if latent else c for c in chain]
            # token heads predict no hidden state: chained drafts reuse the source's (as the drafter does)
            chained = chain if latent else [head(c, emb) for c in chain]
            target = p[:, k * step:k * step + L]  # [B, L, V]
            exact.append(float(torch.minimum(probs(once), target).sum(-1).mean()))
            drafted.append(float(torch.minimum(probs(chained), target).sum(-1).mean()))
        res[name] = {"exact": exact, "drafted": drafted}
    return res
