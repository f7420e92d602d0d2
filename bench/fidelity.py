"""`ssdgen fidelity`: each decoder against `ar` on the same prompts with independent seeds.

For every decoder spec (and an `ar` control: a second AR sample set, which shows the noise):
- the NLL per token of its committed tokens under the target (`decoders.fidelity.target_nll`) and the gap
  to the AR reference set, with 95% and 99% paired-bootstrap intervals over prompts;
- `indistinguishable`: the 99% interval covers 0, so a lossless decoder is misjudged about 1 time in 100;
- `within_tolerance`: the 95% interval lies inside +-tolerance nats/token;
- where the model has the scenes scorer (the reference model): FD to AR's own samples on the scorer's
  features against a noise floor (FD between the AR control and the AR reference set, same sizes), and
  scene, object and per-attribute accuracy deltas to AR with paired-bootstrap intervals.

A device-calibrated spec (`calibrated=true`, ssd+csd's default) decodes as the concrete spec the device resolves
it to (decoders/calibrate.py): 1 .. `rows` rows (the block decoder: a cap of 1 .. `max_rows`), or plain AR, which is
exact by construction. Which one depends on the machine and the batch size, so fidelity measures every
speculative choice (`choices`), each a row of its own under its uncalibrated spec, and the spec's own row is its
worst choice (the widest 95% interval end): `measured_as` names it, `choices` lists them all.
"""

from __future__ import annotations

import datetime as dt
import time

import numpy as np
import torch
from tqdm import tqdm

from ssdgen.decoders import build
from ssdgen.decoders.calibrate import choices  # a calibrated spec's choices: bench/decode.py imports it from here
from ssdgen.decoders.fidelity import paired_gap, ratio_gap, target_nll
from ssdgen.decoders.recipes import REFERENCE_SEED_OFFSET
from ssdgen.decoders.spec import DecodeSpec, common_sampling


def uncapped(spec: DecodeSpec) -> DecodeSpec:
    """A calibrated spec at its widest choice, the most rows (quality scoring); any other spec as it is."""
    opts = {k: v for k, v in choices(spec).items() if k.startswith("r")}
    return opts[max(opts, key=lambda k: int(k[1:]))] if opts else spec


