"""Model bundles: safetensors + config + checksums; corrupt or mismatched files are refused by name."""

import json

import numpy as np
import pytest
import torch

from ssdgen.reference.gpt import GPT, GPTConfig
from ssdgen.reference.scenes import render, sample_scene
from ssdgen.reference.vqvae import VQVAE, VQConfig
from ssdgen.reference.weights import BundleError, load_bundle, save_bundle

TINY_GPT = GPTConfig(dim=32, n_layers=1, n_heads=2, mlp_hidden=48)
TINY_VQ = VQConfig(ch=(8, 8, 8), codebook_size=16, code_dim=4)


@pytest.fixture
def bundle(tmp_path):
    save_bundle(tmp_path, VQVAE(TINY_VQ), GPT(TINY_GPT), {"note": "test"})
    return tmp_path


def test_round_trip(bundle):
    b = load_bundle(bundle)
    assert b.gpt.cfg == TINY_GPT and b.vq.cfg == TINY_VQ
    assert sorted(p.name for p in bundle.iterdir()) == ["checksums.json", "config.json", "gpt.safetensors",
                                                        "vq.safetensors"]


def test_corrupt_weights_are_refused(bundle):
    data = bytearray((bundle / "gpt.safetensors").read_bytes())
    data[-1] ^= 0xFF
    (bundle / "gpt.safetensors").write_bytes(bytes(data))
    with pytest.raises(BundleError, match="gpt.safetensors: SHA-256 does not match"):
        load_bundle(bundle)


def test_weights_that_do_not_fit_the_config_are_refused(bundle):
    cfg = json.loads((bundle / "config.json").read_text())
    cfg["gpt"]["dim"] = 64
    (bundle / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(BundleError):
        load_bundle(bundle, verify=False)


def test_missing_bundle_is_named(tmp_path):
    with pytest.raises(BundleError, match="not a model bundle"):
        load_bundle(tmp_path / "nowhere")


def test_bundled_reference_model_loads_with_checksums(ref_model):
    assert ref_model.grid == (16, 16) and ref_model.n_codes == 1024


def test_vq_tokenizer_round_trip(ref_model):
    vq = ref_model.vq
    rng = np.random.default_rng(3)
    scenes = [sample_scene(rng) for _ in range(64)]
    x = torch.from_numpy(np.stack([render(s) for s in scenes]))
    codes = vq.encode(x)
    assert codes.shape == (64, 16, 16) and codes.max() < 1024
    rec = vq.decode(codes)
    mse = ((rec.float() - x.float()) ** 2).mean()
    assert 10 * torch.log10(255 ** 2 / mse) > 20  # dB
    # codes -> pixels -> codes is (nearly) a fixed point
    assert (vq.encode(rec) == codes).float().mean() > 0.8
    assert len(torch.unique(codes)) > 200  # the codebook is in use, not collapsed
