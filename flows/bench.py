"""`ssdgen bench`: every decoder in one process, on the same eval prompts and seeds.

Speed: for each decoder and batch size, `n` eval prompts are decoded and timed (forwards per image,
tokens per forward, seconds per image, images/s); `speedup_vs_ar` is the ratio to `ar` at the same
batch size, measured in the same run. Quality: `quality_n` eval prompts decoded batched, scored for
scene and object accuracy and FD against real renders.

Decoder specs are `name` or `name:key=value:key=value`, e.g. `csd:lam=0.5:delta=0.3`.
"""

from __future__ import annotations

import datetime as dt
import platform
import time

import numpy as np
import torch

from decoders import decode, decoder_config
from decoders.sampling import SamplingConfig


def parse_decoder_spec(spec: str) -> tuple[str, dict]:
    name, *kvs = spec.strip().split(":")
    params = {}
    for kv in kvs:
        if "=" not in kv:
            raise ValueError(f"decoder spec {spec!r}: expected key=value, got {kv!r}")
        k, v = kv.split("=", 1)
        params[k] = _value(v)
    decoder_config(name, params)  # validate now, before any work
    return name, params


def _value(v: str):
    if v.lower() in ("true", "false"):
        return v.lower() == "true"
    for cast in (int, float):
        try:
            return cast(v)
        except ValueError:
            pass
    return v


def _label(name: str, params: dict) -> str:
    return name + "".join(f":{k}={v}" for k, v in params.items())


def speed_row(model, name: str, params: dict, prompts: list[str], seeds: list[int], batch_size: int,
              sc: SamplingConfig) -> dict:
    forwards, committed, latencies = [], [], []
    t0 = time.perf_counter()
    for i in range(0, len(prompts), batch_size):
        tb = time.perf_counter()
        res = decode(name, model, prompts[i:i + batch_size], seeds[i:i + batch_size], sc, params)
        latencies += [time.perf_counter() - tb] * len(res.stats)  # a sample is done when its batch is
        forwards += [s.forwards for s in res.stats]
        committed += [s.tokens_per_forward for s in res.stats]
    secs = time.perf_counter() - t0
    return {"decoder": _label(name, params), "params": params, "batch_size": batch_size, "n": len(prompts),
            "forwards_per_image": float(np.mean(forwards)), "tokens_per_forward": float(np.mean(committed)),
            "seconds_per_image": secs / len(prompts), "images_per_s": len(prompts) / secs,
            "latency_p50_s": float(np.percentile(latencies, 50)), "latency_p90_s": float(np.percentile(latencies, 90))}


def bench(model, specs: list[str], n: int, batch_sizes: list[int], quality_n: int, sc: SamplingConfig,
          quality_batch: int = 64, seed: int = 0, log=print) -> dict:
    from reference.evaluate import evaluate
    from reference.prompts import eval_prompts
    if not specs:
        raise ValueError("--decoders is empty: name at least one decoder, e.g. ar,sjd,csd")
    if any(b < 1 for b in batch_sizes) or not batch_sizes:
        raise ValueError(f"--batch-sizes must be integers >= 1, got {batch_sizes}")
    decs = [parse_decoder_spec(s) for s in specs]
    if "ar" not in [d[0] for d in decs]:
        decs.insert(0, ("ar", {}))  # speedups are ratios to ar measured in this run
    rows_ = eval_prompts(n)
    prompts = [r["prompt"] for r in rows_]
    seeds = [seed * 1_000_003 + r["seed"] for r in rows_]
    rows = []
    for bs in batch_sizes:
        ar_sec = None
        for name, params in decs:
            row = speed_row(model, name, params, prompts, seeds, bs, sc)
            if name == "ar" and not params:
                ar_sec = row["seconds_per_image"]
            rows.append(row)
            log(f"speed  {row['decoder']:<28} batch {bs:>3}: {row['forwards_per_image']:.1f} forwards/image, "
                f"{row['seconds_per_image']:.3f} s/image")
        for row in rows:
            if row["batch_size"] == bs:
                row["speedup_vs_ar"] = ar_sec / row["seconds_per_image"]
    if quality_n:
        for name, params in decs:
            q = evaluate(model, name, quality_n, quality_batch, seed, sc, params)
            log(f"quality {_label(name, params):<27}: scene {q['scene_accuracy']:.3f}, object "
                f"{q['object_accuracy']:.3f}, FD {q['fd']:.2f}")
            for row in rows:
                if row["decoder"] == _label(name, params):
                    row.update(scene_accuracy=q["scene_accuracy"], object_accuracy=q["object_accuracy"],
                               fd=q["fd"], quality_n=quality_n, quality_forwards_per_image=q["forwards_per_image"])
    return {"model": model.name, "device": f"cpu ({platform.processor() or platform.machine()}, "
                                            f"{torch.get_num_threads()} threads)",
            "date": dt.date.today().isoformat(), "sampling": sc.__dict__, "rows": rows}
