"""The device calibration: on fake cost curves (flat, proportional, step, affine) the estimates favour the rows
they should, only plausible choices are timed, the fastest measured wins, a fall-back to plain AR is said, the
plan is decided once (tokens depend on the seed only), and a real curve on a tiny model has the right shape."""

import pytest
import torch

from ssdgen.decoders import decode
from ssdgen.decoders.calibrate import AR_FASTER, choose, worth_timing
from ssdgen.decoders.cost_curve import CostCurve, best_rows, measure_cost_curve, window_rates
from ssdgen.decoders.sampling import SamplingConfig
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


@pytest.mark.parametrize("name, f, want", [
    ("flat: the widest window is free", lambda s: 1.0, "2"),
    ("proportional: the window costs its tokens", lambda s: 0.01 * s, "0"),
    ("affine: overhead dominates, the window pays", lambda s: 10 + s, "2"),
    ("step: one row is free, two cost 4x", lambda s: 1.0 if s <= 17 else 4.0, "1"),
])
def test_window_rates_on_fake_curves(name, f, want):
    rates = window_rates(curve(f), 16, 2)
    assert set(rates) == {"0", "1", "2"} and max(rates, key=rates.get) == want, (name, rates)


def test_only_plausible_choices_are_timed_and_ties_go_to_fewer_rows():
    assert worth_timing({"0": 1.0, "1": 2.1, "2": 4.0}) == [1, 2]  # AR is under half the best estimate
    assert worth_timing({"0": 1.0, "1": 0.4}) == [0]
    assert choose({"0": 1.0, "1": 1.5, "2": 1.5}) == 1
    assert choose({"0": 2.0, "1": 1.5}) == 0


def _fake_device(monkeypatch, f, measured: dict | None = None) -> list:
    """The calibration sees cost curve f and, if it times choices, `measured` (images/s); returns the list of
    choice sets it timed."""
    import ssdgen.decoders.calibrate as cal
    timed = []
    monkeypatch.setattr(cal, "measure_cost_curve", lambda model, prompts, use_cfg, most: CostCurve(
        len(prompts), SIZES, tuple(float(f(s)) for s in SIZES)))

    def fake_time(model, prompts, seeds, batch, trial, decode_as):
        timed.append(trial)
        return {str(r): measured[str(r)] for r in trial}
    monkeypatch.setattr(cal, "_time_choices", fake_time)
    return timed


PREFIX = {"commit": "prefix", "adaptive": False, "calibrated": True, "rows": 2}


def test_calibrated_prefix_engine_decodes_as_planned_and_says_so(tmp_path, monkeypatch):
    """Proportional curve: AR without timing anything (the stats say so); flat curve: the windows are timed and
    the fastest measured (one row here) decodes, exactly as the uncalibrated spec with that many rows."""
    tiny = tiny_with_heads(tmp_path / "t")
    timed = _fake_device(monkeypatch, lambda s: 0.01 * s)
    res = decode("ssd+csd", tiny, PROMPTS, [0, 1], SAMPLED, PREFIX)
    assert torch.equal(res.tokens, decode("ar", tiny, PROMPTS, [0, 1], SAMPLED).tokens)
    assert timed == [] and all(s.ar_fallback == AR_FASTER and s.extra["rows"] == 0 for s in res.stats)
    tiny.__dict__.pop("_ssd_plans")
    timed = _fake_device(monkeypatch, lambda s: 1.0, {"1": 3.0, "2": 2.0})
    res = decode("ssd+csd", tiny, PROMPTS, [0, 1], SAMPLED, PREFIX)
    assert timed == [[1, 2]]  # AR's estimate is under half the widest window's: not worth timing
    st = res.stats[0]
    assert st.extra["policy"] == "calibrated: 1 row(s)" and st.extra["rows"] == 1 and st.extra["plan"]["rows"] == 1
    assert st.ar_fallback is None
    one_row = decode("ssd+csd", tiny, PROMPTS, [0, 1], SAMPLED, PREFIX | {"calibrated": False, "rows": 1})
    assert torch.equal(res.tokens, one_row.tokens)


