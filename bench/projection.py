"""PROJECTION, not measurement: images/s and $ per 1,000 images for each decoder and batch size on a named
accelerator and model size, from a bench's measured acceptance statistics and a roofline model.

Inputs
  - a `ssdgen bench --json` result: per decoder and batch size, forwards per image (so committed tokens per
    forward, tau = grid tokens / forwards), forwards per batch (a batch runs until its slowest sample ends),
    and query tokens fed per row and forward (measured; for an older bench JSON, what the row's spec feeds);
  - an accelerator (`ACCELERATORS`: memory bandwidth, peak dense bf16 FLOP/s, memory, with sources; the price
    is the `output/prices.csv` row of the same name, one GPU);
  - a model (`MODELS`: parameters, layers, width, KV width, prompt tokens, bytes per value) and a token grid.

Method (per forward of a batch of b images, c = 2 rows per image with CFG, else 1; R = b*c rows)
  tokens in flight  T   = R * S                  S = query tokens per row (below)
  FLOPs                 = 2 * params * T
  bytes moved           = weight bytes (read once per forward) + R * ctx * kv_bytes_per_token
                          ctx = prompt + grid_tokens / 2 (the mean position while the image is drawn)
                          kv_bytes_per_token = 2 (K, V) * layers * kv_width * bytes_per_value
  time per forward      = max(bytes / (bandwidth * bw_eff), FLOPs / (peak * flops_eff)) + overhead_per_forward
  prefill               = one forward over R * prompt tokens (ctx = prompt / 2)
  forwards per batch    = 1 (prefill) + (grid_tokens / tau - 1) * (measured forwards per batch / forwards per image)
  s / image             = (prefill + steps * time per forward) / b;  $ / 1k images = s / image * $/GPU-h / 3.6
  KV cap on the batch   = floor((memory * mem_util - weight bytes) / (c * kv_bytes_per_token * (prompt + grid + S)))
  best batch            = the highest images/s over powers of two up to the cap, the cap and the given batches
                          (`best_batch`); `verdict` says in words whether AR's best or a speculative best is faster

A row's decoder is its spec as it decoded (a calibrated row's resolved `plan_spec`). S on the projected grid is the
measured S times what that spec's config feeds per forward there over what it feeds on the measured grid
(`DecoderStats.fed_at`): a window of L tokens (sjd, csd, a resolved `ssd+csd:window=5`) feeds L on any grid; a
window of raster rows (ssd, ssd+csd with window=0) grows with the width up to 64 tokens, the block decoder's rows
without bound.

Assumptions (stated in every result under "assumptions"):
  - tau (tokens committed per forward) and the batch's slowest-sample factor carry over from the measured
    model and grid to the projected ones unchanged; acceptance really depends on the model and content;
  - tokens fed per forward follow the decoder's config from the measured grid to the projected one (above);
  - roofline: no kernel-launch/Python overhead (overhead_per_forward = 0 unless given), bandwidth and peak
    reached in full (bw_eff = flops_eff = 1 unless given), attention-score FLOPs (4 * layers * ctx * width per
    token: ~5% of 2*params at 7B/48x48's mean context, 9% at its end), activation traffic and KV writes left out;
  - one image per CFG pair of rows; a batch larger than the KV cap is reported as not fitting (no throughput);
  - price: on-demand $ per GPU-hour from output/prices.csv; VQ decoding of tokens to pixels is not counted.

`bench.projection_check.calibrate(bench)` applies the same method to the bench's own model on this CPU, with this
CPU's bandwidth and FLOP/s measured by a torch copy / matmul microbenchmark, and reports the error of the predicted
s/image against the measured one.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

from ssdgen.decoders.spec import DecodeSpec

LABEL = "projection"


@dataclass(frozen=True)
class Accelerator:
    name: str
    mem_bw: float  # bytes/s
    peak_flops: float  # FLOP/s, dense bf16 tensor (or what the device runs the model in)
    mem_bytes: float
    source: str
    price_row: str | None = None  # device_type in output/prices.csv


ACCELERATORS: dict[str, Accelerator] = {
    "h100": Accelerator("NVIDIA H100 SXM5 80GB", 3.35e12, 989e12, 80e9,
                        "NVIDIA H100 datasheet (SXM5): 3.35 TB/s HBM3, BF16 tensor 1,979 TFLOP/s with sparsity = "
                        "989 dense, 80 GB", "h100"),
    "h200": Accelerator("NVIDIA H200 SXM 141GB", 4.8e12, 989e12, 141e9,
                        "NVIDIA H200 datasheet: 4.8 TB/s HBM3e, 141 GB, BF16 tensor 1,979 TFLOP/s sparse = 989 "
                        "dense (same compute as H100 SXM)", "h200"),
    "a100-40gb": Accelerator("NVIDIA A100 SXM4 40GB", 1.555e12, 312e12, 40e9,
                             "NVIDIA A100 datasheet: 40 GB HBM2 at 1,555 GB/s, BF16 tensor 312 TFLOP/s dense",
                             "a100-40gb"),
    "l4": Accelerator("NVIDIA L4 24GB", 300e9, 121e12, 24e9,
                      "NVIDIA L4 datasheet: 24 GB GDDR6 at 300 GB/s, BF16 tensor 242 TFLOP/s with sparsity = 121 "
                      "dense", "l4"),
    "a10g": Accelerator("NVIDIA A10G 24GB (AWS g5)", 600e9, 125e12, 24e9,
                        "600 GB/s and 24 GB GDDR6 as for the A10 (baseten.co, 'NVIDIA A10 vs A10G for ML model "
                        "inference'); 125 TFLOP/s is the A10 datasheet's dense BF16 tensor figure: the same page says "
                        "the A10G's tensor compute is lower, so compute-bound rows here are optimistic", "a10g"),
}


@dataclass(frozen=True)
class ModelSpec:
    name: str
    params: float
    layers: int
    dim: int
    kv_dim: int  # width of K (= of V) per token per layer: dim for MHA, less with GQA/MQA
    prompt_len: int  # prompt tokens before the image (both CFG rows)
    bytes_per_value: float = 2.0  # bf16 weights and KV cache
    grid: int | None = None  # the model's own token grid side: `--models NAME` without @GRID takes it


MODELS: dict[str, ModelSpec] = {
    # LLaMA-style shapes; params ~ 12 * layers * dim^2 + embeddings. Prompt: 120 text tokens (LlamaGen's T5 length).
    "1b": ModelSpec("1B (24 layers, width 1792, MHA)", 1.0e9, 24, 1792, 1792, 120),
    "7b": ModelSpec("7B (32 layers, width 4096, MHA; LLaMA-7B / Chameleon-7B shape)", 7.0e9, 32, 4096, 4096, 120),
    # transformers' Emu3TextConfig: 32 layers, width 4096, 8 KV heads of 128 (GQA), MLP 14336, vocab 184,622
    # untied: 32 * 218.1M + 2 * 184,622 * 4096 = 8.49B. Grid 90 x 90 (720 x 720 pixels); its 90 row-end tokens
    # (1% of the cache) are left out.
    "emu3-8b": ModelSpec("Emu3-Gen 8B (32 layers, width 4096, GQA 8 KV heads)", 8.49e9, 32, 4096, 1024, 120,
                         grid=90),
    # DeepSeek-LLM-7B base: 30 layers, width 4096, MHA, vocab 102,400; 24 x 24 tokens (384 x 384 pixels).
    "janus-pro-7b": ModelSpec("Janus-Pro 7B (30 layers, width 4096, MHA)", 6.9e9, 30, 4096, 4096, 120, grid=24),
}

MEM_UTIL = 0.90  # share of device memory usable for weights + KV cache (the rest: activations, allocator, CUDA)


@dataclass(frozen=True)
class Roofline:
    bw_eff: float = 1.0
    flops_eff: float = 1.0
    overhead_per_forward: float = 0.0  # seconds per forward (kernel launches, Python) added to the roofline


def kv_bytes_per_token(m: ModelSpec) -> float:
    return 2 * m.layers * m.kv_dim * m.bytes_per_value


def forward_time(acc: Accelerator, m: ModelSpec, rows: float, tokens_per_row: float, ctx: float,
                 rf: Roofline = Roofline()) -> dict:
    """One forward of `rows` sequences, each feeding `tokens_per_row` query tokens against `ctx` cached ones."""
    tokens = rows * tokens_per_row
    flops = 2.0 * m.params * tokens
    bytes_ = m.params * m.bytes_per_value + rows * ctx * kv_bytes_per_token(m)
    t_mem = bytes_ / (acc.mem_bw * rf.bw_eff)
    t_flop = flops / (acc.peak_flops * rf.flops_eff)
    return {"tokens_in_flight": tokens, "flops": flops, "bytes": bytes_, "t_memory_s": t_mem, "t_compute_s": t_flop,
            "bound": "memory" if t_mem >= t_flop else "compute",
            "seconds": max(t_mem, t_flop) + rf.overhead_per_forward}


def kv_cap(acc: Accelerator, m: ModelSpec, grid_tokens: int, cfg: bool, spare: int = 0) -> int:
    """Largest batch (images) whose KV cache fits next to the weights."""
    per_image = (2 if cfg else 1) * kv_bytes_per_token(m) * (m.prompt_len + grid_tokens + spare)
    free = acc.mem_bytes * MEM_UTIL - m.params * m.bytes_per_value
    return max(0, int(free // per_image))


# ----------------------------------------------------------------------------------- measured stats

@dataclass(frozen=True)
class DecoderStats:
    """Acceptance statistics of one decoder at one measured batch size (from a bench row)."""
    decoder: str
    batch_size: int
    forwards_per_image: float
    forwards_per_batch: float
    tokens_fed_per_forward: float  # query tokens per row per step forward
    grid_tokens: int
    grid_width: int
    spec: str = "ar"  # what decoded it: the resolved spec's text (a calibrated row's plan), which sizes S per grid
    derived: tuple[str, ...] = ()  # fields filled in from the decoder's parameters (older bench JSON)
    effective_batch: float = 0.0  # images per decode call actually run (n / batches: n < batch size runs fewer)

    @property
    def tau(self) -> float:
        return self.grid_tokens / self.forwards_per_image

    @property
    def batch_factor(self) -> float:
        return self.forwards_per_batch / self.forwards_per_image

    @property
    def speculative(self) -> bool:  # whether it decoded by drafting and verifying, not plain AR
        return DecodeSpec.parse(self.spec).recipe.speculative

    def fed_at(self, grid: int) -> float:
        """Query tokens per row and forward on a grid `grid` tokens wide, as the row's spec feeds (module doc)."""
        spec = DecodeSpec.parse(self.spec)
        return self.tokens_fed_per_forward * spec.tokens(grid) / spec.tokens(self.grid_width)


