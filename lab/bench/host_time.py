"""Host time per forward: the wall time a decoder spends outside the model, per model forward.

On a GPU the model's forward is a few large kernels; what the decoder does around it (sampling, drafting,
verification, bookkeeping, and any Python loop over samples) is host time that the device waits for. This
benchmark isolates it on a tiny random reference-architecture model (reference/tiny.py: 2 layers, width 32),
whose forward costs almost nothing: every call into the model (`start`, `step`, `embed`,
`logits_from_hidden`) is timed, and

    host ms per forward = (decode wall time - time inside model calls) / model forwards (start + step calls)

for each decoder at batch 1 and 64. A larger vocabulary and grid than the unit tests' (256 codes, 8 x 8) keep
the per-token tensor work realistic in shape; the numbers are a CPU's, and only their ratio before / after a
change to the decoders means much. The run conditions (CPU count, torch threads, load average) are recorded.

`rng` rows time one forward's randomness alone, both ways: a torch.Generator per sample (what the decoders
did before decoders/rng.py) and the counter-based streams, for an SJD window's uniforms and for a coupled
window's new Gumbel rows (one per sample per forward).

    python -m lab host-time [--out FILE.json] [--batches 1,64] [--repeats 5] [--codes 256] [--grid 8]
                              [--threads 1]
"""

from __future__ import annotations

import os
import platform
import tempfile
import time
from pathlib import Path

import torch

# (label, decoder family, parameters): every loop and configuration; calibrated=False: a concrete spec
DECODERS = [("ar", "ar", {}), ("sjd", "sjd", {"window": 8}),
            ("sjd coupled", "sjd", {"window": 8, "coupled": True}), ("csd", "csd", {"window": 8}),
            ("ssd block", "ssd", {"rows": 2, "rounds": 1, "commit": "block"}), ("ssd", "ssd", {"rows": 2}),
            ("ssd lossless", "ssd", {"lossless": True, "rows": 1}),
            ("ssd+csd", "ssd+csd", {"calibrated": False, "adaptive": False, "rows": 2})]
PROMPT = "a large red circle at the center on a flat gray background"


class _Timed:
    """A model whose every call is timed: `inside` accumulates seconds spent in the model, `forwards` counts
    start + step calls. Everything else is delegated to the wrapped model."""

    CALLS = ("start", "step", "embed", "logits_from_hidden")

    def __init__(self, model):
        self.__dict__["_m"], self.__dict__["inside"], self.__dict__["forwards"] = model, 0.0, 0
        self.__dict__["step_s"] = 0.0  # `step` alone: the model's forward, what the host share is of

    def __getattr__(self, name):
        attr = getattr(self._m, name)
        if name not in self.CALLS:
            return attr

        def timed(*args, **kwargs):
            t = time.perf_counter()
            try:
                return attr(*args, **kwargs)
            finally:
                self.__dict__["inside"] += time.perf_counter() - t
                self.__dict__["step_s"] += (time.perf_counter() - t) * (name == "step")
                self.__dict__["forwards"] += name in ("start", "step")
        return timed


def _heads(model, seed: int = 1):
    """Random non-identity latent heads saved as the model's default heads (SSD needs some)."""
    from ssdgen.decoders.drafters import HeadsConfig, SpatialHeads, model_fingerprint
    torch.manual_seed(seed)
    heads = SpatialHeads(HeadsConfig(dim=model.hidden_dim, emb_dim=model.hidden_dim, n_codes=model.n_codes,
                                     grid=model.grid, model=model_fingerprint(model)))
    with torch.no_grad():
        for p in heads.parameters():
            p.normal_(0, 0.1)
    heads.save(model.default_heads)


def measure(model, family: str, params: dict, batch: int, repeats: int, prompts: list[str] | None = None) -> dict:
    """The best of `repeats` decodes of one batch: host ms per forward, the host share of the model's step time
    (wall minus `step`, drafting's own model calls included, over `step`), and what they came from."""
    from ssdgen.decoders import DecodeSpec, build
    from ssdgen.decoders.decoder import Decoder
    from ssdgen.decoders.recipes import SamplingConfig
    sc = SamplingConfig(cfg_scale=3.0)
    dec = build(DecodeSpec.of(family, params, sc), model)  # its heads loaded once: no row times a heads load
    best = None
    for r in range(repeats):
        timed = _Timed(model)
        t = time.perf_counter()
        Decoder(dec.spec, timed, dec.heads).decode((prompts or [PROMPT] * batch)[:batch],
                                                   list(range(r * batch, (r + 1) * batch)))
        wall = time.perf_counter() - t
        row = {"wall_s": wall, "model_s": timed.inside, "step_s": timed.step_s, "forwards": timed.forwards,
               "host_ms_per_forward": 1e3 * (wall - timed.inside) / max(1, timed.forwards),
               "host_share_of_step": (wall - timed.step_s) / max(timed.step_s, 1e-9)}
        if best is None or row["host_ms_per_forward"] < best["host_ms_per_forward"]:
            best = row
    return best


