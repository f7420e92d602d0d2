"""#37: a fused decode-attention loop compiled at run time (torch.utils.cpp_extension.load_inline, -O3
-march=native) against SDPA, at the batch-64 plain-AR shapes over six layers' caches (as attention_kernels.py):
one pass per (row, head) over its keys (scores, max), then exp, then one pass over its values. Reads the cache at
15.6 GB/s where SDPA reads at 12.4 and a plain sum at 22.9; not landed (docs/benchmarks.md says why).

    .venv/bin/python -m lab.results.roofline_37.attention_compiled
"""
import time

import torch
import torch.nn.functional as F
from torch.utils.cpp_extension import load_inline
torch.set_num_threads(2)
src = r'''
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <cmath>
#include <vector>
// q [B,H,D], k/v [B,H,Talloc,D] (last dim contiguous), lens: attend t < T. -> out [B,H,D]
torch::Tensor decode_attn(torch::Tensor q, torch::Tensor k, torch::Tensor v, int64_t T) {
  auto B = q.size(0), H = q.size(1), D = q.size(2);
  auto out = torch::empty_like(q);
  const float* qp = q.data_ptr<float>(); const float* kp = k.data_ptr<float>(); const float* vp = v.data_ptr<float>();
  float* op = out.data_ptr<float>();
  auto ks0 = k.stride(0), ks1 = k.stride(1), ks2 = k.stride(2);
  auto vs0 = v.stride(0), vs1 = v.stride(1), vs2 = v.stride(2);
  float scale = 1.0f / std::sqrt((float)D);
  at::parallel_for(0, B * H, 1, [&](int64_t s, int64_t e) {
    std::vector<float> sc(T);
    for (int64_t i = s; i < e; ++i) {
      int64_t b = i / H, h = i % H;
      const float* qi = qp + (b * H + h) * D;
      const float* kb = kp + b * ks0 + h * ks1;
      float m = -INFINITY;
      for (int64_t t = 0; t < T; ++t) {
        const float* kt = kb + t * ks2; float acc = 0.f;
        #pragma omp simd reduction(+:acc)
        for (int64_t d = 0; d < D; ++d) acc += qi[d] * kt[d];
        acc *= scale; sc[t] = acc; m = acc > m ? acc : m;
      }
      float z = 0.f;
      for (int64_t t = 0; t < T; ++t) { sc[t] = std::exp(sc[t] - m); z += sc[t]; }
      float* o = op + (b * H + h) * D;
      float accv[64] = {0};
      const float* vb = vp + b * vs0 + h * vs1;
      for (int64_t t = 0; t < T; ++t) {
        const float* vt = vb + t * vs2; float p = sc[t];
        #pragma omp simd
        for (int64_t d = 0; d < D; ++d) accv[d] += p * vt[d];
      }
      for (int64_t d = 0; d < D; ++d) o[d] = accv[d] / z;
    }
  });
  return out;
}
'''
t0 = time.perf_counter()
mod = load_inline("decattn", cpp_sources=src, functions=["decode_attn"],
                  extra_cflags=["-O3", "-march=native", "-fopenmp"], verbose=False)
print("build s", time.perf_counter() - t0, flush=True)
B, H, T_ALLOC, D, T, LAYERS = 128, 8, 484, 32, 165, 6
KS = [torch.randn(B, H, T_ALLOC, D) for _ in range(LAYERS)]
VS = [torch.randn(B, H, T_ALLOC, D) for _ in range(LAYERS)]
Q = torch.randn(B, H, 1, D)
BIAS = torch.zeros(B, 1, 1, T)
ref = F.scaled_dot_product_attention(Q, KS[0][:, :, :T], VS[0][:, :, :T], BIAS)
out = mod.decode_attn(Q[:, :, 0].contiguous(), KS[0], VS[0], T)
print("maxdiff", (out - ref[:, :, 0]).abs().max().item())


def timed(name, fn, n=10):
    def step():
        for k, v in zip(KS, VS):
            fn(k, v)
    step()
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        step()
        ts.append(time.perf_counter() - t)
    best = min(ts)
    gbs = LAYERS * 2 * B * H * T * D * 4 / best / 1e9
    print(f"{name:30s} {best * 1e3:7.2f} ms (med {sorted(ts)[n // 2] * 1e3:.2f})  {gbs:5.1f} GB/s", flush=True)
q2 = Q[:, :, 0].contiguous()
for _ in range(2):
    timed("SDPA", lambda k, v: F.scaled_dot_product_attention(Q, k[:, :, :T], v[:, :, :T], BIAS))
    timed("cpp", lambda k, v: mod.decode_attn(q2, k, v, T))
    timed("floor", lambda k, v: (k[:, :, :T].sum(), v[:, :, :T].sum()))
