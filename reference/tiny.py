"""A tiny randomly initialised reference-architecture model with peaked, context-dependent distributions:
for decoder tests that must run in seconds (the way transformers' tests build tiny configs), and for the
structural SSD scaling benchmark over grid sizes no trained model here has."""

from pathlib import Path

import torch

from ssdgen.reference.gpt import GPT, GPTConfig
from ssdgen.reference.model import ReferenceModel
from ssdgen.reference.vqvae import VQVAE, VQConfig
from ssdgen.reference.weights import save_bundle


def tiny_model(path: Path, codes: int = 8, grid: int = 4, seed: int = 0, scale: float = 0.35) -> ReferenceModel:
    torch.manual_seed(seed)
    gpt = GPT(GPTConfig(dim=32, n_layers=2, n_heads=2, mlp_hidden=64, n_image_codes=codes, grid=grid))
    with torch.no_grad():
        for p in gpt.parameters():
            if p.dim() >= 2:
                p.normal_(0, scale)
    vq = VQVAE(VQConfig(codebook_size=codes, code_dim=4, ch=(8, 8, 8)))
    save_bundle(path, vq, gpt, {"note": "tiny test model"})
    return ReferenceModel(path)