def decode_set(model, spec: DecodeSpec, prompts: list[str], seeds: list[int], batch_size: int,
               images: bool) -> dict:
    """Decode, score under the target -> tokens, per-sample NLL, forwards, seconds, images (or None)."""
    toks, nll, fwd, imgs = [], [], [], []
    dec = build(spec, model)  # its heads loaded once, not timed
    t0 = time.perf_counter()
    for i in tqdm(range(0, len(prompts), batch_size), desc=f"fidelity {spec.label}", unit="batch"):
        res = dec.decode(prompts[i:i + batch_size], seeds[i:i + batch_size])
        toks.append(res.tokens)
        fwd += [st.forwards for st in res.stats]
        if images:
            imgs.append(model.decode_images(res.tokens).numpy())
    seconds = time.perf_counter() - t0
    for i in range(0, len(prompts), batch_size):  # scoring is not part of the decode time
        nll.append(target_nll(model, prompts[i:i + batch_size], toks[i // batch_size], spec.sampling))
    return {"tokens": torch.cat(toks), "nll": torch.cat(nll).numpy(), "forwards": np.array(fwd, float),
            "seconds": seconds, "images": np.concatenate(imgs) if images else None}


def _accuracy_columns(judgements) -> dict[str, np.ndarray]:
    """Per-prompt counts: scene correct, objects correct, objects named, and per-attribute correct."""
    cols = {"scene": np.array([j.scene_correct for j in judgements], float),
            "objects": np.array([sum(j.objects_correct) for j in judgements], float),
            "named": np.array([len(j.objects_correct) for j in judgements], float)}
    for k in judgements[0].attrs:
        cols[k] = np.array([sum(j.attrs[k]) for j in judgements], float)
    return cols


class SceneJudge:
    """The reference model's scorer: features for FD and per-image judgements for accuracy deltas."""

    def __init__(self):
        from ssdgen.reference.scorer import load_scorer
        self.net = load_scorer()

    def features(self, images: np.ndarray) -> np.ndarray:
        from ssdgen.reference.scorer import predict
        return predict(self.net, images)["features"]

    def columns(self, images: np.ndarray, prompts: list[str]) -> dict[str, np.ndarray]:
        from ssdgen.reference.scorer import judgements
        return _accuracy_columns(judgements(self.net, images, prompts))


def compare(dec: dict, ref: dict, control: dict | None, prompts: list[str], judge: SceneJudge | None,
            tolerance: float) -> dict:
    """One decoder's row against the AR reference set."""
    g95, g99 = paired_gap(dec["nll"], ref["nll"], 0.95), paired_gap(dec["nll"], ref["nll"], 0.99)
    row = {"n": len(dec["nll"]), "forwards_per_image": float(dec["forwards"].mean()),
           "seconds_per_image": dec["seconds"] / len(dec["nll"]),
           "nll_per_token": float(dec["nll"].mean()), "nll_gap": g95["gap"], "nll_gap_ci": list(g95["ci"]),
           "nll_gap_ci99": list(g99["ci"]),
           "indistinguishable": bool(g99["ci"][0] <= 0 <= g99["ci"][1]),
           "within_tolerance": bool(-tolerance <= g95["ci"][0] and g95["ci"][1] <= tolerance),
           "fd_to_ar": None, "fd_noise_floor": None}
    if judge is not None:
        from ssdgen.reference.fd import frechet_distance
        for s in (ref, control, dec):  # each set's features and judgements once, however many rows use them
            if s is not None and "features" not in s:
                s["features"], s["columns"] = judge.features(s["images"]), judge.columns(s["images"], prompts)
        row["fd_to_ar"] = frechet_distance(dec["features"], ref["features"])
        if control is not None:
            row["fd_noise_floor"] = frechet_distance(control["features"], ref["features"])
        a, b = dec["columns"], ref["columns"]
        ones = np.ones(len(prompts))
        row["scene_accuracy_delta"] = ratio_gap(a["scene"], b["scene"], ones)
        row["object_accuracy_delta"] = ratio_gap(a["objects"], b["objects"], a["named"])
        row["attribute_deltas"] = {k: ratio_gap(a[k], b[k], a["named"]) for k in a
                                   if k not in ("scene", "objects", "named")}
        row["scene_accuracy"], row["object_accuracy"] = float(a["scene"].mean()), float(a["objects"].sum()
                                                                                         / a["named"].sum())
    return row


def fidelity(model, specs: list[DecodeSpec], prompts: list[str], seeds: list[int], batch_size: int = 64,
             tolerance: float = 0.15, log=print, keep_images: int = 0) -> dict:
    """Specs sharing one sampling setting. Returns {"rows": [...]} with the `ar` control row first, and
    with keep_images > 0 (and a model that draws images) "samples": the first keep_images prompts and
    {label: uint8 images} for each decoder, the AR control included, for side-by-side grids."""
    sc = common_sampling(specs)
    ar = DecodeSpec("ar", (), sc)
    judge = SceneJudge() if hasattr(model, "vq") and model.grid == (16, 16) else None
    images = judge is not None
    ref_seeds = [s + REFERENCE_SEED_OFFSET for s in seeds]
    ref = decode_set(model, ar, prompts, ref_seeds, batch_size, images)
    control = decode_set(model, ar, prompts, seeds, batch_size, images)
    rows, samples = [], {}

    def measure(spec: DecodeSpec) -> dict:
        dec = control if spec == ar else decode_set(model, spec, prompts, seeds, batch_size, images)
        row = {"decoder": spec.label} | compare(dec, ref, control, prompts, judge, tolerance)
        row["speedup_forwards_vs_ar"] = float(ref["forwards"].mean()) / row["forwards_per_image"]
        rows.append(row)
        if keep_images and images:
            samples[spec.label] = dec["images"][:keep_images]
        log(f"fidelity {spec.label:<30} {row['forwards_per_image']:6.1f} forwards  NLL gap {row['nll_gap']:+.3f} "
            f"[{row['nll_gap_ci'][0]:+.3f}, {row['nll_gap_ci'][1]:+.3f}]  "
            f"{'indistinguishable' if row['indistinguishable'] else 'DIFFERS'}"
            + (f"  FD to AR {row['fd_to_ar']:.1f} (floor {row['fd_noise_floor']:.1f})" if judge else ""))
        return row

    for spec in [ar] + [s for s in specs if s != ar]:
        opts = choices(spec)
        if not opts:
            measure(spec)
            continue
        measured = [measure(c) for c in opts.values()]
        worst = max(measured, key=lambda r: max(abs(r["nll_gap_ci"][0]), abs(r["nll_gap_ci"][1])))
        rows.append(worst | {"decoder": spec.label, "measured_as": worst["decoder"],
                             "choices": [r["decoder"] for r in measured]})
        if keep_images and images:
            samples[spec.label] = samples[worst["decoder"]]
    res = {"model": model.name, "date": dt.date.today().isoformat(), "n": len(prompts), "tolerance": tolerance,
           "sampling": sc.__dict__, "ar_reference_nll_per_token": float(ref["nll"].mean()),
           "threads": torch.get_num_threads(), "rows": rows}
    if samples:
        res["samples"] = {"prompts": prompts[:keep_images], "images": samples}
    return res
