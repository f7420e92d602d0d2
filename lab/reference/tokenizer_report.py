"""`python -m lab tokenizer-report`: how well the VQ tokenizer reconstructs, and how tokens relate to neighbours.

- PSNR of render -> codes -> pixels, per background kind, on held-out renders of the eval captions;
- how often a token equals its upper neighbour and its left neighbour, on tokenized renders, overall and
  on smooth vs detailed backgrounds: the spatial redundancy that speculative decoders live on;
- how many distinct codes the renders use;
- with `floor=True`, what the scorer makes of it: its accuracy on the renders and on their reconstructions, and
  the FD of the reconstructions against renders of the same captions with other seeds (the tokenizer's floor:
  the best FD any transformer on these tokens can reach, as `ssdgen eval` reports it), beside the FD real renders
  reach among themselves.

`size` is the renders' side: 64 for v1 and v2 (16x16 tokens), 128 for v3 (32x32); the scorer judges 128-pixel
images at 64 (reference/scorer.py `at_scorer_size`).
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
def tokenizer_report(vq, n: int = 1024, size: int = 64, floor: bool = False) -> dict:
    rows = eval_prompts(n)
    scenes = [real_scene(r["prompt"], r["seed"] + 2_000_000) for r in rows]
    images = torch.from_numpy(np.stack([render(s, size=size) for s in scenes]))
    codes = torch.cat([vq.encode(images[i:i + 256]) for i in range(0, n, 256)])
    recon = torch.cat([vq.decode(codes[i:i + 256]) for i in range(0, n, 256)])
    mse = ((recon.float() - images.float()) ** 2).mean((1, 2, 3)).numpy()
    kinds = np.array([s.background for s in scenes])
    psnr = {k: float(10 * np.log10(255 ** 2 / mse[kinds == k].mean())) for k in BACKGROUNDS if (kinds == k).any()}
    smooth = np.isin(kinds, SMOOTH_BACKGROUNDS)
    c = codes.numpy()
    return {
        "n": n, "size": size, "grid": list(c.shape[1:]),
        **(scorer_floor(images.numpy(), recon.numpy(), rows, size) if floor else {}),
        "psnr_db": {"all": float(10 * np.log10(255 ** 2 / mse.mean())), **psnr},
        "agreement": {"all": neighbour_agreement(c), "smooth_backgrounds": neighbour_agreement(c[smooth]),
                      "detailed_backgrounds": neighbour_agreement(c[~smooth])},
        "distinct_codes_used": int(len(np.unique(c))),
    }


def scorer_floor(images: np.ndarray, recon: np.ndarray, rows: list[dict], size: int) -> dict:
    """The scorer on renders and their reconstructions, and the FD floors (as reference/evaluate.py computes
    them for `ssdgen eval`, against renders of the same captions with the eval seeds)."""
    from ssdgen.reference.evaluate import real_images
    from ssdgen.reference.fd import frechet_distance
    from ssdgen.reference.scorer import load_scorer, predict, score
    net, prompts = load_scorer(), [r["prompt"] for r in rows]
    real = predict(net, real_images(prompts, [r["seed"] for r in rows], size))["features"]
    keys = ("scene_accuracy", "object_accuracy", "images_with_extra_objects")
    on_renders, on_recon = score(net, images, prompts), score(net, recon, prompts)  # each scored once
    return {"scorer_on_renders": {k: on_renders[k] for k in keys},
            "scorer_on_reconstructions": {k: on_recon[k] for k in keys},
            "fd_real_heldout": frechet_distance(predict(net, images)["features"], real),
            "fd_tokenizer_floor": frechet_distance(predict(net, recon)["features"], real)}
