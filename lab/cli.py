"""The lab's command line, `python -m lab COMMAND` from a checkout (what `ssdgen dev` was): training the reference
model and its scorer, the tokenizer report, the docs' figures and the research benchmarks (docs/reference-model.md,
docs/benchmarks.md, docs/pipeline.md). Same command names and options as before; errors are one line, as the
product's (ssdgen/cli/options.py `friendly`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from ssdgen.cli.app import HELP_OPTIONS, OneLineErrors, first_sentence
from ssdgen.cli.options import DECODER, MODEL, SPEC_HELP, friendly, model_on, spec_of

app = typer.Typer(cls=OneLineErrors, no_args_is_help=True, pretty_exceptions_enable=False, add_completion=False,
                  context_settings=HELP_OPTIONS,
                  help="The lab (python -m lab, from a checkout): train and check the reference model, its scorer "
                       "and tokenizer, draw the docs' figures, benchmark the pipeline and the step "
                       "(docs/benchmarks.md, docs/reference-model.md).")
# the bundled model's VQ by default: found in the installed package, never relative to the working folder
VQ = typer.Option(None, help="VQ-VAE weights (default: the bundled model's)")


def _load_vq(vq: Path | None):
    """The VQ-VAE at `vq` (default: the bundled one), in eval mode."""
    from safetensors.torch import load_file
    from ssdgen.reference.vqvae import VQVAE, VQConfig
    from ssdgen.reference.weights import DEFAULT_DIR
    vq = vq or Path(DEFAULT_DIR) / "vq.safetensors"
    if not vq.is_file():
        raise FileNotFoundError(f"{vq}: no VQ-VAE weights (run `python -m lab train-reference` first)")
    vqm = VQVAE(VQConfig())
    vqm.load_state_dict(load_file(vq), strict=True)
    return vqm.eval()


@app.command("bench-sharding")
@friendly
def bench_sharding_cmd(rows: int = typer.Option(10_000_000, help="synthetic prompt rows"),
                       files: int = typer.Option(100, help="Parquet files they are split into"),
                       workdir: Optional[str] = typer.Option(None, help="where the synthetic Parquet goes (kept)"),
                       json_path: Optional[Path] = typer.Option(None, "--json", help="write the result here")):
    """Sharding benchmark: list and shard synthetic prompt Parquet from metadata only (bars: 60 s, 2 GB)."""
    from lab.bench.sharding import run
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
    from lab.bench.pipeline import run
    res = run(n=n, decoder=decoder, batch_size=batch_size, threads=threads, shard_size=shard_size, log=typer.echo)
    typer.echo(json.dumps(res, indent=1))
    if json_path:
        json_path.write_text(json.dumps(res, indent=1))


@app.command("bench-scaling")
@friendly
def bench_scaling_cmd(sides: str = typer.Option("8,16,32", help="grid sides n"),
                      n: int = typer.Option(8, help="prompts per grid side"),
                      reference_bench: Optional[str] = typer.Option(
                          None, help="bench JSON of the trained 16x16 model, drawn at n = 16 (the docs' plot takes "
                                     "a checkout's docs/results/bench_main.json)"),
                      plot: Optional[Path] = typer.Option(None, help="write the log-log plot (PNG) here"),
                      json_path: Optional[Path] = typer.Option(None, "--json", help="write the result here")):
    """SSD's scaling claim: forwards per image against grid side n, with a log-log plot."""
    from lab.bench.scaling import run
    res = run(tuple(int(x) for x in sides.split(",")), n, reference_bench, plot and str(plot), log=typer.echo)
    typer.echo(json.dumps(res["loglog_slope"], indent=1))
    if json_path:
        json_path.write_text(json.dumps(res, indent=1))


@app.command("shard-overhead")
@friendly
def shard_overhead_cmd(shards: int = typer.Option(40, help="shards to time (the first warms up and is left out)"),
                       shard_size: int = typer.Option(256, help="rows per shard (= the batch: one task per shard)"),
                       json_path: Optional[Path] = typer.Option(None, "--json", help="write the result here")):
    """Where a shard's overhead goes, piece by piece, as bench-scale runs a shard: the driver's reads, pickling,
    tables, writes and commit; the actor's unpickling, decoding and pickling; Ray's own per task."""
    from lab.bench.shard_overhead import brief, run
    res = run(shards=shards, shard_size=shard_size, log=typer.echo)
    typer.echo(brief(res))
    if json_path:
        json_path.write_text(json.dumps(res, indent=1))
        typer.echo(f"wrote {json_path}")


