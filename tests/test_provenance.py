"""A committed row says what made it: the decoder the actor reports in its results, which must be the run's plan.
A worker that reports another spec (a stale actor, a resolving bug) gets its shard refused, never committed
under the plan's name (#47)."""

from types import SimpleNamespace

import pytest

from ssdgen.flows.commit import ProvenanceError, shard_marker
from ssdgen.workers.results import BatchResult, Sample

PLAN = "ssd+csd:calibrated=false:window=5:cfg=3.0:temperature=1.0:top_k=0:top_p=1.0"
CFG = SimpleNamespace(devices_per_actor=1.0, model="reference", image_format="png", audit=0.0, audit_label="",
                      device_type="cpu")


def _job(*decoders: str) -> SimpleNamespace:
    """A decoded shard of one row per batch, each batch's result reporting one of `decoders`."""
    rows, results = [], []
    for i, name in enumerate(decoders):
        pid = f"p{i}"
        rows.append({"prompt_id": pid, "prompt": "a red circle", "seed": i})
        sample = Sample(pid, "ok", image=b"png", width=4, height=4, tokens=[1, 2], grid=(1, 2), stats={})
        results.append(BatchResult({pid: sample}, name, False, busy_s=0.1))
    return SimpleNamespace(shard=SimpleNamespace(id=3), results=results, rows=rows, kept=None, alloc_s=1.0,
                           busy_s=0.2, load_s=0.5, started_at="t", where={}, batches=[[r] for r in rows])


def test_rows_and_marker_record_the_decoder_the_results_report():
    marker, images, stats, _ = shard_marker(_job(PLAN, PLAN), CFG, PLAN, planning_s=2.0)
    assert marker["decoder"] == PLAN
    assert set(images.column("decoder").to_pylist()) == set(stats.column("decoder").to_pylist()) == {PLAN}
    assert marker["load_s"] == 2.5  # the calibration actor's seconds are charged with the model load


def test_a_worker_reporting_another_spec_is_refused():
    other = "sjd:cfg=3.0:temperature=1.0:top_k=0:top_p=1.0"
    with pytest.raises(ProvenanceError, match="shard 3: decoded by sjd:.*but the run's plan is ssd\\+csd"):
        shard_marker(_job(PLAN, other), CFG, PLAN)
