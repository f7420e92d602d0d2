"""`ssdgen report RUN_URL --html PATH`: one standalone HTML page about a pipeline run.

It reads only what the run wrote, through fsspec (any URL the pipeline writes to): the commit markers
(`shards/*/_SUCCESS.json`) or, without them, `manifest.parquet`, for the committed shards' files; those
shards' `images.parquet` and `stats.parquet`; `summary.json` and `_config.json` where present. Uncommitted
attempts are never read. No model, no Prefect, no Ray.

The page: the run's settings and counts; a sample grid of images with their prompts; acceptance heatmaps
(each image beside itself tinted by the stored `commit_map`: one colour per commit code) and the mean
acceptance per token position over all images (for a run decoded as plain AR, one sentence saying so instead of
uniformly gray maps); histograms of forwards per image and acceptance rate (one with no values left out, and
said); the cost table (`output.cost.cost_table` on summary.json, or on the markers when the run has no summary
yet; at the price the run recorded, or recomputed at the user's --prices / --usd-per-hour); failed samples
counted by reason and by message, one by one, and failed shards.
"""

from __future__ import annotations

import io
import math
from collections import Counter
from pathlib import Path

import numpy as np

from ssdgen.decoders.sample_stats import COMMIT_ACCEPTED, COMMIT_AR, COMMIT_BONUS, COMMIT_RELAXED, COMMIT_RESAMPLED
from ssdgen.decoders.spec import DecodeSpec
from ssdgen.output.layout import plan_words
from ssdgen.output.reader import read_run
from ssdgen.workers.results import UNRECORDED

from . import plots

COMMIT_COLOURS = {  # RGB; the same colours as the docs' figures (lab/reference/commit_maps.py)
    COMMIT_AR: (128, 128, 128), COMMIT_ACCEPTED: (40, 170, 60), COMMIT_RESAMPLED: (220, 40, 40),
    COMMIT_BONUS: (60, 90, 230), COMMIT_RELAXED: (250, 210, 30),
}
COMMIT_LABELS = {COMMIT_AR: "plain AR", COMMIT_ACCEPTED: "accepted draft", COMMIT_RESAMPLED: "resampled / corrected",
                 COMMIT_BONUS: "bonus", COMMIT_RELAXED: "relaxed (CSD)"}
SPECULATED = (COMMIT_ACCEPTED, COMMIT_BONUS, COMMIT_RELAXED)  # committed without a forward of their own


def load_run(url: str, samples: int = 24) -> dict:
    """Everything the report shows, from the one reader of a run's output (output.reader.read_run)."""
    return read_run(url, samples)


# ------------------------------------------------------------------------------------------ drawing

def decode_image(data: bytes) -> np.ndarray:
    from PIL import Image
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))  # PNG, WebP or JPEG: Pillow sniffs it


def commit_colours(commit_map: np.ndarray) -> np.ndarray:
    """[H, W] commit codes -> [H, W, 3] uint8 colours."""
    c = np.zeros(commit_map.shape + (3,), np.uint8)
    for code, rgb in COMMIT_COLOURS.items():
        c[commit_map == code] = rgb
    return c


def heatmap_overlay(image: np.ndarray, commit_map: np.ndarray, alpha: float = 0.55) -> np.ndarray:
    """uint8 image [h, w, 3] tinted by its [H, W] commit map (any grid: each token covers h/H x w/W pixels)."""
    from PIL import Image
    colours = Image.fromarray(commit_colours(commit_map)).resize((image.shape[1], image.shape[0]), Image.NEAREST)
    return (image * (1 - alpha) + np.asarray(colours, np.float32) * alpha).astype(np.uint8)


def commit_grid(row: dict) -> np.ndarray | None:
    cm, h, w = row.get("commit_map"), row.get("grid_height"), row.get("grid_width")
    if cm is None or not h or not w or len(cm) != h * w:
        return None
    return np.asarray(cm, np.int8).reshape(h, w)


def acceptance_by_position(stats: list[dict]) -> np.ndarray | None:
    """Share of images in which each token position was committed speculatively (accepted, bonus, relaxed)."""
    maps = [m for m in (commit_grid(r) for r in stats if r["status"] == "ok") if m is not None]
    shapes = {m.shape for m in maps}
    if not maps or len(shapes) != 1:
        return None
    return np.mean([np.isin(m, SPECULATED) for m in maps], axis=0)


