"""Re-export for the tests: the tiny random model lives in reference/tiny.py (the scaling benchmark uses it too)."""

from reference.tiny import tiny_model  # noqa: F401


def tiny_with_heads(path, seed: int = 1):
    """A tiny model (scale 0.2) with random non-identity SSD heads saved as its default heads, so drafts
    differ from the model's own predictions."""
    import torch
    from decoders.ssd_heads import HeadsConfig, SpatialHeads, model_fingerprint
    m = tiny_model(path, scale=0.2)
    torch.manual_seed(seed)
    heads = SpatialHeads(HeadsConfig(dim=m.hidden_dim, emb_dim=m.hidden_dim, n_codes=m.n_codes, grid=m.grid,
                                     model=model_fingerprint(m)))
    with torch.no_grad():
        for p in heads.parameters():
            p.normal_(0, 0.1)
    heads.save(m.default_heads)
    return m
