"""The projection's method checked against benches measured on this machine: this device's bandwidth and
FLOP/s measured by a copy / matmul microbenchmark, the roofline applied to the bench's own model, and the
error of the predicted s/image against the measured one (ssdgen's bench/projection.py says what is projected).

    python -m lab projection-check BENCH.json [BENCH2.json ...] [--out OUT.json] [--device cuda] [--repeats 3]
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path

from ssdgen.bench.projection import (LABEL, Accelerator, ModelSpec, Roofline, _reference_info, as_bench,
                                     decoder_stats, project_one)


# --------------------------------------------------------------------------------------- calibration

def measure_cpu(working_set_bytes: float | None = None, seconds: float = 0.5, threads: int | None = None,
                device: str = "cpu") -> dict:
    """This machine's effective copy bandwidth (bytes read + written per second) at 256 MB (DRAM; 1 GB on a GPU)
    and, if given, at a working set of the model's weight size (cache-resident for a small model), and fp32
    matmul FLOP/s (1024^3 on a CPU, 4096^3 on a GPU, TF32 off). Best of repeated runs, so a busy machine reads
    closer to what it can do. `device="cuda"` measures the GPU instead."""
    import torch
    if threads:
        torch.set_num_threads(threads)
    dev = torch.device(device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)

    def best(fn, work):
        fn()
        sync()
        best_t, t_end = float("inf"), time.perf_counter() + seconds
        while time.perf_counter() < t_end:
            t0 = time.perf_counter()
            fn()
            sync()
            best_t = min(best_t, time.perf_counter() - t0)
        return work / best_t

    def bw(nbytes):
        n = max(1024, int(nbytes // 4))
        a, b = torch.rand(n, device=dev), torch.empty(n, device=dev)
        return best(lambda: b.copy_(a), 2 * 4 * n)

    k = 4096 if dev.type == "cuda" else 1024
    a, b = torch.rand(k, k, device=dev), torch.rand(k, k, device=dev)
    flops = best(lambda: torch.mm(a, b), 2 * k ** 3)
    out = {"device": str(dev), "flops": flops, "bw_dram": bw(1e9 if dev.type == "cuda" else 256e6),
           "threads": torch.get_num_threads()}
    if working_set_bytes:
        out["bw_model"] = bw(working_set_bytes)
        out["working_set_bytes"] = working_set_bytes
    return out


def calibrate(bench: dict, cpu: dict | None = None, rf: Roofline = Roofline(), bandwidth: str = "bw_dram") -> dict:
    """Predict the bench's own s/image on this CPU with the projection's method; error in % per row.
    `bandwidth`: "bw_model" (copy bandwidth at the weights' size: the cache level the weights live in) or
    "bw_dram"."""
    info = bench.get("model_info") or _reference_info(bench)
    if not info.get("params"):
        raise ValueError("the bench JSON has no model_info (params, layers, ...): cannot calibrate")
    m = ModelSpec("bench model", float(info["params"]), int(info["layers"]), int(info["dim"]), int(info["kv_dim"]),
                  int(info["prompt_len"]), float(info.get("bytes_per_param", 4)))
    cpu = cpu or measure_cpu(m.params * m.bytes_per_value)
    acc = Accelerator(f"this machine ({cpu.get('device', 'cpu')})", cpu[bandwidth], cpu["flops"], 1e12,
                      "measured: torch copy / fp32 matmul")
    cfg = float((bench.get("sampling") or {}).get("cfg_scale", 1.0)) != 1.0
    grid = int((info.get("grid") or [16])[0])
    out = []
    for st, meas in zip(decoder_stats(bench, assume_no_straggler=True), bench["rows"]):
        p = project_one(st, acc, m, grid, st.effective_batch or st.batch_size, cfg, None, rf)
        out.append({"source": meas.get("source"), "decoder": st.decoder, "batch_size": st.batch_size,
                    "images_per_batch": p["batch_size"],
                    "bound": p["bound"], "derived": list(st.derived),
                    "predicted_s_per_image": p["seconds_per_image"], "measured_s_per_image": meas["seconds_per_image"],
                    "error_pct": 100 * (p["seconds_per_image"] - meas["seconds_per_image"]) / meas["seconds_per_image"],
                    "predicted_s_per_forward": p["seconds_per_forward"],
                    "measured_s_per_forward": meas["seconds_per_image"] * (st.effective_batch or st.batch_size)
                    / st.forwards_per_batch})
    return {"label": LABEL + " (calibration on this CPU)", "cpu": cpu, "bandwidth_used": bandwidth,
            "roofline": asdict(rf), "model": asdict(m), "cfg": cfg, "rows": out,
            "mean_abs_error_pct": sum(abs(r["error_pct"]) for r in out) / len(out)}


def calibrate_with_overhead(bench: dict, cpu: dict, fit_on: tuple[str, int] = ("ar", 1),
                            bandwidth: str = "bw_dram") -> dict:
    """Roofline + one fixed per-forward overhead, fitted on one row (default: ar at batch 1) and checked on
    the others (the fitted row's own error is ~0 by construction)."""
    base = calibrate(bench, cpu, bandwidth=bandwidth)
    fit = next((r for r in base["rows"] if r["decoder"] == fit_on[0] and r["batch_size"] == fit_on[1]), None)
    if fit is None:
        raise ValueError(f"no {fit_on[0]} row at batch {fit_on[1]} to fit the overhead on")
    overhead = max(0.0, fit["measured_s_per_forward"] - fit["predicted_s_per_forward"])
    res = calibrate(bench, cpu, Roofline(overhead_per_forward=overhead), bandwidth=bandwidth)
    held = [r for r in res["rows"] if r is not res["rows"][base["rows"].index(fit)]]
    res["fitted_on"] = list(fit_on)
    res["overhead_per_forward_s"] = overhead
    res["mean_abs_error_pct_held_out"] = sum(abs(r["error_pct"]) for r in held) / len(held) if held else None
    return res


def calibrate_fitted(bench: dict, cpu: dict, bandwidth: str = "bw_dram") -> dict:
    """Two constants fitted, the rest held out: the per-forward overhead on ar at batch 1, then the matmul
    efficiency (share of the measured peak FLOP/s) on the compute-bound row of the largest batch."""
    over = calibrate_with_overhead(bench, cpu, bandwidth=bandwidth)
    ov = over["overhead_per_forward_s"]
    compute = [r for r in over["rows"] if r["bound"] == "compute"]
    if not compute:
        return over | {"flops_eff": 1.0}
    fit = max(compute, key=lambda r: (r["batch_size"], -abs(r["error_pct"])))
    i = over["rows"].index(fit)
    lo, hi = 1e-3, 1.0
    for _ in range(60):  # predicted time falls as the efficiency rises: bisect to the measured time
        mid = (lo * hi) ** 0.5
        row = calibrate(bench, cpu, Roofline(flops_eff=mid, overhead_per_forward=ov), bandwidth)["rows"][i]
        lo, hi = (mid, hi) if row["predicted_s_per_image"] > row["measured_s_per_image"] else (lo, mid)
    eff = (lo * hi) ** 0.5
    res = calibrate(bench, cpu, Roofline(flops_eff=eff, overhead_per_forward=ov), bandwidth)
    fit_ar = over["rows"].index(next(r for r in over["rows"] if r["decoder"] == "ar" and r["batch_size"] == 1))
    held = [r for j, r in enumerate(res["rows"]) if j not in (i, fit_ar)]
    return res | {"overhead_per_forward_s": ov, "flops_eff": eff,
                  "fitted_on": [["ar", 1], [fit["decoder"], fit["batch_size"]]],
                  "mean_abs_error_pct_held_out": sum(abs(r["error_pct"]) for r in held) / len(held) if held else None}


# ------------------------------------------------------------------------------------------- output

def merge_benches(paths: list[str]) -> dict:
    """Several measured bench / eval JSONs of one model as one bench (rows tagged with their file)."""
    benches = [(p, as_bench(json.loads(Path(p).read_text()))) for p in paths]
    models = {b.get("model") for _, b in benches}
    cfgs = {float((b.get("sampling") or {}).get("cfg_scale", 1.0)) for _, b in benches}
    if len(models) != 1 or len(cfgs) != 1:
        raise ValueError(f"benches of different models or CFG scales cannot be merged: {models}, {cfgs}")
    first = benches[0][1]
    info = next((b["model_info"] for _, b in benches if b.get("model_info")), None)
    return {"model": first.get("model"), "sampling": first.get("sampling"), "device": first.get("device"),
            **({"model_info": info} if info else {}),
            "rows": [r | {"source": Path(p).name} for p, b in benches for r in b["rows"]]}


def best_of(measures: list[dict]) -> dict:
    """The best reading of each figure over repeated measurements (a busy machine only ever reads low)."""
    return measures[0] | {k: max(m[k] for m in measures) for k in ("flops", "bw_dram", "bw_model") if k in measures[0]}


def check(files: list[str], out: str | None = None, device: str = "cpu", repeats: int = 3, echo=print) -> dict:
    """The projection's method checked against benches measured on this machine (its bandwidth and FLOP/s
    measured here, best of `repeats`), error in % per decoder and batch. Eval JSONs count as one-row benches."""
    bench = merge_benches(files)
    info = bench.get("model_info") or _reference_info(bench)
    weights = float(info["params"]) * float(info.get("bytes_per_param", 4))
    cpu = best_of([measure_cpu(weights, device=device) for _ in range(repeats)])
    res = {"roofline": calibrate(bench, cpu, bandwidth="bw_dram"),
           "roofline_cache_bandwidth": calibrate(bench, cpu, bandwidth="bw_model"),
           "roofline_plus_overhead": calibrate_with_overhead(bench, cpu, bandwidth="bw_dram"),
           "roofline_plus_overhead_and_matmul_efficiency": calibrate_fitted(bench, cpu, bandwidth="bw_dram")}
    for k, v in res.items():
        echo(f"{k}: mean |error| {v['mean_abs_error_pct']:.1f}%"
             + (f", held out {v['mean_abs_error_pct_held_out']:.1f}% "
                f"(overhead {v['overhead_per_forward_s'] * 1e3:.2f} ms/forward"
                + (f", matmul efficiency {v['flops_eff']:.3f}" if "flops_eff" in v else "")
                + f"; fitted on {v['fitted_on']})" if "fitted_on" in v else ""))
        for r in v["rows"]:
            echo(f"  {str(r['source']):<22} {r['decoder']:<26} batch {r['batch_size']:>3} {r['bound']:<7} predicted "
                 f"{r['predicted_s_per_image']:.4f} s/image, measured {r['measured_s_per_image']:.4f}, "
                 f"error {r['error_pct']:+.1f}%" + (" (assumed: " + ", ".join(r["derived"]) + ")"
                                                    if "forwards_per_batch" in r["derived"] and r["batch_size"] > 1
                                                    else ""))
    echo("measured: " + json.dumps(cpu))
    if out:
        Path(out).write_text(json.dumps(res | {"files": files}, indent=1))
    return res
