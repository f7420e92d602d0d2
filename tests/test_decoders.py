"""Decoders on a tiny random model: exact (greedy equality), statistical (distribution), and unit tests.

Statistical test: 6,000 samples of one prompt from `ar` and 6,000 from the decoder under test, with
independent seeds; at each of 4 chosen token positions a chi-square test of homogeneity on the 8-way
token counts; the decoder fails if any p-value is below 0.001 / 4 (Bonferroni). A lossless decoder then
fails by chance with probability < 0.001. Power: see `test_statistical_test_has_power` (a gross and a
subtle broken acceptance rule must both be caught). At 3,000 samples the subtle one (resampling from q
instead of the residual) was caught or missed depending on the draw of the AR reference sample (p from 1e-6
to 3e-2 over reference draws), so the sample size is 6,000, where every draw tried caught it.
"""

import numpy as np
import pytest
import torch
from scipy.stats import chi2_contingency

import ssdgen.decoders.window as window_mod
from ssdgen.decoders import decode, decoder_config
from ssdgen.decoders.sampling import sample_from
from ssdgen.decoders.recipes import Relaxation, SamplingConfig
from ssdgen.decoders.sample_stats import COMMIT_ACCEPTED, COMMIT_AR, COMMIT_BONUS, COMMIT_RELAXED, COMMIT_RESAMPLED
from ssdgen.decoders.verify import verify
from tiny import tiny_model

PROMPTS = ["a large red circle at the center on a flat gray background",
           "a small blue square at the top left on a wavy beige background",
           "a large shaded green triangle at the bottom right on a cloudy slate background",
           "a small dotted yellow diamond at the top middle on a striped brown background"]
GREEDY = SamplingConfig(temperature=0)
SAMPLED = SamplingConfig(cfg_scale=3.0)
POSITIONS = (3, 6, 9, 15)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_model(tmp_path_factory.mktemp("tiny"), scale=0.2)


# ------------------------------------------------------------------ exact tier

@pytest.mark.parametrize("name, params", [
    ("sjd", {"window": 4}), ("sjd", {"window": 6, "init": "repeat-left"}),
    ("sjd", {"window": 16, "init": "repeat-above"}), ("csd", {"window": 6, "lam": 0.0}),
    ("sjd", {"window": 6, "init": "repeat-left", "coupled": True}),
])
@pytest.mark.parametrize("batch", [1, 4])
def test_greedy_equals_ar(tiny, name, params, batch):
    prompts, seeds = PROMPTS[:batch], list(range(batch))
    ar = decode("ar", tiny, prompts, seeds, GREEDY)
    spec = decode(name, tiny, prompts, seeds, GREEDY, params)
    assert torch.equal(ar.tokens, spec.tokens)
    assert all(s.forwards <= 16 for s in spec.stats)  # never more forwards than AR's 16


@pytest.mark.parametrize("name, params", [
    ("sjd", {"window": 6, "init": "repeat-left"}), ("sjd", {"window": 16, "init": "repeat-above"}),
    ("csd", {"window": 6, "lam": 0.0}), ("sjd", {"window": 6, "init": "repeat-left", "coupled": True}),
])
def test_a_wider_window_accepts_drafts_on_most_samples(tiny, name, params):
    # whether one sample accepts anything depends on its random drafts (a first row of uniform tokens), so
    # this is asked of 32 samples: most accept something, and on average they need fewer forwards than AR
    res = decode(name, tiny, PROMPTS * 8, list(range(32)), GREEDY, params)
    forwards = np.array([s.forwards for s in res.stats])
    assert (forwards < 16).mean() > 0.5 and forwards.mean() < 15


@pytest.mark.parametrize("params", [{"window": 6}, {"window": 6, "coupled": True}])
def test_batch_gives_each_sample_its_batch_one_tokens(tiny, params):
    prompts, seeds = PROMPTS * 2, list(range(10, 18))
    batched = decode("sjd", tiny, prompts, seeds, SAMPLED, params)
    for b in range(8):
        alone = decode("sjd", tiny, prompts[b:b + 1], seeds[b:b + 1], SAMPLED, params)
        assert torch.equal(alone.tokens[0], batched.tokens[b])


