"""The CPUs a decoding process may really use, and how many of them other processes leave it (#49).

torch starts one intra-op thread per core it sees, and its OpenMP threads spin at every barrier. On a shared
machine one busy neighbour on one of two cores made a 2-thread decode 12-20x slower: every parallel region waits
for the thread whose core the neighbour holds. Measured on this project's 2-core machine (docs/benchmarks.md,
"A busy core"), v2 AR images/s at batch 1 / 8:

    2 threads, quiet 1.2 / 4.2; beside `while True` 0.045 / 0.20
    1 thread,  quiet 1.1 / 2.8; beside `while True` 1.0 / 2.7
    2 threads, OMP_WAIT_POLICY=PASSIVE, quiet 0.45 / 2.1 (sleeping at every barrier costs more than it saves)
    the bench under this governor beside `while True`: 0.80 / 2.23, 69% / 57% of its quiet speed

So the pool keeps its spin-wait (quiet speed is not given away) and the thread count follows what is free:

  - `usable_cpus()`: the process's affinity mask, capped by its cgroup's CPU quota (Kubernetes limits, CI
    runners), which torch's default ignores;
  - `ThreadGovernor`: between forwards, at most once per `interval` seconds, it measures the busy time other
    processes took on this process's CPUs, and the hypervisor's steal, and sets torch's threads to the cores left:
    a thread is given up for each other process's core (from a quarter of one on), never below 1, never above
    the cap. The user's OMP_NUM_THREADS / MKL_NUM_THREADS pin the count (`ThreadPolicy.from_env`).

The thread count decides no token: a sample's draws come from its seed, and matmuls on this model's shapes give
the same tokens with 1 or 2 threads (tests/test_cpus.py); floats may differ in their last bits, as they do
between machines (docs/deployment.md, "Shared CPUs").
"""

from __future__ import annotations

import math
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psutil

PIN_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
GIVE_UP_FROM = 0.25  # other processes' cores from which a thread is given up (a neighbour's share stalls barriers)


