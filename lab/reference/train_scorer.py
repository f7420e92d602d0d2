"""Training the scorer (ssdgen.reference.scorer's SceneNet): per-cell and background labels from the scene a
caption names, the loss over every head, and the training loop on renders and, half the time, on the reference
VQ's reconstructions of the same renders (generated images reach the scorer through the VQ decoder). Training
captions exclude the eval set, like the AR model's: the renders are ssdgen.reference.scene_sets'.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from tqdm import tqdm

from ssdgen.reference import captions as cap
# the same held-out rendering as the AR model's training set
from ssdgen.reference.scene_sets import build_dataset
from ssdgen.reference.scenes import BACKGROUNDS, BG_COLOURS, COLOURS, FILLS, SHAPES, SIZES, Scene
from ssdgen.reference.scorer import DEFAULT_PATH, HEADS, N_CELLS, SceneNet


def targets(scenes: list[Scene]) -> dict[str, torch.Tensor]:
    """Per-cell labels [N, 9] (-100 where no object: ignored by cross-entropy) and background labels [N]."""
    t = {k: torch.full((len(scenes), N_CELLS), -100, dtype=torch.long) for k in HEADS}
    t["present"].fill_(0)
    for i, s in enumerate(scenes):
        for o in s.objects:
            t["present"][i, o.cell] = 1
            t["shape"][i, o.cell] = SHAPES.index(o.shape)
            t["colour"][i, o.cell] = list(COLOURS).index(o.colour)
            t["size"][i, o.cell] = list(SIZES).index(o.size)
            t["fill"][i, o.cell] = FILLS.index(o.fill)
    t["bg_kind"] = torch.tensor([BACKGROUNDS.index(s.background) for s in scenes])
    t["bg_colour"] = torch.tensor([list(BG_COLOURS).index(s.bg_colour) for s in scenes])
    return t


def loss_fn(out: dict, t: dict) -> torch.Tensor:
    loss = sum(F.cross_entropy(out[k].reshape(-1, out[k].shape[-1]), t[k].reshape(-1), ignore_index=-100)
               for k in HEADS)
    return loss + F.cross_entropy(out["bg_kind"], t["bg_kind"]) + F.cross_entropy(out["bg_colour"], t["bg_colour"])


def train_scorer(vq=None, steps: int = 3000, batch: int = 128, n_images: int = 48_000, seed: int = 7,
                 device: str = "cpu", workers: int = 2) -> SceneNet:
    """Train on renders (and, given a VQ-VAE, on its reconstructions of the same renders, half the time).
    Training captions exclude the eval set, like the AR model's."""
    torch.manual_seed(seed)
    images, _, caps = build_dataset(n_images, seed, workers)
    images = torch.from_numpy(images)
    t_all = targets([cap.parse(c) for c in caps])
    recon = None
    if vq is not None:
        vq = vq.to(device)
        with torch.no_grad():
            recon = torch.cat([vq.decode(vq.encode(images[i:i + 1000].to(device))).cpu()
                               for i in tqdm(range(0, n_images, 1000), desc="vq round-trip", unit="batch")])
    net = SceneNet().to(device)
    opt = torch.optim.AdamW(net.parameters(), lr=2e-3, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=2e-3, total_steps=steps, pct_start=0.1)
    gen = torch.Generator().manual_seed(seed)
    bar = tqdm(range(steps), desc="scorer", unit="step")
    for step in bar:
        idx = torch.randint(0, n_images, (batch,), generator=gen)
        x = images[idx]
        if recon is not None:
            use_recon = torch.rand(batch, generator=gen) < 0.5
            x = torch.where(use_recon[:, None, None, None], recon[idx], x)
        out = net(x.to(device))
        loss = loss_fn(out, {k: v[idx].to(device) for k, v in t_all.items()})
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        if step % 20 == 0:
            bar.set_postfix(loss=f"{loss.item():.3f}")
    return net.cpu().eval()


def save_scorer(net: SceneNet, path: Path = DEFAULT_PATH) -> None:
    save_file({k: v.contiguous() for k, v in net.state_dict().items()}, path)
