"""Re-export for the tests: the tiny random model lives in reference/tiny.py (the scaling benchmark uses it too)."""

from ssdgen.reference.tiny import tiny_model  # noqa: F401


def tiny_with_heads(path, seed: int = 1, dtype=None):
    """A tiny model (scale 0.2) with random non-identity SSD heads saved as its default heads, so drafts
    differ from the model's own predictions. dtype: the transformer's precision (fp32 when None); float64 is
    for tests whose expected values must not depend on the CPU's fp32 kernels (test_engine_golden.py). The
    heads stay fp32 whatever it is, as in production (decoders/drafters.py)."""
    import torch
    from ssdgen.decoders.drafters import HeadsConfig, SpatialHeads, model_fingerprint
    from ssdgen.reference.model import ReferenceModel
    m = tiny_model(path, scale=0.2)
    torch.manual_seed(seed)
    heads = SpatialHeads(HeadsConfig(dim=m.hidden_dim, emb_dim=m.hidden_dim, n_codes=m.n_codes, grid=m.grid,
                                     model=model_fingerprint(m)))
    with torch.no_grad():
        for p in heads.parameters():
            p.normal_(0, 0.1)
    heads.save(m.default_heads)
    # the same saved bundle loaded again in dtype: same weights' checksum, so the heads' fingerprint still fits
    return m if dtype in (None, torch.float32) else ReferenceModel(m.path, dtype=dtype)
