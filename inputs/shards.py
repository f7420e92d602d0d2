"""A run's shards, and reading one.

`Shards` cuts the global row sequence (files in order, rows in order) into consecutive shards of exactly
`shard_size` rows (the last may be shorter), img2dataset-style, on demand (`shards[i]`), from the files'
cumulative row counts: footer metadata only, pure arithmetic, O(files) memory, so the same inputs always give
the same shards (a shard id is a stable unit of work and output across retries and resumes) and a run over
millions of prompts never holds a list of its shards. Rows added to the inputs later (--incremental) form a
segment of their own, numbered after the shards before it (inputs.growth), so no committed shard moves.

`read_shard` reads one shard's rows (`read_shard_columns` also the input columns the run keeps: inputs.columns),
touching only the row groups that overlap it, in record batches through a `RowReader` (inputs.row_reader):
memory is bounded whatever the size of a row group, a row group is decoded about once however many shards it
holds, and every read is of the content the run pinned at its start (inputs.pinned). Bad rows (null prompt,
invalid UTF-8) come back as `Row`s with `error` set; they never fail the shard. Storage errors are raised as-is
(OSError, ...) so the caller can retry them as transient; a changed input is an InputError naming the file.
"""

from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from ssdgen.inputs.columns import shard_columns
from ssdgen.inputs.files import InputFile, derive_prompt_id, derive_seed, prompt_ids_as_text
from ssdgen.inputs.row_reader import RowReader


@dataclass(frozen=True)
class Piece:
    file: int   # index into the planned files list
    start: int  # first row, inclusive
    stop: int   # last row, exclusive


@dataclass(frozen=True)
class Shard:
    id: int
    pieces: tuple[Piece, ...]

    @property
    def rows(self) -> int:
        return sum(p.stop - p.start for p in self.pieces)

    def to_dict(self) -> dict:
        """JSON-able form, e.g. {"id": 3, "pieces": [[0, 3000, 3500], [1, 0, 500]]}."""
        return {"id": self.id, "pieces": [[p.file, p.start, p.stop] for p in self.pieces]}

    @classmethod
    def from_dict(cls, d: dict) -> "Shard":
        return cls(id=int(d["id"]), pieces=tuple(Piece(int(f), int(a), int(b)) for f, a, b in d["pieces"]))


Range = tuple[str, int, int]  # (file URL, first row, stop row): a segment's part, as _config.json records it


