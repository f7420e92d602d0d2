"""#37: decode attention written as elementwise products and sums and compiled by torch.compile (Inductor, C++
on the CPU, dynamic shapes) against SDPA, at the batch-64 plain-AR shapes over six layers' caches: no faster.

    .venv/bin/python -m lab.results.roofline_37.attention_inductor
"""
import time

import torch
import torch.nn.functional as F
torch.set_num_threads(2)
B, H, T_ALLOC, D, T, LAYERS = 128, 8, 484, 32, 165, 6
KS = [torch.randn(B, H, T_ALLOC, D) for _ in range(LAYERS)]
VS = [torch.randn(B, H, T_ALLOC, D) for _ in range(LAYERS)]
Q = torch.randn(B, H, 1, D)
BIAS = torch.zeros(B, 1, 1, T)

def attn(q, k, v, bias):
    s = (k * q).sum(-1, keepdim=True).transpose(-1, -2) * (q.shape[-1] ** -0.5) + bias  # [B,H,1,T]
    p = s.softmax(-1)
    return (p.transpose(-1, -2) * v).sum(-2, keepdim=True)  # [B,H,1,D]

t0 = time.perf_counter()
cattn = torch.compile(attn, dynamic=True)
ref = F.scaled_dot_product_attention(Q, KS[0][:, :, :T], VS[0][:, :, :T], BIAS)
out = cattn(Q, KS[0][:, :, :T], VS[0][:, :, :T], BIAS)
print("compile s", time.perf_counter() - t0, "maxdiff", (out - ref).abs().max().item(), flush=True)
out = cattn(Q, KS[0][:, :, :T+1], VS[0][:, :, :T+1], torch.zeros(B,1,1,T+1))
print("second shape s", time.perf_counter() - t0, flush=True)

def timed(name, fn, n=10):
    def step():
        for k, v in zip(KS, VS):
            fn(k[:, :, :T], v[:, :, :T])
    step()
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        step()
        ts.append(time.perf_counter() - t)
    best = min(ts)
    gbs = LAYERS * 2 * B * H * T * D * 4 / best / 1e9
    print(f"{name:44s} {best * 1e3:7.2f} ms (med {sorted(ts)[n // 2] * 1e3:.2f})  {gbs:5.1f} GB/s", flush=True)


for _ in range(2):
    timed("SDPA", lambda k, v: F.scaled_dot_product_attention(Q, k, v, BIAS))
    timed("inductor fused", lambda k, v: cattn(Q, k, v, BIAS))
    timed("floor", lambda k, v: (k.sum(), v.sum()))
