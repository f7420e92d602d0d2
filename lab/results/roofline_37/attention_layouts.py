"""#37: does the cache's layout let a kernel read it faster? SDPA (as the model calls it), two batched matmuls and
a plain sum (the floor) at the bundled model's batch-64 plain-AR shapes (128 rows, 8 heads, head size 32, 165 of
484 slots in use), over six layers' caches, with keys and values laid out
  separate       [B, H, T, hd] each (the model's),
  interleaved    one [B, H, T, 2 hd] (a slot's key then its value),
  slot-major kv  one [B, T, H, 2 hd],
  slot-major     [B, T, H, hd] each,
  kv adjacent    one [B, H, 2, T, hd] (a (row, head)'s keys, then its values);
3 rounds of the best of 7 steps, the layouts interleaved. GB/s counts the keys and values in use (260 MB).

    .venv/bin/python -m lab.results.roofline_37.attention_layouts
"""
import time

import torch
import torch.nn.functional as F

torch.set_num_threads(2)
B, H, TA, D, T, L = 128, 8, 484, 32, 165, 6
Q = torch.randn(B, H, 1, D)
BIAS = torch.zeros(B, 1, 1, T)
GB = L * 2 * B * H * T * D * 4 / 1e9


def caches(*shape):
    return [torch.randn(*shape) for _ in range(L)]


SEP_K, SEP_V = caches(B, H, TA, D), caches(B, H, TA, D)
INTER = caches(B, H, TA, 2 * D)
SLOT_KV = caches(B, TA, H, 2 * D)
SLOT_K, SLOT_V = caches(B, TA, H, D), caches(B, TA, H, D)
ADJ = caches(B, H, 2, TA, D)
LAYOUTS = {  # name -> each layer's (keys, values) in use, as [B, H, T, hd] views
    "separate": lambda: [(k[:, :, :T], v[:, :, :T]) for k, v in zip(SEP_K, SEP_V)],
    "interleaved": lambda: [(c[:, :, :T, :D], c[:, :, :T, D:]) for c in INTER],
    "slot-major kv": lambda: [(c[:, :T, :, :D].transpose(1, 2), c[:, :T, :, D:].transpose(1, 2)) for c in SLOT_KV],
    "slot-major": lambda: [(k[:, :T].transpose(1, 2), v[:, :T].transpose(1, 2)) for k, v in zip(SLOT_K, SLOT_V)],
    "kv adjacent": lambda: [(c[:, :, 0, :T], c[:, :, 1, :T]) for c in ADJ],
}
KERNELS = {
    "sdpa mask": lambda k, v: F.scaled_dot_product_attention(Q, k, v, BIAS),
    "bmm": lambda k, v: torch.matmul((torch.matmul(Q, k.transpose(-1, -2)) + BIAS).softmax(-1), v),
    "sum": lambda k, v: (k.sum(), v.sum()),
}


def once(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main() -> None:
    times: dict[tuple[str, str], list[float]] = {}
    for _ in range(3):
        for layout, views in LAYOUTS.items():
            kv = views()
            for name, fn in KERNELS.items():
                def step(kv=kv, fn=fn):
                    for k, v in kv:
                        fn(k, v)
                step()
                times.setdefault((layout, name), []).append(min(once(step) for _ in range(7)))
    print("layout | kernel | ms per step, rounds 1-3 | best's read")
    for (layout, name), ts in times.items():
        print(f"{layout} | {name} | " + " ".join(f"{t * 1e3:.2f}" for t in ts) + f" | {GB / min(ts):.1f} GB/s")


if __name__ == "__main__":
    main()
