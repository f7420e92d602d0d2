"""`python -m lab roofline` (lab/bench/roofline.py): what a step of the reference model moves and computes, against
what the machine can do. The arithmetic is checked against the model's own cache and weights; the timings only
for being there (speeds come from the command on a quiet machine, docs/benchmarks.md, never from a test)."""

import json

import pytest

from lab.bench import roofline
from ssdgen.models.registry import load_model


@pytest.fixture(scope="module")
def model():
    return load_model(None, device="cpu", dtype="fp32")


def test_a_steps_bytes_and_flops_are_the_models_own(model):
    g = model.gpt.cfg
    shapes = roofline.step_shapes(model.gpt, rows=4, window=3)
    assert shapes["slots"] == g.caption_len + roofline.mid_image(model.gpt) + 3  # the window's last token sees them all
    # the slots in use are that share of what 2 CFG samples' (4 rows') caches allocate
    from ssdgen.reference.gpt import SPARE_POSITIONS
    alloc = 2 * model.cache_bytes_per_sample(use_cfg=True)
    assert shapes["kv_bytes"] == alloc * shapes["slots"] // (g.seq_len + SPARE_POSITIONS)
    # a bf16 cache (reference:kv=bf16) moves half the KV bytes; the weights' stay fp32
    half = roofline.step_shapes(model.gpt, rows=4, window=3, kv_item=2)
    assert 2 * half["kv_bytes"] == shapes["kv_bytes"] and half["weight_bytes"] == shapes["weight_bytes"]
    n_weights = sum(p.numel() for n, p in model.gpt.named_parameters()
                    if n.endswith("weight") and ("wqkv" in n or "wo" in n or "w13" in n or "w2" in n
                                                 or n == "head.weight"))
    assert shapes["weight_bytes"] == 4 * n_weights
    _, flops = roofline.matmul_time(model.gpt, tokens=5, repeats=1)
    assert flops == 2 * 5 * n_weights


def test_the_table_has_every_cell_and_the_cli_writes_it(model, tmp_path):
    res = roofline.run(model, [1, 2], [1, 2], repeats=1)
    cells = [(r["batch"], r["window"]) for r in res["rows"]]
    assert sorted(cells) == [(1, 1), (1, 2), (2, 1), (2, 2)]
    for r in res["rows"]:
        assert r["rows"] == 2 * r["batch"] and r["tokens"] == r["rows"] * r["window"]
        assert 0 < r["step_ms_best"] <= r["step_ms_median"] <= r["step_ms_max"]
        assert r["roof_ms"] == pytest.approx(r["matmul_ms"] + r["kv_read_ms"])
        assert r["fraction_of_roof"] == pytest.approx(r["roof_ms"] / r["step_ms_median"])
    assert res["read_gb_per_s"] > 0 and model.gpt.layers[0].attn.kv_cache is None  # caches freed after

    from typer.testing import CliRunner

    from lab.cli import app
    out = tmp_path / "r.json"
    r = CliRunner().invoke(app, ["roofline", "--batches", "1", "--windows", "1", "--repeats", "1",
                                 "--json", str(out), "--profile", "1x1"])
    assert r.exit_code == 0, r.output
    assert "of roof" in r.stdout and "Self CPU" in r.stdout  # the table, then the profiled step's ops
    assert [row["window"] for row in json.loads(out.read_text())["rows"]] == [1]
