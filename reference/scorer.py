"""Scene accuracy from pixels alone, in the spirit of GenEval, and the feature network for FD.

A small CNN trained on the scenes domain reads an image and predicts, for each of the 9 grid cells,
whether an object is there and its shape, colour, size and fill, plus the background kind and colour.
Comparing those predictions with what the caption names gives:
  - object correct: the named object is present at its position with the right shape and colour;
  - scene correct: every named object correct, the background of the named kind, and no unnamed object;
  - per-attribute accuracies (presence, shape, colour, size, fill, background kind and colour, extras).
Its 256-d penultimate layer plays the role Inception plays for FID (see `fd.py`).

It is trained on renders and on VQ reconstructions of renders, because generated images reach the
scorer through the VQ decoder; it is validated on held-out renders of both kinds. Both are the lab's
(lab/reference/train_scorer.py, lab/reference/validate_scorer.py); this module only loads and applies it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import load_file

from . import captions as cap
from .scenes import BACKGROUNDS, BG_COLOURS, COLOURS, FILLS, GRID, SHAPES, SIZE, SIZES, Scene

HEADS = {"present": 2, "shape": len(SHAPES), "colour": len(COLOURS), "size": len(SIZES), "fill": len(FILLS)}
N_CELLS = GRID * GRID
DEFAULT_PATH = Path(__file__).parent / "weights" / "scorer.safetensors"
FEATURE_DIM = 256


class SceneNet(nn.Module):
    def __init__(self):
        super().__init__()
        def block(i, o):
            return nn.Sequential(nn.Conv2d(i, o, 3, padding=1), nn.BatchNorm2d(o), nn.ReLU())
        self.conv = nn.Sequential(
            nn.Conv2d(3, 32, 4, stride=2, padding=1), nn.BatchNorm2d(32), nn.ReLU(),  # 32x32
            block(32, 64), nn.MaxPool2d(2),  # 16x16
            block(64, 96), block(96, 96), nn.MaxPool2d(2),  # 8x8
            block(96, 128),
        )
        self.fc = nn.Sequential(nn.Flatten(), nn.Linear(128 * 8 * 8, FEATURE_DIM), nn.ReLU())
        self.cell_heads = nn.ModuleDict({k: nn.Linear(FEATURE_DIM, N_CELLS * n) for k, n in HEADS.items()})
        self.bg_kind = nn.Linear(FEATURE_DIM, len(BACKGROUNDS))
        self.bg_colour = nn.Linear(FEATURE_DIM, len(BG_COLOURS))

    @staticmethod
    def prep(images: torch.Tensor) -> torch.Tensor:
        """uint8 [N, 64, 64, 3] -> float [N, 3, 64, 64]."""
        return images.permute(0, 3, 1, 2).float() / 127.5 - 1.0

    def features(self, images: torch.Tensor) -> torch.Tensor:
        return self.fc(self.conv(self.prep(images)))  # [N, 256]

    def forward(self, images: torch.Tensor) -> dict[str, torch.Tensor]:
        f = self.features(images)
        out = {k: h(f).view(len(f), N_CELLS, -1) for k, h in self.cell_heads.items()}  # [N, 9, n]
        out["bg_kind"], out["bg_colour"] = self.bg_kind(f), self.bg_colour(f)
        out["features"] = f
        return out


def load_scorer(path: Path | str = DEFAULT_PATH) -> SceneNet:
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no scorer weights (train them from a checkout: `python -m lab train-scorer`)")
    net = SceneNet()
    net.load_state_dict(load_file(path), strict=True)
    return net.eval()


# --------------------------------------------------------------------------- scoring

@dataclass
class Judgement:
    scene_correct: bool
    objects_correct: list[bool]
    attrs: dict[str, list[bool]]  # per named object: present, shape, colour, size, fill
    background_kind: bool
    background_colour: bool
    extras: int  # objects found in cells the caption does not name


def at_scorer_size(images: torch.Tensor) -> torch.Tensor:
    """uint8 [N, s, s, 3] with s = 64 * k -> uint8 [N, 64, 64, 3] by k x k area averages: the scorer judges v3's
    128-pixel images on the 64-pixel canvas it was trained on (its accuracy on downsampled real 128-pixel renders
    is in docs/reference-model.md)."""
    side = images.shape[1]
    if side == SIZE:
        return images
    if side % SIZE or images.shape[2] != side:
        raise ValueError(f"the scorer takes square images of 64 * k pixels, got {tuple(images.shape[1:3])}")
    x = F.avg_pool2d(images.permute(0, 3, 1, 2).float(), side // SIZE)
    return x.round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1).contiguous()


@torch.no_grad()
def predict(net: SceneNet, images: np.ndarray | torch.Tensor, batch: int = 256) -> dict[str, np.ndarray]:
    images = at_scorer_size(torch.as_tensor(images))
    outs = [net(images[i:i + batch]) for i in range(0, len(images), batch)]
    pred = {k: torch.cat([o[k] for o in outs]).argmax(-1).numpy() for k in list(HEADS) + ["bg_kind", "bg_colour"]}
    pred["features"] = torch.cat([o["features"] for o in outs]).numpy()
    return pred


def judge(spec: Scene, pred: dict[str, np.ndarray], i: int) -> Judgement:
    attrs = {k: [] for k in HEADS}
    objects_correct = []
    for o in spec.objects:
        c = o.cell
        ok = {"present": pred["present"][i, c] == 1,
              "shape": pred["shape"][i, c] == SHAPES.index(o.shape),
              "colour": pred["colour"][i, c] == list(COLOURS).index(o.colour),
              "size": pred["size"][i, c] == list(SIZES).index(o.size),
              "fill": pred["fill"][i, c] == FILLS.index(o.fill)}
        for k, v in ok.items():
            attrs[k].append(bool(v))
        objects_correct.append(bool(ok["present"] and ok["shape"] and ok["colour"]))
    named = {o.cell for o in spec.objects}
    extras = int(sum(pred["present"][i, c] == 1 for c in range(N_CELLS) if c not in named))
    bg_kind = bool(pred["bg_kind"][i] == BACKGROUNDS.index(spec.background))
    bg_col = bool(pred["bg_colour"][i] == list(BG_COLOURS).index(spec.bg_colour))
    return Judgement(all(objects_correct) and bg_kind and extras == 0, objects_correct, attrs, bg_kind, bg_col, extras)


def judgements(net: SceneNet, images: np.ndarray, prompts: list[str]) -> list[Judgement]:
    """One Judgement per image [N, 64, 64, 3] uint8 against the scene its prompt names."""
    pred = predict(net, images)
    return [judge(cap.parse(p), pred, i) for i, p in enumerate(prompts)]


def score(net: SceneNet, images: np.ndarray, prompts: list[str]) -> dict:
    """Scene accuracy report for images [N, 64, 64, 3] uint8 generated for prompts."""
    js = judgements(net, images, prompts)
    n_obj = np.array([len(j.objects_correct) for j in js])
    report = {
        "n": len(js),
        "scene_accuracy": float(np.mean([j.scene_correct for j in js])),
        "object_accuracy": float(np.mean([c for j in js for c in j.objects_correct])),
        "attributes": {k: float(np.mean([v for j in js for v in j.attrs[k]])) for k in HEADS},
        "background_kind": float(np.mean([j.background_kind for j in js])),
        "background_colour": float(np.mean([j.background_colour for j in js])),
        "images_with_extra_objects": float(np.mean([j.extras > 0 for j in js])),
        "scene_accuracy_by_objects": {int(k): float(np.mean([j.scene_correct for j, m in zip(js, n_obj) if m == k]))
                                      for k in sorted(set(n_obj.tolist()))},
    }
    return report
