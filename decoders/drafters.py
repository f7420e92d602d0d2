"""Where drafts come from: one `Drafter` interface, shared by the window loop (window.py: SJD, CSD, SSD) and SSD's
block decoder (block.py).

A drafter fills a run of positions of a sample's token buffer with draft tokens and returns the distribution
each was drawn from (p, which verification needs). The positions are given relative to a window: `start`
[B] is the index of window slot 0, and slots first_b .. end_b - 1 are drafted (first_b >= end_b: none).
  window: the window after the last committed token; its first `carried` slots hold Jacobi updates, the rest
       are fresh drafts (first = carried, end = K).
  block: a block of L_b positions after the committed prefix (first = 0, end = L).
Implementations:
  RandomDrafter       a uniform token, one-hot p (SJD's `init=random`)
  RepeatDrafter       the token `offset` positions back (1: repeat-left, W: repeat-above), one-hot p; a
                      uniform token where there is none
  HeadsDrafter        SSD's spatial heads (SpatialHeads, below): drafts sampled from the model's own norm + head on
                      predicted hidden states, so p is a full distribution
`begin` and `observe` hand the drafter each forward's output (the heads keep the hidden states they draft
from); the guessing drafters ignore them.

SSD's heads themselves (`SpatialHeads`), the network the heads drafter runs:
SSD's spatial drafting heads: small predictors of the backbone's last hidden state (before its final
norm) one step to the right and one row down.

Notation: h(i) is the backbone's pre-norm hidden state at image index i (the output of feeding token x_i);
the model's own final norm + head turn h(i) into the distribution of x_{i+1}.
  horizontal head:  ĥ(i + 1) = H(h(i), e(x_{i+1}))   (EAGLE-style, along the raster row)
  vertical head:    ĥ(i + W) = V(h(i), e(x_i))       (the position directly below; W = grid width)
e(x_j) is the model's input embedding of token x_j at index j. Each head is a residual MLP on
[rmsnorm(h), rmsnorm(e)]; the backbone stays frozen. Drafts are decoded through the backbone's own norm
and head (`model.logits_from_hidden`), so they live in the same processed distribution as verification.

`kind="token"` is the ablation the SSD paper argues against: heads that output token logits directly.

Heads are saved as safetensors with a JSON config that names the backbone (its name and weights'
checksum); loading refuses heads of another shape or for another model.

Precision: the heads are fp32 whatever the backbone's precision (small, and trained with AdamW, which a
bf16 copy of the weights would not serve well). A head casts its inputs (the backbone's hidden states and
embeddings, bf16 on a GPU) to its own dtype, and `draft_logits` casts its output back to the backbone's
dtype before the backbone's norm + head.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from .protocol import StepOutput
from .recipes import SamplingConfig
from .sampling import model_device, model_dtype, processed_probs, sample_from


HEAD_KINDS = ("latent", "token")  # SSD's heads: latent ones predict the hidden state, token ones the code


@dataclass(frozen=True)
class HeadsConfig:
    dim: int  # backbone hidden size D
    emb_dim: int  # backbone input-embedding size
    n_codes: int  # image-token vocabulary (output size of token heads)
    grid: tuple[int, int]
    model: str  # the backbone these heads were trained for: "<name>@<weights checksum>"
    hidden: int = 0  # MLP width; 0 = 2 * dim
    kind: str = "latent"

    def __post_init__(self):
        if self.kind not in HEAD_KINDS:
            raise ValueError(f"heads kind must be one of {HEAD_KINDS}, got {self.kind!r}")

    @property
    def width(self) -> int:
        return self.hidden or 2 * self.dim


def _rms(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5)


class SpatialHead(nn.Module):
    """f(h, e) -> ĥ at the head's offset ([..., D]), or token logits ([..., V]) for kind="token"."""

    def __init__(self, cfg: HeadsConfig):
        super().__init__()
        self.kind = cfg.kind
        out = cfg.dim if cfg.kind == "latent" else cfg.n_codes
        self.fc1 = nn.Linear(cfg.dim + cfg.emb_dim, cfg.width)
        self.fc2 = nn.Linear(cfg.width, out)
        nn.init.zeros_(self.fc2.weight)  # a latent head starts as the identity: ĥ = h
        nn.init.zeros_(self.fc2.bias)

    def forward(self, h: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
        # h [..., D], e [..., E] in the backbone's dtype -> the heads' (see the module doc)
        h, e = h.to(self.fc1.weight.dtype), e.to(self.fc1.weight.dtype)
        y = self.fc2(F.silu(self.fc1(torch.cat([_rms(h), _rms(e)], dim=-1))))
        return h + y if self.kind == "latent" else y


class SpatialHeads(nn.Module):
    def __init__(self, cfg: HeadsConfig):
        super().__init__()
        self.cfg = cfg
        self.horizontal = SpatialHead(cfg)
        self.vertical = SpatialHead(cfg)

    def draft_logits(self, model, out: torch.Tensor) -> torch.Tensor:
        """Head output -> logits over image codes: through the backbone's own norm + head (in the backbone's
        dtype) for latent heads."""
        return model.logits_from_hidden(out.to(model_dtype(model))) if self.cfg.kind == "latent" else out

    def n_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def flops_per_token(self) -> int:
        """Multiply-adds x 2 of one head application (latent: the backbone's head not included)."""
        return 2 * sum(m.weight.numel() for m in self.horizontal.modules() if isinstance(m, nn.Linear))

    # ------------------------------------------------------------------ persistence
    def save(self, path: Path | str) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        save_file({k: v.contiguous() for k, v in self.state_dict().items()}, path.with_suffix(".safetensors"))
        path.with_suffix(".json").write_text(json.dumps(asdict(self.cfg), indent=1))

    @classmethod
    def load(cls, path: Path | str, model) -> "SpatialHeads":
        """Load heads for `model`, on the model's device; refuse heads trained for another model or of another
        shape."""
        path = Path(path)
        cfg_path, w_path = path.with_suffix(".json"), path.with_suffix(".safetensors")
        if not cfg_path.exists() or not w_path.exists():
            raise FileNotFoundError(f"{path}: SSD heads need {cfg_path.name} and {w_path.name} "
                                    f"(train them with `ssdgen train-heads`)")
        d = json.loads(cfg_path.read_text())
        d["grid"] = tuple(d["grid"])
        cfg = HeadsConfig(**d)
        want = model_fingerprint(model)
        if cfg.model != want:
            raise ValueError(f"{cfg_path}: heads were trained for model {cfg.model!r}, not {want!r}")
        if (cfg.dim, cfg.n_codes, cfg.grid) != (model.hidden_dim, model.n_codes, tuple(model.grid)):
            raise ValueError(f"{cfg_path}: heads are for dim {cfg.dim}, {cfg.n_codes} codes, grid {cfg.grid}; "
                             f"the model has dim {model.hidden_dim}, {model.n_codes} codes, grid {model.grid}")
        device = model_device(model)
        with torch.device(device):  # built where the model lives (its init is overwritten below)
            heads = cls(cfg)
        try:
            heads.load_state_dict(load_file(w_path, device=str(device)), strict=True)
        except RuntimeError as e:
            raise ValueError(f"{w_path}: weights do not match {cfg_path.name}: {e}") from None
        return heads.eval()


def model_fingerprint(model) -> str:
    """'<name>@<first 12 hex of the weights' checksum>' where the model has one, else its name."""
    digest = model.capabilities.weights_digest
    return f"{model.name}@{digest[:12]}" if digest else model.name


class Drafter(Protocol):
    name: str  # recorded in the statistics (SJD's "init")

    def begin(self, out: StepOutput) -> None:
        """The prefill's output (its last position is the hidden state before image index 0)."""

    def observe(self, out: StepOutput, idx: torch.Tensor, fed: torch.Tensor | None = None) -> None:
        """A forward's output; idx [B, S] the indices fed (out.hidden[:, s] is index idx[:, s]); fed [B, S]
        bool: which of them were real tokens (None: all; the rest is padding whose output is junk)."""

    def restart(self, rows: torch.Tensor, out: StepOutput) -> None:
        """Rows `rows` [R] took new samples (continuous batching, slots.py): forget what they held, as a fresh
        drafter's rows, and `begin` them with their prefill's output out [R, 1]."""

    def draft(self, buf: torch.Tensor, start: torch.Tensor, first: torch.Tensor, end: torch.Tensor,
              u: torch.Tensor) -> torch.Tensor:
        """Fill buf[b, start_b + o] for window slots first_b <= o < end_b, in place; return the draft
        distributions p [B, K, V] by window slot (slots outside [first_b, end_b) are meaningless).
        u [B, K]: uniforms keyed by each sample's seed (sampling.py), at least one per drafted slot."""


class _GuessDrafter:
    """Drafts guessed without the model: one-hot p. Slot o uses u[:, o]."""

    name = ""

    def __init__(self, n_codes: int):
        self.V = n_codes

    def begin(self, out: StepOutput) -> None:
        pass

    def observe(self, out: StepOutput, idx: torch.Tensor, fed: torch.Tensor | None = None) -> None:
        pass

    def restart(self, rows: torch.Tensor, out: StepOutput) -> None:
        pass

    def guess(self, buf: torch.Tensor, rows: torch.Tensor, idx: torch.Tensor, rand: torch.Tensor) -> torch.Tensor:
        """The draft at index idx [B] of each sample; rand [B]: a uniform random token."""
        raise NotImplementedError

    def draft(self, buf, start, first, end, u):
        B, K = u.shape
        rows = torch.arange(B, device=buf.device)
        for o in range(K):  # in slot order: a repeat may copy the draft just made to its left
            idx = start + o  # [B]
            fill = (o >= first) & (o < end)  # [B]
            if not fill.any():
                continue
            rand = (u[:, o] * self.V).long().clamp_(max=self.V - 1)  # [B]
            buf[rows, idx] = torch.where(fill, self.guess(buf, rows, idx, rand), buf[rows, idx])
        window = buf[rows[:, None], start[:, None] + torch.arange(K, device=buf.device)]  # [B, K]
        return torch.zeros(B, K, self.V, device=buf.device).scatter_(2, window.unsqueeze(-1), 1.0)


class RandomDrafter(_GuessDrafter):
    name = "random"

    def guess(self, buf, rows, idx, rand):
        return rand


class RepeatDrafter(_GuessDrafter):
    """The token `offset` indices back: 1 repeats the left neighbour, the grid's width W the one above."""

    def __init__(self, n_codes: int, offset: int, name: str):
        super().__init__(n_codes)
        self.offset, self.name = offset, name

    def guess(self, buf, rows, idx, rand):
        return torch.where(idx >= self.offset, buf[rows, (idx - self.offset).clamp(min=0)], rand)


def guess_drafter(init: str, grid: tuple[int, int], n_codes: int) -> _GuessDrafter:
    """SJD's draft initialisation by name (recipes.INITS)."""
    if init == "random":
        return RandomDrafter(n_codes)
    return RepeatDrafter(n_codes, 1 if init == "repeat-left" else grid[1], init)


class HeadsDrafter:
    """SSD's spatial heads as a drafter. hb[b, i + 1] holds the best-known hidden state at index i (h(-1): the
    prompt's last position), conditional and, under CFG, unconditional (hbu): the model's own states where a
    forward has fed index i, the heads' predictions ĥ(i) where i was only drafted.

    A block is drafted in waves (`waves`): positions with a row above vertically, ĥ(t-1) = V(h(t-1-W),
    e(x_{t-1-W})), a whole row per wave, chaining V down the block; the rest (the first row of the image, or
    everything with `two_d=False`) horizontally, ĥ(t-1) = H(ĥ(t-2), e(x_{t-1})). Drafted slot first_b + o
    uses u[:, o] (the draft order, not the window slot)."""

    name = "heads"

    def __init__(self, model, heads: SpatialHeads, sc: SamplingConfig, two_d: bool, batch: int, size: int):
        """size: hidden-state slots per sample (indices -1 .. size - 2; writes past the end land on the last)."""
        dev = model_device(model)
        self.model, self.heads, self.sc, self.two_d, self.W = model, heads, sc, two_d, model.grid[1]
        # fp32 whatever the model's dtype: the heads chain their predictions in fp32 (drafters.py)
        self.hb = torch.zeros(batch, size, model.hidden_dim, device=dev)  # [B, size, D]
        self.hbu = torch.zeros_like(self.hb) if sc.uses_cfg else None
        self.rows = torch.arange(batch, device=dev)

    def begin(self, out: StepOutput) -> None:
        self.hb[:, 0] = out.hidden[:, -1]
        if self.hbu is not None:
            self.hbu[:, 0] = out.hidden_uncond[:, -1]

    def restart(self, rows: torch.Tensor, out: StepOutput) -> None:
        # a fresh drafter's rows are zeros: the first draft after a resampled token reads the slot of an index
        # its sample has not fed yet (window.py), which must not hold the slot's previous sample's state
        for hs, new in ((self.hb, out.hidden), (self.hbu, out.hidden_uncond)):
            if hs is not None:
                hs[rows] = 0
                hs[rows, 0] = new[:, -1].to(hs.dtype)

    def observe(self, out: StepOutput, idx: torch.Tensor, fed: torch.Tensor | None = None) -> None:
        slot = (idx + 1).clamp(max=self.hb.shape[1] - 1)  # [B, S]
        for hs, new in ((self.hb, out.hidden), (self.hbu, out.hidden_uncond)):
            if hs is None:
                continue
            new = new.to(hs.dtype)  # an indexed write needs matching dtypes (a bf16 model's hidden states)
            if fed is None:
                hs[self.rows[:, None], slot] = new
            else:  # keep what padding positions would overwrite
                hs[self.rows[:, None], slot] = torch.where(fed[..., None], new, hs[self.rows[:, None], slot])

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

    def draft(self, buf, start, first, end, u):
        B, K, dev = buf.shape[0], u.shape[1], buf.device
        n0 = start + first  # [B] the first index drafted
        wave = self.waves(n0.cpu().numpy(), (end - first).cpu().numpy())  # the schedule is planned on the host
        p = torch.zeros(B, K, self.model.n_codes, device=dev)  # [B, K, V] by window slot
        for w in range(int(wave.max()) + 1):
            bs, os_ = np.nonzero(wave == w)
            bs_t, os_t = torch.from_numpy(bs).to(dev), torch.from_numpy(os_).to(dev)  # [P] each
            probs = self._wave(buf, bs_t, n0[bs_t] + os_t)  # [P, V]
            buf[bs_t, n0[bs_t] + os_t] = sample_from(probs, u[bs_t, os_t])
            p[bs_t, first[bs_t] + os_t] = probs
        return p

    def _wave(self, buf: torch.Tensor, bs: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """Draft distributions [P, V] of positions t [P] of samples bs [P], whose inputs are all known."""
        vertical = (t - 1 - self.W >= 0) & self.two_d
        src = torch.where(vertical, t - 1 - self.W, t - 2)  # index of the source hidden state
        tok_at = torch.where(vertical, t - 1 - self.W, t - 1)  # index of the source token
        e = self.model.embed(buf[bs, tok_at][None], tok_at[None])[0]  # [P, E]
        out_c = self._predict(self.hb, bs, t, src, e, vertical)
        logits_u = None
        if self.hbu is not None:
            logits_u = self.heads.draft_logits(self.model, self._predict(self.hbu, bs, t, src, e, vertical))
        return processed_probs(self.heads.draft_logits(self.model, out_c), logits_u, self.sc)

    def _predict(self, hs: torch.Tensor, bs: torch.Tensor, t: torch.Tensor, src: torch.Tensor, e: torch.Tensor,
                 vertical: torch.Tensor) -> torch.Tensor:
        """The heads' output [P, D or V] for ĥ(t - 1), from hs (hb or hbu); ĥ(t - 1) is stored at slot t."""
        h = hs[bs, src + 1]  # [P, D]
        out = torch.where(vertical[:, None], self.heads.vertical(h, e), self.heads.horizontal(h, e))
        # token heads (the ablation) predict no hidden state: a chained draft reuses its source's hidden state
        # with the new token's embedding
        hs[bs, t] = out if self.heads.cfg.kind == "latent" else h
        return out


def _guessed(model, sc: SamplingConfig, cfg, heads, batch: int, size: int) -> Drafter:
    return guess_drafter(cfg.init, model.grid, model.n_codes)


def _from_heads(model, sc: SamplingConfig, cfg, heads, batch: int, size: int) -> Drafter:
    if heads is None:
        raise ValueError("SSD drafts with its heads: pass heads (engine.load_heads)")
    return HeadsDrafter(model, heads, sc, cfg.two_d, batch, size)


# a recipe's drafter (recipes.py) -> (model, sampling, the loop's config, heads, batch, hidden-state slots) -> Drafter
DRAFTERS = {"guess": _guessed, "heads": _from_heads}
