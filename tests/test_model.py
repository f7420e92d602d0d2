"""AR transformer and sampling: KV-cache rollback per sample, CFG arithmetic, processed distribution,
per-sample random numbers, and batch invariance of seeded sampling."""

import pytest
import torch

from ssdgen.decoders import sampling as rng
from ssdgen.decoders.sampling import cfg_mix, processed_probs, sample_from
from ssdgen.decoders.recipes import SamplingConfig
from ssdgen.reference.gpt import GPT, GPTConfig

TINY = GPTConfig(dim=64, n_layers=2, n_heads=4, mlp_hidden=96, caption_len=6, grid=4, n_caption_words=8)


def _tiny():
    torch.manual_seed(0)
    m = GPT(TINY).eval()
    with torch.no_grad():  # non-trivial position embeddings
        m.img_pos.normal_(0, 0.5)
    return m


@torch.no_grad()
def test_rollback_of_one_sample_matches_full_recompute_and_leaves_others_untouched():
    m = _tiny()
    B, T = 3, TINY.seq_len
    seq = torch.randint(0, TINY.n_image_codes, (B, T))
    seq[:, :TINY.caption_len] = torch.randint(0, 8, (B, TINY.caption_len)) + TINY.n_image_codes
    full, full_h = m(seq)  # no cache: one plain causal pass

    m.setup_caches(B)
    pos = torch.arange(T).expand(B, T)
    m(seq[:, :12], pos[:, :12])
    window = seq[:, 12:16].clone()
    window[1] = torch.randint(0, TINY.n_image_codes, (4,))  # sample 1 speculates wrongly at 12..15
    m(window, pos[:, 12:16])
    snap = [blk.attn.kv_cache.k[[0, 2], :, :16].clone() for blk in m.layers]
    # ragged next step: sample 1 rolls back to 12 (by feeding from there), samples 0 and 2 go on at 16
    ragged = torch.tensor([[16, 17, 18, 19], [12, 13, 14, 15], [16, 17, 18, 19]])
    logits, h = m(torch.gather(seq, 1, ragged), ragged)
    for b in range(B):
        assert torch.allclose(logits[b], full[b, ragged[b]], atol=1e-4)
        assert torch.allclose(h[b], full_h[b, ragged[b]], atol=1e-4)
    for k0, blk in zip(snap, m.layers):  # the others' earlier cache entries were not touched
        assert torch.equal(blk.attn.kv_cache.k[[0, 2], :, :16], k0)


def test_cfg_arithmetic():
    c, u = torch.tensor([[2.0, 0.0, -1.0]]), torch.tensor([[1.0, 1.0, 1.0]])
    assert torch.allclose(cfg_mix(c, u, 3.0), torch.tensor([[4.0, -2.0, -5.0]]))
    assert torch.equal(cfg_mix(c, u, 1.0), c)
    assert torch.equal(cfg_mix(c, None, 3.0), c)
    p = processed_probs(c, u, SamplingConfig(cfg_scale=3.0))
    assert torch.allclose(p, torch.softmax(torch.tensor([[4.0, -2.0, -5.0]]), -1))


def test_processed_distribution_filters():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    p = processed_probs(logits, None, SamplingConfig(cfg_scale=1.0, top_k=2))
    assert torch.allclose(p, torch.tensor([[0.625, 0.375, 0, 0]]))
    p = processed_probs(logits, None, SamplingConfig(cfg_scale=1.0, top_p=0.7))
    assert torch.allclose(p, torch.tensor([[0.625, 0.375, 0, 0]]))  # smallest prefix with mass >= 0.7
    p = processed_probs(logits, None, SamplingConfig(cfg_scale=1.0, temperature=0))
    assert torch.equal(p, torch.tensor([[1.0, 0, 0, 0]]))
    hot = processed_probs(logits, None, SamplingConfig(cfg_scale=1.0, temperature=2.0))
    assert hot[0, 3] > 0.05  # higher temperature flattens


@pytest.mark.parametrize("kw, name", [({"top_k": -1}, "top_k"), ({"top_p": 0.0}, "top_p"),
                                      ({"temperature": -1}, "temperature"), ({"cfg_scale": -2}, "cfg_scale")])
def test_bad_sampling_parameters_are_named(kw, name):
    with pytest.raises(ValueError, match=name):
        SamplingConfig(**kw)


def test_per_sample_random_numbers_are_independent_of_batch():
    alone = rng.Streams([7]).uniform(rng.Purpose.TOKEN, 3, width=5)
    batched = rng.Streams([1, 7, 3]).uniform(rng.Purpose.TOKEN, 3, width=5)
    assert torch.equal(alone[0], batched[1])
    probs = torch.softmax(torch.randn(3, 50), -1)
    t1 = sample_from(probs, rng.Streams([1, 7, 3]).uniform(rng.Purpose.TOKEN, 0))
    t2 = sample_from(probs[1:2], rng.Streams([7]).uniform(rng.Purpose.TOKEN, 0))
    assert t1[1] == t2[0]
