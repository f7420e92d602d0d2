"""`python -m lab bench-scale`: the generation flow over many prompts with a tiny model, so that decoding costs almost
nothing and what is measured is the orchestration: wall time, images/s, per-shard overhead, actor utilisation,
and the resident memory of the driver and of each actor, sampled over the run.

A run longer than a sitting (10 M prompts: hours) is checkpointed by the run itself: with `--workdir` the inputs
and the output stay, and the same command again resumes the run where its commits stopped (a Ctrl-C or a kill
loses only the shards in flight). Each sitting's figures are of its own shards and time, and are appended to
`{workdir}/segments.jsonl`.

The model is `reference.tiny.tiny_model` (the reference architecture, random weights, 4x4 tokens) written to a
temporary bundle and used as `--model reference:/bundle`; the prompts are the eval captions cycled, each with
its own prompt_id, in one Parquet file. A background thread samples RSS with psutil every `sample_s`: the
driver (this process) and every Ray actor process of the run (`ray::DecodeWorker...` among this process's
descendants, or on the machine when attached to a cluster).

Figures (JSON keys):
  - per_shard_overhead_ms: the actors' time that was not decoding, per shard:
    (actors x steady-state wall - summed busy seconds) / shards. What the orchestration costs each shard.
  - actor_utilization: summed busy seconds / (actors x steady-state wall).
  - overhead_split: the same time per shard from the sitting's markers, without startup and the run's end:
    fed (the actor had shards queued: Ray's round trip, pickling) and starved (it had none: the driver lagged);
    `python -m lab shard-overhead` times a shard's pieces one by one.
  - commit_latency_ms_mean / _max: driver time from a shard's last batch coming back to its commit marker
    being written (the write happens while the actor decodes its next shard).
  - driver_rss_mb_first_tenth / _last_tenth: the driver's mean RSS over the first and the last tenth of the
    flow's steady phase (actors ready to the flow's end); their difference is the growth a flat driver must
    not have. driver_peak_rss_mb is over the whole flow.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

MB = 2**20


class RssSampler:
    """The driver's and the actors' RSS every `interval` seconds, in a daemon thread: [(t, driver_mb, {pid:
    mb})]. Actor processes are found again at each sample, so a restarted actor is a new line."""

    def __init__(self, interval: float = 0.5):
        import psutil
        self.interval, self.me = interval, psutil.Process()
        self.samples: list[tuple[float, float, dict[int, float]]] = []
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)
        self.t0 = time.perf_counter()

    def start(self) -> "RssSampler":
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stop_event.set()
        self.thread.join()

    def _actors(self) -> list:
        import psutil
        procs = self.me.children(recursive=True)
        found = [p for p in procs if _is_actor(p)]
        return found or [p for p in psutil.process_iter() if _is_actor(p)]

    def _run(self) -> None:
        import psutil
        while not self.stop_event.is_set():
            actors = {}
            for p in self._actors():
                try:
                    actors[p.pid] = p.memory_info().rss / MB
                except psutil.Error:
                    pass
            self.samples.append((time.perf_counter() - self.t0, self.me.memory_info().rss / MB, actors))
            self.stop_event.wait(self.interval)


def _is_actor(p) -> bool:
    import psutil
    try:
        return any("DecodeWorker" in part for part in p.cmdline()[:1])
    except psutil.Error:
        return False


def write_inputs(work: Path, n: int) -> tuple[Path, Path]:
    """The tiny model bundle and n prompts (eval captions cycled, ids p000000000...) under `work`; kept as they
    are when a `_DONE` file says they were written for n (a resumed run must find its inputs unchanged)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from ssdgen.reference.prompts import eval_prompts
    from ssdgen.reference.tiny import tiny_model
    done = work / "_DONE"
    if done.exists() and done.read_text() == str(n):
        return work / "model", work / "prompts.parquet"
    tiny_model(work / "model")
    captions = [r["prompt"] for r in eval_prompts()]
    table = pa.table({"prompt_id": [f"p{i:09d}" for i in range(n)],
                      "prompt": [captions[i % len(captions)] for i in range(n)]})
    pq.write_table(table, work / "prompts.parquet")
    done.write_text(str(n))
    return work / "model", work / "prompts.parquet"


def write_inputs_apart(work: Path, n: int) -> None:
    """`write_inputs` in a process of its own, which imports the lab from this checkout."""
    checkout = str(Path(__file__).resolve().parents[2])
    subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[3]); from pathlib import Path; "
                    "from lab.bench.scale import write_inputs; write_inputs(Path(sys.argv[1]), int(sys.argv[2]))",
                    str(work), str(n), checkout], check=True)


