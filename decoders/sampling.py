"""Random numbers and sampling: the counter-based uniforms every decoder draws, the one processed distribution,
and tokens sampled from it given uniforms, the prefill's token 0 among them.

Counter-based random numbers. Every random number a decoder uses is a pure function of the sample's seed, a
purpose and a counter (an image index, the sample's own forward or block number, a slot), computed for the
whole batch in one set of integer tensor ops on the model's device.

Why not a generator per sample: a sample's tokens must not depend on its batch-mates, and a retried shard
must reproduce its images. One `torch.Generator` per sample gives that, but costs one small draw (one kernel
launch on a GPU) per sample per forward, in a Python loop. Here the same guarantee comes from the keying: a
sample's numbers depend only on its seed and on counters that its own progress sets, never on its row in
the batch or on how many numbers other samples drew. The numbers are also device-independent: the same on a
CPU and a GPU (a torch.Generator's CPU and CUDA streams differ).

Each (sample, purpose) is a SplittableRandom stream (Steele, Lea and Flood 2014): number c of it is
mix(base + c * GOLDEN), where mix is splitmix64's finaliser, a bijection on 64-bit words with full avalanche,
and GOLDEN the odd gamma 2^64 / golden ratio; that sequence passes BigCrush. So numbers with distinct
counters never share a word, and one mix per number is all a draw costs. torch has no unsigned 64-bit
arithmetic, so mix runs on int64: multiplication wraps modulo 2^64 as on unsigned words, and a logical right
shift is an arithmetic one with the sign-extended bits masked off.

    key_b          = mix(seed_b * GOLDEN + SALT)                    one per sample
    base_b,p       = mix(key_b + purpose * GOLDEN)                  one per sample and purpose (`Streams`)
    number c       = mix(base_b,p + c * GOLDEN)                     c = counter * width + j, j < width
    uniform        = (the number's top 23 bits + 0.5) / 2^23        in (0, 1)

Uniforms have 23 bits: every one is exact in fp32 and lies strictly inside (0, 1), so no log or inverse CDF
needs a clamp.

The processed distribution. `processed_probs` turns raw logits into the distribution every decoder samples from
and verifies against: CFG mix -> temperature -> top-k -> top-p -> softmax, always in fp32 (a bf16 model's logits
are cast first). AR sampling, drafting and verification all call it, because speculative acceptance is lossless
only when draft and target are processed alike. Sampling is deterministic given its uniforms (`sample_from`,
`gumbel_sample`), and the uniforms are keyed by each sample's seed (above), so a sample's tokens do not depend on
which other samples share its batch.

The prefill (`prefill`): every decoder starts with it, and image token 0 is an AR sample in all of them, drawn
with number 0 of the sample's TOKEN stream.
"""

from __future__ import annotations

from enum import IntEnum

import torch

from .protocol import ImageTokenModel, StepOutput
from .recipes import SamplingConfig


def _signed(x: int) -> int:
    """A 64-bit word as the int64 with the same bits."""
    x %= 1 << 64
    return x - (1 << 64) if x >= 1 << 63 else x


GOLDEN = _signed(0x9E3779B97F4A7C15)  # 2^64 / golden ratio, odd: SplittableRandom's gamma
SALT = _signed(0x632BE59BD9B4E019)
_M1, _M2 = _signed(0xBF58476D1CE4E5B9), _signed(0x94D049BB133111EB)
BITS = 23  # uniform resolution: exact in fp32 with the half-step offset


class Purpose(IntEnum):
    """What a stream of numbers is for: one value per use, so no two uses ever share numbers."""
    TOKEN = 1  # an AR sample (the prefill's token 0 and every AR step), counter: the image index
    SJD_FIRST = 2  # SJD's first window of fresh drafts
    SJD_STEP = 3  # one SJD forward (accept, resample, Jacobi, fresh drafts), counter: the sample's forward number
    NOISE = 4  # coupled drafts' Gumbel noise, counter: the image index, one number per code
    SSD_BLOCK = 5  # one SSD block (draft, accept / resample per round, bonus), counter: block * 2^16 + offset
    BRANCH = 6  # proactive drafting's candidate tests (window.py: Branches), counter: the sample's forward number


