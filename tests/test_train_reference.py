"""`python -m lab train-reference` on a tiny config: a resumed run continues bit-identically, the object-weighted
loss weights what it says, and a checkpoint written with other settings is refused."""

from dataclasses import replace

import pytest
import torch
from safetensors.torch import load_file

from ssdgen.reference.gpt import GPT, GPTConfig
from lab.reference.train import TrainConfig, train_reference
from lab.reference.train_gpt import GPTTrainConfig
from ssdgen.reference.vqvae import VQConfig

TINY = TrainConfig(n_images=48, vq_steps=3, vq_batch=8, curve_prompts=0, vq=VQConfig(codebook_size=16, code_dim=4,
                                                                                       ch=(8, 8, 8)),
                   gpt=GPTTrainConfig(steps=6, batch=4, warmup=2, eval_every=0,
                                      gpt=GPTConfig(dim=32, n_layers=2, n_heads=2, mlp_hidden=64,
                                                    n_image_codes=16)))


def test_resume_continues_bit_identically(tmp_path):
    whole = train_reference(tmp_path / "a", TINY, tmp_path / "work-a")
    part = train_reference(tmp_path / "b", TINY, tmp_path / "work-b", until_step=3)
    assert part["steps_done"] == 3 and not (tmp_path / "b").exists()  # no bundle from an unfinished run
    folders = sorted(p.name for p in (tmp_path / "work-b").glob("checkpoint-*"))
    assert folders == ["checkpoint-000003"] == [(tmp_path / "work-b" / "latest").read_text()]
    rest = train_reference(tmp_path / "b", TINY, tmp_path / "work-b", resume=True)
    assert whole["steps_done"] == rest["steps_done"] == 6
    a, b = load_file(tmp_path / "a" / "gpt.safetensors"), load_file(tmp_path / "b" / "gpt.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # and it trained: the weights moved from their initialisation
    torch.manual_seed(TINY.gpt.seed + 1)
    init = GPT(TINY.gpt.gpt).state_dict()
    assert not torch.equal(init["layers.0.w2.weight"], a["layers.0.w2.weight"])


def test_resume_refuses_other_settings(tmp_path):
    train_reference(tmp_path / "a", TINY, tmp_path / "work", until_step=2)
    other = replace(TINY, gpt=replace(TINY.gpt, lr=1e-4))
    with pytest.raises(ValueError, match="other training settings"):
        train_reference(tmp_path / "a", other, tmp_path / "work", resume=True)


def test_weighted_loss_is_the_weighted_mean_of_token_losses():
    torch.manual_seed(0)
    g = GPT(GPTConfig(dim=32, n_layers=1, n_heads=2, mlp_hidden=64, n_image_codes=16))
    caps, codes = torch.randint(0, 40, (2, 36)), torch.randint(0, 16, (2, 256))
    w = torch.ones(2, 256)
    assert torch.allclose(g.training_loss(caps, codes, w), g.training_loss(caps, codes))
    w[0, 7] = 1e6  # nearly all weight on one token: the loss is that token's cross-entropy
    logits, _ = g(torch.cat([caps + 16, codes], 1)[:, :-1])
    ce7 = torch.nn.functional.cross_entropy(logits[0, 35 + 7], codes[0, 7])
    assert torch.allclose(g.training_loss(caps, codes, w), ce7, rtol=1e-3)
