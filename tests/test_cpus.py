"""workers/cpus.py: the CPUs a decoding process may use (affinity, cgroup quota), a thread count the user pins,
threads given up to other processes' load and taken back, and tokens that do not depend on the thread count."""

import pytest
import torch

from ssdgen.decoders import build
from ssdgen.decoders.spec import DecodeSpec
from ssdgen.workers import cpus
from ssdgen.workers.cpus import ThreadGovernor, ThreadPolicy, cgroup_quota, usable_cpus

PROMPTS = ["a large red circle at the center on a flat gray background",
           "a small blue square at the top left on a wavy beige background",
           "a large shaded green triangle at the bottom right on a cloudy slate background",
           "a small dotted yellow diamond at the top middle on a striped brown background"]


@pytest.fixture(autouse=True)
def _threads():
    saved = torch.get_num_threads()
    yield
    torch.set_num_threads(saved)


def test_cgroup_quota_v2_v1_and_unlimited(tmp_path):
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    assert cgroup_quota(tmp_path) == 1.5
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert cgroup_quota(tmp_path) is None
    v1 = tmp_path / "v1"
    (v1 / "cpu").mkdir(parents=True)
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("50000\n")
    (v1 / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert cgroup_quota(v1) == 0.5
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    assert cgroup_quota(v1) is None
    assert cgroup_quota(tmp_path / "missing") is None


def test_usable_cpus_follows_affinity_and_quota(monkeypatch):
    monkeypatch.setattr(cpus, "affinity", lambda: [0, 1, 2, 3])
    monkeypatch.setattr(cpus, "cgroup_quota", lambda: None)
    assert usable_cpus() == 4
    monkeypatch.setattr(cpus, "cgroup_quota", lambda: 1.5)  # a Kubernetes limit of 1.5 CPUs on 4
    assert usable_cpus() == 2
    monkeypatch.setattr(cpus, "cgroup_quota", lambda: 0.2)
    assert usable_cpus() == 1


def test_the_users_thread_count_wins_and_is_fixed(monkeypatch):
    monkeypatch.setattr(cpus, "usable_cpus", lambda: 8)
    assert ThreadPolicy.from_env(None, env={}) == ThreadPolicy(cap=8, adapt=True)
    assert ThreadPolicy.from_env(2, env={}) == ThreadPolicy(cap=2, adapt=True)
    assert ThreadPolicy.from_env(2, env={"OMP_NUM_THREADS": "3"}) == ThreadPolicy(cap=3, adapt=False)
    assert ThreadPolicy.from_env(None, env={"OMP_NUM_THREADS": "", "MKL_NUM_THREADS": "1"}).cap == 1


class _Clock:
    """Fake /proc: the busy seconds other processes add per second, and this process's own."""

    def __init__(self):
        self.t = self.busy = self.own = 0.0

    def advance(self, seconds: float, other_cores: float, own_cores: float) -> None:
        self.t += seconds
        self.busy += (other_cores + own_cores) * seconds
        self.own += own_cores * seconds


def _governed(monkeypatch, cap: int, adapt: bool = True) -> tuple[ThreadGovernor, _Clock]:
    clock = _Clock()
    monkeypatch.setattr(cpus, "usable_cpus", lambda: cap)
    monkeypatch.setattr(cpus.CpuSample, "read", lambda self: (clock.t, clock.busy, 0.0))
    monkeypatch.setattr(cpus, "_own_cpu", lambda proc: clock.own)
    monkeypatch.setattr(cpus.time, "monotonic", lambda: clock.t)
    return ThreadGovernor(ThreadPolicy(cap=cap, adapt=adapt)), clock


def test_a_busy_neighbour_takes_a_thread_and_gives_it_back(monkeypatch):
    gov, clock = _governed(monkeypatch, cap=2)
    assert torch.get_num_threads() == 2
    clock.advance(2.0, other_cores=0.1, own_cores=2.0)  # a quiet machine: a shell, a logger
    gov.tick()
    assert gov.threads == 2
    clock.advance(2.0, other_cores=0.6, own_cores=1.4)  # a `while True` sharing one of our cores
    gov.tick()
    assert gov.threads == 1 and torch.get_num_threads() == 1
    clock.advance(2.0, other_cores=1.0, own_cores=1.0)  # it keeps its core: we keep one thread
    gov.tick()
    assert gov.threads == 1
    clock.advance(2.0, other_cores=0.0, own_cores=1.0)  # gone
    gov.tick()
    assert gov.threads == 2 and torch.get_num_threads() == 2
    rep = gov.report()
    assert rep["reduced_s"] == pytest.approx(4.0) and rep["other_cores_worst"] == pytest.approx(1.0)


def test_a_pinned_count_is_kept_under_load(monkeypatch):
    gov, clock = _governed(monkeypatch, cap=2, adapt=False)
    clock.advance(2.0, other_cores=1.0, own_cores=1.0)
    gov.tick()
    assert gov.threads == 2 and gov.report()["other_cores_mean"] == pytest.approx(1.0)


def test_ticks_wait_for_the_interval(monkeypatch):
    gov, clock = _governed(monkeypatch, cap=2)
    clock.advance(0.2, other_cores=1.0, own_cores=1.0)
    gov.tick()  # a fifth of a second is no measurement
    assert gov.threads == 2 and gov.report()["seconds"] == 0


def test_watching_ticks_every_forward_and_restores_the_model(ref_model, monkeypatch):
    gov = ThreadGovernor(ThreadPolicy(cap=1, adapt=False))
    ticks = []
    monkeypatch.setattr(gov, "tick", lambda: ticks.append(1))
    before = {k: ref_model.__dict__.get(k) for k in ("start", "step")}
    with gov.watching(ref_model):
        build(DecodeSpec.parse("ar"), ref_model).decode(PROMPTS[:1], [0])
    grid = ref_model.grid[0] * ref_model.grid[1]
    assert len(ticks) == grid  # the prefill and every step but the last's (it commits the last token)
    assert {k: ref_model.__dict__.get(k) for k in ("start", "step")} == before


@pytest.mark.parametrize("spec", ["ar", "ssd+csd:calibrated=false"])
def test_tokens_do_not_depend_on_the_thread_count(ref_model, spec):
    """The governor changes threads mid-decode; a sample's tokens come from its seed alone."""
    dec = build(DecodeSpec.parse(spec), ref_model)
    got = {}
    for n in (1, 2):
        torch.set_num_threads(n)
        got[n] = dec.decode(PROMPTS, [11, 12, 13, 14]).tokens
    assert torch.equal(got[1], got[2])


def test_run_load_warns_when_other_processes_took_cpu(monkeypatch):
    """Scripted /proc: 2 s windows in which the machine was busy 3.2 core-seconds and the run 2.0 of them."""
    from ssdgen.workers.cpus import RunLoad
    load = RunLoad(set(), interval=0.01)
    reads = iter([(0.0, 0.0, 0.0), (2.0, 3.2, 0.0), (4.0, 6.4, 0.0)])
    ours = iter([0.0, 2.0, 4.0])

    def read(self):
        try:
            return next(reads)
        except StopIteration:
            load._stop.set()
            return (4.0, 6.4, 0.0)
    monkeypatch.setattr(cpus.CpuSample, "read", read)
    monkeypatch.setattr(load, "_ours", lambda: next(ours, 4.0))
    with load:
        load._thread.join(timeout=5)
    rep = load.report()
    assert rep["other_cores_mean"] == pytest.approx(0.6) and rep["seconds"] == pytest.approx(4.0)
    assert "other processes used 0.60" in rep["warning"]
    quiet = RunLoad(set())
    quiet.wall_s, quiet.other_s = 10.0, 0.5
    assert quiet.report()["warning"] is None


def test_run_load_counts_the_runs_own_processes_as_its_own():
    """A child of the driver (a local Ray's worker) and a listed pid (an actor) are the run's, not others'."""
    import subprocess
    import sys
    import time

    import psutil
    from ssdgen.workers.cpus import RunLoad
    child = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        load = RunLoad(set())
        p = psutil.Process(child.pid)
        c0, o0 = sum(p.cpu_times()[:2]), load._ours()
        time.sleep(1.0)
        c1, o1 = sum(p.cpu_times()[:2]), load._ours()
        assert c1 - c0 > 0.01
        assert o1 - o0 >= c1 - c0 - 0.05
    finally:
        child.kill()
        child.wait()