def _hist(vals: list[float], title: str, xlabel: str) -> bytes:
    """A histogram of finite values (the caller leaves out one that has none, and says why)."""
    plt = plots._plt()
    fig, ax = plt.subplots(figsize=(5.0, 3.2))
    ax.hist(vals, bins=min(30, max(5, len(set(vals)))), color="#1f77b4", edgecolor="white")
    ax.axvline(float(np.mean(vals)), color="#d62728", ls="--", label=f"mean {np.mean(vals):.3g}")
    ax.legend(fontsize=8)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("images")
    ax.grid(alpha=0.3)
    return plots.fig_png(fig)


def _position_plot(share: np.ndarray) -> bytes:
    plt = plots._plt()
    fig, ax = plt.subplots(figsize=(4.2, 3.6))
    im = ax.imshow(share, cmap="viridis", vmin=0, vmax=1, interpolation="nearest")
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04, label="share speculated")
    ax.set_title("accepted + bonus + relaxed, per token")
    ax.set_xticks([])
    ax.set_yticks([])
    return plots.fig_png(fig)


# ------------------------------------------------------------------------------------------- the page

def _legend() -> str:
    spans = "".join(f'<span style="background: rgb{COMMIT_COLOURS[c]}">{plots.esc(COMMIT_LABELS[c])}</span>'
                    for c in (COMMIT_ACCEPTED, COMMIT_RELAXED, COMMIT_BONUS, COMMIT_RESAMPLED, COMMIT_AR))
    return f'<p class="legend">{spans}</p>'


def _tile(png: bytes, caption: str, extra: str = "") -> str:
    return f'<div class="tile">{png and plots.img_tag(png, caption)}{extra}<div>{plots.esc(caption)}</div></div>'


def _cost(run: dict, prices: dict) -> tuple[list[dict], str]:
    """The cost table and a note saying what it is from; at the user's `prices` (price_from's keyword
    arguments) when given, else at the run's recorded price."""
    from ssdgen.output.cost import cost_table, price_words, reprice, run_summary
    from ssdgen.output.reader import view_price
    s = run["summary"]
    if s and s.get("price"):
        if not any(v is not None for v in prices.values()):
            return cost_table(s), "from summary.json"
        price, _ = view_price(None, s["price"]["device_type"], **prices)
        return cost_table(reprice(s, price)), (f"from summary.json, recomputed at your price; the run was costed "
                                               f"at {price_words(s['price'])}")
    markers = run["markers"]
    types = {m.device_type for m in markers.values()}
    if markers and len(types) == 1:
        recs = [markers[k] for k in sorted(markers)]
        price, given = view_price(run.get("price"), types.pop(), **prices)
        s = run_summary([m.to_dict() for m in recs], price, wall_s=sum(m.wall_s for m in recs))
        return cost_table(s), ("so far, from the commit markers (this run has no summary.json yet)"
                               + (", at your price" if given else ""))
    return [], "no summary.json and no markers with one device type: no cost table"


