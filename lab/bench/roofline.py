"""The reference model's step against this machine's roofline: what one forward costs, what it must move and
compute, and the fraction of the machine's roof it reaches.

A decode step of the bundled model (one `ReferenceModel.step`: CFG doubles its rows) reads the weights once and
the keys and values of every cache slot in use, in every layer; it multiplies `tokens = rows x S` activations
by the weights. On a CPU those parts run one after the other, so the step's roof (its least possible time) is

    roof = (the step's matmuls, timed alone at its shapes) + (KV bytes in use) / (read bandwidth)

- read bandwidth: the best of repeated sums over a 256 MB fp32 tensor (a read, as attention's is);
- the matmuls: the step's linear layers (qkv, out, MLP, head) on random activations of its shapes, best of
  repeats; they read the weights, so weight traffic is in this term;
- KV bytes in use: keys and values of slots [0, T) for every row, head and layer, T the furthest position
  attended to (mid-image by default: image token 128 of 256).

The small ops (norms, RoPE, the mask, softmax, the residual adds) and Python are left out of the roof: they
are what a faster step removes, so the fraction `roof / step` is the share of the step the hardware had to
spend. Steps are timed on the model itself, random tokens at fixed positions, best and median of repeats.

    python -m lab roofline [--batches 1,4,16,64,256] [--windows 1,2,4,8] [--repeats 7] [--json F] [--profile 64x1]
"""

from __future__ import annotations

import statistics
import time
from contextlib import contextmanager

import torch
import torch.nn.functional as F

from lab.bench.host_time import conditions

def mid_image(gpt) -> int:
    """The image token the timed step is at: half the grid (128 of v2's 256, 512 of v3's 1,024), so the cache
    holds the caption and half the image, a run's average."""
    return gpt.cfg.n_image_tokens // 2


