"""The reference text-to-image AR model: a LlamaGen-style decoder-only transformer.

Sequence layout: [caption tokens (36, right-padded) | image tokens (256, raster order)]. Ids 0..1023 are
image codes; caption words follow at 1024 + word id. The output head covers image codes only: the
logits at sequence position t predict the image token at position t + 1, so the last caption position
predicts the first image token and no begin-of-image token is needed.

Blocks are pre-norm: RMSNorm, attention with rotary position embeddings (RoPE) over the sequence
position, SwiGLU MLP. A learned 2D position embedding on image tokens tells each token its row and column.

Inference uses a pre-allocated, position-indexed KV cache (gpt-fast style): `forward(idx, input_pos)`
writes keys and values at each sample's own absolute positions and attends to cache slots <= the
query's position. Rolling one sample back therefore means only feeding it from an earlier position
next time; stale slots beyond it are masked by causality and overwritten. Other samples are untouched.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from . import decode_attention


@dataclass(frozen=True)
class GPTConfig:
    n_image_codes: int = 1024
    n_caption_words: int = 64
    caption_len: int = 36
    grid: int = 16  # image tokens per side
    dim: int = 256
    n_layers: int = 6
    n_heads: int = 8
    mlp_hidden: int = 688
    rope_base: float = 10000.0
    norm_eps: float = 1e-5
    cfg_dropout: float = 0.1  # probability of training with the null caption

    @property
    def n_image_tokens(self) -> int:
        return self.grid * self.grid

    @property
    def seq_len(self) -> int:
        return self.caption_len + self.n_image_tokens

    @property
    def vocab_size(self) -> int:
        return self.n_image_codes + self.n_caption_words

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "GPTConfig":
        return cls(**d)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


# Cache slots past the sequence's end: speculative windows near the last token write their unused tail
# there, so no decoder needs a special case for the image's end. Nothing valid ever attends to them.
SPARE_POSITIONS = 192


def rope_tables(cfg: GPTConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of shape [seq_len + SPARE_POSITIONS, head_dim // 2]."""
    hd = cfg.dim // cfg.n_heads
    freqs = 1.0 / (cfg.rope_base ** (torch.arange(0, hd, 2).float() / hd))
    ang = torch.outer(torch.arange(cfg.seq_len + SPARE_POSITIONS).float(), freqs)
    return ang.cos(), ang.sin()