@app.command("bench-scale")
@friendly
def bench_scale_cmd(n: int = typer.Option(200_000, help="prompts"),
                    shard_size: int = typer.Option(10, help="rows per shard"),
                    actors: int = typer.Option(2, help="Ray actors"),
                    batch_size: int = typer.Option(16, help="prompts per decoder call"),
                    decoder: str = DECODER, plot: Optional[Path] = typer.Option(None, "--plot", help="RSS plot (PNG)"),
                    json_path: Optional[Path] = typer.Option(None, "--json", help="write the result here"),
                    workdir: Optional[str] = typer.Option(None, help="where inputs and output go (kept: the same "
                                                                       "command resumes an interrupted run there, "
                                                                       "each sitting appended to segments.jsonl); "
                                                                       "default a temporary folder, removed after")):
    """Orchestration at scale: the flow over N prompts with a tiny model (decoding costs almost nothing); wall
    time, images/s, per-shard overhead, actor utilisation, and the driver's and actors' peak memory."""
    from lab.bench.scale import brief, dump, run
    res = run(n=n, shard_size=shard_size, actors=actors, batch_size=batch_size, decoder=str(spec_of(decoder)),
              plot=str(plot) if plot else None, workdir=workdir, log=typer.echo)
    typer.echo(brief(res))
    if json_path:
        dump(res, str(json_path))
        typer.echo(f"wrote {json_path}")


@app.command("train-reference")
@friendly
def train_reference(out: Path = typer.Option(..., help="bundle directory to write (reference/weights replaces "
                                                       "the shipped model)"),
                    preset: str = typer.Option("v2", help="the model's settings: v2 (64-pixel renders, 16x16 "
                                                          "tokens) or v3 (128-pixel renders, 32x32 tokens, bf16 "
                                                          "autocast; wants --warm-from and --vq-from)"),
                    work: Path = typer.Option(Path("runs/train-reference"),
                                              help="folder for the tokenized set, checkpoints and the curve"),
                    resume: bool = typer.Option(False, help="continue from the checkpoint in --work"),
                    until_step: Optional[int] = typer.Option(None, help="stop this sitting after this AR step"),
                    device: str = typer.Option("cpu", help="torch device, e.g. cuda"),
                    vq_from: Optional[Path] = typer.Option(None, help="take the VQ tokenizer from this bundle"),
                    warm_from: Optional[Path] = typer.Option(None, help="start the transformer from this bundle's "
                                                                        "(the image-position embedding resized "
                                                                        "to the new grid)"),
                    seed: int = typer.Option(0, help="training seed (data, initialisation, order)"),
                    gpt_steps: Optional[int] = typer.Option(None, help="override AR training steps"),
                    n_images: Optional[int] = typer.Option(None, help="override the number of training renders"),
                    curve_prompts: Optional[int] = typer.Option(None, help="eval prompts per curve point (0 = none)")):
    """Train the VQ tokenizer and the AR model (v2: about 4 hours on 2 CPU cores; resumable with --resume)."""
    from dataclasses import replace
    from lab.reference.train import PRESETS, train_reference as run
    if preset not in PRESETS:
        raise ValueError(f"--preset must be one of {', '.join(PRESETS)}, got {preset!r}")
    tc = replace(PRESETS[preset], seed=seed)
    tc = replace(tc, **{k: v for k, v in {"n_images": n_images, "curve_prompts": curve_prompts}.items()
                        if v is not None})
    if gpt_steps is not None:
        tc = replace(tc, gpt=replace(tc.gpt, steps=gpt_steps))
    tc = replace(tc, gpt=replace(tc.gpt, seed=seed))
    res = run(out, tc, work, resume, device, vq_from, until_step, warm_from)
    typer.echo(json.dumps({k: res[k] for k in ("steps_done", "timing", "curve")}, indent=1))


