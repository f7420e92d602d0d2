"""`ssdgen bench`: every decoder in one process, on the same eval prompts and seeds.

Speed: for each decoder and batch size, `n` eval prompts are decoded and timed (forwards per image,
tokens per forward, seconds per image, images/s, waste: query tokens computed in both CFG rows per committed
token, the mean of the decoders' own per-sample count); `speedup_vs_ar` is the ratio to `ar` at the same
batch size, measured in the same run. `best` (best_batches): each decoder at the batch size where it
rendered the most images/s, with its cost, fidelity and batch-1 latency, and its ratio to ar's best: the
headline, since a dataset job runs at whatever batch is cheapest. Quality: `quality_n` eval prompts decoded
batched, scored for scene and object accuracy and FD against real renders.

Cost: `usd_per_1k_images` = device-seconds per image x on-demand $ per device-hour / 3600 x 1000, from the
`--device-type` row of `infra/prices.csv` (`flows.cost.price_for`). A device is what the row prices: on a CPU
type a vCPU, and the bench is billed `torch.get_num_threads()` of them; on a GPU type, one GPU.

Forward accounting (for `bench.projection`): every `start` (prefill) and `step` (one forward) the decoder
makes is counted, with the rows it fed (CFG doubles them) and the query tokens per row, so a row also
carries `forwards_per_batch` (prefill included), `rows_per_forward`, `tokens_fed_per_forward` and
`prefill_tokens_per_image`. On CUDA the clock reads after a device synchronize, and one untimed warm-up
decode per decoder runs first.

Decoders are `DecodeSpec`s (decoders/spec.py), e.g. `csd:lam=0.5:delta=0.3`; all share one sampling setting,
which the `ar` reference gets too, and rows are named by `spec.label` (the decoder and its parameters).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import platform
import time

import numpy as np
import torch

from ssdgen.decoders import heads_for, resolve, run
from ssdgen.decoders.configs import CALIBRATION_PROMPTS
from ssdgen.decoders.sampling import SamplingConfig
from ssdgen.decoders.spec import DecodeSpec, common_sampling, speculative_rows


class ForwardCounter:
    """Counts the model calls a decoder makes: prefills (`start`) and forwards (`step`), with the rows fed
    (CFG's doubled batch included) and the query tokens per row. Wraps the instance's methods while active.

    While `recording`, each call is also appended to `trace` as [rows, tokens per row, context length]: the
    forward shapes a decoder produced, which bench/shape_replay.py replays on bigger models."""

    def __init__(self, model):
        self.model = model
        self.prefills = self.prefill_tokens = self.steps = self.step_rows = self.step_tokens = 0
        self.recording, self.trace = False, []

    def __enter__(self):
        m = self.model
        self._saved = {k: m.__dict__[k] for k in ("start", "step") if k in m.__dict__}
        start, step = m.start, m.step

        def counted_start(prompts, use_cfg):
            out = start(prompts, use_cfg)
            self.prefills += 1
            rows = len(prompts) * (2 if use_cfg else 1)
            self.prefill_tokens += rows * _prompt_len(m)
            self._cfg_factor = 2 if use_cfg else 1
            if self.recording:
                self.trace.append([rows, _prompt_len(m), _prompt_len(m)])
            return out

        def counted_step(tokens, index, lengths=None, **kw):  # kw: tree= (decoders/branches.py)
            self.steps += 1
            f = getattr(self, "_cfg_factor", 1)
            self.step_rows += tokens.shape[0] * f
            # a packed step computes each row's own entries only
            self.step_tokens += (tokens.numel() if lengths is None else int(lengths.sum())) * f
            if self.recording:  # the furthest position fed bounds the attention's width; the padded width
                # a tree step caches entry s at slot index[:, 0] + s (reference/gpt.py tree_mask), past its positions
                end = int(index[:, 0].max()) + tokens.shape[1] if kw.get("tree") is not None else int(index.max()) + 1
                self.trace.append([tokens.shape[0] * f, tokens.shape[1], _prompt_len(m) + end])
            return step(tokens, index, lengths, **kw)

        m.start, m.step = counted_start, counted_step
        return self

    def __exit__(self, *exc):
        m = self.model
        for k in ("start", "step"):
            if k in self._saved:
                setattr(m, k, self._saved[k])
            else:
                m.__dict__.pop(k, None)
        return False


def _prompt_len(model) -> int:
    g = getattr(getattr(model, "gpt", None), "cfg", None)
    return int(getattr(g, "caption_len", 0) or 0)


def _sync(model) -> None:
    dev = getattr(model, "device", None)
    if dev is not None and torch.device(dev).type == "cuda":
        torch.cuda.synchronize(dev)


class SpeedTally:
    """One decoder's timings and counts at one batch size, fed batch by batch: `bench` interleaves the decoders
    batch by batch, so a slow spell of the machine falls on every decoder alike and the ratios to `ar` hold."""

    def __init__(self, model, spec: DecodeSpec, batch_size: int, decode_as: DecodeSpec | None = None, heads=None):
        """spec: the row's; decode_as: what decodes (a calibrated spec's resolution; default spec); heads: its."""
        self.model, self.spec, self.batch_size = model, spec, batch_size
        self.decode_as, self.heads = decode_as or spec, heads
        self.fc = ForwardCounter(model)
        self.forwards, self.committed, self.latencies, self.accepted, self.waste = [], [], [], [], []
        self.batches, self.seconds, self.n = 0, 0.0, 0

    def run_batch(self, prompts: list[str], seeds: list[int]) -> None:
        with self.fc as fc:
            fc.recording = self.batches == 0  # the first batch's forward shapes, for the shape replay
            _sync(self.model)
            t0 = time.perf_counter()
            res = run(self.decode_as, self.model, prompts, seeds, self.heads)
            _sync(self.model)
            secs = time.perf_counter() - t0
        self.seconds += secs
        self.latencies += [secs] * len(res.stats)  # a sample is done when its batch is
        self.forwards += [s.forwards for s in res.stats]
        self.committed += [s.tokens_per_forward for s in res.stats]
        self.accepted += [s.acceptance_rate for s in res.stats]
        self.waste += [s.waste for s in res.stats]
        self.batches += 1
        self.n += len(prompts)

    def row(self) -> dict:
        fc, n, secs, accepted = self.fc, self.n, self.seconds, self.accepted
        return {"decoder": self.spec.label, "params": dict(self.spec.params), "batch_size": self.batch_size, "n": n,
                "forwards_per_image": float(np.mean(self.forwards)),
                "tokens_per_forward": float(np.mean(self.committed)),
                # query tokens computed (both CFG rows) per committed token, prefill as one: ar 2.0 with CFG
                "waste": float(np.mean(self.waste)),
                # drafts accepted / drafts verified (nan for ar): the heads' and drafters' quality
                "acceptance_rate": float(np.nanmean(accepted)) if not np.all(np.isnan(accepted)) else None,
                "seconds_per_image": secs / n, "images_per_s": n / secs,
                "latency_p50_s": float(np.percentile(self.latencies, 50)),
                "latency_p90_s": float(np.percentile(self.latencies, 90)),
                # model calls, for bench.projection (a batch runs as long as its slowest sample): forwards per
                # batch with the prefill, as forwards_per_image counts it; rows and tokens per step forward
                "batches": self.batches, "forwards_per_batch": (fc.prefills + fc.steps) / self.batches,
                "rows_per_forward": fc.step_rows / max(1, fc.steps),
                "tokens_fed_per_forward": fc.step_tokens / max(1, fc.step_rows),
                "prefill_tokens_per_image": fc.prefill_tokens / n,
                "trace": {"batch": min(self.batch_size, n), "forwards": fc.trace}}


def speed_rows(model, specs: list[DecodeSpec], prompts: list[str], seeds: list[int], batch_size: int,
               resolved: list[DecodeSpec] | None = None, heads: dict | None = None) -> list[dict]:
    """Every spec over every batch of the prompts, interleaved batch by batch (SpeedTally); resolved: what each
    spec decodes as (a calibrated one's resolution at this batch size); heads: {spec: its heads}."""
    resolved, heads = resolved or list(specs), heads or {}
    tallies = [SpeedTally(model, spec, batch_size, as_, heads.get(spec)) for spec, as_ in zip(specs, resolved)]
    for i in range(0, len(prompts), batch_size):
        for t in tallies:
            t.run_batch(prompts[i:i + batch_size], seeds[i:i + batch_size])
    return [t.row() for t in tallies]


def model_info(model) -> dict:
    """Sizes the projection needs, where the model exposes them (the reference model does)."""
    info: dict = {"grid": list(getattr(model, "grid", ()) or ())}
    gpt = getattr(model, "gpt", None)
    if gpt is not None:
        g = gpt.cfg
        p = next(gpt.parameters())
        info |= {"params": int(sum(t.numel() for t in gpt.parameters())), "layers": g.n_layers, "dim": g.dim,
                 "kv_dim": g.dim, "prompt_len": g.caption_len, "bytes_per_param": p.element_size()}
    return info


def resolve_device(device: str, device_type: str):
    """(torch device, Price, devices billed). Rejects a device type that does not price this device."""
    from ssdgen.flows.cost import price_for
    price = price_for(device_type)  # unknown types: ValueError listing the known ones
    dev = torch.device(device)  # a malformed device string raises RuntimeError
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {device}: CUDA is not available on this machine (torch {torch.__version__})")
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"--device must be cpu or cuda[:N], got {device!r}")
    if price.unit == "gpu" and dev.type != "cuda":
        raise ValueError(f"device type {price.device_type!r} is priced per GPU but the bench runs on {device}; "
                         "pass --device cuda, or --device-type cpu")
    if price.unit == "vcpu" and dev.type == "cuda":
        raise ValueError(f"device type {price.device_type!r} is priced per vCPU but the bench runs on {device}; "
                         "pass the GPU's --device-type (e.g. l4, h100)")
    devices = torch.get_num_threads() if price.unit == "vcpu" else 1
    return dev, price, devices


