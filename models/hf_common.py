"""Shared machinery of the Hugging Face adapters (hf_adapters.py): a slot-indexed KV cache, per-sample
masks and positions, and the prompt-encoder seam.

Layout. Every batch row (2B rows with CFG: conditional rows first, unconditional after) is a fixed run of
cache *slots*: the prompt is left-padded into slots [0, P) (row r's prompt starts at slot start[r]), image
token i lives at slot P + offset(i) (offset(i) = i; with Emu3's line breaks r*(cols+1)+c, the row's
end-of-line token at r*(cols+1)+cols), and the last slot is a trash slot for padding entries. The RoPE
position of slot s is s - start[r], so left padding changes nothing. A query at slot q of row r sees the
keys at slots k with start[r] <= k <= q (a padding query sees only itself). Hence:
  * ragged batches: each row's entries are written into its own slots in one forward;
  * rollback: feeding a sample from an earlier index overwrites its slots from there on; its stale
    entries further right are invisible (they lie after every query) until they are overwritten.
The cache is not a transformers `Cache`: a plain object with the `update(k, v, layer_idx, **kw)` the
attention layers call, index-copying whole Dh-vectors into [R, H_kv, L, Dh] buffers; a ready 4D additive mask passes
transformers' `create_causal_mask` untouched. It grows when a step needs slots past its end (sjd feeds up to
`window` indices past the last image index; their outputs are ignored).

Prompts. `PromptEncoder` is any callable str -> list[int] of text-token ids, without special tokens (the
adapter adds BOS and its image-start tokens). `as_prompt_encoder` accepts a transformers tokenizer (uses
`tokenizer.encode(text, add_special_tokens=False)`) or such a callable; `HashPromptEncoder` hashes words into
a set of ids (for tests: no tokenizer exists offline for the tiny random models).
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Callable, Protocol

import torch

from ssdgen.decoders.protocol import EMPTY, TOO_LONG, Capabilities, PromptError, StepOutput


class PromptEncoder(Protocol):
    def __call__(self, text: str) -> list[int]: ...


class HashPromptEncoder:
    """Each whitespace-separated word -> one id of `ids`, by CRC32 (stable across runs)."""

    def __init__(self, ids: Sequence[int]):
        self.ids = list(ids)

    def __call__(self, text: str) -> list[int]:
        return [self.ids[zlib.crc32(w.encode()) % len(self.ids)] for w in text.split()]


def as_prompt_encoder(obj) -> Callable[[str], list[int]]:
    if hasattr(obj, "encode"):  # a transformers tokenizer (tokenizers are callable too: test `encode` first)
        return lambda text: list(obj.encode(text, add_special_tokens=False))
    if callable(obj):
        return obj
    raise TypeError(f"need a tokenizer or a callable str -> list[int], got {type(obj).__name__}")


def pixel_stats(path: Path | str) -> tuple[float, float]:
    """(mean, std) the checkpoint's image processor normalises pixels with; (0.5, 0.5), i.e. [-1, 1], if unknown."""
    f = Path(path) / "preprocessor_config.json"
    if f.exists():
        d = json.loads(f.read_text())
        mean, std = d.get("image_mean", 0.5), d.get("image_std", 0.5)
        return (mean if isinstance(mean, (int, float)) else sum(mean) / len(mean),
                std if isinstance(std, (int, float)) else sum(std) / len(std))
    return 0.5, 0.5


class SlotCache:
    """Per-layer K/V buffers [R, H, L, Dh]; `slots` [R, S] says where the next forward's entries go, and
    `visible` how many leading slots its queries may attend to (None: all L)."""

    def __init__(self, length: int):
        self.length = length
        self.k: dict[int, torch.Tensor] = {}
        self.v: dict[int, torch.Tensor] = {}
        self.slots: torch.Tensor | None = None
        self.visible: int | None = None

    def grow(self, length: int) -> None:
        """Keep the real slots [0, old - 1) in place; the trash slot moves to the new end."""
        for buf in (self.k, self.v):
            for i, t in buf.items():
                new = t.new_zeros(*t.shape[:2], length, t.shape[-1])
                new[:, :, :self.length - 1] = t[:, :, :self.length - 1]
                buf[i] = new
        self.length = length

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        if layer_idx not in self.k:
            R, H = key_states.shape[:2]
            self.k[layer_idx] = key_states.new_zeros(R, H, self.length, key_states.shape[-1])
            self.v[layer_idx] = value_states.new_zeros(R, H, self.length, value_states.shape[-1])
        # whole Dh-vectors by index copy, as reference/gpt.py's KVCache, where a scatter indexed every element;
        # padding entries share the trash slot L - 1, which no query sees, so which of them lands there is moot
        cache_k, cache_v = self.k[layer_idx], self.v[layer_idx]
        R, H, L, D = cache_k.shape
        first = torch.arange(R * H, device=cache_k.device).view(R, H, 1) * L  # [R, H, 1]: slot 0's row
        rows = (first + self.slots[:, None, :]).flatten()  # [R * H * S] in (r, h, s) order
        cache_k.view(-1, D).index_copy_(0, rows, key_states.reshape(-1, D))
        cache_v.view(-1, D).index_copy_(0, rows, value_states.reshape(-1, D))
        T = self.visible or self.length  # attention runs over these keys only (views, no copy)
        return self.k[layer_idx][:, :, :T], self.v[layer_idx][:, :, :T]


