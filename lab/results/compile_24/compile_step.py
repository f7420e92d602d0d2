"""torch.compile on the reference model's cached step, CPU: eager against compiled at fixed shapes, timed in
interleaved rounds (median of 10). Usage: python compile_step.py OUT.json"""
import json
import sys
import time

import torch

from ssdgen.reference.model import ReferenceModel


def main(out: str) -> None:
    torch.set_num_threads(2)
    m = ReferenceModel()
    eager = m.gpt.forward
    compiled = torch.compile(m.gpt.forward, dynamic=False)
    res = {}
    for B in (1, 64):
        m.start(["a large red circle at the center"] * B, True)
        for S in (1, 5):
            tok = torch.zeros(2 * B, S, dtype=torch.long)  # CFG rows, mid-image positions
            pos = (36 + 128 + torch.arange(S)).expand(2 * B, S).contiguous()
            with torch.no_grad():
                a = time.perf_counter()
                compiled(tok, pos)  # the first call compiles
                first = time.perf_counter() - a
                err = (eager(tok, pos)[0] - compiled(tok, pos)[0]).abs().max().item()
                te, tc = [], []
                for _ in range(10):
                    for f, acc in ((eager, te), (compiled, tc)):
                        a = time.perf_counter()
                        f(tok, pos)
                        acc.append(time.perf_counter() - a)
            me, mc = sorted(te)[5], sorted(tc)[5]
            res[f"B{B} S{S}"] = {"eager_ms": me * 1e3, "compiled_ms": mc * 1e3, "speedup": me / mc,
                                 "first_call_s": first, "max_abs_logit_diff": err}
            print(f"batch {B} tokens {S}: eager {me * 1e3:.2f} ms, compiled {mc * 1e3:.2f} ms, {me / mc:.2f}x, "
                  f"first call {first:.1f} s, max |dlogit| {err:.1e}", flush=True)
    with open(out, "w") as f:
        json.dump({"what": "torch.compile(gpt.forward, dynamic=False) vs eager, reference model, CFG rows",
                   "torch": torch.__version__, "threads": 2, "rows": res}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
