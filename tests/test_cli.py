"""The CLI turns bad input into one clear error line and exit code 2, never a stack trace."""

import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration  # every test here runs the CLI in a subprocess

GOOD = "a large red circle at the center on a flat gray background"


def run(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "ssdgen.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.parametrize("args, message", [
    (["sample", "--prompt", ""], "empty caption"),
    (["sample", "--prompt", "a large magenta circle at the center on a flat gray background"], "unknown words"),
    (["sample", "--prompt", " ".join([GOOD] * 4)], "at most 36"),
    (["sample", "--prompt", GOOD, "--decoder", "nope"], "unknown decoder 'nope'"),
    (["sample", "--prompt", GOOD, "--decoder", "ar:top_k=-3"], "top_k"),
    (["sample", "--prompt", GOOD, "--decoder", "csd:lam"], "expected key=value"),
    (["sample", "--prompt", GOOD, "--decoder", "sjd:lam=1"], "has no parameter(s) ['lam']"),
    (["generate", "--prompts", "x.parquet", "--decoder", "ssd+csd:commit=block:token_budget=64"],
     "calibrated and token_budget"),
    (["generate", "--prompts", "x.parquet", "--decoder", "ssd+csd:token_budget=64"], "token_budget are not supported"),
    (["bench", "--decoders", "ar:cfg=2,csd"], "must share their sampling"),
    (["sample", "--prompt", GOOD, "--model", "reference:/nonexistent"], "not a model bundle"),
    (["eval", "--n", "0"], "--n must be in 1..1024"),
    (["calibrate", "--decoder", "csd"], "is not calibrated"),
    (["calibrate", "--batch-sizes", "0"], "--batch-sizes must be integers in 1..1024"),
    (["sample", "--prompt", GOOD, "--dtype", "fp16"], "fp16 is not supported on the CPU"),
    (["train-heads", "--dtype", "fp64", "--out", "/nonexistent/heads"], "--dtype must be one of"),
    (["generate", "--prompts", "/nonexistent/prompts.parquet"], "/nonexistent/prompts.parquet"),
    (["generate", "--prompts", "x.parquet", "--device-type", "tpu-v9"], "known"),
    (["generate", "--prompts", "x.parquet", "--batch-size", "0"], "--batch-size must be >= 1"),
    (["generate", "--prompts", "x.parquet", "--device-type", "h100"], "priced per GPU"),
    (["generate", "--prompts", "x.parquet", "--image-format", "gif"], "--image-format must be one of png, webp"),
    (["generate", "--prompts", "x.parquet", "--image-format", "jpeg", "--quality", "0"], "--quality must be in"),
    (["generate", "--prompts", "x.parquet", "--format", "zip"], "--format must be one of parquet, webdataset"),
    (["status", "/nonexistent/run"], "no ssdgen run here"),
    (["generate", "--prompts", "x.parquet", "--dtype", "fp16"], "--dtype fp16 is not supported on the CPU"),
    (["serve", "--prompts", "x.parquet", "--out", "o", "--dtype", "fp8"], "--dtype must be one of"),
    (["export", "/nonexistent/run", "--to", "x"], "no ssdgen run here"),
    (["train-heads", "--kind", "latent,pixel"], "--kind must be latent, token or latent,token"),
])
def test_bad_input_gets_a_clear_error(args, message, tmp_path):
    r = run(*args, *([] if args[0] != "sample" else ["--out", str(tmp_path / "x.png")]))
    assert r.returncode == 2, r.stderr
    assert message in r.stderr
    assert "Traceback" not in r.stderr + r.stdout


def test_sample_writes_a_grid(tmp_path):
    from PIL import Image
    out = tmp_path / "grid.png"
    r = run("sample", "--prompt", GOOD, "--n", "2", "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert Image.open(out).size == (128, 64)


def test_calibrate_says_what_the_device_decides(tmp_path):
    out = tmp_path / "plans.json"
    r = run("calibrate", "--decoder", "ssd+csd", "--batch-sizes", "1", "--json", str(out))
    assert r.returncode == 0, r.stderr
    import json
    plan = json.loads(out.read_text())["plans"][0]
    assert plan["batch"] == 1 and plan["rows"] in (0, 1, 2) and set(plan["estimates"]) == {"0", "1", "2"}
    assert f"batch    1: rows {plan['rows']}" in r.stdout


def test_train_heads_trains_both_kinds_from_one_sample_set(tmp_path):
    from reference.tiny import tiny_model
    tiny_model(tmp_path / "tiny")
    r = run("train-heads", "--model", f"reference:{tmp_path / 'tiny'}", "--kind", "latent,token", "--n-images", "4",
            "--steps", "2")
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.count("\"shared_collect_s\"") == 2  # both kinds report the one shared sampling pass
    for name in ("heads", "heads-token"):
        assert (tmp_path / "tiny" / f"{name}.safetensors").exists(), name


@pytest.mark.slow
def test_demo_runs_the_flow_on_local_ray_and_writes_committed_images(tmp_path):
    """What `make demo` runs: Prefect's ephemeral API, a local Ray, local files, the bundled model."""
    import pyarrow.parquet as pq
    r = run("demo", "--out", str(tmp_path), timeout=900)  # Prefect's first start, Ray, two actors
    assert r.returncode == 0, r.stderr[-3000:]
    man = pq.read_table(tmp_path / "run" / "manifest.parquet").to_pylist()
    assert sum(m["ok"] for m in man) == 8 and (tmp_path / "grid.png").exists()
    s = run("status", str(tmp_path / "run"))
    assert s.returncode == 0 and "2 done, 0 pending, 0 failed of 2 shards" in s.stdout, s.stdout + s.stderr
