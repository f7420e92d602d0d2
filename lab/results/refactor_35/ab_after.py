"""#35's A/B timing, the restructured tree: one decoder, 32 eval prompts at batch 32, timed N times after a
warm-up, in this process: `python ab_after.py SPEC N` (prints s/image per decode)."""

import sys
import time

import torch

from ssdgen.decoders import build
from ssdgen.decoders.spec import DecodeSpec
from ssdgen.reference.model import ReferenceModel
from ssdgen.reference.prompts import eval_prompts

torch.set_num_threads(2)
spec, model = DecodeSpec.parse(sys.argv[1]), ReferenceModel()
rows = eval_prompts(32)
prompts, seeds = [r["prompt"] for r in rows], [r["seed"] for r in rows]
decoder = build(spec, model)
decoder.decode(prompts[:8], seeds[:8])  # warm-up
for _ in range(int(sys.argv[2])):
    t0 = time.perf_counter()
    decoder.decode(prompts, seeds)
    print(f"after {(time.perf_counter() - t0) / 32:.4f}", flush=True)
