"""The `ssdgen` command line. Arguments are parsed here, at the edge, into typed configs.

Errors users can cause (bad captions, bad parameters, missing files) print one clear line and exit 2;
they never end in a raw stack trace.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import sys
from pathlib import Path
from typing import Optional

import typer

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="ssdgen: batch image generation with speculative decoders for AR image transformers.")

USER_ERRORS = (ValueError, FileNotFoundError, RuntimeError, KeyError)


def friendly(fn):
    """Turn user-facing exceptions into `error: ...` and exit code 2."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except USER_ERRORS as e:
            msg = e.args[0] if isinstance(e, KeyError) and e.args else e
            typer.echo(f"error: {msg}", err=True)
            raise typer.Exit(2)
    return wrapper


class _QuietUserErrors(logging.Filter):
    """Drops, on the console only, Prefect's "Encountered exception" record of a user error: its traceback
    stays in the Prefect logs (the API handler sits on a child logger and has already sent it), and the
    console ends with `friendly`'s one `error:` line."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, USER_ERRORS)


@contextlib.contextmanager
def _flow_console():
    """Around a flow call: keep user errors' tracebacks off the console, and on such an error stop Prefect's
    temporary API server now (it would log its shutdown at exit, after the `error:` line)."""
    from prefect.logging.handlers import PrefectConsoleHandler
    # Prefect's console handler sits on the root logger (the "prefect" logger only propagates to it)
    handlers = [h for name in ("", "prefect") for h in logging.getLogger(name).handlers
                if isinstance(h, PrefectConsoleHandler)]
    quiet = _QuietUserErrors()
    for h in handlers:
        h.addFilter(quiet)
    try:
        yield
    except USER_ERRORS:
        _stop_prefect_server()
        raise
    finally:
        for h in handlers:
            h.removeFilter(quiet)


def _stop_prefect_server() -> None:
    """Send the queued run logs (the failure's traceback among them), then stop the temporary Prefect server
    this process started in ephemeral mode (no API URL configured), if any. Best effort: it uses a private
    Prefect API, and atexit stops it anyway."""
    try:
        from prefect.logging.handlers import APILogHandler
        from prefect.server.api.server import SubprocessASGIServer
        from prefect.settings import get_current_settings
        if get_current_settings().api.url:  # a configured API (a real server, a test harness): not ours to stop
            return
        for h in logging.getLogger("prefect.flow_runs").handlers:
            if isinstance(h, APILogHandler):
                h.flush()
        for server in list(getattr(SubprocessASGIServer, "_instances", {}).values()):
            server.stop()
    except Exception:  # noqa: BLE001 - only tidies the console
        pass


def _sampling(cfg: float, temperature: float, top_k: int, top_p: float):
    from decoders.sampling import SamplingConfig
    return SamplingConfig(cfg_scale=cfg, temperature=temperature, top_k=top_k, top_p=top_p)


def _model(model: Optional[str]):
    from workers.models import load_model
    return load_model(model)


def _spec(text: str):
    """The one place a decode spec is parsed (decoders/spec.py); errors name the spec and the key."""
    from decoders.spec import DecodeSpec
    return DecodeSpec.parse(text)


def _specs(text: str) -> list:
    return [_spec(t) for t in text.split(",") if t.strip()]


SPEC_HELP = ("decode spec: family[:key=value]..., family one of ar, sjd, csd, ssd, ssd+csd; keys are the "
             "decoder's parameters, cfg, temperature, top_k, top_p and heads (docs/decoders.md), "
             "e.g. ssd+csd:rows=2:cfg=3")
DECODER = typer.Option("ar", "--decoder", help=SPEC_HELP)
CFG = typer.Option(3.0, "--cfg", help="classifier-free guidance scale (1 = off)")
TOPK = typer.Option(0, "--top-k", help="keep the k most likely tokens (0 = off)")
MODEL = typer.Option(None, help="model: reference (default), reference:/bundle, janus:/ckpt, emu3:/ckpt, "
                                 "chameleon:/ckpt")
AUDIT = typer.Option(0.0, "--audit", metavar="FRACTION",
                     help="also decode this fraction of the prompts (chosen by prompt_id) with ar and report the "
                          "NLL gap to it in summary.json; 0 = no audit")
AUDIT_TOL = typer.Option(0.15, "--audit-tolerance", help="allowed |NLL gap| of the audit, nats/token (95% interval)")
IMAGE_FORMAT = typer.Option("png", "--image-format", help="encoding of the stored images: png (lossless), webp or jpeg")
QUALITY = typer.Option(90, "--quality", help="webp/jpeg quality, 1..100 (png ignores it)")


@app.command()
@friendly
def sample(prompt: list[str] = typer.Option(..., help="caption; repeat for several"),
           n: int = typer.Option(4, help="images per prompt"), out: Path = typer.Option(Path("grid.png")),
           seed: int = 0, decoder: str = DECODER, model: Optional[str] = MODEL):
    """Sample images for prompts and save them as one grid PNG (a row per prompt)."""
    import numpy as np
    from PIL import Image
    from decoders import run
    if n < 1:
        raise ValueError(f"--n must be >= 1, got {n}")
    spec = _spec(decoder)
    m = _model(model)
    prompts = [p for p in prompt for _ in range(n)]
    seeds = [seed + i for i in range(len(prompts))]
    m.validate_prompts(prompts)
    res = run(spec, m, prompts, seeds)
    imgs = m.decode_images(res.tokens).numpy()
    rows = [np.concatenate(list(imgs[i * n:(i + 1) * n]), axis=1) for i in range(len(prompt))]
    Image.fromarray(np.concatenate(rows, axis=0)).save(out)
    fwd = np.mean([s.forwards for s in res.stats])
    typer.echo(f"wrote {out} ({len(prompts)} images, {decoder}, {fwd:.1f} forwards per image)")
    policy = res.stats[0].extra.get("policy", "")
    if policy.startswith("ar:"):  # a fall-back is reported, never silent
        typer.echo(f"note: {decoder} decoded this batch as plain AR ({policy.removeprefix('ar: ')})")


@app.command()
@friendly
def generate(prompts: list[str] = typer.Option(..., help="Parquet file, prefix or glob at any fsspec URL; repeatable"),
             out: str = typer.Option("out/run", help="output URL (local path, s3://, gs://, ...)"),
             decoder: str = DECODER, model: Optional[str] = MODEL,
             shard_size: int = typer.Option(256, help="rows per shard"),
             batch_size: int = typer.Option(16, help="prompts per decoder call"),
             actors: int = typer.Option(2, help="Ray actors (each loads the model once)"),
             cpus_per_actor: float = typer.Option(1.0, help="Ray num_cpus per actor (= torch threads on CPU)"),
             gpus_per_actor: float = typer.Option(0.0, help="Ray num_gpus per actor (0 on CPU)"),
             device_type: str = typer.Option("cpu", help="price row in infra/prices.csv (cpu, l4, h100, ...)"),
             ray_address: Optional[str] = typer.Option(None, help="attach to a Ray cluster (default: RAY_ADDRESS, "
                                                                   "else a local Ray)"),
             cluster_limit: Optional[str] = typer.Option(None, help="Prefect global concurrency limit to hold "
                                                                     "a slot of per GPU (per actor on CPUs)"),
             seed: int = typer.Option(0, help="run seed; a row's own `seed` column wins"),
             audit: float = AUDIT, audit_tolerance: float = AUDIT_TOL,
             image_format: str = IMAGE_FORMAT, quality: int = QUALITY,
             progress: bool = typer.Option(True, help="show a progress bar")):
    """Generate images for Parquet prompts with a Prefect flow on Ray actors; resumable (run it again)."""
    from flows.inputs import list_inputs
    from flows.pipeline import GenerateConfig, generate as flow
    spec = _spec(decoder)
    # the flow validates again (deployments call it directly); here it fails fast, before Prefect starts
    GenerateConfig(prompts=tuple(prompts), out=out, model=model or "reference", decoder=spec,
                   shard_size=shard_size, batch_size=batch_size, actors=actors, cpus_per_actor=cpus_per_actor,
                   gpus_per_actor=gpus_per_actor, device_type=device_type, audit=audit,
                   audit_tolerance=audit_tolerance, image_format=image_format, quality=quality).validate()
    list_inputs(list(prompts))
    with _flow_console():
        summary = flow(prompts=prompts, out=out, model=model or "reference", decoder=str(spec), seed=seed,
                       shard_size=shard_size, batch_size=batch_size, actors=actors, cpus_per_actor=cpus_per_actor,
                       gpus_per_actor=gpus_per_actor, device_type=device_type, ray_address=ray_address,
                       cluster_limit=cluster_limit, audit=audit, audit_tolerance=audit_tolerance,
                       image_format=image_format, quality=quality, progress=progress)
    _print_summary(summary)


def _print_summary(s: dict) -> None:
    from flows.cost import cost_table
    typer.echo(f"shards {s['shards_committed']}/{s['shards_total']} committed ({s['shards_run_now']} this run); "
               f"images ok {s['images_ok']}, failed {s['images_failed']}")
    from flows.audit import audit_rows, warning
    for r in cost_table(s) + audit_rows(s.get("audit")):
        typer.echo(f"  {r['metric']:<34} {r['value']}")
    if (w := warning(s.get("audit"))) is not None:
        typer.echo(f"WARNING: {w}", err=True)
    typer.echo(f"manifest: {s['manifest']}\nsummary:  {s['summary']}")


@app.command()
@friendly
def serve(prompts: list[str] = typer.Option(..., help="Parquet file, prefix or glob; repeatable"),
          out: str = typer.Option(..., help="output URL; `{date}` becomes the run's scheduled date"),
          cron: str = typer.Option("0 2 * * *", help="schedule (cron, UTC)"), name: str = "nightly",
          decoder: str = DECODER, model: Optional[str] = MODEL, shard_size: int = 256, batch_size: int = 16,
          actors: int = 2, cpus_per_actor: float = 1.0, gpus_per_actor: float = 0.0, device_type: str = "cpu",
          cluster_limit: Optional[str] = typer.Option(None, help="Prefect global concurrency limit (see generate)"),
          audit: float = AUDIT, audit_tolerance: float = AUDIT_TOL,
          image_format: str = IMAGE_FORMAT, quality: int = QUALITY):
    """Serve the generation flow as a Prefect deployment on a cron schedule (runs until stopped)."""
    from flows.audit import check_audit
    from flows.pipeline import generate as flow
    spec = _spec(decoder)
    from workers.decode_worker import check_image_format
    check_audit(audit, audit_tolerance)
    check_image_format(image_format, quality)
    flow.serve(name=name, cron=cron, parameters={
        "prompts": prompts, "out": out, "model": model or "reference", "decoder": str(spec), "shard_size": shard_size,
        "batch_size": batch_size, "actors": actors, "cpus_per_actor": cpus_per_actor,
        "gpus_per_actor": gpus_per_actor, "device_type": device_type, "cluster_limit": cluster_limit,
        "audit": audit, "audit_tolerance": audit_tolerance, "image_format": image_format, "quality": quality,
        "progress": False})


@app.command()
@friendly
def status(url: str = typer.Argument(..., help="a run's output URL")):
    """Shards done, pending and failed, and the cost so far."""
    from flows.pipeline import run_status
    st = run_status(url)
    typer.echo(f"{url}: {st['shards_done']} done, {st['shards_pending']} pending, {len(st['shards_failed'])} failed "
               f"of {st['shards_total']} shards; images ok {st['images_ok']}, failed {st['images_failed']}")
    for k, v in st["shards_failed"].items():
        typer.echo(f"  failed shard {k}: {v}")
    if st["cost"]:
        c = st["cost"]
        typer.echo(f"  cost so far: ${c['usd_on_demand']:.4f} on demand"
                   + (f", ${c['usd_spot']:.4f} spot" if c.get("usd_spot") is not None else "")
                   + f" ({c['device_seconds_allocated']:.1f} device-seconds on {c['price']['device_type']})")
    from flows.audit import audit_rows, warning
    for r in audit_rows(st["audit"]):
        typer.echo(f"  {r['metric']:<34} {r['value']}")
    if (w := warning(st["audit"])) is not None:
        typer.echo(f"WARNING: {w}", err=True)


@app.command()
@friendly
def demo(out: Path = typer.Option(Path("out"), help="output folder"), decoder: str = DECODER,
         batch_size: int = 8, actors: int = 2, model: Optional[str] = MODEL):
    """The embedded default job: the bundled example prompts (Parquet) through the Prefect flow on local Ray
    actors into OUT/run, then a grid.png of the committed images."""
    import io
    import numpy as np
    import pyarrow.parquet as pq
    from PIL import Image
    from flows.pipeline import generate as flow
    from reference.prompts import EXAMPLES_PARQUET
    with _flow_console():
        summary = flow(prompts=[str(EXAMPLES_PARQUET)], out=str(out / "run"), model=model or "reference",
                       decoder=str(_spec(decoder)), shard_size=4, batch_size=batch_size, actors=actors, progress=True)
    _print_summary(summary)
    man = pq.read_table(summary["manifest"].removeprefix("file://")).to_pylist()
    tables = [pq.read_table(m["images_url"].removeprefix("file://"), columns=["prompt_id", "image"]) for m in man]
    imgs = [r["image"]["bytes"] for t in tables for r in t.to_pylist() if r["image"]]
    grid = np.concatenate([np.asarray(Image.open(io.BytesIO(b)).convert("RGB")) for b in imgs], axis=1)
    Image.fromarray(grid).save(out / "grid.png")
    typer.echo(f"{len(imgs)} images -> {(out / 'run').resolve()}/ (shards/*/attempt-*/images.parquet); "
               f"look at {(out / 'grid.png').resolve()}")


@app.command("bench")
@friendly
def bench_cmd(decoders: str = typer.Option("ar,sjd,csd", help="comma-separated specs, e.g. ar,sjd:window=16,csd:lam=0.5"),
              n: int = typer.Option(64, help="eval prompts timed per decoder and batch size"),
              batch_sizes: str = typer.Option("1", help="comma-separated batch sizes"),
              quality_n: int = typer.Option(1024, help="eval prompts for scene accuracy and FD (0 = skip)"),
              quality_decoders: Optional[str] = typer.Option(None, help="comma-separated specs to score for "
                                                             "quality (default: all of --decoders)"),
              fidelity_n: int = typer.Option(256, help="eval prompts for the NLL gap to ar (0 = skip)"),
              tolerance: float = typer.Option(0.15, help="allowed |NLL gap| in nats/token (95% interval)"),
              json_path: Optional[Path] = typer.Option(None, "--json"),
              html: Optional[Path] = typer.Option(None, "--html", help="write a standalone HTML report here"),
              device_type: str = typer.Option("cpu", help="price row in infra/prices.csv for $ per 1k images "
                                                          "(cpu = per vCPU x torch threads; a GPU type = 1 GPU)"),
              device: str = typer.Option("cpu", help="torch device for the model: cpu or cuda[:N]"),
              seed: int = 0, model: Optional[str] = MODEL):
    """Compare decoders side by side: forwards, time, cost, quality and fidelity, speedups measured in this
    run. The decoders share one sampling setting (give cfg, temperature, top_k, top_p in each spec)."""
    from flows.bench import bench, check_args, resolve_device
    specs = _specs(decoders)
    try:
        sizes = [int(b) for b in batch_sizes.split(",") if b.strip()]
    except ValueError:
        raise ValueError(f"--batch-sizes must be comma-separated integers, got {batch_sizes!r}") from None
    if not 1 <= n <= 1024 or not 0 <= quality_n <= 1024 or not (fidelity_n == 0 or 2 <= fidelity_n <= 1024):
        raise ValueError(f"--n must be in 1..1024, --quality-n in 0..1024 and --fidelity-n 0 or in 2..1024, "
                         f"got {n}, {quality_n} and {fidelity_n}")
    check_args(specs, sizes)  # all argument errors before the model loads
    chosen = _specs(quality_decoders) if quality_decoders else None
    resolve_device(device, device_type)
    res = bench(_model_on(model, device), specs, n, sizes, quality_n, seed=seed, log=typer.echo,
                device_type=device_type, quality_decoders=chosen, fidelity_n=fidelity_n, tolerance=tolerance)
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
        from flows.plots import bench_html
        html.write_text(bench_html(res, samples), encoding="utf-8")
        typer.echo(f"wrote {html}")


@app.command("fidelity")
@friendly
def fidelity_cmd(decoders: str = typer.Option("sjd,ssd:lossless=true,csd,ssd+csd",
                                              help="comma-separated specs, each compared with ar"),
                 n: int = typer.Option(256, help="prompts: the first n eval prompts, or of --prompts"),
                 batch_size: int = 64, seed: int = 0,
                 tolerance: float = typer.Option(0.15, help="allowed |NLL gap| in nats/token (95% interval)"),
                 prompts: Optional[Path] = typer.Option(None, help="text file, one prompt a line (HF models)"),
                 json_path: Optional[Path] = typer.Option(None, "--json"),
                 device: str = typer.Option("cpu", help="torch device for the model: cpu or cuda[:N]"),
                 model: Optional[str] = MODEL):
    """Fidelity against the target: NLL per token of each decoder's tokens under the model, its gap to AR
    with bootstrap intervals, FD to AR's own samples and accuracy deltas (reference model)."""
    from decoders.spec import common_sampling
    from flows.fidelity import fidelity
    specs = _specs(decoders)
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
    res = fidelity(_model_on(model, device), specs, texts, seeds, batch_size, tolerance, log=typer.echo)
    if json_path:
        json_path.write_text(json.dumps(res, indent=1))
        typer.echo(f"wrote {json_path}")


def _model_on(model: Optional[str], device: str):
    from workers.models import load_model
    return load_model(model, device=device)


@app.command("report")
@friendly
def report_cmd(url: str = typer.Argument(..., help="a run's output URL (local path, file://, s3://, ...)"),
               html: Path = typer.Option(Path("report.html"), "--html", help="where to write the HTML"),
               samples: int = typer.Option(24, help="images in the sample grid and the heatmaps")):
    """A standalone HTML report of a pipeline run, from its committed Parquet and JSON only."""
    from flows.report import write_report
    info = write_report(url, html, samples=samples)
    typer.echo(f"wrote {html} ({info['shards']} committed shards, {info['images_ok']} images ok, "
               f"{info['images_failed']} failed)")


@app.command("projection")
@friendly
def projection_cmd(bench_json: Path = typer.Option(..., "--bench-json", help="a `ssdgen bench --json` result"),
                   accelerators: str = typer.Option("l4,a10g,a100-40gb,h100,h200", help="comma-separated"),
                   models: str = typer.Option("1b@24,7b@48", help="comma-separated SIZE@GRID, SIZE in "
                                                                  "{1b, 7b} (e.g. 7b@48 = 7B params, 48x48 tokens)"),
                   batch_sizes: str = typer.Option("1,4,16,64", help="comma-separated"),
                   cfg: bool = typer.Option(True, help="classifier-free guidance doubles the batch"),
                   json_path: Optional[Path] = typer.Option(None, "--json"),
                   html: Optional[Path] = typer.Option(None, "--html")):
    """PROJECTION (not a measurement): images/s and $ per 1k images on named accelerators, from a bench's
    measured acceptance statistics and a roofline model; the KV cache caps the batch."""
    from flows.projection import project_cli
    res = project_cli(bench_json, accelerators, models, batch_sizes, cfg)
    for line in res["text"]:
        typer.echo(line)
    if json_path:
        json_path.write_text(json.dumps(res["result"], indent=1))
        typer.echo(f"wrote {json_path}")
    if html:
        from flows.projection import projection_html
        html.write_text(projection_html(res["result"]), encoding="utf-8")
        typer.echo(f"wrote {html}")


@app.command("bench-plan")
@friendly
def bench_plan_cmd(rows: int = 10_000_000, files: int = 100,
                   workdir: Optional[str] = typer.Option(None, help="where the synthetic Parquet goes (kept)"),
                   json_path: Optional[Path] = typer.Option(None, "--json")):
    """Planning benchmark: list and shard synthetic prompt Parquet from metadata only (bars: 60 s, 2 GB)."""
    from flows.bench_plan import run
    res = run(rows=rows, files=files, workdir=workdir)
    typer.echo(json.dumps(res, indent=1))
    if json_path:
        json_path.write_text(json.dumps(res, indent=1))


@app.command("bench-pipeline")
@friendly
def bench_pipeline_cmd(n: int = 128, decoder: str = "ar", batch_size: int = 16, threads: int = 2,
                       shard_size: int = 32, json_path: Optional[Path] = typer.Option(None, "--json")):
    """Pipeline overhead: `generate` end to end vs the bare decoder loop (same decoder, batch, threads)."""
    from flows.bench_pipeline import run
    res = run(n=n, decoder=decoder, batch_size=batch_size, threads=threads, shard_size=shard_size, log=typer.echo)
    typer.echo(json.dumps(res, indent=1))
    if json_path:
        json_path.write_text(json.dumps(res, indent=1))


@app.command("bench-scaling")
@friendly
def bench_scaling_cmd(sides: str = typer.Option("8,16,32", help="grid sides n"), n: int = 8,
                      reference_bench: Optional[str] = typer.Option("docs/results/bench_main.json",
                                                                    help="bench JSON of the trained 16x16 model"),
                      plot: Path = typer.Option(Path("docs/ssd_scaling.png")),
                      json_path: Optional[Path] = typer.Option(None, "--json")):
    """SSD's scaling claim: forwards per image against grid side n, with a log-log plot."""
    from flows.bench_scaling import run
    res = run(tuple(int(x) for x in sides.split(",")), n, reference_bench, str(plot), log=typer.echo)
    typer.echo(json.dumps(res["loglog_slope"], indent=1))
    if json_path:
        json_path.write_text(json.dumps(res, indent=1))


@app.command("bench-scale")
@friendly
def bench_scale_cmd(n: int = typer.Option(200_000, help="prompts"),
                    shard_size: int = typer.Option(10, help="rows per shard"),
                    actors: int = typer.Option(2, help="Ray actors"), batch_size: int = 16,
                    decoder: str = DECODER, plot: Optional[Path] = typer.Option(None, "--plot", help="RSS plot (PNG)"),
                    json_path: Optional[Path] = typer.Option(None, "--json"),
                    workdir: Optional[str] = typer.Option(None, help="where inputs and output go (kept); default a "
                                                                       "temporary folder, removed after")):
    """Orchestration at scale: the flow over N prompts with a tiny model (decoding costs almost nothing); wall
    time, images/s, per-shard overhead, actor utilisation, and the driver's and actors' peak memory."""
    from flows.bench_scale import brief, dump, run
    res = run(n=n, shard_size=shard_size, actors=actors, batch_size=batch_size, decoder=str(_spec(decoder)),
              plot=str(plot) if plot else None, workdir=workdir, log=typer.echo)
    typer.echo(brief(res))
    if json_path:
        dump(res, str(json_path))
        typer.echo(f"wrote {json_path}")


from flows import cli_reference  # noqa: E402,F401  (registers the reference-model commands on `app`)


def main():
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    app()


if __name__ == "__main__":
    # `python -m flows.cli` runs this file as __main__; the commands live on flows.cli's `app`
    from flows.cli import main as _main
    sys.exit(_main())
