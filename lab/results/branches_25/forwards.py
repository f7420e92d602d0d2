"""Forwards per image of decoder specs on the first N eval prompts (seeds 0..N-1), decoded at batch N: a
sample's forwards do not depend on its batch. Usage: python forwards.py N SPEC..."""
import json
import sys
import time

import numpy as np
import torch

from ssdgen.models.registry import load_model
from ssdgen.reference.prompts import eval_prompts
from ssdgen.decoders import decode
from ssdgen.decoders.recipes import SamplingConfig
torch.set_num_threads(2)
m = load_model("reference")
sc = SamplingConfig()
n = int(sys.argv[1])
prompts = [r["prompt"] for r in eval_prompts(n)]
for spec in sys.argv[2:]:
    name, *kv = spec.split(":")
    params = {}
    for x in kv:
        k, v = x.split("=")
        params[k] = json.loads(v)
    t = time.time()
    r = decode(name, m, prompts, list(range(n)), sc, params)
    fw = np.mean([s.forwards for s in r.stats])
    fed = np.mean([s.tokens_fed for s in r.stats])
    print(f"{spec:55s} fwd/img {fw:6.1f} ({256/fw:.2f}x)  fed/img {fed:7.0f}  {time.time()-t:.0f}s", flush=True)
