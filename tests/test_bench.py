"""`ssdgen bench` (JSON keys, cost, bad arguments, standalone HTML, a headless-Chromium render) and
`bench.projection` (roofline arithmetic on hand-checkable cases, calibration plumbing)."""

import base64
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OLD_KEYS = ("decoder", "params", "batch_size", "n", "forwards_per_image", "tokens_per_forward", "seconds_per_image",
            "images_per_s", "latency_p50_s", "latency_p90_s", "speedup_vs_ar")
NEW_KEYS = ("usd_per_1k_images", "usd_per_1k_images_spot", "device_seconds_per_image", "forwards_per_batch",
            "rows_per_forward", "tokens_fed_per_forward", "prefill_tokens_per_image", "batches")


def cli(*args):
    return subprocess.run([sys.executable, "-m", "ssdgen.cli", *args], capture_output=True, text=True, timeout=300,
                          cwd=ROOT)


@pytest.fixture(scope="module")
def tiny_bench(tmp_path_factory):
    """A real bench run (ar and csd, batches 1 and 2) on the tiny random model: seconds, not minutes."""
    from ssdgen.decoders.spec import DecodeSpec
    from ssdgen.bench.decode import bench
    from ssdgen.reference.tiny import tiny_model
    m = tiny_model(tmp_path_factory.mktemp("tiny"))
    res = bench(m, [DecodeSpec.parse("ar"), DecodeSpec.parse("csd:window=4")], 2, [1, 2], 0, log=lambda *_: None)
    from ssdgen.workers.cpus import ThreadPolicy
    return res | {"_threads": ThreadPolicy.from_env().cap}  # the CPUs it holds, whatever it gave up meanwhile


def test_bench_json_has_every_key_and_the_cost(tiny_bench):
    res = json.loads(json.dumps(tiny_bench))  # JSON-able
    assert res["price"]["device_type"] == "cpu" and res["price"]["unit"] == "vcpu"
    assert res["devices"] == res["threads"] == tiny_bench["_threads"] and res["device_type"] == "cpu"
    assert set(res["model_info"]) >= {"params", "layers", "dim", "kv_dim", "prompt_len", "grid", "bytes_per_param"}
    assert [(r["decoder"], r["batch_size"]) for r in res["rows"]] == [
        ("ar", 1), ("csd:window=4", 1), ("ar", 2), ("csd:window=4", 2)]
    for r in res["rows"]:
        for k in OLD_KEYS + NEW_KEYS:
            assert k in r, k
        # $ / 1k images = s/image x vCPUs x $/vCPU-hour / 3600 x 1000
        want = r["seconds_per_image"] * res["devices"] * res["price"]["on_demand_usd_per_hour"] / 3600 * 1000
        assert math.isclose(r["usd_per_1k_images"], want, rel_tol=1e-9)
        assert r["forwards_per_batch"] >= r["forwards_per_image"] - 1e-9  # a batch waits for its slowest sample
        assert r["rows_per_forward"] == pytest.approx(2 * r["batch_size"])  # CFG doubles the rows
    ar = [r for r in res["rows"] if r["decoder"] == "ar"]
    csd = [r for r in res["rows"] if r["decoder"] != "ar"]
    assert all(r["tokens_fed_per_forward"] == 1 and r["speedup_vs_ar"] == 1 for r in ar)
    assert all(3 < r["tokens_fed_per_forward"] <= 4 for r in csd)  # the window, shorter at the grid's end


@pytest.mark.parametrize("args, message", [
    (["--device-type", "tpu-v9"], "known: a100-40gb, a10g, cpu, h100, h200, l4"),
    (["--batch-sizes", "1,0"], "--batch-sizes must be integers >= 1"),
    (["--batch-sizes", "one"], "--batch-sizes must be comma-separated integers"),
    (["--decoders", ","], "--decoders is empty"),
    (["--decoders", "ar,nope"], "unknown decoder 'nope'"),
    (["--device-type", "h100"], "priced per GPU"),
])
@pytest.mark.integration
def test_bench_bad_arguments_give_one_line_and_exit_2(args, message):
    r = cli("bench", "--n", "1", "--quality-n", "0", *args)
    assert r.returncode == 2, r.stdout + r.stderr
    assert message in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


