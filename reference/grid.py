"""Captioned grids of images, for people to look at: `ssdgen demo`'s grid of its first images, `ssdgen sample`'s
strip per prompt, and the docs' figures of eval-prompt samples and commit-map overlays (`python -m lab figures`).

Captions wrap by the font's measured width, not by a character count, and the caption band grows to the longest
caption's lines: a fixed band once cut a 5-line caption's last word off under the next row's images."""

from __future__ import annotations

import numpy as np
from PIL import Image, ImageDraw, ImageFont

TILE = 192  # pixels per image in a figure (64x64 scaled x3, nearest neighbour)
PAD = 6  # pixels between tiles, and around a caption
MIN_CAPTION_LINES = 4  # the band every grid keeps (its height before captions grew it), for short captions
SPACING = 1  # pixels between caption lines


def caption_lines(caption: str, font, width: int) -> list[str]:
    """`caption` wrapped into lines no wider than `width` pixels in `font`, every word kept: a word wider than a
    line on its own is cut across lines rather than dropped."""
    lines: list[str] = []
    line = ""
    for word in caption.split():
        candidate = f"{line} {word}" if line else word
        if font.getlength(candidate) <= width:
            line = candidate
            continue
        if line:
            lines.append(line)
        while font.getlength(word) > width:  # too long for any line: as many characters as fit, at least one
            n = 1
            while font.getlength(word[:n + 1]) <= width:
                n += 1
            lines.append(word[:n])
            word = word[n:]
        line = word
    return lines + [line] if line else lines


def _line_height(font) -> int:
    ascent, descent = font.getmetrics()
    return ascent + descent + SPACING


def captioned_grid(images: list[np.ndarray], captions: list[str], cols: int = 4,
                   extra: list[np.ndarray] | None = None, tile: int = TILE) -> Image.Image:
    """Tiles of `tile` pixels with their caption beneath, wrapped whole; `extra` puts a second image (e.g. a
    commit map) beside each."""
    font = ImageFont.load_default(size=12)
    per = 2 if extra is not None else 1
    w = tile * per + 2 * PAD
    wrapped = [caption_lines(c, font, w - 2 * PAD) for c in captions]
    n_lines = max([MIN_CAPTION_LINES, *map(len, wrapped)])
    cap_h = n_lines * _line_height(font) + PAD
    h = tile + cap_h + 4
    rows = (len(images) + cols - 1) // cols
    canvas = Image.new("RGB", (cols * w, rows * h), "white")
    draw = ImageDraw.Draw(canvas)
    for i, img in enumerate(images):
        x, y = (i % cols) * w + PAD, (i // cols) * h + 4
        canvas.paste(Image.fromarray(img).resize((tile, tile), Image.NEAREST), (x, y))
        if extra is not None:
            canvas.paste(Image.fromarray(extra[i]).resize((tile, tile), Image.NEAREST), (x + tile, y))
        for k, line in enumerate(wrapped[i]):  # line by line at the height the band was sized by
            draw.text((x, y + tile + 3 + k * _line_height(font)), line, fill="black", font=font)
    return canvas
