"""Seconds for people, with the digits that matter: "0.42 s", "12 s", "3.4 min", "1.2 h" (never "0.0 min": #49's
dry run printed that for a small run). Used where a command says how long something takes or took (the dry run's
estimate, the bench's workload)."""

from __future__ import annotations


def duration(seconds: float) -> str:
    if seconds < 10:
        return f"{seconds:.2g} s"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.2g} min" if seconds < 600 else f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.2g} h"
