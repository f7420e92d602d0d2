"""Before/after bench summary: per version, each decoder x batch's images/s over the repetitions (median, min-max),
each decoder's best batch, and the AR-best ratios against `before` per repetition (rep i of each against rep i)."""
import glob
import json
import statistics
from collections import defaultdict
V = ["before", "after", "kv"]
cell = defaultdict(list)  # (v, decoder, batch) -> [img/s per rep]
loads = defaultdict(list)
for v in V:
    for f in sorted(glob.glob(f"{v}_*.json")):
        d = json.load(open(f))
        loads[v].append(d["load"]["loadavg_1m_before"])
        for r in d["rows"]:
            if r.get("role") == "control":
                continue
            cell[v, r["decoder"], r["batch_size"]].append(r["rounds_images_per_s"][0])


def fmt(xs):
    return f"{statistics.median(xs):.2f} ({min(xs):.2f}-{max(xs):.2f})"


print("version | decoder | batch | images/s median (min-max) over reps | reps")
for (v, dec, b), xs in sorted(cell.items(), key=lambda kv: (V.index(kv[0][0]), kv[0][1], kv[0][2])):
    print(f"{v} | {dec} | {b} | {fmt(xs)} | {len(xs)}")
best = {}
for v in V:
    for dec in ("ar", "sjd"):
        cands = {b: statistics.median(xs) for (vv, d, b), xs in cell.items() if vv == v and d == dec}
        if cands:
            b = max(cands, key=cands.get)
            best[v, dec] = (b, cell[v, dec, b])
print("\nbest batch (by median) per version and decoder; ratio to before's AR best, median (min-max) over the "
      "reps' pairs")
for (v, dec), (b, xs) in best.items():
    ref = best["before", "ar"][1]
    ratios = [x / y for x, y in zip(xs, ref)]
    print(f"{v} | {dec} | batch {b} | {fmt(xs)} images/s | x{fmt(ratios)} vs before's AR best")
pool = defaultdict(list)  # plain AR: the reference row and the run's AR control are both plain AR
for v in V:
    for f in sorted(glob.glob(f"{v}_*.json")):
        d = json.load(open(f))
        for r in d["rows"] + d["noise"]["control"]:
            if r["spec"] == "ar":
                pool[v, r["batch_size"]].append(r["rounds_images_per_s"][0])
print("\nplain AR pooled (each run's ar row and its ar control), images/s median (min-max), n; vs before, medians")
for (v, b), xs in sorted(pool.items(), key=lambda kv: (kv[0][1], V.index(kv[0][0]))):
    base = statistics.median(pool["before", b])
    print(f"{v} | batch {b} | {fmt(xs)} | n={len(xs)} | x{statistics.median(xs) / base:.2f}")
print("\nload average before each run (the previous run's own: they ran back to back):", dict(loads))
