"""Standalone HTML pages with embedded figures, for `ssdgen bench --html` and `ssdgen report`.

Everything a page shows is inside the one file: figures are matplotlib (Agg) or PIL images embedded as
base64 PNG `data:` URLs, styles are inline, and there are no scripts and no external URLs, so a page
opens the same from a laptop, a bucket or a CI artifact.
"""

from __future__ import annotations

import base64
import html
import io
import math

import numpy as np

CSS = """
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 24px; color: #222;
       max-width: 1400px; }
h1 { font-size: 22px; margin-bottom: 4px; } h2 { font-size: 18px; margin-top: 28px; }
.meta { color: #555; font-size: 13px; }
table { border-collapse: collapse; font-size: 13px; margin: 8px 0; }
th, td { border: 1px solid #ccc; padding: 3px 7px; text-align: right; }
th { background: #f2f2f2; } td.l, th.l { text-align: left; }
.note { background: #fff8e1; border-left: 4px solid #f0b400; padding: 6px 10px; font-size: 13px; }
.grid { display: flex; flex-wrap: wrap; gap: 10px; }
.tile { width: 196px; font-size: 11px; } .tile img { image-rendering: pixelated; }
.legend span { display: inline-block; padding: 2px 8px; margin-right: 6px; color: #fff; font-size: 12px; }
.err { color: #b00020; }
"""


def esc(x) -> str:
    return html.escape(str(x), quote=True)


def png_b64(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def img_tag(png: bytes, alt: str = "", width: int | None = None) -> str:
    w = f' width="{width}"' if width else ""
    return f'<img src="{png_b64(png)}" alt="{esc(alt)}"{w}>'


def array_png(a: np.ndarray, scale: int = 1) -> bytes:
    """uint8 [H, W, 3] -> PNG bytes, optionally scaled up by nearest neighbour."""
    from PIL import Image
    im = Image.fromarray(np.asarray(a, dtype=np.uint8))
    if scale > 1:
        im = im.resize((im.width * scale, im.height * scale), Image.NEAREST)
    buf = io.BytesIO()
    im.save(buf, format="PNG")
    return buf.getvalue()


def fig_png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    import matplotlib.pyplot as plt
    plt.close(fig)
    return buf.getvalue()


def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def fmt(v, digits: int = 3) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if not math.isfinite(v):
            return "n/a"
        if v != 0 and (abs(v) < 0.1 or abs(v) >= 1e6):
            return f"{v:.{digits}g}"
        return f"{v:,.{digits}f}"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, (list, tuple)):  # an interval
        return "[" + ", ".join(fmt(x, digits) for x in v) + "]"
    return str(v)


def table(rows: list[dict], cols: list[tuple[str, str]], left: tuple[str, ...] = ()) -> str:
    """rows of dicts, cols [(key, header)] -> an HTML table."""
    head = "".join(f'<th class="{"l" if k in left else ""}">{esc(h)}</th>' for k, h in cols)
    body = "".join("<tr>" + "".join(f'<td class="{"l" if k in left else ""}">{esc(fmt(r.get(k)))}</td>'
                                    for k, _ in cols) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def page(title: str, body: str, meta: str = "") -> str:
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{esc(title)}</title>'
            f"<style>{CSS}</style></head><body><h1>{esc(title)}</h1>"
            f'<div class="meta">{meta}</div>{body}</body></html>\n')


# ------------------------------------------------------------------------------------------ bench figures

DECODER_COLOURS = ["#444444", "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2"]


def _colour_map(decoders: list[str]) -> dict[str, str]:
    return {d: DECODER_COLOURS[i % len(DECODER_COLOURS)] for i, d in enumerate(decoders)}


def _decoders(rows: list[dict]) -> list[str]:
    seen: list[str] = []
    for r in rows:
        if r["decoder"] not in seen:
            seen.append(r["decoder"])
    return seen


