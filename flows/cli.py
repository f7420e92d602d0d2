"""The `ssdgen` command line. Arguments are parsed here, at the edge, into typed configs.

Errors users can cause (bad captions, bad parameters, missing files) print one clear line and exit 2;
they never end in a raw stack trace.
"""

from __future__ import annotations

import functools
import json
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


def _sampling(cfg: float, temperature: float, top_k: int, top_p: float):
    from decoders.sampling import SamplingConfig
    return SamplingConfig(cfg_scale=cfg, temperature=temperature, top_k=top_k, top_p=top_p)


def _model(model: Optional[str]):
    from reference.model import ReferenceModel
    if model in (None, "reference"):
        return ReferenceModel()
    if model.startswith("reference:"):
        return ReferenceModel(model.split(":", 1)[1])
    raise ValueError(f"unknown model {model!r}; use 'reference' or 'reference:/path/to/bundle'")


CFG = typer.Option(3.0, "--cfg", help="classifier-free guidance scale (1 = off)")
TEMP = typer.Option(1.0, help="sampling temperature (0 = greedy)")
TOPK = typer.Option(0, "--top-k", help="keep the k most likely tokens (0 = off)")
TOPP = typer.Option(1.0, "--top-p", help="nucleus sampling mass (1 = off)")
MODEL = typer.Option(None, help="model: 'reference' (default) or 'reference:/path/to/bundle'")


@app.command("train-reference")
@friendly
def train_reference(out: Path = typer.Option(Path("reference/weights"), help="bundle directory to write"),
                    seed: int = 0, gpt_steps: int = typer.Option(None, help="override AR training steps"),
                    vq_steps: int = typer.Option(None, help="override VQ-VAE training steps")):
    """Train the VQ tokenizer and the AR model from scratch (CPU, about 90 minutes)."""
    from dataclasses import replace
    from reference.train import TrainConfig, train_reference as run
    tc = TrainConfig(seed=seed)
    tc = replace(tc, **{k: v for k, v in {"gpt_steps": gpt_steps, "vq_steps": vq_steps}.items() if v is not None})
    typer.echo(json.dumps(run(out, tc), indent=1))


@app.command("train-scorer")
@friendly
def train_scorer(out: Path = typer.Option(None, help="scorer weights file"), steps: int = 2500,
                 vq: Path = typer.Option(Path("reference/weights/vq.safetensors"), help="VQ-VAE weights")):
    """Train the scene-accuracy / FD feature network on renders and the reference VQ's reconstructions."""
    from safetensors.torch import load_file
    from reference.scorer import DEFAULT_PATH, save_scorer, train_scorer as run
    from reference.vqvae import VQVAE, VQConfig
    if not vq.exists():
        raise FileNotFoundError(f"{vq}: no VQ-VAE weights (run `ssdgen train-reference` first)")
    vqm = VQVAE(VQConfig())
    vqm.load_state_dict(load_file(vq), strict=True)
    net = run(vq=vqm.eval(), steps=steps)
    save_scorer(net, out or DEFAULT_PATH)
    typer.echo(f"wrote {out or DEFAULT_PATH}")


@app.command()
@friendly
def sample(prompt: list[str] = typer.Option(..., help="caption; repeat for several"),
           n: int = typer.Option(4, help="images per prompt"), out: Path = typer.Option(Path("grid.png")),
           seed: int = 0, decoder: str = "ar", cfg: float = CFG, temperature: float = TEMP, top_k: int = TOPK,
           top_p: float = TOPP, model: Optional[str] = MODEL):
    """Sample images for prompts and save them as one grid PNG (a row per prompt)."""
    import numpy as np
    from PIL import Image
    from decoders import decode
    if n < 1:
        raise ValueError(f"--n must be >= 1, got {n}")
    sc = _sampling(cfg, temperature, top_k, top_p)
    m = _model(model)
    prompts = [p for p in prompt for _ in range(n)]
    seeds = [seed + i for i in range(len(prompts))]
    res = decode(decoder, m, prompts, seeds, sc)
    imgs = m.decode_images(res.tokens).numpy()
    rows = [np.concatenate(list(imgs[i * n:(i + 1) * n]), axis=1) for i in range(len(prompt))]
    Image.fromarray(np.concatenate(rows, axis=0)).save(out)
    fwd = np.mean([s.forwards for s in res.stats])
    typer.echo(f"wrote {out} ({len(prompts)} images, {fwd:.0f} forwards per image)")


