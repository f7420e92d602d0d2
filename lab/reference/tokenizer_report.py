"""`python -m lab tokenizer-report`: how well the VQ tokenizer reconstructs, and how tokens relate to neighbours.

- PSNR of render -> codes -> pixels, per background kind, on held-out renders of the eval captions;
- how often a token equals its upper neighbour and its left neighbour, on tokenized renders, overall and
  on smooth vs detailed backgrounds: the spatial redundancy that speculative decoders live on;
- how many distinct codes the renders use.
"""

from __future__ import annotations

import numpy as np
import torch

from ssdgen.reference.evaluate import real_scene
from ssdgen.reference.prompts import eval_prompts
from ssdgen.reference.scenes import BACKGROUNDS, SMOOTH_BACKGROUNDS, render


def neighbour_agreement(codes: np.ndarray) -> dict[str, float]:
    """codes [N, H, W] -> fraction of tokens equal to the one above / to the left."""
    return {"above": float((codes[:, 1:, :] == codes[:, :-1, :]).mean()),
            "left": float((codes[:, :, 1:] == codes[:, :, :-1]).mean())}


@torch.no_grad()
def tokenizer_report(vq, n: int = 1024) -> dict:
    rows = eval_prompts(n)
    scenes = [real_scene(r["prompt"], r["seed"] + 2_000_000) for r in rows]
    images = torch.from_numpy(np.stack([render(s) for s in scenes]))
    codes = torch.cat([vq.encode(images[i:i + 256]) for i in range(0, n, 256)])
    recon = torch.cat([vq.decode(codes[i:i + 256]) for i in range(0, n, 256)])
    mse = ((recon.float() - images.float()) ** 2).mean((1, 2, 3)).numpy()
    kinds = np.array([s.background for s in scenes])
    psnr = {k: float(10 * np.log10(255 ** 2 / mse[kinds == k].mean())) for k in BACKGROUNDS if (kinds == k).any()}
    smooth = np.isin(kinds, SMOOTH_BACKGROUNDS)
    c = codes.numpy()
    return {
        "n": n,
        "psnr_db": {"all": float(10 * np.log10(255 ** 2 / mse.mean())), **psnr},
        "agreement": {"all": neighbour_agreement(c), "smooth_backgrounds": neighbour_agreement(c[smooth]),
                      "detailed_backgrounds": neighbour_agreement(c[~smooth])},
        "distinct_codes_used": int(len(np.unique(c))),
    }
