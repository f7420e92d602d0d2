"""The Hugging Face adapters (models/hf.py) on tiny randomly initialised Janus, Emu3 and Chameleon
models built offline from configs (2 layers, hidden 32): greedy speculative decoding equals greedy AR, with
and without CFG, at batch 1 and 4; per-sample rollback equals a full recompute and leaves batch-mates alone."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from ssdgen.decoders import decode  # noqa: E402
from ssdgen.models.hf import (ChameleonAdapter, Emu3Adapter, HashPromptEncoder, JanusAdapter,  # noqa: E402
                                  load_model)
from ssdgen.decoders.recipes import SamplingConfig  # noqa: E402



@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """One summation order for these exact-equality tests; restored after, so other modules keep theirs."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


PROMPTS = ["a red circle on gray", "a small blue square at the top left", "green triangle",
           "a dotted yellow diamond on a striped brown background"]
N_TEXT, N_CODES = 48, 16  # text ids 0..47 (0 pad, 1 bos, 2 eos), then image codes / specials
TEXT = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
            max_position_embeddings=256, pad_token_id=0, bos_token_id=1, eos_token_id=2)
WORDS = HashPromptEncoder(range(3, N_TEXT))


def _peaked(model, scale=0.25):
    """Random weights with a larger spread than the default init: peaked, context-dependent distributions."""
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0, scale)
    return model.eval()


def tiny_janus():
    from transformers import JanusConfig, JanusForConditionalGeneration
    cfg = JanusConfig(
        text_config=dict(model_type="llama", vocab_size=N_TEXT + 3, **TEXT),
        vision_config=dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, image_size=32, patch_size=8,
                           projection_dim=32, num_image_tokens=16, depth=1, mlp_ratio=2.0),
        vq_config=dict(embed_dim=8, num_embeddings=N_CODES, latent_channels=32, base_channels=32,
                       channel_multiplier=[1, 1], num_res_blocks=1, projection_dim=32, image_token_embed_dim=32,
                       num_hidden_layers=2),
        image_token_id=N_TEXT)
    model = _peaked(JanusForConditionalGeneration(cfg))
    return JanusAdapter(model, WORDS, boi_id=N_TEXT + 1, pad_id=N_TEXT + 2)  # grid 4 x 4 (image 32 / patch 8)


def tiny_emu3(grid=(3, 4)):
    from transformers import Emu3Config, Emu3ForConditionalGeneration
    vocab = {f"t{i}": i for i in range(N_TEXT)}
    vocab |= {f"<|visual token{c:06d}|>": N_TEXT + c for c in range(N_CODES)}
    for j, name in enumerate(["<|extra_200|>", "<|extra_201|>", "<|image start|>", "<|image token|>", "<image>"]):
        vocab[name] = N_TEXT + N_CODES + j
    cfg = Emu3Config(
        text_config=dict(vocab_size=len(vocab), **TEXT),
        vq_config=dict(codebook_size=N_CODES, embed_dim=4, latent_channels=4, base_channels=32,
                       channel_multiplier=[1, 1], num_res_blocks=1, attn_resolutions=[], hidden_size=32,
                       num_attention_heads=1,
                       temporal_downsample_factor=1),
        vocabulary_map=vocab)
    return Emu3Adapter(_peaked(Emu3ForConditionalGeneration(cfg)), WORDS, grid)


def tiny_chameleon(grid=(3, 4)):
    from transformers import ChameleonConfig, ChameleonForConditionalGeneration
    vocab = {f"t{i}": i for i in range(N_TEXT)}
    vocab |= {"IMGIMG" + "".join(chr(ord("A") + int(d)) for d in str(c)) + "Z": N_TEXT + c for c in range(N_CODES)}
    vocab |= {"<image>": N_TEXT + N_CODES, "<racm3:break>": N_TEXT + N_CODES + 1, "<eoss>": N_TEXT + N_CODES + 2}
    cfg = ChameleonConfig(
        vocab_size=len(vocab), **TEXT, vocabulary_map=vocab,
        vq_config=dict(embed_dim=4, num_embeddings=N_CODES, latent_channels=4, base_channels=32,
                       channel_multiplier=[1, 1], num_res_blocks=1, resolution=8, attn_resolutions=[]))
    return ChameleonAdapter(_peaked(ChameleonForConditionalGeneration(cfg)), WORDS, grid)


BUILDERS = {"janus": tiny_janus, "emu3": tiny_emu3, "chameleon": tiny_chameleon}


@pytest.fixture(scope="module", params=list(BUILDERS))
def adapter(request):
    torch.manual_seed(0)
    return BUILDERS[request.param]()


# ------------------------------------------------------------------ greedy speculative == greedy AR

