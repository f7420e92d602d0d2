"""Golden tokens: the decoder engine's refactors keep behaviour identical. Every decoder variant decodes a fixed
batch on the tiny model with heads; its tokens and integer statistics must hash to, and its float statistics
must lie within a tolerance of, what tests/data/engine_golden.json holds. A change that alters sampling on
purpose re-records it (`python tests/test_engine_golden.py`) and says so in its commit.

What is compared is what must not depend on the machine (the suite runs on CPUs with and without
AVX-512/AMX, whose fp32 kernels sum in different orders and round differently in their last bits):
- The tiny transformer runs in float64. Its logits are then rounded to the fp32 the decoders always sample
  in (sampling.py), so a last-bit kernel difference in the forward (~1e-16) almost never survives into the
  probabilities, and a sampled token or an accept/reject would flip only if its uniform fell within ~1e-7 of
  a boundary. The heads stay fp32, as in production: their drafts only feed such decisions.
- Hashed exactly (SHA-256): the tokens and the integer statistics (forwards, tokens_per_forward_hist,
  commit_map, relaxed, and the extras that are not floats: block sizes, rounds, settings, policy).
- Compared with a relative tolerance REL_TOL, stored as plain numbers per sample: mean_entropy (an fp32 sum
  of exp/log terms, whose last bits are the kernels'), acceptance_rate (null where nothing was drafted) and
  any float extra. The original golden hashed their repr(), so every variant, plain `ar` included, failed on
  another CPU of the same kind.

History: recorded in fp32 from the commit before the drafter/tally refactor, and again when the counter-based
RNG changed the sampled streams by design (07e1b8b); re-recorded in float64 for the reasons above, after
checking that the float64 model decodes every variant to the same tokens and integer statistics as the fp32
model, which still matched the fp32 digests (its floats agree within 7e-7 relative).
"""

import hashlib
import json
import math
import sys
from pathlib import Path

import pytest
import torch

GOLDEN = Path(__file__).parent / "data" / "engine_golden.json"
# mean_entropy is accumulated in fp32 (unit roundoff 6e-8) over 16 tokens of ~10 exp/log/sum steps each: a few
# 1e-7 apart across kernels at worst. 1e-5 leaves a wide margin, while anything that changes what is summed (a
# token, a distribution, the entropy floor on a real probability) moves it far more. abs: exact zeros.
REL_TOL, ABS_TOL = 1e-5, 1e-9
# The csd and ssd+csd defaults changed after recording (decoders/recipes.py); the old ones are spelled out
OLD_CSD = {"lam": 2.0, "delta": 0.9, "coupled": False}
OLD_SSD_CSD = {"lam": 2.0, "delta": 0.9, "commit": "block", "adaptive": True, "max_rows": 4}
# ssd's default commit changed after recording, from the block decoder to the prefix engine: a recorded run that
# names no commit (nor lossless) decodes with the old default, commit=block, under its recorded key
OLD_SSD = {"commit": "block"}
# settings the window loop's statistics record since the recording, at the values every recorded run decoded
# with: fixed windows; the packed model step computes the same real tokens as the padded one did
NEW_EXTRAS = {"window_sizes": "fixed", "packed": True}
RUNS = [("ar", {}), ("sjd", {"window": 6}), ("sjd", {"window": 6, "coupled": True, "init": "repeat-above"}),
        ("sjd", {"window": 4, "init": "repeat-left"}), ("csd", OLD_CSD | {"window": 6}),
        ("csd", {"window": 6, "entropy_norm": "vocab", "lam": 1.0, "delta": 0.5, "coupled": False}),
        ("ssd", {"rows": 2, "rounds": 1}), ("ssd", {"lossless": True, "rows": 2}),
        ("ssd", {"commit": "prefix", "rows": 1}), ("ssd", {"rows": 2, "rounds": 2, "two_d": False}),
        ("ssd+csd", OLD_SSD_CSD | {"calibrated": False}),
        ("ssd+csd", OLD_SSD_CSD | {"calibrated": False, "token_budget": 8}),
        ("ssd+csd", {"commit": "prefix", "adaptive": False, "calibrated": False, "rows": 2, "lam": 1.0,
                     "delta": 0.3})]


def _sampling_configs():
    from ssdgen.decoders.recipes import SamplingConfig
    return (("cfg3", SamplingConfig(cfg_scale=3.0)),
            ("filtered", SamplingConfig(cfg_scale=2.0, temperature=0.9, top_k=5, top_p=0.9)))


