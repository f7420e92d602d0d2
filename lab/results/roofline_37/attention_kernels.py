"""#37: attention kernels alone at the bundled model's batch-64 plain-AR shapes (128 rows with CFG, 8 heads, head
size 32, image token 128: 165 slots in use of 484), over six layers' caches so that the reads come from memory,
not from the CPU's caches as one layer's would. GB/s counts the keys and values in use (260 MB per step).

    .venv/bin/python -m lab.results.roofline_37.attention_kernels
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


def timed(name: str, fn, n: int = 10) -> None:
    def step():
        for k, v in zip(KS, VS):
            fn(k[:, :, :T], v[:, :, :T])
    step()
    best = min(_once(step) for _ in range(n))
    print(f"{name:44s} {best * 1e3:7.2f} ms per step  {LAYERS * 2 * B * H * T * D * 4 / best / 1e9:5.1f} GB/s",
          flush=True)


def _once(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def block_diagonal(k, v):
    """[B, T, H*D] layout: one GEMM per row against a block-diagonal query (8x the FLOPs, one call per row)."""
    k, v = k.permute(0, 2, 1, 3).reshape(B, T, H * D), v.permute(0, 2, 1, 3).reshape(B, T, H * D)
    qb = (Q[:, :, 0, :, None] * torch.eye(H)[None, :, None, :]).reshape(B, H * D, H)
    p = torch.bmm(k, qb).softmax(1)  # [B, T, H]
    return torch.bmm(p.transpose(1, 2), v).view(B, H, H, D).diagonal(dim1=1, dim2=2)


timed("SDPA, additive mask (what the model calls)", lambda k, v: F.scaled_dot_product_attention(Q, k, v, BIAS))
timed("SDPA, no mask", lambda k, v: F.scaled_dot_product_attention(Q, k, v))
timed("two batched matmuls, q @ k^T then p @ v",
      lambda k, v: torch.matmul((torch.matmul(Q, k.transpose(-1, -2)) + BIAS).softmax(-1), v))
timed("two batched matmuls, k @ q^T orientation",
      lambda k, v: torch.matmul((torch.matmul(k, Q.transpose(-1, -2)) + BIAS.transpose(-1, -2))
                                .softmax(-2).transpose(-1, -2), v))
timed("scores alone, q @ k^T (reads the keys only)", lambda k, v: torch.matmul(Q, k.transpose(-1, -2)))
timed("a sum over the keys and the values (the floor)", lambda k, v: (k.sum(), v.sum()))
# the [B, T, H*D] layout is timed with its own permuted copy: the copy's cost is left out
KS = [k[:, :, :T].permute(0, 2, 1, 3).contiguous().permute(0, 2, 1, 3) for k in KS]
VS = [v[:, :, :T].permute(0, 2, 1, 3).contiguous().permute(0, 2, 1, 3) for v in VS]
timed("block-diagonal GEMM per row, [B, T, H*D] cache", block_diagonal)
