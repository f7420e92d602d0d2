"""The measuring commands: bench, fidelity, projection and the bench-* benchmarks (docs/benchmarks.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from ssdgen.options import DECODER, DEVICE, DTYPE, MODEL, RUN_DECODER, friendly, model_on, spec_of, specs_of

app = typer.Typer()


def _batch_sizes(text: str) -> list[int]:
    try:
        return [int(b) for b in text.split(",") if b.strip()]
    except ValueError:
        raise ValueError(f"--batch-sizes must be comma-separated integers, got {text!r}") from None


@app.command("bench")
@friendly
def bench_cmd(decoders: str = typer.Option("ar,sjd,csd", help="comma-separated specs, e.g. ar,sjd:window=16,csd:lam=0.5"),
              n: int = typer.Option(64, help="eval prompts timed per decoder and batch size"),
              batch_sizes: str = typer.Option("1", help="comma-separated batch sizes"),
              quality_n: int = typer.Option(1024, help="eval prompts for scene accuracy and FD (0 = skip)"),
              quality_decoders: Optional[str] = typer.Option(None, help="comma-separated specs to score for "
                                                             "quality (default: all of --decoders)"),
              fidelity_n: int = typer.Option(256, help="eval prompts for the NLL gap to ar (0 = skip)"),
              quality_batch: int = typer.Option(64, help="batch size of the quality and fidelity decodes (not "
                                                         "timed; on a CPU speculation is cheapest at 16)"),
              tolerance: float = typer.Option(0.15, help="allowed |NLL gap| in nats/token (95% interval)"),
              json_path: Optional[Path] = typer.Option(None, "--json", help="write the result here"),
              html: Optional[Path] = typer.Option(None, "--html", help="write a standalone HTML report here"),
              device_type: str = typer.Option("cpu", help="price row in infra/prices.csv for $ per 1k images "
                                                          "(cpu = per vCPU x torch threads; a GPU type = 1 GPU)"),
              device: str = DEVICE, dtype: str = DTYPE,
              seed: int = typer.Option(0, help="run seed, combined with each eval prompt's own"),
              model: Optional[str] = MODEL):
    """Compare decoders side by side: forwards, time, cost, quality and fidelity, speedups measured in this
    run. The decoders share one sampling setting (give cfg, temperature, top_k, top_p in each spec)."""
    from bench.decode import bench, check_args, resolve_device
    specs = specs_of(decoders)
    sizes = _batch_sizes(batch_sizes)
    if not 1 <= n <= 1024 or not 0 <= quality_n <= 1024 or not (fidelity_n == 0 or 2 <= fidelity_n <= 1024):
        raise ValueError(f"--n must be in 1..1024, --quality-n in 0..1024 and --fidelity-n 0 or in 2..1024, "
                         f"got {n}, {quality_n} and {fidelity_n}")
    if quality_batch < 1:
        raise ValueError(f"--quality-batch must be >= 1, got {quality_batch}")
    check_args(specs, sizes)  # all argument errors before the model loads
    chosen = specs_of(quality_decoders) if quality_decoders else None
    resolve_device(device, device_type)
    res = bench(model_on(model, device, dtype), specs, n, sizes, quality_n, seed=seed, log=typer.echo,
                device_type=device_type, quality_decoders=chosen, fidelity_n=fidelity_n, tolerance=tolerance,
                quality_batch=quality_batch)
    samples = res.pop("samples", None)  # images: for the page, not the JSON
    cols = ("decoder", "batch_size", "forwards_per_image", "tokens_per_forward", "seconds_per_image",
            "speedup_vs_ar", "usd_per_1k_images", "nll_gap", "scene_accuracy", "object_accuracy", "fd")
    typer.echo(" | ".join(cols))
    for r in res["rows"]:
        typer.echo(" | ".join(f"{r[c]:.4g}" if isinstance(r.get(c), float) else str(r.get(c, "")) for c in cols))
    if json_path:
        json_path.write_text(json.dumps(res, indent=1))
        typer.echo(f"wrote {json_path}")
    if html:
        from bench.plots import bench_html
        html.write_text(bench_html(res, samples), encoding="utf-8")
        typer.echo(f"wrote {html}")


@app.command("fidelity")
@friendly
def fidelity_cmd(decoders: str = typer.Option("sjd,ssd:lossless=true,csd,ssd+csd",
                                              help="comma-separated specs, each compared with ar"),
                 n: int = typer.Option(256, help="prompts: the first n eval prompts, or of --prompts"),
                 batch_size: int = typer.Option(64, help="prompts per decoder call"),
                 seed: int = typer.Option(0, help="run seed, combined with each eval prompt's own"),
                 tolerance: float = typer.Option(0.15, help="allowed |NLL gap| in nats/token (95% interval)"),
                 prompts: Optional[Path] = typer.Option(None, help="text file, one prompt a line (HF models)"),
                 json_path: Optional[Path] = typer.Option(None, "--json", help="write the result here"),
                 device: str = DEVICE, dtype: str = DTYPE, model: Optional[str] = MODEL):
    """Fidelity against the target: NLL per token of each decoder's tokens under the model, its gap to AR
    with bootstrap intervals, FD to AR's own samples and accuracy deltas (reference model)."""
    from decoders.spec import common_sampling
    from bench.fidelity import fidelity
    specs = specs_of(decoders)
    common_sampling(specs)
    if not specs:
        raise ValueError("--decoders is empty: name at least one decoder, e.g. sjd,csd")
    if n < 2 or batch_size < 1 or tolerance <= 0:
        raise ValueError(f"--n must be >= 2, --batch-size >= 1 and --tolerance > 0; got {n}, {batch_size}, "
                         f"{tolerance}")
    if prompts is not None:
        if not prompts.exists():
            raise FileNotFoundError(f"{prompts}: no such prompts file")
        texts = [line.strip() for line in prompts.read_text().splitlines() if line.strip()][:n]
        seeds = [seed * 1_000_003 + i for i in range(len(texts))]
    else:
        from reference.prompts import eval_prompts
        rows = eval_prompts(min(n, 1024))
        texts, seeds = [r["prompt"] for r in rows], [seed * 1_000_003 + r["seed"] for r in rows]
    if len(texts) < 2:
        raise ValueError("fidelity needs at least 2 prompts")
    res = fidelity(model_on(model, device, dtype), specs, texts, seeds, batch_size, tolerance, log=typer.echo)
    if json_path:
        json_path.write_text(json.dumps(res, indent=1))
        typer.echo(f"wrote {json_path}")


