"""Rendered scene sets of the training distribution: scenes drawn from a seed, eval captions held out.

`ssdgen train-heads` distils SSD's heads on these captions (the eval set stays unseen); the lab trains the
tokenizer, the transformer and the scorer on these images (lab/reference/). Rendering is deterministic from
(n, seed, size): chunks are seeded, so the result does not depend on the number of workers, and a scene is the
same at any size.
"""

from __future__ import annotations

from multiprocessing import get_context

import numpy as np
from tqdm import tqdm

from .prompts import eval_captions
from .scenes import render, sample_scene


def _render_chunk(args: tuple[int, int, int, int]) -> tuple[np.ndarray, np.ndarray, list[str]]:
    seed, start, count, size = args
    held_out = eval_captions()
    imgs, masks, caps = [], [], []
    rng = np.random.default_rng([seed, start])
    while len(caps) < count:
        scene = sample_scene(rng)
        if scene.caption in held_out:
            continue
        img, mask = render(scene, with_mask=True, size=size)
        imgs.append(img)
        masks.append(mask)
        caps.append(scene.caption)
    return np.stack(imgs), np.stack(masks), caps


def build_dataset(n: int, seed: int, workers: int = 2, size: int = 64) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Render n training scenes -> (uint8 images [n, size, size, 3], object masks [n, size, size], captions).
    Chunks are seeded, so the result does not depend on the number of workers; a scene is the same at any size."""
    chunk = 2000
    jobs = [(seed, s, min(chunk, n - s), size) for s in range(0, n, chunk)]
    if len(jobs) == 1 or workers <= 1:  # no pool for one chunk
        parts = [_render_chunk(j) for j in jobs]
    else:
        # spawn, not fork: a forked worker of a process with threads (Ray's, Prefect's, torch's) can inherit a
        # lock held at the fork and hang for good (seen: a pool worker stuck in SemLock.__enter__)
        with get_context("spawn").Pool(workers) as pool:
            parts = list(tqdm(pool.imap(_render_chunk, jobs), total=len(jobs), desc="render", unit="chunk"))
    return (np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]),
            [c for p in parts for c in p[2]])
