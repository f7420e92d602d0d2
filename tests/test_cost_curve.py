"""The device-calibrated block policy: on fake cost curves (flat, proportional, step, affine) it picks the
rows per block that maximise expected committed tokens per second, falls back to plain AR (and says so)
when that is faster, and a real measurement on a tiny model has the shape the policy needs."""

import pytest
import torch

from decoders import decode
from decoders.cost_curve import CostCurve, best_rows, measure_cost_curve, speculate_window
from decoders.sampling import SamplingConfig
from tiny import tiny_model, tiny_with_heads

SIZES = (1, 2, 4, 8, 16, 32, 64)
PROMPTS = ["a large red circle at the center on a flat gray background",
           "a small blue square at the top left on a wavy beige background"]
SAMPLED = SamplingConfig(cfg_scale=3.0)


def curve(f) -> CostCurve:
    return CostCurve(1, SIZES, tuple(float(f(s)) for s in SIZES))


@pytest.mark.parametrize("name, f, fpb, want", [
    ("flat: more tokens are free", lambda s: 1.0, 3.0, 4),
    ("proportional: a token costs the same however fed", lambda s: 0.01 * s, 2.0, 0),
    ("proportional, every draft kept: a tie goes to AR", lambda s: 0.01 * s, 1.0, 0),
    ("step: flat up to 32 tokens, then 4x", lambda s: 1.0 if s <= 32 else 4.0, 2.0, 2),
    ("affine: fixed overhead dominates", lambda s: 10 + s, 2.0, 4),
    ("affine, but rounds eat it", lambda s: 1 + s, 3.0, 0),
])
def test_best_rows_on_fake_curves(name, f, fpb, want):
    rows, rates = best_rows(curve(f), 16, 4, fpb)
    assert rows == want, (name, rates)
    assert rates[str(rows)] == max(rates.values())


@pytest.mark.parametrize("name, f, tpf, want", [
    ("flat: the window is free", lambda s: 1.0, 1.5, True),
    ("proportional: the window costs its tokens", lambda s: 0.01 * s, 5.0, False),
    ("affine: overhead dominates, 5 tokens a forward pay", lambda s: 10 + s, 5.0, True),
    ("affine, too few tokens a forward", lambda s: 10 + s, 2.0, False),
])
def test_speculate_window_on_fake_curves(name, f, tpf, want):
    go, rates = speculate_window(curve(f), 33, tpf)
    assert go == want, (name, rates)
    # a measured rate (wall clock, drafting and verification included) replaces that choice's estimate
    slower = {"window": 0.9 * rates["0"]} if go else {"0": 0.9 * rates["window"]}
    assert speculate_window(curve(f), 33, tpf, slower)[0] != go


def test_calibrated_prefix_engine_falls_back_to_ar_and_learns(tmp_path):
    """commit=prefix with calibrated: plain AR where the window does not pay (the stats say so), the window
    where it does, and the tokens per forward it saw kept for the next batch's plan."""
    tiny = tiny_with_heads(tmp_path / "t")
    W = tiny.grid[1]
    window = min(64, 2 * W + 1)
    spec = {"commit": "prefix", "adaptive": False, "calibrated": True, "rows": 2}
    proportional = CostCurve(2, SIZES, tuple(0.01 * s for s in SIZES))
    tiny.__dict__.setdefault("_cost_curves", {})[(2, True, window)] = proportional
    res = decode("ssd+csd", tiny, PROMPTS, [0, 1], SAMPLED, spec)
    assert torch.equal(res.tokens, decode("ar", tiny, PROMPTS, [0, 1], SAMPLED).tokens)
    assert all(s.extra["policy"].startswith("ar:") and s.extra["rows"] == 0 for s in res.stats)
    assert "_prefix_tokens_per_forward" not in tiny.__dict__
    tiny.__dict__["_cost_curves"][(1, True, window)] = CostCurve(1, SIZES, (1.0,) * len(SIZES))
    one = decode("ssd+csd", tiny, PROMPTS[:1], [0], SAMPLED, spec)
    st = one.stats[0]
    assert st.extra["policy"] == "cost curve" and st.extra["rows"] == 2 and st.forwards < tiny.grid[0] * W
    assert tiny.__dict__["_prefix_tokens_per_forward"][window] == pytest.approx(tiny.grid[0] * W / st.forwards)
    measured = tiny.__dict__["_prefix_rates"]
    assert set(measured[(2, window)]) == {"0"} and set(measured[(1, window)]) == {"window"}
    measured[(1, window)]["0"] = 10 * measured[(1, window)]["window"]  # AR measured faster at batch 1
    again = decode("ssd+csd", tiny, PROMPTS[:1], [0], SAMPLED, spec)
    st = again.stats[0]
    assert st.extra["policy"].startswith("ar:") and st.extra["measured_rates"] == ["0", "window"]


def test_curve_interpolates_and_extends_along_its_last_slope():
    c = curve(lambda s: 1 + s)
    assert c.time(3) == pytest.approx(4) and c.time(128) == pytest.approx(129)


def _with_curve(model, batch: int, f) -> None:
    W = model.grid[1]
    model.__dict__.setdefault("_cost_curves", {})[(batch, True, 4 * W)] = CostCurve(batch, SIZES, tuple(
        float(f(s)) for s in SIZES))


def test_calibrated_block_decoder_follows_the_device(tmp_path):
    tiny = tiny_with_heads(tmp_path / "t")
    W = tiny.grid[1]
    _with_curve(tiny, 2, lambda s: 0.01 * s)  # proportional: AR is best, and the stats say so
    block = {"commit": "block", "adaptive": True}  # the block decoder (ssd+csd's default is the prefix engine)
    res = decode("ssd+csd", tiny, PROMPTS, [0, 1], SAMPLED, block)
    ar = decode("ar", tiny, PROMPTS, [0, 1], SAMPLED)
    assert torch.equal(res.tokens, ar.tokens)
    assert all(s.extra["policy"].startswith("ar:") and s.extra["rows_cap"] == 0 for s in res.stats)
    _with_curve(tiny, 1, lambda s: 1.0)  # flat: the cap is max_rows, and the curve is in the stats
    one = decode("ssd+csd", tiny, PROMPTS[:1], [0], SAMPLED, block | {"rows": 4})
    st = one.stats[0]
    assert st.extra["rows_cap"] == 4 and tuple(st.extra["cost_curve"]["tokens"]) == SIZES
    assert max(st.extra["block_sizes"]) == 4 * W - 1  # all rows after the prefill's token in one block
    assert tiny.__dict__["_ssd_forwards_per_block"] >= 1  # the running estimate the next batch plans with


def test_measured_curve_on_a_real_model(tmp_path):
    tiny = tiny_model(tmp_path / "t")
    c = measure_cost_curve(tiny, PROMPTS, True, 16, reps=2)
    assert c.batch == 2 and c.tokens == (1, 2, 4, 8, 16) and all(t > 0 for t in c.seconds)


def test_calibrated_and_a_token_budget_are_exclusive():
    with pytest.raises(ValueError, match="calibrated and token_budget"):
        decode("ssd+csd", None, [], [], SAMPLED, {"token_budget": 64, "commit": "block"})