# ------------------------------------------------------------------ statistical tier

def _sample(model, name, params, n=6000, offset=0):
    toks = [decode(name, model, PROMPTS[:1] * 500, list(range(offset + i, offset + i + 500)), SAMPLED, params).tokens
            for i in range(0, n, 500)]
    return torch.cat(toks).numpy()


def _same_distribution(a: np.ndarray, b: np.ndarray, codes: int = 8) -> float:
    """Smallest chi-square homogeneity p-value over POSITIONS."""
    ps = []
    for pos in POSITIONS:
        table = np.stack([np.bincount(a[:, pos], minlength=codes), np.bincount(b[:, pos], minlength=codes)])
        table = table[:, table.sum(0) > 0]
        ps.append(chi2_contingency(table)[1])
    return min(ps)


@pytest.fixture(scope="module")
def ar_samples(tiny):
    return _sample(tiny, "ar", {}, offset=0)


@pytest.mark.slow
@pytest.mark.parametrize("params", [{"window": 6}, {"window": 6, "init": "repeat-above"},
                                    {"window": 6, "coupled": True}, {"window": 6, "coupled": True, "adaptive": True}])
def test_sjd_samples_the_ar_distribution(tiny, ar_samples, params):
    spec = _sample(tiny, "sjd", params, offset=1_000_000)
    assert _same_distribution(ar_samples, spec) > 0.001 / len(POSITIONS)


def _always_accept(draft, p, q, n_valid, u_accept, u_resample, relax=Relaxation()):
    return verify(draft, p, q, n_valid, torch.zeros_like(u_accept) - 1, u_resample, relax)  # u < 0 accepts all


def _resample_from_q(draft, p, q, n_valid, u_accept, u_resample, relax=Relaxation()):
    # a classic bug: the right acceptance test, but on rejection sample from q instead of max(0, q - p)
    v = verify(draft, p, q, n_valid, u_accept, u_resample, relax)
    at = v.n_accepted.view(-1, 1, 1).expand(-1, 1, q.shape[-1])
    v.next_token = sample_from(q.gather(1, at).squeeze(1), u_resample)
    return v


@pytest.mark.slow
@pytest.mark.parametrize("broken", [_always_accept, _resample_from_q])
@pytest.mark.parametrize("coupled", [False, True])
def test_statistical_test_has_power(tiny, ar_samples, monkeypatch, broken, coupled):
    monkeypatch.setattr(window_mod, "verify", broken)
    spec = _sample(tiny, "sjd", {"window": 6, "coupled": coupled}, offset=1_000_000)
    assert _same_distribution(ar_samples, spec) < 0.001 / len(POSITIONS)


# ------------------------------------------------------------------ unit tier: pure verification

def _onehot(i, v=4):
    return torch.nn.functional.one_hot(torch.tensor(i), v).float()


def test_verify_perfect_match_takes_bonus():
    q = torch.stack([_onehot(1), _onehot(2), _onehot(3)])[None]  # [1, 3, 4]
    draft = torch.tensor([[1, 2]])
    v = verify(draft, q[:, :2], q, torch.tensor([2]), torch.rand(1, 2), torch.tensor([0.5]))
    assert v.n_accepted.item() == 2 and v.next_token.item() == 3


def test_verify_early_mismatch_resamples_from_residual():
    q = torch.tensor([[[0.0, 0.5, 0.5, 0.0], [1, 0, 0, 0], [1, 0, 0, 0]]])
    draft = torch.tensor([[0, 0]])  # q gives draft 0 no mass at slot 0
    v = verify(draft, _onehot(0)[None, None].expand(1, 2, 4), q, torch.tensor([2]), torch.zeros(1, 2),
               torch.tensor([0.9]))
    assert v.n_accepted.item() == 0 and v.next_token.item() == 2
    # residual max(0, q - p) with p = q is empty: fall back to q
    p = q[:, :2]
    v = verify(torch.tensor([[1, 0]]), p, q, torch.tensor([2]), torch.tensor([[0.99, 0.0]]), torch.tensor([0.2]))
    assert v.n_accepted.item() == 2  # q(x)/p(x) = 1 always accepts