class HFImageAdapter:
    """The protocol over a Hugging Face decoder stack. Subclasses give the prompt layout, the embeddings and the
    head: `_prompt_ids`, `_uncond_ids`, `_embed_ids` (text ids), `embed` (image codes), `_head` (final-normed
    hidden -> image-code logits). `line_break_id` (Emu3): after a token in a row's last column the adapter feeds
    that token too, and returns the outputs at its slot (they predict the next row's first token)."""

    line_break_id: int | None = None
    spare = 16  # image indices allocated past the grid at start (sjd windows overhang); grows on demand
    capabilities = Capabilities()  # no tree attention, no heads of its own, caches sized on demand

    def __init__(self, name: str, lm: torch.nn.Module, norm: torch.nn.Module, grid: tuple[int, int], n_codes: int,
                 hidden_dim: int, encoder, max_positions: int | None = None):
        attn = getattr(lm.config, "_attn_implementation", None)
        if attn not in ("eager", "sdpa"):
            raise ValueError(f"{name}: attn_implementation {attn!r} cannot take the per-sample 4D attention mask "
                             "these adapters need; load the model with attn_implementation='sdpa' or 'eager'")
        self.name, self.grid, self.n_codes, self.hidden_dim = name, tuple(grid), n_codes, hidden_dim
        self.lm, self.norm, self.max_positions = lm, norm, max_positions
        self.encode = as_prompt_encoder(encoder)
        self._pre_norm: torch.Tensor | None = None
        norm.register_forward_hook(self._capture)
        self._cfg, self._batch, self._cache = False, 0, None

    def _capture(self, module, inputs, output):
        self._pre_norm = inputs[0]

    @property
    def device(self) -> torch.device:
        return next(self.lm.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        """The decoder stack's precision (the decoders' probabilities are fp32 whatever it is)."""
        return next(self.lm.parameters()).dtype

    def _offset(self, index: torch.Tensor | int) -> torch.Tensor | int:
        """Image index -> offset of its slot after the prompt (a tensor, or an int for sizes)."""
        if self.line_break_id is None:
            return index
        cols = self.grid[1]
        return index // cols * (cols + 1) + index % cols

    # ---------------------------------------------------------------- protocol

    def validate_prompts(self, prompts: list[str]) -> None:
        """Any non-empty text in any language (the model's own tokenizer reads it) that fits its positions."""
        n = self.grid[0] * self.grid[1]
        image_len = self._offset(n - 1) + 2
        for i, p in enumerate(prompts):
            if not isinstance(p, str) or not p.strip():
                raise PromptError(f"prompt {i}: empty prompt ({p!r})", EMPTY)
            length = len(self._prompt_ids(p))
            if self.max_positions and length + image_len > self.max_positions:
                raise PromptError(f"prompt {i}: {length} prompt tokens + {image_len} image positions exceed the "
                                  f"model's {self.max_positions} positions", TOO_LONG)

    @torch.no_grad()
    def start(self, prompts: list[str], use_cfg: bool) -> StepOutput:
        ids = [self._prompt_ids(p) for p in prompts]
        if use_cfg:
            ids += [self._uncond_ids(p, i) for p, i in zip(prompts, ids)]
        self._cfg, self._batch = use_cfg, len(prompts)
        R, P = len(ids), max(map(len, ids))
        dev = self.device
        tok = torch.tensor([[0] * (P - len(row)) + row for row in ids], dtype=torch.long, device=dev)  # left-padded
        self._P = P
        self._start = torch.tensor([P - len(row) for row in ids], device=dev)
        n = self.grid[0] * self.grid[1]
        self._cache = SlotCache(P + self._offset(n + self.spare) + 2)
        slots = torch.arange(P, device=dev).expand(R, P)
        h, pre = self._forward(self._embed_ids(tok), slots, torch.ones_like(slots, dtype=torch.bool))
        return self._split(self._head(h[:, -1:]), pre[:, -1:])

    @torch.no_grad()
    def step(self, tokens: torch.Tensor, index: torch.Tensor, lengths: torch.Tensor | None = None) -> StepOutput:
        """lengths: accepted and ignored, the padding is computed (the protocol allows it)."""
        dev = self.device
        tokens, index = tokens.to(dev), index.to(dev)
        if self._cfg:
            tokens, index = tokens.repeat(2, 1), index.repeat(2, 1)
        R, S = tokens.shape
        emb = self.embed(tokens, index)
        slots = self._P + self._offset(index)
        if self.line_break_id is None:
            eol = torch.zeros_like(index, dtype=torch.bool)
        else:
            eol = index % self.grid[1] == self.grid[1] - 1
        # every entry is the token, then (if eol) the line break at the next slot; valid entries first
        lb = self._embed_ids(torch.tensor([[self.line_break_id or 0]], device=dev)).expand_as(emb)
        emb2 = torch.stack([emb, lb], 2).flatten(1, 2)
        slot2 = torch.stack([slots, slots + 1], 2).flatten(1, 2)
        valid2 = torch.stack([torch.ones_like(eol), eol], 2).flatten(1, 2)
        width = int(valid2.sum(1).max())
        order = torch.argsort((~valid2).to(torch.int8), dim=1, stable=True)[:, :width]
        h, pre = self._forward(emb2.gather(1, order[..., None].expand(R, width, emb.shape[-1])),
                               slot2.gather(1, order), valid2.gather(1, order))
        # the output of entry s sits where its last element (token, or its line break) landed
        take = (valid2.long().cumsum(1) - 1).gather(1, 2 * torch.arange(S, device=dev) + eol.long())
        h = h.gather(1, take[..., None].expand(R, S, h.shape[-1]))
        pre = pre.gather(1, take[..., None].expand(R, S, pre.shape[-1]))
        return self._split(self._head(h), pre)

    def logits_from_hidden(self, hidden: torch.Tensor) -> torch.Tensor:
        return self._head(self.norm(hidden))

    # ---------------------------------------------------------------- internals

    def _forward(self, embeds: torch.Tensor, slots: torch.Tensor, valid: torch.Tensor):
        """One forward of entries at per-row slots -> (final-normed, pre-norm) hidden states [R, S, D].

        Attention runs over slots [0, T), T = the furthest valid entry's slot + 1 (as reference/gpt.py bounds it
        by the furthest position): later slots lie after every valid query, so they would only be masked. Padding
        entries are written to the trash slot L - 1 >= T; as queries they see [start, T), never an empty row."""
        cache = self._cache
        need = int(slots[valid].max()) + 2 if valid.any() else 2
        if need > cache.length:
            cache.grow(need + self.spare)
        L, T = cache.length, need - 1
        slots = torch.where(valid, slots, L - 1)
        start = self._start[:, None]
        pos = torch.where(valid, slots - start, 0)
        k = torch.arange(T, device=slots.device)
        q = slots[..., None]
        vis = (k <= q) & ((k >= start[..., None]) | (k == q))
        mask = torch.zeros(vis.shape, dtype=embeds.dtype, device=embeds.device)
        mask = mask.masked_fill(~vis, torch.finfo(embeds.dtype).min)[:, None]
        cache.slots, cache.visible = slots, T
        out = self.lm(inputs_embeds=embeds, attention_mask=mask, position_ids=pos, cache=cache, use_cache=True)
        return out.last_hidden_state, self._pre_norm

    def _split(self, logits: torch.Tensor, hidden: torch.Tensor) -> StepOutput:
        B = self._batch
        if self._cfg:
            return StepOutput(logits[:B], logits[B:], hidden[:B], hidden[B:])
        return StepOutput(logits, None, hidden)

    @staticmethod
    def _to_uint8(pixels: torch.Tensor, mean: float, std: float) -> torch.Tensor:
        """[B, 3, H, W] normalised pixels -> uint8 [B, H, W, 3]."""
        x = (pixels.float() * std + mean).clamp(0, 1) * 255
        return x.round().to(torch.uint8).permute(0, 2, 3, 1).cpu()