def _shr(x: torch.Tensor, s: int) -> torch.Tensor:
    """Logical right shift of int64 words (torch's >> is arithmetic)."""
    return (x >> s) & ((1 << (64 - s)) - 1)


def mix(x: torch.Tensor) -> torch.Tensor:
    """splitmix64's finaliser on int64 words (a bijection; multiplication wraps modulo 2^64)."""
    x = (x ^ _shr(x, 30)) * _M1
    x = (x ^ _shr(x, 27)) * _M2
    return x ^ _shr(x, 31)


def keys(seeds: list[int], device: torch.device | str = "cpu") -> torch.Tensor:
    """One key per sample, [B] int64, on the model's device (seeds are taken modulo 2^64)."""
    return mix(torch.tensor([_signed(int(s)) for s in seeds], dtype=torch.long, device=device) * GOLDEN + SALT)


def base(key: torch.Tensor, purpose: int) -> torch.Tensor:
    """The start of each sample's stream for a purpose: key [...] -> [...]."""
    return mix(key + _signed(int(purpose) * GOLDEN))


def words(base: torch.Tensor, counter: int | torch.Tensor, width: int | None = None) -> torch.Tensor:
    """Numbers counter * width + j (j < width) of the streams at base [...] -> int64 [..., *trailing, width]
    (no width dim when width is None). counter: an int, or an int64 tensor whose leading dims are base's (or
    broadcast to them, e.g. [1, n] for every sample); its further dims are added after base's."""
    if isinstance(counter, torch.Tensor):
        base = base.view(base.shape + (1,) * (counter.dim() - base.dim()))
    if width is None:
        return mix(base + (counter * GOLDEN if isinstance(counter, torch.Tensor) else _signed(counter * GOLDEN)))
    c = counter[..., None] * width if isinstance(counter, torch.Tensor) else counter * width
    return mix(base[..., None] + (c + torch.arange(width, device=base.device)) * GOLDEN)


def to_uniform(w: torch.Tensor) -> torch.Tensor:
    """int64 words -> fp32 uniforms (top 23 bits + 0.5) / 2^23, in (0, 1) and exact."""
    top = (w >> (64 - BITS)).float()  # the top bits as a signed number s in [-2^22, 2^22): exact in fp32
    return top.mul_(2.0 ** -BITS).add_(0.5 + 2.0 ** -(BITS + 1))  # (s + 2^22 + 0.5) / 2^23, exact


def uniform(base: torch.Tensor, counter: int | torch.Tensor, width: int | None = None) -> torch.Tensor:
    """fp32 uniforms in (0, 1) of `words`' shape."""
    return to_uniform(words(base, counter, width))


class Streams:
    """A batch's streams: the keys of its seeds and, per purpose, each sample's stream base (made once)."""

    def __init__(self, seeds: list[int], device: torch.device | str = "cpu"):
        self.key = keys(seeds, device)  # [B]
        self._bases: dict[int, torch.Tensor] = {}

    def base(self, purpose: int) -> torch.Tensor:
        if purpose not in self._bases:
            self._bases[purpose] = base(self.key, purpose)
        return self._bases[purpose]  # [B]

    def uniform(self, purpose: int, counter: int | torch.Tensor, width: int | None = None) -> torch.Tensor:
        """Each sample's uniforms counter * width + j of its `purpose` stream: [B, ..., width]."""
        return uniform(self.base(purpose), counter, width)

    def admit(self, rows: torch.Tensor, seeds: list[int]) -> None:
        """Rows `rows` [R] take new samples with `seeds` (continuous batching, slots.py): their keys and the stream
        bases made so far become the new seeds', in place, so a holder of a base (PositionNoise) sees them too."""
        key = keys(seeds, self.key.device)  # [R]
        self.key[rows] = key
        for purpose, b in self._bases.items():
            b[rows] = base(key, purpose)


def gumbel(u: torch.Tensor) -> torch.Tensor:
    """Standard Gumbel noise from uniforms in (0, 1)."""
    return -torch.log(-torch.log(u))