def device_label(dev) -> str:
    if torch.device(dev).type == "cuda":
        return f"cuda ({torch.cuda.get_device_name(dev)}, torch {torch.__version__})"
    return f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def check_args(specs: list[DecodeSpec], batch_sizes: list[int]) -> SamplingConfig:
    """Argument errors before any work; returns the one sampling setting the decoders share."""
    if not specs:
        raise ValueError("--decoders is empty: name at least one decoder, e.g. ar,sjd,csd")
    if not batch_sizes or any(b < 1 for b in batch_sizes):
        raise ValueError(f"--batch-sizes must be integers >= 1, got {batch_sizes}")
    return common_sampling(specs)


def bench(model, specs: list[DecodeSpec], n: int, batch_sizes: list[int], quality_n: int,
          quality_batch: int = 64, seed: int = 0, log=print, device_type: str = "cpu",
          warmup: bool | None = None, quality_decoders: list[DecodeSpec] | None = None, fidelity_n: int = 0,
          tolerance: float = 0.15) -> dict:
    """`warmup` (default: on CUDA only) decodes one prompt per decoder first, untimed (CUDA/cuBLAS start-up).
    A device-calibrated spec is resolved at each batch size first, as a run is once (`plan_rows`, `plan_spec`,
    `calibration_s`, `plan_measured` in its row), so the timed batches decode by the resolved spec.
    `quality_decoders`: the decoder specs to score for quality (default: all); lossless decoders sample AR's
    distribution by construction (tested exactly and statistically), so a run may spend its time elsewhere."""
    from ssdgen.reference.prompts import eval_prompts
    sc = check_args(specs, batch_sizes)
    dev, price, devices = resolve_device(str(getattr(model, "device", "cpu")), device_type)
    decs = list(specs)
    heads = {spec: heads_for(spec, model) for spec in decs}  # loaded once; missing heads fail before any decode
    ar = DecodeSpec("ar", (), sc)
    if ar not in decs:
        decs.insert(0, ar)  # speedups are ratios to ar measured in this run
    rows_ = eval_prompts(n)
    prompts = [r["prompt"] for r in rows_]
    seeds = [seed * 1_000_003 + r["seed"] for r in rows_]
    if warmup if warmup is not None else dev.type == "cuda":
        for spec in decs:
            run(resolve(spec, model, prompts[:1], seeds[:1], 1, heads.get(spec))[0], model, prompts[:1], seeds[:1],
                heads.get(spec))
        _sync(model)
    rows = []
    for bs in batch_sizes:
        if bs > n:
            log(f"note: batch {bs} > --n {n}: its batches hold all {n} prompts, as batch {n} would")
        plans = [_calibrate(model, spec, prompts, seeds, bs, heads.get(spec)) for spec in decs]
        resolved = [as_ for as_, _ in plans]
        for row, (_, planned) in zip(speed_rows(model, decs, prompts, seeds, bs, resolved, heads), plans):
            row |= planned or {}
            row["device_seconds_per_image"] = row["seconds_per_image"] * devices
            row["usd_per_1k_images"] = row["device_seconds_per_image"] * price.on_demand_usd_per_hour / 3.6
            row["usd_per_1k_images_spot"] = (None if price.spot_usd_per_hour is None else
                                             row["device_seconds_per_image"] * price.spot_usd_per_hour / 3.6)
            rows.append(row)
            log(f"speed  {row['decoder']:<28} batch {bs:>3}: {row['forwards_per_image']:.1f} forwards/image, "
                f"{row['seconds_per_image']:.3f} s/image, ${row['usd_per_1k_images']:.4g}/1k images")
        ar_sec = next(r["seconds_per_image"] for r in rows if r["batch_size"] == bs and r["decoder"] == "ar")
        for row in rows:
            if row["batch_size"] == bs:
                row["speedup_vs_ar"] = ar_sec / row["seconds_per_image"]
    if quality_n:
        _add_quality(model, decs, rows, quality_decoders, quality_n, quality_batch, seed, log)
    samples = _add_fidelity(model, decs, rows, fidelity_n, quality_batch, seed, tolerance, log) \
        if fidelity_n else None
    return {"model": model.name, "device": device_label(dev), "torch_device": str(dev),
            "device_type": price.device_type, "devices": devices, "threads": torch.get_num_threads(),
            "price": dataclasses.asdict(price), "model_info": model_info(model),
            "date": dt.date.today().isoformat(), "sampling": sc.__dict__, "best": best_batches(rows),
            "rows": rows} \
        | ({"samples": samples, "fidelity_n": fidelity_n, "tolerance": tolerance} if fidelity_n else {})