def rotation(cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """cos, sin [..., hd/2] -> cos + i sin, complex64 (complex128 for a float64 model; complex bf16 does not exist,
    so a bf16 or fp16 model rotates in fp32), computed once per forward for every layer."""
    if cos.dtype != torch.float64:
        cos, sin = cos.float(), sin.float()
    return torch.complex(cos, sin)


def apply_rope(x: torch.Tensor, rot: torch.Tensor) -> torch.Tensor:
    """x [..., hd] as hd/2 (even, odd) pairs; rot [..., hd/2] from `rotation`, broadcastable -> each pair rotated.

    One complex multiply, (x1 + i x2)(cos + i sin), for queries and keys at once: the real form, x1 cos - x2 sin
    and x1 sin + x2 cos stacked, was ten small ops per tensor, ~1.6 ms of a batch-64 step on the CPU."""
    z = torch.view_as_complex(x.to(rot.real.dtype).unflatten(-1, (-1, 2)))
    return torch.view_as_real(z * rot).flatten(-2).to(x.dtype)


class KVCache(nn.Module):
    """Per-layer pre-allocated keys/values [B, H, T, hd], written at absolute positions per sample."""

    def __init__(self, batch: int, n_heads: int, max_len: int, head_dim: int, dtype=torch.float32, device=None):
        super().__init__()
        shape = (batch, n_heads, max_len, head_dim)
        self.register_buffer("k", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("v", torch.zeros(shape, dtype=dtype, device=device), persistent=False)

    def slots(self, input_pos: torch.Tensor) -> torch.Tensor | slice:
        """input_pos [B, S] -> the rows [B * H * S] of the cache viewed as [B * H * T, hd] that `update` writes,
        in (b, h, s) order; computed once per step, for every layer (their caches have one shape).

        On the CPU, when every row writes the same S adjacent slots (a plain-AR batch, all rows at one image
        token, or windows that start together), the slice of those slots instead: a strided copy writes them in
        about a third of the index copy's time once the step's attention has pushed the cache lines out (2.4 ms of a
        batch-64 step; docs/benchmarks.md, "The step at the roofline"). On an accelerator the check would wait
        for the device every step, so it always indexes."""
        B, H, T, _ = self.k.shape
        if input_pos.device.type == "cpu":
            start = input_pos[0, 0]
            if bool((input_pos == start + torch.arange(input_pos.shape[1], device=input_pos.device)).all()):
                return slice(int(start), int(start) + input_pos.shape[1])
        first = torch.arange(B * H, device=input_pos.device).view(B, H, 1) * T  # [B, H, 1]: slot 0's row
        return (first + input_pos[:, None, :]).flatten()

    def update(self, slots: torch.Tensor | slice, k: torch.Tensor, v: torch.Tensor):
        """slots from `slots`; k, v [B, H, S, hd] -> full caches [B, H, T, hd].

        A (row, head, position)'s key is one contiguous hd-vector of the cache: whole vectors are index-copied,
        where a scatter indexed every element (docs/benchmarks.md, "The step at the roofline")."""
        if isinstance(slots, slice):  # copy_ casts to a cache in another precision than the model's
            self.k[:, :, slots].copy_(k)
            self.v[:, :, slots].copy_(v)
            return self.k, self.v
        D, dt = k.shape[-1], self.k.dtype  # a cache in another precision than the model's stores its own
        self.k.view(-1, D).index_copy_(0, slots, k.reshape(-1, D).to(dt))
        self.v.view(-1, D).index_copy_(0, slots, v.reshape(-1, D).to(dt))
        return self.k, self.v


class Ragged:
    """A packed ragged batch: the first lengths[b] of row b's S slots, flattened to [T, ...] (T = sum of lengths),
    so the projections, the MLP and the head run on real tokens only. Attention runs per sample over its own
    cache row, padded to S queries: the block-diagonal causal mask of a packed batch, without materialising
    its off-diagonal blocks (each sample's keys are its own cache row)."""

    def __init__(self, lengths: torch.Tensor, S: int):
        self.B, self.S = len(lengths), S
        slot = torch.arange(S, device=lengths.device)
        self.sel = (slot[None, :] < lengths[:, None]).flatten().nonzero().squeeze(1)  # [T] flat indices into B*S

    def pack(self, x: torch.Tensor) -> torch.Tensor:
        """[B, S, ...] -> [T, ...]."""
        return x.flatten(0, 1).index_select(0, self.sel)

    def unpack(self, x: torch.Tensor) -> torch.Tensor:
        """[T, ...] -> [B, S, ...], zeros at the padding."""
        out = x.new_zeros(self.B * self.S, *x.shape[1:])
        return out.index_copy_(0, self.sel, x).view(self.B, self.S, *x.shape[1:])


def tree_mask(pos: torch.Tensor, tree: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Tree attention over a window: pos [B, S] the entries' positions, tree [B, S, S] bool (entry s sees entry
    s'; itself included). Entry s is cached at slot pos[b, 0] + s, so entries that share a position (a tree's
    branches) keep their own keys; it sees every slot before pos[b, 0] (the committed prefix) and the slots of
    the entries tree[b, s] marks. -> (cache slots [B, S], attention mask [B, 1, S, T])."""
    B, S = pos.shape
    root = pos[:, :1]  # [B, 1]
    slots = root + torch.arange(S, device=pos.device)  # [B, S]
    T = int(root.max()) + S
    rel = torch.arange(T, device=pos.device)[None, :] - root  # [B, T] slot relative to the window's first
    inside = (rel >= 0) & (rel < S)
    seen = tree.gather(2, rel.clamp(0, S - 1)[:, None, :].expand(B, S, T)) & inside[:, None, :]  # [B, S, T]
    return slots, ((rel < 0)[:, None, :] | seen).unsqueeze(1)


class Attention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.n_heads, self.head_dim = cfg.n_heads, cfg.dim // cfg.n_heads
        self.wqkv = nn.Linear(cfg.dim, 3 * cfg.dim, bias=False)
        self.wo = nn.Linear(cfg.dim, cfg.dim, bias=False)
        self.kv_cache: KVCache | None = None

    def forward(self, x, rot, slots=None, mask=None, ragged: Ragged | None = None):
        """x [B, S, dim], or [T, dim] packed by `ragged`; the output has x's layout. rot: the positions'
        `rotation`, [S, 1, 1, hd/2] or [B, S, 1, 1, hd/2]. slots: the cache rows KVCache.slots gives for the
        step's positions (cached passes)."""
        qkv = self.wqkv(x)
        if ragged is not None:  # padding's q, k, v are zeros: its keys land on slots that no real query reads
            qkv = ragged.unpack(qkv)
        B, S, _ = qkv.shape
        qkv = qkv.view(B, S, 3, self.n_heads, self.head_dim)
        q, k = apply_rope(qkv[:, :, :2], rot).permute(2, 0, 3, 1, 4)  # 2x [B,H,S,hd]
        v = qkv[:, :, 2].transpose(1, 2)  # [B,H,S,hd]
        if self.kv_cache is None:  # training / full recompute: plain causal attention
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2)
        else:
            k, v = self.kv_cache.update(slots, k, v)
            # [B, S, H, hd]: every cached step of 1 to 16 queries on the CPU (plain AR, windows, packed, trees)
            y = decode_attention.attention(q, k, v, mask)
            if y is None:  # a GPU, a prefill (more than 16 queries), no op built: SDPA
                T = mask.shape[-1]  # attend only up to the furthest position in use, not the whole cache
                # a cache in another precision (reference:kv=bf16): attention runs in it, as a GPU's kernel would
                y = F.scaled_dot_product_attention(q.to(k.dtype), k[:, :, :T], v[:, :, :T], attn_mask=mask)
                y = y.to(x.dtype).transpose(1, 2)
        y = y.reshape(B, S, -1)
        return self.wo(y if ragged is None else ragged.pack(y))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.attn_norm, self.attn = RMSNorm(cfg.dim, cfg.norm_eps), Attention(cfg)
        self.mlp_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.w13 = nn.Linear(cfg.dim, 2 * cfg.mlp_hidden, bias=False)  # gate and up, fused
        self.w2 = nn.Linear(cfg.mlp_hidden, cfg.dim, bias=False)

    def forward(self, x, rot, slots=None, mask=None, ragged: Ragged | None = None):
        x = x + self.attn(self.attn_norm(x), rot, slots, mask, ragged)
        gate, up = self.w13(self.mlp_norm(x)).chunk(2, dim=-1)
        return x + self.w2(F.silu(gate) * up)


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.img_pos = nn.Parameter(torch.zeros(cfg.n_image_tokens, cfg.dim))  # learned 2D (row, col) position
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.head = nn.Linear(cfg.dim, cfg.n_image_codes, bias=False)
        cos, sin = rope_tables(cfg)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.apply(self._init)
        for blk in self.layers:  # scaled init of residual projections (GPT-2)
            nn.init.normal_(blk.attn.wo.weight, std=0.02 / (2 * cfg.n_layers) ** 0.5)
            nn.init.normal_(blk.w2.weight, std=0.02 / (2 * cfg.n_layers) ** 0.5)

    @staticmethod
    def _init(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)

    # ------------------------------------------------------------------ embeddings and head
    def embed(self, idx: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Token ids [B, S] at sequence positions [B, S] -> input embeddings [B, S, dim]."""
        x = self.tok_emb(idx)
        img = pos - self.cfg.caption_len  # image-token index, negative on caption positions
        is_img = (img >= 0).unsqueeze(-1)
        # spare slots reuse the last; F.embedding, not indexing: its CPU backward sums in a fixed order, which
        # a bit-identical resume needs
        img_pos = F.embedding(img.clamp(0, self.cfg.n_image_tokens - 1), self.img_pos)
        return x + torch.where(is_img, img_pos, torch.zeros_like(x))

    def logits_from_hidden(self, h: torch.Tensor) -> torch.Tensor:
        """The model's own final norm + head: pre-norm hidden [..., dim] -> image-code logits [..., 1024]."""
        return self.head(self.norm(h))

    # ------------------------------------------------------------------ forward
    def hidden(self, idx: torch.Tensor, input_pos: torch.Tensor | None = None,
               ragged: Ragged | None = None, tree: torch.Tensor | None = None) -> torch.Tensor:
        """Last hidden state before the final norm, [B, S, dim] ([T, dim] packed, with lengths).

        Without input_pos: a full causal pass from position 0 (training). With input_pos [B, S]: a cached
        pass at those absolute positions (caches must be set up). ragged (cached passes only): which entries
        are real tokens; the padding is never computed. tree [B, S, S] (cached passes only): tree attention
        (`tree_mask`)."""
        B, S = idx.shape
        cache_pos = input_pos
        if input_pos is None:
            pos = torch.arange(S, device=idx.device).expand(B, S)
            rot, mask = rotation(self.rope_cos[:S], self.rope_sin[:S])[:, None, None], None  # [S, 1, 1, hd/2]
        else:
            pos = input_pos
            rot = rotation(self.rope_cos[pos], self.rope_sin[pos])[:, :, None, None]  # [B, S, 1, 1, hd/2]
            if tree is None:
                T = int(pos.max()) + 1  # slots past every query's position are masked anyway
                mask = (torch.arange(T, device=idx.device)[None, None, :] <= pos[:, :, None]).unsqueeze(1)
            else:
                cache_pos, mask = tree_mask(pos, tree)
        x = self.embed(idx, pos)
        if ragged is not None:
            x = ragged.pack(x)  # [T, dim]
        slots = None if cache_pos is None else self.layers[0].attn.kv_cache.slots(cache_pos)
        for blk in self.layers:
            x = blk(x, rot, slots, mask, ragged)
        return x

    def forward(self, idx: torch.Tensor, input_pos: torch.Tensor | None = None,
                lengths: torch.Tensor | None = None,
                tree: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (logits [B, S, 1024], pre-norm hidden [B, S, dim]); with lengths, zeros at the padding."""
        if lengths is None:
            h = self.hidden(idx, input_pos, tree=tree)
            return self.logits_from_hidden(h), h
        ragged = Ragged(lengths, idx.shape[1])
        h = self.hidden(idx, input_pos, ragged, tree)  # [T, dim]
        return ragged.unpack(self.logits_from_hidden(h)), ragged.unpack(h)

    def copy_cache(self, src: torch.Tensor, dst: torch.Tensor, where: torch.Tensor) -> None:
        """Keys and values of cache slots src [B, M] copied to slots dst [B, M] of the same row, where [B, M]:
        a tree branch's accepted entries, cached at scratch slots, moved to their own positions."""
        rows, cols = where.nonzero(as_tuple=True)
        s, d = src[rows, cols], dst[rows, cols]  # [P] each
        for blk in self.layers:
            kv = blk.attn.kv_cache
            kv.k[rows, :, d], kv.v[rows, :, d] = kv.k[rows, :, s], kv.v[rows, :, s]

    # ------------------------------------------------------------------ caches
    def setup_caches(self, batch: int, max_len: int | None = None, dtype: torch.dtype | None = None) -> None:
        """dtype: the caches' (None: the weights'); attention then runs in it (Attention.forward)."""
        max_len = max_len or self.cfg.seq_len + SPARE_POSITIONS
        p = next(self.parameters())
        for blk in self.layers:
            blk.attn.kv_cache = KVCache(batch, self.cfg.n_heads, max_len, self.cfg.dim // self.cfg.n_heads,
                                        dtype or p.dtype, p.device)

    def clear_caches(self) -> None:
        for blk in self.layers:
            blk.attn.kv_cache = None

    def training_loss(self, captions: torch.Tensor, codes: torch.Tensor,
                      weights: torch.Tensor | None = None) -> torch.Tensor:
        """captions [B, 36], codes [B, 256] -> cross-entropy over image tokens, weighted by weights [B, 256]
        (e.g. up on object tokens) as sum(w * ce) / sum(w). The head runs on image positions only."""
        C = self.cfg.caption_len
        idx = torch.cat([captions + self.cfg.n_image_codes, codes], dim=1)  # [B, 292]
        h = self.hidden(idx[:, :-1])[:, C - 1:]  # [B, 256, dim]: the positions that predict image tokens
        ce = F.cross_entropy(self.logits_from_hidden(h).flatten(0, 1), codes.reshape(-1), reduction="none")
        if weights is None:
            return ce.mean()
        w = weights.reshape(-1).to(ce.dtype)
        return (w * ce).sum() / w.sum()
