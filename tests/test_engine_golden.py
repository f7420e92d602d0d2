"""Golden tokens: the decoder engine's refactors keep behaviour bit-identical. Every decoder variant decodes
a fixed batch on the tiny model with heads; a SHA-256 of its tokens and every statistic but wall time must
equal what the engine gave before the drafter/tally refactor (tests/data/engine_golden.json, recorded from
that commit by running this module's `record`). A change that alters sampling on purpose re-records it
and says so in its commit."""

import hashlib
import json
from pathlib import Path

import torch

GOLDEN = Path(__file__).parent / "data" / "engine_golden.json"
# The csd and ssd+csd defaults changed after recording (decoders/configs.py); the old ones are spelled out
OLD_CSD = {"lam": 2.0, "delta": 0.9, "coupled": False}
OLD_SSD_CSD = {"lam": 2.0, "delta": 0.9, "commit": "block", "adaptive": True, "max_rows": 4}
RUNS = [("ar", {}), ("sjd", {"window": 6}), ("sjd", {"window": 6, "coupled": True, "init": "repeat-above"}),
        ("sjd", {"window": 4, "init": "repeat-left"}), ("csd", OLD_CSD | {"window": 6}),
        ("csd", {"window": 6, "entropy_norm": "vocab", "lam": 1.0, "delta": 0.5, "coupled": False}),
        ("ssd", {"rows": 2, "rounds": 1}), ("ssd", {"lossless": True, "rows": 2}),
        ("ssd", {"commit": "prefix", "rows": 1}), ("ssd", {"rows": 2, "rounds": 2, "two_d": False}),
        ("ssd+csd", OLD_SSD_CSD | {"calibrated": False}),
        ("ssd+csd", OLD_SSD_CSD | {"calibrated": False, "token_budget": 8}),
        ("ssd+csd", {"commit": "prefix", "adaptive": False, "calibrated": False, "rows": 2, "lam": 1.0,
                     "delta": 0.3})]


def _digest(res) -> str:
    stats = [(s.forwards, s.tokens_per_forward_hist, s.commit_map.tolist(), repr(s.mean_entropy),
              repr(s.acceptance_rate), s.relaxed, repr(sorted(s.extra.items()))) for s in res.stats]
    return hashlib.sha256(json.dumps([res.tokens.cpu().tolist(), stats]).encode()).hexdigest()


def record(model) -> dict:
    from decoders import decode
    from decoders.sampling import SamplingConfig
    from test_decoders import PROMPTS
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one summation order, whatever the machine's core count
    try:
        out = {}
        for sc_name, sc in (("cfg3", SamplingConfig(cfg_scale=3.0)),
                            ("filtered", SamplingConfig(cfg_scale=2.0, temperature=0.9, top_k=5, top_p=0.9))):
            for name, params in RUNS:
                out[f"{sc_name} {name} {json.dumps(params, sort_keys=True)}"] = _digest(
                    decode(name, model, PROMPTS * 2, list(range(5, 13)), sc, params))
        return out
    finally:
        torch.set_num_threads(threads)


def test_every_decoder_decodes_as_before_the_refactor(tmp_path):
    from tiny import tiny_with_heads
    got = record(tiny_with_heads(tmp_path / "t"))
    want = json.loads(GOLDEN.read_text())
    assert got.keys() == want.keys()
    assert [k for k in got if got[k] != want[k]] == []
