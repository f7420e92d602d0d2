"""torch.compile on the reference model's step, CPU: eager vs compiled at fixed shapes (interleaved medians)."""
import time, torch, json, sys
from ssdgen.reference.model import ReferenceModel
torch.set_num_threads(2)
m = ReferenceModel()
eager = m.gpt.forward
t0 = time.perf_counter()
compiled = torch.compile(m.gpt.forward, dynamic=False)
res = {}
for B in (1, 64):
    m.start(["a large red circle at the center"] * B, True)
    for S in (1, 5):
        tok = torch.zeros(2 * B, S, dtype=torch.long); pos = (36 + 128 + torch.arange(S)).expand(2 * B, S).contiguous()
        with torch.no_grad():
            a = time.perf_counter(); compiled(tok, pos); ct = time.perf_counter() - a  # compile
            ref, _ = eager(tok, pos); got, _ = compiled(tok, pos)
            err = (ref - got).abs().max().item()
            te, tc = [], []
            for r in range(10):
                for f, acc in ((eager, te), (compiled, tc)):
                    a = time.perf_counter(); f(tok, pos); acc.append(time.perf_counter() - a)
        me, mc = sorted(te)[5], sorted(tc)[5]
        res[f"B{B} S{S}"] = {"eager_ms": me * 1e3, "compiled_ms": mc * 1e3, "speedup": me / mc, "first_call_s": ct, "max_abs_logit_diff": err}
        print(f"batch {B} tokens {S}: eager {me*1e3:.2f} ms, compiled {mc*1e3:.2f} ms, {me/mc:.2f}x, first call {ct:.1f} s, max |dlogit| {err:.1e}", flush=True)
json.dump({"what": "torch.compile(gpt.forward, dynamic=False) vs eager, reference model, CFG rows, mid-image", "torch": torch.__version__, "threads": 2, "rows": res}, open(sys.argv[1], "w"), indent=1)
