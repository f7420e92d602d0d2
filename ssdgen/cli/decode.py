"""Decode and measure commands: sample, eval, bench, fidelity, calibrate, projection, train-heads and eval-heads
(docs/benchmarks.md, docs/decoders.md)."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Optional

import typer

from ssdgen.bench.noise import SAME
from ssdgen.cli.options import (CFG, DECODER, DEVICE, DTYPE, MODEL, RUN_DECODER, TOPK, check_out_files, friendly,
                                model_on,
                                sampling_of, spec_of, specs_of)

app = typer.Typer()


SAMPLE_OUT = Path("out/samples.png")  # beside `make demo`'s out/, which .gitignore keeps out of a checkout


@app.command()
@friendly
def sample(prompts: Optional[list[str]] = typer.Argument(None, help="captions to draw (or --prompt, repeated)",
                                                         show_default=False),
           prompt: Optional[list[str]] = typer.Option(None, help="caption; repeat for several"),
           n: int = typer.Option(4, help="images per prompt"),
           out: Path = typer.Option(SAMPLE_OUT, help="the grid PNG to write (its folder must exist; the default's "
                                                     "out/ is made)"),
           seed: int = typer.Option(0, help="seed of the first image; the others count up from it"),
           decoder: str = DECODER, model: Optional[str] = MODEL, device: str = DEVICE, dtype: str = DTYPE):
    """Sample images for prompts and save them as one grid PNG: a row per prompt, each image captioned with its
    prompt and seed."""
    import numpy as np
    from ssdgen.decoders import build
    captions = [*(prompts or []), *(prompt or [])]
    if not captions:
        raise ValueError('give a prompt: ssdgen sample "a large red circle at the center on a flat gray background"')
    if n < 1:
        raise ValueError(f"--n must be >= 1, got {n}")
    if out != SAMPLE_OUT:  # the default's folder is made when the grid is written, not for a run that fails
        check_out_files({"--out": out})
    spec = spec_of(decoder)
    m = model_on(model, device, dtype)
    batch = [p for p in captions for _ in range(n)]
    seeds = [seed + i for i in range(len(batch))]
    m.validate_prompts(batch)
    from ssdgen.workers.cpus import governed
    with governed(m):  # threads follow what other processes leave (workers/cpus.py)
        dec = build(spec, m).resolve(batch, seeds, len(batch))  # a calibrated spec: planned on this batch
        if dec.plan is not None:
            typer.echo(f"{decoder} planned on this device: {dec.plan.why}; decoding as {dec}")
        res = dec.decode(batch, seeds)
    grid = _sample_grid(m.decode_images(res.tokens).numpy(), batch, seeds, n)
    out.parent.mkdir(exist_ok=True)
    grid.save(out)
    fwd = np.mean([s.forwards for s in res.stats])
    typer.echo(f"wrote {out.resolve()}: {len(batch)} images of {len(captions)} prompt(s), {n} per row ({decoder}, "
               f"{fwd:.1f} forwards per image)")
    if dec.falls_back:  # a fall-back to plain AR is said, never silent
        typer.echo(f"note: {decoder} decoded this batch as plain AR ({dec.plan.why})")


def _sample_grid(images, prompts: list[str], seeds: list[int], n: int):
    """The samples as reference/grid.py's captioned grid, `n` to a row: each under its prompt and seed (the seed
    redraws it: --seed), at 3x the reference model's 64 pixels or a larger model's own size."""
    from ssdgen.reference.grid import TILE, captioned_grid
    captions = [f"{p} (seed {s})" for p, s in zip(prompts, seeds)]
    return captioned_grid(list(images), captions, cols=n, tile=max(TILE, images.shape[2]))


def _batch_sizes(text: str) -> list[int]:
    try:
        return [int(b) for b in text.split(",") if b.strip()]
    except ValueError:
        raise ValueError(f"--batch-sizes must be comma-separated integers, got {text!r}") from None


def _echo_bench(res: dict) -> None:
    """The verdict first (the cheapest configuration at its best batch and what cannot be told apart from it),
    then the load warnings, each decoder at its best measured batch size, and every decoder and batch size."""
    from ssdgen.bench.tables import BEST_COLS, ROW_COLS, text_table
    if res.get("verdict"):
        typer.echo(f"verdict: {res['verdict']['text']}")
    noise = res.get("noise") or {}
    if noise.get("floor") is not None:
        typer.echo(f"noise floor: {noise['floor']:.1%} (AR against AR in the same {res.get('rounds')} rounds); a "
                   f"ratio whose 95% interval holds 1 or lies within it is '{SAME}'")
    elif "rounds" in res:
        typer.echo("one round: no interval, so no difference can be told from noise (use --rounds 3 or more)")
    for w in (res.get("load") or {}).get("warnings", []):
        typer.echo(f"warning: busy machine: {w}")
    if (res.get("price") or {}).get("unit"):
        from ssdgen.output.cost import price_words
        typer.echo(f"price: {price_words(res['price'])} x {res.get('devices')} {res['price']['unit']}(s)")
    if not res["rows"]:
        return
    typer.echo("best batch per decoder (the most images/s among the batch sizes measured; latency at batch 1)")
    typer.echo("\n".join(text_table(res.get("best", []), BEST_COLS)))
    typer.echo("")
    typer.echo("\n".join(text_table(res["rows"], ROW_COLS)))


def _bench_or_stop(run) -> dict:
    """The bench's result; after a Ctrl-C, the verdict of what it timed and its own line, exit 130 (it printed
    generate's "interrupted before the run started; nothing was committed" and dropped the verdict)."""
    from ssdgen.bench.decode import BenchInterrupted
    try:
        return run()
    except BenchInterrupted as e:
        _echo_bench(e.result)
        typer.echo(f"\n{_interrupted_line(e.result)}", err=True)
        raise typer.Exit(130)
    except KeyboardInterrupt:  # while the model loaded
        typer.echo("\ninterrupted: the bench stopped before it decoded anything; nothing written", err=True)
        raise typer.Exit(130)