def _summary(res, ssd: bool) -> dict:
    """{"digest": SHA-256 of the tokens and integer statistics, "floats": [{name: value} per sample]}. The golden
    file was recorded when an SSD sample's per-block lists sat in `extra` ([] outside the block decoder); they are
    SampleStats fields now, and are put back where the digest had them."""
    exact, floats = [], []
    for s in res.stats:
        blocks = {"block_sizes": s.block_sizes or [], "rounds_per_block": s.rounds_per_block or []} if ssd else {}
        extra = sorted((k, v) for k, v in (s.extra | blocks).items() if NEW_EXTRAS.get(k, ()) != v)
        exact.append([s.forwards, s.tokens_per_forward_hist, s.commit_map.tolist(), s.relaxed,
                      [(k, v) for k, v in extra if not isinstance(v, float)]])
        rate = None if math.isnan(s.acceptance_rate) else s.acceptance_rate  # JSON has no NaN
        floats.append({"mean_entropy": s.mean_entropy, "acceptance_rate": rate}
                      | {f"extra.{k}": v for k, v in extra if isinstance(v, float)})
    digest = hashlib.sha256(json.dumps([res.tokens.cpu().tolist(), exact]).encode()).hexdigest()
    return {"digest": digest, "floats": floats}


def record(model, runs=RUNS) -> dict:
    """{"<sampling> <decoder> <params>": _summary} for every run under both sampling configs."""
    from ssdgen.decoders import decode
    from test_decoders import PROMPTS
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one summation order, whatever the machine's core count
    try:
        return {f"{sc_name} {name} {json.dumps(params, sort_keys=True)}":
                _summary(decode(name, model, PROMPTS * 2, list(range(5, 13)), sc, _as_recorded(name, params)),
                         ssd=name.startswith("ssd"))
                for sc_name, sc in _sampling_configs() for name, params in runs}
    finally:
        torch.set_num_threads(threads)


def _as_recorded(name: str, params: dict) -> dict:
    """The parameters that decode a recorded run as it was recorded (OLD_SSD)."""
    return OLD_SSD | params if name == "ssd" and not {"commit", "lossless"} & set(params) else params


def _close(got, want) -> bool:
    if got is None or want is None:
        return got is want
    return math.isclose(got, want, rel_tol=REL_TOL, abs_tol=ABS_TOL)


def mismatches(got: dict, want: dict) -> list[str]:
    """One line per run of `want` whose tokens / integer statistics differ or whose floats are out of tolerance."""
    bad = []
    for key, w in want.items():
        g = got.get(key)
        if g is None or g["digest"] != w["digest"]:
            bad.append(f"{key}: {'not run' if g is None else 'tokens or integer statistics differ'}")
            continue
        for i, (gs, ws) in enumerate(zip(g["floats"], w["floats"], strict=True)):
            if gs.keys() != ws.keys() or not all(_close(gs[k], ws[k]) for k in ws):
                bad.append(f"{key} sample {i}: {gs} vs golden {ws}")
    return bad


def save(golden: dict, path: Path = GOLDEN) -> None:
    """One run per line, floats as their repr (exact round trip)."""
    lines = [f" {json.dumps(k)}: {json.dumps(v)}" for k, v in golden.items()]
    path.write_text("{\n" + ",\n".join(lines) + "\n}\n")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from tiny import tiny_with_heads
    return tiny_with_heads(tmp_path_factory.mktemp("tiny") / "t", dtype=torch.float64)


def test_every_decoder_decodes_as_recorded(model):
    got, want = record(model), json.loads(GOLDEN.read_text())
    assert got.keys() == want.keys()
    assert mismatches(got, want) == []


def test_the_comparison_notices_a_changed_decoder_or_statistic(model):
    want = json.loads(GOLDEN.read_text())
    key = 'cfg3 sjd {"window": 6}'
    # the same key decoded with another window: tokens or forwards move, so the digest must
    got = record(model, [("sjd", {"window": 5})])['cfg3 sjd {"window": 5}']
    assert mismatches({key: got}, {key: want[key]}) != []
    # floats: a last-bits difference passes, a real one (1e-4 relative) does not
    floats = want[key]["floats"]
    nudged = [{k: v if v is None else v * (1 + 1e-7) for k, v in s.items()} for s in floats]
    moved = [s | {"mean_entropy": s["mean_entropy"] * (1 + 1e-4)} for s in floats]
    assert mismatches({key: want[key] | {"floats": nudged}}, {key: want[key]}) == []
    assert len(mismatches({key: want[key] | {"floats": moved}}, {key: want[key]})) == len(floats)


if __name__ == "__main__":  # re-record: python tests/test_engine_golden.py
    import tempfile
    sys.path.insert(0, str(Path(__file__).parent))
    from tiny import tiny_with_heads
    with tempfile.TemporaryDirectory() as d:
        save(record(tiny_with_heads(Path(d) / "t", dtype=torch.float64)))
    print(f"wrote {GOLDEN}")
