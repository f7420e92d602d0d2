"""Images/s of `ar` (the reference row) at batch 1 and 8, median of the rounds, per run of run.sh; the busy run
against the mean of the quiet runs of the same code."""
import json
import statistics
import sys
from pathlib import Path

out = Path(sys.argv[1])
runs = {}
for f in sorted(out.glob("*.json")):
    r = json.loads(f.read_text())
    runs[f.stem] = {row["batch_size"]: statistics.median(row["rounds_images_per_s"])
                    for row in r["rows"] if row["decoder"] == "ar"}
    runs[f.stem]["load"] = r["load"]["other_cores_mean"]
    runs[f.stem]["threads"] = r.get("threads_given_up", {}).get("reduced_s")
print("| run | ar b1 images/s | ar b8 images/s | other processes' cores (mean) | s with a thread given up |")
print("|---|---|---|---|---|")
for k, v in runs.items():
    print(f"| {k} | {v[1]:.3f} | {v[8]:.3f} | {v['load']:.2f} | {v['threads'] if v['threads'] is not None else '-'} |")
quiet = [runs[k] for k in runs if k.startswith("after-quiet")]
before = [runs[k] for k in runs if k.startswith("before-quiet")]
busy = runs.get("after-busy")
for b in (1, 8):
    q = statistics.mean(r[b] for r in quiet)
    line = f"batch {b}: quiet after {q:.3f}, before {statistics.mean(r[b] for r in before):.3f} images/s"
    if busy:
        line += f"; beside a busy process {busy[b]:.3f} = {busy[b] / q:.0%} of quiet"
    print(f"\n{line}")