def _interrupted_line(res: dict) -> str:
    """The bench's Ctrl-C line: where it stopped and what the lines above it rest on."""
    stop = res["interrupted"]
    if not res["rows"]:
        return f"interrupted: the bench stopped in its {stop['phase']}, before any cell was timed; nothing written"
    done = (f"{stop['cells']} cells, {stop['rounds_done']} whole round(s) each" if stop["rounds_done"] is not None
            else f"all {stop['cells']} cells, every round")
    skipped = {"timing": "quality and fidelity not measured", "quality": "quality and fidelity not (all) measured",
               "fidelity": "fidelity not measured"}.get(stop["phase"], "")
    return (f"interrupted: the bench stopped in its {stop['phase']}; the verdict above is from {done}"
            + (f"; {skipped}" if skipped else "") + "; --json and --html not written")


def _check_counts(n: int, quality_n: int, fidelity_n: int, quality_batch: int, rounds: int, tolerance: float) -> None:
    """The bench's counts, each refused in one line before the model loads."""
    if not 1 <= n <= 1024 or not 0 <= quality_n <= 1024 or not (fidelity_n == 0 or 2 <= fidelity_n <= 1024):
        raise ValueError(f"--n must be in 1..1024, --quality-n in 0..1024 and --fidelity-n 0 or in 2..1024, "
                         f"got {n}, {quality_n} and {fidelity_n}")
    if quality_batch < 1:
        raise ValueError(f"--quality-batch must be >= 1, got {quality_batch}")
    if rounds < 1:
        raise ValueError(f"--rounds must be >= 1, got {rounds}")
    if not tolerance > 0:
        raise ValueError(f"--tolerance must be > 0 (nats/token), got {tolerance}")


