"""The reference model (scenes VQ-VAE + AR transformer) behind the decoders' ImageTokenModel protocol."""

from __future__ import annotations

from pathlib import Path

import torch

from ssdgen.decoders.protocol import Capabilities, StepOutput

from ssdgen.reference import captions as cap
from ssdgen.reference import decode_attention
from ssdgen.reference.gpt import SPARE_POSITIONS
from ssdgen.reference.weights import load_bundle


class ReferenceModel:
    """Wraps a trained bundle. With CFG, the cache holds 2B rows: conditional first, unconditional after."""

    def __init__(self, path: Path | str | None = None, device: str | torch.device = "cpu",
                 dtype: torch.dtype = torch.float32, kv_dtype: torch.dtype | None = None):
        """dtype: the transformer's precision; the VQ decoder stays fp32 (it runs once per image, and pixels
        are what the user keeps). kv_dtype: what the KV cache stores keys and values in (None: dtype); the
        capabilities say which (`reference:kv=bf16`, models/registry.py); its name stays the weights' own (SSD
        heads are trained for weights, not for a cache precision)."""
        bundle = load_bundle(path)
        device = torch.device(device)
        # frozen: decoders and heads train around it
        self._attach(bundle.gpt.to(device, dtype).requires_grad_(False), bundle.vq.to(device).requires_grad_(False),
                     bundle.name, bundle.path, bundle.checksums["gpt.safetensors"], kv_dtype)

    @classmethod
    def from_modules(cls, gpt, vq, name: str = "in-training") -> "ReferenceModel":
        """Wrap modules that are still training (the learning curve samples them); nothing is frozen or copied."""
        self = cls.__new__(cls)
        self._attach(gpt, vq, name, None, None)
        return self

    def _attach(self, gpt, vq, name: str, path: Path | None, digest: str | None,
                kv_dtype: torch.dtype | None = None) -> None:
        self.gpt, self.vq = gpt, vq
        self.device = next(gpt.parameters()).device
        self.dtype = next(gpt.parameters()).dtype  # the transformer's; the decoders' probabilities are fp32
        self.kv_dtype = kv_dtype or self.dtype  # the KV cache's
        self.name, self.path = name, path
        self.weights_digest = digest  # heads trained for these weights only
        self.default_heads = path / "heads" if path else None  # SSD heads: heads.safetensors + heads.json
        g = self.gpt.cfg
        self.grid = (g.grid, g.grid)
        self.n_codes = g.n_image_codes
        self.hidden_dim = g.dim
        self._cfg = False
        self._batch = 0

    def validate_prompts(self, prompts: list[str]) -> None:
        """Only captions the model can draw: every word known (encode) and the caption grammar's sentence (parse);
        anything else would be drawn from a partial or empty caption. Raises CaptionError with its reason."""
        for i, p in enumerate(prompts):
            try:
                cap.encode(p)
                cap.parse(p)
            except cap.CaptionError as e:
                raise cap.CaptionError(f"prompt {i}: {e}", e.reason) from None

    @torch.no_grad()
    def start(self, prompts: list[str], use_cfg: bool) -> StepOutput:
        ids = torch.tensor([cap.encode(p) for p in prompts], device=self.device)  # [B, 36]
        B = len(prompts)
        if use_cfg:
            ids = torch.cat([ids, torch.tensor([cap.null_caption()] * B, device=self.device)])
        self._cfg, self._batch = use_cfg, B
        self.gpt.setup_caches(ids.shape[0], dtype=self.kv_dtype)
        pos = torch.arange(ids.shape[1], device=self.device).expand_as(ids)
        logits, hidden = self.gpt(ids + self.n_codes, pos)
        return self._split(logits[:, -1:], hidden[:, -1:])

    @property
    def capabilities(self) -> Capabilities:
        """Tree attention (step takes tree=, copy_cache moves a branch's keys: decoders/window.py), its own
        heads, its weights' digest, its caches' size and precision, and which attention its steps run: the
        decode-attention op or SDPA (reference/decode_attention.py; decoders/protocol.py)."""
        return Capabilities(tree_attention=True, admit=True,
                            heads=None if self.default_heads is None else str(self.default_heads),
                            weights_digest=self.weights_digest, kv_bytes_per_sample=self.cache_bytes_per_sample,
                            kv_dtype=str(self.kv_dtype).removeprefix("torch."),
                            attention=decode_attention.kind(self.device, self.dtype, self.kv_dtype))

    @torch.no_grad()
    def step(self, tokens: torch.Tensor, index: torch.Tensor, lengths: torch.Tensor | None = None,
             tree: torch.Tensor | None = None) -> StepOutput:
        """tree [B, S, S] (optional): tree attention, gpt.tree_mask (entry s cached at slot index[b, 0] + s)."""
        pos = index + self.gpt.cfg.caption_len
        if self._cfg:
            tokens, pos = tokens.repeat(2, 1), pos.repeat(2, 1)
            lengths = None if lengths is None else lengths.repeat(2)
            tree = None if tree is None else tree.repeat(2, 1, 1)
        logits, hidden = self.gpt(tokens, pos, lengths, tree)
        return self._split(logits, hidden)

    @torch.no_grad()
    def admit(self, rows: torch.Tensor, prompts: list[str], tokens: torch.Tensor, index: torch.Tensor,
              lengths: torch.Tensor | None) -> tuple[StepOutput, StepOutput]:
        """Continuous batching (decoders/protocol.py `admit`, decoders/slots.py): the prompts' captions fed at
        positions 0 .. C - 1 of cache rows `rows` [R], in one ragged forward with the other rows' step (tokens,
        index [B, S], lengths [B]; None: all S). Every row is widened to E = max(S, C) entries; the added padding
        continues the row's positions, so its zero keys land past what the row has fed, masked until the row writes
        there (gpt.Ragged's padding, the same). The caption at its own positions has the prefill's causal mask, and
        the previous sample's keys past it are masked too: nothing in gpt changes.
        -> (the step's output [B, S], the prefills' output for index 0 [R, 1])."""
        C, (B, S) = self.gpt.cfg.caption_len, tokens.shape
        E = max(S, C)
        ids = torch.cat([tokens, tokens.new_zeros(B, E - S)], 1)  # [B, E]
        after = index[:, -1:] + torch.arange(1, E - S + 1, device=self.device)  # [B, E - S]
        pos = torch.cat([index + C, after + C], 1)  # [B, E] sequence positions
        lens = torch.full((B,), S, dtype=torch.long, device=self.device) if lengths is None else lengths.clone()
        lens[rows] = C
        pos[rows] = torch.arange(E, device=self.device)  # the caption, then padding at image indices 0 .. E - C - 1
        ids[rows, :C] = torch.tensor([cap.encode(p) for p in prompts], device=self.device) + self.n_codes
        if self._cfg:
            uncond = ids.clone()
            uncond[rows, :C] = torch.tensor([cap.null_caption()] * len(prompts), device=self.device) + self.n_codes
            ids, pos, lens = torch.cat([ids, uncond]), pos.repeat(2, 1), lens.repeat(2)
        logits, hidden = self.gpt(ids, pos, lens)  # [B or 2B, E, ...]
        step = self._split(logits[:, :S], hidden[:, :S])
        last = slice(C - 1, C)  # the prompt's last position predicts image index 0
        cfg_rows = rows + B  # the unconditional rows of the admitted slots
        pre = StepOutput(logits[rows, last], logits[cfg_rows, last] if self._cfg else None, hidden[rows, last],
                         hidden[cfg_rows, last] if self._cfg else None)
        return step, pre

    @torch.no_grad()
    def copy_cache(self, src: torch.Tensor, dst: torch.Tensor, where: torch.Tensor) -> None:
        """Cached keys and values at image indices src [B, M] copied to dst [B, M] where [B, M] (both branches)."""
        C = self.gpt.cfg.caption_len
        src, dst = src + C, dst + C
        if self._cfg:
            src, dst, where = src.repeat(2, 1), dst.repeat(2, 1), where.repeat(2, 1)
        self.gpt.copy_cache(src, dst, where)

    def cache_bytes_per_sample(self, use_cfg: bool) -> int:
        """What one sample's KV cache takes (gpt.setup_caches' allocation; CFG doubles its rows)."""
        g = self.gpt.cfg
        per_row = g.n_layers * 2 * (g.seq_len + SPARE_POSITIONS) * g.dim * self.kv_dtype.itemsize  # keys and values
        return per_row * (2 if use_cfg else 1)

    def _split(self, logits: torch.Tensor, hidden: torch.Tensor) -> StepOutput:
        B = self._batch
        if self._cfg:
            return StepOutput(logits[:B], logits[B:], hidden[:B], hidden[B:])
        return StepOutput(logits, None, hidden)

    def embed(self, tokens: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        return self.gpt.embed(tokens, index + self.gpt.cfg.caption_len)

    def logits_from_hidden(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.gpt.logits_from_hidden(hidden)

    @torch.no_grad()
    def decode_images(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.vq.decode(tokens.view(-1, *self.grid).to(self.device)).cpu()
