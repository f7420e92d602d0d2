"""The model protocol (protocol.py) for three Hugging Face architectures: Janus(-Pro), Emu3, Chameleon.

All three keep a slot-indexed KV cache with explicit per-sample positions and 4D masks (hf_common.py), so
batches may be ragged and any sample may roll back to an earlier index while the others move on. Prompts are
plain strings encoded by a `PromptEncoder` (a tokenizer, or any str -> ids callable; see hf_common.py).
Each adapter wraps a built model (`JanusAdapter(model, encoder, ...)`), or loads a local checkpoint
(`JanusAdapter.from_pretrained(path)`, tokenizer from the same directory); `load_model("janus:/path")`.
Checkpoints load from safetensors only: a folder holding only pickled weights (`.bin`, `.pt`) is refused.

Janus: image tokens are the VQ codes [0, num_embeddings); they are embedded by `generation_embeddings` +
  `generation_aligner` and scored by `generation_head`, never the text embeddings / lm_head. Grid
  (num_patches, num_patches). Prompt [BOS] + template(prompt) + [BOI]; CFG as Janus does it: the
  unconditional row is the same sequence with every token but BOS and BOI replaced by PAD.
Emu3: image code c is the vocab entry "<|visual token%06d|>"; logits are the lm_head restricted to those
  n_codes rows. Prompt [BOS] + prompt + <|image start|> + "H*W" + <|image token|>; the unconditional row is
  the same with `negative_prompt` (default empty). The visual grid has an end-of-line token
  "<|extra_200|>" after each row: image index i = (r, c) sits at image offset r*(cols+1)+c and the row's EOL
  at r*(cols+1)+cols. The adapter feeds the EOL itself: whenever a step feeds a token in the last column, the
  same forward also feeds the EOL after it, and the logits/hidden returned for that entry are the EOL's
  (they predict the next row's first token; the model's own prediction at the last column, the forced EOL,
  is never returned). Rolling back over a row end re-feeds its EOL with the token. The grid (H, W in tokens)
  is a constructor argument (default 90 x 90, Emu3-Gen's 720 x 720 pixels); `from_pretrained` takes `grid=`
  or `image_area=` (pixels of a square image), else the checkpoint config's `image_area` (models/registry.py:
  `emu3:/ckpt:grid=32x32`).
Chameleon: image code c is the vocab entry "IMGIMG<c in letters A-J>Z"; logits are lm_head over those rows,
  computed from the model's hidden state, going around forward()'s masking of image tokens to -inf. Prompt
  [BOS] + prompt + <racm3:break>; unconditional row: `negative_prompt` (default empty). Grid defaults to
  32 x 32 (the processor's 1024 image tokens). Chameleon's VQ-VAE has no decoder in transformers, so
  `decode_images` raises NotImplementedError.

`embed(tokens, index)` ignores `index`: all three use RoPE, so the input embedding has no position term.
`hidden` is the decoder stack's output before its final norm (a forward hook on that norm);
`logits_from_hidden` applies that norm and the image head.

Limitations. The per-step attention runs over the cache's slots up to the furthest position in the batch
(prompt + the furthest sample's image offset), masked per row: exact, and no wider than the furthest sample
needs, but a sample far behind its batch-mates still attends (masked) over their width. The custom 4D mask
needs attn_implementation "eager" or "sdpa" (flash-attention is refused at construction).
Checked only on tiny random models (no hub access): the prompt layouts follow the transformers processors'
image-generation prompts (Janus chat template + BOI; Emu3 "<|image start|>H*W<|image token|>"); pass
`template=`, `negative_prompt=` or the token ids to change them. `decode_images` maps the VQ decoder's
output back with the checkpoint's image_mean / image_std (preprocessor_config.json; default [-1, 1]).
"""

from __future__ import annotations

from pathlib import Path

import torch

from .hf_common import HashPromptEncoder, HFImageAdapter, PromptEncoder, as_prompt_encoder, pixel_stats

__all__ = ["JanusAdapter", "Emu3Adapter", "ChameleonAdapter", "load_model", "PromptEncoder", "HashPromptEncoder",
           "as_prompt_encoder"]


PICKLED = (".bin", ".pt", ".pth", ".ckpt", ".pkl")