def busy_committed(out: str) -> tuple[int, float]:
    """(shards, actor busy seconds) over the shards already committed at `out`: a resumed segment's own work is
    the summary's totals less these."""
    from ssdgen.output.layout import Output
    shards, busy = 0, 0.0
    try:
        for m in Output(out).iter_markers():
            shards, busy = shards + 1, busy + m.device_seconds_busy
    except FileNotFoundError:
        pass
    return shards, busy


def overhead_split(out: str, since: str | None = None) -> dict:
    """The actors' time outside busy per shard, split, from the commit markers of shards started at or after
    `since` (an ISO time: this sitting's; None: all), per actor process:
      - fed: the actor had shards queued but was not decoding: Ray's task round trip, (un)pickling, the result's
        return (the markers' wall_s - busy_s: flows.scheduling charges an actor's time to its shards only while it
        has work);
      - starved: the actor had no shard queued (the driver did not keep it fed): its span from its first shard's
        dispatch to its last commit, less the time charged to its shards.
    Startup and the run's end (manifest, summary) are outside every span, so neither is in these figures."""
    from datetime import datetime
    from ssdgen.output.layout import Output
    per: dict[int, dict] = {}
    for m in Output(out).iter_markers():
        if not (m.started_at and m.finished_at) or since is not None and m.started_at < since:
            continue
        a = per.setdefault(m.actor_pid, {"shards": 0, "busy": 0.0, "wall": 0.0, "first": m.started_at,
                                         "last": m.finished_at})
        a["shards"] += 1
        a["busy"], a["wall"] = a["busy"] + m.busy_s, a["wall"] + m.wall_s
        a["first"], a["last"] = min(a["first"], m.started_at), max(a["last"], m.finished_at)
    shards = sum(a["shards"] for a in per.values()) or 1
    span = sum((datetime.fromisoformat(a["last"]) - datetime.fromisoformat(a["first"])).total_seconds()
               for a in per.values())
    busy, wall = sum(a["busy"] for a in per.values()), sum(a["wall"] for a in per.values())
    return {"shards": shards, "actors": len(per), "fed_overhead_ms_per_shard": 1000 * (wall - busy) / shards,
            "starved_ms_per_shard": 1000 * max(0.0, span - wall) / shards,
            "busy_share_of_span": busy / span if span else None}


def figures(samples: list, summary: dict, n: int, actors: int, t_start: float, t_end: float,
            before_busy: float = 0.0) -> dict:
    """The JSON figures from the RSS samples and the flow's summary (see the module docstring). The tenths are
    of the steady phase, from the actors being ready to the flow's end: startup (Prefect, Ray, model loads)
    is a constant, not growth. before_busy: busy seconds of shards committed before this segment (a resume)."""
    ready = steady_start(summary, t_start, t_end)
    run = [s for s in samples if ready <= s[0] <= t_end] or samples
    tenth = (t_end - ready) / 10
    first = [s[1] for s in run if s[0] <= ready + tenth] or [run[0][1]]
    last = [s[1] for s in run if s[0] >= t_end - tenth] or [run[-1][1]]
    peaks: dict[int, float] = {}
    for _, _, acts in run:
        for pid, mb in acts.items():
            peaks[pid] = max(peaks.get(pid, 0.0), mb)
    steady = max(1e-9, summary["wall_s"] - summary["startup_s"])
    busy_s = summary["device_seconds_busy"] - before_busy  # one CPU per actor here: device-seconds are seconds
    shards = summary["shards_run_now"] or 1
    lat = summary.get("commit_latency_s") or {}
    return {
        "n": n, "shards": summary["shards_total"], "shards_this_segment": summary["shards_run_now"],
        "actors": actors, "wall_s": t_end - t_start, "actor_busy_s": busy_s,
        "images_ok": summary["images_ok"], "images_this_segment": summary["images_this_run"],
        "images_per_s": summary["images_this_run"] / (t_end - t_start),
        "images_per_s_steady": summary["images_per_s_steady"], "startup_s": summary["startup_s"],
        "per_shard_overhead_ms": 1000 * max(0.0, actors * steady - busy_s) / shards,
        "actor_utilization": busy_s / (actors * steady),
        "commit_latency_ms_mean": None if lat.get("mean") is None else 1000 * lat["mean"],
        "commit_latency_ms_max": None if lat.get("max") is None else 1000 * lat["max"],
        "driver_peak_rss_mb": max((s[1] for s in samples if t_start <= s[0] <= t_end + 1), default=run[0][1]),
        "driver_rss_mb_first_tenth": sum(first) / len(first), "driver_rss_mb_last_tenth": sum(last) / len(last),
        "driver_rss_growth_mb": sum(last) / len(last) - sum(first) / len(first),
        "actor_peak_rss_mb": sorted(peaks.values(), reverse=True),
    }