@app.command("bench")
@friendly
def bench_cmd(decoders: str = typer.Option("ar,sjd,csd",
                                           help="comma-separated specs, e.g. ar,sjd:window=16,csd:lam=0.5; a "
                                                "repeated spec is a row of its own (ar,ar: AR against itself)"),
              n: int = typer.Option(64, help="eval prompts timed per decoder, batch size and round"),
              batch_sizes: str = typer.Option("1", help="comma-separated batch sizes"),
              rounds: int = typer.Option(3, help="interleaved timing rounds: each times every decoder and batch "
                                                 "size once; 3 or more give 95% intervals (1: none)"),
              quality_n: int = typer.Option(1024, help="eval prompts for scene accuracy and FD, decoded once per "
                                                       "decoder (0 = skip)"),
              quality_decoders: Optional[str] = typer.Option(None, help="comma-separated specs to score for "
                                                             "quality (default: all of --decoders)"),
              fidelity_n: int = typer.Option(256, help="eval prompts for the NLL gap to ar, decoded once per "
                                                       "decoder (0 = skip)"),
              quality_batch: int = typer.Option(64, help="batch size of the quality and fidelity decodes (not "
                                                         "timed; on a CPU speculation is cheapest at 16)"),
              tolerance: float = typer.Option(0.15, help="allowed |NLL gap| in nats/token (95% interval)"),
              json_path: Optional[Path] = typer.Option(None, "--json", help="write the result here"),
              html: Optional[Path] = typer.Option(None, "--html", help="write a standalone HTML report here"),
              device_type: str = typer.Option("cpu", help="price row of the price table for $ per 1k images "
                                                          "(cpu = per vCPU x torch threads; a GPU type = 1 GPU)"),
              prices: Optional[str] = typer.Option(None, help="your price table instead of the shipped one (a CSV "
                                                            "with its columns); --device-type picks the row"),
              usd_per_hour: Optional[str] = typer.Option(None, help="your on-demand price in USD per device-hour "
                                                                    "(per vCPU-hour for a CPU type)"),
              spot_usd_per_hour: Optional[str] = typer.Option(None, help="with --usd-per-hour: your spot price"),
              device: str = DEVICE, dtype: str = DTYPE,
              seed: int = typer.Option(0, help="run seed, combined with each eval prompt's own"),
              model: Optional[str] = MODEL):
    """Compare decoders side by side: forwards, time, cost, quality and fidelity, speedups measured in this
    run, in interleaved rounds with 95% intervals, an AR-against-AR noise floor and a verdict. The decoders
    share one sampling setting (give cfg, temperature, top_k, top_p in each spec).

    What it decodes: (decoders + an AR control) x batch sizes x --rounds x --n images for speed, plus --quality-n
    and --fidelity-n images per decoder. The defaults (ar,sjd,csd at batch 1, 64 prompts, 3 rounds, quality 1024,
    fidelity 256) decode about 4,900 images (768 timed): on 2 CPU cores, 30-60 minutes. For a quick look:
    --n 8 --quality-n 0 --fidelity-n 0 (a minute or two)."""
    from ssdgen.bench.decode import bench, check_args, resolve_device
    specs = specs_of(decoders)
    sizes = _batch_sizes(batch_sizes)
    _check_counts(n, quality_n, fidelity_n, quality_batch, rounds, tolerance)
    check_out_files({"--json": json_path, "--html": html})
    check_args(specs, sizes)  # all argument errors before the model loads
    chosen = specs_of(quality_decoders) if quality_decoders else None
    from ssdgen.output.cost import price_from
    price = price_from(device_type, prices, usd_per_hour, spot_usd_per_hour)  # bad values: one line, before the load
    resolve_device(device, device_type, price)
    res = _bench_or_stop(lambda: bench(
        model_on(model, device, dtype), specs, n, sizes, quality_n, seed=seed, log=typer.echo,
        device_type=device_type, quality_decoders=chosen, fidelity_n=fidelity_n, tolerance=tolerance,
        quality_batch=quality_batch, rounds=rounds, price=price))
    samples = res.pop("samples", None)  # images: for the page, not the JSON
    _echo_bench(res)
    if json_path:
        json_path.write_text(json.dumps(res, indent=1))
        typer.echo(f"wrote {json_path}")
    if html:
        from ssdgen.bench.plots import bench_html
        html.write_text(bench_html(res, samples), encoding="utf-8")
        typer.echo(f"wrote {html}")