@pytest.mark.integration
def test_bench_cuda_without_a_gpu_is_a_clear_error():
    import torch
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    r = cli("bench", "--n", "1", "--quality-n", "0", "--device", "cuda", "--device-type", "l4")
    assert r.returncode == 2 and "CUDA is not available" in r.stderr


def _no_external_urls(text: str) -> None:
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", text, re.I)
    assert "<script" not in text.lower() and "<link" not in text.lower()


def test_bench_html_is_standalone_and_says_quality_and_fidelity_were_skipped(tiny_bench):
    from ssdgen.bench.plots import bench_html
    text = bench_html(tiny_bench)
    _no_external_urls(text)
    imgs = re.findall(r'<img src="data:image/png;base64,([A-Za-z0-9+/=]+)"', text)
    # the throughput plot only: no quality was measured, so its plot is left out and the page says why
    assert len(imgs) == 1 and all(base64.b64decode(b)[:4] == b"\x89PNG" for b in imgs)
    assert "$ / 1k images" in text and "csd:window=4" in text
    assert "Quality was skipped" in text and "Speed vs quality" not in text
    assert "Fidelity was skipped in this run (--fidelity-n 0)" in text and "Speed vs fidelity" not in text
    assert text.index("Verdict") < text.index("Best batch per decoder") and "Noise floor" in text


def test_pareto_front_and_plot_with_quality(tiny_bench):
    from ssdgen.bench.plots import bench_html, pareto_front
    assert pareto_front([(1, 0.5), (2, 0.4), (1.5, 0.3), (2, 0.45), (0.5, 0.6)]) == [4, 0, 3]
    res = json.loads(json.dumps(tiny_bench))
    for r in res["rows"]:
        r.update(scene_accuracy=0.2 if r["decoder"] == "ar" else 0.15, object_accuracy=0.5, fd=10.0)
    text = bench_html(res)
    assert "Quality was skipped" not in text and len(re.findall(r"data:image/png", text)) == 2


@pytest.mark.integration
def test_bench_html_renders_in_headless_chromium(tiny_bench, tmp_path):
    import numpy as np
    from PIL import Image
    from ssdgen.bench.plots import bench_html

    from lab.bench.screenshot import find_chromium, screenshot
    if find_chromium() is None:
        if os.environ.get("CI"):  # .ci/run installs it: in CI a missing browser is a failure, not a skip
            pytest.fail("no chromium in CI")
        pytest.skip("no chromium installed (Debian: apt-get install -y chromium)")
    page = tmp_path / "bench.html"
    page.write_text(bench_html(tiny_bench), encoding="utf-8")
    png = screenshot(page, tmp_path / "bench.png", 1200, 1600)
    im = np.asarray(Image.open(png).convert("RGB"))
    assert im.shape == (1600, 1200, 3)
    assert (im < 128).mean() > 0.005  # text and plots were drawn, not a blank page


# ------------------------------------------------------------------------------------------ projection

def test_roofline_memory_bound_time_is_bytes_over_bandwidth():
    from ssdgen.bench.projection import Accelerator, ModelSpec, forward_time, kv_bytes_per_token
    acc = Accelerator("toy", mem_bw=1e12, peak_flops=1e15, mem_bytes=80e9, source="test")
    m = ModelSpec("toy", params=1e9, layers=10, dim=1000, kv_dim=1000, prompt_len=0, bytes_per_value=2)
    assert kv_bytes_per_token(m) == 2 * 10 * 1000 * 2 == 40_000
    f = forward_time(acc, m, rows=1, tokens_per_row=1, ctx=100)
    assert f["bytes"] == 2e9 + 100 * 40_000  # weights once + the row's KV cache
    assert f["flops"] == 2e9
    assert f["bound"] == "memory" and f["seconds"] == pytest.approx(2.004e9 / 1e12)
    # compute-bound: 1000 rows x 16 tokens = 16,000 tokens in flight -> 3.2e13 FLOPs / 1e15 = 32 ms
    g = forward_time(acc, m, rows=1000, tokens_per_row=16, ctx=100)
    assert g["bound"] == "compute" and g["seconds"] == pytest.approx(0.032)
    assert g["t_memory_s"] == pytest.approx((2e9 + 1000 * 100 * 40_000) / 1e12)


