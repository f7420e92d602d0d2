"""#37: one reference-model step (CFG, image token 128) under four attention/cache-write variants, interleaved
cell by cell, 3 rounds, each the median of 7 steps. Variants are patched onto reference/gpt.py's classes:

  before      reference/gpt.py before #37 (commit BEFORE): element-wise scatter_ cache writes, SDPA with the
              boolean mask
  index_copy  index_copy_ writes (reference/gpt.py as committed), SDPA with the boolean mask
  bmm         index_copy_ writes, attention as two batched matmuls over rows x heads with an additive mask
  bmm_bf16kv  as bmm, keys and values stored in bf16 (fp32 scores and softmax)

Run on a quiet machine from the repository root:
    .venv/bin/python -m lab.results.roofline_37.attention_variants 1x1,16x1,64x1,128x1,64x4,64x8 3
"""
import math
import statistics
import sys
import time

import torch

from ssdgen.models.registry import load_model
from ssdgen.reference import gpt as G

BEFORE = "e8a275e"  # the commit before #37's step changes
COMMITTED = (G.KVCache.update, G.Attention.forward, G.GPT.hidden)
COMMITTED_UPDATE = G.KVCache.update
VARIANTS = ["before", "index_copy", "bmm", "bmm_bf16kv"]


def _before():
    """reference/gpt.py as it was before #37 (commit BEFORE), as a module of its own: its GPT.hidden,
    Attention.forward and KVCache.update are patched onto the committed classes for the `before` variant."""
    import subprocess
    import types
    mod = types.ModuleType("gpt_before")
    sys.modules[mod.__name__] = mod  # dataclasses look their module up
    exec(subprocess.check_output(["git", "show", f"{BEFORE}:reference/gpt.py"], text=True), mod.__dict__)
    return mod


def cast_update(self, slots, k, v):
    return COMMITTED_UPDATE(self, slots, k.to(self.k.dtype), v.to(self.v.dtype))


def bmm_forward(self, x, cos, sin, slots=None, mask=None, ragged=None):
    qkv = self.wqkv(x)
    if ragged is not None:
        qkv = ragged.unpack(qkv)
    B, S, _ = qkv.shape
    q, k, v = qkv.view(B, S, 3, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4)
    q, k = G.apply_rope(q, cos, sin), G.apply_rope(k, cos, sin)
    k, v = self.kv_cache.update(slots, k, v)
    T = mask.shape[-1]
    bias = torch.zeros(mask.shape, dtype=q.dtype).masked_fill_(~mask, -math.inf)
    q = q * (1.0 / math.sqrt(self.head_dim))
    s = torch.matmul(q.to(k.dtype), k[:, :, :T].transpose(-1, -2)).float() + bias
    y = torch.matmul(s.softmax(-1).to(v.dtype), v[:, :, :T]).float()
    y = y.transpose(1, 2).reshape(B, S, -1)
    return self.wo(y if ragged is None else ragged.pack(y))


def use(variant: str, before):
    if variant == "before":
        G.KVCache.update, G.Attention.forward, G.GPT.hidden = (before.KVCache.update, before.Attention.forward,
                                                               before.GPT.hidden)
        return
    G.KVCache.update, G.Attention.forward, G.GPT.hidden = COMMITTED
    if variant.startswith("bmm"):
        G.Attention.forward = bmm_forward
    if variant == "bmm_bf16kv":
        G.KVCache.update = cast_update


@torch.no_grad()
def step_ms(model, variant: str, before, batch: int, window: int, reps: int = 7) -> float:
    use(variant, before)
    model._cfg, model._batch = True, batch
    model.gpt.setup_caches(2 * batch)
    if variant == "bmm_bf16kv":
        for blk in model.gpt.layers:
            blk.attn.kv_cache.k, blk.attn.kv_cache.v = blk.attn.kv_cache.k.bfloat16(), blk.attn.kv_cache.v.bfloat16()
    tokens = torch.randint(0, model.n_codes, (batch, window))
    index = (128 + torch.arange(window)).expand(batch, window)
    model.step(tokens, index)
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        model.step(tokens, index)
        ts.append(time.perf_counter() - t)
    model.gpt.clear_caches()
    return 1e3 * statistics.median(ts)


def main():
    torch.set_num_threads(2)
    cells = [tuple(int(x) for x in c.split("x")) for c in sys.argv[1].split(",")]
    rounds = int(sys.argv[2])
    model = load_model(None, device="cpu", dtype="fp32")
    before = _before()
    res = {(v, c): [] for v in VARIANTS for c in cells}
    for r in range(rounds):
        for c in cells:
            order = VARIANTS[r % len(VARIANTS):] + VARIANTS[:r % len(VARIANTS)]  # a variant further on each round
            for v in order:
                res[(v, c)].append(step_ms(model, v, before, *c))
    print("batch | window | " + " | ".join(f"{v} ms median (min-max), vs before" for v in VARIANTS))
    for c in cells:
        base = res[("before", c)]
        cols = []
        for v in VARIANTS:
            x = res[(v, c)]
            ratio = statistics.median(b / y for b, y in zip(base, x))
            cols.append(f"{statistics.median(x):.2f} ({min(x):.2f}-{max(x):.2f}), x{ratio:.2f}")
        print(f"{c[0]} | {c[1]} | " + " | ".join(cols), flush=True)
    print("load average", open("/proc/loadavg").read().split()[:3], time.strftime("%Y-%m-%dT%H:%M:%S%z"))


if __name__ == "__main__":
    main()
