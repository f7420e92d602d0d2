"""The training set: rendered scenes (eval captions held out, ssdgen.reference.scene_sets), tokenized once,
cached as safetensors.

A sample is its caption ids [36], its image codes [g*g] and the object coverage of each code's 4x4 patch
[g*g] (0..255), which weights the AR model's loss towards the tokens that carry the caption's meaning; g is
16 for 64-pixel renders (v1, v2) and 32 for 128-pixel ones (v3).
Rendering and tokenizing are deterministic from (n, seed, size, VQ weights), which name the cache file.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from tqdm import tqdm

from ssdgen.reference import captions as cap
from ssdgen.reference.scene_sets import build_dataset
from ssdgen.reference.vqvae import VQVAE


@torch.no_grad()
def tokenize(vq: VQVAE, images: np.ndarray, batch: int = 256) -> np.ndarray:
    """uint8 images [N, px, px, 3] -> codes int16 [N, px/4, px/4], on the VQ's device."""
    device = next(vq.parameters()).device
    out = [vq.encode(torch.from_numpy(images[i:i + batch]).to(device)).to(torch.int16).cpu().numpy()
           for i in tqdm(range(0, len(images), batch), desc="tokenize", unit="batch")]
    return np.concatenate(out)


@dataclass
class TokenizedSet:
    captions: torch.Tensor  # [N, 36] int16 caption ids
    codes: torch.Tensor  # [N, g*g] int16 image codes, raster order
    coverage: torch.Tensor  # [N, g*g] uint8 object coverage of each code's patch, 0..255

    def save(self, path: Path) -> None:
        tmp = path.with_suffix(".tmp")
        save_file({"captions": self.captions, "codes": self.codes, "coverage": self.coverage}, tmp)
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path) -> "TokenizedSet":
        t = load_file(path)
        return cls(t["captions"], t["codes"], t["coverage"])


def tokenized_set(images: np.ndarray, masks: np.ndarray, captions: list[str], vq: VQVAE) -> TokenizedSet:
    codes = tokenize(vq, images).reshape(len(images), -1)
    grid = codes.shape[1] ** 0.5
    cover = F.adaptive_avg_pool2d(torch.from_numpy(masks).float().unsqueeze(1), int(grid))  # [N, 1, g, g]
    return TokenizedSet(torch.tensor(np.array([cap.encode(c) for c in captions]), dtype=torch.int16),
                        torch.from_numpy(codes), cover.flatten(1).round().to(torch.uint8))


def cached_tokenized_set(work: Path, n: int, seed: int, vq: VQVAE, vq_digest: str, size: int = 64) -> TokenizedSet:
    """Render and tokenize n scenes at size pixels, or load them from work/ when the same (n, seed, size, VQ)
    made them before (64-pixel sets keep the name they had before sizes existed)."""
    px = "" if size == 64 else f"-px{size}"
    path = work / f"tokens-n{n}-seed{seed}{px}-vq{vq_digest[:12]}.safetensors"
    if path.exists():
        return TokenizedSet.load(path)
    images, masks, captions = build_dataset(n, seed, size=size)
    data = tokenized_set(images, masks, captions, vq)
    work.mkdir(parents=True, exist_ok=True)
    data.save(path)
    return data