def cgroup_quota(root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """The CPU quota of this process's cgroup in cores (v2 `cpu.max`, v1 `cpu.cfs_quota_us`), None if unlimited
    or unknown."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        return None if quota <= 0 or period <= 0 else quota / period
    except (OSError, ValueError):
        return None


def affinity() -> list[int]:
    """The CPUs this process may run on."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return list(range(os.cpu_count() or 1))


def usable_cpus() -> int:
    """CPUs this process may really use: its affinity mask, capped by its cgroup's quota (rounded up: a quota
    of 1.5 CPUs runs 2 threads, each throttled part of the time)."""
    n = len(affinity())
    quota = cgroup_quota()
    return max(1, min(n, math.ceil(quota))) if quota else max(1, n)


@dataclass(frozen=True)
class ThreadPolicy:
    """How many torch threads a decoding process runs. cap: the most; adapt: give threads up to other
    processes' load (off where the user pinned the count)."""
    cap: int
    adapt: bool = True

    @classmethod
    def from_env(cls, requested: int | None = None, env: dict | None = None) -> "ThreadPolicy":
        """requested: the run's threads per actor (its --cpus-per-actor), None for one process with the machine.
        A thread count the user set in the environment wins and is kept fixed. Read where the user's
        environment is (the CLI, the driver): Ray sets OMP_NUM_THREADS in its workers itself."""
        env = os.environ if env is None else env
        for var in PIN_VARS:
            value = env.get(var, "").strip()
            if value.isdigit() and int(value) > 0:
                return cls(cap=int(value), adapt=False)
        return cls(cap=max(1, requested) if requested else usable_cpus())


class CpuSample:
    """Busy and steal time on a set of CPUs, from /proc/stat through psutil."""

    def __init__(self, cpus: list[int]):
        self.cpus = cpus

    def read(self) -> tuple[float, float, float]:
        """(monotonic seconds, busy CPU seconds, stolen CPU seconds) summed over the CPUs."""
        per = psutil.cpu_times(percpu=True)
        busy = steal = 0.0
        for i in self.cpus:
            if i < len(per):
                t = per[i]
                s = getattr(t, "steal", 0.0)
                busy += sum(t) - t.idle - getattr(t, "iowait", 0.0) - s
                steal += s
        return time.monotonic(), busy, steal


def _own_cpu(p: psutil.Process) -> float:
    c = p.cpu_times()
    return c.user + c.system


class ThreadGovernor:
    """Sets torch's threads to the cores other processes leave this one (module docstring). `tick()` between
    forwards (cheap: a clock read until `interval` has passed); `watching(model)` calls it before each of the
    model's forwards; `report()` says what it saw."""

    def __init__(self, policy: ThreadPolicy, interval: float = 1.0):
        import torch
        self.policy, self.interval = policy, interval
        self.cap = policy.cap if not policy.adapt else min(policy.cap, usable_cpus())
        self.threads = self.cap
        torch.set_num_threads(self.cap)
        self.proc, self.sample = psutil.Process(), CpuSample(affinity())
        self.other_s = self.steal_s = self.wall_s = self.reduced_s = 0.0
        self.worst = 0.0  # the most cores other processes took over one interval
        self._mark()

    def _mark(self) -> None:
        self._t, self._busy, self._steal = self.sample.read()
        self._own = _own_cpu(self.proc)

    def tick(self) -> None:
        if time.monotonic() - self._t >= self.interval:
            self.update()

    def update(self) -> None:
        """Measure the last window and set the threads for the next."""
        t, busy, steal = self.sample.read()
        own = _own_cpu(self.proc)
        wall = t - self._t
        if wall <= 0:
            return
        other = max(0.0, (busy - self._busy) - (own - self._own)) / wall
        stolen = max(0.0, steal - self._steal) / wall
        self.other_s += other * wall
        self.steal_s += stolen * wall
        self.wall_s += wall
        self.worst = max(self.worst, other + stolen)
        if self.threads < self.cap:
            self.reduced_s += wall
        self._t, self._busy, self._steal, self._own = t, busy, steal, own
        if self.policy.adapt:
            taken = math.ceil(max(0.0, other + stolen - GIVE_UP_FROM))
            self._set(max(1, self.cap - taken))

    def _set(self, n: int) -> None:
        if n != self.threads:
            import torch
            torch.set_num_threads(n)
            self.threads = n

    @contextmanager
    def watching(self, model):
        """The model's forwards (`start`, `step`) each tick the governor first, while inside; restored after. The
        window restarts on entry: the time between batches (waiting, encoding) is not measured."""
        saved = {k: model.__dict__[k] for k in ("start", "step") if k in model.__dict__}
        start, step = model.start, model.step

        def ticked_start(*a, **kw):
            self.tick()
            return start(*a, **kw)

        def ticked_step(*a, **kw):
            self.tick()
            return step(*a, **kw)

        model.start, model.step = ticked_start, ticked_step
        self._mark()
        try:
            yield self
        finally:
            for k in ("start", "step"):
                if k in saved:
                    setattr(model, k, saved[k])
                else:
                    model.__dict__.pop(k, None)

    def report(self) -> dict:
        """What the governor saw over its watched time: other processes' cores (mean and worst interval), the
        share stolen, the seconds run with fewer threads than the cap."""
        w = max(self.wall_s, 1e-9)
        return {"cap": self.cap, "adapt": self.policy.adapt, "threads_now": self.threads,
                "seconds": self.wall_s, "other_cores_mean": self.other_s / w, "other_cores_worst": self.worst,
                "steal_share": self.steal_s / (w * max(1, len(self.sample.cpus))), "reduced_s": self.reduced_s}


BUSY_WARN = 0.25  # other processes' cores, on average while decoding, from which a run's summary warns


class RunLoad:
    """Other processes' CPU on this machine while a run decodes, sampled every `interval` seconds on a thread:
    the machine's busy time less the run's own processes' (this driver with its children: a local Ray's GCS,
    raylet and workers; and the actors' pids on this machine, `own`), and the hypervisor's steal. Only this
    machine is seen: actors on other nodes are not measured (`report` says how many were here)."""

    def __init__(self, own: set[int], interval: float = 2.0):
        import threading
        self.own, self.interval = set(own), interval
        self.sample, self.me = CpuSample(list(range(psutil.cpu_count() or os.cpu_count() or 1))), psutil.Process()
        self.cpu: dict[int, float] = {}
        self.other_s = self.steal_s = self.wall_s = self.worst = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="ssdgen-run-load", daemon=True)

    def _ours(self) -> float:
        """The run's processes' CPU seconds; a process first seen counts from its start (it began in the window
        or is the driver's own, measured from the first read)."""
        procs = {self.me.pid: self.me} | {p.pid: p for p in self.me.children(recursive=True)}
        for pid in self.own - procs.keys():
            try:
                procs[pid] = psutil.Process(pid)
            except psutil.Error:
                pass
        for pid, p in procs.items():
            try:
                self.cpu[pid] = _own_cpu(p)
            except psutil.Error:  # ended: keeps its last reading
                pass
        return sum(self.cpu.values())

    def _loop(self) -> None:
        t0, busy0, steal0 = self.sample.read()
        ours0 = self._ours()
        stopped = False
        while not stopped:
            stopped = self._stop.wait(self.interval)  # the last, shorter window too
            t, busy, steal = self.sample.read()
            ours = self._ours()
            wall = t - t0
            if wall > 0:
                other = max(0.0, (busy - busy0) - (ours - ours0)) / wall
                self.other_s += other * wall
                self.steal_s += max(0.0, steal - steal0)
                self.wall_s += wall
                self.worst = max(self.worst, other)
            t0, busy0, steal0, ours0 = t, busy, steal, ours

    def __enter__(self) -> "RunLoad":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def report(self) -> dict:
        """{seconds measured, other processes' cores (mean, worst window), the share of CPU stolen, warning}."""
        w, cores = max(self.wall_s, 1e-9), len(self.sample.cpus)
        mean, steal = self.other_s / w, self.steal_s / (w * cores)
        warning = None
        if self.wall_s and (mean > BUSY_WARN or steal > 0.05):
            warning = (f"other processes used {mean:.2f} of this machine's {cores} cores on average while the run "
                       f"decoded (up to {self.worst:.2f})" + (f", and the hypervisor took {steal:.0%}" if steal > 0.05
                                                               else "")
                       + ": its images/s and cost per image are worse than this machine's quiet figures")
        return {"seconds": self.wall_s, "cores": cores, "other_cores_mean": mean, "other_cores_worst": self.worst,
                "steal_share": steal, "warning": warning}


def governed(model):
    """`with governed(model):` decodes in this process under a ThreadGovernor with the machine's CPUs (the user's
    thread count wins): `ssdgen sample`, `ssdgen eval`, `ssdgen.sample`."""
    return ThreadGovernor(ThreadPolicy.from_env()).watching(model)
