"""#37 item 2: the keys stored transposed, [B, H, hd, T] (`KVCache(keys_by_slot=True)`, in commit 1fb364b only;
it did not land), so that `q @ k^T` is one GEMV over adjacent slots per (row, head), measured three ways:

1. the attention kernels alone at the batch-64 plain-AR shapes (128 rows with CFG, 8 heads, head size 32, 165
   slots in use of 484), over six layers' caches so that reads come from memory (GB/s counts keys and values);
2. the cache writes alone (one step's keys and values, six layers), by layout;
3. in the model, one `model.step` (lab/bench/roofline.py's setup) with each layout, interleaved, ROUNDS rounds of the
   median of 7 steps per cell, and torch.profiler's ops of a batch-64 step with each layout.

Run on a quiet machine from the repository root of a checkout of 1fb364b (`git worktree add /tmp/kbs 1fb364b`, then
`make install-dev` there), from which this output came:
    .venv/bin/python -m lab.results.roofline_37.keys_by_slot 5
"""
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from lab.bench.roofline import profile, step_time
from ssdgen.models.registry import load_model
from ssdgen.reference.gpt import GPT

B, H, TA, D, T, LAYERS = 128, 8, 484, 32, 165, 6
CELLS = [(1, 1), (16, 1), (64, 1), (128, 1), (64, 4), (64, 8)]


def best_ms(fn, caches, n: int = 10) -> float:
    for c in caches:
        fn(*c)
    times = []
    for _ in range(n):
        t = time.perf_counter()
        for c in caches:
            fn(*c)
        times.append(time.perf_counter() - t)
    return 1e3 * min(times)


def kernels() -> None:
    ks, vs = [torch.randn(B, H, TA, D) for _ in range(LAYERS)], [torch.randn(B, H, TA, D) for _ in range(LAYERS)]
    kts = [torch.randn(B, H, D, TA) for _ in range(LAYERS)]
    q, bias = torch.randn(B, H, 1, D), torch.zeros(B, 1, 1, T)
    gb = LAYERS * 2 * B * H * T * D * 4 / 1e6
    rows = [("SDPA, [B, H, T, hd] keys (what the model calls)",
             lambda k, v: F.scaled_dot_product_attention(q, k[:, :, :T], v[:, :, :T], bias), list(zip(ks, vs))),
            ("two batched matmuls, keys stored [B, H, hd, T]",
             lambda kt, v: torch.matmul((torch.matmul(q, kt[..., :T]) + bias).softmax(-1), v[:, :, :T]),
             list(zip(kts, vs))),
            ("  scores alone, q @ k^T over [B, H, hd, T]", lambda kt, v: torch.matmul(q, kt[..., :T]),
             list(zip(kts, vs))),
            ("  p @ v alone", lambda k, v: torch.matmul(bias.expand(B, H, 1, T), v[:, :, :T]),
             list(zip(ks, vs))),
            ("a sum over the keys and the values (the floor)", lambda k, v: (k[:, :, :T].sum(), v[:, :, :T].sum()),
             list(zip(ks, vs)))]
    print("kernel | ms per step | keys and values read at")
    for name, fn, caches in rows:
        ms = best_ms(fn, caches)
        print(f"{name} | {ms:.2f} | {gb / ms:.1f} GB/s", flush=True)


def writes() -> None:
    pos = torch.randint(100, 200, (B, 1))
    k = torch.randn(B, 1, 3, H, D).permute(2, 0, 3, 1, 4)[1]  # [B, H, 1, hd], strided as the model's
    first = torch.arange(B * H).view(B, H, 1) * TA
    rows = (first + pos[:, None, :]).flatten()
    elems = (first[..., None] * D + torch.arange(D) * TA + pos[:, None, :, None]).flatten()
    plain = [(torch.zeros(B, H, TA, D),) for _ in range(LAYERS)]
    trans = [(torch.zeros(B, H, D, TA),) for _ in range(LAYERS)]
    print("keys' write, one step, six layers (alone: the lines written stay in the CPU's caches) | ms")
    print(f"whole hd-vectors by index_copy_, [B, H, T, hd] | "
          f"{best_ms(lambda c: c.view(-1, D).index_copy_(0, rows, k.reshape(-1, D)), plain):.3f}")
    print(f"elements by index_copy_, [B, H, hd, T] | "
          f"{best_ms(lambda c: c.view(-1).index_copy_(0, elems, k.reshape(-1)), trans):.3f}", flush=True)


def in_model(rounds: int) -> None:
    layout = {"by_slot": None}
    setup = GPT.setup_caches
    GPT.setup_caches = lambda self, batch, max_len=None, dtype=None, keys_by_slot=None: setup(
        self, batch, max_len, dtype, layout["by_slot"])
    model = load_model("reference")
    ms = {(f, c): [] for f in (False, True) for c in CELLS}
    for r in range(rounds):
        for c in CELLS:
            for f in ((False, True) if r % 2 == 0 else (True, False)):  # alternate who goes first
                layout["by_slot"] = f
                ms[f, c].append(1e3 * statistics.median(step_time(model, *c, repeats=7)))
    print("batch x window | [B, H, T, hd] keys, SDPA: ms median (min-max) | [B, H, hd, T] keys, matmuls | x")
    for c in CELLS:
        a, b = ms[False, c], ms[True, c]
        ratio = [x / y for x, y in zip(a, b)]
        print(f"{c[0]} x {c[1]} | {statistics.median(a):.2f} ({min(a):.2f}-{max(a):.2f}) | "
              f"{statistics.median(b):.2f} ({min(b):.2f}-{max(b):.2f}) | "
              f"x{statistics.median(ratio):.2f} ({min(ratio):.2f}-{max(ratio):.2f})", flush=True)
    for f in (False, True):
        layout["by_slot"] = f
        print(f"keys_by_slot={f}: batch 64 x 1, 5 steps")
        print(profile(model, 64, 1, top=8), flush=True)

if __name__ == "__main__":
    torch.set_num_threads(2)
    with open("/proc/loadavg") as f:
        print("load average", f.read().split()[:3], time.strftime("%Y-%m-%dT%H:%M:%S%z"), flush=True)
    kernels()
    writes()
    in_model(int(sys.argv[1]))
