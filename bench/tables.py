"""`ssdgen bench`'s tables as aligned text, for the console and a log: the columns a terminal has room for, each
under a header a person reads ("images / s", not `images_per_s`), as the HTML page heads them (bench/plots.py).
A column no row has a value in is left out; numbers are right-aligned, names left-aligned (#49: the tables were
`|`-separated field names over unaligned values)."""

from __future__ import annotations

# (row key, header): each decoder at its best batch size, then every decoder and batch size
BEST_COLS = (("decoder", "decoder"), ("batch_size", "best batch"), ("images_per_s", "images / s"),
             ("images_per_s_ci", "95% interval"), ("vs_ar_best", "vs ar's best"), ("vs_ar_best_ci", "95% interval"),
             ("vs_ar_best_verdict", "verdict"), ("usd_per_1k_images", "$ / 1k images"),
             ("usd_per_1k_images_ci", "95% interval"), ("usd_per_1k_images_spot", "$ / 1k spot"),
             ("waste", "computed / committed"), ("nll_gap", "NLL gap to ar"), ("nll_gap_ci", "95% interval"),
             ("within_tolerance", "within tolerance"), ("latency_batch1_s", "s / image at batch 1"))
ROW_COLS = (("decoder", "decoder"), ("batch_size", "batch"), ("forwards_per_image", "forwards / image"),
            ("tokens_per_forward", "tokens / forward"), ("waste", "computed / committed"),
            ("images_per_s", "images / s"), ("images_per_s_ci", "95% interval"), ("speedup_vs_ar", "vs ar"),
            ("speedup_vs_ar_ci", "95% interval"), ("speedup_vs_ar_verdict", "verdict"),
            ("usd_per_1k_images", "$ / 1k images"), ("planned_as", "plan"), ("nll_gap", "NLL gap to ar"),
            ("scene_accuracy", "scene acc."), ("object_accuracy", "object acc."), ("fd", "FD"))
LEFT = ("decoder", "vs_ar_best_verdict", "speedup_vs_ar_verdict", "planned_as")


def cell(v) -> str:
    """A value as the tables print it: 4 significant digits, an interval in brackets, yes/no, "" for none."""
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, (list, tuple)):  # an interval
        return "[" + ", ".join(cell(x) for x in v) + "]"
    return "" if v is None else str(v)


def text_table(rows: list[dict], cols: tuple[tuple[str, str], ...]) -> list[str]:
    """The rows under their headers, each column as wide as its widest entry, two spaces apart."""
    cols = tuple((k, h) for k, h in cols if any(r.get(k) is not None for r in rows))  # no empty column
    grid = [[h for _, h in cols]] + [[cell(r.get(k)) for k, _ in cols] for r in rows]
    widths = [max(len(line[i]) for line in grid) for i in range(len(cols))]
    out = []
    for line in grid:
        parts = [v.ljust(w) if k in LEFT else v.rjust(w) for (k, _), v, w in zip(cols, line, widths)]
        out.append("  ".join(parts).rstrip())
    return out
