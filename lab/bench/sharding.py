"""Sharding benchmark (not a test): list and shard millions of prompt rows from footer metadata only.

`run()` writes synthetic Parquet prompt files once (reused on later runs), then times what the flow shards with
(flows/pipeline.py): `list_inputs`, a `Shards(shard_size=1000)` and every shard of it taken as the flow takes
them (`shards[i]`), in a fresh Python process, so the figures are not skewed by the data generation in this one.
Bars: plan_seconds <= 60 and peak_rss_mb <= 2048.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROW_GROUP = 64 * 1024
SHARD_SIZE = 1000
BARS = {"plan_seconds": 60.0, "peak_rss_mb": 2048.0}

_SIZES = ["a small", "a large", "a tiny", "a big"]
_COLORS = ["red", "green", "blue", "yellow", "purple", "orange"]
_SHAPES = ["circle", "square", "triangle", "star"]
_PLACES = ["at the center", "in the top left corner", "in the bottom right corner", "on the left", "on the right"]
_BACKS = ["a flat gray background", "a white background", "a black background"]

# The child is a fresh interpreter: only the code under test and its imports count towards RSS.
_CHILD = """
import json, resource, sys, time

def peak_rss_mb():
    # VmHWM, not ru_maxrss: after fork and exec ru_maxrss is at least the parent's peak
    try:
        return next(int(x.split()[1]) for x in open("/proc/self/status") if x.startswith("VmHWM:")) / 1024
    except OSError:  # not Linux: ru_maxrss (KB on Linux, bytes on macOS; Linux never gets here)
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
t0 = time.perf_counter()
from ssdgen.inputs.files import list_inputs
from ssdgen.inputs.shards import Shards
t1 = time.perf_counter()
files = list_inputs([sys.argv[1]])
t2 = time.perf_counter()
plan = Shards(files, int(sys.argv[2]))
planned = sum(plan[i].rows for i in range(len(plan)))  # each shard as the flow takes it, none kept
t3 = time.perf_counter()
print(json.dumps({"files": len(files), "rows": sum(f.num_rows for f in files), "shards": len(plan),
                  "planned_rows": planned, "import_seconds": t1 - t0,
                  "list_seconds": t2 - t1, "plan_only_seconds": t3 - t2, "plan_seconds": t3 - t1,
                  "peak_rss_mb": peak_rss_mb()}))
"""


def _captions() -> pa.Array:
    return pa.array([f"{s} {c} {sh} {p} on {b}" for s in _SIZES for c in _COLORS for sh in _SHAPES
                     for p in _PLACES for b in _BACKS], pa.string())


def write_data(workdir: Path, rows: int, files: int) -> None:
    """`files` Parquet files sharing `rows` rows; skipped when a marker says this set already exists."""
    marker = workdir / "_DONE"  # underscore: list_inputs skips it
    spec = json.dumps({"rows": rows, "files": files, "row_group": ROW_GROUP})
    if marker.exists() and marker.read_text() == spec:
        return
    workdir.mkdir(parents=True, exist_ok=True)
    captions = _captions()
    per_file = [rows // files + (i < rows % files) for i in range(files)]
    start = 0
    for i, n in enumerate(per_file):
        # Vectorised: a strided walk through the caption set, no per-row Python.
        idx = (np.arange(start, start + n, dtype=np.int64) * 7919) % len(captions)
        table = pa.table({"prompt": captions.take(pa.array(idx))})
        pq.write_table(table, workdir / f"part-{i:05d}.parquet", row_group_size=ROW_GROUP)
        start += n
    marker.write_text(spec)


def run(rows: int = 10_000_000, files: int = 100, workdir: str | os.PathLike | None = None) -> dict:
    """Write (once) and plan `rows` rows in `files` files; returns the measured figures."""
    if rows < 1 or files < 1:
        raise ValueError(f"--rows and --files must be >= 1, got {rows} and {files}")
    path = Path(workdir) if workdir else Path(tempfile.gettempdir()) / f"ssdgen-bench-sharding-{rows}-{files}"
    t0 = time.perf_counter()
    write_data(path, rows, files)
    write_seconds = time.perf_counter() - t0

    # this interpreter imports ssdgen as installed (a wheel or `pip install -e .`): no checkout on the path
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(path), str(SHARD_SIZE)],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"planning subprocess failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
    child = json.loads(proc.stdout.strip().splitlines()[-1])
    if child["rows"] != rows or child["planned_rows"] != rows:
        raise RuntimeError(f"row count mismatch: wrote {rows}, listed {child['rows']}, planned {child['planned_rows']}")
    result = {"rows": child["rows"], "files": child["files"], "shards": child["shards"],
              "plan_seconds": round(child["plan_seconds"], 3), "peak_rss_mb": round(child["peak_rss_mb"], 1)}
    result["details"] = {"list_seconds": round(child["list_seconds"], 3),
                         "plan_only_seconds": round(child["plan_only_seconds"], 3),
                         "import_seconds": round(child["import_seconds"], 3),
                         "write_seconds": round(write_seconds, 3), "workdir": str(path),
                         "shard_size": SHARD_SIZE, "row_group": ROW_GROUP}
    result["within_bars"] = all(result[k] <= v for k, v in BARS.items())
    return result


def main(rows: int = 10_000_000, files: int = 100, workdir: str | None = None) -> dict:
    result = run(rows=rows, files=files, workdir=workdir)
    print(json.dumps(result, indent=2))
    return result