def pareto_front(points: list[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point beats on both axes (higher is better on each), by x."""
    keep = []
    for i, (x, y) in enumerate(points):
        if not any((x2 >= x and y2 >= y) and (x2 > x or y2 > y) for j, (x2, y2) in enumerate(points) if j != i):
            keep.append(i)
    return sorted(keep, key=lambda i: points[i][0])


def pareto_plot(rows: list[dict]) -> bytes:
    """Speedup vs AR (x) against scene accuracy (y), a point per decoder and batch size."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(4.9, 3.6))
    colours = _colour_map(_decoders(rows))
    markers = "osD^v<>ph*"
    sizes = sorted({r["batch_size"] for r in rows})
    have_q = [r for r in rows if r.get("scene_accuracy") is not None and r.get("speedup_vs_ar") is not None]
    ax.set_xlabel("wall-clock speedup vs ar (same batch size, same run)")
    ax.set_ylabel("scene accuracy")
    ax.set_title("speed vs quality")
    if not have_q:
        for r in rows:
            if r.get("speedup_vs_ar") is not None:
                ax.scatter(r["speedup_vs_ar"], 0, color=colours[r["decoder"]],
                           marker=markers[sizes.index(r["batch_size"]) % len(markers)])
        ax.set_ylim(-1, 1)
        ax.set_yticks([])
        ax.text(0.5, 0.82, "quality skipped (--quality-n 0):\nno scene accuracy measured in this run;\n"
                          "points show speedup only", transform=ax.transAxes, ha="center", va="center",
                fontsize=9, color="#b00020", bbox=dict(facecolor="#fff8e1", edgecolor="#f0b400"))
    else:
        pts = [(r["speedup_vs_ar"], r["scene_accuracy"]) for r in have_q]
        for r in have_q:
            ax.scatter(r["speedup_vs_ar"], r["scene_accuracy"], color=colours[r["decoder"]], s=46,
                       marker=markers[sizes.index(r["batch_size"]) % len(markers)], zorder=3)
        front = pareto_front(pts)
        ax.plot([pts[i][0] for i in front], [pts[i][1] for i in front], "--", color="#999", zorder=2,
                label="Pareto front")
        ax.axvline(1.0, color="#ccc", lw=1)
    handles = [plt.Line2D([], [], color=c, marker="o", ls="", label=d) for d, c in colours.items()]
    handles += [plt.Line2D([], [], color="#555", marker=markers[i % len(markers)], ls="", label=f"batch {b}")
                for i, b in enumerate(sizes)]
    if have_q:
        handles.append(plt.Line2D([], [], color="#999", ls="--", label="Pareto front"))
    ax.legend(handles=handles, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=4, frameon=False)
    ax.grid(alpha=0.3)
    return fig_png(fig)


def throughput_plot(rows: list[dict]) -> bytes:
    """Images/s against batch size (log x), a line per decoder, with the rounds' 95% intervals."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(4.9, 3.6))
    colours = _colour_map(_decoders(rows))
    for d, c in colours.items():
        rs = sorted((r for r in rows if r["decoder"] == d), key=lambda r: r["batch_size"])
        x, y = [r["batch_size"] for r in rs], [r["images_per_s"] for r in rs]
        ci = [r.get("images_per_s_ci") or [v, v] for r, v in zip(rs, y)]  # the rounds' 95% interval
        ax.errorbar(x, y, yerr=[[v - lo for v, (lo, _) in zip(y, ci)], [hi - v for v, (_, hi) in zip(y, ci)]],
                    fmt="o-", color=c, label=d, capsize=3)
    ax.set_xscale("log", base=2)
    sizes = sorted({r["batch_size"] for r in rows})
    ax.set_xticks(sizes)
    ax.set_xticklabels([str(s) for s in sizes])
    ax.set_xlabel("batch size (log scale)")
    ax.set_ylabel("images / s")
    ax.set_title("throughput vs batch size")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=4, frameon=False)
    return fig_png(fig)


def frontier_plot(rows: list[dict]) -> bytes:
    """Images/s (each decoder at its best measured batch size) against the NLL gap to ar with its 95%
    interval; Pareto-optimal settings (no other is both faster and closer to ar) ringed and joined."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(4.9, 3.6))
    colours = _colour_map(_decoders(rows))
    best = {}
    for r in rows:
        if r.get("nll_gap") is not None and r["images_per_s"] > best.get(r["decoder"], {}).get("images_per_s", -1):
            best[r["decoder"]] = r
    pts = list(best.values())
    front = pareto_front([(-abs(r["nll_gap"]), r["images_per_s"]) for r in pts])
    for i, r in enumerate(pts):
        lo, hi = r["nll_gap_ci"]
        ax.errorbar(r["nll_gap"], r["images_per_s"], xerr=[[r["nll_gap"] - lo], [hi - r["nll_gap"]]], fmt="o",
                    color=colours[r["decoder"]], ms=7, capsize=3, zorder=3,
                    label=f"{r['decoder']} (batch {r['batch_size']})")
        if i in front:
            ax.scatter(r["nll_gap"], r["images_per_s"], s=190, facecolors="none", edgecolors="#222", zorder=4)
    line = sorted((pts[i] for i in front), key=lambda r: abs(r["nll_gap"]))
    ax.plot([r["nll_gap"] for r in line], [r["images_per_s"] for r in line], "--", color="#999", zorder=2)
    ax.axvline(0, color="#ccc", lw=1)
    ax.set_xlabel("NLL gap to ar under the target (nats/token, 95% interval)")
    ax.set_ylabel("images / s (best batch size)")
    ax.set_title("speed vs fidelity (ringed: Pareto-optimal)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, frameon=False)
    return fig_png(fig)


def samples_table(samples: dict) -> str:
    """AR beside each decoder on the same prompts: a column per decoder, a row per prompt."""
    labels = list(samples["images"])
    head = "".join(f"<th>{esc(lb)}</th>" for lb in labels)
    body = []
    for i, prompt in enumerate(samples["prompts"]):
        cells = "".join(f"<td>{img_tag(array_png(samples['images'][lb][i], 2), lb)}</td>" for lb in labels)
        body.append(f'<tr><td class="l" style="max-width:220px">{esc(prompt)}</td>{cells}</tr>')
    return f'<table><tr><th class="l">prompt</th>{head}</tr>{"".join(body)}</table>'


BENCH_COLS = [("decoder", "decoder"), ("batch_size", "batch"), ("n", "n"), ("rounds", "rounds"),
              ("planned_as", "plan"), ("forwards_per_image", "forwards / image"),
              ("tokens_per_forward", "tokens / forward"), ("waste", "tokens computed / committed"),
              ("seconds_per_image", "s / image"), ("images_per_s", "images / s"), ("images_per_s_ci", "95% interval"),
              ("latency_p50_s", "latency p50 (s)"), ("latency_p90_s", "latency p90 (s)"),
              ("speedup_vs_ar", "vs ar (same batch)"), ("speedup_vs_ar_ci", "95% interval"),
              ("speedup_vs_ar_verdict", "verdict"), ("usd_per_1k_images", "$ / 1k images"),
              ("nll_gap", "NLL gap to ar"), ("nll_gap_ci", "95% interval"), ("indistinguishable", "= ar?"),
              ("fd_to_ar", "FD to ar"),
              ("scene_accuracy", "scene acc."), ("object_accuracy", "object acc."), ("fd", "FD")]


BEST_COLS = [("decoder", "decoder"), ("batch_size", "best batch"), ("images_per_s", "images / s"),
             ("images_per_s_ci", "95% interval"), ("vs_ar_best", "vs ar's best"), ("vs_ar_best_ci", "95% interval"),
             ("vs_ar_best_verdict", "verdict"), ("usd_per_1k_images", "$ / 1k images on demand"),
             ("usd_per_1k_images_ci", "95% interval"),
             ("usd_per_1k_images_spot", "$ / 1k images spot"), ("waste", "tokens computed / committed"),
             ("nll_gap", "NLL gap to ar"), ("nll_gap_ci", "95% interval"), ("within_tolerance", "within tolerance"),
             ("latency_batch1_s", "latency at batch 1 (s / image)")]


def present(rows: list[dict], cols: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The columns some row has a value in: a table keeps no empty column."""
    return [c for c in cols if any(r.get(c[0]) is not None for r in rows)]


def verdict_section(res: dict) -> list[str]:
    """The page's first lines: the verdict, the noise floor it was judged by, and any warning of a busy machine."""
    out = []
    v, noise = res.get("verdict"), res.get("noise") or {}
    if v:
        out += ["<h2>Verdict</h2>", f"<p><b>{esc(v['text'])}</b></p>"]
    if noise.get("floor") is not None:
        out.append(f'<p class="meta">Timed in {esc(res.get("rounds"))} interleaved rounds; medians with 95% '
                   f"intervals. Noise floor {noise['floor']:.1%}: AR against AR in the same rounds. A ratio whose "
                   "interval holds 1 or lies within the floor is &ldquo;no measurable difference&rdquo;.</p>")
    elif "rounds" in res:
        out.append('<p class="note">One round: no intervals, so no difference can be told from noise.</p>')
    for w in (res.get("load") or {}).get("warnings", []):
        out.append(f'<p class="note err">Busy machine: {esc(w)}</p>')
    return out


def best_section(res: dict) -> list[str]:
    """The page's headline: each decoder at its best measured batch size (bench.noise.best_batches), or
    nothing for a result recorded before the bench reported it."""
    best = res.get("best")
    if not best:
        return []
    sizes = sorted({r["batch_size"] for r in res["rows"]})
    return ["<h2>Best batch per decoder</h2>", table(best, present(best, BEST_COLS), left=("decoder",)),
            f'<p class="meta">Each decoder at the batch size with the most images/s among those measured '
            f'({esc(", ".join(map(str, sizes)))}): what a dataset job would run; rows planned as plain AR are not '
            "ranked. &ldquo;vs ar\'s best&rdquo; divides its images/s by ar's at ar's own best batch size, round "
            "by round. Tokens computed / committed: query tokens fed to the model in both CFG rows per image token "
            "(plain AR with CFG: 2).</p>"]


def bench_html(res: dict, samples: dict | None = None) -> str:
    """The bench result (bench.decode.bench's dict) as one standalone HTML page; `samples` (the bench's
    side-by-side images) add a grid of ar beside each decoder on the same prompts."""
    rows = res["rows"]
    p = res.get("price") or {}
    meta = (f"model {esc(res.get('model'))} &middot; device {esc(res.get('device'))} &middot; "
            f"{esc(res.get('date'))} &middot; sampling {esc(res.get('sampling'))}")
    quality = any(r.get("scene_accuracy") is not None for r in rows)
    body = verdict_section(res) + best_section(res) + [
        "<h2>Results</h2>", table(rows, present(rows, BENCH_COLS), left=("decoder", "speedup_vs_ar_verdict"))]
    if p:
        spot = p.get("spot_usd_per_hour")
        spot = "no price" if spot is None else f'{esc(spot)} $/{esc(p.get("unit"))}-hour'
        body.append(f'<p class="meta">$ / 1k images = device-seconds per image &times; '
                    f'{esc(p.get("on_demand_usd_per_hour"))} $/{esc(p.get("unit"))}-hour on demand / 3600 '
                    f'&times; 1000 (spot: {spot}), '
                    f'with {esc(res.get("devices"))} {esc(p.get("unit"))}(s) billed '
                    f'(device type {esc(p.get("device_type"))}, {esc(p.get("instance_type"))}; '
                    f'price from {esc(p.get("origin") or "the shipped table")}, as of {esc(p.get("as_of"))}: '
                    f'{esc(p.get("source"))}).</p>')
    body += ['<div class="grid">']
    if quality:
        body += ["<div><h2>Speed vs quality</h2>", img_tag(pareto_plot(rows), "Pareto plot: speedup vs scene accuracy"),
                 "</div>"]
    body += ["<div><h2>Throughput</h2>", img_tag(throughput_plot(rows), "images/s vs batch size"), "</div>"]
    fidelity = any(r.get("nll_gap") is not None for r in rows)
    if fidelity:
        body += ["<div><h2>Speed vs fidelity</h2>", img_tag(frontier_plot(rows), "images/s vs NLL gap"), "</div>"]
    body.append("</div>")
    if not quality:  # the plot it would have drawn is left out, and the page says why
        body.append('<p class="note">Quality was skipped in this run (--quality-n 0): no scene accuracy, '
                    "object accuracy or FD, so no speed-vs-quality plot.</p>")
    if not fidelity:
        body.append('<p class="note">Fidelity was skipped in this run (--fidelity-n 0): no NLL gap to ar, so no '
                    "speed-vs-fidelity plot.</p>")
    if samples:
        body += ["<h2>Same prompts, ar beside each decoder</h2>", samples_table(samples)]
    return page(f"ssdgen bench: {res.get('model', '')}", "\n".join(body), meta)
