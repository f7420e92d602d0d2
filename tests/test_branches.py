"""Proactive drafting (decoders/window.py: Branches) and the continuation of drafts (window.py): tree attention in the
model, the candidates' test, and the decoders that use them, exact (greedy), statistical and unit tiers."""

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

import ssdgen.decoders.window as window_mod
from ssdgen.decoders import decode, decoder_config
from ssdgen.decoders.sampling import sample_from
from ssdgen.decoders.verify import residual, verify_candidates
from test_decoders import GREEDY, POSITIONS, PROMPTS, SAMPLED, _sample, _same_distribution
from tiny import tiny_with_heads


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_with_heads(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def ar_samples(tiny):
    return _sample(tiny, "ar", {}, offset=0)


# ------------------------------------------------------------------ unit tier: the candidates' test

def test_a_draft_then_candidates_then_the_last_residual_samples_q():
    # the whole first level: a draft x ~ p kept with min(1, q/p), else candidates against the residual, else a draw
    # from what is left; over many uniforms the token's distribution must be q
    torch.manual_seed(0)
    V, B = 6, 200_000
    q, p = torch.tensor([.3, .25, .2, .15, .07, .03]), torch.tensor([.05, .1, .5, .05, .2, .1])
    u = torch.rand(B, 6)
    x = sample_from(p.expand(B, V), u[:, 0])
    keep = u[:, 1] < (q[x] / p[x]).clamp(max=1)
    cands = torch.tensor([[0, 1, 3]]).expand(B, 3)  # fixed in advance, one of them may equal x
    won, r_last = verify_candidates(residual(q.expand(B, V), p.expand(B, V)), cands, u[:, 2:5])
    token = torch.where(keep, x, torch.where(won >= 0, cands.gather(1, won.clamp(min=0)[:, None])[:, 0],
                                             sample_from(r_last, u[:, 5])))
    counts = np.bincount(token.numpy(), minlength=V)
    expected = q.double().numpy() / q.double().sum().item() * B
    assert chisquare(counts, expected).pvalue > 1e-3
    assert (won >= 0).float().mean() > 0.2  # the candidates did the work they are there for


def test_candidates_are_tested_in_order_and_the_first_accepted_wins():
    r = torch.tensor([[0.5, 0.5, 0.0, 0.0]])
    won, left = verify_candidates(r, torch.tensor([[2, 0, 1]]), torch.tensor([[0.0, 0.9, 0.1]]))
    assert won.item() == 2  # c=2 has no mass; c=0 fails at 0.9 > 0.5; c=1 then has mass 1
    won, left = verify_candidates(r, torch.tensor([[0, 1]]), torch.tensor([[0.2, 0.0]]))
    assert won.item() == 0


# ------------------------------------------------------------------ the model's tree attention

def test_a_tree_step_gives_each_branch_what_a_plain_step_gives_it(tiny):
    prompt, start = PROMPTS[:1], 5
    ctx = torch.tensor([[3, 1, 4, 1, 5]])
    tiny.start(prompt, True)
    tiny.step(ctx, torch.arange(start)[None])
    # root y at index 5, main [y, a, b, c], branches [d, b] and [e, b] at indices 6, 7
    tokens = torch.tensor([[2, 6, 7, 0, 5, 7, 3, 7]])
    index = torch.tensor([[5, 6, 7, 8, 6, 7, 6, 7]])
    tree = torch.zeros(1, 8, 8, dtype=torch.bool)
    for s, seen in {0: [0], 1: [0, 1], 2: [0, 1, 2], 3: [0, 1, 2, 3], 4: [0, 4], 5: [0, 4, 5], 6: [0, 6],
                    7: [0, 6, 7]}.items():
        tree[0, s, seen] = True
    out = tiny.step(tokens, index, tree=tree)
    for chain in ([0, 1, 2, 3], [0, 4, 5], [0, 6, 7]):
        tiny.start(prompt, True)
        tiny.step(ctx, torch.arange(start)[None])
        plain = tiny.step(tokens[:, chain], index[:, chain])
        torch.testing.assert_close(out.cond[:, chain], plain.cond, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(out.uncond[:, chain], plain.uncond, atol=1e-4, rtol=1e-4)


def test_a_branchs_copied_cache_continues_as_if_it_had_been_fed_in_place(tiny):
    prompt, ctx = PROMPTS[:1], torch.tensor([[3, 1, 4, 1, 5]])
    tiny.start(prompt, True)
    tiny.step(ctx, torch.arange(5)[None])
    tokens, index = torch.tensor([[2, 6, 7, 4, 3]]), torch.tensor([[5, 6, 7, 6, 7]])  # branch [4, 3] at 6, 7
    tree = torch.tensor([[[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [1, 0, 0, 1, 0], [1, 0, 0, 1, 1]]],
                        dtype=torch.bool)
    tiny.step(tokens, index, tree=tree)
    tiny.copy_cache(torch.tensor([[5 + 3, 5 + 4]]), torch.tensor([[6, 7]]), torch.tensor([[True, True]]))
    after = tiny.step(torch.tensor([[1]]), torch.tensor([[8]]))
    tiny.start(prompt, True)
    full = tiny.step(torch.tensor([[3, 1, 4, 1, 5, 2, 4, 3, 1]]), torch.arange(9)[None])
    torch.testing.assert_close(after.cond[:, 0], full.cond[:, -1], atol=1e-4, rtol=1e-4)


# ------------------------------------------------------------------ exact tier

BRANCHED = [("sjd", {"window": 6, "coupled": True, "branches": 3}),
            ("sjd", {"window": 6, "branches": 4, "branch_len": 2, "continuation": True}),
            ("ssd", {"lossless": True, "branches": 3}),
            ("ssd", {"lossless": True, "window": 8, "adaptive": True, "branches": 2, "continuation": True})]


@pytest.mark.parametrize("name, params", BRANCHED)
@pytest.mark.parametrize("batch", [1, 4])
def test_branches_and_continuation_decode_greedy_as_ar(tiny, name, params, batch):
    prompts, seeds = PROMPTS[:batch], list(range(batch))
    assert torch.equal(decode("ar", tiny, prompts, seeds, GREEDY).tokens,
                       decode(name, tiny, prompts, seeds, GREEDY, params).tokens)


@pytest.mark.parametrize("name, params", BRANCHED)
def test_a_branched_sample_decodes_alone_as_in_its_batch(tiny, name, params):
    prompts, seeds = PROMPTS * 2, list(range(20, 28))
    batched = decode(name, tiny, prompts, seeds, SAMPLED, params)
    for b in (0, 5):
        alone = decode(name, tiny, prompts[b:b + 1], seeds[b:b + 1], SAMPLED, params)
        assert torch.equal(alone.tokens[0], batched.tokens[b])


def test_branches_save_forwards_and_say_so(tiny):
    prompts, seeds = PROMPTS * 8, list(range(32))
    base = decode("sjd", tiny, prompts, seeds, SAMPLED, {"window": 6, "coupled": True})
    tree = decode("sjd", tiny, prompts, seeds, SAMPLED, {"window": 6, "coupled": True, "branches": 4})
    assert np.mean([s.forwards for s in tree.stats]) < np.mean([s.forwards for s in base.stats])
    assert tree.stats[0].extra["branches"] == 4 and tree.stats[0].extra["branch_len"] == 5


@pytest.mark.parametrize("params, name", [({"branches": 9}, "branches"), ({"branch_len": 64}, "branch_len"),
                                          ({"window": 64, "branches": 8, "branch_len": 32}, "192"),
                                          ({"branches": 2, "packed": False}, None)])
def test_bad_branch_settings_are_named(tiny, params, name):
    with pytest.raises(ValueError, match=name or "packed"):
        cfg = decoder_config("sjd", params)
        decode("sjd", tiny, PROMPTS[:1], [0], SAMPLED, params) if cfg else None
    with pytest.raises(ValueError, match="commit=block"):
        decoder_config("ssd", {"commit": "block", "branches": 2})


def test_a_model_without_tree_attention_is_refused(tiny):
    from ssdgen.decoders.protocol import Capabilities

    class Plain:  # the protocol without tree attention, as the HF adapters are
        capabilities = Capabilities()

        def __getattr__(self, k):
            return getattr(tiny, k)
    with pytest.raises(ValueError, match="tree attention"):
        decode("sjd", Plain(), PROMPTS[:1], [0], SAMPLED, {"branches": 2})


# ------------------------------------------------------------------ statistical tier

@pytest.mark.slow
@pytest.mark.parametrize("name, params, offset", [
    ("sjd", {"window": 6, "coupled": True, "branches": 3}, 5_000_000),
    ("ssd", {"lossless": True, "window": 6, "branches": 3, "continuation": True}, 6_000_000),
])
def test_branches_and_continuation_sample_the_ar_distribution(tiny, ar_samples, name, params, offset):
    assert _same_distribution(ar_samples, _sample(tiny, name, params, offset=offset)) > 0.001 / len(POSITIONS)


def _over_accepting(r, cands, u):
    # a broken rule: each candidate accepted with twice its residual mass, and none removed from the residual
    # (without the doubling, the missing renormalisation alone gave p = 0.01 here: too subtle for 6,000 samples)
    won = torch.full((len(r),), -1, dtype=torch.long)
    for k in range(cands.shape[1]):
        won = torch.where((won < 0) & (u[:, k] < 2 * r.gather(1, cands[:, k:k + 1]).squeeze(1)), k, won)
    return won, r


@pytest.mark.slow
def test_the_exact_test_catches_a_broken_candidate_rule(tiny, ar_samples, monkeypatch):
    monkeypatch.setattr(window_mod, "verify_candidates", _over_accepting)
    spec = _sample(tiny, "sjd", {"window": 6, "coupled": True, "branches": 3}, offset=5_000_000)
    assert _same_distribution(ar_samples, spec) < 0.001 / len(POSITIONS)


def test_the_bench_counts_a_branched_decoders_entries(tiny):
    from ssdgen.bench.forwards import ForwardCounter
    with ForwardCounter(tiny) as c:
        res = decode("sjd", tiny, PROMPTS[:2], [0, 1], SAMPLED, {"window": 6, "coupled": True, "branches": 3})
    assert c.step_tokens == sum(s.tokens_fed for s in res.stats) - 2 * 2  # the prefill's position is not a step's


def test_branch_len_0_fits_the_branches_into_one_forward(tiny):
    from ssdgen.decoders.recipes import MAX_ENTRIES, branch_tokens
    assert branch_tokens(4, 0, 33) == 32  # the window's drafts, where they fit
    assert 33 + 7 * branch_tokens(8, 0, 33) <= MAX_ENTRIES  # shorter where they do not
    with pytest.raises(ValueError, match="192"):  # SSD's window depends on the grid: checked at the widest
        decoder_config("ssd", {"lossless": True, "branches": 8, "branch_len": 32})
    res = decode("ssd", tiny, PROMPTS[:1], [0], SAMPLED, {"lossless": True, "branches": 8})
    assert res.stats[0].extra["branch_len"] == branch_tokens(8, 0, res.stats[0].extra["window"])
