"""#37 item 3: the reference model with its KV cache in bf16 (`--model reference:kv=bf16`) against fp32.

Speed: one `model.step` at MID_IMAGE (lab/bench/roofline.py's setup) of both models, interleaved, ROUNDS rounds of
the median of 7 steps per cell; the ratio is fp32's time over bf16's (above 1: bf16 is faster), the median of
the per-round ratios with their range.

Fidelity: n prompts of the eval set decoded by plain AR (CFG 3, temperature 1) three times: fp32 with reference
seeds, fp32 with the run's seeds (the control: the noise between two AR sets), the bf16-cache model with the
run's seeds. Every set is scored under the fp32 target (NLL per token), and the gap to the reference set gets
a paired-bootstrap 95% interval over prompts (bench/fidelity.compare), with FD to AR and its noise floor on the
scorer's features and the scene/object accuracy deltas.

Run on a quiet machine from the repository root (n = 0: the speed alone):
    .venv/bin/python -m lab.results.roofline_37.kv_precision 256 5
"""
import statistics
import sys
import time

import torch

from ssdgen.bench.fidelity import REFERENCE_SEED_OFFSET, SceneJudge, compare, decode_set
from lab.bench.roofline import step_time
from ssdgen.decoders.fidelity import target_nll
from ssdgen.decoders.spec import DecodeSpec
from ssdgen.models.registry import load_model
from ssdgen.reference.prompts import eval_prompts

CELLS = [(1, 1), (16, 1), (64, 1), (128, 1), (64, 4), (64, 8)]


def speed(models: dict, rounds: int) -> None:
    ms = {(name, c): [] for name in models for c in CELLS}
    for r in range(rounds):
        for c in CELLS:
            for name in (list(models) if r % 2 == 0 else list(models)[::-1]):  # alternate who goes first
                ms[name, c].append(1e3 * statistics.median(step_time(models[name], *c, repeats=7)))
    print("batch x window | fp32 ms median (min-max) | kv=bf16 ms median (min-max) | fp32/bf16 median (min-max)")
    for c in CELLS:
        a, b = ms["fp32", c], ms["bf16", c]
        ratio = [x / y for x, y in zip(a, b)]
        print(f"{c[0]} x {c[1]} | {statistics.median(a):.2f} ({min(a):.2f}-{max(a):.2f}) | "
              f"{statistics.median(b):.2f} ({min(b):.2f}-{max(b):.2f}) | "
              f"x{statistics.median(ratio):.2f} ({min(ratio):.2f}-{max(ratio):.2f})", flush=True)


def fidelity(models: dict, n: int) -> None:
    rows = eval_prompts(n)
    prompts, seeds = [r["prompt"] for r in rows], [r["seed"] for r in rows]
    ar = DecodeSpec.parse("ar")
    fp32, bf16 = models["fp32"], models["bf16"]
    ref = decode_set(fp32, ar, prompts, [s + REFERENCE_SEED_OFFSET for s in seeds], 64, True)
    control = decode_set(fp32, ar, prompts, seeds, 64, True)
    dec = decode_set(bf16, ar, prompts, seeds, 64, True)
    dec["nll"] = torch.cat([target_nll(fp32, prompts[i:i + 64], dec["tokens"][i:i + 64], ar.sampling)
                            for i in range(0, n, 64)]).numpy()  # under the fp32 target, as the others
    judge = SceneJudge()
    for name, s in (("fp32 AR (control)", control), ("kv=bf16 AR", dec)):
        row = compare(s, ref, control, prompts, judge, tolerance=0.15)
        print(f"{name:18s} n={row['n']} NLL/token {row['nll_per_token']:.4f}  gap to fp32 AR {row['nll_gap']:+.4f} "
              f"95% [{row['nll_gap_ci'][0]:+.4f}, {row['nll_gap_ci'][1]:+.4f}]  FD to AR {row['fd_to_ar']:.2f} "
              f"(floor {row['fd_noise_floor']:.2f})  scene acc delta {row['scene_accuracy_delta']['gap']:+.3f} "
              f"[{row['scene_accuracy_delta']['ci'][0]:+.3f}, {row['scene_accuracy_delta']['ci'][1]:+.3f}]  "
              f"object acc delta {row['object_accuracy_delta']['gap']:+.3f} "
              f"[{row['object_accuracy_delta']['ci'][0]:+.3f}, {row['object_accuracy_delta']['ci'][1]:+.3f}]",
              flush=True)


if __name__ == "__main__":
    n, rounds = int(sys.argv[1]), int(sys.argv[2])
    torch.set_num_threads(2)
    models = {"fp32": load_model("reference"), "bf16": load_model("reference:kv=bf16")}
    with open("/proc/loadavg") as f:
        print("load average", f.read().split()[:3], time.strftime("%Y-%m-%dT%H:%M:%S%z"), flush=True)
    speed(models, rounds)
    if n:  # n = 0: the speed alone (infra/machine-probe.sh, on whichever machine kind runs CI)
        fidelity(models, n)
