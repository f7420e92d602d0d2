"""Cost accounting for generation runs: $ per 1k images, images/s per device, utilization.

Price table (`output/prices.csv`, package data of ssdgen.output: `DEFAULT_PRICES`) conventions:
  - one row per `device_type` (`h100`, `a100-40gb`, `h200`, `l4`, `a10g`, `cpu`, ...);
  - prices are USD per *device*-hour: the instance's hourly price divided by
    `devices_per_instance`. `unit` says what a device is: `gpu` for accelerators, `vcpu` for
    CPU-only types (the `cpu` row is priced per vCPU);
  - `on_demand_usd_per_hour` is the list price (AWS us-east-1, Linux, shared tenancy);
    `spot_usd_per_hour` is a *typical* spot price (spot varies by zone and hour) and may be empty
    when unknown;
  - `source` is the page the numbers come from (and says "unverified"/"typical" where that is what
    they are); `as_of` is the ISO date the page states, or the date the row was recorded.

The user's prices (`price_from`, the one place a run's price is chosen): `--prices FILE` is a table of the
same columns (local path or fsspec URL) that replaces the shipped one; `--usd-per-hour X` replaces the device
row's on-demand price (per device-hour of its unit: per vCPU-hour for a `vcpu` type), with the spot price
unknown unless `--spot-usd-per-hour` gives it. `Price.origin` says which: "shipped table (as of ...)",
"--prices PATH" or "--usd-per-hour"; summary.json, `ssdgen status` and the report show it.

Conventions (how the numbers are defined):
  - A shard record (written by the pipeline into each shard's commit marker) carries, at least,
    `shard, rows, ok, failed, wall_s, busy_s, load_s, devices, device_seconds_allocated,
    device_seconds_busy`, where device_seconds_allocated = (wall_s + load_s) x devices and
    device_seconds_busy = busy_s x devices.
  - images/s per device = images_ok / device-seconds allocated.
  - $ per 1k images = sum over shards of (device-seconds allocated x price per device-hour / 3600)
    divided by (images_ok / 1000). Reported for on-demand and spot, each with the price's source
    and date; None (never NaN/inf) when there are no images or no spot price.
  - utilization = busy device-seconds / allocated device-seconds; overhead share = 1 - utilization
    (model load, I/O, encoding, idle).
  - Failed and retried samples cost money and produce no output: they are in the allocated
    device-seconds and not in images_ok, so they raise $ per 1k images.
  - `reconciles`: the totals are computed once from summed device-seconds x price and once as the
    sum of per-shard costs (`shard_cost`); the two must agree to 1e-9 relative.

Pure Python on purpose (no Ray/Prefect/torch imports), so drivers, tests and notebooks can use it.
"""

from __future__ import annotations

import csv
import dataclasses
import datetime as dt
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

# next to this module, so an installed wheel finds it as it finds the code (never relative to a checkout)
DEFAULT_PRICES: Path = Path(__file__).resolve().with_name("prices.csv")

COLUMNS = ("device_type", "unit", "devices_per_instance", "instance_type",
           "on_demand_usd_per_hour", "spot_usd_per_hour", "source", "as_of")
UNITS = ("gpu", "vcpu")
RECORD_KEYS = ("ok", "failed", "wall_s", "busy_s", "load_s", "devices",
               "device_seconds_allocated", "device_seconds_busy")
RECONCILE_RTOL = 1e-9


@dataclass(frozen=True)
class Price:
    device_type: str
    unit: str
    devices_per_instance: int
    instance_type: str
    on_demand_usd_per_hour: float
    spot_usd_per_hour: float | None
    source: str
    as_of: str
    origin: str = ""  # where the run's price came from (price_from); "" on a bare table row or an older record


# ---------------------------------------------------------------------------------------- prices

def _bad(path: Path, line: int, column: str, problem: str) -> ValueError:
    return ValueError(f"{path}: line {line}, column {column!r}: {problem}")


