"""The GPU bench's shape replay, end to end on CPU with tiny shapes: a bench on a tiny model records each
decoder's forward shapes, and the replay times them on two other model shapes."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ssdgen.decoders.spec import DecodeSpec
from ssdgen.bench.decode import bench
from lab.bench.shape_replay import run as replay
from tiny import tiny_model, tiny_with_heads

ROOT = Path(__file__).resolve().parents[1]


def test_traces_record_every_forward_and_replay_on_other_shapes(tmp_path):
    m = tiny_model(tmp_path / "t")
    res = bench(m, [DecodeSpec.parse("ar"), DecodeSpec.parse("sjd:window=4")], 2, [1, 2], 0, log=lambda *_: None)
    for r in res["rows"]:
        fw = r["trace"]["forwards"]
        assert len(fw) == r["forwards_per_batch"] or r["batch_size"] == 1  # one batch's forwards, prefill first
        assert fw[0] == [2 * r["trace"]["batch"], 36, 36]  # CFG doubles the rows
        assert all(f[1] <= (1 if r["decoder"] == "ar" else 4) for f in fw[1:])
    (tmp_path / "bench.json").write_text(json.dumps(res))
    out = replay(str(tmp_path / "bench.json"), str(tmp_path / "replay.json"), "cpu", tiny=True)
    assert json.loads((tmp_path / "replay.json").read_text()) == out
    assert {(r["shape"], r["decoder"], r["batch_size"]) for r in out["rows"]} == {
        (s, d, b) for s in ("tiny-a", "tiny-b") for d in ("ar", "sjd:window=4") for b in (1, 2)}
    assert all(r["images_per_s"] > 0 and r["forwards"] > 1 for r in out["rows"])


@pytest.mark.slow
@pytest.mark.integration
def test_device_bench_script_runs_end_to_end_on_cpu_with_tiny_shapes(tmp_path):
    """`infra/device-bench.sh --tiny`: every step of the GPU script on the CPU, on a tiny model with heads,
    and every file a GPU run writes."""
    m = tiny_with_heads(tmp_path / "model")
    env = os.environ | {"PYTHON": sys.executable, "BENCH_MODEL": f"reference:{m.path}"}
    r = subprocess.run(["bash", str(ROOT / "infra" / "device-bench.sh"), "--tiny", str(tmp_path / "out")], env=env,
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    files = {p.name for p in (tmp_path / "out").iterdir()}
    assert {"bench.json", "bench.html", "replay.json", "calibration.json", "env.txt", "probe.json"} <= files, files
    replay = json.loads((tmp_path / "out" / "replay.json").read_text())
    assert {r["decoder"].split(":")[0] for r in replay["rows"]} == {"ar", "sjd", "csd", "ssd", "ssd+csd"}
    assert any("branches=8" in r["decoder"] for r in replay["rows"])  # proactive drafting's tree steps replay
