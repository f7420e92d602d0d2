"""Is the machine quiet enough to time on? `ssdgen bench` asks before and while it runs.

With two torch threads on two cores, any busy process on the other core cuts matmul throughput about 3x
(docs/benchmarks.md), and a noisy neighbour's VM shows as CPU steal. Three signals, from /proc through psutil:

  - other processes' CPU: the whole machine's busy CPU time minus this process's own, in cores;
  - the 1-minute load average, for the record;
  - CPU steal, as a share of the machine's CPU time, where the kernel reports it.

The load average is kept in the report but warns on nothing: it lags, so it shows the user's previous command.
A busy machine (other processes' CPU or steal) gets a warning in the console, the JSON and the HTML: the
intervals still hold, but they are wider, and a verdict from a loaded machine is worth less than one from a quiet one.
"""

from __future__ import annotations

import os
import time

import psutil

OTHER_CORES_WARN = 0.25  # other processes' CPU, in cores, above which timings are disturbed
STEAL_WARN = 0.05  # share of CPU time stolen by the hypervisor


def _busy(t) -> float:
    return sum(t) - t.idle - getattr(t, "iowait", 0.0)


def _own(p: psutil.Process) -> float:
    c = p.cpu_times()
    return c.user + c.system + c.children_user + c.children_system


class LoadMonitor:
    """Samples the machine between checkpoints: `mark(where)` closes a window and records its figures;
    `report()` -> the JSON block with warnings. `threads`: the cores this process means to use."""

    def __init__(self, threads: int):
        self.threads, self.cores = threads, psutil.cpu_count() or os.cpu_count() or 1
        self.proc = psutil.Process()
        self.windows: list[dict] = []
        self._start()

    def _start(self) -> None:
        self._t, self._cpu, self._own = time.monotonic(), psutil.cpu_times(), _own(self.proc)

    def mark(self, where: str) -> dict:
        t, cpu, own = time.monotonic(), psutil.cpu_times(), _own(self.proc)
        wall = max(t - self._t, 1e-6)
        total = max(sum(cpu) - sum(self._cpu), 1e-9)
        other = max(0.0, (_busy(cpu) - _busy(self._cpu)) - (own - self._own)) / wall
        steal = (getattr(cpu, "steal", 0.0) - getattr(self._cpu, "steal", 0.0)) / total
        w = {"where": where, "seconds": wall, "other_cores": other, "steal_share": steal,
             "loadavg_1m": os.getloadavg()[0]}
        self.windows.append(w)
        self._start()
        return w

    def idle_check(self, seconds: float = 1.0) -> dict:
        """Before the run: a window in which this process sits still."""
        self._start()
        time.sleep(seconds)
        return self.mark("before")

    def report(self) -> dict:
        ws = self.windows
        during = [w for w in ws if w["where"] != "before"] or ws
        worst_other = max((w["other_cores"] for w in ws), default=0.0)
        mean_other = sum(w["other_cores"] * w["seconds"] for w in during) / max(sum(w["seconds"] for w in during),
                                                                                 1e-9)
        steal = max((w["steal_share"] for w in ws), default=0.0)
        before = next((w for w in ws if w["where"] == "before"), None)
        warnings = []
        if worst_other > OTHER_CORES_WARN:
            w = max(ws, key=lambda w: w["other_cores"])
            warnings.append(f"other processes used {w['other_cores']:.2f} of {self.cores} cores ({w['where']}; "
                            f"{mean_other:.2f} on average while timing): timings are disturbed")
        # the load average is reported, never warned on: it lags by minutes, so the user's own previous command
        # (or this bench's start-up) is in it; other processes' measured CPU and the steal are what disturb timing
        if steal > STEAL_WARN:
            warnings.append(f"CPU steal up to {steal:.0%} of CPU time: the hypervisor gave this machine's time away")
        return {"busy": bool(warnings), "warnings": warnings, "cores": self.cores, "threads": self.threads,
                "other_cores_max": worst_other, "other_cores_mean": mean_other, "steal_share_max": steal,
                "loadavg_1m_before": None if before is None else before["loadavg_1m"],
                "loadavg_1m_max": max((w["loadavg_1m"] for w in ws), default=None), "windows": len(ws)}
