"""`python -m lab train-reference`: train the VQ tokenizer and the AR model from scratch, resumably.

Stages, each deterministic from the seed: render a training set of scenes (eval captions held out), train
the VQ-VAE (or take one from an existing bundle), tokenize the set once, then train the AR transformer
(lab/reference/train_gpt.py) with checkpoints in a work folder, so the run can be spread over sittings.
`PRESETS` names each shipped model's settings: v2 (64-pixel renders, 16x16 tokens, from scratch) and v3
(128-pixel renders, 32x32 tokens, warm-started from v2's transformer and tokenizer).
Weights are written as safetensors with a JSON config and a SHA-256 manifest that loading checks.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from tqdm import tqdm

from ssdgen.decoders import build
from ssdgen.decoders.spec import DecodeSpec
# imported up front: a long run must not pick up code edited while it trains
from ssdgen.reference.evaluate import generate
from ssdgen.reference.gpt import GPTConfig
from ssdgen.reference.model import ReferenceModel
from ssdgen.reference.prompts import eval_prompts
from ssdgen.reference.scene_sets import build_dataset
from ssdgen.reference.scorer import load_scorer, score
from ssdgen.reference.vqvae import VQVAE, VQConfig
from ssdgen.reference.weights import BUNDLE_NAME, load_bundle, save_bundle, sha256

from .figures import learning_curve_plot
from .train_data import cached_tokenized_set
from .train_gpt import GPTTrainConfig, cosine_lr, train_gpt


@dataclass(frozen=True)
class TrainConfig:
    seed: int = 0
    n_images: int = 60_000
    vq_steps: int = 1100
    vq_batch: int = 64
    vq_crop: int = 32  # train on random crops: convolutions don't care, and a step costs a quarter
    vq_fg_weight: float = 6.0  # extra loss weight on object pixels
    vq_lr: float = 2e-3
    curve_prompts: int = 256  # eval prompts per learning-curve point
    name: str = BUNDLE_NAME  # the bundle's name, which the model is known by
    image_size: int = 64  # pixels per side of the renders; the VQ-VAE makes image_size / 4 tokens per side
    vq: VQConfig = VQConfig()
    gpt: GPTTrainConfig = field(default_factory=GPTTrainConfig)

    def __post_init__(self):
        if self.image_size != 4 * self.gpt.gpt.grid:
            raise ValueError(f"{self.image_size}-pixel renders make a {self.image_size // 4}x{self.image_size // 4} "
                             f"token grid, but the transformer's grid is {self.gpt.gpt.grid}")


# v3: the same transformer shape as v2 (its weights carry over; docs/reference-model.md says why this shape),
# on 32x32 tokens; half of v2's samples, at a lower peak rate, since it starts from v2
PRESETS = {
    "v2": TrainConfig(),
    "v3": TrainConfig(name="scenes-reference-v3", image_size=128, gpt=GPTTrainConfig(
        steps=2000, batch=32, lr=1e-3, warmup=100, precision="bf16",
        gpt=GPTConfig(grid=32, dim=256, n_layers=6, n_heads=8, mlp_hidden=688))),
}


def train_vq(images: np.ndarray, masks: np.ndarray, tc: TrainConfig) -> VQVAE:
    """Reconstruction loss is weighted up on objects (they are ~10% of pixels but all of the scene's
    meaning), and the codebook's EMA k-means is weighted alike, so object patches get their share of codes."""
    gen = torch.Generator().manual_seed(tc.seed)
    torch.manual_seed(tc.seed)
    vq = VQVAE(tc.vq)
    opt = torch.optim.Adam([p for p in vq.parameters() if p.requires_grad], lr=tc.vq_lr)
    data, fg = torch.from_numpy(images), torch.from_numpy(masks)
    bar = tqdm(range(tc.vq_steps), desc="vq-vae", unit="step")
    for step in bar:
        for g in opt.param_groups:
            g["lr"] = cosine_lr(step, tc.vq_steps, tc.vq_lr, 50)
        idx = torch.randint(0, len(data), (tc.vq_batch,), generator=gen)
        ox, oy = (torch.randint(0, (tc.image_size - tc.vq_crop) // 4 + 1, (2,), generator=gen) * 4).tolist()
        crop = (idx, slice(oy, oy + tc.vq_crop), slice(ox, ox + tc.vq_crop))
        x = VQVAE.to_input(data[crop])
        w = 1.0 + tc.vq_fg_weight * fg[crop].float().unsqueeze(1) / 255  # [B, 1, crop, crop]
        rec, commit, codes = vq(x, token_weight=F.avg_pool2d(w, 4).squeeze(1))
        err = rec - x
        loss = (w * (err ** 2 + 0.5 * err.abs())).mean() / w.mean() + tc.vq.commitment * commit
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % 25 == 0 and step < tc.vq_steps * 0.8:  # step 0 seeds the whole codebook from data
            with torch.no_grad():
                vq.restart_dead_codes(vq.encoder(x), gen, min_count=float("inf") if step == 0 else 0.5)
        if step % 10 == 0:
            psnr = 10 * math.log10(4.0 / F.mse_loss(rec, x).item())
            bar.set_postfix(psnr=f"{psnr:.1f}", used=int((vq.ema_count > 0.5).sum()))
    return vq.eval()


def curve_point(gpt, vq, n: int, batch_size: int = 64) -> dict:
    """Object and scene accuracy of AR samples (CFG 3, temperature 1) on the first n eval prompts."""
    rows = eval_prompts(n)
    prompts = [r["prompt"] for r in rows]
    try:
        model = ReferenceModel.from_modules(gpt, vq)
        images, _, _ = generate(model, prompts, [r["seed"] for r in rows], build(DecodeSpec(), model), batch_size,
                                desc="curve")
    finally:
        gpt.clear_caches()
    rep = score(load_scorer(), images, prompts)
    return {"n": n, "object_accuracy": rep["object_accuracy"], "scene_accuracy": rep["scene_accuracy"],
            "scene_accuracy_by_objects": rep["scene_accuracy_by_objects"],
            "images_with_extra_objects": rep["images_with_extra_objects"]}


def _vq_stage(work: Path, tc: TrainConfig, vq_from: Path | None, device: torch.device) -> tuple[VQVAE, dict]:
    path = work / "vq.safetensors"
    t = time.time()
    if not path.exists():
        if vq_from is not None:  # an existing bundle's tokenizer, e.g. to retrain only the AR model
            shutil.copyfile(load_bundle(vq_from).path / "vq.safetensors", path)
        else:
            images, masks, _ = build_dataset(tc.n_images, tc.seed, size=tc.image_size)
            save_file({k: v.contiguous() for k, v in train_vq(images, masks, tc).state_dict().items()}, path)
    vq = VQVAE(tc.vq)
    vq.load_state_dict(load_file(path), strict=True)
    return vq.to(device).eval().requires_grad_(False), {"vq_s": time.time() - t, "vq_from": str(vq_from or "")}


def _warm_source(tc: TrainConfig, warm_from: Path | None) -> tuple[TrainConfig, dict | None]:
    """The settings with the warm-start source's SHA-256 recorded, and its transformer's tensors."""
    if warm_from is None:
        return tc, None
    bundle = load_bundle(warm_from)
    digest = bundle.checksums["gpt.safetensors"]
    return replace(tc, gpt=replace(tc.gpt, warm_from=digest)), bundle.gpt.state_dict()


def train_reference(out_dir: Path, tc: TrainConfig = TrainConfig(), work: Path = Path("runs/train-reference"),
                    resume: bool = False, device: str = "cpu", vq_from: Path | None = None,
                    until_step: int | None = None, warm_from: Path | None = None) -> dict:
    """Run (or continue) all stages; writes the bundle to out_dir once the AR model's last step is done.
    Returns the summary: settings, per-stage seconds (summed over sittings), the learning curve.
    warm_from: a bundle whose transformer the AR model starts from (train_gpt.warm_state)."""
    dev = torch.device(device)
    tc, warm = _warm_source(tc, warm_from)
    work.mkdir(parents=True, exist_ok=True)
    timing_path = work / "timing.json"
    timing = json.loads(timing_path.read_text()) if resume and timing_path.exists() else {}
    vq, t = _vq_stage(work, tc, vq_from, dev)
    timing.setdefault("vq", t)
    t0 = time.time()
    data = cached_tokenized_set(work, tc.n_images, tc.seed, vq, sha256(work / "vq.safetensors"), tc.image_size)
    timing.setdefault("data_s", time.time() - t0)
    timing_path.write_text(json.dumps(timing, indent=1))
    evaluate = (lambda g: curve_point(g, vq, tc.curve_prompts)) if tc.curve_prompts else None
    gpt, state = train_gpt(data, tc.gpt, work, resume, dev, until_step, evaluate, warm)
    timing |= {"gpt_s": state["train_seconds"], "gpt_cpu_s": state["cpu_seconds"]}
    summary = {"train_config": asdict(tc), "timing": timing,
               "steps_done": state["step"], "curve": state["curve"], "torch_threads": torch.get_num_threads(),
               "device": str(dev), "gpt_params": sum(p.numel() for p in gpt.parameters()),
               "vq_params": sum(p.numel() for p in vq.parameters())}
    (work / "curve.json").write_text(json.dumps(state["curve"], indent=1))
    if state["curve"]:
        learning_curve_plot(state["curve"], work / "learning_curve.png")
    if state["step"] >= tc.gpt.steps:
        save_bundle(out_dir, vq.cpu(), gpt.cpu(), summary, tc.name)
    return summary