def build_html(run: dict, samples: int = 24, prices: dict | None = None) -> str:
    """The page: header, plan and damage notes, then one section per part (samples, heatmaps, histograms, cost,
    failures); the cost at the user's `prices` (output.cost.price_from's keyword arguments) when given."""
    stats = run["stats"]
    ok = [r for r in stats if r["status"] == "ok"]
    bad = [r for r in stats if r["status"] != "ok"]
    conf = run["config"] or {}
    decoder = conf.get("decoder") or (stats[0]["decoder"] if stats else "?")
    meta = (f"run {plots.esc(run['url'])} &middot; decoder {plots.esc(decoder)} "
            f"{plots.esc(conf.get('params') or '')} &middot; model {plots.esc(conf.get('model', '?'))} &middot; "
            f"{len(run['files'])} committed shards &middot; {len(ok)} images ok, {len(bad)} failed")
    body = []
    if (how := plan_words(run.get("plan"))) is not None:  # a fall-back to plain AR is said, never silent
        body.append(f"<p class=\"plan\">Decode plan (decided once for this run): {plots.esc(how)}</p>")
    if len(by := Counter(r["decoder"] for r in stats)) > 1 or (by and next(iter(by)) != decoder):
        body.append("<p class=\"plan\">Rows by the resolved spec that decoded them: "
                    + "; ".join(f"{plots.esc(str(k))}: {n}" for k, n in by.most_common()) + "</p>")
    if run.get("damaged"):
        body.append(f"<p class=\"damaged\">{len(run['damaged'])} damaged shard(s) left out (the same generate "
                    "re-decodes them): " + "; ".join(plots.esc(str(d)) for d in run["damaged"][:10]) + "</p>")
    shown = [im for im in run["images"] if im["image"] is not None][:samples]
    body += _samples(shown, len(ok))
    if (why := plain_ar(run, ok)) is not None:  # a gray map per image says nothing: one sentence says why instead
        body += ["<h2>Acceptance heatmaps</h2>", f'<p class="note">No acceptance heatmaps: every image was decoded '
                 f"as plain AR ({plots.esc(why)}), so each token's map would be the same gray.</p>"]
    else:
        body += _heatmaps(shown, stats, len(ok))
    body += _histograms(ok)
    rows, note = _cost(run, prices or {})
    body.append(f"<h2>Cost</h2><p class=\"meta\">{plots.esc(note)}</p>")
    if rows:
        body.append(plots.table(rows, [("metric", "metric"), ("value", "value")], left=("metric", "value")))
    body += _failures(bad, run)
    return plots.page(f"ssdgen run report: {run['url']}", "\n".join(body), meta)


def plain_ar(run: dict, ok: list[dict]) -> str | None:
    """Why no ok image has a token committed other than by plain AR (the run's plan chose ar, or its decoder
    is ar), or None when some image speculated (or has no commit map to tell)."""
    grids = [commit_grid(r) for r in ok]
    if not grids or any(g is None or (g != COMMIT_AR).any() for g in grids):
        return None
    plan = run.get("plan")
    if plan is not None and _plain_ar_spec(plan.get("spec")):
        return "the decode plan chose ar"
    if all(_plain_ar_spec(r.get("decoder")) for r in ok):
        return "its decoder is ar"
    return "no draft was ever committed"


def _plain_ar_spec(text: str | None) -> bool:
    """Whether a recorded spec's text decodes by plain AR (its recipe does not speculate); a text that does not
    parse (none, or one an older version wrote) is not known to."""
    try:
        return not DecodeSpec.parse(str(text or "")).recipe.speculative
    except ValueError:
        return False