def test_projection_per_image_time_kv_cap_and_cost():
    from ssdgen.bench.projection import Accelerator, DecoderStats, ModelSpec, Roofline, kv_cap, project_one
    acc = Accelerator("toy", 1e12, 1e15, 80e9, "test")
    m = ModelSpec("toy", 1e9, 10, 1000, 1000, prompt_len=0, bytes_per_value=2)
    # kv cap: (80e9 * 0.9 - 2e9) / (2 rows (CFG) * 40,000 B * 256 tokens) = 70e9 / 20.48e6 = 3417.96
    assert kv_cap(acc, m, 256, cfg=True) == 3417 and kv_cap(acc, m, 256, cfg=False) == 6835
    ar = DecoderStats("ar", 1, 256, 256, 1, 256, 16, "ar")
    p = project_one(ar, acc, m, grid=16, batch=1, cfg=True, price_per_hour=3.6)
    # prefill: 0 prompt tokens -> weights only (2 ms); 255 steps of 2 rows at mean context 128
    step = (2e9 + 2 * 128 * 40_000) / 1e12
    assert p["seconds_per_forward"] == pytest.approx(step)
    assert p["seconds_per_image"] == pytest.approx(2e9 / 1e12 + 255 * step)
    assert p["usd_per_1k_images"] == pytest.approx(p["seconds_per_image"] * 3.6 / 3.6)
    assert p["label"] == "projection" and p["fits"]
    # a 4x window decoder: a quarter of the forwards, same memory-bound forward cost (+ KV of more tokens: none)
    sjd = DecoderStats("sjd", 1, 64, 64, 16, 256, 16, "sjd:window=16")
    q = project_one(sjd, acc, m, grid=16, batch=1, cfg=True, price_per_hour=3.6)
    assert q["forwards_per_image"] == 64 and q["seconds_per_image"] == pytest.approx(2e-3 + 63 * step)
    # over the KV cap: no throughput claimed
    big = project_one(ar, acc, m, grid=16, batch=4000, cfg=True, price_per_hour=3.6)
    assert not big["fits"] and big["images_per_s"] is None and big["usd_per_1k_images"] is None
    # ssd's window is 2 raster rows: 33 tokens on a grid 16 wide, the window loop's widest, 64, at 48
    ssd = DecoderStats("ssd", 1, 50, 50, 33, 256, 16, "ssd")
    assert project_one(ssd, acc, m, 48, 1, True, None)["tokens_fed_per_row"] == 64
    # the overhead term is added per forward
    o = project_one(ar, acc, m, 16, 1, True, None, Roofline(overhead_per_forward=1e-3))
    assert o["seconds_per_image"] == pytest.approx(p["seconds_per_image"] + 256e-3)


def test_projection_reads_an_older_bench_json_and_calibrates():
    from ssdgen.bench.projection import decoder_stats, project
    from lab.bench.projection_check import calibrate
    bench = json.loads((ROOT / "tests/data/bench_v1_batch1.json").read_text())
    st = {s.decoder: s for s in decoder_stats(bench)}
    assert st["ar"].tokens_fed_per_forward == 1 and st["csd:window=16"].tokens_fed_per_forward == 16
    assert "tokens_fed_per_forward" in st["csd:window=16"].derived and not st["ar"].derived
    res = project(bench, ["h100", "l4"], [("7b", 48)], [1, 16])
    assert all(r["label"] == "projection" for r in res["rows"]) and len(res["rows"]) == 2 * 3 * 2
    l4 = [r for r in res["rows"] if r["accelerator"] == "l4" and r["batch_size"] == 16]
    assert all(not r["fits"] for r in l4)  # 7B bf16 + a 48x48 KV cache for 16 CFG pairs exceeds 24 GB
    cpu = {"flops": 5e10, "bw_dram": 1e10, "bw_model": 2e10, "threads": 2}
    cal = calibrate(bench, cpu)
    assert len(cal["rows"]) == 3 and all(math.isfinite(r["error_pct"]) for r in cal["rows"])
    # several measured files (an eval JSON counts as a one-row bench); two constants fitted, the rest held out
    from lab.bench.projection_check import calibrate_fitted, merge_benches
    merged = merge_benches([str(ROOT / "tests/data" / f) for f in ("bench_v1_batch1.json", "eval_csd_v1.json")])
    assert [r["source"] for r in merged["rows"]] == ["bench_v1_batch1.json"] * 3 + ["eval_csd_v1.json"]
    fit = calibrate_fitted(merged, cpu)
    errs = {(r["decoder"], r["batch_size"]): r["error_pct"] for r in fit["rows"]}
    assert abs(errs[("ar", 1)]) < 1 and abs(errs[("csd:window=16", 64)]) < 1  # the two fitted rows
    assert 0 < fit["flops_eff"] <= 1 and fit["overhead_per_forward_s"] > 0


