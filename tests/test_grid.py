"""Captioned grids (reference/grid.py): a long caption wraps whole, every word drawn inside its own cell (#49: a
5-line caption in `make demo`'s grid lost its last word under the next row)."""

import numpy as np
from PIL import ImageFont

from ssdgen.reference.grid import PAD, TILE, caption_lines, captioned_grid

LONG = ("a large red circle at the top left, a small blue square at the bottom right, a medium green triangle at "
        "the center and a small purple diamond at the top right on a striped yellow background")


def _font():
    return ImageFont.load_default(size=12)


def test_caption_lines_keep_every_word_in_order_within_the_width():
    lines = caption_lines(LONG, _font(), TILE)
    assert len(lines) >= 6 and " ".join(lines).split() == LONG.split()
    assert all(_font().getlength(line) <= TILE for line in lines)


def test_a_word_wider_than_a_line_is_cut_not_dropped():
    word = "x" * 80
    lines = caption_lines(f"{word} end", _font(), 100)
    assert "".join(lines).replace(" ", "") == word + "end" and all(_font().getlength(x) <= 100 for x in lines)


def _text_rows(canvas, x0, x1, y0, y1) -> np.ndarray:
    """The pixel rows in a region that hold any dark (text) pixel."""
    a = np.asarray(canvas.convert("L"))[y0:y1, x0:x1]
    return np.nonzero((a < 128).any(axis=1))[0] + y0


def test_every_line_of_a_long_caption_is_drawn_inside_its_cell():
    white = np.full((64, 64, 3), 255, np.uint8)  # only the captions are dark
    n = len(caption_lines(LONG, _font(), TILE))
    g = captioned_grid([white] * 4, [LONG, "short", "short", "short"], cols=2)
    cell_w, cell_h = g.width // 2, g.height // 2
    rows = _text_rows(g, 0, cell_w, 4 + TILE, cell_h)
    assert rows.max() < cell_h - 2, "the last line runs into the next row"
    # as many separate text lines as the caption wraps to: each is a run of dark pixel rows
    runs = 1 + int((np.diff(rows) > 1).sum())
    assert runs == n, (runs, n)
    one_row = captioned_grid([white], [LONG], cols=1)  # the last row: nothing cut at the canvas' bottom
    assert _text_rows(one_row, 0, one_row.width, 4 + TILE, one_row.height).max() < one_row.height - 2
    assert one_row.width == TILE + 2 * PAD


def test_short_captions_keep_the_grid_size():
    white = np.full((64, 64, 3), 255, np.uint8)
    assert captioned_grid([white] * 2, ["a", "b"], cols=2).size == (2 * (TILE + 2 * PAD), 266)