def check_safetensors(path: Path | str) -> None:
    """Refuse a checkpoint folder without safetensors weights, with one line naming it: pickled weights
    (`.bin`, `.pt`, ...) can run code when loaded, so they are never loaded (as the reference bundle does)."""
    folder = Path(path)
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: no such checkpoint folder")
    names = sorted(f.name for f in folder.iterdir())
    if any(n.endswith(".safetensors") for n in names):
        return
    pickled = [n for n in names if n.endswith(PICKLED)]
    if pickled:
        raise ValueError(f"{folder}: holds only pickled weights ({', '.join(pickled[:3])}); ssdgen loads "
                         "safetensors only (pickle can run code when loaded); convert the checkpoint to "
                         ".safetensors first")
    raise FileNotFoundError(f"{folder}: no .safetensors weights in this checkpoint folder")


def _load(cls, path: Path | str, dtype, device):
    check_safetensors(path)  # before transformers, whose own fallback would unpickle a .bin
    return cls.from_pretrained(str(path), dtype=dtype, attn_implementation="sdpa",
                               use_safetensors=True).to(device).eval()


def _tokenizer(path: Path | str):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(str(path))


def _first(*candidates):
    """The first candidate that is not None; a callable candidate is called only when every earlier one was
    None, so a fallback (a tokenizer lookup) is not evaluated, and cannot fail, once an id is known."""
    for c in candidates:
        v = c() if callable(c) else c
        if v is not None:
            return v
    return None


def _tokenizer_id(tok, attr: str) -> int | None:
    """The id of the tokenizer's special token `attr` (e.g. "boi_token"); None without a tokenizer or that token."""
    token = getattr(tok, attr, None) if tok is not None else None
    return None if token is None else tok.convert_tokens_to_ids(token)


def _lm_rows(head: torch.nn.Linear, ids: list[int]) -> torch.Tensor:
    """The lm_head rows of `ids`: a view when they are contiguous, else a copy (made once)."""
    lo = ids[0]
    if ids == list(range(lo, lo + len(ids))):
        return head.weight[lo:lo + len(ids)]
    return head.weight[torch.tensor(ids, device=head.weight.device)].detach()


