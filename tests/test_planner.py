"""The planner (decoders/planner.py): on fake device profiles the objective picks what it should (a flat curve: a
window; a proportional one: plain AR; latency: batch 1); the pilot's histograms give each window's tokens per
forward; a calibrated spec resolves to a concrete one whose tokens depend on the seed only, from a real or a
cached profile; the cache round-trips and refuses a damaged file; the block decoder's choices are its caps."""

import json

import pytest
import torch

from ssdgen.decoders import DecodeSpec, Plan, decode, resolve, run
from ssdgen.decoders.cost_curve import CostCurve
from ssdgen.decoders.planner import AR, Profile, acceptance, candidates, decide
from ssdgen.decoders.recipes import SamplingConfig
from tiny import tiny_with_heads

PROMPTS = ["a large red circle at the center on a flat gray background",
           "a small blue square at the top left on a wavy beige background"]
SAMPLED = SamplingConfig(cfg_scale=3.0)
SIZES = (1, 3, 5, 8, 17, 33)
SPEC = DecodeSpec.of("ssd+csd", {}, SAMPLED)  # calibrated, the prefix engine, 2 rows


def profile(f, batches=(1, 16, 64)) -> Profile:
    """A fake device: a forward of s tokens at batch b takes f(b, s) seconds."""
    return Profile({b: CostCurve(b, SIZES, tuple(float(f(b, s)) for s in SIZES)) for b in batches}, 0.0)


# tokens per forward by window; "9": the tiny grid's 2 rows
ACCEPT = {"3": 2.5, "4": 3.2, "5": 3.8, "6": 4.3, "8": 5.0, "9": 5.2, "17": 7.0, "33": 8.0}
BATCHES = [1, 4, 16, 64, 256]


def test_candidates_are_ar_windows_and_rows_and_short_windows_relax_less():
    c = candidates(SPEC, 16)
    assert list(c) == [AR, "w3", "w4", "w5", "w6", "w8", "r1", "r2"]
    assert c["w5"][1] == 5 and c["r1"][1] == 17 and c["r2"][1] == 33 and c[AR][0].family == "ar"
    assert c["w5"][0].config().relax.lam == 1.0 and c["r1"][0].config().relax.lam == 2.0
    assert all(not s.calibrated for s, _ in c.values())
    assert candidates(DecodeSpec.of("ssd+csd", {"lam": 0.5}, SAMPLED), 16)["w5"][0].config().relax.lam == 0.5
    assert list(candidates(DecodeSpec.parse("sjd:window=8"), 16)) == ["as-is"]


@pytest.mark.parametrize("name, f, objective, want", [
    ("a fixed cost per forward: the widest window, at the largest batch", lambda b, s: 1 + 0.001 * b,
     "throughput", ("r2", 256)),
    ("a token costs the same however fed: plain AR, at the smallest batch", lambda b, s: 0.01 * b * s,
     "throughput", (AR, 1)),
    ("latency: batch 1, the fastest there", lambda b, s: 1.0 if b == 1 else b * s, "latency", ("r2", 1)),
    ("affine in tokens: a short window", lambda b, s: b * (1 + 0.5 * s), "throughput", ("w5", 1)),
])
def test_decide_on_fake_profiles(name, f, objective, want):
    choice, batch, est = decide(SPEC, 16, 256, objective, BATCHES, profile(f), ACCEPT)
    assert (choice, batch) == want, (name, est)
    assert est[f"{choice}@{batch}"] >= 0.97 * max(v for k, v in est.items()
                                                  if objective == "throughput" or k.endswith("@1"))


def test_a_smaller_batch_within_the_slack_wins_and_profiles_interpolate():
    p = profile(lambda b, s: 0.01 * b * s + 0.01)  # a fixed cost per forward, then proportional to the batch
    assert p.time(40, 5) == pytest.approx((p.time(16, 5) + p.time(64, 5)) / 2)
    assert p.time(256, 1) == pytest.approx(p.time(64, 1) + (p.time(64, 1) - p.time(16, 1)) * 4)
    _, batch, _ = decide(SPEC, 16, 256, "throughput", BATCHES, p, ACCEPT)
    assert batch == 64  # batch 256 is 1% faster: within the slack, the smaller one


def test_acceptance_from_pilot_histograms():
    # the prefill's one token (hist[1] includes it), 3 forwards of 1 token, 2 of 3 tokens
    acc = acceptance([[0, 4, 0, 2]], [2, 3, 8])
    assert acc == {"2": pytest.approx((3 + 2 * 2) / 5), "3": pytest.approx((3 + 2 * 3) / 5),
                   "8": pytest.approx((3 + 2 * 3) / 5)}


