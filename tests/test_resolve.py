"""A calibrated spec resolves to a concrete spec whose text alone reproduces the tokens: decoded here by resolve +
run, and again in a fresh Python process from nothing but the recorded text, the model's path, the prompts and
the seeds. The worker records the same text (its `calibrate`), decodes by the text the flow sends, and holds its
heads itself: nothing is left on the model object."""

import json
import subprocess
import sys

import pytest
import torch

from ssdgen.decoders import DecodeSpec, resolve, run
from ssdgen.decoders.cost_curve import CostCurve
from ssdgen.decoders.recipes import SamplingConfig
from tiny import tiny_with_heads

PROMPTS = ["a large red circle at the center on a flat gray background",
           "a small blue square at the top left on a wavy beige background",
           "a small green triangle at the bottom right on a flat slate background"]
SEEDS = [11, 12, 13]
CALIBRATED = DecodeSpec.of("ssd+csd", None, SamplingConfig(cfg_scale=3.0))  # calibrated=true by default

# a fresh process: the recorded text, the model's bundle and the prompts and seeds, nothing else
FRESH = """
import json, sys
from ssdgen.decoders import DecodeSpec, run
from ssdgen.models.registry import load_model
args = json.loads(sys.argv[1])
model = load_model("reference:" + args["model"], device="cpu", dtype="fp32")
res = run(DecodeSpec.parse(args["spec"]), model, args["prompts"], args["seeds"])
print(json.dumps(res.tokens.tolist()))
"""


def _flat_device(monkeypatch) -> None:
    """A device on which every forward costs the same, and a pilot that says the 2-row window (9 tokens on the
    tiny grid) commits the most per forward: that window is the plan."""
    import ssdgen.decoders.planner as planner
    monkeypatch.setattr(planner, "measure_profile", lambda model, prompt, use_cfg, batches, tokens: planner.Profile(
        {b: CostCurve(b, tuple(tokens), (1.0,) * len(tokens)) for b in batches}, 0.0))
    monkeypatch.setattr(planner, "pilot", lambda spec, model, prompts, seeds, heads, run: {
        str(L): (8.0 if L == 9 else 1.0) for L in (3, 4, 5, 6, 8, 9)})


