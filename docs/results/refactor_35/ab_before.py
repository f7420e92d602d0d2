import sys, time, torch
torch.set_num_threads(2)
from ssdgen.decoders import run
from ssdgen.decoders.spec import DecodeSpec
from ssdgen.reference.model import ReferenceModel
from ssdgen.reference.prompts import eval_prompts
spec = DecodeSpec.parse(sys.argv[1]); m = ReferenceModel()
rows = eval_prompts(32); p = [r["prompt"] for r in rows]; s = [r["seed"] for r in rows]
from ssdgen.decoders import heads_for
h = heads_for(spec, m)
run(spec, m, p[:8], s[:8], h)
for i in range(int(sys.argv[2])):
    t = time.perf_counter(); r = run(spec, m, p, s, h); dt = time.perf_counter() - t
    print(f"before {dt/32:.4f}", flush=True)
