"""The format registry: a `Format` per output format, registered by name (formats/__init__.py lists them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import pyarrow as pa

STATS = "stats"  # every shard's statistics file (stats.parquet), whatever the format
BOTH = ("parquet", "webdataset")  # what `--format both` writes


@dataclass(frozen=True)
class Format:
    """One output format. `kind` is the file kind its marker records (output.marker: a file's stem, or its
    extension when the stem is the shard number) and names its manifest columns ({kind}_url, {kind}_sha256). A
    format a run does not write (`run=False`: an export's, such as hf) is only built by `ssdgen export`."""

    name: str  # the --format value
    kind: str
    file_name: Callable[[int], str]  # shard -> its file's name in an attempt folder
    # (shard, images table, stats table, shard size) -> (the file's bytes, the rows in it)
    encode: Callable[[int, pa.Table, pa.Table, int], tuple[bytes, int]]
    export_name: Callable[[int], str]  # shard -> its file's path in an export folder
    # shard -> the statistics' path beside it in an export folder; None: the format's file holds them
    stats_export_name: Callable[[int], str] | None
    read_images: Callable[[object], list[dict]] | None = None  # an open file -> its image rows (IMAGE_COLS)
    run: bool = True  # a run's --format may name it (else only `ssdgen export --format`)
    # the export folder's dataset card (output.card): the data files of its default config, and of its
    # statistics config, as globs `datasets.load_dataset(folder)` reads (None: no such config)
    card_files: str | None = None
    card_stats: str | None = None

    @property
    def manifest_columns(self) -> tuple[str, str]:
        return f"{self.kind}_url", f"{self.kind}_sha256"


FORMATS: dict[str, Format] = {}


def register(fmt: Format) -> Format:
    """Add a format (or replace one of the same name); returns it."""
    FORMATS[fmt.name] = fmt
    return fmt


def run_formats(name: str) -> list[Format]:
    """The formats a run's --format writes: one registered name, or `both` (parquet and webdataset)."""
    check_format(name)
    return [FORMATS[n] for n in BOTH] if name == "both" else [FORMATS[name]]


def written() -> list[Format]:
    """The formats a run can write (each has its manifest columns and marker kind)."""
    return [f for f in FORMATS.values() if f.run]


def check_format(name: str) -> None:
    """Reject an unknown --format of a run (a user error, before any work starts)."""
    names = [f.name for f in written()]
    if name != "both" and name not in names:
        raise ValueError(f"--format must be one of {', '.join([*names, 'both'])}, got {name!r}")


def check_export_format(name: str) -> None:
    if name not in FORMATS:
        raise ValueError(f"--format must be one of {', '.join(FORMATS)}, got {name!r}")


def write_shard(out, attempt: str, shard: int, images: pa.Table, stats: pa.Table, fmt: str,
                shard_size: int) -> list[dict]:
    """Write a shard's data files for `--format fmt` under `attempt` (a folder from `Output.new_attempt`):
    each format's file and the statistics; returns their records for the commit marker. Nothing here is visible
    to readers until the marker names it."""
    files = []
    for f in run_formats(fmt):
        data, rows = f.encode(shard, images, stats, shard_size)
        files.append(out.store.write_bytes(f"{attempt}/{f.file_name(shard)}", data, rows))
    files.append(out.store.write_table(f"{attempt}/{STATS}.parquet", stats))
    return files
