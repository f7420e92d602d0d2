"""Self-distillation of SSD's spatial heads on the frozen backbone's own generations.

1. Sample images from the backbone with CFG (plain AR, the sampling config users decode with).
2. One teacher-forced pass over each image gives the pre-norm hidden states h(i) of both CFG branches.
3. Train the heads on (h(i), e(x_{i+1})) -> h(i+1) and (h(i), e(x_i)) -> h(i+W): a regression in latent
   space (MSE, scaled by the mean square of h) plus a KL term through the backbone's frozen norm + head
   that asks the drafted distribution to match the backbone's. Token heads (the ablation) train on the
   KL term alone.
The backbone is never updated. It may be bf16 (a GPU checkpoint): its hidden states are kept in its dtype
(half the memory), the heads and the losses are fp32 (ssd_heads.py).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from tqdm import tqdm

from .ar import decode_ar
from .sampling import SamplingConfig, processed_probs
from .ssd_heads import HeadsConfig, SpatialHeads, model_fingerprint


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


def train_heads(model, prompts: list[str], sc: SamplingConfig = SamplingConfig(),
                dc: DistillConfig = DistillConfig(), log=print,
                data: dict[str, torch.Tensor] | None = None) -> tuple[SpatialHeads, dict]:
    """Self-distil heads of kind dc.kind on the frozen model's samples of `prompts`. `data` is `collect`'s
    result when the caller already has it (latent and token heads can learn from one set of samples)."""
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
            i = torch.randint(0, n_pos, (dc.batch,), generator=gen, device=h.device)
            target = h[m, i + off]  # [batch, D], the backbone's dtype
            out = head(h[m, i], e[m, i + e_off])  # [batch, D or V], fp32
            with torch.no_grad():
                p_t = F.softmax(model.logits_from_hidden(target).float(), -1)
            logp = F.log_softmax(heads.draft_logits(model, out).float(), -1)
            target = target.float()
            kl = F.kl_div(logp, p_t, reduction="batchmean")
            mse = F.mse_loss(out, target) / scale if cfg.kind == "latent" else torch.zeros((), device=out.device)
            losses[name] = mse + dc.kl_weight * kl
        loss = losses["h"] + losses["v"]
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % 20 == 0:
            bar.set_postfix(h=f"{losses['h'].item():.3f}", v=f"{losses['v'].item():.3f}")
    info = {"n_images": len(prompts[:dc.n_images]), "pairs": int(M * (n_h + n_v)), "collect_s": t_collect,
            "total_s": time.perf_counter() - t0, "params": heads.n_params(),
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
