"""The one processed distribution, and sampling from it with a torch.Generator per sample.

`processed_probs` turns raw logits into the distribution every decoder samples from and verifies
against: CFG mix -> temperature -> top-k -> top-p -> softmax. AR sampling, drafting and verification all
call it, because speculative acceptance is lossless only when draft and target are processed alike.

Randomness is per sample: `uniforms` draws each sample's numbers from that sample's own generator, so a
sample's tokens do not depend on which other samples share its batch.
"""

from __future__ import annotations


import torch

from .configs import SamplingConfig  # noqa: F401 - re-exported: the one processed distribution's settings


def cfg_mix(cond: torch.Tensor, uncond: torch.Tensor | None, scale: float) -> torch.Tensor:
    """Classifier-free guidance on logits: u + s * (c - u). scale 1 (or no uncond) returns cond."""
    if uncond is None or scale == 1.0:
        return cond
    return uncond + scale * (cond - uncond)


def processed_probs(cond: torch.Tensor, uncond: torch.Tensor | None, sc: SamplingConfig) -> torch.Tensor:
    """Logits [..., V] (conditional, and unconditional for CFG) -> probabilities [..., V]."""
    logits = cfg_mix(cond.float(), None if uncond is None else uncond.float(), sc.cfg_scale)
    if sc.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).to(logits.dtype)
    logits = logits / sc.temperature
    if sc.top_k and sc.top_k < logits.shape[-1]:
        kth = torch.topk(logits, sc.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if sc.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        cum = torch.softmax(sorted_logits, dim=-1).cumsum(-1)
        drop_sorted = (cum - torch.softmax(sorted_logits, dim=-1)) >= sc.top_p  # keep the smallest prefix >= p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return torch.softmax(logits, dim=-1)


def next_probs(out, sc: SamplingConfig) -> torch.Tensor:
    """The processed distribution of the token after each sample's last fed position: a `StepOutput`'s logits
    [B, S, V] -> [B, V] (AR's step, and every decoder's prefill)."""
    return processed_probs(out.cond[:, -1], None if out.uncond is None else out.uncond[:, -1], sc)


def model_device(model) -> torch.device:
    """Where a model's tensors live: every decoder buffer, uniform and generator goes there (CPU for a model
    that does not say)."""
    return torch.device(getattr(model, "device", "cpu"))


def make_generators(seeds: list[int], device: torch.device | str = "cpu") -> list[torch.Generator]:
    """One generator per sample, on the model's device. A CUDA generator (Philox) gives another stream than a
    CPU one (Mersenne Twister) for the same seed: tokens are reproducible per device, not across devices."""
    return [torch.Generator(device=device).manual_seed(int(s)) for s in seeds]


def uniforms(gens: list[torch.Generator], *shape: int, device=None) -> torch.Tensor:
    """[B, *shape] uniforms in [0, 1), row b drawn from gens[b] alone."""
    return torch.stack([torch.rand(shape, generator=g, device=g.device) for g in gens]).to(device)


def sample_from(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF sampling: probs [..., V], u [...] -> token ids [...]. Deterministic given u."""
    cdf = probs.cumsum(-1)
    cdf = cdf / cdf[..., -1:]  # guard against rounding: the last bin ends at exactly 1
    idx = torch.searchsorted(cdf, u.unsqueeze(-1).to(cdf.dtype).contiguous(), right=True).squeeze(-1)
    return idx.clamp_(max=probs.shape[-1] - 1)


def sample(probs: torch.Tensor, gens: list[torch.Generator]) -> torch.Tensor:
    """One token per sample: probs [B, V] -> [B]."""
    return sample_from(probs, uniforms(gens, device=probs.device))


def _gumbel(u: torch.Tensor) -> torch.Tensor:
    return -torch.log(-torch.log(u.clamp(1e-20, 1 - 1e-7)))


class PositionNoise:
    """Gumbel noise fixed per (sample, index) for coupled drafts: row j of sample b is the j-th row of V
    uniforms that b's generator gives from where decoding starts, as if a [n_rows, V] table were drawn up
    front. Only the live window's rows are held (a ring of `span` rows, row j at slot j % span), so memory is
    B x span x V, not B x N x V (1 GB per sample for Emu3's 8,100 positions and 32k codes): a clone of each
    generator draws rows in index order as the window reaches them, and the sample's own generator skips
    past the table (drawn and discarded in chunks) so its other randomness does not overlap it.

    That holds for CPU generators, whose draws are split-invariant. A CUDA generator (Philox) is not: rows
    drawn lazily in varying chunks are not the rows of one up-front draw, and the clone could run into the
    stream the sample's generator skipped to. On other devices the noise therefore has a generator of its own,
    seeded from the sample's seed (`_noise_seed`), and the sample's generator skips nothing. Each row is still
    drawn once, when the window first reaches it, and never redrawn, which is what the coupled drafts'
    losslessness needs (sjd.py): the noise of index j is fresh when drawn and only ever draws j's draft."""

    def __init__(self, gens: list[torch.Generator], n_rows: int, V: int, span: int,
                 device: torch.device | str | None = None):
        self.src = [self._source(g, n_rows, V) for g in gens]
        self.V, self.span, self.n_rows = V, span, n_rows
        self.drawn = [0] * len(gens)  # rows drawn so far, per sample
        if device is None:
            device = gens[0].device if gens else "cpu"
        self.ring = torch.zeros(len(gens), span, V, device=device)

    @staticmethod
    def _source(g: torch.Generator, n_rows: int, V: int) -> torch.Generator:
        """The generator that draws g's sample's noise rows (see the class doc)."""
        if g.device.type != "cpu":
            return torch.Generator(device=g.device).manual_seed(_noise_seed(g.initial_seed()))
        clone = torch.Generator(device=g.device)
        clone.set_state(g.get_state())
        for i in range(0, n_rows, 256):  # CPU draws are split-invariant: this is one [n_rows, V] draw
            torch.rand((min(256, n_rows - i), V), generator=g, device=g.device)
        return clone

    def rows(self, index: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
        """index [B, S] (non-decreasing along S; a sample never asks again for rows more than `span`
        behind its newest) -> Gumbel noise [B, S, V]. Inactive samples draw nothing and get stale rows."""
        upto_all = (index.amax(1) + 1).clamp(max=self.n_rows).tolist()  # one host sync for the batch
        for b in active.nonzero().squeeze(1).tolist():
            upto = upto_all[b]
            if upto > self.drawn[b]:
                new = torch.rand((upto - self.drawn[b], self.V), generator=self.src[b], device=self.src[b].device)
                slots = torch.arange(self.drawn[b], upto, device=self.ring.device) % self.span
                self.ring[b, slots] = _gumbel(new).to(self.ring.device)
                self.drawn[b] = upto
        return self.ring[torch.arange(index.shape[0], device=index.device)[:, None], index % self.span]


def _noise_seed(seed: int) -> int:
    """A seed for a sample's noise stream on a non-CPU device: an affine mix of its own seed with an odd
    multiplier (a bijection: distinct seeds, distinct noise seeds) and an odd offset (no seed maps to itself)."""
    return (seed * 0x9E3779B97F4A7C15 + 0x632BE59BD9B4E019) % 2**63


def gumbel_sample(probs: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """Gumbel-max sampling: argmax(log probs + g), probs [..., V], g [..., V] -> [...]. An exact sample of
    probs when g is fresh Gumbel noise; with g fixed per position, two similar distributions give the same
    token with probability at least (1 - TV) / (1 + TV) (the Gumbel coupling)."""
    logp = torch.where(probs > 0, probs.clamp_min(1e-38).log(), float("-inf"))
    return (logp + g).argmax(-1)
