"""Where did a decoder speculate? Commit maps on the scenes domain, split into object and background tokens.

A token counts as background when its 4x4-pixel patch lies clear of every named object's cell area
(centre +- size + jitter + a 2-pixel margin): the caption says where objects may be, so no detector is
needed. `content_awareness` reports, over decoded eval prompts, the share of relaxed acceptances (and
of plain accepted drafts) that fall on background tokens, beside the background's share of all tokens.
"""

from __future__ import annotations

import numpy as np

from decoders.stats import COMMIT_ACCEPTED, COMMIT_AR, COMMIT_BONUS, COMMIT_RELAXED, COMMIT_RESAMPLED

from . import captions as cap
from .scenes import JITTER, SIZES, cell_centre

PALETTE = {  # RGB per commit code, for overlays
    COMMIT_AR: (128, 128, 128), COMMIT_ACCEPTED: (40, 170, 60), COMMIT_RESAMPLED: (220, 40, 40),
    COMMIT_BONUS: (60, 90, 230), COMMIT_RELAXED: (250, 210, 30),
}


def background_tokens(prompt: str, grid: int = 16, image: int = 64) -> np.ndarray:
    """[grid, grid] bool: True where a token's patch cannot touch any named object."""
    spec = cap.parse(prompt)
    patch = image / grid
    centres = (np.arange(grid) + 0.5) * patch
    yy, xx = np.meshgrid(centres, centres, indexing="ij")
    bg = np.ones((grid, grid), bool)
    for o in spec.objects:
        cx, cy = cell_centre(o.cell)
        reach = SIZES[o.size] * 1.25 + JITTER + 2 + patch / 2  # the widest shape's half-extent, plus slack
        bg &= (np.abs(xx - cx) > reach) | (np.abs(yy - cy) > reach)
    return bg


def content_awareness(prompts: list[str], commit_maps: list[np.ndarray]) -> dict:
    bg_all, relaxed_bg, relaxed_all, acc_bg, acc_all = 0, 0, 0, 0, 0
    total = 0
    for p, cm in zip(prompts, commit_maps):
        bg = background_tokens(p, cm.shape[0])
        bg_all += int(bg.sum())
        total += bg.size
        relaxed_all += int((cm == COMMIT_RELAXED).sum())
        relaxed_bg += int(((cm == COMMIT_RELAXED) & bg).sum())
        acc_all += int((cm == COMMIT_ACCEPTED).sum())
        acc_bg += int(((cm == COMMIT_ACCEPTED) & bg).sum())
    return {"background_token_share": bg_all / total,
            "relaxed_on_background": relaxed_bg / relaxed_all if relaxed_all else float("nan"),
            "accepted_on_background": acc_bg / acc_all if acc_all else float("nan"),
            "relaxed_acceptances": relaxed_all, "accepted_drafts": acc_all}


def overlay(image: np.ndarray, commit_map: np.ndarray, alpha: float = 0.55) -> np.ndarray:
    """uint8 [64, 64, 3] image and [16, 16] commit map -> uint8 [64, 64, 3] tinted by commit kind."""
    scale = image.shape[0] // commit_map.shape[0]
    colours = np.zeros(commit_map.shape + (3,), np.float32)
    for code, rgb in PALETTE.items():
        colours[commit_map == code] = rgb
    colours = colours.repeat(scale, 0).repeat(scale, 1)
    return (image * (1 - alpha) + colours * alpha).astype(np.uint8)