@app.command()
@friendly
def demo(out: Path = typer.Option(Path("out"), help="output folder"), decoder: str = "ar",
         batch_size: int = 8, cfg: float = CFG, model: Optional[str] = MODEL):
    """Generate images for the bundled example prompts into OUT (the embedded default job)."""
    import numpy as np
    from PIL import Image
    from reference.evaluate import generate
    from reference.prompts import EXAMPLES_PATH, load_jsonl
    rows = load_jsonl(EXAMPLES_PATH)
    m = _model(model)
    images, stats, secs = generate(m, [r["prompt"] for r in rows], [r["seed"] for r in rows], decoder,
                                   _sampling(cfg, 1.0, 0, 1.0), batch_size)
    out.mkdir(parents=True, exist_ok=True)
    for r, img in zip(rows, images):
        Image.fromarray(img).resize((256, 256), Image.NEAREST).save(out / f"{r['prompt_id']}.png")
    Image.fromarray(np.concatenate(list(images), axis=1)).save(out / "grid.png")
    (out / "prompts.json").write_text(json.dumps(rows, indent=1))
    typer.echo(f"{len(rows)} images in {secs:.1f} s -> {out.resolve()}/ (grid.png, example-*.png, prompts.json)")


@app.command("eval")
@friendly
def eval_cmd(decoder: str = "ar", n: int = 1024, batch_size: int = 64, seed: int = 0,
             json_path: Optional[Path] = typer.Option(None, "--json", help="write the result here"),
             cfg: float = CFG, temperature: float = TEMP, top_k: int = TOPK, top_p: float = TOPP,
             model: Optional[str] = MODEL):
    """Decode the fixed eval prompts and report scene accuracy, object accuracy and FD."""
    from reference.evaluate import evaluate
    if not 1 <= n <= 1024:
        raise ValueError(f"--n must be in 1..1024 (the eval set has 1,024 prompts), got {n}")
    if batch_size < 1:
        raise ValueError(f"--batch-size must be >= 1, got {batch_size}")
    res = evaluate(_model(model), decoder, n, batch_size, seed, _sampling(cfg, temperature, top_k, top_p))
    rep = res["scorer"]
    typer.echo(f"model {res['model']}  decoder {decoder}  n {res['n']}  batch {batch_size}  seed {seed}")
    for k in ("scene_accuracy", "object_accuracy", "fd", "fd_real_heldout", "forwards_per_image",
              "seconds_per_image"):
        typer.echo(f"  {k:<22} {res[k]:.4f}")
    for k, v in rep["attributes"].items():
        typer.echo(f"  attribute {k:<12} {v:.4f}")
    for k in ("background_kind", "background_colour", "images_with_extra_objects"):
        typer.echo(f"  {k:<22} {rep[k]:.4f}")
    for k, v in rep["scene_accuracy_by_objects"].items():
        typer.echo(f"  scene accuracy, {k} object(s): {v:.4f}")
    if json_path:
        keys = ("model", "decoder", "n", "batch_size", "seed", "scene_accuracy", "object_accuracy", "fd",
                "forwards_per_image", "seconds_per_image")
        out = {k: res[k] for k in keys} | {"fd_real_heldout": res["fd_real_heldout"], "details": res}
        json_path.write_text(json.dumps(out, indent=1))
        typer.echo(f"wrote {json_path}")


def main():
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    app()


if __name__ == "__main__":
    sys.exit(main())
