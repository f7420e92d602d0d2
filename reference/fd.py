"""Fréchet distance between two image sets, on the scorer network's 256-d features (FID's recipe, with a
network trained on the scenes domain in Inception's place). Deterministic: eval-mode network, float64
statistics, scipy's matrix square root.
"""

from __future__ import annotations

import numpy as np
from scipy import linalg


def frechet_distance(feats_a: np.ndarray, feats_b: np.ndarray) -> float:
    """FD between Gaussians fitted to features [N, D] and [M, D]."""
    a, b = feats_a.astype(np.float64), feats_b.astype(np.float64)
    mu_a, mu_b = a.mean(0), b.mean(0)
    cov_a, cov_b = np.cov(a, rowvar=False), np.cov(b, rowvar=False)
    covmean, _ = linalg.sqrtm(cov_a @ cov_b, disp=False)
    if not np.isfinite(covmean).all():  # near-singular product: regularise, as pytorch-fid does
        eps = np.eye(len(cov_a)) * 1e-6
        covmean = linalg.sqrtm((cov_a + eps) @ (cov_b + eps))
    covmean = covmean.real
    return float(((mu_a - mu_b) ** 2).sum() + np.trace(cov_a) + np.trace(cov_b) - 2 * np.trace(covmean))