@app.command("calibrate")
@friendly
def calibrate_cmd(decoder: str = RUN_DECODER,
                  batch_sizes: str = typer.Option("1,4,16", help="comma-separated batch sizes"),
                  json_path: Optional[Path] = typer.Option(None, "--json", help="write the result here"),
                  seed: int = typer.Option(0, help="run seed, combined with each eval prompt's own"),
                  device: str = DEVICE, dtype: str = DTYPE, model: Optional[str] = MODEL):
    """What a calibrated decoder (calibrated=true, ssd+csd's default) would decide on this device at each batch
    size, as `generate` decides it once per run (decoders/calibrate.py): the curve's estimates, the timed
    choices and the rows chosen (0 = plain AR)."""
    spec = spec_of(decoder)
    if not spec.calibrated:
        raise ValueError(f"--decoder {decoder!r} is not calibrated (only ssd and ssd+csd with calibrated=true are)")
    sizes = _batch_sizes(batch_sizes)
    if not sizes or min(sizes) < 1 or max(sizes) > 1024:
        raise ValueError(f"--batch-sizes must be integers in 1..1024, got {batch_sizes!r}")
    from decoders import calibrate_spec
    from decoders.configs import CALIBRATION_PROMPTS
    from reference.prompts import eval_prompts
    m = model_on(model, device, dtype)
    rows = eval_prompts(max(max(sizes), CALIBRATION_PROMPTS))
    plans = []
    for b in sizes:
        k = max(b, CALIBRATION_PROMPTS)
        plan = calibrate_spec(spec, m, [r["prompt"] for r in rows[:k]],
                              [seed * 1_000_003 + r["seed"] for r in rows[:k]], b).to_dict()
        plans.append(plan)
        est = ", ".join(f"{r}: {v:.1f}" for r, v in plan["estimates"].items())
        timed = ", ".join(f"{r}: {v:.3f}" for r, v in plan["measured"].items()) or "none"
        typer.echo(f"batch {b:>4}: rows {plan['rows']} ({'plain AR' if plan['rows'] == 0 else 'speculate'}); "
                   f"estimates (tokens/s per sample) {est}; timed (images/s) {timed}; {plan['seconds']:.1f} s")
    if json_path:
        json_path.write_text(json.dumps({"decoder": str(spec), "model": m.name, "plans": plans}, indent=1))
        typer.echo(f"wrote {json_path}")


