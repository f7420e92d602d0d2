"""Pipeline overhead benchmark (not a test): `ssdgen generate` end to end against the bare decoder loop.

Both decode the same eval prompts with the same seeds, decoder, batch size and torch threads, in one run:
  - bare: one process, `decoders.decode` + the VQ decoder over the batches, nothing else;
  - pipeline: the Prefect flow with one Ray actor holding all the threads, from the flow call to its return:
    planning, Ray start, actor start and model load, reading prompts, PNG encoding, Parquet writes, commit
    markers, manifest, summary, artifacts.
The pipeline is run twice: first with Prefect's ephemeral API starting inside the call (a first run on a
fresh machine pays this), then again with that server already up (what a scheduled deployment sees).
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq


def run(n: int = 128, decoder: str = "ar", batch_size: int = 16, threads: int = 2, shard_size: int = 32,
        log=print) -> dict:
    import torch
    from ssdgen.decoders import build
    from ssdgen.decoders.spec import DecodeSpec
    from ssdgen.inputs.files import derive_seed
    from ssdgen.flows.pipeline import RunSettings, generate
    from ssdgen.reference.prompts import eval_prompts
    from ssdgen.models.registry import load_model

    rows = [{"prompt_id": r["prompt_id"], "prompt": r["prompt"]} for r in eval_prompts(n)]
    work = Path(tempfile.mkdtemp(prefix="ssdgen-bench-pipeline-"))
    src = work / "prompts.parquet"
    pq.write_table(pa.Table.from_pylist(rows), src)
    seeds = [derive_seed(0, r["prompt_id"]) for r in rows]  # the seeds the pipeline derives

    torch.set_num_threads(threads)
    model = load_model("reference")
    dec = build(DecodeSpec.parse(decoder), model)
    if dec.spec.calibrated:  # resolved once, here, and both paths below decode by the same concrete spec
        dec = dec.resolve([r["prompt"] for r in rows], seeds, batch_size)
        log(f"{decoder} resolves to {dec} at batch {batch_size}")
    spec = dec.spec
    t0 = time.perf_counter()
    for i in range(0, n, batch_size):
        res = dec.decode([r["prompt"] for r in rows[i:i + batch_size]], seeds[i:i + batch_size])
        model.decode_images(res.tokens)
    bare_s = time.perf_counter() - t0
    log(f"bare decoder loop: {n} images in {bare_s:.1f} s ({n / bare_s:.3f} img/s)")

    out = {"n": n, "decoder": decoder, "batch_size": batch_size, "threads": threads, "shard_size": shard_size,
           "bare_seconds": bare_s, "bare_images_per_s": n / bare_s}
    for label in ("cold_prefect", "warm_prefect"):
        t0 = time.perf_counter()
        s = generate(RunSettings(prompts=[str(src)], out=str(work / label), decoder=spec, batch_size=batch_size,
                                 shard_size=shard_size, actors=1, cpus_per_actor=float(threads)), progress=False)
        wall = time.perf_counter() - t0
        assert s["images_ok"] == n, s
        out[label] = {"seconds": wall, "images_per_s": n / wall, "ratio_vs_bare": (n / wall) / (n / bare_s),
                      "model_load_s": s["model_load_device_seconds"] / threads, "startup_s": s["startup_s"],
                      "steady_images_per_s": s["images_per_s_steady"],
                      "steady_ratio_vs_bare": s["images_per_s_steady"] / (n / bare_s),
                      "utilization": s["utilization"]}
        log(f"pipeline ({label}): {n} images in {wall:.1f} s ({n / wall:.3f} img/s), "
            f"{out[label]['ratio_vs_bare']:.1%} of bare; after {s['startup_s']:.1f} s of startup "
            f"{out[label]['steady_ratio_vs_bare']:.1%} of bare")
    return out


def main(**kw) -> dict:
    res = run(**kw)
    print(json.dumps(res, indent=1))
    return res
