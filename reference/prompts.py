"""Prompt sets of the scenes domain: the fixed, versioned eval set and the bundled example prompts.

The eval set (1,024 prompts, a third each with 1, 2 and 3 objects) is drawn from a fixed seed and stored
in `reference/data/eval_prompts_v1.jsonl`; training never draws a scene whose caption is in it.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from .scenes import sample_scene

DATA = Path(__file__).parent / "data"
EVAL_VERSION = "v1"
EVAL_PATH = DATA / f"eval_prompts_{EVAL_VERSION}.jsonl"
EXAMPLES_PATH = DATA / "example_prompts.jsonl"
EXAMPLES_PARQUET = DATA / "example_prompts.parquet"  # the same rows, as the pipeline reads them
EVAL_SEED = 20261129


def make_eval_set() -> list[dict]:
    """Regenerate the eval set: 342 / 341 / 341 prompts with 1 / 2 / 3 objects, unique captions."""
    rng = np.random.default_rng(EVAL_SEED)
    rows, seen = [], set()
    for n_obj, count in ((1, 342), (2, 341), (3, 341)):
        while sum(r["n_objects"] == n_obj for r in rows) < count:
            scene = sample_scene(rng, n_objects=n_obj)
            if scene.caption in seen:
                continue
            seen.add(scene.caption)
            rows.append({"prompt_id": f"eval-{EVAL_VERSION}-{len(rows):04d}", "prompt": scene.caption,
                         "n_objects": n_obj, "seed": len(rows)})
    return rows


def load_jsonl(path: Path) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def eval_prompts(n: int | None = None) -> list[dict]:
    """The first n rows of the eval set (all 1,024 by default), interleaved so any prefix mixes 1-3 objects."""
    rows = load_jsonl(EVAL_PATH)
    by = [[r for r in rows if r["n_objects"] == k] for k in (1, 2, 3)]
    mixed = [r for trio in zip(*by) for r in trio] + by[0][len(by[2]):]
    return mixed[: (n or len(mixed))]


def eval_seed(run_seed: int, prompt_seed: int) -> int:
    """The seed an eval prompt decodes with under a run seed: its own seed at run seed 0 (the docs' numbers), and
    for each other run seed another (1,000,003 is a prime above every prompt's seed, so no two (run seed, prompt)
    pairs share one). The one rule every eval, bench, fidelity and calibration run derives its seeds by."""
    return run_seed * 1_000_003 + prompt_seed


def eval_captions() -> set[str]:
    return {r["prompt"] for r in load_jsonl(EVAL_PATH)}


def write_jsonl(rows: list[dict], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
