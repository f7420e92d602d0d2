"""SSD on a tiny random model: lossless greedy equality and distribution, heads persistence and refusal,
and the self-distillation trainer."""

import pytest
import torch

from ssdgen.decoders import decode, decoder_config
from ssdgen.decoders.sample_stats import COMMIT_BONUS
from ssdgen.decoders.block import BUDGET_FULL
from ssdgen.decoders.drafters import HeadsConfig, SpatialHeads, model_fingerprint
from ssdgen.decoders.ssd_train import DistillConfig, train_heads
from test_decoders import GREEDY, POSITIONS, PROMPTS, SAMPLED, _same_distribution
from tiny import tiny_with_heads


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_with_heads(tmp_path_factory.mktemp("tiny"))


@pytest.mark.parametrize("params", [
    {}, {"rows": 1}, {"lossless": True, "rows": 1}, {"lossless": True, "rows": 2},
    {"lossless": True, "rows": 3, "two_d": False}, {"lossless": True, "window": 2},
    {"lossless": True, "window": 5}, {"lossless": True, "window": 5, "packed": False},
    {"lossless": True, "window": 8, "adaptive": True},
])
@pytest.mark.parametrize("batch", [1, 4])
def test_lossless_ssd_greedy_equals_ar(tiny, params, batch):
    prompts, seeds = PROMPTS[:batch], list(range(batch))
    ar = decode("ar", tiny, prompts, seeds, GREEDY)
    ssd = decode("ssd", tiny, prompts, seeds, GREEDY, params)
    assert torch.equal(ar.tokens, ssd.tokens)


@pytest.mark.slow
def test_lossless_ssd_samples_the_ar_distribution(tiny):
    from test_decoders import _sample as sample_
    ar = sample_(tiny, "ar", {}, offset=0)
    ssd = sample_(tiny, "ssd", {"lossless": True, "rows": 2}, offset=2_000_000)
    assert _same_distribution(ar, ssd) > 0.001 / len(POSITIONS)


@pytest.mark.slow
def test_lossless_ssd_in_a_short_window_samples_the_ar_distribution(tiny):
    from test_decoders import _sample as sample_
    ar = sample_(tiny, "ar", {}, offset=0)
    ssd = sample_(tiny, "ssd", {"lossless": True, "window": 3}, offset=3_000_000)
    assert _same_distribution(ar, ssd) > 0.001 / len(POSITIONS)


@pytest.mark.slow
def test_lossless_ssd_in_adaptive_windows_samples_the_ar_distribution(tiny):
    from test_decoders import _sample as sample_
    ar = sample_(tiny, "ar", {}, offset=0)
    ssd = sample_(tiny, "ssd", {"lossless": True, "window": 6, "adaptive": True}, offset=4_000_000)
    assert _same_distribution(ar, ssd) > 0.001 / len(POSITIONS)


@pytest.mark.parametrize("name, params", [("ssd", {"lossless": True, "window": 8, "adaptive": True}),
                                          ("ssd+csd", {"window": 5, "calibrated": False}),
                                          ("sjd", {"window": 6, "coupled": True, "adaptive": True})])
def test_the_packed_step_decodes_as_the_padded_one(tiny, name, params):
    """The packed step computes each sample's own window only; what it computes is what the padded step
    computed for those entries, so the samples are the same."""
    prompts, seeds = PROMPTS * 2, list(range(40, 48))
    packed = decode(name, tiny, prompts, seeds, SAMPLED, params)
    padded = decode(name, tiny, prompts, seeds, SAMPLED, params | {"packed": False})
    assert torch.equal(packed.tokens, padded.tokens)
    assert [s.forwards for s in packed.stats] == [s.forwards for s in padded.stats]
    assert sum(s.tokens_fed for s in packed.stats) < sum(s.tokens_fed for s in padded.stats)


def test_a_window_is_the_window_loops_and_in_range():
    assert decoder_config("ssd+csd", {"window": 5}).window == 5
    for bad, match in (({"window": 1}, "window must be an integer in"), ({"window": 65}, "window must be"),
                       ({"window": 5, "commit": "block"}, "block decoder")):
        with pytest.raises(ValueError, match=match):
            decoder_config("ssd", bad)


@pytest.mark.slow
def test_the_same_test_catches_a_broken_rule_in_lossless_ssd(tiny, monkeypatch):
    import ssdgen.decoders.window as window_mod
    from test_decoders import _resample_from_q
    from test_decoders import _sample as sample_
    ar = sample_(tiny, "ar", {}, offset=0)
    monkeypatch.setattr(window_mod, "verify", _resample_from_q)  # lossless SSD verifies in the window loop
    ssd = sample_(tiny, "ssd", {"lossless": True, "rows": 2}, offset=2_000_000)
    assert _same_distribution(ar, ssd) < 0.001 / len(POSITIONS)