def _calibrate(model, spec: DecodeSpec, prompts: list[str], seeds: list[int], batch: int,
               heads=None) -> tuple[DecodeSpec, dict | None]:
    """(what the spec decodes as at this batch size, the row's calibration columns): a calibrated spec resolved
    as a run resolves it (decoders/calibrate.py: on the first max(batch, 4) prompts); any other spec as it is."""
    k = max(batch, CALIBRATION_PROMPTS)
    resolved, measured = resolve(spec, model, prompts[:k], seeds[:k], batch, heads)
    if measured is None:
        return spec, None
    return resolved, {"plan_rows": speculative_rows(resolved), "plan_spec": str(resolved),
                      "calibration_s": measured.seconds, "plan_choice": measured.choice, "plan_why": measured.why}


def _add_quality(model, decs, rows, chosen, n, batch, seed, log) -> None:
    """Scene accuracy, object accuracy and FD on every speed row of each chosen decoder."""
    from ssdgen.bench.fidelity import uncapped
    from ssdgen.reference.evaluate import evaluate
    if chosen is not None:
        unknown = [str(q) for q in chosen if q not in decs]
        if unknown:
            raise ValueError(f"--quality-decoders {unknown} are not among --decoders")
    for spec in decs:
        if chosen is not None and spec not in chosen:
            continue
        # a calibrated spec at its widest choice (bench/fidelity.py)
        q = evaluate(model, uncapped(spec), n, batch, seed)
        log(f"quality {spec.label:<27}: scene {q['scene_accuracy']:.3f}, object "
            f"{q['object_accuracy']:.3f}, FD {q['fd']:.2f}")
        for row in rows:
            if row["decoder"] == spec.label:
                row.update(scene_accuracy=q["scene_accuracy"], object_accuracy=q["object_accuracy"],
                           fd=q["fd"], quality_n=n, quality_forwards_per_image=q["forwards_per_image"])