def row_spec(row: dict) -> str:
    """What decoded a bench row: a calibrated row's resolved spec (`plan_spec`), else the row's spec (its label;
    an older bench JSON's or an eval JSON's row: its decoder text)."""
    return row.get("plan_spec") or row.get("spec") or row["decoder"]


def as_bench(d: dict) -> dict:
    """A bench JSON as is; an `ssdgen eval --json` result as a one-row bench (its decoder at its batch size)."""
    if "rows" in d:
        return d
    if "details" in d and "seconds_per_image" in d:
        det = d["details"]
        params = det.get("params") or {}
        return {"model": d["model"], "device": f"cpu ({det.get('threads', '?')} threads)", "date": None,
                "sampling": det.get("sampling") or {},
                "rows": [{"decoder": d["decoder"] + "".join(f":{k}={v}" for k, v in params.items()), "params": params,
                          "plan_spec": det.get("resolved"),
                          "batch_size": d["batch_size"], "n": d["n"], "forwards_per_image": d["forwards_per_image"],
                          "seconds_per_image": d["seconds_per_image"], "batches": math.ceil(d["n"] / d["batch_size"])}]}
    raise ValueError("not a bench JSON (no 'rows') nor an eval JSON")


def decoder_stats(bench: dict, assume_no_straggler: bool = False) -> list[DecoderStats]:
    """`assume_no_straggler`: a row without forwards_per_batch at batch > 1 (older JSON) takes forwards per
    image for it, a lower bound on the batch's forwards (exact for ar); otherwise such a row is an error."""
    info = bench.get("model_info") or _reference_info(bench)
    grid = info.get("grid") or [16, 16]
    n_tok, width = int(grid[0] * grid[1]), int(grid[1])
    out = []
    for r in bench["rows"]:
        derived, spec = [], row_spec(r)
        speculative = DecodeSpec.parse(spec).recipe.speculative
        fpb = r.get("forwards_per_batch")
        if fpb is None:
            if r["batch_size"] != 1 and speculative and not assume_no_straggler:
                raise ValueError(f"bench row {r['decoder']} at batch {r['batch_size']} has no forwards_per_batch "
                                 "(an older bench JSON): rerun `ssdgen bench` to project batches > 1 from it")
            fpb = r["forwards_per_image"]
            if speculative and r["batch_size"] != 1:  # exact for ar and at batch 1
                derived.append("forwards_per_batch")
        fed = r.get("tokens_fed_per_forward")
        if fed is None:
            fed = DecodeSpec.parse(spec).tokens(width)
            if speculative:
                derived.append("tokens_fed_per_forward")
        eff = r["n"] / r["batches"] if r.get("batches") else min(r["batch_size"], r.get("n", r["batch_size"]))
        out.append(DecoderStats(r["decoder"], int(r["batch_size"]), float(r["forwards_per_image"]), float(fpb),
                                float(fed), n_tok, width, spec, tuple(derived), float(eff)))
    return out


