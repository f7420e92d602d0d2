"""Fidelity against the target: NLL under the target computed exactly, bootstrap intervals that cover what
they claim on synthetic data with a known gap, and verdicts on a tiny model (lossless decoders
indistinguishable from AR, a planted lossy setting caught)."""

import numpy as np
import pytest
import torch

from ssdgen.decoders import decode
from ssdgen.decoders.fidelity import bootstrap_ci, paired_gap, ratio_gap, target_nll
from ssdgen.decoders.sampling import processed_probs
from ssdgen.decoders.recipes import SamplingConfig
from ssdgen.decoders.spec import DecodeSpec
from ssdgen.bench.fidelity import fidelity
from tiny import tiny_model

PROMPT = "a large red circle at the center on a flat gray background"
SC = SamplingConfig(cfg_scale=3.0, top_k=6)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_model(tmp_path_factory.mktemp("tiny"), scale=0.2)


def test_target_nll_is_the_processed_distributions_nll_in_any_chunking(tiny):
    prompts = [PROMPT] * 3
    tokens = decode("ar", tiny, prompts, [1, 2, 3], SC).tokens  # [3, 16]
    # by hand: one prefill, then each prefix fed alone
    want = torch.zeros(3)
    for i in range(16):
        out = tiny.start(prompts, True) if i == 0 else None
        if i:
            tiny.start(prompts, True)
            out = tiny.step(tokens[:, :i], torch.arange(i).expand(3, i))
        p = processed_probs(out.cond[:, -1], out.uncond[:, -1], SC)
        want += -p.gather(1, tokens[:, i:i + 1]).squeeze(1).log()
    for chunk in (1, 5, 256):
        assert torch.allclose(target_nll(tiny, prompts, tokens, SC, chunk=chunk), want / 16, atol=1e-5)
    # a token outside top-k costs the floor, not infinity
    worst = tokens.clone()
    worst[:, 0] = processed_probs(tiny.start(prompts, True).cond[:, -1], None, SC).argmin(-1)
    assert torch.isfinite(target_nll(tiny, prompts, worst, SC)).all()


def test_bootstrap_interval_covers_a_known_gap_at_its_level():
    rng = np.random.default_rng(0)
    hits, excludes_zero = 0, 0
    for rep in range(200):
        base = rng.normal(2.0, 1.0, 200)  # prompt difficulty, shared by both sets
        dec, ref = base + 0.3 + rng.normal(0, 0.5, 200), base + rng.normal(0, 0.5, 200)
        lo, hi = paired_gap(dec, ref, 0.95, n_boot=1000, seed=rep)["ci"]
        hits += lo <= 0.3 <= hi
        excludes_zero += lo > 0
    assert 0.90 <= hits / 200 <= 0.99  # a 95% interval covers the true gap about 95% of the time
    assert excludes_zero == 200  # and pairing removes the shared spread: a 0.3 gap is always seen


def test_ratio_gap_is_the_difference_of_pooled_rates():
    a, b, den = np.array([1, 2, 0, 3.]), np.array([1, 1, 0, 1.]), np.array([1, 2, 1, 3.])
    g = ratio_gap(a, b, den, n_boot=500)
    assert g["gap"] == pytest.approx((6 - 3) / 7)
    assert g["ci"][0] <= g["gap"] <= g["ci"][1]
    lo, hi = bootstrap_ci(np.zeros(10))
    assert lo == hi == 0


def test_lossless_indistinguishable_and_a_planted_lossy_setting_caught(tiny):
    prompts = [PROMPT] * 256
    seeds = list(range(256))
    specs = [DecodeSpec.parse("sjd:window=6"), DecodeSpec.parse("csd:window=6:lam=6:delta=1")]
    res = fidelity(tiny, specs, prompts, seeds, batch_size=64, log=lambda *_: None)
    rows = {r["decoder"]: r for r in res["rows"]}
    assert set(rows) == {"ar", "sjd:window=6", "csd:delta=1:lam=6:window=6"}
    for name in ("ar", "sjd:window=6"):
        assert rows[name]["indistinguishable"], rows[name]
    lossy = rows["csd:delta=1:lam=6:window=6"]
    assert not lossy["indistinguishable"] and lossy["nll_gap"] > 0 and not lossy["within_tolerance"], lossy
    assert lossy["forwards_per_image"] < rows["ar"]["forwards_per_image"]
    for r in rows.values():
        lo, hi = r["nll_gap_ci"]
        assert lo <= r["nll_gap"] <= hi and len(r["nll_gap_ci99"]) == 2 and r["fd_to_ar"] is None


def test_a_calibrated_spec_is_measured_at_every_choice_it_may_make():
    """A calibrated spec may decode with a window of 3 .. 8 tokens or of 1 .. rows rows (or AR, exact) depending on
    the device: fidelity measures each choice under its uncalibrated spec, and leaves every other spec as it is."""
    from ssdgen.bench.fidelity import choices, uncapped
    from ssdgen.decoders.spec import DecodeSpec
    spec = DecodeSpec.parse("ssd+csd:lam=1")  # the prefix engine, calibrated, rows 2 by default
    opts = choices(spec)
    assert sorted(opts) == ["r1", "r2", "w3", "w4", "w5", "w6", "w8"]
    assert opts["r1"].label == "ssd+csd:calibrated=false:lam=1:rows=1"
    assert opts["w5"].label == "ssd+csd:calibrated=false:lam=1:window=5"
    assert all(not o.config().calibrated and o.config().relax == spec.config().relax and o.sampling == spec.sampling
               for o in opts.values())
    assert uncapped(spec) == opts["r2"]
    block = choices(DecodeSpec.parse("ssd+csd:commit=block:max_rows=3"))
    assert [(o.config().rows, o.config().max_rows) for o in block.values()] == [(1, 1), (2, 2), (2, 3)]
    for text in ("csd", "ssd:lossless=true", "ssd+csd:commit=block:adaptive=true:calibrated=false:token_budget=8",
                 "ar"):
        assert choices(DecodeSpec.parse(text)) == {} and uncapped(DecodeSpec.parse(text)) == DecodeSpec.parse(text)
