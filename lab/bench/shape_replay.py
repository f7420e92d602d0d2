"""Shape replay: the forward shapes a decoder really produced, timed on models of a production size.

A bench on the trained reference model records, per decoder and batch size, the forwards of one batch
(`ForwardCounter`'s trace: rows fed, with CFG's doubled rows; tokens per row; context length). Acceptance
is the trained model's; only the model's size changes. Replaying a trace on a random-weight model of the
Janus-Pro or Chameleon shape (LLaMA-style: RMSNorm, rotary attention, SwiGLU; `reference.gpt.GPT` with
their widths, depths, heads and image vocabulary) in bf16 gives a *measured* s/image for that decoder at
that batch size on this device, at the trace's 16x16 grid. Native grids (24x24, 32x32) would need traces at
those grids: anything said about them from this is an extrapolation and is labelled so.

`projection_error` compares `bench.projection`'s roofline estimate for the same model size, decoder and
batch with the replayed measurement, so the projection's error on this device is known.

    python -m lab shape-replay BENCH_JSON OUT_JSON [--device cuda] [--shapes janus-pro-1b,janus-pro-7b]
                                 [--budget-s 240] [--tiny]
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass

import torch


@dataclass(frozen=True)
class Shape:
    name: str
    dim: int
    n_layers: int
    n_heads: int
    mlp_hidden: int
    codes: int  # image-token vocabulary (the output head's width)
    projection_model: str | None = None  # the bench.projection MODELS key of this size, if any


SHAPES = {
    # Janus-Pro's language model (LLaMA-style, the image head over a 16,384-code VQ vocabulary)
    "janus-pro-1b": Shape("janus-pro-1b", 2048, 24, 16, 5632, 16384, "1b"),
    "janus-pro-7b": Shape("janus-pro-7b", 4096, 30, 32, 11008, 16384, "7b"),
    # Chameleon-7B (LLaMA-2-7B shape, 8,192 image codes inside a 65,536 vocabulary)
    "chameleon-7b": Shape("chameleon-7b", 4096, 32, 32, 11008, 8192, "7b"),
}
TINY = {"tiny-a": Shape("tiny-a", 64, 2, 4, 128, 64), "tiny-b": Shape("tiny-b", 96, 2, 4, 192, 64)}


def build(shape: Shape, prompt_len: int, grid: int, device: str, dtype: torch.dtype):
    from ssdgen.reference.gpt import GPT, GPTConfig
    cfg = GPTConfig(n_image_codes=shape.codes, caption_len=prompt_len, grid=grid, dim=shape.dim,
                    n_layers=shape.n_layers, n_heads=shape.n_heads, mlp_hidden=shape.mlp_hidden)
    with torch.device(device):
        model = GPT(cfg)  # random weights: timing does not depend on their values
    return model.to(dtype).eval().requires_grad_(False)


def _sync(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


@torch.no_grad()
def replay_batch(model, forwards: list[list[int]], device: str) -> float:
    """Seconds to run one batch's forwards [[rows, tokens per row, context], ...] on the model."""
    rows = max(f[0] for f in forwards)
    model.setup_caches(rows)
    _sync(device)
    t0 = time.perf_counter()
    for r, s, ctx in forwards:
        pos = torch.arange(ctx - s, ctx, device=device).expand(r, s)  # the last s positions of the context
        model(torch.zeros(r, s, dtype=torch.long, device=device), pos)
    _sync(device)
    seconds = time.perf_counter() - t0
    model.clear_caches()
    return seconds


def replay(bench: dict, shapes: list[Shape], device: str, dtype: torch.dtype, budget_s: float,
           log=print) -> list[dict]:
    """A row per (shape, decoder, batch size) with a trace: s/image and images/s, measured."""
    info = bench.get("model_info", {})
    prompt_len, grid = int(info.get("prompt_len", 36)), int((info.get("grid") or [16])[0])
    t_start, out = time.perf_counter(), []
    for shape in shapes:
        model = build(shape, prompt_len, grid, device, dtype)
        warm = [r for r in bench["rows"] if r.get("trace")][:1]
        for r in warm:  # kernels, allocator and caches warm before anything is timed
            replay_batch(model, r["trace"]["forwards"], device)
        for r in bench["rows"]:
            if not r.get("trace") or time.perf_counter() - t_start > budget_s:
                continue
            b = r["trace"]["batch"]
            secs = replay_batch(model, r["trace"]["forwards"], device)
            out.append({"shape": shape.name, "decoder": r["decoder"], "batch_size": b,
                        "forwards": len(r["trace"]["forwards"]), "seconds_per_image": secs / b,
                        "images_per_s": b / secs, "grid": grid, "dtype": str(dtype).removeprefix("torch.")})
            log(f"replay {shape.name:<13} {r['decoder']:<32} batch {b:>3}: {b / secs:8.2f} images/s")
        del model
        if torch.device(device).type == "cuda":
            torch.cuda.empty_cache()
    return out


def projection_error(bench: dict, rows: list[dict], accelerator: str | None) -> list[dict]:
    """The roofline projection of each replayed row (same size, decoder, batch, grid) and its error."""
    from ssdgen.bench import projection as pj
    if accelerator is None or accelerator not in pj.ACCELERATORS:
        return []
    stats = pj.decoder_stats(pj.as_bench(bench))
    acc, out = pj.ACCELERATORS[accelerator], []
    for r in rows:
        shape = SHAPES.get(r["shape"])
        if shape is None or shape.projection_model is None:
            continue
        st = pj.stats_for_batch(stats, r["decoder"], r["batch_size"])
        p = pj.project_one(st, acc, pj.MODELS[shape.projection_model], r["grid"], r["batch_size"], True, None)
        if p.get("images_per_s"):
            out.append({"shape": r["shape"], "decoder": r["decoder"], "batch_size": r["batch_size"],
                        "projected_images_per_s": p["images_per_s"], "measured_images_per_s": r["images_per_s"],
                        "error": p["images_per_s"] / r["images_per_s"] - 1})
    return out


def run(bench_json: str, out_json: str, device: str | None = None, shapes: str = "janus-pro-1b,janus-pro-7b",
        budget_s: float = 240.0, accelerator: str | None = None, tiny: bool = False) -> dict:
    """Replay a bench's traces on the named shapes (tiny: the tiny ones, in fp32) and write OUT_JSON."""
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    bench = json.loads(open(bench_json).read())
    table = TINY if tiny else SHAPES
    unknown = [] if tiny else [s for s in shapes.split(",") if s not in table]
    if unknown:
        raise ValueError(f"--shapes: unknown shape(s) {', '.join(unknown)}; known: {', '.join(SHAPES)}")
    chosen = [table[s] for s in (table if tiny else shapes.split(","))]
    dtype = torch.float32 if tiny or torch.device(device).type == "cpu" else torch.bfloat16
    rows = replay(bench, chosen, device, dtype, budget_s)
    res = {"label": "measured: forward shapes recorded on the trained reference model, replayed on random "
                    "weights of the named shapes at the trace's grid", "device": device,
           "device_name": torch.cuda.get_device_name(device) if device.startswith("cuda") else "cpu",
           "torch": torch.__version__, "shapes": [asdict(s) for s in chosen], "rows": rows,
           "projection_error": projection_error(bench, rows, accelerator)}
    with open(out_json, "w") as f:
        json.dump(res, f, indent=1)
    return res