@app.command("fidelity")
@friendly
def fidelity_cmd(decoders: str = typer.Option("sjd,ssd:lossless=true,csd,ssd+csd",
                                              help="comma-separated specs, each compared with ar"),
                 n: int = typer.Option(256, help="prompts: the first n eval prompts, or of --prompts-file"),
                 batch_size: int = typer.Option(64, help="prompts per decoder call"),
                 seed: int = typer.Option(0, help="run seed, combined with each eval prompt's own"),
                 tolerance: float = typer.Option(0.15, help="allowed |NLL gap| in nats/token (95% interval)"),
                 prompts: Optional[Path] = typer.Option(None, "--prompts-file",
                                                         help="text file, one prompt a line (HF models)"),
                 json_path: Optional[Path] = typer.Option(None, "--json", help="write the result here"),
                 device: str = DEVICE, dtype: str = DTYPE, model: Optional[str] = MODEL):
    """Fidelity against the target: NLL per token of each decoder's tokens under the model, its gap to AR
    with bootstrap intervals, FD to AR's own samples and accuracy deltas (reference model)."""
    from ssdgen.decoders.spec import common_sampling
    from ssdgen.bench.fidelity import fidelity
    specs = specs_of(decoders)
    common_sampling(specs)
    if not specs:
        raise ValueError("--decoders is empty: name at least one decoder, e.g. sjd,csd")
    if n < 2 or batch_size < 1 or tolerance <= 0:
        raise ValueError(f"--n must be >= 2, --batch-size >= 1 and --tolerance > 0; got {n}, {batch_size}, "
                         f"{tolerance}")
    check_out_files({"--json": json_path})
    from ssdgen.reference.prompts import eval_prompts, eval_seed
    if prompts is not None:
        if not prompts.exists():
            raise FileNotFoundError(f"{prompts}: no such prompts file")
        texts = [line.strip() for line in prompts.read_text().splitlines() if line.strip()][:n]
        seeds = [eval_seed(seed, i) for i in range(len(texts))]  # a file's prompts are seeded by their line
    else:
        rows = eval_prompts(min(n, 1024))
        texts, seeds = [r["prompt"] for r in rows], [eval_seed(seed, r["seed"]) for r in rows]
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
                  objective: str = typer.Option("throughput", help="throughput (most images/s) or latency"),
                  device: str = DEVICE, dtype: str = DTYPE, model: Optional[str] = MODEL):
    """What a calibrated decoder (calibrated=true, ssd+csd's default) would decide on this device at each batch
    size, as `generate` decides it once per run (decoders/planner.py): each choice's expected images/s, the
    choice and why."""
    spec = spec_of(decoder)
    if not spec.calibrated:
        raise ValueError(f"--decoder {decoder!r} is not calibrated (only ssd and ssd+csd with calibrated=true are)")
    sizes = _batch_sizes(batch_sizes)
    if not sizes or min(sizes) < 1 or max(sizes) > 1024:
        raise ValueError(f"--batch-sizes must be integers in 1..1024, got {batch_sizes!r}")
    from ssdgen.decoders.recipes import OBJECTIVES
    if objective not in OBJECTIVES:
        raise ValueError(f"--objective must be one of {', '.join(OBJECTIVES)}, got {objective!r}")
    check_out_files({"--json": json_path})
    from ssdgen.decoders import build
    from ssdgen.decoders.recipes import pilot_rows
    from ssdgen.decoders.spec import speculative_rows
    from ssdgen.reference.prompts import eval_prompts, eval_seed
    m = model_on(model, device, dtype)
    dec = build(spec, m)  # its heads loaded once for every batch size
    rows = eval_prompts(pilot_rows(sizes))  # Decoder.resolve plans on its first ones
    plans = []
    for b in sizes:
        chosen = dec.resolve([r["prompt"] for r in rows], [eval_seed(seed, r["seed"]) for r in rows], b, objective)
        plan = {"spec": str(chosen), "rows": speculative_rows(chosen.spec)} | chosen.plan.to_dict()
        plans.append(plan)
        est = ", ".join(f"{c.split('@')[0]}: {v:.2f}" for c, v in plan["estimates"].items())
        typer.echo(f"batch {b:>4}: {plan['why']}; {plan['spec']}; estimates (images/s) {est}; "
                   f"{plan['seconds']:.1f} s")
    if json_path:
        json_path.write_text(json.dumps({"decoder": str(spec), "model": m.name, "plans": plans}, indent=1))
        typer.echo(f"wrote {json_path}")