@pytest.mark.parametrize("params", [{"rows": 2, "rounds": 1, "commit": "block"}, {"rows": 2, "lossless": True},
                                    {"rows": 2}, {"window": 4}, {"window": 8, "adaptive": True},
                                    {"window": 6, "lossless": True, "adaptive": True}])
def test_ssd_batch_gives_each_sample_its_batch_one_tokens(tiny, params):
    prompts, seeds = PROMPTS * 2, list(range(20, 28))
    batched = decode("ssd", tiny, prompts, seeds, SAMPLED, params)
    for b in range(8):
        alone = decode("ssd", tiny, prompts[b:b + 1], seeds[b:b + 1], SAMPLED, params)
        assert torch.equal(alone.tokens[0], batched.tokens[b])


def test_lossy_ssd_stats(tiny):
    res = decode("ssd", tiny, PROMPTS[:2], [0, 1], SAMPLED, {"rows": 2, "rounds": 1, "commit": "block"})
    for s in res.stats:
        bonuses = int((s.commit_map == COMMIT_BONUS).sum())
        assert 1 + sum(s.block_sizes) + bonuses == 16  # prefill token + blocks + bonus tokens
        assert s.forwards == 1 + sum(s.rounds_per_block)
        assert all(r <= 2 for r in s.rounds_per_block)


def test_token_budget_shrinks_blocks_and_falls_back_to_ar_when_the_batch_fills_it(tiny):
    W = tiny.grid[1]
    params = {"rows": 2, "max_rows": 3, "rounds": 1, "adaptive": True, "token_budget": 4 * W, "calibrated": False,
              "commit": "block"}
    one = decode("ssd+csd", tiny, PROMPTS[:1], [0], SAMPLED, params)  # 4 rows fit, capped at max_rows
    assert W < max(one.stats[0].block_sizes) <= 3 * W  # block sizes are in tokens
    four = decode("ssd+csd", tiny, PROMPTS[:4], [0, 1, 2, 3], SAMPLED, params)  # one row each
    assert all(max(s.block_sizes) <= W for s in four.stats)
    eight = decode("ssd+csd", tiny, PROMPTS[:4] * 2, list(range(8)), SAMPLED, params)  # no headroom: plain AR
    ar = decode("ar", tiny, PROMPTS[:4] * 2, list(range(8)), SAMPLED)
    assert torch.equal(eight.tokens, ar.tokens)
    assert all(s.ar_fallback == BUDGET_FULL and s.forwards == ar.stats[0].forwards for s in eight.stats)
    assert all(s.ar_fallback is None for s in four.stats)


def test_heads_for_another_model_or_shape_are_refused(tiny, tmp_path):
    cfg = HeadsConfig(dim=tiny.hidden_dim, emb_dim=tiny.hidden_dim, n_codes=tiny.n_codes, grid=tiny.grid,
                      model="someone-else@0123456789ab")
    SpatialHeads(cfg).save(tmp_path / "other")
    with pytest.raises(ValueError, match="trained for model 'someone-else"):
        SpatialHeads.load(tmp_path / "other", tiny)
    cfg = HeadsConfig(dim=tiny.hidden_dim * 2, emb_dim=tiny.hidden_dim, n_codes=tiny.n_codes, grid=tiny.grid,
                      model=model_fingerprint(tiny))
    SpatialHeads(cfg).save(tmp_path / "wide")
    with pytest.raises(ValueError, match="heads are for dim"):
        SpatialHeads.load(tmp_path / "wide", tiny)
    with pytest.raises(FileNotFoundError, match="train them"):
        SpatialHeads.load(tmp_path / "missing", tiny)


@pytest.mark.parametrize("params, name", [({"rows": 0}, "rows"), ({"rounds": -1}, "rounds"),
                                          ({"lossless": True, "lam": 0.5, "delta": 0.5}, "lossless"),
                                          ({"lossless": True, "token_budget": 8}, "token_budget")])
def test_bad_ssd_parameters_are_named(params, name):
    with pytest.raises(ValueError, match=name):
        decoder_config("ssd+csd" if "lam" in params else "ssd", params)


