"""The device calibration: on fake cost curves (flat, proportional, step, affine) the estimates favour the rows
they should, only plausible choices are timed, the fastest measured wins, a fall-back to plain AR is said, a
calibrated spec resolves to a concrete one (whose tokens depend on the seed only), and a real curve on a tiny
model has the right shape."""

import pytest
import torch

from ssdgen.decoders import DecodeSpec, Measurements, decode, resolve, run
from ssdgen.decoders.calibrate import AR_FASTER, choose, worth_timing
from ssdgen.decoders.cost_curve import CostCurve, best_rows, measure_cost_curve, window_rates
from ssdgen.decoders.sampling import SamplingConfig
from ssdgen.decoders.spec import speculative_rows
from tiny import tiny_model, tiny_with_heads

SIZES = (1, 2, 4, 8, 16, 32, 64)
PROMPTS = ["a large red circle at the center on a flat gray background",
           "a small blue square at the top left on a wavy beige background"]
SAMPLED = SamplingConfig(cfg_scale=3.0)
SAMPLED_TEXT = ":cfg=3.0:temperature=1.0:top_k=0:top_p=1.0"


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


def _spec(params: dict) -> DecodeSpec:
    return DecodeSpec.of("ssd+csd", params, SAMPLED)


def test_calibrated_prefix_engine_resolves_to_the_fastest_choice_and_says_so(tmp_path, monkeypatch):
    """Proportional curve: plain AR with the same sampling, without timing anything (the measurements say why);
    flat curve: the windows are timed and the fastest measured (one row here) is the concrete spec, which decodes
    exactly as the uncalibrated spec with that many rows."""
    tiny = tiny_with_heads(tmp_path / "t")
    timed = _fake_device(monkeypatch, lambda s: 0.01 * s)
    spec, m = resolve(_spec(PREFIX), tiny, PROMPTS, [0, 1], 2)
    assert spec == DecodeSpec("ar", (), SAMPLED) and timed == [] and m.why == AR_FASTER and m.measured == {}
    assert torch.equal(run(spec, tiny, PROMPTS, [0, 1]).tokens, decode("ar", tiny, PROMPTS, [0, 1], SAMPLED).tokens)
    timed = _fake_device(monkeypatch, lambda s: 1.0, {"1": 3.0, "2": 2.0})
    spec, m = resolve(_spec(PREFIX), tiny, PROMPTS, [0, 1], 2)
    assert timed == [[1, 2]]  # AR's estimate is under half the widest window's: not worth timing
    assert str(spec) == "ssd+csd:adaptive=false:calibrated=false:commit=prefix:rows=1" + SAMPLED_TEXT
    assert m.why is None and m.measured == {"1": 3.0, "2": 2.0} and m.batch == 2
    one_row = decode("ssd+csd", tiny, PROMPTS, [0, 1], SAMPLED, PREFIX | {"calibrated": False, "rows": 1})
    assert torch.equal(run(spec, tiny, PROMPTS, [0, 1]).tokens, one_row.tokens)


def test_a_resolved_spec_decodes_by_its_seed_only(tmp_path):
    """Real timings on a real (tiny) model: the resolved spec is concrete, so the same seed gives the same tokens
    alone, in another batch, and again later, whatever the timings do; the measurements round-trip as a dict."""
    tiny = tiny_with_heads(tmp_path / "t")
    spec, m = resolve(_spec(PREFIX), tiny, PROMPTS, [0, 1], 2)
    assert m.batch == 2 and m.seconds > 0 and str(speculative_rows(spec)) in m.estimates
    assert Measurements.from_dict(m.to_dict()) == m and not spec.calibrated
    first = run(spec, tiny, PROMPTS, [0, 1])
    alone = run(spec, tiny, PROMPTS[1:], [1])
    again = run(DecodeSpec.parse(str(spec)), tiny, PROMPTS[::-1], [1, 0])
    assert torch.equal(alone.tokens[0], first.tokens[1]) and torch.equal(again.tokens.flip(0), first.tokens)
    assert not any(k.startswith("_ssd") for k in tiny.__dict__)  # nothing kept on the model object


def test_run_refuses_a_calibrated_spec_and_other_specs_resolve_to_themselves(tmp_path):
    tiny = tiny_with_heads(tmp_path / "t")
    with pytest.raises(ValueError, match="resolve it first"):
        run(DecodeSpec.parse("ssd+csd:cfg=3"), tiny, PROMPTS, [0, 1])
    for text in ("ar", "csd", "ssd", "ssd+csd:calibrated=false:rows=1"):
        assert resolve(DecodeSpec.parse(text), tiny, PROMPTS, [0, 1], 2) == (DecodeSpec.parse(text), None)


def test_curve_interpolates_and_extends_along_its_last_slope():
    c = curve(lambda s: 1 + s)
    assert c.time(3) == pytest.approx(4) and c.time(128) == pytest.approx(129)


def test_calibrated_block_decoder_follows_the_device(tmp_path, monkeypatch):
    tiny = tiny_with_heads(tmp_path / "t")
    W = tiny.grid[1]
    # proportional, AR measured fastest: AR, and the measurements say so
    _fake_device(monkeypatch, lambda s: 0.01 * s, {"0": 2.0, "1": 1.0, "2": 1.0, "3": 1.0, "4": 1.0})
    block = {"commit": "block", "adaptive": True}  # the block decoder (ssd+csd's default is the prefix engine)
    spec, m = resolve(_spec(block), tiny, PROMPTS, [0, 1], 2)
    assert spec.family == "ar" and m.why == AR_FASTER
    # flat: several caps are worth timing, and the fastest measured is the cap, with the curve measured
    timed = _fake_device(monkeypatch, lambda s: 1.0, {"2": 1.0, "3": 1.0, "4": 2.0})
    spec, m = resolve(_spec(block | {"rows": 4}), tiny, PROMPTS[:1], [0], 1)
    assert timed == [[2, 3, 4]] and spec.config().max_rows == 4 and speculative_rows(spec) == 4
    assert tuple(m.cost_curve["tokens"]) == SIZES
    one = run(spec, tiny, PROMPTS[:1], [0])
    assert max(one.stats[0].block_sizes) == 4 * W - 1  # all rows after the prefill's token in one block


def test_measured_curve_on_a_real_model(tmp_path):
    tiny = tiny_model(tmp_path / "t")
    c = measure_cost_curve(tiny, PROMPTS, True, 16, reps=2)
    assert c.batch == 2 and c.tokens == (1, 2, 4, 8, 16) and all(t > 0 for t in c.seconds)


def test_calibrated_and_a_token_budget_are_exclusive():
    with pytest.raises(ValueError, match="calibrated and token_budget"):
        decode("ssd+csd", None, [], [], SAMPLED, {"token_budget": 64, "commit": "block"})
