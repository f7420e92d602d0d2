"""What `ssdgen bench` tells a user as it goes (#49 item 3): a verdict that names a lossy configuration without
a fidelity measurement says so on its line; what the bench will decode and roughly how long, said first; a
line per round off a terminal; and its own Ctrl-C line, after the verdict of the cells timed."""

import pytest
from typer.testing import CliRunner

from ssdgen.bench.noise import best_batches, verdict
from ssdgen.decoders.spec import DecodeSpec


def _row(decoder, batch, ips, lossless, **kw):
    return {"decoder": decoder, "batch_size": batch, "images_per_s": ips, "usd_per_1k_images": 0.01 / ips,
            "seconds_per_image": 1 / ips,
            "rounds_images_per_s": [ips * f for f in (0.99, 1.0, 1.01)], "lossless": lossless} | kw


def test_a_lossy_cheapest_without_fidelity_says_so_in_the_verdict_line():
    rows = [_row("ar", 1, 2.0, True), _row("csd", 1, 4.0, False)]
    v = verdict(rows, best_batches(rows), 0.01)
    assert v["text"].startswith("cheapest: csd at batch 1 (lossy, and its fidelity to ar was not measured: "
                                "--fidelity-n 0; measure it before using it)")
    assert "cheapest exact or measured within tolerance: ar at batch 1" in v["text"]
    assert v["unverified"] == ["csd"]


def test_a_lossless_or_measured_cheapest_carries_no_caveat_and_a_gap_outside_the_tolerance_is_named():
    exact = [_row("ar", 1, 2.0, True), _row("sjd", 1, 4.0, True)]
    assert "lossy" not in verdict(exact, best_batches(exact), 0.01)["text"]
    measured = [_row("ar", 1, 2.0, True),
                _row("csd", 1, 4.0, False, nll_gap=0.02, nll_gap_ci=[-0.01, 0.05], within_tolerance=True)]
    assert "lossy" not in verdict(measured, best_batches(measured), 0.01)["text"]
    far = [_row("ar", 1, 2.0, True),
           _row("csd", 1, 4.0, False, nll_gap=0.4, nll_gap_ci=[0.3, 0.5], within_tolerance=False)]
    assert "cheapest: csd at batch 1 (lossy: NLL gap to ar +0.400 nats/token [0.3, 0.5], outside the tolerance)" \
        in verdict(far, best_batches(far), 0.01)["text"]


def test_the_specs_say_which_are_lossless():
    assert [DecodeSpec.parse(t).lossless for t in ("ar", "sjd", "ssd:lossless=true", "csd:lam=0")] == [True] * 4
    assert [DecodeSpec.parse(t).lossless for t in ("csd", "ssd+csd", "ssd:commit=block")] == [False] * 3


def test_the_workload_counts_what_the_help_says_the_defaults_decode():
    """ar,sjd,csd at batch 1, 64 prompts, 3 rounds, quality 1024, fidelity 256: 768 timed, about 4,900 in all."""
    from ssdgen.bench.decode import row_names
    from ssdgen.bench.workload import workload
    specs = [DecodeSpec.parse(t) for t in ("ar", "sjd", "csd")]
    w = workload(row_names(specs, specs[0]), specs, specs, 64, 1, 3, 1024, 256)
    assert (w.total("timed"), w.total("quality"), w.total("fidelity"), w.total()) == (768, 3072, 1024, 4864)
    assert w.line() == ("bench: decodes 4,864 images: 768 timed (4 rows, the AR control included, x 1 batch size(s) "
                        "x 3 round(s) x 64 prompts), 3,072 scored for quality (1,024 for each of 3 decoder(s): "
                        "--quality-n), 1,024 for fidelity (1,024 for each of 4 sets: AR's reference and control, "
                        "and each decoder's choices: --fidelity-n)".replace("1,024 for each of 4", "256 for each of 4"))
    assert w.seconds({s: 1.0 for s in specs}) == 4864  # a second an image: an upper bound of 4,864 s
    # a calibrated spec's fidelity decodes each choice it may plan
    calibrated = DecodeSpec.parse("ssd+csd")
    w = workload(row_names([calibrated], specs[0]), [], [specs[0], calibrated], 2, 1, 1, 0, 10)
    from ssdgen.decoders.calibrate import choices
    assert w.total("fidelity") == 10 * (2 + len(choices(calibrated))) and w.total("quality") == 0


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from ssdgen.reference.tiny import tiny_model
    return tiny_model(tmp_path_factory.mktemp("tiny"))


