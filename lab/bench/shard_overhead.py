"""Where a shard's overhead goes (`python -m lab shard-overhead`), piece by piece, as bench-scale runs a shard: the
tiny model, `ar`, one Ray task per shard (batch = shard size), local files.

bench-scale's per-shard overhead is the actors' time not spent decoding: (actors x steady wall - busy) / shards.
Here each piece of a shard's way is timed on its own, over `shards` shards, in this process (no flow, nothing
overlapping), and a one-actor Ray times the task's round trip with the shard's real rows and result:

    driver   read the shard's rows (Arrow), pickle them for the task (Ray serialises arguments so), unpickle the
             result, build its two tables, write images.parquet and stats.parquet, commit the marker
    actor    unpickle the rows, decode and encode (busy_s: what bench-scale counts as busy), pickle the result
    Ray      a task's round trip on an idle actor with the shard's rows and a result of the shard's size, less
             the time the actor spends in it (what only Ray's own machinery costs per task)

The actor's side outside busy_s (unpickle rows, pickle result, Ray's own) is what a shard costs an actor beyond
its decoding when the driver keeps it fed; the driver's pieces run on its I/O threads meanwhile and, on a
machine with no spare core, take CPU from the actors.
"""

from __future__ import annotations

import pickle
import statistics
import tempfile
import time
from dataclasses import asdict
from pathlib import Path


def _ms(xs: list[float]) -> dict:
    return {"median_ms": 1000 * statistics.median(xs), "mean_ms": 1000 * statistics.fmean(xs)}


class _Echo:
    """A Ray actor that takes a shard's rows and returns a prepared result: the task's round trip alone."""

    def __init__(self, result: bytes):
        self.result = pickle.loads(result)

    def run(self, rows):
        return self.result


def _ray_round_trip(rows: list[dict], result_blob: bytes, tries: int) -> list[float]:
    import ray
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        echo = ray.remote(num_cpus=1)(_Echo).remote(result_blob)
        ray.get(echo.run.remote(rows))  # warm: the actor is up and has the result
        out = []
        for _ in range(tries):
            t0 = time.perf_counter()
            ray.get(echo.run.remote(rows))
            out.append(time.perf_counter() - t0)
        return out
    finally:
        ray.shutdown()


def run(shards: int = 40, shard_size: int = 256, workdir: str | None = None, log=print) -> dict:
    from ssdgen.inputs.files import list_inputs
    from ssdgen.output.layout import Output, shard_tables
    from ssdgen.output.marker import Marker
    from ssdgen.inputs.shards import Shards, read_shard
    from ssdgen.flows.settings import RunSettings
    from ssdgen.formats import write_shard
    from ssdgen.workers.decode_worker import DecodeWorker

    from lab.bench.scale import write_inputs_apart
    if shards < 2 or shard_size < 1:
        raise ValueError("--shards must be >= 2 and --shard-size >= 1")
    work = Path(workdir or tempfile.mkdtemp(prefix="ssdgen-shard-overhead-"))
    work.mkdir(parents=True, exist_ok=True)
    write_inputs_apart(work, shards * shard_size)
    cfg = RunSettings(prompts=[str(work / "prompts.parquet")], out=str(work / "out"), decoder="ar",
                      model=f"reference:{work / 'model'}", shard_size=shard_size, batch_size=shard_size, actors=1)
    files = list_inputs(list(cfg.prompts))
    plan, worker, out = Shards(files, shard_size), DecodeWorker(cfg.worker(), threads=1), Output(cfg.out)
    spec = str(cfg.decoder)
    t: dict[str, list[float]] = {k: [] for k in ("read", "args_pickle", "args_unpickle", "decode_busy", "decode_call",
                                                 "result_pickle", "result_unpickle", "tables", "write", "commit")}
    sizes = {"args_bytes": 0, "result_bytes": 0}
    for i in range(shards):
        a = time.perf_counter()
        rows = [asdict(r) for r in read_shard(files, plan[i], cfg.seed)]
        b = time.perf_counter()
        blob = pickle.dumps(rows, protocol=5)
        c = time.perf_counter()
        rows = pickle.loads(blob)
        d = time.perf_counter()
        res = worker(rows)
        e = time.perf_counter()
        rblob = pickle.dumps(res, protocol=5)
        f = time.perf_counter()
        res = pickle.loads(rblob)
        g = time.perf_counter()
        images, stats = shard_tables(res.samples, rows, spec, cfg.model)
        h = time.perf_counter()
        attempt = out.new_attempt(i)
        recs = write_shard(out, attempt, i, images, stats, "parquet", shard_size)
        k = time.perf_counter()
        out.commit(Marker.from_dict({"shard": i, "attempt": attempt.rsplit("/", 1)[-1], "files": recs,
                                     "rows": len(rows), "ok": len(rows), "decoder": spec}))
        m = time.perf_counter()
        for key, v in zip(t, (b - a, c - b, d - c, res.busy_s, e - d, f - e, g - f, h - g, k - h, m - k)):
            t[key].append(v)
        sizes = {"args_bytes": len(blob), "result_bytes": len(rblob)}
    first = {k: v[1:] for k, v in t.items()}  # the first shard warms the allocator and the model up
    log(f"timed {shards - 1} shards of {shard_size} in this process; now a one-actor Ray for the task round trip")
    trips = _ray_round_trip(rows, rblob, max(20, shards))
    return {"shards": shards - 1, "shard_size": shard_size, **sizes, "pieces": {k: _ms(v) for k, v in first.items()},
            "ray_round_trip": _ms(trips), "workdir": str(work)}


def breakdown(res: dict) -> list[tuple[str, str, float]]:
    """(side, piece, median ms per shard) in the module doc's order; Ray's own is the round trip less what the
    echo actor spends (nothing) less the rows' and the result's (un)pickling on both ends."""
    p = {k: v["median_ms"] for k, v in res["pieces"].items()}
    ser = p["args_pickle"] + p["args_unpickle"] + p["result_pickle"] + p["result_unpickle"]
    ray_own = max(0.0, res["ray_round_trip"]["median_ms"] - ser)
    return [("driver", "read rows (Arrow)", p["read"]), ("driver", "pickle rows", p["args_pickle"]),
            ("driver", "unpickle result", p["result_unpickle"]), ("driver", "build tables", p["tables"]),
            ("driver", "write Parquet files", p["write"]), ("driver", "commit marker", p["commit"]),
            ("actor", "unpickle rows", p["args_unpickle"]), ("actor", "decode + encode (busy)", p["decode_busy"]),
            ("actor", "outside busy in decode()", p["decode_call"] - p["decode_busy"]),
            ("actor", "pickle result", p["result_pickle"]), ("Ray", "task round trip, own", ray_own)]


def brief(res: dict) -> str:
    rows = breakdown(res)
    lines = [f"{side:<6} {piece:<26} {ms:8.2f} ms" for side, piece, ms in rows]
    actor = sum(ms for side, piece, ms in rows if side in ("actor", "Ray") and "busy)" not in piece)
    driver = sum(ms for side, _, ms in rows if side == "driver")
    return "\n".join(lines + [f"per shard of {res['shard_size']}: the actor's time outside busy {actor:.2f} ms "
                              f"(with Ray's own); the driver's CPU {driver:.2f} ms; rows {res['args_bytes']:,} B, "
                              f"result {res['result_bytes']:,} B"])
