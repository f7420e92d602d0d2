"""`ssdgen` commands for models and their quality: training the reference model, its scorer and SSD heads,
evaluating samples and heads, and the docs' figures. ssdgen/cli.py puts them on its one app."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Optional

import typer

from ssdgen.options import (CFG, DECODER, DEVICE, DTYPE, MODEL, SPEC_HELP, TOPK, friendly, model_on,
                            sampling_of, spec_of)

app = typer.Typer()


@app.command("train-reference")
@friendly
def train_reference(out: Path = typer.Option(..., help="bundle directory to write (reference/weights replaces "
                                                       "the shipped model)"),
                    work: Path = typer.Option(Path("runs/train-reference"),
                                              help="folder for the tokenized set, checkpoints and the curve"),
                    resume: bool = typer.Option(False, help="continue from the checkpoint in --work"),
                    until_step: Optional[int] = typer.Option(None, help="stop this sitting after this AR step"),
                    device: str = typer.Option("cpu", help="torch device, e.g. cuda"),
                    vq_from: Optional[Path] = typer.Option(None, help="take the VQ tokenizer from this bundle"),
                    seed: int = typer.Option(0, help="training seed (data, initialisation, order)"),
                    gpt_steps: Optional[int] = typer.Option(None, help="override AR training steps"),
                    n_images: Optional[int] = typer.Option(None, help="override the number of training renders"),
                    curve_prompts: Optional[int] = typer.Option(None, help="eval prompts per curve point (0 = none)")):
    """Train the VQ tokenizer and the AR model (about 4 hours on 2 CPU cores; resumable with --resume)."""
    from dataclasses import replace
    from reference.train import TrainConfig, train_reference as run
    tc = TrainConfig(seed=seed)
    tc = replace(tc, **{k: v for k, v in {"n_images": n_images, "curve_prompts": curve_prompts}.items()
                        if v is not None})
    if gpt_steps is not None:
        tc = replace(tc, gpt=replace(tc.gpt, steps=gpt_steps))
    tc = replace(tc, gpt=replace(tc.gpt, seed=seed))
    res = run(out, tc, work, resume, device, vq_from, until_step)
    typer.echo(json.dumps({k: res[k] for k in ("steps_done", "timing", "curve")}, indent=1))


@app.command("train-scorer")
@friendly
def train_scorer(out: Path = typer.Option(..., help="scorer weights file to write (reference/weights/"
                                                   "scorer.safetensors replaces the shipped one)"),
                 steps: int = typer.Option(3000, help="optimiser steps"),
                 vq: Path = typer.Option(Path("reference/weights/vq.safetensors"), help="VQ-VAE weights"),
                 device: str = typer.Option("cpu", help="torch device, e.g. cuda"),
                 workers: int = typer.Option(2, help="data-loader processes rendering the training images"),
                 n_images: int = typer.Option(48_000, help="training renders"),
                 batch: int = typer.Option(128, help="images per optimiser step")):
    """Train the scene-accuracy / FD feature network on renders and the reference VQ's reconstructions."""
    from safetensors.torch import load_file
    from reference.scorer import save_scorer, train_scorer as run
    from reference.vqvae import VQVAE, VQConfig
    if not vq.exists():
        raise FileNotFoundError(f"{vq}: no VQ-VAE weights (run `ssdgen dev train-reference` first)")
    vqm = VQVAE(VQConfig())
    vqm.load_state_dict(load_file(vq), strict=True)
    net = run(vq=vqm.eval(), steps=steps, batch=batch, n_images=n_images, device=device, workers=workers)
    save_scorer(net, out)
    typer.echo(f"wrote {out}")


