"""SSD's spatial drafting heads: small predictors of the backbone's last hidden state (before its final
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

import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from .sampling import model_device, model_dtype

KINDS = ("latent", "token")


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
        if self.kind not in KINDS:
            raise ValueError(f"heads kind must be one of {KINDS}, got {self.kind!r}")

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
    digest = getattr(model, "weights_digest", None)
    return f"{model.name}@{digest[:12]}" if digest else model.name