def steady_start(summary: dict, t_start: float, t_end: float) -> float:
    """When the actors were ready, on the sampler's clock: the flow's own clock ends about at t_end."""
    return max(t_start, t_end - (summary["wall_s"] - summary["startup_s"]))


def plot_rss(samples: list, path: str, title: str, t_start: float, ready: float) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(9, 4.5))
    ax.plot([s[0] for s in samples], [s[1] for s in samples], label="driver", color="black", lw=1.6)
    pids = sorted({pid for s in samples for pid in s[2]})
    for k, pid in enumerate(pids):
        pts = [(s[0], s[2][pid]) for s in samples if pid in s[2]]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], lw=1, label=f"actor {k + 1} (pid {pid})")
    ax.axvline(t_start, color="gray", ls=":", lw=1, label="flow starts")
    ax.axvline(ready, color="gray", ls="--", lw=1, label="actors ready")
    ax.set_xlabel("seconds")
    ax.set_ylabel("resident memory (MB)")
    ax.set_title(title)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(n: int = 200_000, shard_size: int = 10, actors: int = 2, batch_size: int = 16, decoder: str = "ar",
        plot: str | None = None, workdir: str | None = None, keep: bool = False, sample_s: float = 0.5,
        log=print) -> dict:
    import shutil
    from ssdgen.flows.pipeline import RunSettings, generate
    if n < 1 or shard_size < 1 or actors < 1 or batch_size < 1:
        raise ValueError("--n, --shard-size, --actors and --batch-size must be >= 1")
    work = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="ssdgen-bench-scale-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        # in a process of its own: building n prompts here would leave the driver's heap (the figure measured)
        # hundreds of MB larger for 1 M+ prompts
        write_inputs_apart(work, n)
        model, prompts = work / "model", work / "prompts.parquet"
        before, before_busy = busy_committed(str(work / "run"))
        log(f"{n} prompts, shard size {shard_size}, {actors} actor(s), tiny model at {model}"
            + (f"; resuming: {before} shards already committed" if before else ""))
        sampler = RssSampler(sample_s).start()
        t_start = time.perf_counter() - sampler.t0
        since = datetime.now(timezone.utc).isoformat()
        summary = generate(RunSettings(prompts=[str(prompts)], out=str(work / "run"), model=f"reference:{model}",
                                       decoder=decoder, shard_size=shard_size, batch_size=batch_size, actors=actors),
                           progress=False)
        t_end = time.perf_counter() - sampler.t0
        time.sleep(sample_s)  # one more sample after the flow, then stop
        sampler.stop()
        res = figures(sampler.samples, summary, n, actors, t_start, t_end, before_busy)
        res["overhead_split"] = overhead_split(str(work / "run"), since)
        res |= {"resumed_from_shards": before, "shard_size": shard_size, "batch_size": batch_size,
                "decoder": decoder, "cpu_count": os.cpu_count(),
                "samples": [[round(t, 2), round(d, 1), {str(k): round(v, 1) for k, v in a.items()}]
                            for t, d, a in sampler.samples]}
        if plot:
            plot_rss(sampler.samples, plot, f"bench-scale: {n:,} prompts, {res['shards']:,} shards of {shard_size}, "
                                            f"{actors} actors", t_start,
                     steady_start(summary, t_start, t_end))
            res["plot"] = str(plot)
        with open(work / "segments.jsonl", "a") as f:  # one line per sitting: a long run's log across resumes
            f.write(json.dumps({k: v for k, v in res.items() if k != "samples"}) + "\n")
        return res
    finally:
        if not keep and not workdir:
            shutil.rmtree(work, ignore_errors=True)


def brief(res: dict) -> str:
    return (f"{res['n']:,} prompts, {res['shards']:,} shards: {res['wall_s']:.1f} s, {res['images_per_s']:.0f} "
            f"images/s ({res['images_per_s_steady'] or 0:.0f} after {res['startup_s']:.1f} s startup); per-shard "
            f"overhead {res['per_shard_overhead_ms']:.1f} ms (from the markers: fed "
            f"{res['overhead_split']['fed_overhead_ms_per_shard']:.1f}, starved "
            f"{res['overhead_split']['starved_ms_per_shard']:.1f}), actor utilisation {res['actor_utilization']:.0%}; "
            f"driver RSS {res['driver_rss_mb_first_tenth']:.0f} -> {res['driver_rss_mb_last_tenth']:.0f} MB "
            f"(peak {res['driver_peak_rss_mb']:.0f}), actors' peak "
            + ", ".join(f"{m:.0f}" for m in res["actor_peak_rss_mb"]) + " MB")


def dump(res: dict, path: str) -> None:
    Path(path).write_text(json.dumps(res, indent=1))
