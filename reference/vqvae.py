"""A small convolutional VQ-VAE: 64x64 RGB <-> a 16x16 grid of codes from a 1,024-entry codebook.

Encoder and decoder are convolutional with residual blocks, so a code's receptive field spans several
4x4 patches (a code is not a lookup of its own patch). The quantizer uses l2-normalised codes
(cosine-similarity lookup, as LlamaGen's VQ-16 does) updated by exponential moving averages, with dead
codes restarted from encoder outputs so that the whole codebook stays in use.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass(frozen=True)
class VQConfig:
    codebook_size: int = 1024
    code_dim: int = 16
    ch: tuple[int, int, int] = (32, 64, 128)  # channels at 64, 32 and 16 pixels
    ema_decay: float = 0.99
    commitment: float = 0.25

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "VQConfig":
        d = dict(d)
        d["ch"] = tuple(d["ch"])
        return cls(**d)


class ResBlock(nn.Module):
    def __init__(self, ch: int):
        super().__init__()
        self.n1, self.c1 = nn.GroupNorm(8, ch), nn.Conv2d(ch, ch, 3, padding=1)
        self.n2, self.c2 = nn.GroupNorm(8, ch), nn.Conv2d(ch, ch, 3, padding=1)

    def forward(self, x):
        h = self.c1(F.silu(self.n1(x)))
        return x + self.c2(F.silu(self.n2(h)))


class Encoder(nn.Module):
    def __init__(self, cfg: VQConfig):
        super().__init__()
        c0, c1, c2 = cfg.ch
        self.net = nn.Sequential(
            nn.Conv2d(3, c0, 3, padding=1),
            nn.Conv2d(c0, c1, 4, stride=2, padding=1), ResBlock(c1),  # 32x32
            nn.Conv2d(c1, c2, 4, stride=2, padding=1), ResBlock(c2), ResBlock(c2),  # 16x16
            nn.GroupNorm(8, c2), nn.SiLU(), nn.Conv2d(c2, cfg.code_dim, 1),
        )

    def forward(self, x):
        return self.net(x)


class Decoder(nn.Module):
    def __init__(self, cfg: VQConfig):
        super().__init__()
        c0, c1, c2 = cfg.ch
        self.net = nn.Sequential(
            nn.Conv2d(cfg.code_dim, c2, 3, padding=1), ResBlock(c2), ResBlock(c2),
            nn.ConvTranspose2d(c2, c1, 4, stride=2, padding=1), ResBlock(c1),  # 32x32
            nn.ConvTranspose2d(c1, c0, 4, stride=2, padding=1),  # 64x64
            nn.GroupNorm(8, c0), nn.SiLU(), nn.Conv2d(c0, 3, 3, padding=1),
        )

    def forward(self, z):
        return self.net(z)


class VQVAE(nn.Module):
    def __init__(self, cfg: VQConfig):
        super().__init__()
        self.cfg = cfg
        self.encoder, self.decoder = Encoder(cfg), Decoder(cfg)
        emb = F.normalize(torch.randn(cfg.codebook_size, cfg.code_dim), dim=-1)
        self.register_buffer("codebook", emb)  # [K, D], unit rows
        self.register_buffer("ema_sum", emb.clone())  # [K, D]
        self.register_buffer("ema_count", torch.ones(cfg.codebook_size))  # [K]

    # ---- pixels are uint8 [N, 64, 64, 3] at the edges, float [-1, 1] NCHW inside
    @staticmethod
    def to_input(images: torch.Tensor) -> torch.Tensor:
        return images.permute(0, 3, 1, 2).float() / 127.5 - 1.0

    @staticmethod
    def to_uint8(x: torch.Tensor) -> torch.Tensor:
        return ((x.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).permute(0, 2, 3, 1)

    def quantize(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """z [N, D, H, W] -> (unit-norm codes [N, D, H, W], indices [N, H, W])."""
        zn = F.normalize(z, dim=1)
        flat = zn.permute(0, 2, 3, 1).reshape(-1, zn.shape[1])  # [N*H*W, D]
        idx = (flat @ self.codebook.T).argmax(dim=1)  # max cosine similarity
        q = self.codebook[idx].view(zn.shape[0], zn.shape[2], zn.shape[3], -1).permute(0, 3, 1, 2)
        return q, idx.view(zn.shape[0], zn.shape[2], zn.shape[3])

    @torch.no_grad()
    def encode(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 [N, 64, 64, 3] -> codes [N, 16, 16] (long)."""
        return self.quantize(self.encoder(self.to_input(images)))[1]

    @torch.no_grad()
    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [N, 16, 16] -> uint8 [N, 64, 64, 3]."""
        q = self.codebook[codes].permute(0, 3, 1, 2)
        return self.to_uint8(self.decoder(q))

    def forward(self, x: torch.Tensor, token_weight: torch.Tensor | None = None):
        """Training pass: x [N, 3, H, W] in [-1, 1] -> (reconstruction, commitment loss, indices).

        token_weight [N, H/4, W/4] weights each encoding in the codebook's EMA (weighted k-means)."""
        z = F.normalize(self.encoder(x), dim=1)
        q, idx = self.quantize(z)
        if self.training:
            self._ema_update(z, idx, token_weight)
        commit = F.mse_loss(z, q.detach())
        q = z + (q - z).detach()  # straight-through estimator
        return self.decoder(q), commit, idx

    @torch.no_grad()
    def _ema_update(self, z: torch.Tensor, idx: torch.Tensor, weight: torch.Tensor | None) -> None:
        flat = z.permute(0, 2, 3, 1).reshape(-1, z.shape[1])
        onehot = F.one_hot(idx.view(-1), self.cfg.codebook_size).type_as(flat)  # [M, K]
        if weight is not None:
            onehot = onehot * weight.reshape(-1, 1)
        d = self.cfg.ema_decay
        self.ema_count.mul_(d).add_(onehot.sum(0), alpha=1 - d)
        self.ema_sum.mul_(d).add_(onehot.T @ flat, alpha=1 - d)
        self.codebook.copy_(F.normalize(self.ema_sum, dim=-1))

    @torch.no_grad()
    def restart_dead_codes(self, z_sample: torch.Tensor, gen: torch.Generator, min_count: float = 0.5) -> int:
        """Re-seed rarely used codes from random encoder outputs; returns how many were restarted."""
        dead = (self.ema_count < min_count).nonzero().squeeze(1)
        if len(dead) == 0:
            return 0
        flat = F.normalize(z_sample, dim=1).permute(0, 2, 3, 1).reshape(-1, z_sample.shape[1])
        pick = torch.randint(0, flat.shape[0], (len(dead),), generator=gen)
        new = F.normalize(flat[pick] + 0.01 * torch.randn(flat[pick].shape, generator=gen), dim=-1)
        self.ema_sum[dead] = new
        self.ema_count[dead] = 1.0
        self.codebook[dead] = new
        return len(dead)