def test_self_distillation_reduces_the_heads_loss(tiny):
    prompts = PROMPTS * 4
    heads, info = train_heads(tiny, prompts, SAMPLED, DistillConfig(n_images=16, sample_batch=16, steps=60,
                                                                     batch=256), log=lambda *a: None)
    assert info["params"] > 0 and heads.cfg.model == model_fingerprint(tiny)
    # trained latent heads draft the model's own next token more often than identity heads
    from ssdgen.decoders.ssd_train import collect
    data = collect(tiny, PROMPTS, SAMPLED, DistillConfig(sample_batch=4, seed=5))
    h, e = data["h"], data["e"]
    fresh = SpatialHeads(heads.cfg)
    W = tiny.grid[1]
    n = h.shape[1] - W  # vertical pairs (h(i), e(x_i)) -> h(i + W)

    def agree(hd):
        pred = tiny.logits_from_hidden(hd.vertical(h[:, :n], e[:, :n])).argmax(-1)
        return (pred == tiny.logits_from_hidden(h[:, W:W + n]).argmax(-1)).float().mean()
    with torch.no_grad():
        assert agree(heads) > agree(fresh)
        # the acceptance measure (ssdgen eval-heads) agrees: trained heads draft better than identity heads
        from ssdgen.decoders.ssd_train import draft_acceptance
        trained = draft_acceptance(tiny, heads, PROMPTS, [0, 1, 2, 3], SAMPLED)
        identity = draft_acceptance(tiny, fresh, PROMPTS, [0, 1, 2, 3], SAMPLED)
        assert identity["vertical"] < trained["vertical"]
        assert identity["horizontal"] < trained["horizontal"]
        # by offset (eval-heads' table): offset 1 is the one-step measure, exact and drafted context alike
        from ssdgen.decoders.ssd_train import chain_acceptance
        by = chain_acceptance(tiny, heads, PROMPTS, [0, 1, 2, 3], SAMPLED, depth=2)
        for name in ("horizontal", "vertical"):
            assert by[name]["exact"][0] == pytest.approx(by[name]["drafted"][0])
            assert all(0.0 <= v <= 1.0 for v in by[name]["exact"] + by[name]["drafted"])
        # identity heads chained keep h(s): two rows down drafts from a stale state, worse than one exact step
        stale = chain_acceptance(tiny, fresh, PROMPTS, [0, 1, 2, 3], SAMPLED, depth=2)["vertical"]
        assert stale["drafted"][1] < stale["exact"][1]
        assert stale["exact"][0] < by["vertical"]["exact"][0]  # and the trained heads beat them by offset too
        with pytest.raises(ValueError, match="depth"):  # a chain longer than the grid is named, not an index error
            chain_acceptance(tiny, heads, PROMPTS, [0], SAMPLED, depth=tiny.grid[0])


def test_rollout_training_learns_from_chained_drafts(tiny):
    """rollout=2 trains each head on its own prediction one step back (the decoder's chained drafts): its
    two-step chained acceptance beats the untrained heads'; a rollout below 1 is refused."""
    from ssdgen.decoders.ssd_train import chain_acceptance
    with pytest.raises(ValueError, match="rollout"):
        DistillConfig(rollout=0)
    with pytest.raises(ValueError, match="rollout"):  # a chain past the grid, named before any sampling
        train_heads(tiny, PROMPTS, SAMPLED, DistillConfig(rollout=tiny.grid[0]), log=lambda *a: None)
    heads, info = train_heads(tiny, PROMPTS * 4, SAMPLED, DistillConfig(n_images=16, sample_batch=16, steps=60,
                                                                        batch=256, rollout=2), log=lambda *a: None)
    assert info["rollout"] == 2
    with torch.no_grad():
        trained = chain_acceptance(tiny, heads, PROMPTS, [0, 1, 2, 3], SAMPLED, depth=2)
        fresh = chain_acceptance(tiny, SpatialHeads(heads.cfg), PROMPTS, [0, 1, 2, 3], SAMPLED, depth=2)
    for name in ("horizontal", "vertical"):
        assert trained[name]["drafted"][1] > fresh[name]["drafted"][1]


def test_bare_ssd_runs_the_window_loop_and_the_block_decoder_must_be_named():
    """The recipe table: ssd is the window loop with the heads' drafts and the exact rule (within the fidelity
    tolerance by construction); the lossy block decoder only with commit=block, and never as lossless."""
    from ssdgen.decoders.recipes import BlockConfig, WindowConfig
    from ssdgen.decoders.recipes import RECIPES, recipe
    ssd = RECIPES["ssd"]
    assert (ssd.loop, ssd.drafter, ssd.acceptance) == ("window", "heads", "exact")
    assert recipe("ssd").loop == "window" and isinstance(decoder_config("ssd"), WindowConfig)
    assert recipe("ssd", {"commit": "block"}).loop == "block"
    assert isinstance(decoder_config("ssd", {"commit": "block"}), BlockConfig)
    with pytest.raises(ValueError, match="lossy: ssd:lossless=true .without commit=block. is the lossless"):
        decoder_config("ssd", {"commit": "block", "lossless": True})
    assert {f: (RECIPES[f].loop, RECIPES[f].drafter, RECIPES[f].acceptance) for f in ("sjd", "csd", "ssd+csd")} \
        == {"sjd": ("window", "guess", "exact"), "csd": ("window", "guess", "relaxed"),
            "ssd+csd": ("window", "heads", "relaxed")}
    assert "lossy" in ssd.describe()
