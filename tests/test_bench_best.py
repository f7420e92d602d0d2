"""`ssdgen bench`'s headline: each decoder at its best measured batch size (bench.noise.best_batches), its
ratio to ar's best, and where it shows (first in the console and on the page); and the rows' `waste`."""

import json

import pytest

from ssdgen.bench.noise import best_batches


def _row(decoder, batch, ips, **kw):
    return {"decoder": decoder, "batch_size": batch, "images_per_s": ips, "seconds_per_image": 1 / ips,
            "usd_per_1k_images": 0.01 / ips, "usd_per_1k_images_spot": 0.004 / ips, "waste": 2.0} | kw


ROWS = [_row("ar", 1, 2.0), _row("ssd+csd", 1, 4.0, waste=5.0, nll_gap=0.02, nll_gap_ci=[-0.01, 0.05]),
        _row("ar", 16, 20.0), _row("ssd+csd", 16, 12.0, waste=5.5, nll_gap=0.02, nll_gap_ci=[-0.01, 0.05]),
        _row("ar", 64, 30.0), _row("ssd+csd", 64, 9.0, waste=6.0, nll_gap=0.02, nll_gap_ci=[-0.01, 0.05]),
        _row("ar", 256, 25.0)]


def test_the_best_batch_is_each_decoders_fastest_and_is_compared_with_ars_best():
    best = {b["decoder"]: b for b in best_batches(ROWS)}
    assert list(best) == ["ar", "ssd+csd"]  # the rows' order
    ar, ssd = best["ar"], best["ssd+csd"]
    assert (ar["batch_size"], ar["images_per_s"], ar["vs_ar_best"]) == (64, 30.0, 1.0)
    assert (ssd["batch_size"], ssd["images_per_s"]) == (16, 12.0)
    assert ssd["vs_ar_best"] == pytest.approx(12.0 / 30.0)
    # cost and waste of the best row, not of another batch size
    assert ssd["usd_per_1k_images"] == pytest.approx(0.01 / 12) and ssd["usd_per_1k_images_spot"] == pytest.approx(
        0.004 / 12)
    assert ssd["waste"] == 5.5
    # fidelity where measured; latency at batch 1 from the batch-1 row
    assert ssd["nll_gap"] == 0.02 and ssd["nll_gap_ci"] == [-0.01, 0.05] and "nll_gap" not in ar
    assert ssd["latency_batch1_s"] == pytest.approx(1 / 4.0) and ar["latency_batch1_s"] == pytest.approx(0.5)


def test_without_batch_1_or_ar_the_missing_figures_are_none():
    best = best_batches([r for r in ROWS if r["decoder"] != "ar" and r["batch_size"] != 1])
    assert len(best) == 1
    assert best[0]["batch_size"] == 16 and best[0]["latency_batch1_s"] is None and best[0]["vs_ar_best"] is None


def test_a_faster_speculative_decoder_shows_a_ratio_above_one():
    rows = ROWS + [_row("ssd:window=4", 256, 36.0)]
    best = {b["decoder"]: b for b in best_batches(rows)}
    assert best["ssd:window=4"]["vs_ar_best"] == pytest.approx(1.2)


def test_the_console_prints_the_best_batch_first_in_aligned_columns(capsys):
    """#49: the tables were raw field names over unaligned, |-separated values; now readable headers over columns
    that line up (bench/tables.py)."""
    from ssdgen.cli.decode import _echo_bench
    _echo_bench({"best": best_batches(ROWS), "rows": ROWS})
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("best batch per decoder")
    head, ar, ssd = out[1:4]
    assert head.split()[:4] == ["decoder", "best", "batch", "images"] and "vs ar's best" in head
    assert "vs_ar_best" not in head and "|" not in head + ar
    assert ar.split()[:4] == ["ar", "64", "30", "1"] and ssd.split()[:4] == ["ssd+csd", "16", "12", "0.4"]
    assert "[-0.01, 0.05]" in ssd
    # aligned: each number ends where its header ends (right-aligned), the names start at the left edge
    for header, value in (("best batch", "64"), ("images / s", "30")):
        assert ar.index(value) + len(value) == head.index(header) + len(header)
    table = [i for i, line in enumerate(out) if line.split()[:2] == ["decoder", "batch"]][0]
    assert table > 3 and "computed / committed" in out[table]
    assert "s / image" not in out[table]  # no empty column: these rows carry none
    end = out[table].index("images / s") + len("images / s")
    assert [line[end - 2:end] for line in out[table + 1:]] == [" 2", " 4", "20", "12", "30", " 9", "25"]


def test_the_page_leads_with_the_best_batch():
    from ssdgen.bench.plots import bench_html
    res = {"model": "m", "best": best_batches(ROWS), "rows": ROWS,
           "price": {"on_demand_usd_per_hour": 0.05, "spot_usd_per_hour": 0.017, "unit": "vcpu"}}
    text = bench_html(res)
    assert text.index("Best batch per decoder") < text.index("<h2>Results</h2>")
    assert "vs ar&#x27;s best" in text and "$ / 1k images spot" in text and "0.017 $/vcpu-hour" in text
    assert "Best batch per decoder" not in bench_html(res | {"best": []})  # a result from before the headline


@pytest.fixture(scope="module")
def tiny_bench(tmp_path_factory):
    from ssdgen.bench.decode import bench
    from ssdgen.decoders.spec import DecodeSpec
    from ssdgen.reference.tiny import tiny_model
    m = tiny_model(tmp_path_factory.mktemp("tiny"))
    return bench(m, [DecodeSpec.parse("ar"), DecodeSpec.parse("sjd:window=4")], 2, [1, 2], 0, log=lambda *_: None)


def test_a_real_bench_reports_waste_and_its_best_batches(tiny_bench):
    res = json.loads(json.dumps(tiny_bench))  # JSON-able
    assert list(res).index("best") < list(res).index("rows")
    assert all(r["waste"] == 2.0 for r in res["rows"] if r["decoder"] == "ar")  # the bench's sampling has CFG
    assert all(r["waste"] > 2.0 for r in res["rows"] if r["decoder"] != "ar")  # a window computes 4 per forward
    assert [b["decoder"] for b in res["best"]] == ["ar", "sjd:window=4"]
    for b in res["best"]:
        mine = [r for r in res["rows"] if r["decoder"] == b["decoder"]]
        assert b["images_per_s"] == max(r["images_per_s"] for r in mine)
        assert b["latency_batch1_s"] == next(r["seconds_per_image"] for r in mine if r["batch_size"] == 1)