@pytest.mark.integration
def test_projection_cli_and_bad_arguments(tmp_path):
    r = cli("projection", "--bench-json", "tests/data/bench_v1_batch1.json", "--accelerators", "h200",
            "--models", "1b@24", "--batch-sizes", "1,4", "--json", str(tmp_path / "p.json"), "--html",
            str(tmp_path / "p.html"))
    assert r.returncode == 0, r.stderr
    assert "PROJECTION" in r.stdout and json.loads((tmp_path / "p.json").read_text())["label"] == "projection"
    _no_external_urls((tmp_path / "p.html").read_text())
    for args, msg in ((["--accelerators", "tpu"], "unknown accelerator"), (["--models", "3b@24"], "SIZE@GRID"),
                      (["--batch-sizes", "0"], ">= 1")):
        r = cli("projection", "--bench-json", "tests/data/bench_v1_batch1.json", *args)
        assert r.returncode == 2 and msg in r.stderr, r.stderr


def test_bench_fidelity_columns_and_frontier_page(tmp_path):
    """--fidelity-n adds the NLL gap (with its interval and verdict) to every row of a decoder, and the
    page plots images/s against it."""
    from ssdgen.decoders.spec import DecodeSpec
    from ssdgen.bench.decode import FIDELITY_COLS, bench
    from ssdgen.bench.plots import bench_html
    from ssdgen.reference.tiny import tiny_model
    m = tiny_model(tmp_path / "tiny")
    res = bench(m, [DecodeSpec.parse("ar"), DecodeSpec.parse("csd:window=4:lam=6")], 2, [1, 2], 0,
                log=lambda *_: None, fidelity_n=64)
    for r in res["rows"]:
        assert set(FIDELITY_COLS) <= set(r) and r["fidelity_n"] == 64
        lo, hi = r["nll_gap_ci"]
        assert lo <= r["nll_gap"] <= hi
    ar, csd = res["rows"][0], res["rows"][1]
    assert ar["indistinguishable"] and not csd["indistinguishable"] and csd["nll_gap"] > 0
    page = bench_html(res, res.pop("samples"))
    assert "Speed vs fidelity" in page and "NLL gap to ar" in page and "Fidelity was skipped" not in page
    json.dumps(res)


def test_a_calibrated_specs_rows_carry_the_fidelity_of_what_its_plan_decoded(tmp_path):
    """ssd+csd (calibrated) is planned at each batch size; each of its rows gets the fidelity of the choice its
    plan made (`fidelity_of`: the AR control, or that choice's uncalibrated spec), and the best-batch table
    names it."""
    from ssdgen.decoders.spec import DecodeSpec
    from ssdgen.bench.decode import bench
    from tiny import tiny_with_heads
    m = tiny_with_heads(tmp_path / "t")
    res = bench(m, [DecodeSpec.parse("ar"), DecodeSpec.parse("ssd+csd:cfg=3")], 4, [1, 2], 0,
                log=lambda *_: None, fidelity_n=8, quality_batch=4)
    rows = [r for r in res["rows"] if r["decoder"].startswith("ssd+csd")]
    assert len(rows) == 2
    for r in rows:
        want = "ar" if r["plan_choice"] == "ar" else DecodeSpec.parse(r["plan_spec"]).label
        assert r["fidelity_of"] == want and r["plan_why"] and "nll_gap" in r
    # a row its plan decoded as plain AR says so and is not ranked as a configuration of its own
    for r in rows:
        assert r["planned_as_ar"] == (r["plan_choice"] == "ar") and (r.get("planned_as") == "= ar (plan)") == (
            r["plan_choice"] == "ar")
    own = [r["decoder"] for r in rows if r["plan_choice"] != "ar"][:1]
    assert [b["decoder"] for b in res["best"]] == ["ar"] + own
    json.dumps(res)
