"""Continuous batching (decoders/slots.py): prompts streamed through B slots decode to the tokens and statistics a
fixed batch gives them, for plain AR and every configuration of the window loop (sjd, csd, ssd, ssd+csd; packed,
padded, branches, continuation, adaptive windows), greedy and sampled; the slots' occupancy; what refuses slots;
the reference model's admission.

The tiny model runs in float64 here, as in test_engine_golden.py: a streamed step packs other rows (a newcomer's
prompt, other windows) beside a sample than its fixed batch did, so its logits may differ from the fixed batch's in
their last bits, and float64 keeps such a difference from reaching the fp32 probabilities the decoders sample in.
One fp32 test runs the production kernels too."""

import pytest
import torch

from ssdgen.decoders import build, decode
from ssdgen.decoders.protocol import Capabilities
from ssdgen.decoders.recipes import SamplingConfig
from test_decoders import GREEDY, PROMPTS, SAMPLED
from tiny import tiny_with_heads

N_PROMPTS, SLOTS = 7, 3
STREAM = [PROMPTS[i % len(PROMPTS)] for i in range(N_PROMPTS)]
SEEDS = list(range(100, 100 + N_PROMPTS))
FILTERED = SamplingConfig(cfg_scale=2.0, temperature=0.9, top_k=5, top_p=0.9)
RUNS = [("ar", {}), ("sjd", {"window": 6}), ("sjd", {"window": 4, "init": "repeat-left", "continuation": True}),
        ("csd", {"window": 6}), ("csd", {"window": 6, "coupled": False, "packed": False}),
        ("ssd", {"rows": 1}), ("ssd", {"window": 5, "adaptive": True}),
        ("ssd+csd", {"rows": 2, "calibrated": False}), ("sjd", {"window": 6, "branches": 3}),
        ("ssd", {"rows": 1, "branches": 2, "branch_len": 2})]


@pytest.fixture(scope="module")
def tiny64(tmp_path_factory):
    return tiny_with_heads(tmp_path_factory.mktemp("tiny64"), dtype=torch.float64)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_with_heads(tmp_path_factory.mktemp("tiny"))


def _same_samples(fixed, streamed):
    """Tokens and every statistic but the wall clock, sample by sample."""
    assert torch.equal(fixed.tokens, streamed.tokens)
    for a, b in zip(fixed.stats, streamed.stats, strict=True):
        assert (a.forwards, a.tokens_per_forward_hist, a.relaxed, a.tokens_fed, a.extra) == (
            b.forwards, b.tokens_per_forward_hist, b.relaxed, b.tokens_fed, b.extra)
        assert (a.commit_map == b.commit_map).all()
        assert a.mean_entropy == pytest.approx(b.mean_entropy, rel=1e-6)
        assert a.acceptance_rate == pytest.approx(b.acceptance_rate, rel=1e-6, nan_ok=True)


@pytest.mark.parametrize("name, params, sampling", [(n, p, s) for n, p in RUNS for s in ("greedy", "sampled")] + [
    ("csd", {"window": 6}, "filtered"), ("ssd+csd", {"rows": 2, "calibrated": False}, "filtered")])
def test_a_stream_gives_each_sample_its_fixed_batch_tokens(tiny64, name, params, sampling):
    sc = {"greedy": GREEDY, "sampled": SAMPLED, "filtered": FILTERED}[sampling]
    if sc.greedy and name in ("csd", "ssd+csd"):
        params = params | {"lam": 0.0}  # the relaxation needs sampling
    fixed = decode(name, tiny64, STREAM, SEEDS, sc, params)
    streamed = decode(name, tiny64, STREAM, SEEDS, sc, params, slots=SLOTS)
    _same_samples(fixed, streamed)
    assert streamed.occupancy.slots == SLOTS and 0 < streamed.occupancy.share <= 1


@pytest.mark.parametrize("name, params, slots", [("ar", {}, 2), ("ssd+csd", {"rows": 1, "calibrated": False}, 1),
                                                 ("ssd+csd", {"rows": 1, "calibrated": False}, 2)])
def test_a_sample_streamed_decodes_as_alone_whatever_its_slot_and_step(tiny64, name, params, slots):
    seeds = SEEDS[::-1]  # other seeds in other slots than above
    streamed = decode(name, tiny64, STREAM, seeds, SAMPLED, params, slots=slots)
    for i in (0, 4, 6):
        alone = decode(name, tiny64, STREAM[i:i + 1], seeds[i:i + 1], SAMPLED, params)
        assert torch.equal(alone.tokens[0], streamed.tokens[i])


@pytest.mark.parametrize("name, params", [("ar", {}), ("sjd", {"window": 6, "coupled": True}),
                                          ("ssd+csd", {"rows": 2, "calibrated": False})])
