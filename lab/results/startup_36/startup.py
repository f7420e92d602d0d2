"""Where an 8-prompt local run's wall time goes (#36 item 7): `ssdgen generate` of the bundled model with plain
AR, each output line stamped as it arrives; the marks are lines every run prints. Before and after are timed
alternately, `--rounds` times each, on a fresh --out (and the same Prefect home) every time.

    python -m lab.results.startup_36.startup --rounds 3 BEFORE_SSDGEN AFTER_SSDGEN > startup.json
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MARKS = {"server": "Starting temporary server", "ray": "Started a local Ray instance",
         "flow": "Beginning flow run", "actors": "actor(s) ready", "decoded": "done: ", "flow_end": "Finished in state",
         "summary": "summary:"}
PROMPTS = Path(__file__).resolve().parents[3] / "reference" / "data" / "example_prompts.jsonl"


def once(ssdgen: str, work: Path, n: int) -> dict:
    prompts = work / "p.jsonl"
    prompts.write_text("".join(PROMPTS.read_text().splitlines(keepends=True)[:n]))
    out = work / f"run-{time.monotonic_ns()}"
    t0 = time.perf_counter()
    proc = subprocess.Popen([ssdgen, "generate", "--prompts", str(prompts), "--out", str(out), "--decoder", "ar",
                             "--no-progress"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    marks: dict[str, float] = {}
    for line in proc.stdout:
        for name, text in MARKS.items():
            if text in line and name not in marks:
                marks[name] = round(time.perf_counter() - t0, 2)
    proc.wait()
    marks["exit"] = round(time.perf_counter() - t0, 2)
    if proc.returncode != 0:
        sys.exit(f"{ssdgen}: exit {proc.returncode}")
    return marks


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("ssdgen", nargs="+", help="ssdgen executables to compare (e.g. before and after)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=8)
    a = ap.parse_args()
    runs: dict[str, list] = {s: [] for s in a.ssdgen}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            for s in (a.ssdgen if r % 2 == 0 else a.ssdgen[::-1]):
                runs[s].append(once(s, Path(tmp), a.prompts))
                print(s, runs[s][-1], file=sys.stderr)
    load = os.getloadavg()
    summary = {s: {"exit_median_s": statistics.median(m["exit"] for m in ms),
                   "exit_range_s": [min(m["exit"] for m in ms), max(m["exit"] for m in ms)], "runs": ms}
               for s, ms in runs.items()}
    json.dump({"prompts": a.prompts, "rounds": a.rounds, "loadavg_after": load, "results": summary}, sys.stdout,
              indent=1)


if __name__ == "__main__":
    main()
