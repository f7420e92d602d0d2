"""Where did a decoder speculate? Commit maps on the scenes domain, split by what the image shows.

Each token of a decoded image falls in one region:
  - object: its 4x4-pixel patch holds object colour. The scenes palette makes colour a detector: every
    object colour has HSV saturation >= 0.75 and every background colour <= 0.51; dark pixels are left out,
    where noise and dark texture inflate saturation. On renders, whose coverage is known, it finds object
    tokens with precision 0.99 and recall 0.73 (tests/test_scenes.py): it misses edge tokens and the white
    dots of dotted fills, so it undercounts objects a little and never calls background an object. The
    image, not the caption, decides, because a model may draw objects the caption did not ask for (and
    miss ones it did);
  - smooth background: not object, in an image whose caption names a flat or gradient background;
  - detailed background: not object, over a cloudy, wavy, wooden, striped or checkered background.
`content_awareness` reports, per region, its share of all tokens, of relaxed acceptances (accepted only
thanks to CSD's relaxation) and of accepted drafts, and the rates per token. A content-aware rule relaxes
more on smooth background than its token share, and less on objects.
"""

from __future__ import annotations

import numpy as np

from ssdgen.decoders.sample_stats import COMMIT_ACCEPTED, COMMIT_AR, COMMIT_BONUS, COMMIT_RELAXED, COMMIT_RESAMPLED

from ssdgen.reference import captions as cap
from ssdgen.reference.scenes import SMOOTH_BACKGROUNDS

SATURATION = 0.65  # between the background colours' (<= 0.51) and the object colours' (>= 0.75)
BRIGHT = 0.4  # pixels darker than this (max channel) are never called object
REGIONS = ("object", "smooth background", "detailed background")

PALETTE = {  # RGB per commit code, for overlays
    COMMIT_AR: (128, 128, 128), COMMIT_ACCEPTED: (40, 170, 60), COMMIT_RESAMPLED: (220, 40, 40),
    COMMIT_BONUS: (60, 90, 230), COMMIT_RELAXED: (250, 210, 30),
}


def object_tokens(image: np.ndarray, grid: int = 16, min_pixels: int = 2) -> np.ndarray:
    """uint8 [H, W, 3] image -> [grid, grid] bool: patches with >= min_pixels object-coloured pixels."""
    x = image.astype(np.float32) / 255.0
    hi, lo = x.max(-1), x.min(-1)
    saturated = ((hi - lo) / np.maximum(hi, 1e-6) > SATURATION) & (hi > BRIGHT)  # [H, W]
    ps = image.shape[0] // grid
    return saturated.reshape(grid, ps, grid, ps).sum((1, 3)) >= min_pixels


def regions(prompt: str, image: np.ndarray, grid: int = 16) -> np.ndarray:
    """[grid, grid] region index into REGIONS."""
    smooth = cap.parse(prompt).background in SMOOTH_BACKGROUNDS
    return np.where(object_tokens(image, grid), 0, 1 if smooth else 2)


def content_awareness(prompts: list[str], images: list[np.ndarray], commit_maps: list[np.ndarray]) -> dict:
    tokens, relaxed, accepted = np.zeros(3), np.zeros(3), np.zeros(3)
    for p, img, cm in zip(prompts, images, commit_maps):
        reg = regions(p, img, cm.shape[0])
        for r in range(3):
            tokens[r] += (reg == r).sum()
            relaxed[r] += ((cm == COMMIT_RELAXED) & (reg == r)).sum()
            accepted[r] += ((cm == COMMIT_ACCEPTED) & (reg == r)).sum()
    share = lambda v: v / max(v.sum(), 1)  # noqa: E731
    return {"relaxed_acceptances": int(relaxed.sum()), "accepted_drafts": int(accepted.sum()),
            "regions": {name: {"token_share": float(share(tokens)[r]), "relaxed_share": float(share(relaxed)[r]),
                               "accepted_share": float(share(accepted)[r]),
                               "relaxed_per_token": float(relaxed[r] / max(tokens[r], 1)),
                               "accepted_per_token": float(accepted[r] / max(tokens[r], 1))}
                        for r, name in enumerate(REGIONS)},
            "relaxed_on_background": float(share(relaxed)[1:].sum())}


def overlay(image: np.ndarray, commit_map: np.ndarray, alpha: float = 0.55) -> np.ndarray:
    """uint8 [64, 64, 3] image and [16, 16] commit map -> uint8 [64, 64, 3] tinted by commit kind."""
    scale = image.shape[0] // commit_map.shape[0]
    colours = np.zeros(commit_map.shape + (3,), np.float32)
    for code, rgb in PALETTE.items():
        colours[commit_map == code] = rgb
    colours = colours.repeat(scale, 0).repeat(scale, 1)
    return (image * (1 - alpha) + colours * alpha).astype(np.uint8)