class Shards:
    """Shard i of the files for any i, computed when asked. The layout is a list of segments, each a sequence of row
    ranges of files: the first run's is every file whole, in URL order; an --incremental run over grown inputs
    appends one over only the rows added since (inputs.growth), so a committed shard never moves. Within a
    segment, shards are consecutive runs of `shard_size` rows (its last may be shorter; a shard may span files);
    a segment's shards are numbered after the previous segments'. Binary search over the segments' first shards
    and the parts' first rows (empty ranges contribute no pieces). `segments`: ranges by file URL (None: one
    segment of every file whole). `len(plan)` is the number of shards."""

    def __init__(self, files: list[InputFile], shard_size: int, segments: list[list[Range]] | None = None):
        if isinstance(shard_size, bool) or not isinstance(shard_size, int) or shard_size < 1:
            raise ValueError(f"shard_size must be a positive integer, got {shard_size!r}")
        self.files, self.shard_size = files, shard_size
        if segments is None:  # by index: a list may name one URL twice (tests, benchmarks)
            parts = [[(k, 0, f.num_rows) for k, f in enumerate(files)]]
        else:
            index = {f.url: k for k, f in enumerate(files)}
            missing = sorted({url for seg in segments for url, _, _ in seg if url not in index})
            if missing:
                raise ValueError(f"the recorded shard plan names {missing[0]}, which is not among the inputs")
            parts = [[(index[url], int(a), int(b)) for url, a, b in seg] for seg in segments]
        for k, a, b in (p for seg in parts for p in seg):
            if not 0 <= a <= b <= files[k].num_rows:
                raise ValueError(f"the recorded shard plan reads rows [{a}, {b}) of {files[k].url}, which has "
                                 f"{files[k].num_rows}")
        self.parts = [[p for p in seg if p[2] > p[1]] for seg in parts]
        self.starts = [list(itertools.accumulate((b - a for _, a, b in seg), initial=0)) for seg in self.parts]
        self.first = list(itertools.accumulate((-(-s[-1] // shard_size) for s in self.starts), initial=0))
        self.rows = sum(s[-1] for s in self.starts)

    def __len__(self) -> int:
        return self.first[-1]

    def _locate(self, i: int) -> tuple[int, int, int]:
        """(segment, first row, stop row) of shard i, rows counted within its segment."""
        if not 0 <= i < len(self):
            raise IndexError(f"shard {i} outside 0..{len(self) - 1}")
        s = bisect.bisect_right(self.first, i) - 1
        lo = (i - self.first[s]) * self.shard_size
        return s, lo, min(lo + self.shard_size, self.starts[s][-1])

    def rows_of(self, i: int) -> int:
        """Shard i's row count: `shard_size`, less for a segment's last shard."""
        _, lo, hi = self._locate(i)
        return hi - lo

    def __getitem__(self, i: int) -> Shard:
        s, lo, hi = self._locate(i)
        parts, starts = self.parts[s], self.starts[s]
        k = bisect.bisect_right(starts, lo) - 1  # the last part starting at or before lo
        pieces = []
        while lo < hi:
            f, first, _ = parts[k]
            stop = min(hi, starts[k + 1])
            pieces.append(Piece(f, first + lo - starts[k], first + stop - starts[k]))
            lo, k = stop, k + 1
        return Shard(i, tuple(pieces))


def recorded_segments(inputs: list[dict], segments: list | None) -> list[list[Range]]:
    """The plan's segments as a run's `_config.json` records them: its `segments`, or (a run that never grew,
    or one recorded before segments were) one segment of every recorded input whole."""
    if segments:
        return [[(str(u), int(a), int(b)) for u, a, b in seg] for seg in segments]
    return [[(i["url"], 0, int(i["rows"])) for i in inputs]]


def shard_count(segments: list[list[Range]], shard_size: int) -> int:
    """How many shards the segments make: what `status` counts without listing the inputs."""
    return sum(-(-sum(b - a for _, a, b in seg) // shard_size) for seg in segments)


@dataclass
class Row:
    prompt_id: str
    prompt: str | None  # None when the row is bad
    seed: int
    error: str | None   # per-row problem; the row becomes an error row downstream, the shard goes on


def _read_piece(f: InputFile, piece: Piece, reader: RowReader) -> pa.Table:
    """Rows [start, stop) of one file (start < stop), reading only the overlapping row groups and our columns."""
    if not 0 <= piece.start < piece.stop <= f.num_rows:
        raise ValueError(f"{f.url}: piece rows [{piece.start}, {piece.stop}) outside 0..{f.num_rows}")
    offsets = list(itertools.accumulate(f.row_groups, initial=0))
    first = bisect.bisect_right(offsets, piece.start) - 1
    last = bisect.bisect_left(offsets, piece.stop) - 1  # last group holding row stop-1
    batches: list[pa.RecordBatch] = []
    for g in range(first, last + 1):
        lo, hi = max(piece.start, offsets[g]), min(piece.stop, offsets[g + 1])
        if lo < hi:  # an empty row group holds nothing
            batches += reader.read(f, g, lo - offsets[g], hi - offsets[g])
    table = pa.Table.from_batches(batches)
    if f.prompt_column != "prompt":  # --prompt-column: read as the prompt from here on
        table = table.rename_columns(["prompt" if c == f.prompt_column else c for c in table.column_names])
    return table


def _as_bytes(column: pa.ChunkedArray) -> list[bytes | None]:
    # Casting string -> binary skips UTF-8 validation, so each value can be decoded (and fail) alone.
    target = pa.large_binary() if pa.types.is_large_string(column.type) else pa.binary()
    if pa.types.is_dictionary(column.type) or pa.types.is_string_view(column.type):
        column, target = pc.cast(column, pa.large_string()), pa.large_binary()
    return pc.cast(column, target).to_pylist()


def _decode(value: bytes, name: str) -> tuple[str, str | None]:
    try:
        return value.decode("utf-8"), None
    except UnicodeDecodeError as e:
        # The id must still be a string; backslash escapes keep it readable in error rows.
        return value.decode("utf-8", "backslashreplace"), f"{name} is not valid UTF-8 (byte {e.start})"


def read_shard(files: list[InputFile], shard: Shard, run_seed: int,
               storage_options: dict | None = None, reader: RowReader | None = None) -> list[Row]:
    """The shard's rows in order (`read_shard_columns` without the kept columns)."""
    return read_shard_columns(files, shard, run_seed, storage_options, reader)[0]


def read_shard_columns(files: list[InputFile], shard: Shard, run_seed: int, storage_options: dict | None = None,
                       reader: RowReader | None = None, kept: pa.Schema | None = None) -> tuple[list[Row], pa.Table]:
    """(The shard's rows in order, the input columns the run keeps for them: a table of `kept`, a row per Row).
    prompt_id: the column's value as text, else derived from (file, row). seed: the column's value, else
    derive_seed(run_seed, prompt_id); a null seed or null prompt_id is derived the same way (a null is "not
    given", not an error). reader: the run's (shared by its I/O threads, reading `kept`'s columns), else one of
    the shard's own, with `storage_options`."""
    kept = kept if kept is not None else pa.schema([])
    if reader is None:
        own = RowReader(storage_options, extra=tuple(kept.names))
        try:
            return read_shard_columns(files, shard, run_seed, reader=own, kept=kept)
        finally:
            own.close()
    out: list[Row] = []
    tables: list[pa.Table] = []
    for piece in shard.pieces:
        f = files[piece.file]
        if piece.start == piece.stop:
            continue
        table = _read_piece(f, piece, reader)
        out += _rows(f, piece, table, run_seed)
        tables.append(table)
    return out, shard_columns(tables, kept)


def _rows(f: InputFile, piece: Piece, table: pa.Table, run_seed: int) -> list[Row]:
    n = piece.stop - piece.start
    prompts = _as_bytes(table.column("prompt"))
    ids = _as_bytes(prompt_ids_as_text(table.column("prompt_id"))) if f.has_prompt_id else [None] * n
    seeds = table.column("seed").to_pylist() if f.has_seed else [None] * n
    out = []
    for k in range(n):
        errors = []
        if ids[k] is None:
            prompt_id = derive_prompt_id(f.url, piece.start + k)
        else:
            prompt_id, err = _decode(ids[k], "prompt_id")
            errors += [err] if err else []
        if prompts[k] is None:
            prompt, err = None, "prompt is null"
        else:
            prompt, err = _decode(prompts[k], "prompt")
            prompt = None if err else prompt
        errors += [err] if err else []
        seed = seeds[k] if seeds[k] is not None else derive_seed(run_seed, prompt_id)
        out.append(Row(prompt_id=prompt_id, prompt=prompt, seed=seed, error="; ".join(errors) or None))
    return out