class PositionNoise:
    """Gumbel noise fixed per (sample, image index) for coupled drafts: row j of sample b is numbers j*V ..
    j*V + V - 1 of b's NOISE stream, the same whenever they are computed; they are used for j's draft only,
    which is what the coupled drafts' losslessness needs (window.py). Only the live window's rows are held (a
    ring of `span` rows, row j at slot j % span, with the index each slot holds), so memory is B x span x V,
    not B x N x V (1 GB per sample for Emu3's 8,100 positions and 32k codes); each call computes the rows that
    entered the window since the last one, for the whole batch at once."""

    def __init__(self, noise_base: torch.Tensor, V: int, span: int):
        """noise_base [B]: each sample's NOISE stream (`Streams.base(Purpose.NOISE)`)."""
        B, dev = noise_base.shape[0], noise_base.device
        self.base, self.V, self.span = noise_base, V, span
        self.ring = torch.zeros(B, span, V, device=dev)  # [B, span, V]
        self.held = torch.full((B, span), -1, dtype=torch.long, device=dev)  # the index each slot holds

    def forget(self, rows: torch.Tensor) -> None:
        """Rows `rows` [R] took new samples (their bases changed with Streams.admit): none of their held rows is
        theirs any more."""
        self.held[rows] = -1

    def rows(self, index: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
        """index [B, S] (S <= span distinct indices per sample, e.g. a window) -> Gumbel noise [B, S, V].
        Inactive samples compute nothing and get stale rows."""
        rows = torch.arange(index.shape[0], device=index.device)[:, None]
        slot = index % self.span  # [B, S]
        stale = (self.held[rows, slot] != index) & active[:, None]
        bs, ss = stale.nonzero(as_tuple=True)  # [P] each: the rows to compute (one host sync)
        if bs.numel():
            at = index[bs, ss]
            self.ring[bs, slot[bs, ss]] = gumbel(uniform(self.base[bs], at, width=self.V))
            self.held[bs, slot[bs, ss]] = at
        return self.ring[rows, slot]


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
    """Where a model's tensors live: every decoder buffer, key and uniform goes there (CPU for a model that does
    not say)."""
    return torch.device(getattr(model, "device", "cpu"))


def model_dtype(model) -> torch.dtype:
    """The precision of a model's weights and outputs (fp32 for a model that does not say). Probabilities are
    fp32 whatever it is: `processed_probs` casts the logits first."""
    return getattr(model, "dtype", torch.float32)


def sample_from(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF sampling: probs [..., V], u [...] -> token ids [...]. Deterministic given u."""
    cdf = probs.cumsum(-1)
    cdf = cdf / cdf[..., -1:]  # guard against rounding: the last bin ends at exactly 1
    idx = torch.searchsorted(cdf, u.unsqueeze(-1).to(cdf.dtype).contiguous(), right=True).squeeze(-1)
    return idx.clamp_(max=probs.shape[-1] - 1)


def gumbel_sample(probs: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """Gumbel-max sampling: argmax(log probs + g), probs [..., V], g [..., V] -> [...]. An exact sample of
    probs when g is fresh Gumbel noise; with g fixed per position, two similar distributions give the same
    token with probability at least (1 - TV) / (1 + TV) (the Gumbel coupling)."""
    logp = torch.where(probs > 0, probs.clamp_min(1e-38).log(), float("-inf"))
    return (logp + g).argmax(-1)


def prefill(model: ImageTokenModel, prompts: list[str], sc: SamplingConfig, streams: Streams
            ) -> tuple[StepOutput, torch.Tensor, torch.Tensor]:
    """Prefill the prompts (with the unconditional branch under CFG) and draw image token 0 with number 0 of each
    sample's TOKEN stream -> (the prefill's output, token 0's distribution [B, V], token 0 [B]). The distribution
    goes back to the caller, whose statistics count its entropy (stats.Tally)."""
    out = model.start(prompts, sc.uses_cfg)
    q0 = next_probs(out, sc)  # [B, V]
    return out, q0, sample_from(q0, streams.uniform(Purpose.TOKEN, 0))
