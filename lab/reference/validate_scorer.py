"""`python -m lab eval-scorer`: how far the scene-accuracy scorer can be trusted.

On held-out renders of the 1,024 eval captions (captions the scorer never trained on) it must call
nearly every scene correct; on the tokenizer's reconstructions of those renders it must still do so
(generated images reach the scorer through the VQ decoder); and with the captions shuffled between
images it must call nearly every scene wrong.
"""

from __future__ import annotations

import numpy as np
import torch

from ssdgen.reference.evaluate import real_images
from ssdgen.reference.prompts import eval_prompts
from ssdgen.reference.scorer import score


def validate(net, vq, n: int = 1024, seed: int = 0) -> dict:
    rows = eval_prompts(n)
    prompts = [r["prompt"] for r in rows]
    images = real_images(prompts, [r["seed"] + 1_000_000 * (seed + 1) for r in rows])
    with torch.no_grad():
        recon = torch.cat([vq.decode(vq.encode(torch.from_numpy(images[i:i + 256])))
                           for i in range(0, len(images), 256)]).numpy()
    shuffled = list(np.roll(prompts, 1))  # each image judged against its neighbour's caption
    return {
        "n": len(prompts),
        "renders": score(net, images, prompts),
        "reconstructions": score(net, recon, prompts),
        "shuffled_captions": score(net, images, shuffled),
    }
