"""SSD's scaling claim: forwards per image against grid side n (an n×n image).

AR needs n² forwards. SSD drafts a block of `rows` rows per step and verifies it with r auto-correction
rounds, so lossy SSD needs about (n / rows)·(1 + r) forwards: linear in n. Only a 16×16 reference model can
be trained on this machine within the budget, so the curve over n ∈ {8, 16, 32} is measured on tiny random
models of the reference architecture (peaked, context-dependent distributions; heads briefly
self-distilled on each), which shows the decoders' structural cost; the trained 16×16 reference model's
measured point is drawn beside it when a bench JSON is given. The slope of log(forwards) on log(n) says
whether the cost is linear (≈ 1) or quadratic (≈ 2).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np

SIDES = (8, 16, 32)
DECODERS = ("ar", "sjd:window=16", "ssd:commit=block:rows=2:rounds=2", "sjd:window=33:coupled=true",
            "ssd:rows=2:lossless=true",
            "ssd+csd:commit=block:rows=2:rounds=2:adaptive=true:max_rows=4:calibrated=false",
            "ssd+csd:calibrated=false")  # no AR fallback: forwards only
PROMPTS = ["a large red circle at the center on a flat gray background",
           "a small blue square at the top left on a wavy beige background",
           "a large shaded green triangle at the bottom right on a cloudy slate background",
           "a small dotted yellow diamond at the top middle on a striped brown background"]


def run(sides=SIDES, n_prompts: int = 8, reference_bench: str | None = None, plot: str | None = None,
        log=print) -> dict:
    import torch
    from ssdgen.decoders import build
    from ssdgen.decoders.spec import DecodeSpec
    from ssdgen.decoders.ssd_train import DistillConfig, train_heads
    from ssdgen.reference.tiny import tiny_model
    if reference_bench and not Path(reference_bench).is_file():  # checked before minutes of training
        raise FileNotFoundError(f"{reference_bench}: no such bench JSON (--reference-bench)")
    specs = [DecodeSpec.parse(d) for d in DECODERS]
    sc = specs[0].sampling
    prompts = (PROMPTS * n_prompts)[:n_prompts]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in sides:
            m = tiny_model(Path(tmp) / f"g{n}", codes=64, grid=n, scale=0.3)
            heads, _ = train_heads(m, PROMPTS * 4, sc, DistillConfig(n_images=16, sample_batch=16, steps=150,
                                                                      batch=512), log=lambda *a: None)
            heads.save(m.default_heads)
            for spec in specs:
                torch.manual_seed(0)
                res = build(spec, m).decode(prompts, list(range(len(prompts))))
                f = float(np.mean([s.forwards for s in res.stats]))
                rows.append({"side": n, "tokens": n * n, "decoder": spec.label, "forwards_per_image": f})
                log(f"n={n:>2}  {spec.label:<40} {f:8.1f} forwards/image")
    slopes = {}
    for dec in dict.fromkeys(r["decoder"] for r in rows):
        pts = [(r["side"], r["forwards_per_image"]) for r in rows if r["decoder"] == dec]
        x, y = np.log([p[0] for p in pts]), np.log([p[1] for p in pts])
        slopes[dec] = float(np.polyfit(x, y, 1)[0])
    ref = None
    if reference_bench:
        b = json.loads(Path(reference_bench).read_text())
        ref = [{"side": 16, "decoder": r["decoder"], "forwards_per_image": r["forwards_per_image"]}
               for r in b["rows"] if r["batch_size"] == 1]
    out = {"sides": list(sides), "n_prompts": n_prompts, "rows": rows, "loglog_slope": slopes,
           "reference_model_points": ref,
           "note": "tiny random models of the reference architecture; slope 1 = linear in n, 2 = quadratic"}
    if plot:
        _plot(out, plot)
    return out


def _plot(res: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6.4, 4.4), dpi=120)
    for dec, slope in res["loglog_slope"].items():
        pts = [(r["side"], r["forwards_per_image"]) for r in res["rows"] if r["decoder"] == dec]
        ax.plot(*zip(*pts), marker="o", label=f"{dec} (slope {slope:.2f})")
    for r in res.get("reference_model_points") or []:
        ax.scatter([16], [r["forwards_per_image"]], marker="*", s=80, color="black", zorder=5)
    if res.get("reference_model_points"):
        ax.scatter([], [], marker="*", s=80, color="black", label="trained reference model (16×16), batch 1")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(res["sides"], [str(s) for s in res["sides"]])
    ax.set_xlabel("grid side n (image is n×n tokens)")
    ax.set_ylabel("forwards per image")
    ax.set_title("Forwards per image vs grid side (tiny random models)")
    ax.legend(fontsize=7)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
