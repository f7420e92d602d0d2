"""How `ssdgen bench` tells a speed difference from the machine's noise.

Every (decoder, batch size) cell is timed once per round, and every round visits every cell (bench/decode.py),
so a round is the unit of independent measurement: a slow spell of the machine inside one round falls on every
cell of that round alike. Per cell:

  - images/s: the median over rounds, with a 95% interval from Student's t on the rounds' logs (a slow round
    widens it; three rounds give t = 4.30, so the interval is honest about how little three rounds show);
  - a ratio of two cells (to AR at the same batch, to AR's best, to the cheapest): the per-round ratios, paired
    by round, with the same interval;
  - the control: AR timed a second time in the same rounds. AR against AR has a true ratio of 1, so its interval
    is what noise alone does to a ratio here: the noise floor, the farthest end from 1 over the batch sizes.

A ratio whose interval holds 1, or lies within the floor, is "no measurable difference": never a speed-up.
A row its plan decoded as plain AR is AR again; it is labelled and not ranked.
"""

from __future__ import annotations

import math

import numpy as np

SAME = "no measurable difference"
FASTER, SLOWER = "faster", "slower"


def _t975(df: int) -> float:
    from scipy.stats import t
    return float(t.ppf(0.975, df))


def interval(values: list[float]) -> tuple[float, float | None, float | None]:
    """(median, low, high) of positive per-round values; the 95% interval is t on the logs (None with one
    round: nothing to tell noise by)."""
    x = np.log(np.asarray(values, dtype=float))
    med = float(np.median(np.asarray(values, dtype=float)))
    if len(x) < 2:
        return med, None, None
    half = _t975(len(x) - 1) * float(np.std(x, ddof=1)) / math.sqrt(len(x))
    m = float(np.mean(x))
    return med, float(math.exp(m - half)), float(math.exp(m + half))


def ratio(a: list[float], b: list[float]) -> tuple[float, float | None, float | None]:
    """a / b paired by round (both lists are per-round images/s of two cells of one bench)."""
    return interval([x / y for x, y in zip(a, b)])


def judge(lo: float | None, hi: float | None, floor: float) -> str:
    """A ratio's verdict: SAME when its interval holds 1 or lies within [1/(1+floor), 1+floor]; else FASTER or
    SLOWER. Without an interval (one round) nothing can be told: SAME."""
    if lo is None or hi is None or lo <= 1.0 <= hi:
        return SAME
    if 1.0 / (1.0 + floor) <= lo and hi <= 1.0 + floor:
        return SAME
    return FASTER if lo > 1.0 else SLOWER


def noise_floor(rows: list[dict], control: list[dict]) -> dict:
    """The control (AR again, same rounds) against the reference AR at each batch size -> {"floor", "by_batch":
    [{batch_size, ratio, ratio_ci}]}; floor: the farthest end of those intervals from 1 (as a fraction)."""
    by_batch, floor = [], 0.0
    for c in control:
        ref = next(r for r in rows if r["role"] == "reference" and r["batch_size"] == c["batch_size"])
        med, lo, hi = ratio(c["rounds_images_per_s"], ref["rounds_images_per_s"])
        by_batch.append({"batch_size": c["batch_size"], "ratio": med, "ratio_ci": _ci(lo, hi)})
        ends = [v for v in (lo, hi, med) if v is not None]
        floor = max([floor] + [max(v - 1.0, 1.0 / v - 1.0) for v in ends])
    return {"floor": floor, "by_batch": by_batch,
            "what": "AR timed twice in the same rounds: a ratio within this fraction of 1 is noise"}


def _ci(lo, hi):
    return None if lo is None else [lo, hi]


def _ratio_cols(prefix: str, a: dict, b: dict, floor: float) -> dict:
    med, lo, hi = ratio(a["rounds_images_per_s"], b["rounds_images_per_s"])
    return {prefix: med, f"{prefix}_ci": _ci(lo, hi), f"{prefix}_verdict": judge(lo, hi, floor)}


def add_cell_stats(rows: list[dict], floor: float, usd_per_image_s: float, spot_per_image_s: float | None) -> None:
    """Each row's medians and intervals (images/s, s/image, $ per 1k on demand and spot) and its ratio to AR at
    the same batch size. usd_per_image_s: $ per 1k images for one image per second (price x devices / 3.6)."""
    for r in rows:
        med, lo, hi = interval(r["rounds_images_per_s"])
        r.update(images_per_s=med, images_per_s_ci=_ci(lo, hi), seconds_per_image=1.0 / med,
                 usd_per_1k_images=usd_per_image_s / med,
                 usd_per_1k_images_ci=None if lo is None else [usd_per_image_s / hi, usd_per_image_s / lo],
                 usd_per_1k_images_spot=None if spot_per_image_s is None else spot_per_image_s / med)
    for r in rows:
        ref = next(x for x in rows if x["role"] == "reference" and x["batch_size"] == r["batch_size"])
        r |= _ratio_cols("speedup_vs_ar", r, ref, floor)


def ranked(rows: list[dict]) -> list[dict]:
    """The rows that stand for a configuration of their own: not those their plan decoded as plain AR."""
    return [r for r in rows if not r.get("planned_as_ar")]