def test_verify_respects_n_valid():
    q = _onehot(1).expand(1, 4, 4).clone()
    v = verify(torch.tensor([[1, 1, 1]]), q[:, :3], q, torch.tensor([1]), torch.zeros(1, 3), torch.zeros(1))
    assert v.n_accepted.item() == 1


def test_csd_relaxes_only_where_draft_and_target_agree():
    q = torch.tensor([[[0.3, 0.3, 0.2, 0.2], [0.25] * 4]])
    p_close = torch.tensor([[[0.5, 0.2, 0.15, 0.15]]])  # TV 0.2
    u = torch.tensor([[0.8]])  # standard rule: q/p = 0.6 < 0.8 rejects
    draft = torch.tensor([[0]])
    std = verify(draft, p_close, q, torch.tensor([1]), u, torch.zeros(1))
    assert std.n_accepted.item() == 0
    relax = Relaxation(lam=0.5, delta=0.3)  # H / log 4 = 0.985 -> 0.6 + 0.49 > 0.8 accepts
    r = verify(draft, p_close, q, torch.tensor([1]), u, torch.zeros(1), relax)
    assert r.n_accepted.item() == 1 and r.relaxed.sum().item() == 1
    far = verify(draft, _onehot(0)[None, None], q, torch.tensor([1]), u, torch.zeros(1), relax)  # TV 0.7
    assert far.n_accepted.item() == 0


@pytest.mark.parametrize("params, name", [
    ({"lam": -0.1}, "lam"), ({"delta": 1.5}, "delta"), ({"window": 1}, "window"),
    ({"entropy_norm": "bits"}, "entropy_norm"), ({"init": "diagonal"}, "init"), ({"gamma": 1}, "gamma"),
])
def test_bad_decoder_parameters_are_named(params, name):
    with pytest.raises(ValueError, match=name):
        decoder_config("csd", params)


def test_unknown_decoder_is_named():
    with pytest.raises(ValueError, match="unknown decoder 'medusa'"):
        decoder_config("medusa")


def test_stats_commit_map_accounts_for_every_token(tiny):
    res = decode("sjd", tiny, PROMPTS[:2], [0, 1], SAMPLED, {"window": 6})
    for s in res.stats:
        cm = s.commit_map
        assert cm.shape == (4, 4) and cm[0, 0] == COMMIT_AR
        assert set(np.unique(cm)) <= {COMMIT_AR, COMMIT_ACCEPTED, COMMIT_RESAMPLED, COMMIT_BONUS, COMMIT_RELAXED}
        assert sum(k * c for k, c in enumerate(s.tokens_per_forward_hist)) == 16
        assert sum(s.tokens_per_forward_hist) == s.forwards


def test_position_noise_is_a_table_held_one_window_at_a_time():
    # coupled drafts need one noise row per index; PositionNoise holds only the window's rows but must give
    # exactly the rows of the whole table, computed up front, for windows that slide by ragged steps
    from ssdgen.decoders import sampling as rng
    base = rng.Streams([3, 4]).base(rng.Purpose.NOISE)
    table = rng.gumbel(rng.uniform(base, torch.arange(20)[None], width=8))  # [2, 20, 8], computed up front
    noise = rng.PositionNoise(base, V=8, span=5)
    both = torch.tensor([True, True])
    for s0, s1 in ((0, 0), (2, 1), (7, 1), (15, 9)):  # each sample's window start
        idx = torch.stack([torch.arange(s0, s0 + 5), torch.arange(s1, s1 + 5)])
        got = noise.rows(idx, both)
        assert torch.equal(got[0], table[0, s0:s0 + 5]) and torch.equal(got[1], table[1, s1:s1 + 5])
    assert noise.ring.shape == (2, 5, 8)
    stale = noise.rows(torch.tensor([[16, 17, 18, 19, 20], [10, 11, 12, 13, 14]]), torch.tensor([True, False]))
    assert torch.equal(stale[0, :4], table[0, 16:20]) and noise.held[0, 20 % 5] == 20
    assert noise.held[1, 14 % 5] == 9  # an inactive sample computes nothing: its slot still holds index 9
