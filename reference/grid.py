"""Captioned grids of images, for people to look at: `ssdgen demo`'s grid of its first images, and the docs'
figures of eval-prompt samples and commit-map overlays (`python -m lab figures`)."""

from __future__ import annotations

import textwrap

import numpy as np
from PIL import Image, ImageDraw, ImageFont

TILE = 192  # pixels per image in a figure (64x64 scaled x3, nearest neighbour)


def captioned_grid(images: list[np.ndarray], captions: list[str], cols: int = 4,
                   extra: list[np.ndarray] | None = None) -> Image.Image:
    """Tiles with their caption beneath; `extra` puts a second image (e.g. a commit map) beside each."""
    font = ImageFont.load_default(size=12)
    per = 2 if extra is not None else 1
    cap_h = 74
    w, h = TILE * per + 12, TILE + cap_h
    rows = (len(images) + cols - 1) // cols
    canvas = Image.new("RGB", (cols * w, rows * h), "white")
    draw = ImageDraw.Draw(canvas)
    for i, img in enumerate(images):
        x, y = (i % cols) * w + 6, (i // cols) * h + 4
        canvas.paste(Image.fromarray(img).resize((TILE, TILE), Image.NEAREST), (x, y))
        if extra is not None:
            canvas.paste(Image.fromarray(extra[i]).resize((TILE, TILE), Image.NEAREST), (x + TILE, y))
        text = "\n".join(textwrap.wrap(captions[i], width=32 * per))
        draw.multiline_text((x, y + TILE + 3), text, fill="black", font=font, spacing=1)
    return canvas