@app.command("projection")
@friendly
def projection_cmd(bench_json: Path = typer.Option(..., "--bench-json", help="a `ssdgen bench --json` result"),
                   accelerators: str = typer.Option("l4,a10g,a100-40gb,h100,h200", help="comma-separated"),
                   models: str = typer.Option("1b@24,7b@48", help="comma-separated SIZE@GRID, SIZE in "
                                                                  "{1b, 7b} (e.g. 7b@48 = 7B params, 48x48 tokens)"),
                   batch_sizes: str = typer.Option("1,4,16,64", help="comma-separated"),
                   cfg: bool = typer.Option(True, help="classifier-free guidance doubles the batch"),
                   json_path: Optional[Path] = typer.Option(None, "--json", help="write the result here"),
                   html: Optional[Path] = typer.Option(None, "--html", help="write a standalone HTML page here")):
    """PROJECTION (not a measurement): images/s and $ per 1k images on named accelerators, from a bench's
    measured acceptance statistics and a roofline model; the KV cache caps the batch."""
    from bench.projection import project_cli
    res = project_cli(bench_json, accelerators, models, batch_sizes, cfg)
    for line in res["text"]:
        typer.echo(line)
    if json_path:
        json_path.write_text(json.dumps(res["result"], indent=1))
        typer.echo(f"wrote {json_path}")
    if html:
        from bench.projection import projection_html
        html.write_text(projection_html(res["result"]), encoding="utf-8")
        typer.echo(f"wrote {html}")


@app.command("bench-plan")
@friendly
def bench_plan_cmd(rows: int = typer.Option(10_000_000, help="synthetic prompt rows"),
                   files: int = typer.Option(100, help="Parquet files they are split into"),
                   workdir: Optional[str] = typer.Option(None, help="where the synthetic Parquet goes (kept)"),
                   json_path: Optional[Path] = typer.Option(None, "--json", help="write the result here")):
    """Planning benchmark: list and shard synthetic prompt Parquet from metadata only (bars: 60 s, 2 GB)."""
    from bench.plan import run
    res = run(rows=rows, files=files, workdir=workdir)
    typer.echo(json.dumps(res, indent=1))
    if json_path:
        json_path.write_text(json.dumps(res, indent=1))


@app.command("bench-pipeline")
@friendly
def bench_pipeline_cmd(n: int = typer.Option(128, help="prompts"),
                       decoder: str = DECODER,
                       batch_size: int = typer.Option(16, help="prompts per decoder call"),
                       threads: int = typer.Option(2, help="torch threads of both sides"),
                       shard_size: int = typer.Option(32, help="rows per shard"),
                       json_path: Optional[Path] = typer.Option(None, "--json", help="write the result here")):
    """Pipeline overhead: `generate` end to end vs the bare decoder loop (same decoder, batch, threads)."""
    from bench.pipeline import run
    res = run(n=n, decoder=decoder, batch_size=batch_size, threads=threads, shard_size=shard_size, log=typer.echo)
    typer.echo(json.dumps(res, indent=1))
    if json_path:
        json_path.write_text(json.dumps(res, indent=1))


@app.command("bench-scaling")
@friendly
def bench_scaling_cmd(sides: str = typer.Option("8,16,32", help="grid sides n"),
                      n: int = typer.Option(8, help="prompts per grid side"),
                      reference_bench: Optional[str] = typer.Option("docs/results/bench_main.json",
                                                                    help="bench JSON of the trained 16x16 model"),
                      plot: Optional[Path] = typer.Option(None, help="write the log-log plot (PNG) here"),
                      json_path: Optional[Path] = typer.Option(None, "--json", help="write the result here")):
    """SSD's scaling claim: forwards per image against grid side n, with a log-log plot."""
    from bench.scaling import run
    res = run(tuple(int(x) for x in sides.split(",")), n, reference_bench, plot and str(plot), log=typer.echo)
    typer.echo(json.dumps(res["loglog_slope"], indent=1))
    if json_path:
        json_path.write_text(json.dumps(res, indent=1))


@app.command("bench-scale")
@friendly
def bench_scale_cmd(n: int = typer.Option(200_000, help="prompts"),
                    shard_size: int = typer.Option(10, help="rows per shard"),
                    actors: int = typer.Option(2, help="Ray actors"),
                    batch_size: int = typer.Option(16, help="prompts per decoder call"),
                    decoder: str = DECODER, plot: Optional[Path] = typer.Option(None, "--plot", help="RSS plot (PNG)"),
                    json_path: Optional[Path] = typer.Option(None, "--json", help="write the result here"),
                    workdir: Optional[str] = typer.Option(None, help="where inputs and output go (kept); default a "
                                                                       "temporary folder, removed after")):
    """Orchestration at scale: the flow over N prompts with a tiny model (decoding costs almost nothing); wall
    time, images/s, per-shard overhead, actor utilisation, and the driver's and actors' peak memory."""
    from bench.scale import brief, dump, run
    res = run(n=n, shard_size=shard_size, actors=actors, batch_size=batch_size, decoder=str(spec_of(decoder)),
              plot=str(plot) if plot else None, workdir=workdir, log=typer.echo)
    typer.echo(brief(res))
    if json_path:
        dump(res, str(json_path))
        typer.echo(f"wrote {json_path}")