def _parse_row(path: Path, line: int, row: dict[str, str]) -> Price:
    def text(col: str) -> str:
        value = (row.get(col) or "").strip()
        if not value:
            raise _bad(path, line, col, "empty")
        return value

    def number(col: str, *, optional: bool = False) -> float | None:
        raw = (row.get(col) or "").strip()
        if not raw and optional:
            return None
        try:
            value = float(raw)
        except ValueError:
            raise _bad(path, line, col, f"not a number: {raw!r}") from None
        if not math.isfinite(value) or value <= 0:
            raise _bad(path, line, col, f"must be a positive finite number, got {raw!r}")
        return value

    unit = text("unit")
    if unit not in UNITS:
        raise _bad(path, line, "unit", f"must be one of {', '.join(UNITS)}, got {unit!r}")
    raw_n = text("devices_per_instance")
    try:
        n = int(raw_n)
    except ValueError:
        raise _bad(path, line, "devices_per_instance", f"not an integer: {raw_n!r}") from None
    if n < 1:
        raise _bad(path, line, "devices_per_instance", f"must be >= 1, got {n}")
    as_of = text("as_of")
    try:
        dt.date.fromisoformat(as_of)
    except ValueError:
        raise _bad(path, line, "as_of", f"not an ISO date (YYYY-MM-DD): {as_of!r}") from None
    return Price(device_type=text("device_type").lower(), unit=unit, devices_per_instance=n,
                 instance_type=text("instance_type"),
                 on_demand_usd_per_hour=number("on_demand_usd_per_hour"),
                 spot_usd_per_hour=number("spot_usd_per_hour", optional=True),
                 source=text("source"), as_of=as_of)


def _open_text(path: str | Path):
    if isinstance(path, str) and "://" in path:  # a table in a bucket, as the run's other inputs may be
        import fsspec
        return fsspec.open(path, "rt", newline="", encoding="utf-8")
    return open(path, newline="", encoding="utf-8")


def load_prices(path: str | Path | None = None) -> dict[str, Price]:
    """Read the price table (a local path or an fsspec URL); {device_type: Price}. Malformed rows raise
    ValueError naming file, line and column."""
    if path is None:
        path = DEFAULT_PRICES
    elif not (isinstance(path, str) and "://" in path):
        path = Path(path)
    with _open_text(path) as f:
        reader = csv.DictReader(f)
        header = reader.fieldnames
        if not header:
            raise ValueError(f"{path}: line 1: empty file, expected header {','.join(COLUMNS)}")
        header = [h.strip() for h in header]
        for col in COLUMNS:
            if col not in header:
                raise _bad(path, 1, col, f"missing from header {','.join(header)}")
        extra = [h for h in header if h not in COLUMNS]
        if extra:
            raise _bad(path, 1, extra[0], f"unknown column; expected {','.join(COLUMNS)}")
        reader.fieldnames = header
        prices: dict[str, Price] = {}
        for row in reader:
            line = reader.line_num
            if None in row:  # more fields than header columns
                raise _bad(path, line, "(extra)", f"{len(header) + len(row[None])} fields, "
                                                  f"header has {len(header)}")
            if all(not (v or "").strip() for v in row.values()):
                continue  # blank line
            price = _parse_row(path, line, row)
            if price.device_type in prices:
                raise _bad(path, line, "device_type", f"duplicate {price.device_type!r}")
            prices[price.device_type] = price
    if not prices:
        raise ValueError(f"{path}: no price rows")
    return prices


def price_for(device_type: str, path: str | Path | None = None) -> Price:
    """The Price of one device type; unknown types raise ValueError listing the known ones."""
    prices = load_prices(path)
    key = device_type.strip().lower()
    if key not in prices:
        raise ValueError(f"unknown device type {device_type!r}; known: {', '.join(sorted(prices))} "
                         f"(in {Path(path) if path is not None else DEFAULT_PRICES})")
    return prices[key]


def _rate(flag: str, value: float | str | None) -> float | None:
    if value is None:
        return None
    try:
        rate = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{flag}: not a number: {value!r}") from None
    if not math.isfinite(rate) or rate <= 0:
        raise ValueError(f"{flag} must be a positive finite number of USD per device-hour, got {value!r}")
    return rate