def _best_us(fn, reps: int = 200) -> float:
    """Fastest of five timings of `reps` calls, in microseconds per call."""
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(reps):
            fn()
        best = min(best, (time.perf_counter() - t) / reps)
    return best * 1e6


def _rng_cases(rng, b: int, width: int, codes: int) -> tuple:
    """(what, per-sample generators, counter-based streams) for a batch of b: the two ways to draw it."""
    gens = [torch.Generator().manual_seed(s) for s in range(b)]
    streams, t = rng.Streams(list(range(b))), torch.zeros(b, dtype=torch.long)
    noise = streams.base(rng.Purpose.NOISE)
    at = torch.arange(b)
    return (("sjd window uniforms", lambda: torch.stack([torch.rand(width, generator=g) for g in gens]),
             lambda: streams.uniform(rng.Purpose.SJD_STEP, t, width=width)),
            ("coupled noise row", lambda: torch.stack([torch.rand(1, codes, generator=g) for g in gens]),
             lambda: rng.uniform(noise, at, width=codes)))


def rng_rows(batches: list[int], width: int, codes: int) -> list[dict]:
    """One forward's randomness: per-sample generators against the counter-based streams (none before
    decoders/rng.py existed)."""
    from ssdgen.decoders import sampling as rng  # the streams live with sampling since #47
    if not hasattr(rng, "Streams"):  # an older checkout: decoders/rng.py's, or none yet
        try:
            from ssdgen.decoders import rng
        except ImportError:
            return []
    rows = []
    for b in batches:
        for what, old, new in _rng_cases(rng, b, width, codes):
            rows.append({"what": what, "batch": b, "width": codes if "noise" in what else width,
                         "generators_us": _best_us(old), "counter_based_us": _best_us(new)})
            r = rows[-1]
            print(f"rng {what:<20} batch {b:>3}: generators {r['generators_us']:8.1f} us, counter-based "
                  f"{r['counter_based_us']:8.1f} us", flush=True)
    return rows


def conditions() -> dict:
    return {"cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
            "python": platform.python_version(), "machine": platform.machine(),
            "load_average_1_5_15": list(os.getloadavg()), "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


# On the bundled model (--model): the engines as a run decodes them, the planner's short windows included
MODEL_DECODERS = [("ar", "ar", {}), ("sjd coupled w8", "sjd", {"window": 8, "coupled": True}),
                  ("ssd lossless w5", "ssd", {"lossless": True, "window": 5}),
                  ("ssd+csd w5", "ssd+csd", {"calibrated": False, "window": 5, "lam": 1.0}),
                  ("ssd+csd 1 row", "ssd+csd", {"calibrated": False, "rows": 1}),
                  ("ssd block", "ssd", {"rows": 2, "rounds": 1, "commit": "block"})]


def run_model(model_spec: str, batches: list[int], repeats: int) -> dict:
    """Host time and its share of the model's step per engine and batch, on a real model and the eval prompts."""
    from ssdgen.models.registry import load_model
    from ssdgen.reference.prompts import eval_prompts
    model = load_model(model_spec, device="cpu", dtype="fp32")
    prompts = [r["prompt"] for r in eval_prompts(max(batches))]
    measure(model, "ar", {}, 1, 1, prompts)  # first-call costs off the rows
    rows = []
    for label, family, params in MODEL_DECODERS:
        for b in batches:
            row = {"decoder": label, "batch": b} | measure(model, family, params, b, repeats, prompts)
            rows.append(row)
            print(f"{label:<16} batch {b:>3}: host {row['host_ms_per_forward']:7.2f} ms/forward, "
                  f"{100 * row['host_share_of_step']:5.1f}% of the model's step ({row['forwards']} forwards, "
                  f"wall {row['wall_s']:.2f} s)", flush=True)
    return {"what": f"host (non-step) wall time per forward and its share of the step, {model_spec}",
            "model": model.name, "repeats": repeats, "conditions": conditions(), "rows": rows}


def run(batches: list[int], repeats: int, codes: int, grid: int) -> dict:
    from ssdgen.reference.tiny import tiny_model
    with tempfile.TemporaryDirectory() as tmp:
        model = tiny_model(Path(tmp) / "tiny", codes=codes, grid=grid, scale=0.2)
        _heads(model)
        decode_warmup = measure(model, "ar", {}, 1, 1)  # first-call costs (allocator, lazy imports) off the rows
        rows = []
        for label, family, params in DECODERS:
            for b in batches:
                row = {"decoder": label, "batch": b} | measure(model, family, params, b, repeats)
                rows.append(row)
                print(f"{label:<14} batch {b:>3}: host {row['host_ms_per_forward']:8.3f} ms/forward "
                      f"({row['forwards']} forwards, wall {row['wall_s']:.3f} s, model {row['model_s']:.3f} s)",
                      flush=True)
    rng = rng_rows(batches, 3 * 7 + 2, codes)  # an 8-token window: accept, resample, Jacobi, fresh drafts
    return {"what": "host (non-model) wall ms per model forward, tiny reference model", "codes": codes,
            "grid": grid, "repeats": repeats, "warmup_s": decode_warmup["wall_s"], "conditions": conditions(),
            "rows": rows, "rng": rng}