def test_the_bench_says_first_what_it_decodes_then_a_line_per_round_off_a_terminal(tiny):
    from ssdgen.bench.decode import bench
    lines = []
    bench(tiny, [DecodeSpec.parse("ar")], 2, [1, 2], 0, log=lines.append, rounds=2, progress=False)
    assert lines[0].startswith("bench: decodes 16 images: 16 timed (2 rows, the AR control included, x 2 batch ")
    assert lines[1].startswith("bench: at most about ") and "at the warm-up's pace" in lines[1]
    rounds = [x for x in lines if x.startswith("bench: round ")]
    assert [x.split(" timed:")[0] for x in rounds] == [
        "bench: round 1/2, batch 1", "bench: round 1/2, batch 2", "bench: round 2/2, batch 1",
        "bench: round 2/2, batch 2"]
    assert "of timing left" in rounds[0] and "16/16 timed images" in rounds[-1] and "timing done" in rounds[-1]


def _stop_at(monkeypatch, call: int):
    """Ctrl-C on the `call`-th timed batch."""
    from ssdgen.bench import decode
    real, seen = decode.SpeedTally.run_batch, []

    def run_batch(self, prompts, seeds):
        seen.append(1)
        if len(seen) == call:
            raise KeyboardInterrupt
        return real(self, prompts, seeds)
    monkeypatch.setattr(decode.SpeedTally, "run_batch", run_batch)


def test_ctrl_c_keeps_the_verdict_of_the_whole_rounds_timed(tiny, monkeypatch):
    """3 rounds of ar and its control at batch 1 over 2 prompts (4 batches a round): stopped in round 3, the
    cells keep rounds 1 and 2, ranked as ever."""
    from ssdgen.bench.decode import BenchInterrupted, bench
    _stop_at(monkeypatch, 4 * 2 + 2)
    with pytest.raises(BenchInterrupted) as e:
        bench(tiny, [DecodeSpec.parse("ar")], 2, [1], 2, log=lambda *_: None, rounds=3, progress=False)
    res = e.value.result
    assert res["interrupted"] == {"phase": "timing", "rounds_done": 2, "cells": 1}
    assert [len(r["rounds_images_per_s"]) for r in res["rows"]] == [2] and res["rows"][0]["n"] == 2
    assert res["verdict"]["text"].startswith("cheapest: ar at batch 1")
    assert "scene_accuracy" not in res["rows"][0]  # the quality phase never ran


def test_the_cli_prints_the_verdict_then_its_own_interrupt_line(tiny, monkeypatch):
    from ssdgen.cli import decode
    from ssdgen.cli.app import app
    _stop_at(monkeypatch, 4 + 1)  # in round 2
    monkeypatch.setattr(decode, "model_on", lambda *a: tiny)
    r = CliRunner().invoke(app, ["bench", "--decoders", "ar", "--n", "2", "--quality-n", "0", "--fidelity-n", "0"])
    assert r.exit_code == 130, r.output
    assert "verdict: cheapest: ar at batch 1" in r.stdout and "best batch per decoder" in r.stdout
    assert r.stderr.strip() == ("interrupted: the bench stopped in its timing; the verdict above is from 1 cells, 1 "
                                "whole round(s) each; quality and fidelity not measured; --json and --html not written")
    assert "nothing was committed" not in r.output  # generate's line, not the bench's


def test_ctrl_c_before_any_cell_is_timed_says_so(tiny, monkeypatch):
    from ssdgen.cli import decode
    from ssdgen.cli.app import app
    _stop_at(monkeypatch, 1)
    monkeypatch.setattr(decode, "model_on", lambda *a: tiny)
    r = CliRunner().invoke(app, ["bench", "--decoders", "ar", "--n", "2", "--quality-n", "0", "--fidelity-n", "0"])
    assert r.exit_code == 130 and "verdict" not in r.stdout
    assert r.stderr.strip() == ("interrupted: the bench stopped in its timing, before any cell was timed; nothing "
                                "written")