def price_table(prices: str | Path | None = None) -> dict[str, Price]:
    """The user's table (`prices`, --prices) or the shipped one; a missing or malformed file is one ValueError
    naming --prices, the file, and its line and column."""
    if prices is None:
        return load_prices()
    try:
        return load_prices(prices)
    except FileNotFoundError:
        raise ValueError(f"--prices {prices}: no such file") from None
    except ValueError as e:
        raise ValueError(f"--prices {e}") from None


def _checked(prices, usd_per_hour, spot_usd_per_hour) -> tuple[dict[str, Price], float | None, float | None]:
    usd = _rate("--usd-per-hour", usd_per_hour)
    spot = _rate("--spot-usd-per-hour", spot_usd_per_hour)
    if spot is not None and usd is None:
        raise ValueError("--spot-usd-per-hour needs --usd-per-hour (the on-demand price of the same device)")
    return price_table(prices), usd, spot


def check_price_options(prices: str | Path | None = None, usd_per_hour: float | str | None = None,
                        spot_usd_per_hour: float | str | None = None) -> None:
    """`price_from`'s checks of the user's prices, for a view that may have no device type to price."""
    _checked(prices, usd_per_hour, spot_usd_per_hour)


def price_from(device_type: str, prices: str | Path | None = None, usd_per_hour: float | str | None = None,
               spot_usd_per_hour: float | str | None = None) -> Price:
    """The price a run is costed at, with `origin` saying where it came from: the `device_type` row of the
    user's table (`prices`: --prices) or of the shipped one, its on-demand price replaced by `usd_per_hour`
    (--usd-per-hour, per device-hour of the row's unit: per vCPU-hour for a vcpu type) and its spot price by
    `spot_usd_per_hour` (unknown when only the on-demand price is given: the table's spot is not the user's).
    Bad values, a bad file or an unknown device type raise one ValueError naming the option."""
    table, usd, spot = _checked(prices, usd_per_hour, spot_usd_per_hour)
    key = device_type.strip().lower()
    if key not in table:
        where = f"--prices {prices}" if prices is not None else f"the shipped table {DEFAULT_PRICES}"
        raise ValueError(f"unknown device type {device_type!r}; known: {', '.join(sorted(table))} (in {where}); "
                         "to price another device give --prices FILE with a row for it")
    row = table[key]
    if usd is None:
        origin = f"--prices {prices}" if prices is not None else f"shipped table (as of {row.as_of})"
        return dataclasses.replace(row, origin=origin)
    flags = "--usd-per-hour" + (", --spot-usd-per-hour" if spot is not None else "")
    return dataclasses.replace(row, on_demand_usd_per_hour=usd, spot_usd_per_hour=spot,
                               source=f"the user's price ({flags})", as_of=dt.date.today().isoformat(),
                               origin=flags + (f" (device row from --prices {prices})" if prices is not None else ""))


def recorded_price(record: dict | None) -> Price | None:
    """A Price as a run recorded it (summary.json's "price", _price.json), or None when there is none or it has
    another shape (an older ssdgen's)."""
    if not isinstance(record, dict):
        return None
    names = {f.name for f in dataclasses.fields(Price)}
    try:
        return Price(**{k: v for k, v in record.items() if k in names})
    except TypeError:
        return None


# ----------------------------------------------------------------------------------------- costs

def _field(record: dict, key: str) -> float:
    if key not in record:
        raise ValueError(f"shard record {record.get('shard', '?')}: missing {key!r}")
    try:
        value = float(record[key])
    except (TypeError, ValueError):
        raise ValueError(f"shard record {record.get('shard', '?')}: {key}={record[key]!r} "
                         "is not a number") from None
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"shard record {record.get('shard', '?')}: {key}={record[key]!r} "
                         "must be a finite number >= 0")
    return value


def shard_cost(record: dict, price: Price) -> dict:
    """USD of one shard: its allocated device-seconds at the on-demand and the spot price."""
    device_s = _field(record, "device_seconds_allocated")
    spot = price.spot_usd_per_hour
    return {"usd_on_demand": device_s * price.on_demand_usd_per_hour / 3600.0,
            "usd_spot": None if spot is None else device_s * spot / 3600.0}