FIDELITY_COLS = ("nll_gap", "nll_gap_ci", "indistinguishable", "within_tolerance", "fd_to_ar", "fd_noise_floor")


def _add_fidelity(model, decs, rows, n, batch, seed, tolerance, log) -> dict | None:
    """Fidelity columns on every speed row of each decoder; returns the side-by-side samples (or None). A
    calibrated spec's row gets the fidelity of what its plan decoded at that batch size (`fidelity_of`): one
    of its choices, or the AR control."""
    from ssdgen.bench.fidelity import choices, fidelity
    from ssdgen.reference.prompts import eval_prompts
    ev = eval_prompts(n)
    fid = fidelity(model, decs, [r["prompt"] for r in ev], [seed * 1_000_003 + r["seed"] for r in ev],
                   batch, tolerance, log=log, keep_images=8)
    by_label = {r["decoder"]: r for r in fid["rows"]}
    specs = {s.label: s for s in decs}
    for row in rows:
        f = by_label.get(row["decoder"])
        if row.get("plan_choice") is not None:  # what the plan decoded: AR, or one of the spec's choices
            c = row["plan_choice"]
            f = by_label["ar"] if c == "ar" else by_label[choices(specs[row["decoder"]])[c].label]
            row["fidelity_of"] = f["decoder"]
        if f is not None:
            row.update({k: f[k] for k in FIDELITY_COLS} | {"fidelity_n": n})
            if "scene_accuracy" in f and "quality_n" not in row:  # the scorer's verdict on the same samples
                row.update(scene_accuracy=f["scene_accuracy"], object_accuracy=f["object_accuracy"], quality_n=n)
    return fid.get("samples")