@app.command("train-scorer")
@friendly
def train_scorer(out: Path = typer.Option(..., help="scorer weights file to write (reference/weights/"
                                                   "scorer.safetensors replaces the shipped one)"),
                 steps: int = typer.Option(3000, help="optimiser steps"),
                 vq: Optional[Path] = VQ,
                 device: str = typer.Option("cpu", help="torch device, e.g. cuda"),
                 workers: int = typer.Option(2, help="data-loader processes rendering the training images"),
                 n_images: int = typer.Option(48_000, help="training renders"),
                 batch: int = typer.Option(128, help="images per optimiser step")):
    """Train the scene-accuracy / FD feature network on renders and the reference VQ's reconstructions."""
    from lab.reference.train_scorer import save_scorer, train_scorer as run
    net = run(vq=_load_vq(vq), steps=steps, batch=batch, n_images=n_images, device=device, workers=workers)
    save_scorer(net, out)
    typer.echo(f"wrote {out}")


@app.command("eval-scorer")
@friendly
def eval_scorer(n: int = typer.Option(1024, help="held-out renders"),
                json_path: Optional[Path] = typer.Option(None, "--json", help="write the result here"),
                scorer: Optional[Path] = typer.Option(None, help="scorer weights (default: bundled)"),
                vq: Optional[Path] = VQ):
    """Validate the scorer: held-out renders, their VQ reconstructions, and shuffled captions."""
    from ssdgen.reference.scorer import DEFAULT_PATH, load_scorer
    from lab.reference.validate_scorer import validate
    res = validate(load_scorer(scorer or DEFAULT_PATH), _load_vq(vq), n)
    for k in ("renders", "reconstructions", "shuffled_captions"):
        r = res[k]
        typer.echo(f"{k:<18} scene {r['scene_accuracy']:.4f}  object {r['object_accuracy']:.4f}  "
                   f"bg {r['background_kind']:.4f}  extras {r['images_with_extra_objects']:.4f}  "
                   + "  ".join(f"{a} {v:.3f}" for a, v in r["attributes"].items()))
    if json_path:
        json_path.write_text(json.dumps(res, indent=1))


@app.command("tokenizer-report")
@friendly
def tokenizer_report(n: int = typer.Option(1024, help="held-out renders"),
                     json_path: Optional[Path] = typer.Option(None, "--json", help="write the result here"),
                     model: Optional[str] = MODEL,
                     size: Optional[int] = typer.Option(None, help="render side in pixels, 64 or 128 (default: the "
                                                                   "model's own, 4 pixels per token)"),
                     floor: bool = typer.Option(False, help="also the scorer on renders and reconstructions and the "
                                                            "tokenizer's FD floor")):
    """VQ reconstruction PSNR per background kind, and above/left token agreement on real renders."""
    from lab.reference.tokenizer_report import tokenizer_report as run
    m = model_on(model)
    res = run(m.vq, n, size or 4 * m.grid[0], floor)
    typer.echo(json.dumps(res, indent=1))
    if json_path:
        json_path.write_text(json.dumps(res, indent=1))


@app.command("figures")
@friendly
def figures(out: Path = typer.Option(..., help="folder for the PNGs and JSON (docs replaces the docs' figures)"),
            seed: int = typer.Option(0, help="run seed, combined with each eval prompt's own"),
            model: Optional[str] = MODEL, n: int = typer.Option(256, help="eval prompts for CSD"),
            csd: str = typer.Option("csd", help="the CSD decode spec whose commit maps to show; "
                                    "its sampling settings are the AR grid's too. " + SPEC_HELP)):
    """docs/ figures: a 4x4 grid of AR samples for 16 eval prompts, and CSD's commit maps with where its
    relaxed acceptances fall (objects, smooth and detailed background)."""
    import numpy as np

    from ssdgen.decoders import build
    from ssdgen.decoders.spec import DecodeSpec
    from ssdgen.reference.evaluate import generate
    from ssdgen.reference.grid import captioned_grid
    from ssdgen.reference.prompts import eval_prompts, eval_seed

    from lab.reference.commit_maps import content_awareness, overlay
    spec = spec_of(csd)
    m = model_on(model)  # on the CPU in fp32
    out.mkdir(parents=True, exist_ok=True)
    rows = eval_prompts(16)
    prompts, seeds = [r["prompt"] for r in rows], [eval_seed(seed, r["seed"]) for r in rows]
    images, _, _ = generate(m, prompts, seeds, build(DecodeSpec("ar", (), spec.sampling), m), 16)
    captioned_grid(list(images), prompts).save(out / "samples_grid.png")
    rows = eval_prompts(n)
    prompts, seeds = [r["prompt"] for r in rows], [eval_seed(seed, r["seed"]) for r in rows]
    dec = build(spec, m)
    images, stats, _ = generate(m, prompts, seeds, dec, 16, desc=spec.label)  # speculation's cheap batch on a CPU
    maps = [s.commit_map for s in stats]
    report = {"decoder": str(spec), "n": len(prompts),
              "forwards_per_image": float(np.mean([s.forwards for s in stats]))}
    report |= content_awareness(prompts, images, maps)
    (out / "csd_content_awareness.json").write_text(json.dumps(report, indent=1))
    pick = list(range(8))
    captioned_grid([images[i] for i in pick], [prompts[i] for i in pick], cols=4,
                   extra=[overlay(images[i], maps[i]) for i in pick]).save(out / "csd_commit_maps.png")
    typer.echo(json.dumps(report, indent=1))