def _reference_info(bench: dict) -> dict:
    """model_info for bench JSON written before it was recorded: the bundled reference model's config."""
    if bench.get("model") != "scenes-reference":
        return {}
    from ssdgen.reference.weights import DEFAULT_DIR
    cfg = json.loads((Path(DEFAULT_DIR) / "config.json").read_text())["gpt"]
    d, L, h = cfg["dim"], cfg["n_layers"], cfg["mlp_hidden"]
    V = cfg["n_image_codes"] + cfg["n_caption_words"]
    params = V * d + cfg["grid"] ** 2 * d + L * (4 * d * d + 3 * d * h + 2 * d) + d + d * cfg["n_image_codes"]
    return {"grid": [cfg["grid"], cfg["grid"]], "params": params, "layers": L, "dim": d, "kv_dim": d,
            "prompt_len": cfg["caption_len"], "bytes_per_param": 4, "derived": True}


def stats_for_batch(stats: list[DecoderStats], decoder: str, batch: int) -> DecoderStats:
    """The measured row at this batch size, else the one at the nearest measured batch size (log scale)."""
    rows = [s for s in stats if s.decoder == decoder]
    return min(rows, key=lambda s: (abs(math.log(s.batch_size) - math.log(batch)), -s.batch_size))


# --------------------------------------------------------------------------------------- projection