def _samples(shown: list[dict], n_ok: int) -> list[str]:
    body = [f"<h2>Samples ({len(shown)} of {n_ok})</h2><div class=\"grid\">"]
    for im in shown:
        body.append(_tile(plots.array_png(decode_image(im["image"]), scale=max(1, 192 // max(1, im["width"] or 64))),
                          im["prompt"] or ""))
    return body + ["</div>"]


def _heatmaps(shown: list[dict], stats: list[dict], n_ok: int) -> list[str]:
    """Each shown image beside itself tinted by its commit map, and the mean acceptance per token position."""
    st_by_id = {r["prompt_id"]: r for r in stats}
    body = ["<h2>Acceptance heatmaps</h2>",
            "<p>Each image, then the same image tinted by how each token was committed (the stored "
            "<code>commit_map</code>).</p>" + _legend(), '<div class="grid">']
    n_maps = 0
    for im in shown:
        cm = commit_grid(st_by_id.get(im["prompt_id"], {}))
        if cm is None:
            continue
        img = decode_image(im["image"])
        pair = np.concatenate([img, np.full((img.shape[0], 2, 3), 255, np.uint8), heatmap_overlay(img, cm)], axis=1)
        spec = float(np.isin(cm, SPECULATED).mean())
        cap = f"{im['prompt']} (speculated {spec:.0%}, {st_by_id[im['prompt_id']]['forwards']} forwards)"
        body.append(f'<div class="tile heatmap" data-prompt-id="{plots.esc(im["prompt_id"])}" style="width: 392px">'
                    f'{plots.img_tag(plots.array_png(pair, scale=max(1, 192 // max(1, img.shape[0]))), cap)}'
                    f"<div>{plots.esc(cap)}</div></div>")
        n_maps += 1
    body.append("</div>")
    if not n_maps:
        body.append('<p class="note">No commit maps stored for these images.</p>')
    if (share := acceptance_by_position(stats)) is not None:
        body.append(f"<h3>Mean over all {n_ok} images</h3>" + plots.img_tag(_position_plot(share), "per token"))
    return body


def _histograms(ok: list[dict]) -> list[str]:
    """Forwards per image and acceptance rate; a histogram with no values is left out, and a sentence says why."""
    fwd = [r["forwards"] for r in ok if r["forwards"] is not None]
    acc = [v for v in (r["acceptance_rate"] for r in ok) if v is not None and math.isfinite(v)]
    body = ["<h2>Forwards and acceptance</h2><div class=\"grid\">"]
    if fwd:
        body.append(plots.img_tag(_hist(fwd, "forwards per image", "forwards (prefill included)")))
    if acc:
        body.append(plots.img_tag(_hist(acc, "acceptance rate", "accepted drafts / drafts verified")))
    body.append("</div>")
    if not fwd:
        body.append('<p class="note">No histograms: no image of the committed shards succeeded.</p>')
    elif not acc:
        body.append('<p class="note">No acceptance-rate histogram: nothing was drafted (every image was decoded '
                    "as plain AR), so there is no rate to show.</p>")
    return body


def _failures(bad: list[dict], run: dict) -> list[str]:
    """Failed samples by message and one by one; shards that failed to commit."""
    body = ["<h2>Failures</h2>"]
    failed_shards = (run["summary"] or {}).get("shards_failed") or {}
    if not bad and not failed_shards:
        body.append("<p>None: every sample of every committed shard succeeded.</p>")
    if bad:
        prompts = {im["prompt_id"]: im["prompt"] for im in run["images"]}
        body.append(f"<p>{len(bad)} failed samples; by reason:</p>")
        body.append(plots.table([{"reason": k, "count": v} for k, v in errors_by_reason(bad).items()],
                                [("count", "samples"), ("reason", "reason")], left=("reason",)))
        by_msg: dict[str, int] = {}
        for r in bad:
            by_msg[r["error"] or "?"] = by_msg.get(r["error"] or "?", 0) + 1
        body.append("<p>by message:</p>")
        body.append(plots.table([{"error": k, "count": v} for k, v in sorted(by_msg.items(), key=lambda kv: -kv[1])],
                                [("count", "samples"), ("error", "message")], left=("error",)))
        body.append(plots.table([{"prompt_id": r["prompt_id"], "prompt": _short(prompts.get(r["prompt_id"])),
                                  "reason": r.get("error_reason") or UNRECORDED, "error": r["error"]}
                                 for r in bad[:200]],
                                [("prompt_id", "prompt_id"), ("prompt", "prompt"), ("reason", "reason"),
                                 ("error", "error")], left=("prompt_id", "prompt", "reason", "error")))
    if failed_shards:
        body.append(f"<p class=\"err\">{len(failed_shards)} shards failed (not committed):</p>")
        body.append(plots.table([{"shard": k, "error": v} for k, v in failed_shards.items()],
                                [("shard", "shard"), ("error", "error")], left=("error",)))
    return body


def errors_by_reason(bad: list[dict]) -> dict[str, int]:
    """Failed stats rows counted by error_reason, most first (a run from before reasons: "unrecorded")."""
    return dict(Counter(r.get("error_reason") or UNRECORDED for r in bad).most_common())


def _short(p, n: int = 120):
    if p is None:
        return "(null)"
    return p if len(p) <= n else p[:n] + f"... ({len(p):,} chars)"


def write_report(url: str, html_path, samples: int = 24, prices: str | None = None, usd_per_hour=None,
                 spot_usd_per_hour=None) -> dict:
    """Write the page; its cost at the run's recorded price, or at the user's (--prices, --usd-per-hour)."""
    from ssdgen.output.cost import check_price_options
    if samples < 1:
        raise ValueError(f"--samples must be >= 1, got {samples}")
    price_options = {"prices": prices, "usd_per_hour": usd_per_hour, "spot_usd_per_hour": spot_usd_per_hour}
    check_price_options(**price_options)  # a bad value fails before the run is read
    run = load_run(url, samples)
    Path(html_path).write_text(build_html(run, samples, price_options), encoding="utf-8")
    ok = sum(r["status"] == "ok" for r in run["stats"])
    return {"shards": len(run["files"]), "images_ok": ok, "images_failed": len(run["stats"]) - ok}
