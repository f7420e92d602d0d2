"""What `ssdgen bench` will decode and roughly how long, said when it starts, and how far it is, said a line per
round and batch size when stdout is not a terminal (#49: `--n 2` went on to decode 1,024 quality and 256
fidelity images per decoder, said only in `-h`; off a terminal the bench printed nothing for up to 28 minutes).

The counts are exact: the timed cells (every row, the AR control included, x batch sizes x rounds x n), the
quality sets (`--quality-n` per scored decoder) and the fidelity sets (`--fidelity-n` for AR's reference and
control sets and for each decoder, a calibrated one once per choice it may plan: bench/fidelity.py). The time is
an upper bound from the warm-up: each decoder's one image at batch 1, the slowest batch per image, times its
images. Once a round is timed, the lines say what is left at the measured pace.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from ssdgen.decoders.calibrate import choices
from ssdgen.decoders.spec import DecodeSpec
from ssdgen.output.durations import duration

PHASES = ("timed", "quality", "fidelity")


@dataclass(frozen=True)
class Workload:
    """Images the bench decodes, by phase and by spec ({phase: {spec: images}}), and how they are made up."""

    images: dict
    rows: int  # timed rows per batch size: the decoders, AR if not given, and the AR control
    batch_sizes: int
    rounds: int
    n: int
    quality_n: int
    fidelity_n: int
    quality_decoders: int
    fidelity_sets: int

    def total(self, phase: str | None = None) -> int:
        return sum(sum(self.images[p].values()) for p in ([phase] if phase else PHASES))

    def seconds(self, per_image: dict) -> float:
        """At most this long, each spec at `per_image` seconds (its warm-up image at batch 1)."""
        return sum(k * per_image.get(spec, 0.0) for p in PHASES for spec, k in self.images[p].items())

    def line(self) -> str:
        """What it will decode, in one line."""
        parts = [f"{self.total('timed'):,} timed ({self.rows} rows, the AR control included, x {self.batch_sizes} "
                 f"batch size(s) x {self.rounds} round(s) x {self.n} prompts)"]
        if self.quality_n:
            parts.append(f"{self.total('quality'):,} scored for quality ({self.quality_n:,} for each of "
                         f"{self.quality_decoders} decoder(s): --quality-n)")
        if self.fidelity_n:
            parts.append(f"{self.total('fidelity'):,} for fidelity ({self.fidelity_n:,} for each of "
                         f"{self.fidelity_sets} sets: AR's reference and control, and each decoder's choices: "
                         "--fidelity-n)")
        return f"bench: decodes {self.total():,} images: " + ", ".join(parts)


def workload(named: list[tuple[str, DecodeSpec, str]], quality: list[DecodeSpec], fidelity: list[DecodeSpec],
             n: int, batch_sizes: int, rounds: int, quality_n: int, fidelity_n: int) -> Workload:
    """named: the timed rows (bench.decode.row_names); quality, fidelity: the specs each scores (AR among the
    fidelity ones or not: its two sets are counted once)."""
    timed: dict = {}
    for _, spec, _ in named:
        timed[spec] = timed.get(spec, 0) + rounds * batch_sizes * n
    ar = next(spec for _, spec, role in named if role == "control")
    sets = {ar: 2} | {s: max(1, len(choices(s))) for s in fidelity if s != ar}
    return Workload({"timed": timed, "quality": {s: quality_n for s in quality} if quality_n else {},
                     "fidelity": {s: k * fidelity_n for s, k in sets.items()} if fidelity_n else {}},
                    len(named), batch_sizes, rounds, n, quality_n, fidelity_n, len(quality), sum(sets.values()))


def estimate_line(work: Workload, per_image: dict) -> str:
    """The time the warm-up's pace gives, said as the upper bound it is, with the quick alternative where long."""
    secs = work.seconds(per_image)
    text = (f"bench: at most about {duration(secs)} at the warm-up's pace (one image per decoder at batch 1; "
            "larger batches take less per image)")
    if secs > 600 and (work.quality_n or work.fidelity_n):
        text += "; for a quick look: --n 8 --quality-n 0 --fidelity-n 0"
    return text


@dataclass
class RoundLines:
    """A line per round and batch size of the timing, for a log (stdout not a terminal: no bar to watch)."""

    log: object
    total: int  # images the timing decodes
    rest: int = 0  # images of the quality and fidelity phases after it
    done: int = 0
    t0: float = field(default_factory=time.perf_counter)

    def group_done(self, r: int, rounds: int, bs: int, images: int) -> None:
        self.done += images
        spent = time.perf_counter() - self.t0
        left = spent / self.done * (self.total - self.done)
        after = f"; then {self.rest:,} quality and fidelity images" if self.rest else ""
        todo = f"about {duration(left)} of timing left" if self.done < self.total else "timing done"
        self.log(f"bench: round {r + 1}/{rounds}, batch {bs} timed: {self.done:,}/{self.total:,} timed images in "
                 f"{duration(spent)}, {todo}{after}")