def test_a_plan_is_decided_once_so_tokens_depend_on_the_seed_only(tmp_path):
    """Real timings on a real (tiny) model: the first batch calibrates; the plan is never revised, so the same
    seed gives the same tokens alone, in another batch, and again later, whatever the timings do."""
    tiny = tiny_with_heads(tmp_path / "t")
    first = decode("ssd+csd", tiny, PROMPTS, [0, 1], SAMPLED, PREFIX)
    plan = first.stats[0].extra["plan"]
    assert plan["batch"] == 2 and plan["seconds"] > 0 and str(plan["rows"]) in plan["estimates"]
    alone = decode("ssd+csd", tiny, PROMPTS[1:], [1], SAMPLED, PREFIX)
    again = decode("ssd+csd", tiny, PROMPTS[::-1], [1, 0], SAMPLED, PREFIX)
    assert torch.equal(alone.tokens[0], first.tokens[1]) and torch.equal(again.tokens.flip(0), first.tokens)
    assert alone.stats[0].extra["plan"] == plan and len(tiny.__dict__["_ssd_plans"]) == 1


def test_an_installed_plan_is_what_decodes(tmp_path):
    """A run's recorded plan (flows.pipeline) installed on a fresh model object decodes without calibrating."""
    from ssdgen.decoders import DecodeSpec, install_spec_plan, plan_of, run
    tiny = tiny_with_heads(tmp_path / "t")
    spec = DecodeSpec.parse("ssd+csd:cfg=3")
    plan = {"rows": 0, "batch": 16, "estimates": {"0": 1.0}, "measured": {}, "cost_curve": {}, "seconds": 0.0}
    assert plan_of(spec, tiny) is None
    install_spec_plan(spec, tiny, plan)
    assert plan_of(spec, tiny).rows == 0 and plan_of(DecodeSpec.parse("csd"), tiny) is None
    res = run(spec, tiny, PROMPTS, [0, 1])
    assert torch.equal(res.tokens, decode("ar", tiny, PROMPTS, [0, 1], SAMPLED).tokens)
    assert res.stats[0].extra["plan"] == plan


def test_curve_interpolates_and_extends_along_its_last_slope():
    c = curve(lambda s: 1 + s)
    assert c.time(3) == pytest.approx(4) and c.time(128) == pytest.approx(129)


def test_calibrated_block_decoder_follows_the_device(tmp_path, monkeypatch):
    tiny = tiny_with_heads(tmp_path / "t")
    W = tiny.grid[1]
    # proportional, AR measured fastest: AR, and the stats say so
    _fake_device(monkeypatch, lambda s: 0.01 * s, {"0": 2.0, "1": 1.0, "2": 1.0, "3": 1.0, "4": 1.0})
    block = {"commit": "block", "adaptive": True}  # the block decoder (ssd+csd's default is the prefix engine)
    res = decode("ssd+csd", tiny, PROMPTS, [0, 1], SAMPLED, block)
    ar = decode("ar", tiny, PROMPTS, [0, 1], SAMPLED)
    assert torch.equal(res.tokens, ar.tokens)
    assert all(s.ar_fallback == AR_FASTER and s.extra["rows_cap"] == 0 for s in res.stats)
    # flat: several caps are worth timing, and the fastest measured is the cap, with the curve in the stats
    timed = _fake_device(monkeypatch, lambda s: 1.0, {"2": 1.0, "3": 1.0, "4": 2.0})
    tiny.__dict__.pop("_ssd_plans")
    one = decode("ssd+csd", tiny, PROMPTS[:1], [0], SAMPLED, block | {"rows": 4})
    st = one.stats[0]
    assert timed == [[2, 3, 4]] and st.extra["rows_cap"] == 4
    assert tuple(st.extra["plan"]["cost_curve"]["tokens"]) == SIZES
    assert max(st.extra["block_sizes"]) == 4 * W - 1  # all rows after the prefill's token in one block


def test_measured_curve_on_a_real_model(tmp_path):
    tiny = tiny_model(tmp_path / "t")
    c = measure_cost_curve(tiny, PROMPTS, True, 16, reps=2)
    assert c.batch == 2 and c.tokens == (1, 2, 4, 8, 16) and all(t > 0 for t in c.seconds)


def test_calibrated_and_a_token_budget_are_exclusive():
    with pytest.raises(ValueError, match="calibrated and token_budget"):
        decode("ssd+csd", None, [], [], SAMPLED, {"token_budget": 64, "commit": "block"})