@app.command("train-heads")
@friendly
def train_heads_cmd(model: Optional[str] = MODEL, out: str = typer.Option(
                        ..., help="heads path without suffix, one per kind, comma-separated, e.g. runs/heads,"
                                  "runs/heads-token (decode with heads=PATH; the shipped ones are "
                                  "reference/weights/heads and heads-token)"),
                    n_images: int = typer.Option(2048, help="the model's own samples to distil from"),
                    steps: int = typer.Option(1500, help="optimiser steps per kind"),
                    kind: str = typer.Option("latent", help="latent, token, or latent,token (both learn from one "
                                                            "set of samples)"),
                    cfg: float = CFG, top_k: int = TOPK, seed: int = typer.Option(0, help="sampling and training seed"),
                    prompts: Optional[Path] = typer.Option(None, help="text file, one prompt a line (HF models)"),
                    device: str = DEVICE, dtype: str = DTYPE):
    """Train SSD's horizontal and vertical heads by self-distillation on the frozen model's own samples (the
    heads train in fp32 whatever the model's --dtype)."""
    from decoders.ssd_train import DistillConfig, collect, train_heads
    from models.registry import ModelSpec
    kinds = [k.strip() for k in kind.split(",") if k.strip()]
    if not kinds or set(kinds) - {"latent", "token"} or len(set(kinds)) < len(kinds):
        raise ValueError(f"--kind must be latent, token or latent,token; got {kind!r}")
    dests = [Path(o.strip()) for o in out.split(",")]
    if len(dests) != len(kinds):  # before the model loads
        raise ValueError(f"--out names {len(dests)} path(s) for {len(kinds)} kind(s) ({kind})")
    m = model_on(model, device, dtype)
    if prompts is not None:
        captions = [line.strip() for line in prompts.read_text().splitlines() if line.strip()]
    elif ModelSpec.parse(model).kind == "reference":
        from reference.train_data import build_dataset
        _, _, captions = build_dataset(n_images, seed + 99)  # training-distribution captions, eval set held out
    else:
        raise ValueError("--prompts is required for Hugging Face models")
    sc = sampling_of(cfg, 1.0, top_k, 1.0)
    base = DistillConfig(n_images=n_images, steps=steps, seed=seed)
    t0 = time.perf_counter()
    data = collect(m, captions[:n_images], sc, base) if len(kinds) > 1 else None  # sampled once, for every kind
    shared = {"shared_collect_s": time.perf_counter() - t0} if data is not None else {}
    for k, dest in zip(kinds, dests):
        heads, info = train_heads(m, captions, sc, dataclasses.replace(base, kind=k), data=data)
        heads.save(dest)
        typer.echo(json.dumps(info | shared | {"kind": k, "path": str(dest)}, indent=1))


@app.command("eval-scorer")
@friendly
def eval_scorer(n: int = typer.Option(1024, help="held-out renders"),
                json_path: Optional[Path] = typer.Option(None, "--json", help="write the result here"),
                scorer: Optional[Path] = typer.Option(None, help="scorer weights (default: bundled)"),
                vq: Path = typer.Option(Path("reference/weights/vq.safetensors"), help="VQ-VAE weights")):
    """Validate the scorer: held-out renders, their VQ reconstructions, and shuffled captions."""
    from safetensors.torch import load_file
    from reference.scorer import DEFAULT_PATH, load_scorer
    from reference.validate_scorer import validate
    from reference.vqvae import VQVAE, VQConfig
    vqm = VQVAE(VQConfig())
    vqm.load_state_dict(load_file(vq), strict=True)
    res = validate(load_scorer(scorer or DEFAULT_PATH), vqm.eval(), n)
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
                     model: Optional[str] = MODEL):
    """VQ reconstruction PSNR per background kind, and above/left token agreement on real renders."""
    from reference.tokenizer_report import tokenizer_report as run
    res = run(model_on(model).vq, n)
    typer.echo(json.dumps(res, indent=1))
    if json_path:
        json_path.write_text(json.dumps(res, indent=1))


@app.command("eval")
@friendly
def eval_cmd(decoder: str = DECODER, n: int = typer.Option(1024, help="eval prompts, the first n of 1,024"),
             batch_size: int = typer.Option(64, help="prompts per decoder call"),
             seed: int = typer.Option(0, help="run seed, combined with each eval prompt's own"),
             json_path: Optional[Path] = typer.Option(None, "--json", help="write the result here"),
             model: Optional[str] = MODEL, device: str = DEVICE, dtype: str = DTYPE):
    """Decode the fixed eval prompts and report scene accuracy, object accuracy and FD."""
    from reference.evaluate import evaluate
    spec = spec_of(decoder)
    if not 1 <= n <= 1024:
        raise ValueError(f"--n must be in 1..1024 (the eval set has 1,024 prompts), got {n}")
    if batch_size < 1:
        raise ValueError(f"--batch-size must be >= 1, got {batch_size}")
    m = model_on(model, device, dtype)
    res = evaluate(m, spec, n, batch_size, seed)
    rep = res["scorer"]
    typer.echo(f"model {res['model']}  decoder {spec}  n {res['n']}  batch {batch_size}  seed {seed}")
    from decoders import plan_of
    if (plan := plan_of(spec, m)) is not None:  # a fall-back to plain AR is reported, never silent
        typer.echo(f"  note: {spec.label} decoded by its calibrated plan: " + (
            "plain AR (faster on this device at this batch size); calibrated=false scores its speculative path"
            if plan.rows == 0 else f"{plan.rows} row(s)"))
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


