"""`ssdgen bench`: every decoder in one process, on the same eval prompts and seeds, timed in rounds.

Speed: for each decoder and batch size (a cell), `n` eval prompts are decoded and timed once per round; every
round visits every cell, the cells of a batch size interleaved batch by batch (`time_rounds`). AR is timed a
second time in the same rounds as the control. bench/noise.py turns the rounds into medians with 95% intervals
(images/s, $ per 1k, the ratio to AR at the same batch and to AR's best), the control into the noise floor, and
the whole into the verdict: the cheapest configuration at its best batch and the ones that cannot be told apart
from it. bench/load.py watches the machine before and during the timing, and warns when it is busy. A row its
plan decoded as plain AR is labelled "= ar (plan)" and not ranked. Also per row: forwards per image, tokens per
forward, waste (query tokens computed in both CFG rows per committed token), latency percentiles. Quality:
`quality_n` eval prompts decoded batched, scored for scene and object accuracy and FD against real renders.

Cost: `usd_per_1k_images` = device-seconds per image x on-demand $ per device-hour / 3600 x 1000, from the
user's price (`--prices`, `--usd-per-hour`) or the `--device-type` row of the shipped table
(`output.cost`). A device is what the row prices: on a CPU type a vCPU, and the bench is billed
`torch.get_num_threads()` of them; on a GPU type, one GPU.

Forward accounting (for `bench.projection`): every `start` (prefill) and `step` (one forward) the decoder
makes is counted, with the rows it fed (CFG doubles them) and the query tokens per row, so a row also
carries `forwards_per_batch` (prefill included), `rows_per_forward`, `tokens_fed_per_forward` and
`prefill_tokens_per_image`. On CUDA the clock reads after a device synchronize. One untimed warm-up decode per
decoder runs first.

Decoders are `DecodeSpec`s (decoders/spec.py), e.g. `csd:lam=0.5:delta=0.3`; all share one sampling setting,
which the `ar` reference gets too. Rows are named by `spec.label` (the decoder and its parameters), a repeated
spec with its count ("ar #2").
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import platform
import sys
import time

import numpy as np
import torch

from ssdgen.decoders import build
from ssdgen.decoders.decoder import Decoder
from ssdgen.decoders.recipes import SamplingConfig
from ssdgen.decoders.spec import DecodeSpec, common_sampling, speculative_rows
from ssdgen.workers.cpus import ThreadGovernor, ThreadPolicy

from .forwards import ForwardCounter
from .workload import RoundLines, estimate_line, workload


class BenchInterrupted(KeyboardInterrupt):
    """A Ctrl-C stopped the bench; `result` is what it measured until then (its cells' whole rounds, their
    verdict, and where it stopped: `result["interrupted"]`). A KeyboardInterrupt still, to a caller that does not
    know it."""

    def __init__(self, result: dict):
        super().__init__("bench interrupted")
        self.result = result


def _sync(model) -> None:
    dev = getattr(model, "device", None)
    if dev is not None and torch.device(dev).type == "cuda":
        torch.cuda.synchronize(dev)


class SpeedTally:
    """One (decoder, batch size) cell's timings and counts, fed batch by batch and round by round: `time_rounds`
    interleaves the cells of a batch size batch by batch within each round, so a slow spell of the machine falls
    on every decoder alike, and each round gives the cell one images/s figure (bench/noise.py)."""

    def __init__(self, model, name: str, spec: DecodeSpec, batch_size: int, role: str, decoder: Decoder):
        """name: the row's (unique within a bench); role: reference (the AR that ratios divide by), control (AR
        timed again: the noise floor) or decoder; decoder: what decodes (`spec` as it resolves at this batch)."""
        self.model, self.name, self.spec, self.batch_size, self.role = model, name, spec, batch_size, role
        self.decoder = decoder
        self.fc = ForwardCounter(model)
        self.forwards, self.committed, self.latencies, self.accepted, self.waste = [], [], [], [], []
        self.batches, self.seconds, self.n = 0, 0.0, 0
        self.round_seconds: list[float] = []
        self.round_images: list[int] = []
        self.planned: dict | None = None  # a calibrated spec's plan columns at this batch size (bench._calibrate)

    def new_round(self) -> None:
        self.round_seconds.append(0.0)
        self.round_images.append(0)

    def drop_round(self) -> None:
        """The round in progress is no round (a Ctrl-C stopped it): the cell keeps its whole rounds only."""
        self.n -= self.round_images.pop()
        self.round_seconds.pop()

    def run_batch(self, prompts: list[str], seeds: list[int]) -> None:
        with self.fc as fc:
            fc.recording = self.batches == 0  # the first batch's forward shapes, for the shape replay
            _sync(self.model)
            t0 = time.perf_counter()
            res = self.decoder.decode(prompts, seeds)
            _sync(self.model)
            secs = time.perf_counter() - t0
        self.seconds += secs
        self.round_seconds[-1] += secs
        self.round_images[-1] += len(prompts)
        self.latencies += [secs] * len(res.stats)  # a sample is done when its batch is
        self.forwards += [s.forwards for s in res.stats]
        self.committed += [s.tokens_per_forward for s in res.stats]
        self.accepted += [s.acceptance_rate for s in res.stats]
        self.waste += [s.waste for s in res.stats]
        self.batches += 1
        self.n += len(prompts)

    def row(self) -> dict:
        """The counts; bench/noise.py adds the medians and intervals from `rounds_images_per_s`."""
        fc, n, accepted = self.fc, self.n, self.accepted
        return {"decoder": self.name, "spec": self.spec.label, "role": self.role, "params": dict(self.spec.params),
                "batch_size": self.batch_size, "n": n // max(1, len(self.round_seconds)),
                "rounds": len(self.round_seconds),
                "rounds_images_per_s": [k / s for k, s in zip(self.round_images, self.round_seconds)],
                "lossless": self.spec.lossless,  # exact by construction; else only fidelity says how far
                "forwards_per_image": float(np.mean(self.forwards)),
                "tokens_per_forward": float(np.mean(self.committed)),
                # query tokens computed (both CFG rows) per committed token, prefill as one: ar 2.0 with CFG
                "waste": float(np.mean(self.waste)),
                # drafts accepted / drafts verified (nan for ar): the heads' and drafters' quality
                "acceptance_rate": float(np.nanmean(accepted)) if not np.all(np.isnan(accepted)) else None,
                "latency_p50_s": float(np.percentile(self.latencies, 50)),
                "latency_p90_s": float(np.percentile(self.latencies, 90)),
                # model calls, for bench.projection (a batch runs as long as its slowest sample): forwards per
                # batch with the prefill, as forwards_per_image counts it; rows and tokens per step forward
                "batches": self.batches, "forwards_per_batch": (fc.prefills + fc.steps) / self.batches,
                "rows_per_forward": fc.step_rows / max(1, fc.steps),
                "tokens_fed_per_forward": fc.step_tokens / max(1, fc.step_rows),
                "prefill_tokens_per_image": fc.prefill_tokens / n,
                "trace": {"batch": min(self.batch_size, n), "forwards": fc.trace}}


def time_rounds(tallies: list[SpeedTally], prompts: list[str], seeds: list[int], rounds: int, monitor=None,
                progress: bool | None = None, lines: RoundLines | None = None) -> None:
    """Every round visits every cell once: per batch size, its cells decode every batch of the prompts,
    interleaved batch by batch, starting each round one decoder further on (no decoder always goes first).
    A progress bar per cell with its ETA, and one for the whole bench (on a terminal; `progress`); `lines`: a
    line per round and batch size instead (off a terminal). A Ctrl-C leaves every cell its whole rounds."""
    from tqdm import tqdm
    sizes = list(dict.fromkeys(t.batch_size for t in tallies))
    total = rounds * len(tallies) * len(prompts)
    with tqdm(total=total, desc="bench", unit="img", disable=True if progress is False else None,
              position=0, dynamic_ncols=True) as overall:
        for r in range(rounds):
            for bs in sizes:
                group = [t for t in tallies if t.batch_size == bs]
                k = r % len(group)
                group = group[k:] + group[:k]
                bars = [tqdm(total=len(prompts), desc=f"round {r + 1}/{rounds} batch {bs} {t.name}", unit="img",
                             leave=False, position=j + 1, disable=overall.disable, dynamic_ncols=True)
                        for j, t in enumerate(group)]
                for t in group:
                    t.new_round()
                try:
                    for i in range(0, len(prompts), bs):
                        for t, bar in zip(group, bars):
                            t.run_batch(prompts[i:i + bs], seeds[i:i + bs])
                            bar.update(len(prompts[i:i + bs]))
                            overall.update(len(prompts[i:i + bs]))
                except KeyboardInterrupt:
                    for t in group:
                        t.drop_round()
                    raise
                for bar in bars:
                    bar.close()
                if monitor is not None:
                    monitor.mark(f"round {r + 1}, batch {bs}")
                if lines is not None:
                    lines.group_done(r, rounds, bs, len(group) * len(prompts))


def model_info(model) -> dict:
    """Sizes the projection needs, where the model exposes them (the reference model does)."""
    info: dict = {"grid": list(getattr(model, "grid", ()) or ())}
    gpt = getattr(model, "gpt", None)
    if gpt is not None:
        g = gpt.cfg
        p = next(gpt.parameters())
        info |= {"params": int(sum(t.numel() for t in gpt.parameters())), "layers": g.n_layers, "dim": g.dim,
                 "kv_dim": g.dim, "prompt_len": g.caption_len, "bytes_per_param": p.element_size()}
    if model.capabilities.kv_dtype is not None:  # `reference:kv=bf16`: the cache's precision, not the weights'
        info["kv_dtype"] = model.capabilities.kv_dtype
    return info


def resolve_device(device: str, device_type: str, price=None):
    """(torch device, Price, devices billed). Rejects a device type that does not price this device. `price`:
    the user's (output.cost); default: the shipped table's row for `device_type`."""
    from ssdgen.output.cost import price_for
    price = price or price_for(device_type)  # unknown types: ValueError listing the known ones
    try:
        dev = torch.device(device)
    except RuntimeError as e:  # torch's word for a malformed device string: the user's to fix, so a ValueError
        raise ValueError(f"--device {device!r}: {e}") from None
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


def row_names(specs: list[DecodeSpec], ar: DecodeSpec) -> list[tuple[str, DecodeSpec, str]]:
    """(name, spec, role) per timed row, in the order given: a repeated spec is a row of its own ("ar", "ar #2");
    the first `ar` is the reference (inserted first when not given), and one more AR is the control."""
    out, seen = [], {}
    for spec in ([] if ar in specs else [ar]) + list(specs):
        seen[spec.label] = seen.get(spec.label, 0) + 1
        k = seen[spec.label]
        role = "reference" if spec == ar and not any(r == "reference" for _, _, r in out) else "decoder"
        out.append((spec.label if k == 1 else f"{spec.label} #{k}", spec, role))
    return out + [("ar (control)", ar, "control")]


def bench(model, specs: list[DecodeSpec], n: int, batch_sizes: list[int], quality_n: int,
          quality_batch: int = 64, seed: int = 0, log=print, device_type: str = "cpu",
          warmup: bool = True, quality_decoders: list[DecodeSpec] | None = None, fidelity_n: int = 0,
          tolerance: float = 0.15, rounds: int = 3, price=None, progress: bool | None = None) -> dict:
    """`rounds` (>= 1; 3 or more for an interval) times every cell; `warmup` decodes one prompt per decoder first,
    untimed (allocator, thread pool; CUDA/cuBLAS start-up). A device-calibrated spec is resolved at each batch
    size first, as a run is once (`plan_rows`, `plan_spec`, `calibration_s`, `plan_measured` in its row), so the
    timed batches decode by the resolved spec. `price`: a output.cost.Price (default: `device_type`'s row).
    `quality_decoders`: the decoder specs to score for quality (default: all); lossless decoders sample AR's
    distribution by construction (tested exactly and statistically), so a run may spend its time elsewhere."""
    from ssdgen.bench.load import LoadMonitor
    sc = check_args(specs, batch_sizes)
    if rounds < 1:
        raise ValueError(f"--rounds must be >= 1, got {rounds}")
    # threads follow what other processes leave (workers/cpus.py), as a run's actors do: a busy core costs a
    # thread, not the whole bench; `load` says what the machine did, `threads_given_up` what that cost
    governor = ThreadGovernor(ThreadPolicy.from_env())
    dev, price, devices = resolve_device(str(getattr(model, "device", "cpu")), device_type, price)
    label = device_label(dev)
    monitor = LoadMonitor(governor.cap)
    monitor.idle_check()
    with governor.watching(model):
        out = _bench(model, specs, n, batch_sizes, quality_n, quality_batch, seed, log, warmup, quality_decoders,
                     fidelity_n, tolerance, rounds, price, devices, progress, sc, monitor)
    res = {"model": model.name, "device": label, "torch_device": str(dev),
           "device_type": price.device_type, "devices": devices, "threads": governor.cap,
           "threads_given_up": governor.report(), "price": dataclasses.asdict(price),
           "model_info": model_info(model)} | out
    if res.get("interrupted"):
        raise BenchInterrupted(res)
    return res


def _bench(model, specs, n, batch_sizes, quality_n, quality_batch, seed, log, warmup, quality_decoders,
           fidelity_n, tolerance, rounds, price, devices, progress, sc, monitor) -> dict:
    """The bench's decoding, under its thread governor (`bench`), said first (bench/workload.py). A Ctrl-C keeps
    what was measured: the cells' whole rounds, ranked as ever, and where it stopped (`interrupted`)."""
    from ssdgen.reference.prompts import eval_prompts, eval_seed
    named = row_names(specs, DecodeSpec("ar", (), sc))
    decs = list(dict.fromkeys(spec for _, spec, _ in named))  # each spec once: heads, plans, quality, fidelity
    built = {spec: build(spec, model) for spec in decs}  # heads loaded once; missing heads fail before any decode
    scored = [s for s in decs if quality_decoders is None or s in quality_decoders]
    work = workload(named, scored, decs, n, len(batch_sizes), rounds, quality_n, fidelity_n)
    log(work.line())
    rows_ = eval_prompts(n)
    prompts = [r["prompt"] for r in rows_]
    seeds = [eval_seed(seed, r["seed"]) for r in rows_]
    done = _Measured()
    try:
        if warmup:
            log(estimate_line(work, _warm_up(model, built, prompts, seeds)))
        done.phase = "calibration"
        done.tallies = _cells(model, named, built, prompts, seeds, batch_sizes, log)
        monitor.mark("calibration")
        log(f"timing {len(done.tallies)} cells ({len(named) - 1} decoders and an AR control x {len(batch_sizes)} "
            f"batch sizes) in {rounds} interleaved rounds of {n} prompts each")
        done.phase = "timing"
        off_terminal = progress is False or (progress is None and not sys.stdout.isatty())
        lines = RoundLines(log, work.total("timed"), work.total("quality") + work.total("fidelity")) \
            if off_terminal else None
        time_rounds(done.tallies, prompts, seeds, rounds, monitor, progress, lines)
        done.rows, done.floor = _speed_rows(done.tallies, price, devices, log)
        done.phase = "quality"
        if quality_n:
            _add_quality(model, decs, done.rows, quality_decoders, quality_n, quality_batch, seed, log)
        done.phase = "fidelity"
        done.samples = _add_fidelity(model, decs, done.rows, fidelity_n, quality_batch, seed, tolerance, log) \
            if fidelity_n else None
        done.phase = None
    except KeyboardInterrupt:  # what was measured is kept: the cells' whole rounds and the phases done
        done.stopped(price, devices, log)
    return done.result(sc, rounds, n, monitor) \
        | ({"samples": done.samples, "fidelity_n": fidelity_n, "tolerance": tolerance} if fidelity_n else {})


def _warm_up(model, built: dict, prompts: list[str], seeds: list[int]) -> dict:
    """One untimed image per decoder at batch 1 (allocator, thread pool; CUDA/cuBLAS start-up) -> {spec: its
    seconds}, the pace the bench's first estimate is read at (a calibrated spec's plan not included)."""
    took = {}
    for spec, dec in built.items():
        chosen = dec.resolve(prompts[:1], seeds[:1], 1)
        t0 = time.perf_counter()
        chosen.decode(prompts[:1], seeds[:1])
        _sync(model)
        took[spec] = time.perf_counter() - t0
    return took


class _Measured:
    """What the bench measured so far: its cells, then their rows and noise floor, then the samples; `phase`:
    where it is (None once done)."""

    def __init__(self):
        self.phase: str | None = "warm-up"
        self.tallies: list[SpeedTally] = []
        self.rows: list[dict] | None = None
        self.floor: dict = {"floor": None, "by_batch": []}
        self.samples = None
        self.rounds_done: int | None = None

    def stopped(self, price, devices: int, log) -> None:
        """After a Ctrl-C: the rows of the cells with a whole round (time_rounds dropped the one in progress)."""
        if self.rows is None:
            kept = [t for t in self.tallies if t.round_seconds]
            self.rounds_done = min((len(t.round_seconds) for t in kept), default=0)
            if kept:
                self.rows, self.floor = _speed_rows(kept, price, devices, log)
        self.phase = self.phase or "the end"
        self.samples = None

    def result(self, sc, rounds: int, n: int, monitor) -> dict:
        from ssdgen.bench import noise
        rows = self.rows or []
        best = noise.best_batches(rows, self.floor["floor"] or 0.0)
        verdict = noise.verdict(rows, best, self.floor["floor"] or 0.0) if rows else None
        out = {"date": dt.date.today().isoformat(), "sampling": sc.__dict__, "rounds": rounds, "n": n,
               "verdict": verdict, "load": monitor.report(), "noise": self.floor, "best": best, "rows": rows}
        if self.phase is not None:
            out["interrupted"] = {"phase": self.phase, "rounds_done": self.rounds_done,
                                  "cells": len({(r["decoder"], r["batch_size"]) for r in rows})}
        return out


def _cells(model, named, built: dict, prompts, seeds, batch_sizes, log) -> list[SpeedTally]:
    """A tally per (batch size, named row), each decoding as its spec resolves at that batch size (`_calibrate`,
    once per spec and batch size), its plan's columns kept for the row."""
    tallies = []
    for bs in batch_sizes:
        if bs > len(prompts):
            log(f"note: batch {bs} > --n {len(prompts)}: its batches hold all {len(prompts)} prompts, as batch "
                f"{len(prompts)} would")
        plans = {spec: _calibrate(dec, prompts, seeds, bs) for spec, dec in built.items()}
        for name, spec, role in named:
            t = SpeedTally(model, name, spec, bs, role, plans[spec][0])
            t.planned = plans[spec][1]
            tallies.append(t)
    return tallies


def _speed_rows(tallies: list[SpeedTally], price, devices: int, log) -> tuple[list[dict], dict]:
    """(the rows, the noise block with the control's rows): medians, intervals, $ and the ratios (bench/noise.py);
    a row its plan decoded as plain AR is labelled."""
    from ssdgen.bench import noise
    all_rows = [t.row() | (t.planned or {}) for t in tallies]
    for row in all_rows:
        row["planned_as_ar"] = row.get("plan_choice") == "ar"
        if row["planned_as_ar"]:
            row["planned_as"] = "= ar (plan)"
    rows = [r for r in all_rows if r["role"] != "control"]
    control = [r for r in all_rows if r["role"] == "control"]
    floor = noise.noise_floor(all_rows, control) if control[0]["rounds"] > 1 else {"floor": None, "by_batch": []}
    per_s = devices * price.on_demand_usd_per_hour / 3.6
    spot = None if price.spot_usd_per_hour is None else devices * price.spot_usd_per_hour / 3.6
    noise.add_cell_stats(all_rows, floor["floor"] or 0.0, per_s, spot)
    for row in all_rows:
        row["device_seconds_per_image"] = row["seconds_per_image"] * devices
        log(f"speed  {row['decoder']:<28} batch {row['batch_size']:>3}: {row['forwards_per_image']:.1f} "
            f"forwards/image, {row['images_per_s']:.3g} images/s {noise.fmt_interval(row['images_per_s_ci'])}"
            + (f" {row['planned_as']}" if row.get("planned_as") else ""))
    floor["control"] = control
    return rows, floor


def _calibrate(dec: Decoder, prompts: list[str], seeds: list[int], batch: int) -> tuple[Decoder, dict | None]:
    """(what the spec decodes as at this batch size, the row's calibration columns): a calibrated spec resolved
    as a run resolves it (`Decoder.resolve`: on its first prompts); any other spec as it is."""
    chosen = dec.resolve(prompts, seeds, batch)
    if chosen.plan is None:
        return dec, None
    m = chosen.plan
    return chosen, {"plan_rows": speculative_rows(chosen.spec), "plan_spec": str(chosen),
                    "calibration_s": m.seconds, "plan_choice": m.choice, "plan_why": m.why}


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
            if row["spec"] == spec.label:
                row.update(scene_accuracy=q["scene_accuracy"], object_accuracy=q["object_accuracy"],
                           fd=q["fd"], quality_n=n, quality_forwards_per_image=q["forwards_per_image"])


FIDELITY_COLS = ("nll_gap", "nll_gap_ci", "indistinguishable", "within_tolerance", "fd_to_ar", "fd_noise_floor")


def _add_fidelity(model, decs, rows, n, batch, seed, tolerance, log) -> dict | None:
    """Fidelity columns on every speed row of each decoder; returns the side-by-side samples (or None). A
    calibrated spec's row gets the fidelity of what its plan decoded at that batch size (`fidelity_of`): one
    of its choices, or the AR control."""
    from ssdgen.bench.fidelity import choices, fidelity
    from ssdgen.reference.prompts import eval_prompts, eval_seed
    ev = eval_prompts(n)
    fid = fidelity(model, decs, [r["prompt"] for r in ev], [eval_seed(seed, r["seed"]) for r in ev],
                   batch, tolerance, log=log, keep_images=8)
    by_label = {r["decoder"]: r for r in fid["rows"]}
    specs = {s.label: s for s in decs}
    for row in rows:
        f = by_label.get(row["spec"])
        if row.get("plan_choice") is not None:  # what the plan decoded: AR, or one of the spec's choices
            c = row["plan_choice"]
            f = by_label["ar"] if c == "ar" else by_label[choices(specs[row["spec"]])[c].label]
            row["fidelity_of"] = f["decoder"]
        if f is not None:
            row.update({k: f[k] for k in FIDELITY_COLS} | {"fidelity_n": n})
            if "scene_accuracy" in f and "quality_n" not in row:  # the scorer's verdict on the same samples
                row.update(scene_accuracy=f["scene_accuracy"], object_accuracy=f["object_accuracy"], quality_n=n)
    return fid.get("samples")