BEST_COLS = ("batch_size", "images_per_s", "seconds_per_image", "usd_per_1k_images", "usd_per_1k_images_spot",
             "waste", "speedup_vs_ar", "plan_spec", "fidelity_of", "fidelity_n") + FIDELITY_COLS


def best_batches(rows: list[dict]) -> list[dict]:
    """Per decoder (in the rows' order), its row with the most images/s among the batch sizes measured: that
    row's BEST_COLS (the fidelity ones where the bench measured them), `latency_batch1_s` (s/image at batch 1,
    None when batch 1 was not measured) and `vs_ar_best` (its images/s / ar's best images/s; None without ar)."""
    best: dict[str, dict] = {}
    for r in rows:
        if r["images_per_s"] > best.get(r["decoder"], {"images_per_s": -1.0})["images_per_s"]:
            best[r["decoder"]] = r
    ar_best = best["ar"]["images_per_s"] if "ar" in best else None
    out = []
    for d, r in best.items():
        one = next((x for x in rows if x["decoder"] == d and x["batch_size"] == 1), None)
        out.append({"decoder": d} | {k: r[k] for k in BEST_COLS if k in r}
                   | {"latency_batch1_s": None if one is None else one["seconds_per_image"],
                      "vs_ar_best": None if ar_best is None else r["images_per_s"] / ar_best})
    return out
