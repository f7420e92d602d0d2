"""Decode attention in the model: the op `ssdgen::decode_attention` (reference/decode_attention.c) against torch's
SDPA for a plain-AR step, in the model's cached steps (every one of 1 to 16 queries), and its fallback to SDPA.
The op's own contract (windows, trees, bf16, bad calls, its build) is tests/test_decode_attention_op.py's.

Outputs are compared with a float tolerance (the op and SDPA sum in different orders); a row's independence
from its batch-mates is compared exactly, on this machine, as the reproducibility rule needs."""

import pytest
import torch
import torch.nn.functional as F

from ssdgen.reference import decode_attention as da

needs_loop = pytest.mark.skipif(da.library() is None, reason="no C compiler here: attention falls back to SDPA")


def _case(B, H, S, T, D, talloc=None, seed=0):
    """q [B, H, S, D] (strided, as the model's permuted view is), caches [B, H, talloc, D], a causal mask [B, 1, S,
    T] over per-row positions with one more slot masked out."""
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(B, S, 3, H, D, generator=g)
    q = qkv[:, :, 0].transpose(1, 2)  # [B, H, S, D], not contiguous
    talloc = talloc or T + 7
    k, v = torch.randn(2, B, H, talloc, D, generator=g).unbind(0)
    last = torch.randint(S - 1, T, (B, 1), generator=g)  # each row's last query position
    pos = last - S + 1 + torch.arange(S)[None]
    mask = (torch.arange(T)[None, None, :] <= pos[:, :, None]).unsqueeze(1)
    mask[..., 0] = False  # a hole: slots are excluded by the mask, not only by length
    return q, k, v, mask


def _sdpa(q, k, v, mask):
    T = mask.shape[-1]
    return F.scaled_dot_product_attention(q, k[:, :, :T], v[:, :, :T], attn_mask=mask).transpose(1, 2)


@needs_loop
@pytest.mark.parametrize("B,H,T,D", [(1, 1, 2, 32), (3, 8, 165, 32), (2, 4, 33, 64), (2, 2, 50, 128),
                                     (1, 3, 19, 24)])
def test_loop_matches_sdpa(B, H, T, D):
    q, k, v, mask = _case(B, H, 1, T, D)
    out = da.attention(q, k, v, mask)
    assert out is not None and out.shape == (B, 1, H, D)
    torch.testing.assert_close(out, _sdpa(q, k, v, mask), atol=2e-6, rtol=1e-5)


@needs_loop
def test_a_row_does_not_depend_on_its_batch_mates():
    q, k, v, mask = _case(6, 8, 1, 70, 32, seed=3)
    alone = da.attention(q[2:3], k[2:3], v[2:3], mask[2:3])
    assert torch.equal(da.attention(q, k, v, mask)[2:3], alone)


@needs_loop
def test_a_query_with_every_slot_masked_gives_zeros():
    q, k, v, mask = _case(2, 2, 1, 10, 32)
    mask[1] = False
    out = da.attention(q, k, v, mask)
    assert torch.equal(out[1], torch.zeros_like(out[1])) and out[0].abs().sum() > 0


@needs_loop
def test_what_the_op_does_not_take_goes_to_sdpa():
    q, k, v, mask = _case(2, 2, 1, 10, 32)
    assert da.attention(q.double(), k.double(), v.double(), mask) is None  # fp32 and bf16 caches only
    assert da.attention(*_case(2, 2, 17, 40, 32)) is None  # more than 16 queries: a prefill
    assert da.attention(q.to("meta"), k.to("meta"), v.to("meta"), mask.to("meta")) is None
    assert da.attention(q, k.bfloat16(), v.bfloat16(), mask) is not None  # reference:kv=bf16 takes the op
    assert da.attention(*_case(2, 2, 4, 40, 32)) is not None  # so does a window


def test_without_a_compiler_attention_stays_sdpa_with_one_warning(monkeypatch, caplog):
    monkeypatch.setenv("CC", "/nonexistent/cc")
    monkeypatch.setattr(da, "_state", "untried")
    monkeypatch.setattr(da, "_built", None)
    with caplog.at_level("WARNING", logger=da.__name__):
        assert da.library() is None and da.library() is None
    assert caplog.text.count("SDPA") == 1 and da.state() == "unavailable"
    q, k, v, mask = _case(2, 2, 1, 10, 32)
    assert da.attention(q, k, v, mask) is None
    assert da.kind("cpu", torch.float32, torch.float32) == "sdpa"
    with pytest.raises(RuntimeError, match="not built"):
        torch.ops.ssdgen.decode_attention(q, k, v, mask)


def _steps(m):
    """A CFG batch of 2 through the model's cached passes: the prefill (SDPA), a plain-AR step, a ragged window
    of 3 and a tree of 3 (the op) -> their conditional and unconditional logits."""
    m.start(["a large red circle at the center on a flat gray background"] * 2, use_cfg=True)
    outs = [m.step(torch.tensor([[1], [2]]), torch.tensor([[0], [0]]))]
    outs.append(m.step(torch.tensor([[3, 1, 0], [2, 2, 0]]), torch.tensor([[1, 2, 3], [1, 2, 3]]),
                       lengths=torch.tensor([3, 2])))
    tree = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool).expand(2, 3, 3)
    outs.append(m.step(torch.tensor([[0, 1, 2], [3, 0, 1]]), torch.tensor([[3, 4, 4], [3, 4, 4]]), tree=tree))
    return [x for o in outs for x in (o.cond, o.uncond)]


@needs_loop
@pytest.mark.parametrize("kv", [None, torch.bfloat16])
def test_the_model_steps_match_sdpa(tmp_path, monkeypatch, kv):
    """The tiny reference model (fp32 on the CPU, its cache fp32 or bf16) through the op and through SDPA: the
    same logits. Every cached step takes the op, plain AR, the packed window and the tree alike; the prefill
    (36 queries) stays SDPA."""
    from tiny import tiny_model
    from ssdgen.reference.model import ReferenceModel
    m = tiny_model(tmp_path / "t", scale=0.2)
    if kv is not None:
        m = ReferenceModel(m.path, kv_dtype=kv)
    taken, op = [], da.attention

    def counted(*a):
        out = op(*a)
        taken.append(out is not None)
        return out
    monkeypatch.setattr(da, "attention", counted)
    with_op = _steps(m)
    assert taken == [False] * m.gpt.cfg.n_layers + [True] * 3 * m.gpt.cfg.n_layers
    assert m.capabilities.attention == "op"
    monkeypatch.setattr(da, "attention", lambda *a: None)
    tol = {"atol": 1e-5, "rtol": 1e-4} if kv is None else {"atol": 2e-2, "rtol": 2e-2}
    for a, b in zip(with_op, _steps(m), strict=True):
        torch.testing.assert_close(a, b, **tol)


@needs_loop
def test_a_profile_names_the_loop():
    """torch.profiler cannot look into the C call: the op's registered name labels it, so `python -m lab roofline
    --profile` shows it."""
    from torch.profiler import ProfilerActivity, profile
    q, k, v, mask = _case(2, 2, 1, 10, 32)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        da.attention(q, k, v, mask)
    assert "ssdgen::decode_attention" in {e.key for e in prof.key_averages()}