def test_resolve_plans_once_and_its_spec_decodes_by_the_seed_only(tmp_path):
    """Real profile and pilot on a tiny model: a concrete spec, a plan that says why and round-trips, tokens
    that the seed alone decides (alone, in another batch, reversed), and nothing kept on the model."""
    tiny = tiny_with_heads(tmp_path / "t")
    spec, plan = resolve(SPEC, tiny, PROMPTS, [0, 1], 2)
    assert not spec.calibrated and plan.batch == 2 and plan.seconds > 0 and not plan.cached
    assert plan.choice in candidates(SPEC, tiny.grid[1]) and plan.why and f"{plan.choice}@2" in plan.estimates
    assert Plan.from_dict(json.loads(json.dumps(plan.to_dict()))) == plan
    first = run(spec, tiny, PROMPTS, [0, 1])
    alone = run(spec, tiny, PROMPTS[1:], [1])
    again = run(DecodeSpec.parse(str(spec)), tiny, PROMPTS[::-1], [1, 0])
    assert torch.equal(alone.tokens[0], first.tokens[1]) and torch.equal(again.tokens.flip(0), first.tokens)
    assert not any(k.startswith("_ssd") for k in tiny.__dict__)
    # the same measurements, cached: the same decision, nothing measured
    again_spec, cached = resolve(SPEC, tiny, PROMPTS, [0, 1], 2, cached={"profile": plan.profile,
                                                                          "acceptance": plan.acceptance})
    assert again_spec == spec and cached.cached and cached.estimates == plan.estimates


def test_a_fake_flat_device_chooses_a_window_that_decodes_as_its_uncalibrated_spec(tmp_path):
    tiny = tiny_with_heads(tmp_path / "t")
    flat = {"profile": profile(lambda b, s: 1.0, (1, 2)).to_dict(), "acceptance": ACCEPT}
    spec, plan = resolve(SPEC, tiny, PROMPTS, [0, 1], 2, cached=flat)
    assert plan.choice == "r2" and "2-row window at batch 2" in plan.why and "plain AR" in plan.why
    want = decode("ssd+csd", tiny, PROMPTS, [0, 1], SAMPLED, {"calibrated": False, "rows": 2})
    assert torch.equal(run(spec, tiny, PROMPTS, [0, 1]).tokens, want.tokens)
    prop = {"profile": profile(lambda b, s: 0.01 * b * s, (1, 2)).to_dict(), "acceptance": ACCEPT}
    spec, plan = resolve(SPEC, tiny, PROMPTS, [0, 1], 2, cached=prop)
    assert spec == DecodeSpec("ar", (), SAMPLED) and plan.why.startswith("plain AR at batch 2")


def test_the_block_decoders_choices_are_its_caps_and_concrete_specs_resolve_to_themselves(tmp_path):
    block = DecodeSpec.of("ssd+csd", {"commit": "block", "adaptive": True, "rows": 2}, SAMPLED)
    c = candidates(block, 16)
    assert list(c) == [AR, "r1", "r2", "r3", "r4"]
    assert [(s.config().rows, s.config().max_rows) for k, (s, _) in c.items() if k != AR] == \
        [(1, 1), (2, 2), (2, 3), (2, 4)]
    tiny = tiny_with_heads(tmp_path / "t")
    with pytest.raises(ValueError, match="resolve it first"):
        run(SPEC, tiny, PROMPTS, [0, 1])
    for text in ("ar", "csd", "ssd", "ssd+csd:calibrated=false:rows=1", "ssd+csd:calibrated=false:window=5"):
        assert resolve(DecodeSpec.parse(text), tiny, PROMPTS, [0, 1], 2) == (DecodeSpec.parse(text), None)


def test_the_plan_cache_round_trips_and_refuses_a_damaged_file(tmp_path, monkeypatch):
    from ssdgen.workers import plan_cache
    monkeypatch.setenv("SSDGEN_CACHE", str(tmp_path / "cache"))
    tiny = tiny_with_heads(tmp_path / "t")
    k = plan_cache.key(tiny, SPEC, 16)
    assert plan_cache.load(k) is None and k != plan_cache.key(tiny, SPEC, 64)
    p = Plan("throughput", AR, 16, "why", {}, ACCEPT, profile(lambda b, s: 1.0).to_dict(), 1.0)
    plan_cache.save(k, p)
    assert plan_cache.load(k) == {"profile": p.profile, "acceptance": ACCEPT}
    (plan_cache.cache_dir() / f"{k}.json").write_text('{"profile": {"curves": 3}')
    assert plan_cache.load(k) is None