@app.command("formats")
@friendly
def formats_cmd(n: int = typer.Option(256, help="images (the first n eval prompts)"),
                quality: int = typer.Option(90, help="webp/jpeg quality (generate's default)"),
                batch_size: int = typer.Option(32, help="prompts per decoder call"), model: Optional[str] = MODEL,
                out: Optional[Path] = typer.Option(None, help="also write the rows as JSON here")):
    """Stored bytes per image in png, webp and jpeg: the same images through the pipeline's own encoder."""
    from lab.bench.formats import report
    if n < 1 or batch_size < 1:
        raise ValueError(f"--n and --batch-size must be >= 1, got {n} and {batch_size}")
    report(n, quality, batch_size, model, out, echo=typer.echo)


@app.command("shape-replay")
@friendly
def shape_replay_cmd(bench_json: Path = typer.Argument(..., help="a `ssdgen bench --json` result with traces"),
                     out_json: Path = typer.Argument(..., help="where to write the replay's rows"),
                     device: Optional[str] = typer.Option(None, help="torch device (default: cuda if there is one)"),
                     shapes: str = typer.Option("janus-pro-1b,janus-pro-7b", help="comma-separated model shapes"),
                     budget_s: float = typer.Option(240.0, help="stop starting new rows after this many seconds"),
                     accelerator: Optional[str] = typer.Option(None, help="projection accelerator to compare with"),
                     tiny: bool = typer.Option(False, help="tiny shapes in fp32 (a CPU check of the command)")):
    """Time the forward shapes a bench recorded on random-weight models of production sizes (docs/benchmarks.md)."""
    from lab.bench.shape_replay import run
    if not bench_json.is_file():
        raise FileNotFoundError(f"{bench_json}: no such bench JSON")
    res = run(str(bench_json), str(out_json), device, shapes, budget_s, accelerator, tiny)
    typer.echo(f"wrote {out_json} ({len(res['rows'])} rows)")


@app.command("projection-check")
@friendly
def projection_check_cmd(bench_json: list[Path] = typer.Argument(..., help="bench or eval JSONs of one model"),
                         out: Optional[Path] = typer.Option(None, help="write the result as JSON here"),
                         device: str = typer.Option("cpu", help="torch device whose bandwidth and FLOP/s to measure"),
                         repeats: int = typer.Option(3, help="measurements of the device; the best counts")):
    """The GPU projection's method checked against benches measured on this machine, error in % per row."""
    from lab.bench.projection_check import check
    missing = [str(p) for p in bench_json if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"{', '.join(missing)}: no such bench JSON")
    check([str(p) for p in bench_json], str(out) if out else None, device, repeats, echo=typer.echo)


@app.command("screenshot")
@friendly
def screenshot_cmd(page: Path = typer.Argument(..., help="a local HTML page (bench or report)"),
                   png: Path = typer.Argument(..., help="the PNG to write"),
                   width: int = typer.Option(1200, help="viewport width, px"),
                   height: int = typer.Option(1600, help="viewport height, px")):
    """Render an HTML page to PNG with headless Chromium (the docs' screenshots)."""
    from lab.bench.screenshot import screenshot
    if not page.is_file():
        raise FileNotFoundError(f"{page}: no such page")
    typer.echo(screenshot(page, png, width, height))


@app.command("eval-set")
@friendly
def eval_set_cmd(out: Path = typer.Option(..., help="JSONL to write (reference/data/eval_prompts_v1.jsonl is the "
                                                    "versioned set)")):
    """Regenerate the fixed eval set (1,024 prompts from a fixed seed) into --out."""
    from ssdgen.reference.prompts import make_eval_set, write_jsonl
    rows = make_eval_set()
    write_jsonl(rows, out)
    typer.echo(f"wrote {len(rows)} prompts to {out}")