@app.command("figures")
@friendly
def figures(out: Path = typer.Option(..., help="folder for the PNGs and JSON (docs replaces the docs' figures)"),
            seed: int = typer.Option(0, help="added to each eval prompt's own seed"),
            model: Optional[str] = MODEL, n: int = typer.Option(256, help="eval prompts for CSD"),
            csd: str = typer.Option("csd", help="the CSD decode spec whose commit maps to show; "
                                    "its sampling settings are the AR grid's too. " + SPEC_HELP)):
    """docs/ figures: a 4x4 grid of AR samples for 16 eval prompts, and CSD's commit maps with where its
    relaxed acceptances fall (objects, smooth and detailed background)."""
    import numpy as np

    from decoders.spec import DecodeSpec
    from reference.commit_maps import content_awareness, overlay
    from reference.evaluate import generate
    from reference.figures import captioned_grid
    from reference.prompts import eval_prompts
    spec = spec_of(csd)
    m = model_on(model)  # on the CPU in fp32
    out.mkdir(parents=True, exist_ok=True)
    rows = eval_prompts(16)
    prompts, seeds = [r["prompt"] for r in rows], [seed + r["seed"] for r in rows]
    images, _, _ = generate(m, prompts, seeds, DecodeSpec("ar", (), spec.sampling), 16)
    captioned_grid(list(images), prompts).save(out / "samples_grid.png")
    rows = eval_prompts(n)
    prompts, seeds = [r["prompt"] for r in rows], [seed + r["seed"] for r in rows]
    images, stats, _ = generate(m, prompts, seeds, spec, 16, desc=spec.label)  # speculation's cheap batch on a CPU
    maps = [s.commit_map for s in stats]
    report = {"decoder": str(spec), "n": len(prompts),
              "forwards_per_image": float(np.mean([s.forwards for s in stats]))}
    report |= content_awareness(prompts, images, maps)
    (out / "csd_content_awareness.json").write_text(json.dumps(report, indent=1))
    pick = list(range(8))
    captioned_grid([images[i] for i in pick], [prompts[i] for i in pick], cols=4,
                   extra=[overlay(images[i], maps[i]) for i in pick]).save(out / "csd_commit_maps.png")
    typer.echo(json.dumps(report, indent=1))


@app.command("eval-heads")
@friendly
def eval_heads(heads: str = typer.Option("reference/weights/heads,reference/weights/heads-token",
                                         help="comma-separated heads paths (without suffix)"),
               n: int = typer.Option(64, help="eval prompts"),
               batch_size: int = typer.Option(64, help="prompts per teacher-forced forward"),
               seed: int = typer.Option(0, help="added to each eval prompt's own seed"),
               cfg: float = CFG, model: Optional[str] = MODEL,
               json_path: Optional[Path] = typer.Option(None, "--json", help="write the result here"),
               device: str = DEVICE, dtype: str = DTYPE):
    """Draft acceptance of SSD heads with exact context (teacher forcing), e.g. latent against token heads."""
    from decoders import load_heads
    from decoders.ssd_train import draft_acceptance
    from reference.prompts import eval_prompts
    m = model_on(model, device, dtype)
    sc = sampling_of(cfg, 1.0, 0, 1.0)
    rows = eval_prompts(n)
    res = {"n": n, "rows": []}
    for path in [h.strip() for h in heads.split(",") if h.strip()]:
        hd = load_heads(m, path)
        acc = {"horizontal": 0.0, "vertical": 0.0, "target_entropy_nats": 0.0}
        for i in range(0, n, batch_size):
            part = rows[i:i + batch_size]
            got = draft_acceptance(m, hd, [r["prompt"] for r in part], [seed + r["seed"] for r in part], sc)
            acc = {k: acc[k] + got[k] * len(part) / n for k in acc}
        res["rows"].append({"heads": path, "kind": hd.cfg.kind, "params": hd.n_params(),
                            "flops_per_token_per_head": hd.flops_per_token()} | acc)
        typer.echo(f"{path}: {hd.cfg.kind} heads, horizontal {acc['horizontal']:.3f}, vertical {acc['vertical']:.3f}")
    if json_path:
        json_path.write_text(json.dumps(res, indent=1))