def project_one(st: DecoderStats, acc: Accelerator, m: ModelSpec, grid: int, batch: int, cfg: bool,
                price_per_hour: float | None, rf: Roofline = Roofline()) -> dict:
    n_tok = grid * grid
    c = 2 if cfg else 1
    S = st.fed_at(grid)
    fwd_image = n_tok / st.tau
    steps = max(0.0, (fwd_image - 1.0) * st.batch_factor)
    rows = batch * c
    pre = forward_time(acc, m, rows, m.prompt_len, m.prompt_len / 2, rf)
    step = forward_time(acc, m, rows, S, m.prompt_len + n_tok / 2, rf)
    cap = kv_cap(acc, m, n_tok, cfg, spare=int(math.ceil(S)))
    fits = batch <= cap
    batch_s = pre["seconds"] + steps * step["seconds"]
    spi = batch_s / batch
    return {"label": LABEL, "decoder": st.decoder, "speculative": st.speculative, "batch_size": batch,
            "stats_from_batch": st.batch_size, "tokens_per_forward": st.tau, "forwards_per_image": fwd_image,
            "forwards_per_batch": 1 + steps, "tokens_fed_per_row": S, "tokens_in_flight": step["tokens_in_flight"],
            "bound": step["bound"],
            "seconds_per_forward": step["seconds"], "prefill_s": pre["seconds"], "kv_cap_batch": cap,
            "fits": fits, "kv_gb_per_image": c * kv_bytes_per_token(m) * (m.prompt_len + n_tok + S) / 1e9,
            "seconds_per_image": spi if fits else None, "images_per_s": 1 / spi if fits else None,
            "usd_per_1k_images": (spi * price_per_hour / 3.6) if fits and price_per_hour is not None else None}