def _ratio(num: float, den: float) -> float | None:
    return num / den if den > 0 else None


def _close(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return math.isclose(a, b, rel_tol=RECONCILE_RTOL, abs_tol=1e-15)


class _ExactSum:
    """math.fsum's result over values fed one at a time (Shewchuk's partials), so a summary streams over its
    records instead of holding a list of per-shard costs."""

    def __init__(self):
        self.partials: list[float] = []

    def add(self, x: float) -> None:
        i = 0
        for y in self.partials:
            if abs(x) < abs(y):
                x, y = y, x
            hi = x + y
            lo = y - (hi - x)
            if lo:
                self.partials[i] = lo
                i += 1
            x = hi
        self.partials[i:] = [x]

    def value(self) -> float:
        return math.fsum(self.partials)


def _priced(dev_alloc: float, ok: int, price: Price) -> dict:
    """The summary's cost fields: allocated device-seconds x price, and per 1k ok images."""
    spot = price.spot_usd_per_hour
    usd_od = dev_alloc * price.on_demand_usd_per_hour / 3600.0
    usd_spot = None if spot is None else dev_alloc * spot / 3600.0
    k_images = ok / 1000.0
    return {"usd_on_demand": usd_od, "usd_spot": usd_spot,
            "usd_per_1k_images_on_demand": _ratio(usd_od, k_images),
            "usd_per_1k_images_spot": None if usd_spot is None else _ratio(usd_spot, k_images),
            "price": dataclasses.asdict(price)}


def reprice(summary: dict, price: Price) -> dict:
    """A recorded summary costed at another price (a view's --prices / --usd-per-hour): the same device-seconds
    and images, the cost fields recomputed."""
    return summary | _priced(float(summary["device_seconds_allocated"]), int(summary["images_ok"]), price)


def run_summary(records: Iterable[dict], price: Price, wall_s: float) -> dict:
    """Flat, JSON-able summary of a run from its shard records (see module docstring). One pass over
    `records`, which may be a generator: a run's markers are streamed from storage, never held."""
    wall_s = float(wall_s)
    if not math.isfinite(wall_s) or wall_s < 0:
        raise ValueError(f"wall_s must be a finite number >= 0, got {wall_s!r}")
    ok = failed = shards = 0
    dev_alloc = dev_busy = dev_load = 0.0
    spot = price.spot_usd_per_hour
    sum_od, sum_spot = _ExactSum(), (None if spot is None else _ExactSum())
    for r in records:
        f = {k: _field(r, k) for k in RECORD_KEYS}
        shards += 1
        ok += int(f["ok"])
        failed += int(f["failed"])
        dev_alloc += f["device_seconds_allocated"]
        dev_busy += f["device_seconds_busy"]
        dev_load += f["load_s"] * f["devices"]
        c = shard_cost(r, price)  # the per-shard costs, summed exactly, check the totals below
        sum_od.add(c["usd_on_demand"])
        if sum_spot is not None:
            sum_spot.add(c["usd_spot"])

    # Totals from summed device-seconds x price, checked against the sum of per-shard costs.
    priced = _priced(dev_alloc, ok, price)
    sum_od = sum_od.value()
    sum_spot = None if sum_spot is None else sum_spot.value()

    utilization = _ratio(dev_busy, dev_alloc)
    return {
        "shards": shards,
        "images_ok": ok,
        "images_failed": failed,
        "wall_s": wall_s,
        "images_per_s": _ratio(ok, wall_s),
        "images_per_s_per_device": _ratio(ok, dev_alloc),
        "device_seconds_allocated": dev_alloc,
        "device_seconds_busy": dev_busy,
        "model_load_device_seconds": dev_load,
        "utilization": utilization,
        "overhead_share": None if utilization is None else 1.0 - utilization,
        **priced,
        "reconciles": _close(sum_od, priced["usd_on_demand"]) and _close(sum_spot, priced["usd_spot"]),
    }


# ---------------------------------------------------------------------------------------- tables

def _num(v: float | None, fmt: str = ",.1f", suffix: str = "") -> str:
    return "n/a" if v is None else f"{v:{fmt}}{suffix}"


def usd(v: float | None) -> str:
    """Dollars for people: cents from $1 up, four significant digits below, in plain decimals ($0.00012, never
    1.2e-04), so a small run's nonzero cost never reads as $0.0000; "n/a" for none."""
    if v is None or not math.isfinite(v):
        return "n/a"
    if v == 0 or abs(v) >= 1:
        return f"${v:,.2f}"
    digits = 3 - math.floor(math.log10(abs(v)))  # the decimals that keep four significant digits
    whole, frac = f"{v:.{digits}f}".split(".")
    return f"${whole}.{frac.rstrip('0').ljust(2, '0')}"  # at least cents: $0.10, not $0.1


def _pct(v: float | None) -> str:
    return "n/a" if v is None else f"{100 * v:.1f} %"


def cost_table(summary: dict) -> list[dict]:
    """Rows {"metric", "value"} with readable values, for a Prefect table artifact or printing."""
    p = summary["price"]
    unit = p["unit"]
    src = f"{p['source']} (as of {p['as_of']})"
    rows = [
        ("device", f"{p['device_type']} ({p['instance_type']}, {p['devices_per_instance']} "
                   f"{unit}/instance)"),
        ("shards", f"{summary['shards']:,}"),
        ("images ok", f"{summary['images_ok']:,}"),
        ("images failed", f"{summary['images_failed']:,}"),
        # end to end: from the command's start, start-up included, as the user waited (#49); then the flow's own
        *([("wall time (end to end)", _num(summary["wall_s_end_to_end"], ",.1f", " s")),
           ("images/s (end to end)", _num(summary["images_per_s_end_to_end"], ",.3f")),
           ("start-up (end to end)", _num(summary["startup_s_end_to_end"], ",.1f", " s"))]
          if summary.get("wall_s_end_to_end") is not None else []),
        ("wall time (the flow, this run)", _num(summary["wall_s"], ",.1f", " s")),
        ("images/s (the flow, wall clock)", _num(summary["images_per_s"], ",.3f")),
        ("images/s (the flow, after startup)", _num(summary.get("images_per_s_steady"), ",.3f")),
        (f"images/s per {unit} (every shard)", _num(summary["images_per_s_per_device"], ",.3f")),
        (f"{unit}-seconds allocated", _num(summary["device_seconds_allocated"])),
        (f"{unit}-seconds busy", _num(summary["device_seconds_busy"])),
        (f"model-load {unit}-seconds", _num(summary["model_load_device_seconds"])),
        ("utilization", _pct(summary["utilization"])),
        ("overhead share", _pct(summary["overhead_share"])),
        ("cost on-demand", usd(summary["usd_on_demand"])),
        ("cost spot", usd(summary["usd_spot"])),
        ("$ per 1k images on-demand", usd(summary["usd_per_1k_images_on_demand"])),
        ("$ per 1k images spot", usd(summary["usd_per_1k_images_spot"])),
        (f"price on-demand per {unit}-hour", usd(p["on_demand_usd_per_hour"])),
        (f"price spot per {unit}-hour (typical)", usd(p["spot_usd_per_hour"])),
        ("price source", src),
        *([("price from", p["origin"])] if p.get("origin") else []),
        ("per-shard costs reconcile", "yes" if summary["reconciles"] else "NO"),
    ]
    return [{"metric": m, "value": v} for m, v in rows]


def price_words(price: dict) -> str:
    """A recorded price (summary.json's "price") in a few words, where it came from included."""
    unit = price["unit"]
    spot = price.get("spot_usd_per_hour")
    return (f"{usd(price['on_demand_usd_per_hour'])} per {unit}-hour on demand"
            + (f", {usd(spot)} spot" if spot is not None else ", no spot price")
            + f" ({price['device_type']}; from {price.get('origin') or price['source']})")