def test_a_stream_in_fp32_gives_the_fixed_batch_tokens(tiny, name, params):
    fixed = decode(name, tiny, STREAM, SEEDS, SAMPLED, params)
    _same_samples(fixed, decode(name, tiny, STREAM, SEEDS, SAMPLED, params, slots=SLOTS))


def test_slot_occupancy_counts_the_slot_forwards_that_work(tiny64):
    # plain AR, 16 tokens, 7 prompts in 3 slots: the start's prefill (3 busy), 15 steps of 3; a step that prefills
    # 3 newcomers, 15 steps of 3; one that prefills the last prompt, 2 slots idle, and its 15 steps alone
    res = decode("ar", tiny64, STREAM, SEEDS, SAMPLED, slots=SLOTS)
    assert (res.occupancy.forwards, res.occupancy.busy) == (48, 3 + 45 + 3 + 45 + 1 + 15)
    assert res.occupancy.share == pytest.approx(112 / 144)
    fixed = decode("ar", tiny64, STREAM, SEEDS, SAMPLED)  # a fixed AR batch: every row works in every forward
    assert (fixed.occupancy.slots, fixed.occupancy.forwards, fixed.occupancy.share) == (N_PROMPTS, 16, 1.0)
    # a fixed window batch: its rows idle once their sample is done; each sample's forwards are its busy ones
    win = decode("sjd", tiny64, STREAM, SEEDS, SAMPLED, {"window": 6})
    assert win.occupancy.busy == sum(s.forwards for s in win.stats)
    assert win.occupancy.forwards == max(s.forwards for s in win.stats) and win.occupancy.share < 1


def test_as_many_slots_as_prompts_is_the_fixed_batch(tiny64):
    fixed = decode("sjd", tiny64, STREAM, SEEDS, SAMPLED, {"window": 6})
    for slots in (N_PROMPTS, 64):
        same = decode("sjd", tiny64, STREAM, SEEDS, SAMPLED, {"window": 6}, slots=slots)
        _same_samples(fixed, same)
        assert same.occupancy == fixed.occupancy


def test_the_decoder_streams_with_slots(tiny64):
    dec = build("ssd:rows=1:cfg=3", tiny64)
    _same_samples(dec.decode(STREAM, SEEDS), dec.decode(STREAM, SEEDS, slots=SLOTS))


def test_what_cannot_stream_says_so(tiny64):
    block = {"commit": "block", "rows": 1, "calibrated": False}
    with pytest.raises(ValueError, match="unsupported combination.*block decoder"):
        decode("ssd", tiny64, STREAM, SEEDS, SAMPLED, block, slots=SLOTS)
    decode("ssd", tiny64, STREAM[:2], SEEDS[:2], SAMPLED, block, slots=SLOTS)  # a fixed batch: as before
    with pytest.raises(ValueError, match="slots must be at least 1"):
        decode("ar", tiny64, STREAM, SEEDS, SAMPLED, slots=0)

    class NoAdmit:  # the reference model, declaring no admission (as the HF adapters do not)
        def __getattr__(self, name):
            return getattr(tiny64, name)
        capabilities = Capabilities()
    with pytest.raises(ValueError, match="cannot take a prompt into a running batch"):
        decode("ar", NoAdmit(), STREAM, SEEDS, SAMPLED, slots=SLOTS)


def test_the_model_admits_a_prompt_beside_a_step_as_start_prefills_it(tiny64):
    # two rows decoding; row 1 takes a new prompt while row 0 steps: its prefill output is start's for that prompt,
    # and row 0's step output is what a step without the admission gives
    m, new = tiny64, PROMPTS[3]
    alone = m.start([new], use_cfg=True)
    m.start(PROMPTS[:2], use_cfg=True)
    tokens, index = torch.tensor([[5, 2, 7], [1, 1, 1]]), torch.tensor([[0, 1, 2], [4, 5, 6]])
    m.step(tokens, index)  # some cached keys in both rows
    step, pre = m.admit(torch.tensor([1]), [new], tokens[:, 2:], index[:, 2:] + 1, torch.tensor([1, 0]))
    for got, want in ((pre.cond, alone.cond), (pre.uncond, alone.uncond), (pre.hidden, alone.hidden)):
        assert got.shape == want.shape == (1, 1, want.shape[-1]) and torch.allclose(got, want, atol=1e-10)
    m.start(PROMPTS[:2], use_cfg=True)
    m.step(tokens, index)
    plain = m.step(tokens[:, 2:], index[:, 2:] + 1)
    assert torch.allclose(step.cond[0], plain.cond[0], atol=1e-10)
    assert torch.allclose(step.uncond[0], plain.uncond[0], atol=1e-10)