# ------------------------------------------------------------------- best batch, and who wins where

MAX_SEARCH_BATCH = 1 << 16  # powers of two stop here: no batch job needs more images in flight on one GPU
TIE = 1e-9  # relative: throughputs this close are equal (a compute-bound plateau), the smaller batch is chosen


def candidate_batches(cap: int, given: list[int]) -> list[int]:
    """The batches searched: powers of two up to the cap, the cap itself and the given ones (those above the cap
    too, so that they are seen not to fit)."""
    powers = [1 << i for i in range(17) if (1 << i) <= min(cap, MAX_SEARCH_BATCH)]
    return sorted(set(powers) | ({cap} if cap >= 1 else set()) | set(given))


def best_batch(stats: list[DecoderStats], decoder: str, acc: Accelerator, m: ModelSpec, grid: int, cfg: bool,
               price_per_hour: float | None, given: list[int], rf: Roofline = Roofline()) -> dict:
    """The decoder's highest-throughput batch that fits: only batches at or under the memory cap are chosen."""
    # each measured row feeds its own window, so has its own cap: every one of them is searched
    mine = [s for s in stats if s.decoder == decoder]
    caps = {kv_cap(acc, m, grid * grid, cfg, spare=int(math.ceil(s.fed_at(grid)))) for s in mine}
    batches = sorted(set(candidate_batches(max(caps), given)) | {c for c in caps if c >= 1})
    tried = [project_one(stats_for_batch(stats, decoder, b), acc, m, grid, b, cfg, price_per_hour, rf)
             for b in batches]
    fitting = [p for p in tried if p["fits"]]
    out = {"decoder": decoder, "searched": batches}
    if not fitting:
        return out | {"kv_cap_batch": max(caps), "batch_size": None, "fits": False, "memory_capped": True,
                      "images_per_s": None, "usd_per_1k_images": None, "bound": None, "stats_from_batch": None,
                      "speculative": any(s.speculative for s in mine)}
    top = max(p["images_per_s"] for p in fitting)
    best = min((p for p in fitting if p["images_per_s"] >= top * (1 - TIE)), key=lambda p: p["batch_size"])
    largest = max(p["batch_size"] for p in fitting)
    return out | {k: best[k] for k in ("batch_size", "kv_cap_batch", "fits", "images_per_s", "usd_per_1k_images",
                                       "bound", "stats_from_batch", "seconds_per_forward", "tokens_per_forward",
                                       "speculative")} | {
        "memory_capped": best["batch_size"] == largest}  # a larger batch would have been faster, had it fit


def _why(b: dict) -> str:
    if b["batch_size"] is None:
        return "does not fit"
    return "memory cap" if b["memory_capped"] else f"{b['bound']}-bound"


VERDICT_FIELDS = ("decoder", "batch_size", "images_per_s", "usd_per_1k_images", "memory_capped", "bound")