@app.command("projection")
@friendly
def projection_cmd(bench_json: Path = typer.Option(..., "--bench-json", help="a `ssdgen bench --json` result"),
                   accelerators: str = typer.Option("l4,a10g,a100-40gb,h100,h200", help="comma-separated"),
                   models: str = typer.Option("1b@24,7b@48,emu3-8b", help="comma-separated SIZE@GRID, SIZE in "
                                              "{1b, 7b, emu3-8b, janus-pro-7b} (e.g. 7b@48 = 7B params, 48x48 "
                                              "tokens); emu3-8b and janus-pro-7b alone take their own grid"),
                   batch_sizes: str = typer.Option("1,4,16,64", help="comma-separated; the best batch is also "
                                                   "searched over powers of two up to the memory cap"),
                   cfg: bool = typer.Option(True, help="classifier-free guidance doubles the batch"),
                   json_path: Optional[Path] = typer.Option(None, "--json", help="write the result here"),
                   html: Optional[Path] = typer.Option(None, "--html", help="write a standalone HTML page here")):
    """PROJECTION (not a measurement): images/s and $ per 1k images on named accelerators, from a bench's
    measured acceptance statistics and a roofline model; memory (weights + KV cache, CFG doubling the rows) caps
    the batch, each decoder's best batch is found up to that cap, and the words say where speculation wins."""
    from ssdgen.bench.projection import project_cli
    check_out_files({"--json": json_path, "--html": html})
    res = project_cli(bench_json, accelerators, models, batch_sizes, cfg)
    for line in res["text"]:
        typer.echo(line)
    if json_path:
        json_path.write_text(json.dumps(res["result"], indent=1))
        typer.echo(f"wrote {json_path}")
    if html:
        from ssdgen.bench.projection import projection_html
        html.write_text(projection_html(res["result"]), encoding="utf-8")
        typer.echo(f"wrote {html}")


