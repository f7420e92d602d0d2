"""The counter-based random numbers (decoders/sampling.py): the hash is splitmix64's finaliser bit for bit (int64
arithmetic wraps as unsigned words do) and a stream is SplittableRandom's sequence, the uniforms are uniform
(Kolmogorov-Smirnov and chi-square) and strictly inside (0, 1), and streams keyed by different seeds,
purposes or counters look independent (their correlation and a 2D chi-square test of their joint
histogram). Every input is fixed, so each test either always passes or always fails: no flaky draws."""

import numpy as np
import pytest
import torch
from scipy.stats import chi2_contingency, chisquare, kstest

from ssdgen.decoders import sampling as rng  # the counter-based numbers live with sampling

MASK = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    """The reference finaliser on Python ints (unsigned 64-bit words)."""
    x &= MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


def test_mix_is_splitmix64_on_unsigned_words():
    xs = [0, 1, 2, 12345, (1 << 63) - 1, 1 << 63, MASK, 0x9E3779B97F4A7C15] + list(range(1000, 100_000, 997))
    got = rng.mix(torch.tensor([rng._signed(x) for x in xs])).tolist()
    assert [g & MASK for g in got] == [_splitmix64(x) for x in xs]


def test_a_stream_is_splittable_randoms_sequence():
    key = rng.keys([11])
    b = rng.base(key, rng.Purpose.SJD_STEP).item() & MASK
    got = rng.words(rng.base(key, rng.Purpose.SJD_STEP), 3, width=4)[0].tolist()
    assert [g & MASK for g in got] == [_splitmix64(b + (12 + j) * 0x9E3779B97F4A7C15) for j in range(4)]


def _stream(seeds, purpose=rng.Purpose.TOKEN, counter=0, width=1000) -> np.ndarray:
    return rng.Streams(seeds).uniform(purpose, counter, width=width).numpy().astype(np.float64)


def test_uniforms_are_uniform_and_strictly_inside_the_unit_interval():
    u = _stream(range(400), width=1000).ravel()  # 400k numbers, consecutive seeds and counters
    assert u.min() > 0 and u.max() < 1 and u.dtype == np.float64
    assert kstest(u, "uniform").pvalue > 1e-3
    assert chisquare(np.bincount((u * 256).astype(int), minlength=256)).pvalue > 1e-3
    q = rng.Streams([0]).uniform(1, 0, width=10_000)
    assert q.dtype == torch.float32 and torch.equal(q, (q * 2 ** 23 - 0.5).round().add(0.5) / 2 ** 23)  # exact


def _independent(a: np.ndarray, b: np.ndarray, bins: int = 16) -> bool:
    """No linear correlation (|r| < 4.5 / sqrt(n)) and a joint histogram consistent with independence."""
    a, b = a.ravel(), b.ravel()
    r = np.corrcoef(a, b)[0, 1]
    table = np.zeros((bins, bins))
    np.add.at(table, ((a * bins).astype(int), (b * bins).astype(int)), 1)
    return abs(r) < 4.5 / np.sqrt(len(a)) and chi2_contingency(table)[1] > 1e-3


@pytest.mark.parametrize("other", ["seed", "purpose", "counter", "slot"])
def test_streams_with_different_keys_look_independent(other):
    seeds = list(range(100, 300))
    base = _stream(seeds, rng.Purpose.SJD_STEP, 5, width=500)  # [200, 500]
    if other == "seed":
        alt = _stream([s + 1 for s in seeds], rng.Purpose.SJD_STEP, 5, width=500)
    elif other == "purpose":
        alt = _stream(seeds, rng.Purpose.SSD_BLOCK, 5, width=500)
    elif other == "counter":
        alt = _stream(seeds, rng.Purpose.SJD_STEP, 6, width=500)
    else:  # the next slot of the same stream
        alt = np.roll(base, -1, axis=1)
    assert _independent(base, alt)


def test_tensor_counters_equal_int_counters_and_keys_wrap_modulo_2_to_the_64():
    s = rng.Streams([5, 6])
    per_row = s.uniform(rng.Purpose.NOISE, torch.tensor([[3, 4], [3, 4]]), width=7)  # [2, 2, 7]
    assert torch.equal(per_row[:, 1], s.uniform(rng.Purpose.NOISE, 4, width=7))
    assert torch.equal(per_row, s.uniform(rng.Purpose.NOISE, torch.tensor([[3, 4]]), width=7))  # broadcast
    assert torch.equal(s.uniform(2, 40), s.uniform(2, torch.tensor([40, 40])))
    assert torch.equal(rng.keys([-1]), rng.keys([2 ** 64 - 1]))
    assert not torch.equal(rng.keys([0]), rng.keys([1]))


def test_gumbel_noise_has_the_gumbel_mean_and_variance():
    g = rng.gumbel(rng.Streams(range(50)).uniform(rng.Purpose.NOISE, 0, width=4000)).double()
    assert abs(g.mean().item() - 0.5772) < 0.01 and abs(g.var().item() - np.pi ** 2 / 6) < 0.03