BEST_COLS = ("batch_size", "images_per_s", "images_per_s_ci", "seconds_per_image", "usd_per_1k_images",
             "usd_per_1k_images_ci", "usd_per_1k_images_spot", "waste", "speedup_vs_ar", "speedup_vs_ar_ci",
             "plan_spec", "fidelity_of", "fidelity_n", "nll_gap", "nll_gap_ci", "indistinguishable",
             "within_tolerance", "fd_to_ar", "fd_noise_floor", "lossless")


def best_batches(rows: list[dict], floor: float = 0.0) -> list[dict]:
    """Per decoder (in the rows' order), its ranked row with the most images/s (median): BEST_COLS,
    `latency_batch1_s` (s/image at batch 1, None when not measured) and `vs_ar_best` with its interval and verdict
    (None without AR). A decoder whose every row was planned as AR has no best row of its own."""
    best: dict[str, dict] = {}
    for r in ranked(rows):
        if r["images_per_s"] > best.get(r["decoder"], {"images_per_s": -1.0})["images_per_s"]:
            best[r["decoder"]] = r
    ar = best.get("ar")
    out = []
    for d, r in best.items():
        one = next((x for x in rows if x["decoder"] == d and x["batch_size"] == 1), None)
        vs = ({"vs_ar_best": None} if ar is None or "rounds_images_per_s" not in r else
              _ratio_cols("vs_ar_best", r, ar, floor))
        if ar is not None and "rounds_images_per_s" not in r:  # a result without rounds: the plain ratio
            vs = {"vs_ar_best": r["images_per_s"] / ar["images_per_s"]}
        out.append({"decoder": d} | {k: r[k] for k in BEST_COLS if k in r}
                   | {"latency_batch1_s": None if one is None else one["seconds_per_image"]} | vs)
    return out


def verdict(rows: list[dict], best: list[dict], floor: float) -> dict:
    """The headline: the cheapest configuration at its best batch (the most images/s: one device, one price),
    with its intervals, and the others that cannot be told apart from it."""
    if not best:
        return {"text": "no configuration to rank: every row was planned as plain AR"}
    top = max(best, key=lambda b: b["images_per_s"])
    cell = {(r["decoder"], r["batch_size"]): r for r in rows}
    top_row = cell[(top["decoder"], top["batch_size"])]
    ties = []
    for b in best:
        if b is top:
            continue
        med, lo, hi = ratio(cell[(b["decoder"], b["batch_size"])]["rounds_images_per_s"],
                            top_row["rounds_images_per_s"])
        if judge(lo, hi, floor) == SAME:
            ties.append({"decoder": b["decoder"], "batch_size": b["batch_size"], "ratio": med, "ratio_ci": _ci(lo, hi)})
    planned_ar = sorted({r["decoder"] for r in rows if r.get("planned_as_ar")})
    by_name = {b["decoder"]: b for b in best}
    text = (f"cheapest: {top['decoder']} at batch {top['batch_size']}{caveat(top)}, ${_g(top['usd_per_1k_images'])} "
            f"per 1k images {fmt_interval(top.get('usd_per_1k_images_ci'))}, {_g(top['images_per_s'])} images/s "
            f"{fmt_interval(top.get('images_per_s_ci'))}")
    text += ("; cannot be told apart from it: " + ", ".join(
        f"{t['decoder']} at batch {t['batch_size']}{caveat(by_name[t['decoder']])} ({_g(t['ratio'])}x "
        f"{fmt_interval(t['ratio_ci'])})" for t in ties)
        if ties else "; every other configuration is measurably slower")
    if caveat(top) and (safe := [b for b in best if not caveat(b)]):  # what the user can take as it is
        alt = max(safe, key=lambda b: b["images_per_s"])
        text += (f"; cheapest exact or measured within tolerance: {alt['decoder']} at batch {alt['batch_size']}, "
                 f"${_g(alt['usd_per_1k_images'])} per 1k images")
    if planned_ar:
        text += f"; planned as plain AR (not ranked there): {', '.join(planned_ar)}"
    return {"cheapest": {k: top.get(k) for k in ("decoder", "batch_size", "images_per_s", "images_per_s_ci",
                                                  "usd_per_1k_images", "usd_per_1k_images_ci")},
            "indistinguishable": ties, "noise_floor": floor, "text": text,
            "unverified": [b["decoder"] for b in best if caveat(b)]}


def caveat(b: dict) -> str:
    """What the verdict must say of a lossy configuration beside its name (#49: "cheapest: csd" with
    --fidelity-n 0 said nowhere but at the foot of the page that csd's images were never compared with ar's):
    no fidelity measured, or an NLL gap outside the tolerance. "" for a lossless one (`lossless`, the spec's own
    word: exact by construction), one measured within the tolerance, or a row from before rows said."""
    if b.get("lossless") is not False:
        return ""
    if b.get("nll_gap") is None:
        return " (lossy, and its fidelity to ar was not measured: --fidelity-n 0; measure it before using it)"
    if b.get("within_tolerance") is False:
        return (f" (lossy: NLL gap to ar {b['nll_gap']:+.3f} nats/token {fmt_interval(b.get('nll_gap_ci'))}, "
                "outside the tolerance)")
    return ""


def _g(v: float) -> str:
    return f"{v:.4g}"


def fmt_interval(ci) -> str:
    return "[no interval: one round]" if not ci else f"[{_g(ci[0])}, {_g(ci[1])}]"