@app.command("train-heads")
@friendly
def train_heads_cmd(model: Optional[str] = MODEL, out: str = typer.Option(
                        ..., help="heads path without suffix, one per kind, comma-separated, e.g. runs/heads,"
                                  "runs/heads-token (decode with heads=PATH; the shipped ones are "
                                  "reference/weights/heads and heads-token)"),
                    n_images: int = typer.Option(2048, help="the model's own samples to distil from"),
                    steps: int = typer.Option(1500, help="optimiser steps per kind"),
                    rollout: int = typer.Option(1, help="chained head steps per training pair (1: teacher "
                                                        "forcing; more: the heads learn from their own drafts)"),
                    kind: str = typer.Option("latent", help="latent, token, or latent,token (both learn from one "
                                                            "set of samples)"),
                    cfg: float = CFG, top_k: int = TOPK, seed: int = typer.Option(0, help="sampling and training seed"),
                    prompts: Optional[Path] = typer.Option(None, "--prompts-file",
                                                         help="text file, one prompt a line (HF models)"),
                    device: str = DEVICE, dtype: str = DTYPE):
    """Train SSD's horizontal and vertical heads by self-distillation on the frozen model's own samples (the
    heads train in fp32 whatever the model's --dtype)."""
    from ssdgen.decoders.ssd_train import DistillConfig, collect, train_heads
    from ssdgen.models.registry import ModelSpec
    kinds = [k.strip() for k in kind.split(",") if k.strip()]
    if not kinds or set(kinds) - {"latent", "token"} or len(set(kinds)) < len(kinds):
        raise ValueError(f"--kind must be latent, token or latent,token; got {kind!r}")
    dests = [Path(o.strip()) for o in out.split(",")]
    if len(dests) != len(kinds):  # before the model loads
        raise ValueError(f"--out names {len(dests)} path(s) for {len(kinds)} kind(s) ({kind})")
    for flag, value in (("--n-images", n_images), ("--steps", steps), ("--rollout", rollout)):
        if value < 1:
            raise ValueError(f"{flag} must be >= 1, got {value}")
    base = DistillConfig(n_images=n_images, steps=steps, seed=seed, rollout=rollout)  # checked before the load
    m = model_on(model, device, dtype)
    base.check_grid(m.grid)  # before the samples are drawn (minutes to hours)
    if prompts is not None:
        captions = [line.strip() for line in prompts.read_text().splitlines() if line.strip()]
    elif ModelSpec.parse(model).kind == "reference":
        from ssdgen.reference.scene_sets import build_dataset
        _, _, captions = build_dataset(n_images, seed + 99)  # training-distribution captions, eval set held out
    else:
        raise ValueError("--prompts-file is required for Hugging Face models")
    sc = sampling_of(cfg, 1.0, top_k, 1.0)
    t0 = time.perf_counter()
    data = collect(m, captions[:n_images], sc, base) if len(kinds) > 1 else None  # sampled once, for every kind
    shared = {"shared_collect_s": time.perf_counter() - t0} if data is not None else {}
    for k, dest in zip(kinds, dests):
        heads, info = train_heads(m, captions, sc, dataclasses.replace(base, kind=k), data=data)
        heads.save(dest)
        typer.echo(json.dumps(info | shared | {"kind": k, "path": str(dest)}, indent=1))


@app.command("eval")
@friendly
def eval_cmd(decoder: str = DECODER, n: int = typer.Option(1024, help="eval prompts, the first n of 1,024"),
             batch_size: int = typer.Option(64, help="prompts per decoder call"),
             seed: int = typer.Option(0, help="run seed, combined with each eval prompt's own"),
             json_path: Optional[Path] = typer.Option(None, "--json", help="write the result here"),
             model: Optional[str] = MODEL, device: str = DEVICE, dtype: str = DTYPE):
    """Decode the fixed eval prompts and report scene accuracy, object accuracy and FD."""
    from ssdgen.reference.evaluate import evaluate
    spec = spec_of(decoder)
    if not 1 <= n <= 1024:
        raise ValueError(f"--n must be in 1..1024 (the eval set has 1,024 prompts), got {n}")
    if batch_size < 1:
        raise ValueError(f"--batch-size must be >= 1, got {batch_size}")
    check_out_files({"--json": json_path})
    m = model_on(model, device, dtype)
    from ssdgen.workers.cpus import governed
    with governed(m):  # threads follow what other processes leave (workers/cpus.py)
        res = evaluate(m, spec, n, batch_size, seed)
    rep = res["scorer"]
    typer.echo(f"model {res['model']}  decoder {spec}  n {res['n']}  batch {batch_size}  seed {seed}")
    if res["measurements"] is not None:  # a fall-back to plain AR is reported, never silent
        typer.echo(f"  note: {spec.label} resolved on this device to {res['resolved']}" + (
            f" ({res['measurements']['why']}); calibrated=false scores its speculative path"
            if not spec_of(res["resolved"]).recipe.speculative else ""))
    for k in ("scene_accuracy", "object_accuracy", "fd", "fd_real_heldout", "fd_tokenizer_floor",
              "forwards_per_image", "seconds_per_image"):
        typer.echo(f"  {k:<22} {res[k]:.4f}")
    for k, v in rep["attributes"].items():
        typer.echo(f"  attribute {k:<12} {v:.4f}")
    for k in ("background_kind", "background_colour", "images_with_extra_objects"):
        typer.echo(f"  {k:<22} {rep[k]:.4f}")
    for k, v in rep["scene_accuracy_by_objects"].items():
        typer.echo(f"  scene accuracy, {k} object(s): {v:.4f}")
    if json_path:
        keys = ("model", "decoder", "spec", "n", "batch_size", "seed", "scene_accuracy", "object_accuracy", "fd",
                "forwards_per_image", "seconds_per_image")
        out = {k: res[k] for k in keys + ("fd_real_heldout", "fd_tokenizer_floor")} | {"details": res}
        json_path.write_text(json.dumps(out, indent=1))
        typer.echo(f"wrote {json_path}")