def verdict(best: list[dict], where: str) -> dict:
    """In words, whether AR's best batch or a speculative decoder's best batch has the higher throughput."""
    ar = [b for b in best if not b["speculative"] and b["images_per_s"]]
    spec = [b for b in best if b["speculative"] and b["images_per_s"]]
    a = max(ar, key=lambda b: b["images_per_s"], default=None)
    s = max(spec, key=lambda b: b["images_per_s"], default=None)
    short = {k: (None if b is None else {f: b[f] for f in VERDICT_FIELDS}) for k, b in (("ar", a), ("speculative", s))}
    if a is None or s is None:
        missing = "AR" if a is None else "a speculative decoder"
        return {"winner": None, "ratio": None} | short | {
            "words": f"{where}: no comparison ({missing} fits no batch or is not in the bench)"}
    ratio = s["images_per_s"] / a["images_per_s"]
    head = (f"{where}: best AR batch {a['batch_size']} ({_why(a)}), {s['decoder']} at batch {s['batch_size']} "
            f"({_why(s)}) {ratio:.2f}x AR's best")
    if ratio > 1:
        why = ("KV-bound: AR's batch is capped by memory, each of its forwards reads the whole cache for one token"
               if a["memory_capped"] and a["bound"] == "memory" else "fewer forwards at AR's cost per forward")
        return {"winner": "speculation", "ratio": ratio} | short | {"words": f"{head}: speculation wins ({why})"}
    why = ("AR's batch is compute-bound: speculation's extra tokens cost FLOPs" if a["bound"] == "compute"
           else "speculation gains nothing: its best setting decodes about as AR does" if ratio >= 0.99
           else "compute-bound: its extra query tokens cost more FLOPs than the forwards they save"
           if s["bound"] == "compute" else "speculation's extra tokens cost more than the forwards they save")
    return {"winner": "ar", "ratio": ratio} | short | {"words": f"{head}: AR wins ({why})"}


ASSUMPTIONS = [
    "PROJECTION from a roofline model, not a measurement.",
    "Tokens committed per forward (tau) and the batch's slowest-sample factor are the bench's measured values "
    "for the bench's model and grid, carried over unchanged to the projected model and grid.",
    "Tokens fed per forward follow each row's spec as it decoded (a calibrated row's plan): a window of L tokens "
    "feeds L on any grid, a window of raster rows grows with the grid's width (the window loop's up to 64).",
    "Time per forward = max(bytes / bandwidth, FLOPs / peak): weights read once per forward plus the KV cache "
    "of every row (mean context = prompt + grid tokens / 2); FLOPs = 2 * params * tokens in flight; "
    "attention-score FLOPs (~5% of 2 * params at 7B / 48x48), activations and KV writes are left out.",
    "No kernel-launch or framework overhead (overhead per forward 0 s) and peak bandwidth / FLOP/s reached "
    "(efficiency 1.0) unless given: the projected throughput is an upper bound.",
    "CFG doubles the rows of every forward and the KV cache per image; a batch is capped by the KV cache that "
    f"fits in {MEM_UTIL:.0%} of device memory beside the weights.",
    "One GPU at its on-demand price from output/prices.csv; VQ decoding to pixels and I/O are not counted.",
    "Each decoder's best batch is searched over powers of two up to its KV cap, the cap itself and the given "
    "batch sizes (only batches that fit are chosen; equal throughputs go to the smaller batch); 'memory cap' "
    "means no larger batch fits, so memory, not the roofline, stopped it. Statistics above the largest measured "
    "batch come from the largest one.",
]