@app.command("host-time")
@friendly
def host_time_cmd(out: Optional[Path] = typer.Option(None, help="write the JSON here"),
                  batches: str = typer.Option("1,64", help="comma-separated batch sizes"),
                  repeats: int = typer.Option(5, help="decodes per row; the fastest counts"),
                  codes: int = typer.Option(256, help="image-token vocabulary of the tiny model"),
                  grid: int = typer.Option(8, help="image tokens per side"),
                  threads: int = typer.Option(1, help="torch threads (1: least sensitive to other load)"),
                  model: Optional[str] = typer.Option(None, help="a real model (e.g. reference) instead of the tiny "
                                                                 "one: the engines a run uses, on eval prompts")):
    """Host (non-model) wall time per model forward of each decoder, on a tiny random model or a real one, and its
    share of the model's step (docs/benchmarks.md)."""
    import torch

    from lab.bench.host_time import run, run_model
    try:
        sizes = [int(b) for b in batches.split(",") if b.strip()]
    except ValueError:
        raise ValueError(f"--batches must be comma-separated integers, got {batches!r}") from None
    if not sizes or min(sizes) < 1 or repeats < 1:
        raise ValueError(f"--batches must be integers >= 1 and --repeats >= 1, got {batches!r} and {repeats}")
    torch.set_num_threads(threads)
    res = run_model(model, sizes, repeats) if model else run(sizes, repeats, codes, grid)
    if out:
        out.write_text(json.dumps(res, indent=1))
        typer.echo(f"wrote {out}")


def _int_list(flag: str, text: str) -> list[int]:
    """A comma-separated list of integers >= 1, or one error line naming the option."""
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise ValueError(f"{flag} must be comma-separated integers >= 1, got {text!r}")
    return values


@app.command("roofline")
@friendly
def roofline_cmd(batches: str = typer.Option("1,4,16,64,256", help="comma-separated batch sizes (CFG: 2 rows "
                                                                   "each)"),
                 windows: str = typer.Option("1,2,4,8", help="comma-separated tokens per row per step (1: plain "
                                                             "AR; more: a speculative window)"),
                 repeats: int = typer.Option(7, help="timed steps per cell, after one warm-up"),
                 threads: int = typer.Option(2, help="torch threads"),
                 model: Optional[str] = typer.Option(None, help="the reference model: a bundle's path, or a spec "
                                                                "reference[:/path/to/bundle][:kv=DTYPE] (default: "
                                                                "the bundled one, fp32 cache)"),
                 json_out: Optional[Path] = typer.Option(None, "--json", help="write the table as JSON here"),
                 profile: Optional[str] = typer.Option(None, help="BATCHxWINDOW (e.g. 64x1): also print "
                                                                  "torch.profiler's ops of that step")):
    """Each step of the reference model against this machine's roof: read bandwidth, the step's matmuls timed
    alone, its KV bytes and FLOPs, and the fraction of the roof it reaches (bench/roofline.py; quiet machine)."""
    import torch

    from ssdgen.cli.options import check_out_files

    from lab.bench import roofline
    sizes, widths = _int_list("--batches", batches), _int_list("--windows", windows)
    if repeats < 1 or threads < 1:
        raise ValueError(f"--repeats and --threads must be >= 1, got {repeats} and {threads}")
    prof = _int_list("--profile", profile.replace("x", ",")) if profile else None
    if prof is not None and len(prof) != 2:
        raise ValueError(f"--profile must be BATCHxWINDOW, e.g. 64x1, got {profile!r}")
    check_out_files({"--json": json_out})
    spec = model or "reference"
    m = model_on(spec if spec.startswith("reference") else f"reference:{spec}", "cpu", "fp32")
    torch.set_num_threads(threads)
    res = roofline.run(m, sizes, widths, repeats)  # prints the table as it goes
    if prof:
        typer.echo(roofline.profile(m, *prof))
    if json_out:
        json_out.write_text(json.dumps(res, indent=1))
        typer.echo(f"wrote {json_out}")


for _info in app.registered_commands:  # as the product's commands: a one-sentence listing, -h as --help
    _info.short_help = _info.short_help or first_sentence(_info.help or _info.callback.__doc__)
    _info.context_settings = {**(_info.context_settings or {}), **HELP_OPTIONS}


def main():
    app()


if __name__ == "__main__":
    main()