@app.command("eval-heads")
@friendly
def eval_heads(heads: Optional[str] = typer.Option(None, help="comma-separated heads paths (without suffix); "
                                                         "default: the bundled model's heads and heads-token"),
               n: int = typer.Option(64, help="eval prompts"),
               batch_size: int = typer.Option(64, help="prompts per teacher-forced forward"),
               seed: int = typer.Option(0, help="run seed, combined with each eval prompt's own"),
               depth: int = typer.Option(6, help="offsets per head for the by-offset table (chained drafts)"),
               cfg: float = CFG, model: Optional[str] = MODEL,
               json_path: Optional[Path] = typer.Option(None, "--json", help="write the result here"),
               device: str = DEVICE, dtype: str = DTYPE):
    """Draft acceptance of SSD heads with exact context (teacher forcing), e.g. latent against token heads, and
    by offset with exact and with drafted (chained) context."""
    from ssdgen.decoders import load_heads
    from ssdgen.decoders.ssd_train import chain_acceptance, draft_acceptance
    from ssdgen.reference.prompts import eval_prompts, eval_seed
    from ssdgen.reference.weights import DEFAULT_DIR
    if depth < 1:  # its upper bound depends on the model's grid (chain_acceptance)
        raise ValueError(f"--depth must be >= 1, got {depth}")
    if not 1 <= n <= 1024 or batch_size < 1:
        raise ValueError(f"--n must be in 1..1024 (the eval set has 1,024 prompts) and --batch-size >= 1, got {n} "
                         f"and {batch_size}")
    check_out_files({"--json": json_path})
    # the installed package's heads, never a path relative to the working folder
    heads = heads or ",".join(str(Path(DEFAULT_DIR) / name) for name in ("heads", "heads-token"))
    m = model_on(model, device, dtype)
    sc = sampling_of(cfg, 1.0, 0, 1.0)
    rows = eval_prompts(n)
    res = {"n": n, "rows": []}
    for path in [h.strip() for h in heads.split(",") if h.strip()]:
        hd = load_heads(m, path)
        acc = {"horizontal": 0.0, "vertical": 0.0, "target_entropy_nats": 0.0}
        by = {h: {c: [0.0] * depth for c in ("exact", "drafted")} for h in ("horizontal", "vertical")}
        for i in range(0, n, batch_size):
            part = rows[i:i + batch_size]
            prompts, seeds = [r["prompt"] for r in part], [eval_seed(seed, r["seed"]) for r in part]
            got = draft_acceptance(m, hd, prompts, seeds, sc)
            acc = {k: acc[k] + got[k] * len(part) / n for k in acc}
            for h, cols in chain_acceptance(m, hd, prompts, seeds, sc, depth).items():
                for c, vals in cols.items():
                    by[h][c] = [a + v * len(part) / n for a, v in zip(by[h][c], vals)]
        res["rows"].append({"heads": path, "kind": hd.cfg.kind, "params": hd.n_params(),
                            "flops_per_token_per_head": hd.flops_per_token()} | acc | {"by_offset": by})
        typer.echo(f"{path}: {hd.cfg.kind} heads, horizontal {acc['horizontal']:.3f}, vertical {acc['vertical']:.3f}")
        for h, cols in by.items():
            typer.echo(f"  {h} by offset 1..{depth}: exact " + " ".join(f"{v:.3f}" for v in cols["exact"])
                       + ", drafted " + " ".join(f"{v:.3f}" for v in cols["drafted"]))
    if json_path:
        json_path.write_text(json.dumps(res, indent=1))