def _fresh(model_path, text: str, prompts: list[str], seeds: list[int]) -> torch.Tensor:
    arg = json.dumps({"model": str(model_path), "spec": text, "prompts": prompts, "seeds": seeds})
    out = subprocess.run([sys.executable, "-c", FRESH, arg], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return torch.tensor(json.loads(out.stdout.strip().splitlines()[-1]))


@pytest.mark.integration  # a subprocess
@pytest.mark.parametrize("device", ["measured", "two rows fastest"])
def test_the_resolved_text_alone_reproduces_a_calibrated_decode_in_a_fresh_process(tmp_path, monkeypatch, device):
    tiny = tiny_with_heads(tmp_path / "t")
    if device != "measured":
        _flat_device(monkeypatch)
    spec, measured = resolve(CALIBRATED, tiny, PROMPTS, SEEDS, 2)
    if device != "measured":
        assert str(spec).startswith("ssd+csd:calibrated=false:rows=2:") and measured.choice == "r2"
    text = json.loads(json.dumps({"spec": str(spec), "measurements": measured.to_dict()}))["spec"]  # as recorded
    here = run(spec, tiny, PROMPTS, SEEDS)
    assert torch.equal(_fresh(tiny.path, text, PROMPTS, SEEDS), here.tokens)
    assert not any(k.startswith("_ssd") for k in tiny.__dict__)


def test_the_worker_calibrates_and_an_actor_built_with_the_plan_decodes_by_it(tmp_path, monkeypatch):
    """A calibration actor records the resolved text; an actor built with that spec decodes by it and reports it
    (the rows' provenance); one built with the request alone refuses a calibrated spec; a plan that chose AR
    is said in the result and in every sample."""
    from ssdgen.output.layout import plan_words
    from ssdgen.output.reader import plan_summary
    from ssdgen.workers.decode_worker import DecodeWorker
    from ssdgen.workers.settings import WorkerSettings
    tiny = tiny_with_heads(tmp_path / "t")
    _flat_device(monkeypatch)
    monkeypatch.setenv("SSDGEN_CACHE", str(tmp_path / "cache"))
    settings = WorkerSettings(model=f"reference:{tiny.path}", decoder=CALIBRATED)
    w = DecodeWorker(settings)
    rows = [{"prompt_id": f"p{i}", "prompt": p, "seed": s, "error": None}
            for i, (p, s) in enumerate(zip(PROMPTS, SEEDS))]
    record = w.calibrate(rows, 2)
    assert set(record) == {"spec", "measurements"} and record["measurements"]["batch"] == 2
    got = DecodeWorker(settings, resolved=DecodeSpec.parse(record["spec"]))(rows)
    want = run(DecodeSpec.parse(record["spec"]), tiny, PROMPTS, SEEDS)
    assert [s.tokens for s in got.samples.values()] == want.tokens.tolist()
    assert got.decoder == record["spec"] and not got.fell_back
    assert not any(k.startswith("_ssd") for k in w.model.__dict__)
    summary = plan_summary(record)
    assert summary["spec"] == record["spec"] and summary["rows"] == 2 and summary["batch"] == 2
    assert summary["objective"] == "throughput" and summary["choice"] == "r2" and not summary["cached"]
    assert plan_words(record).startswith("speculating as ssd+csd:calibrated=false:rows=2: a 2-row window at batch 2")
    assert plan_words(summary) == plan_words(record)
    assert w.calibrate(rows, 2)["measurements"]["cached"]  # planned again: from the cache
    (unresolved,) = w(rows[:1]).samples.values()  # built with the request alone: still calibrated
    assert unresolved.status == "error" and "resolve it first" in unresolved.error
    ar = DecodeWorker(settings, resolved=DecodeSpec("ar", (), CALIBRATED.sampling))(rows[:1])
    (sample,) = ar.samples.values()
    assert ar.fell_back and ar.decoder.startswith("ar:")
    assert sample.stats["ar_fallback"] and sample.stats["forwards"] == 16


def test_the_batch_sizes_a_plan_may_choose_stop_at_the_shard_and_at_what_memory_holds(monkeypatch):
    """batch_choices: planner.BATCHES up to `most` (a shard's rows), and up to what MEMORY_SHARE of the free
    memory holds of the model's cache per sample, split among the actors sharing the machine."""
    from ssdgen.workers import decode_worker as dw

    from ssdgen.decoders.protocol import Capabilities

    class Model:
        device = "cpu"

        def __init__(self, per_sample):
            self.per_sample = per_sample
            self.capabilities = Capabilities(kv_bytes_per_sample=lambda use_cfg: per_sample * (2 if use_cfg else 1))

    monkeypatch.setattr(dw, "free_memory", lambda model: 1000 * 2**20)  # 1000 MiB free
    assert dw.batch_choices(Model(2**20), False, 256) == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    assert dw.batch_choices(Model(2**20), False, 100) == [1, 2, 4, 8, 16, 32, 64]  # a shard of 100 rows
    assert dw.batch_choices(Model(2**20), True, 256) == [1, 2, 4, 8, 16, 32, 64, 128]  # 500 / 2 MiB: 250
    assert dw.batch_choices(Model(2**20), True, 256, sharing=4) == [1, 2, 4, 8, 16, 32]  # 62 each
    assert dw.batch_choices(Model(2**40), True, 256) == [1]  # nothing fits: one at a time
    silent = type("Silent", (), {"capabilities": Capabilities()})()
    assert dw.batch_choices(silent, True, 16) == [1, 2, 4, 8, 16]  # a model that does not say: the shard only


def test_the_reference_models_cache_bytes_are_what_it_allocates(tmp_path):
    tiny = tiny_with_heads(tmp_path / "t")
    tiny.start(PROMPTS[:3], True)
    allocated = sum(b.attn.kv_cache.k.nbytes + b.attn.kv_cache.v.nbytes for b in tiny.gpt.layers)
    assert tiny.cache_bytes_per_sample(True) * 3 == allocated


def test_a_job_smaller_than_a_shard_plans_no_batch_larger_than_its_rows(monkeypatch):
    """#36: an 8-prompt job at the default shard size (256) plans among batch sizes up to 8, never 128 or 256: the
    flow caps what the plan may choose at the job's rows (flows/pipeline.py `_decode_plan`), and the _plan.json it
    records names no larger batch. The actor is a stand-in that chooses as `calibrate` does, by batch_choices."""
    from types import SimpleNamespace

    from ssdgen.decoders.protocol import Capabilities
    from ssdgen.flows import pipeline
    from ssdgen.flows.settings import RunSettings
    from ssdgen.inputs.shards import Shards
    from ssdgen.workers import decode_worker as dw

    silent = SimpleNamespace(capabilities=Capabilities())  # memory bounds nothing: only the cap `most` does
    asked = {}

    def calibrate(rows, batch, objective, most, sharing):
        asked["most"] = most
        choices = dw.batch_choices(silent, True, most, sharing)
        return {"spec": "ar:cfg=3.0:temperature=1.0:top_k=0:top_p=1.0",
                "measurements": {"objective": objective, "why": "the largest batch it may form", "seconds": 0.0,
                                 "batch": max(choices), "choices": choices}}

    written = []
    out = SimpleNamespace(read_plan=lambda: None, write_plan=written.append, path=str, full_url=str)
    # no Ray: the stand-in for the calibration actor answers at once
    monkeypatch.setattr(pipeline, "_calibrate", lambda cfg, rows, most, stop: (
        calibrate(rows, cfg.batch_size, cfg.objective, most, cfg.actors), 0.0))
    monkeypatch.setattr(pipeline, "read_shard", lambda files, shard, seed: [
        SimpleNamespace(prompt_id=str(i), prompt=PROMPTS[0], seed=i, error=None) for i in range(8)])
    monkeypatch.setattr(pipeline, "asdict", vars)
    cfg = RunSettings(prompts=["jobs.parquet"])
    files = [SimpleNamespace(num_rows=8)]
    plan = Shards(files, cfg.shard_size)
    assert (cfg.shard_size, plan.rows, cfg.decoder.calibrated) == (256, 8, True)
    _, batch, _ = pipeline._decode_plan(cfg, files, plan, out, SimpleNamespace(info=lambda line: None), None)
    assert asked["most"] == 8 and batch == 8
    (recorded,) = written
    assert max(recorded["measurements"]["choices"]) == 8 and recorded["measurements"]["batch"] == 8