def project(bench: dict, accelerators: list[str], models: list[tuple[str, int]], batch_sizes: list[int],
            cfg: bool = True, rf: Roofline = Roofline()) -> dict:
    from ssdgen.output.cost import price_for
    if not batch_sizes or any(b < 1 for b in batch_sizes):
        raise ValueError(f"batch sizes must be integers >= 1, got {batch_sizes}")
    unknown = [a for a in accelerators if a not in ACCELERATORS]
    if unknown or not accelerators:
        raise ValueError(f"unknown accelerator(s) {unknown or accelerators}; known: {', '.join(ACCELERATORS)}")
    stats = decoder_stats(bench)
    decoders = list(dict.fromkeys(s.decoder for s in stats))
    rows, best, verdicts = [], [], []
    for a in accelerators:
        acc = ACCELERATORS[a]
        price = price_for(acc.price_row).on_demand_usd_per_hour if acc.price_row else None
        for mname, grid in models:
            m, key = MODELS[mname], {"accelerator": a, "model": mname, "grid": grid}
            for d in decoders:
                for b in batch_sizes:
                    r = project_one(stats_for_batch(stats, d, b), acc, m, grid, b, cfg, price, rf)
                    rows.append(key | r)
            here = [key | best_batch(stats, d, acc, m, grid, cfg, price, batch_sizes, rf) for d in decoders]
            best += here
            verdicts.append(key | verdict(here, f"{a} x {mname}@{grid} ({grid * grid} tokens)"))
    return {"label": LABEL, "assumptions": ASSUMPTIONS, "bench": {k: bench.get(k) for k in ("model", "device", "date")},
            "cfg": cfg, "roofline": asdict(rf),
            "accelerators": {a: asdict(ACCELERATORS[a]) for a in accelerators},
            "models": {mn: asdict(MODELS[mn]) for mn in dict.fromkeys(m for m, _ in models)},
            "derived_fields": sorted({f for s in stats for f in s.derived}), "rows": rows, "best": best,
            "verdicts": verdicts}


def parse_models(spec: str) -> list[tuple[str, int]]:
    """`SIZE@GRID` (grid side in tokens), or `SIZE` alone for a model with its own grid (emu3-8b = 90 x 90)."""
    out = []
    for part in (p.strip() for p in spec.split(",") if p.strip()):
        name, at, g = part.partition("@")
        m = MODELS.get(name)
        if not at and m is not None and m.grid:
            g = str(m.grid)
        if m is None or not g.isdigit() or int(g) < 1:
            own = ", ".join(k for k, v in MODELS.items() if v.grid)
            raise ValueError(f"model {part!r}: expected SIZE@GRID with SIZE in {', '.join(MODELS)} and GRID >= 1 "
                             f"(e.g. 7b@48), or SIZE alone for a model with its own grid ({own})")
        out.append((name, int(g)))
    if not out:
        raise ValueError("--models is empty: e.g. 1b@24,7b@48")
    return out