class JanusAdapter(HFImageAdapter):
    def __init__(self, model, encoder, *, bos_id: int | None = None, boi_id: int, pad_id: int,
                 template: str = "{prompt}", name: str = "janus", pixel_mean: float = 0.5, pixel_std: float = 0.5):
        self.model = model
        m, tc = model.model, model.config.text_config
        p = m.vqmodel.config.num_patches
        super().__init__(name, m.language_model, m.language_model.norm, (p, p), m.vqmodel.config.num_embeddings,
                         tc.hidden_size, encoder, getattr(tc, "max_position_embeddings", None))
        self.bos_id = tc.bos_token_id if bos_id is None else bos_id
        self.boi_id, self.pad_id, self.template = boi_id, pad_id, template
        self.pixel_mean, self.pixel_std = pixel_mean, pixel_std

    @classmethod
    def from_pretrained(cls, path, encoder=None, dtype=torch.bfloat16, device="cpu", **kw):
        """BOI and PAD ids from the checkpoint's generation config (else the tokenizer), unless given."""
        from transformers import GenerationConfig, JanusForConditionalGeneration
        model = _load(JanusForConditionalGeneration, path, dtype, device)
        tok = _tokenizer(path) if encoder is None else None
        try:
            gc = GenerationConfig.from_pretrained(str(path))
        except OSError:
            gc = None
        gk = getattr(gc, "generation_kwargs", None) or {}
        boi = _first(kw.pop("boi_id", None), gk.get("boi_token_id"), lambda: _tokenizer_id(tok, "boi_token"))
        pad = _first(kw.pop("pad_id", None), getattr(gc, "pad_token_id", None),
                     lambda: getattr(tok, "pad_token_id", None))
        if boi is None or pad is None:
            raise ValueError(f"{path}: no image-start (boi) or pad token id found; pass boi_id= and pad_id=")
        mean, std = pixel_stats(path)
        kw = {"template": "<|User|>: {prompt}\n\n<|Assistant|>:", "name": f"janus:{path}", "pixel_mean": mean,
              "pixel_std": std} | kw
        return cls(model, encoder if encoder is not None else tok, boi_id=boi, pad_id=pad, **kw)

    def _prompt_ids(self, prompt: str) -> list[int]:
        return [self.bos_id] + self.encode(self.template.format(prompt=prompt)) + [self.boi_id]

    def _uncond_ids(self, prompt: str, ids: list[int]) -> list[int]:
        return [t if t in (self.bos_id, self.boi_id) else self.pad_id for t in ids]

    def _embed_ids(self, ids: torch.Tensor) -> torch.Tensor:
        return self.lm.embed_tokens(ids)

    def embed(self, tokens: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        return self.model.prepare_embeddings_for_image_generation(tokens.to(self.device))

    def _head(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.model.model.generation_head(hidden)

    @torch.no_grad()
    def decode_images(self, tokens: torch.Tensor) -> torch.Tensor:
        pixels = self.model.model.vqmodel.decode(tokens.to(self.device).long())
        return self._to_uint8(pixels, self.pixel_mean, self.pixel_std)


class _VocabImageAdapter(HFImageAdapter):
    """Image codes are entries of the text vocabulary (Emu3, Chameleon): embedded by embed_tokens, scored by
    the lm_head rows of those entries."""

    def _setup(self, model, lm, code_ids: list[int], bos_id: int, suffix: list[int], negative_prompt: str):
        self.model, self.bos_id, self._suffix = model, bos_id, suffix
        self.negative_prompt = negative_prompt
        self._codes = torch.tensor(code_ids, device=self.device)
        self._rows = _lm_rows(model.lm_head, code_ids)
        self._embed_table = lm.embed_tokens

    def _prompt_ids(self, prompt: str) -> list[int]:
        return [self.bos_id] + self.encode(prompt) + self._suffix

    def _uncond_ids(self, prompt: str, ids: list[int]) -> list[int]:
        return self._prompt_ids(self.negative_prompt) if self.negative_prompt else \
            [self.bos_id] + self._suffix

    def _embed_ids(self, ids: torch.Tensor) -> torch.Tensor:
        return self._embed_table(ids)

    def embed(self, tokens: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        return self._embed_table(self._codes[tokens.to(self.device)])

    def _head(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(hidden, self._rows)


EMU3_GRID = (90, 90)  # Emu3-Gen's 720 x 720 pixels: what transformers' Emu3Processor prompts for by default


def emu3_grid(path, model, grid: tuple[int, int] | None = None, image_area: int | None = None) -> tuple[int, int]:
    """The token grid of an Emu3 checkpoint: `grid` if given; else a square image of `image_area` pixels (given,
    else the config's `image_area`, as the original Emu3 checkpoints state it) at the VQ's pixels per token,
    rounded as Emu3's processor does (518400 -> 90 x 90 on Emu3-Gen); else EMU3_GRID."""
    if grid is not None:
        return int(grid[0]), int(grid[1])
    area = _first(image_area, getattr(model.config, "image_area", None))
    if area is None:
        return EMU3_GRID
    if isinstance(area, bool) or not isinstance(area, (int, float)) or area <= 0:
        raise ValueError(f"{path}: image_area must be a positive number of pixels, got {area!r}")
    f = model.model.vqmodel.vision_spatial_factor
    side = round(area ** 0.5 / f)
    if side < 1:
        raise ValueError(f"{path}: image_area {area} is under one token ({f} x {f} pixels)")
    return side, side


class Emu3Adapter(_VocabImageAdapter):
    def __init__(self, model, encoder, grid: tuple[int, int] = EMU3_GRID, *, bos_id: int | None = None,
                 negative_prompt: str = "", name: str = "emu3", pixel_mean: float = 0.5, pixel_std: float = 0.5):
        tm, tc, vocab = model.model.text_model, model.config.text_config, model.config.vocabulary_map
        n_codes = model.config.vq_config.codebook_size
        super().__init__(name, tm, tm.norm, grid, n_codes, tc.hidden_size, encoder,
                         getattr(tc, "max_position_embeddings", None))
        img2bpe = model.model.vocabulary_mapping.img2bpe
        missing = [c for c in range(n_codes) if c not in img2bpe]
        if missing:
            raise ValueError(f"vocabulary has no '<|visual token%06d|>' entries for codes {missing[:5]}...")
        self.line_break_id = vocab["<|extra_200|>"]
        suffix = [vocab["<|image start|>"]] + self.encode(f"{grid[0]}*{grid[1]}") + [vocab["<|image token|>"]]
        self._setup(model, tm, [img2bpe[c] for c in range(n_codes)], tc.bos_token_id if bos_id is None else bos_id,
                    suffix, negative_prompt)
        self.pixel_mean, self.pixel_std = pixel_mean, pixel_std

    @classmethod
    def from_pretrained(cls, path, encoder=None, dtype=torch.bfloat16, device="cpu", grid=None, image_area=None,
                        **kw):
        """The grid from `grid`, `image_area` or the checkpoint (`emu3_grid`)."""
        from transformers import Emu3ForConditionalGeneration
        model = _load(Emu3ForConditionalGeneration, path, dtype, device)
        mean, std = pixel_stats(path)
        kw = {"name": f"emu3:{path}", "pixel_mean": mean, "pixel_std": std} | kw
        return cls(model, encoder if encoder is not None else _tokenizer(path),
                   emu3_grid(path, model, grid, image_area), **kw)

    @torch.no_grad()
    def decode_images(self, tokens: torch.Tensor) -> torch.Tensor:
        pixels = self.model.model.vqmodel.decode(tokens.to(self.device).long().view(-1, *self.grid))
        return self._to_uint8(pixels, self.pixel_mean, self.pixel_std)


class ChameleonAdapter(_VocabImageAdapter):
    def __init__(self, model, encoder, grid: tuple[int, int] = (32, 32), *, bos_id: int | None = None,
                 boi_id: int | None = None, negative_prompt: str = "", name: str = "chameleon"):
        cm, cfg = model.model, model.config
        n_codes = cfg.vq_config.num_embeddings
        super().__init__(name, cm, cm.norm, grid, n_codes, cfg.hidden_size, encoder,
                         getattr(cfg, "max_position_embeddings", None))
        img2bpe = cm.vocabulary_mapping.img2bpe
        missing = [c for c in range(n_codes) if c not in img2bpe]
        if missing:
            raise ValueError(f"vocabulary has no 'IMGIMG...Z' entries for codes {missing[:5]}...")
        boi = cfg.vocabulary_map["<racm3:break>"] if boi_id is None else boi_id
        self._setup(model, cm, [img2bpe[c] for c in range(n_codes)], cfg.bos_token_id if bos_id is None else bos_id,
                    [boi], negative_prompt)

    @classmethod
    def from_pretrained(cls, path, encoder=None, dtype=torch.bfloat16, device="cpu", **kw):
        from transformers import ChameleonForConditionalGeneration
        model = _load(ChameleonForConditionalGeneration, path, dtype, device)
        kw = {"name": f"chameleon:{path}"} | kw
        return cls(model, encoder if encoder is not None else _tokenizer(path), **kw)

    def decode_images(self, tokens: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError("Chameleon's VQ-VAE in transformers has an encoder only (no decode): its image "
                                  "tokens cannot be turned into pixels here; keep the tokens, or decode them "
                                  "with an external VQGAN decoder")


ADAPTERS = {"janus": JanusAdapter, "emu3": Emu3Adapter, "chameleon": ChameleonAdapter}


def load_model(spec: str, **kw) -> HFImageAdapter:
    """'janus:/path', 'emu3:/path' or 'chameleon:/path' -> the adapter over that local checkpoint; options as
    keywords (grid=(32, 32)): `models.registry.load_model` parses them from a spec's `:grid=32x32`."""
    kind, sep, path = spec.partition(":")
    if kind not in ADAPTERS:
        raise ValueError(f"unknown model kind {kind!r} in {spec!r}; choose one of: {', '.join(ADAPTERS)} "
                         "(as kind:/path/to/checkpoint)")
    if not sep or not path:
        raise ValueError(f"model spec {spec!r} has no checkpoint path; write {kind}:/path/to/checkpoint")
    return ADAPTERS[kind].from_pretrained(path, **kw)
