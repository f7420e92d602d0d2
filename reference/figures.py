"""Figures for people to look at: captioned grids of eval-prompt samples, commit-map overlays, and the
reference model's learning curve."""

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


def learning_curve_plot(curve: list[dict], path, budget_note: str = "") -> None:
    """Object and scene accuracy (AR, CFG 3, on the curve's eval prompts) against samples seen, with the
    issue's bars, so the next person sees whether more training would still pay."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 3.8))
    x = [p["samples_seen"] for p in curve]
    ax.plot(x, [p["object_accuracy"] for p in curve], "o-", label="object accuracy")
    ax.plot(x, [p["scene_accuracy"] for p in curve], "s-", label="scene accuracy")
    for y, style, label in ((0.70, ":", "bar: object 0.70"), (0.40, "--", "bar: scene 0.40")):
        ax.axhline(y, color="#888", ls=style, lw=1, label=label)
    ax.set_xlabel("training samples seen")
    ax.set_ylabel(f"accuracy on {curve[0]['n'] if curve else 0} eval prompts")
    ax.set_ylim(0, 1)
    ax.set_title("reference model v2: learning curve" + (f" ({budget_note})" if budget_note else ""))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