@pytest.mark.parametrize("cfg_scale", [1.0, 3.0])
@pytest.mark.parametrize("batch", [1, 4])
def test_greedy_equals_ar(adapter, batch, cfg_scale):
    sc = SamplingConfig(temperature=0, cfg_scale=cfg_scale)
    prompts, seeds = PROMPTS[:batch], list(range(batch))
    ar = decode("ar", adapter, prompts, seeds, sc)
    assert ar.tokens.shape == (batch, adapter.grid[0] * adapter.grid[1])
    assert len(set(ar.tokens[0].tolist())) > 2  # a non-degenerate image: the check below has teeth
    for name, params in [("sjd", {"window": 4}), ("sjd", {"window": 6, "init": "repeat-left"}),
                         ("csd", {"window": 6, "lam": 0.0})]:
        spec = decode(name, adapter, prompts, seeds, sc, params)
        assert torch.equal(ar.tokens, spec.tokens), (name, params)


def test_batch_row_matches_batch_one(adapter):
    sc = SamplingConfig(temperature=0, cfg_scale=3.0)
    batched = decode("ar", adapter, PROMPTS, list(range(4)), sc).tokens
    for b in (1, 3):
        assert torch.equal(decode("ar", adapter, PROMPTS[b:b + 1], [b], sc).tokens[0], batched[b])


# ------------------------------------------------------------------ rollback

def _full(adapter, prompt, tokens, use_cfg):
    """Logits and hidden for one sample fed from scratch: start, then all tokens in one step."""
    out0 = adapter.start([prompt], use_cfg)
    n = tokens.shape[0]
    out = adapter.step(tokens[None], torch.arange(n)[None])
    return out0, out