def _ints(spec: str, what: str) -> list[int]:
    try:
        v = [int(x) for x in spec.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{what} must be comma-separated integers, got {spec!r}") from None
    if not v or any(x < 1 for x in v):
        raise ValueError(f"{what} must be integers >= 1, got {spec!r}")
    return v


def text_table(result: dict) -> list[str]:
    lines = ["PROJECTION (roofline model, not measured) from bench " + json.dumps(result["bench"]),
             f"{'accel':<10} {'model':<6} {'grid':>4} {'decoder':<22} {'batch':>5} {'bound':<7} {'img/s':>9} "
             f"{'$/1k img':>9} {'KV cap':>6} {'stats@batch':>11}"]
    for r in result["rows"]:
        ips = "OOM" if not r["fits"] else f"{r['images_per_s']:.3g}"
        usd = "" if r["usd_per_1k_images"] is None else f"{r['usd_per_1k_images']:.4g}"
        lines.append(f"{r['accelerator']:<10} {r['model']:<6} {r['grid']:>4} {r['decoder']:<22} {r['batch_size']:>5} "
                     f"{r['bound']:<7} {ips:>9} {usd:>9} {r['kv_cap_batch']:>6} {r['stats_from_batch']:>11}")
    lines.append("stats@batch: the measured batch size whose acceptance statistics a row uses (the nearest measured)")
    lines += best_lines(result)
    lines += ["assumptions:"] + [f"  - {a}" for a in result["assumptions"]]
    return lines


def best_lines(result: dict) -> list[str]:
    """Each decoder's best batch (searched up to the memory cap), then who wins where, in words."""
    lines = ["", "PROJECTION: best batch per decoder (powers of two up to the KV cap, the cap, --batch-sizes)",
             f"{'accel':<10} {'model':<12} {'grid':>4} {'decoder':<22} {'batch':>5} {'why':<15} {'img/s':>9} "
             f"{'$/1k img':>9} {'KV cap':>6}"]
    for b in result.get("best", []):
        ips = "OOM" if b["images_per_s"] is None else f"{b['images_per_s']:.3g}"
        usd = "" if b["usd_per_1k_images"] is None else f"{b['usd_per_1k_images']:.4g}"
        lines.append(f"{b['accelerator']:<10} {b['model']:<12} {b['grid']:>4} {b['decoder']:<22} "
                     f"{b['batch_size'] or '-':>5} {_why(b):<15} {ips:>9} {usd:>9} {b['kv_cap_batch']:>6}")
    lines.append("PROJECTION: where speculation wins on throughput (each decoder at its own best batch):")
    return lines + [f"  - {v['words']}" for v in result.get("verdicts", [])]


def project_cli(bench_json: Path, accelerators: str, models: str, batch_sizes: str, cfg: bool) -> dict:
    if not Path(bench_json).exists():
        raise FileNotFoundError(f"{bench_json}: no such bench JSON (write one with `ssdgen bench --json PATH`)")
    try:
        bench = json.loads(Path(bench_json).read_text())
    except ValueError as e:  # json's own words name no file
        raise ValueError(f"--bench-json {bench_json}: not a bench JSON ({e})") from None
    if not isinstance(bench, dict) or not isinstance(bench.get("rows"), list):
        raise ValueError(f"--bench-json {bench_json}: not a bench JSON (no rows)")
    accs = [a.strip().lower() for a in accelerators.split(",") if a.strip()]
    res = project(bench, accs, parse_models(models), _ints(batch_sizes, "--batch-sizes"), cfg)
    return {"result": res, "text": text_table(res)}


BEST_COLS = [("accelerator", "accelerator"), ("model", "model"), ("grid", "grid"), ("decoder", "decoder"),
             ("batch_size", "best batch"), ("why", "limited by"), ("images_per_s", "images / s"),
             ("usd_per_1k_images", "$ / 1k images"), ("kv_cap_batch", "KV cap (batch)"),
             ("stats_from_batch", "stats from batch")]


def projection_html(result: dict) -> str:
    from ssdgen.bench import plots
    cols = [("accelerator", "accelerator"), ("model", "model"), ("grid", "grid"), ("decoder", "decoder"),
            ("batch_size", "batch"), ("bound", "bound"), ("tokens_per_forward", "tokens / forward"),
            ("tokens_in_flight", "tokens in flight"), ("seconds_per_forward", "s / forward"),
            ("images_per_s", "images / s"), ("usd_per_1k_images", "$ / 1k images"),
            ("kv_cap_batch", "KV cap (batch)"), ("fits", "fits"), ("stats_from_batch", "stats from batch")]
    body = ['<p class="note"><b>PROJECTION</b>: computed from a roofline model and measured acceptance '
            "statistics, not measured on these accelerators.</p>",
            "<h2>Assumptions</h2><ul>" + "".join(f"<li>{plots.esc(a)}</li>" for a in result["assumptions"]) + "</ul>",
            "<h2>Where speculation wins (each decoder at its best batch)</h2><ul>"
            + "".join(f"<li>{plots.esc(v['words'])}</li>" for v in result.get("verdicts", [])) + "</ul>",
            "<h2>Best batch per decoder (up to the KV cap)</h2>",
            plots.table([b | {"why": _why(b)} for b in result.get("best", [])], BEST_COLS,
                        left=("accelerator", "model", "decoder", "why")),
            "<h2>Projected throughput and cost</h2>",
            plots.table(result["rows"], cols, left=("accelerator", "model", "decoder", "bound")),
            "<h2>Accelerators</h2>",
            plots.table([{"name": k} | v for k, v in result["accelerators"].items()],
                        [("name", "name"), ("mem_bw", "bytes/s"), ("peak_flops", "FLOP/s"), ("mem_bytes", "memory"),
                         ("source", "source")], left=("name", "source"))]
    return plots.page("ssdgen projection (not measured)", "\n".join(body), plots.esc(json.dumps(result["bench"])))
