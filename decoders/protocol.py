"""The model protocol every decoder uses and every image AR model implements.

Image tokens are addressed by their raster index i in [0, H*W). `start` prefills the prompts (and, with
CFG, the unconditional branch) and returns the logits for index 0. `step(tokens, index, lengths)` feeds
tokens at the given indices, per sample (the first lengths[b] of row b; all without lengths), and returns
for each the logits that predict index + 1, plus the last hidden state before the final norm. Caches are
position-indexed: feeding a sample from an earlier index is its rollback, and touches no other sample.
What a model offers beyond the protocol it declares as `capabilities` (a `Capabilities`), never probed: with
`tree_attention` (the reference model) it also takes `step(..., tree=)`, a [B, S, S] mask of which entries each
entry sees, and `copy_cache(src, dst, where)`, which moves cached keys and values between indices: proactive
drafting's branches (decoders/window.py) need both; the window loop refuses them elsewhere. With `admit`
(continuous batching, decoders/slots.py) it takes `admit(rows, prompts, tokens, index, lengths)`: the prompts
prefilled into cache rows `rows`, whose previous samples are done, packed into one forward with a step of the
other rows. `heads`: where its
own SSD heads are; `weights_digest`: its weights' checksum (heads and cached plans are for these weights only);
`kv_bytes_per_sample(use_cfg)`: its caches' bytes per sample, which caps a batch (workers/decode_worker.py).
A prompt the model cannot condition on is refused up front (`validate_prompts`) with a `PromptError`, whose
`reason` code a run counts its error rows by.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

import torch


@dataclass(frozen=True)
class Capabilities:
    """What a model offers beyond the protocol (module doc); the defaults: nothing more."""

    tree_attention: bool = False  # step(..., tree=) and copy_cache: proactive drafting's branches
    admit: bool = False  # admit(...): a finished sample's cache row takes a new prompt mid-decode (slots.py)
    heads: str | None = None  # its own SSD heads (heads.safetensors + heads.json), if it ships any
    weights_digest: str | None = None  # the weights' checksum
    kv_bytes_per_sample: Callable[[bool], int] | None = None  # use_cfg -> bytes of one sample's caches
    kv_dtype: str | None = None  # what its KV cache stores keys and values in (`reference:kv=bf16`): a step's speed
    attention: str | None = None  # which kernel its cached steps' attention runs ("op", "sdpa"): a step's speed


@dataclass
class StepOutput:
    cond: torch.Tensor  # [B, S, V] conditional logits
    uncond: torch.Tensor | None  # [B, S, V] unconditional logits, None without CFG
    hidden: torch.Tensor  # [B, S, D] conditional last hidden state, before the final norm
    hidden_uncond: torch.Tensor | None = None  # [B, S, D] the unconditional branch's, None without CFG


# Why a model refused a prompt, as short codes a run counts its error rows by (stats.parquet `error_reason`,
# summary.json `errors_by_reason`); the message says the same for a person.
EMPTY = "empty"  # nothing but whitespace
NO_KNOWN_WORDS = "no_known_words"  # none of the model's words: another script, emoji, digits, punctuation only
UNKNOWN_WORDS = "unknown_words"  # some words the model does not know
TOO_LONG = "too_long"  # more tokens than the model takes
GRAMMAR = "grammar"  # known words that the model's caption grammar does not parse
INVALID_PROMPT = "invalid_prompt"  # a plain ValueError from a model that gives no reason of its own


class PromptError(ValueError):
    """A prompt the model cannot condition on: the message says what is wrong, `reason` is one short code."""

    def __init__(self, message: str, reason: str = INVALID_PROMPT):
        super().__init__(message)
        self.reason = reason

    def __reduce__(self):  # pickled with its reason (a Ray actor may raise it to the driver)
        return type(self), (str(self), self.reason)


def prompt_error_reason(e: BaseException) -> str:
    """The reason code of a refused prompt: a PromptError's own, else INVALID_PROMPT."""
    return getattr(e, "reason", None) or INVALID_PROMPT


class ImageTokenModel(Protocol):
    name: str
    grid: tuple[int, int]  # (rows, cols) of image tokens
    n_codes: int  # image-token vocabulary size
    hidden_dim: int

    def validate_prompts(self, prompts: list[str]) -> None:
        """Raise ValueError naming the prompt and the problem (a PromptError with its reason code); an empty or
        whitespace-only prompt is refused by every model."""

    def start(self, prompts: list[str], use_cfg: bool) -> StepOutput:
        """Allocate caches for len(prompts) samples, prefill, return logits for index 0 ([B, 1, V])."""

    def step(self, tokens: torch.Tensor, index: torch.Tensor, lengths: torch.Tensor | None = None) -> StepOutput:
        """tokens, index [B, S] -> logits predicting index + 1, [B, S, V]. lengths [B] (optional): only row b's
        first lengths[b] entries are real, the rest padding whose outputs are junk; a model may skip computing
        them (a packed ragged step) or compute them anyway (None: every entry is real)."""

    def admit(self, rows: torch.Tensor, prompts: list[str], tokens: torch.Tensor, index: torch.Tensor,
              lengths: torch.Tensor) -> tuple[StepOutput, StepOutput]:
        """With `capabilities.admit` only. Prefill `prompts` (with CFG, the unconditional branch too) into cache rows
        `rows` [R], packed into one forward with a step of every row (tokens, index, lengths [B, S] and [B] as `step`
        takes them; the rows in `rows` are replaced by their prompts, the rest feed their first lengths[b] entries,
        and a row of length 0 feeds nothing). -> (the step's output [B, S], junk on the admitted rows; the prefills'
        output for index 0 [R, 1], as `start` gives it). A row's earlier keys past its prompt are never read: each
        index is written before the first query that sees it."""

    def embed(self, tokens: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """Input embeddings of image tokens at indices, [B, S, D]."""

    def logits_from_hidden(self, hidden: torch.Tensor) -> torch.Tensor:
        """The model's own final norm + head: [..., D] -> [..., V]."""

    def decode_images(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens [B, H*W] -> uint8 images [B, height, width, 3]."""


def check_request(model: ImageTokenModel, prompts: list[str], seeds: list[int], greedy: bool = False,
                  relaxed: bool = False) -> None:
    """What every decoder refuses up front: mismatched seeds, relaxation without sampling, bad prompts."""
    if len(prompts) != len(seeds):
        raise ValueError(f"got {len(prompts)} prompts but {len(seeds)} seeds")
    if greedy and relaxed:
        raise ValueError("CSD's relaxation (lam > 0) needs sampling; with temperature 0 use lam = 0")
    model.validate_prompts(prompts)