def _times(fn, repeats: int) -> list[float]:
    """Seconds per call, `repeats` calls after one warm-up."""
    fn()
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def read_bandwidth(mb: int = 256, repeats: int = 7) -> float:
    """Bytes per second of a streaming read (a sum) over `mb` MB of fp32."""
    x = torch.ones(mb * 2**20 // 4)
    return x.numel() * 4 / min(_times(lambda: x.sum(), repeats))


def _linears(gpt) -> list[torch.Tensor]:
    """The weights a step multiplies by, in order: per layer qkv, out, gate+up, down; then the head."""
    ws = [w for blk in gpt.layers for w in (blk.attn.wqkv.weight, blk.attn.wo.weight, blk.w13.weight, blk.w2.weight)]
    return ws + [gpt.head.weight]


def matmul_time(gpt, tokens: int, repeats: int) -> tuple[float, float]:
    """(best seconds, FLOPs) of the step's linear layers alone on `tokens` random rows."""
    ws = _linears(gpt)
    xs = [torch.randn(tokens, w.shape[1], dtype=w.dtype, device=w.device) for w in ws]
    flops = sum(2 * tokens * w.numel() for w in ws)

    def run():
        for x, w in zip(xs, ws):
            F.linear(x, w)
    return min(_times(run, repeats)), flops


def step_shapes(gpt, rows: int, window: int, kv_item: int | None = None) -> dict:
    """What a step of `window` tokens per row at mid_image moves and computes (bytes, FLOPs); kv_item: the
    cache's bytes per value (None: the weights')."""
    g = gpt.cfg
    T = g.caption_len + mid_image(gpt) + window  # slots attended to by the window's last token
    hd, item = g.dim // g.n_heads, next(gpt.parameters()).element_size()
    kv = g.n_layers * 2 * rows * g.n_heads * T * hd * (kv_item or item)
    weights = sum(w.numel() for w in _linears(gpt)) * item
    attn_flops = g.n_layers * 4 * rows * g.n_heads * window * T * hd
    return {"slots": T, "kv_bytes": kv, "weight_bytes": weights, "attention_flops": attn_flops}


@contextmanager
def mid_image_step(model, batch: int, window: int):
    """A batch set up as a run's is (`model.start` on eval captions, CFG: 2 x batch rows; the caches hold the
    captions, and the image slots up to mid_image are in use) -> a call that runs one `model.step` of `window`
    random tokens per sample at mid_image. The caches are freed after."""
    from ssdgen.reference.prompts import eval_prompts
    captions = [r["prompt"] for r in eval_prompts()]
    model.start([captions[i % len(captions)] for i in range(batch)], use_cfg=True)
    tokens = torch.randint(0, model.n_codes, (batch, window), device=model.device)
    index = (mid_image(model.gpt) + torch.arange(window, device=model.device)).expand(batch, window)
    try:
        yield lambda: model.step(tokens, index)
    finally:
        model.gpt.clear_caches()


def step_time(model, batch: int, window: int, repeats: int) -> list[float]:
    """Seconds per `model.step` of `window` tokens for `batch` samples at mid_image."""
    with mid_image_step(model, batch, window) as step:
        return _times(step, repeats)


def cell(model, bw: float, batch: int, window: int, repeats: int) -> dict:
    """One (batch, window) row of the table."""
    rows = 2 * batch
    shapes = step_shapes(model.gpt, rows, window, model.kv_dtype.itemsize)
    mm_s, mm_flops = matmul_time(model.gpt, rows * window, repeats)
    ts = step_time(model, batch, window, repeats)
    roof = mm_s + shapes["kv_bytes"] / bw
    best, med = min(ts), statistics.median(ts)
    return {"batch": batch, "rows": rows, "window": window, "tokens": rows * window, **shapes,
            "matmul_flops": mm_flops, "matmul_ms": 1e3 * mm_s, "kv_read_ms": 1e3 * shapes["kv_bytes"] / bw,
            "roof_ms": 1e3 * roof, "step_ms_best": 1e3 * best, "step_ms_median": 1e3 * med,
            "step_ms_max": 1e3 * max(ts), "fraction_of_roof": roof / med,
            "matmul_gflops": mm_flops / mm_s / 1e9}


def profile(model, batch: int, window: int, top: int = 12) -> str:
    """torch.profiler's table of one step's ops (self CPU time, 5 steps), the op-by-op view of what holds it back."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as prof
    with mid_image_step(model, batch, window) as step:
        _times(step, 2)  # warm-up
        with prof(activities=[ProfilerActivity.CPU]) as p:
            for _ in range(5):
                step()
    return p.key_averages().table(sort_by="self_cpu_time_total", row_limit=top)


def run(model, batches: list[int], windows: list[int], repeats: int) -> dict:
    """The table: every window at every batch, after the machine's read bandwidth."""
    bw = read_bandwidth()
    print(f"read bandwidth {bw / 1e9:.1f} GB/s (a sum over 256 MB, best of 7)\n{HEADER}\n{SEPARATOR}", flush=True)
    rows = []
    for window in windows:
        for batch in batches:
            r = cell(model, bw, batch, window, repeats)
            rows.append(r)
            print(format_row(r), flush=True)
    return {"what": "the reference model's step against the roof (lab/bench/roofline.py)", "model": model.name,
            "dtype": str(model.dtype), "kv_dtype": model.capabilities.kv_dtype, "position": mid_image(model.gpt),
            "read_gb_per_s": bw / 1e9, "repeats": repeats, "conditions": conditions(), "rows": rows}


HEADER = ("window | batch | rows | slots | KV MB | GFLOP | matmul ms (GFLOP/s) | KV read ms | roof ms | "
          "step ms median (best-max) | of roof")

SEPARATOR = "|".join(["---"] * HEADER.count("|")) + "|---"


def format_row(r: dict) -> str:
    return (f"{r['window']} | {r['batch']} | {r['rows']} | {r['slots']} | {r['kv_bytes'] / 1e6:.1f} | "
            f"{r['matmul_flops'] / 1e9:.2f} | {r['matmul_ms']:.2f} ({r['matmul_gflops']:.0f}) | "
            f"{r['kv_read_ms']:.2f} | {r['roof_ms']:.2f} | {r['step_ms_median']:.2f} ({r['step_ms_best']:.2f}-"
            f"{r['step_ms_max']:.2f}) | {100 * r['fraction_of_roof']:.0f}%")
