"""#37: one `model.step` of the bundled model (fp32, CFG, at MID_IMAGE as `python -m lab roofline` sets it up) with
attention as the C loop (reference/decode_attention.c) and as torch's SDPA (the loop switched off), interleaved:
per round, the median of 7 steps each way; the ratio SDPA / loop per round, then the median and range over rounds.
Also the process's user and system CPU seconds per way.
    .venv/bin/python -m lab.results.roofline_37.c_loop.step_loop_vs_sdpa [ROUNDS]
"""
import resource
import statistics
import sys
import time

import torch

from lab.bench.roofline import _times, mid_image_step
from ssdgen.models.registry import load_model
from ssdgen.reference import decode_attention as da

torch.set_num_threads(2)
ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 5
CELLS = [(1, 1), (16, 1), (64, 1), (128, 1), (64, 4), (64, 8)]
loop_fn, off = da.attention, (lambda *a: None)
model = load_model(None)
print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load {open('/proc/loadavg').read().split()[:3]}")
print("batch x window | SDPA ms | loop ms | x (min-max) | cpu user/sys s SDPA | loop")
for batch, window in CELLS:
    ms = {"sdpa": [], "loop": []}
    cpu = {"sdpa": [0.0, 0.0], "loop": [0.0, 0.0]}
    with mid_image_step(model, batch, window) as step:
        for r in range(ROUNDS):
            for way in (("sdpa", "loop") if r % 2 == 0 else ("loop", "sdpa")):
                da.attention = loop_fn if way == "loop" else off
                u0 = resource.getrusage(resource.RUSAGE_SELF)
                ms[way].append(1e3 * statistics.median(_times(step, 7)))
                u1 = resource.getrusage(resource.RUSAGE_SELF)
                cpu[way][0] += u1.ru_utime - u0.ru_utime
                cpu[way][1] += u1.ru_stime - u0.ru_stime
    da.attention = loop_fn
    x = [a / b for a, b in zip(ms["sdpa"], ms["loop"])]
    print(f"{batch} x {window} | {statistics.median(ms['sdpa']):.2f} | {statistics.median(ms['loop']):.2f} | "
          f"x{statistics.median(x):.2f} ({min(x):.2f}-{max(x):.2f}) | {cpu['sdpa'][0]:.1f}/{cpu['sdpa'][1]:.1f} | "
          f"{cpu['loop'][0]:.1f}/{cpu['loop'][1]:.1f}", flush=True)