@pytest.mark.parametrize("use_cfg", [False, True])
def test_rollback_is_per_sample(adapter, use_cfg):
    g = torch.Generator().manual_seed(1)
    B, n = 3, adapter.grid[0] * adapter.grid[1]
    seq = torch.randint(0, adapter.n_codes, (B, n), generator=g)
    stale = torch.randint(0, adapter.n_codes, (B, n), generator=g)
    adapter.start(PROMPTS[:B], use_cfg)
    ar = torch.arange(5)
    # all three fed 0..4 with sample 1 on stale tokens, then a ragged window: sample 1 rolls back to index 2
    first = torch.stack([seq[0, :5], stale[1, :5], seq[2, :5]])
    adapter.step(first, ar.expand(B, 5))
    idx = torch.stack([ar + 5, ar + 2, ar + 5])
    tok = torch.stack([seq[0, 5:10], seq[1, 2:7], seq[2, 5:10]])
    # sample 1's indices 0..1 were fed stale: make its true sequence share them
    seq[1, :2] = stale[1, :2]
    out = adapter.step(tok, idx)
    for b in range(B):
        _, full = _full(adapter, PROMPTS[b], seq[b, :10], use_cfg)
        sel = idx[b]
        torch.testing.assert_close(out.cond[b], full.cond[0, sel], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(out.hidden[b], full.hidden[0, sel], atol=1e-4, rtol=1e-4)
        if use_cfg:
            torch.testing.assert_close(out.uncond[b], full.uncond[0, sel], atol=1e-4, rtol=1e-4)
        else:
            assert out.uncond is None


def test_start_and_step_shapes(adapter):
    out = adapter.start(PROMPTS[:2], True)
    V, D = adapter.n_codes, adapter.hidden_dim
    assert out.cond.shape == (2, 1, V) and out.uncond.shape == (2, 1, V) and out.hidden.shape == (2, 1, D)
    idx = torch.tensor([[0, 1, 2], [0, 1, 2]])
    out = adapter.step(torch.zeros(2, 3, dtype=torch.long), idx)
    assert out.cond.shape == (2, 3, V) and out.hidden.shape == (2, 3, D)
    torch.testing.assert_close(adapter.logits_from_hidden(out.hidden), out.cond, atol=1e-4, rtol=1e-4)
    # windows may overhang the grid by up to 64 indices (sjd's largest window): accepted, cache grows
    n = adapter.grid[0] * adapter.grid[1]
    far = torch.arange(n - 1, n + 63).expand(2, 64)
    assert adapter.step(torch.zeros(2, 64, dtype=torch.long), far).cond.shape == (2, 64, V)
    again = adapter.step(torch.zeros(2, 3, dtype=torch.long), idx)  # the grown cache kept the prompt
    torch.testing.assert_close(again.cond, out.cond, atol=1e-4, rtol=1e-4)


# ------------------------------------------------------------------ prompts, images, registry

def test_validate_prompts_names_the_index(adapter):
    adapter.validate_prompts(PROMPTS)
    # the model's own tokenizer reads any language: not refused as the closed-vocabulary reference model does
    adapter.validate_prompts(["大きな赤い円、灰色の背景", "🔴🌈", "12345", "!!!"])
    for blank in ("  ", "\t\n", ""):
        with pytest.raises(ValueError, match="prompt 1: empty prompt") as e:
            adapter.validate_prompts(["fine", blank])
        assert e.value.reason == "empty"


def test_decode_images(adapter):
    tokens = torch.randint(0, adapter.n_codes, (2, adapter.grid[0] * adapter.grid[1]))
    if isinstance(adapter, ChameleonAdapter):
        with pytest.raises(NotImplementedError, match="no decode"):
            adapter.decode_images(tokens)
        return
    img = adapter.decode_images(tokens)
    assert img.dtype == torch.uint8 and img.shape[0] == 2 and img.shape[-1] == 3


def test_emu3_line_breaks_are_in_the_cache():
    """Index (1, 0) must attend to row 0's EOL: with the EOL's embedding changed, its logits change."""
    a = tiny_emu3()
    a.start(PROMPTS[:1], False)
    tok = torch.arange(6)[None] % a.n_codes
    base = a.step(tok, torch.arange(6)[None]).cond
    with torch.no_grad():
        a.lm.embed_tokens.weight[a.line_break_id] += 1.0
    a.start(PROMPTS[:1], False)
    moved = a.step(tok, torch.arange(6)[None]).cond
    assert torch.allclose(base[0, :3], moved[0, :3])  # indices 0..2 predict 1..3: before the first EOL
    assert not torch.allclose(base[0, 3:], moved[0, 3:])  # index 3 returns the EOL's output; 4, 5 see it


def test_load_model_registry(tmp_path):
    with pytest.raises(ValueError, match="unknown model kind 'llava'"):
        load_model("llava:/x")
    with pytest.raises(ValueError, match="no checkpoint path"):
        load_model("janus")
    torch.manual_seed(0)
    a = tiny_janus()
    a.model.save_pretrained(tmp_path)
    b = load_model(f"janus:{tmp_path}", encoder=WORDS, dtype=torch.float32, boi_id=a.boi_id, pad_id=a.pad_id,
                   template="{prompt}")
    sc = SamplingConfig(temperature=0, cfg_scale=3.0)
    assert torch.equal(decode("ar", a, PROMPTS[:1], [0], sc).tokens, decode("ar", b, PROMPTS[:1], [0], sc).tokens)


# ------------------------------------------------------------------ against the plain HF forward

def _hf_reference(adapter, ids: list[int], tokens: torch.Tensor) -> torch.Tensor:
    """Image-code logits predicting indices 0..n from one uncached, unpadded HF forward of prompt + tokens."""
    m, P, cols = adapter.model, len(ids), adapter.grid[1]
    ids_t = torch.tensor([ids])
    if isinstance(adapter, JanusAdapter):
        emb = torch.cat([m.get_input_embeddings()(ids_t), m.prepare_embeddings_for_image_generation(tokens[None])], 1)
        return m.model.generation_head(m.model.language_model(inputs_embeds=emb).last_hidden_state)[0, P - 1:]
    codes = adapter._codes[tokens].tolist()
    seq, at = list(ids), [P - 1]  # at[i]: the position whose output predicts index i
    for i, c in enumerate(codes):
        seq.append(c)
        if isinstance(adapter, Emu3Adapter) and i % cols == cols - 1:
            seq.append(adapter.line_break_id)
        at.append(len(seq) - 1)
    if isinstance(adapter, Emu3Adapter):
        logits = m(input_ids=torch.tensor([seq])).logits[0]
    else:  # Chameleon's forward() masks image tokens: go through its hidden state and lm_head
        logits = m.lm_head(m.model(input_ids=torch.tensor([seq])).last_hidden_state)[0]
    return logits[at][:, adapter._codes]


@torch.no_grad()
def test_matches_plain_hf_forward(adapter):
    """Left-padded, slot-cached, batched CFG logits == the model's own uncached forward of each sequence."""
    n = adapter.grid[0] * adapter.grid[1]
    prompts = [PROMPTS[3], PROMPTS[2]]  # different lengths: the second row is left-padded
    tokens = torch.randint(0, adapter.n_codes, (2, n), generator=torch.Generator().manual_seed(2))
    out0 = adapter.start(prompts, True)
    out = adapter.step(tokens, torch.arange(n).expand(2, n))
    for b, p in enumerate(prompts):
        ids = adapter._prompt_ids(p)
        for got0, got, row in [(out0.cond, out.cond, ids), (out0.uncond, out.uncond, adapter._uncond_ids(p, ids))]:
            ref = _hf_reference(adapter, row, tokens[b])
            torch.testing.assert_close(torch.cat([got0[b], got[b]]), ref, atol=1e-4, rtol=1e-4)


@torch.no_grad()
def test_janus_greedy_ar_equals_hf_generate():
    """Janus's own image generate() (static cache, doubled CFG batch, pad-masked unconditional rows)."""
    from transformers import GenerationConfig
    torch.manual_seed(0)
    a = tiny_janus()
    ids = torch.tensor([a._prompt_ids(PROMPTS[1])])
    gc = GenerationConfig(do_sample=False, guidance_scale=3.0, bos_token_id=a.bos_id, pad_token_id=a.pad_id,
                          max_new_tokens=16, generation_kwargs={"boi_token_id": a.boi_id})
    hf = a.model.generate(ids, attention_mask=torch.ones_like(ids), generation_mode="image", generation_config=gc)
    ours = decode("ar", a, PROMPTS[1:2], [0], SamplingConfig(temperature=0, cfg_scale=3.0)).tokens
    assert torch.equal(hf, ours)
