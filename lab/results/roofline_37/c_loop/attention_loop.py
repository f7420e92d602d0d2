"""#37: decode attention alone at the batch-64 plain-AR shapes over six layers' caches (as attention_kernels.py:
128 rows, 8 heads, 165 of 484 slots in use, hd 32, fp32), so that reads come from memory: torch's SDPA (what the
model called before), the C loop (reference/decode_attention.c, what it calls now) and a plain sum over the same
keys and values (the floor); then one layer at batch 1, 4 and 16 (2, 8 and 32 rows), where the cache fits in the
CPU's caches and a call's fixed cost shows. Interleaved, 3 rounds of the best of 10.
    .venv/bin/python -m lab.results.roofline_37.c_loop.attention_loop
"""
import time

import torch
import torch.nn.functional as F

from lab.bench.roofline import _times
from ssdgen.reference import decode_attention as da

torch.set_num_threads(2)
H, T_ALLOC, D, T = 8, 484, 32, 165
assert da.loop() is not None, "no C compiler: the loop is not built"


def best_ms(fn, n=10):
    """The fastest of n calls after one warm-up, in ms (lab/bench/roofline.py's timer)."""
    return 1e3 * min(_times(fn, n))


def case(rows, layers):
    ks = [torch.randn(rows, H, T_ALLOC, D) for _ in range(layers)]
    vs = [torch.randn(rows, H, T_ALLOC, D) for _ in range(layers)]
    q, mask = torch.randn(rows, H, 1, D), torch.ones(rows, 1, 1, T, dtype=torch.bool)
    ref = F.scaled_dot_product_attention(q, ks[0][:, :, :T], vs[0][:, :, :T], attn_mask=mask).transpose(1, 2)
    assert (da.attention(q, ks[0], vs[0], mask) - ref).abs().max() < 1e-5
    return {"SDPA": lambda: [F.scaled_dot_product_attention(q, k[:, :, :T], v[:, :, :T], attn_mask=mask)
                             for k, v in zip(ks, vs)],
            "C loop": lambda: [da.attention(q, k, v, mask) for k, v in zip(ks, vs)],
            "plain sum (floor)": lambda: [(k[:, :, :T].sum(), v[:, :, :T].sum()) for k, v in zip(ks, vs)]}


print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load {open('/proc/loadavg').read().split()[:3]}")
fns = case(128, 6)
gb = 6 * 2 * 128 * H * T * D * 4 / 1e9
for r in range(3):
    print(f"round {r + 1}, batch 64 (128 rows) x 6 layers: " + "; ".join(
        f"{name} {ms:.2f} ms ({gb / ms * 1e3:.1f} GB/s)" for name, ms in ((n, best_ms(f)) for n, f in fns.items())),
        flush=True)
del fns
for rows in (2, 8, 32):
    fns = case(rows, 1)
    for r in range(3):
        print(f"round {r + 1}, {rows} rows x 1 layer: " + "; ".join(
            f"{name} {1e3 * best_ms(f, 200):.0f} us" for name, f in fns.items()), flush=True)
