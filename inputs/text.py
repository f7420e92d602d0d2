"""Prompt files that are not Parquet: CSV, TSV, JSON (an array of objects), JSON Lines and plain text (one prompt a
line), the inputs img2dataset reads, at any fsspec URL; `.gz` of any of them.

The format is the `--input-format` the user gives, else the file's suffix (`ReadAs.format_of`); a folder is listed
for that format's suffixes (Parquet's when none is given, so a README.txt next to the data is never a prompt file).

Parquet is read in place by row group (inputs.row_reader). A text file has no footer and no row groups: it is
parsed whole (`parse`), at listing for its columns and rows, and again by each reader at the content the run
pinned, and the reader holds the table while the run reads it: a CSV of a million 100-byte prompts is about 150 MB
of Arrow. Inputs much larger than memory belong in Parquet.

The prompt and prompt_id columns are read as text whatever they look like (a CSV of numbers is still prompts);
seeds are integers as the file gives them. Text is read as its user wrote it: a line of a `.txt` ends at a line feed
or CR LF only (a U+2028, NEL or form feed is part of the prompt), a UTF-8 byte order mark is skipped, and a prompt or
prompt_id that is not valid UTF-8 is kept as its bytes, so that inputs.shards makes its row an error row as it does a
Parquet file's (the rest of the file is read). A parse error is one line naming the file (and the row where the
parser says it); so is JSON nested deeper than `MAX_DEPTH`, which is refused before pyarrow's reader, which
recurses once per level, can crash the process (past about 5,000 levels).
"""

from __future__ import annotations

import gzip
import json
import posixpath
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.json as pjson

from .pinned import InputError

FORMATS = ("parquet", "csv", "tsv", "json", "jsonl", "txt")
SUFFIXES = {".parquet": "parquet", ".pq": "parquet", ".csv": "csv", ".tsv": "tsv", ".json": "json",
            ".jsonl": "jsonl", ".ndjson": "jsonl", ".txt": "txt"}
COMPRESSED = ".gz"
BOM = b"\xef\xbb\xbf"  # a UTF-8 byte order mark, which Windows editors write
# How deep a JSON row may nest (the row itself is level 1): the images.parquet that carries its columns must read
# back, and Parquet readers refuse a schema over 100 levels (a list takes two).
MAX_DEPTH = 32
CHUNK = 16 << 20  # bytes scanned at a time for JSON Lines' brackets: bounds the scan's temporary arrays


@dataclass(frozen=True)
class ReadAs:
    """How a run reads its prompt files: their format (None: by suffix) and the column that holds the prompt."""

    format: str | None = None
    prompt_column: str = "prompt"

    def __post_init__(self):
        if self.format is not None and self.format not in FORMATS:
            raise InputError(f"--input-format must be one of {', '.join(FORMATS)}, got {self.format!r}")
        if not self.prompt_column.strip():
            raise InputError("--prompt-column must name a column")

    def format_of(self, url: str) -> str:
        if self.format is not None:
            return self.format
        fmt = SUFFIXES.get(_suffix(url))
        if fmt is None:
            raise InputError(f"{url}: cannot tell the input format from the file's name; give --input-format "
                             f"({', '.join(FORMATS)})")
        return fmt

    def takes(self, path: str) -> bool:
        """Whether listing a folder takes this file: the given format's suffixes, else Parquet's."""
        return SUFFIXES.get(_suffix(path)) == (self.format or "parquet")


def _suffix(path: str) -> str:
    stem = path.lower()
    if stem.endswith(COMPRESSED):
        stem = stem[:-len(COMPRESSED)]
    return posixpath.splitext(posixpath.basename(stem))[1]


def parse(data: bytes, fmt: str, url: str, prompt_column: str) -> pa.Table:
    """The file's bytes as a table; raises InputError naming the file."""
    if url.lower().endswith(COMPRESSED):
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as e:
            raise InputError(f"{url}: not a gzip file ({e})") from None
    try:
        if fmt in ("csv", "tsv"):
            return _csv(data, "\t" if fmt == "tsv" else ",", prompt_column)
        if fmt == "txt":
            return _lines(data, prompt_column)
        if fmt == "json" and data.removeprefix(BOM).lstrip()[:1] == b"[":
            return _array(data, url)
        _check_line_depth(data, url)
        return pjson.read_json(pa.BufferReader(data))  # JSON Lines (a .json file that is not an array is read so)
    except InputError:
        raise
    except RecursionError:  # Python's json parser, past its recursion limit
        raise InputError(f"{url}: nested more than {MAX_DEPTH} levels deep") from None
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise InputError(f"{url}: not a {fmt.upper()} file ({first})") from None


def _csv(data: bytes, delimiter: str, prompt_column: str) -> pa.Table:
    if not data.strip():
        return pa.table({prompt_column: pa.array([], pa.string())})
    # Read as bytes, ids as written ("007" stays "007"): pyarrow refuses a whole file for one invalid UTF-8 string.
    own = {prompt_column: pa.binary(), "prompt_id": pa.binary()}
    table = pcsv.read_csv(pa.BufferReader(data), parse_options=pcsv.ParseOptions(delimiter=delimiter,
                                                                                   newlines_in_values=True),
                          convert_options=pcsv.ConvertOptions(column_types=own))
    for i, name in enumerate(table.column_names):
        if name in own:
            table = table.set_column(i, name, _unchecked(table.column(i)))
    return table


def _unchecked(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """Binary values as text, unchecked: a value that is not UTF-8 stays as it is, for inputs.shards to refuse."""
    text = pa.large_string() if pa.types.is_large_binary(column.type) else pa.string()
    return pa.chunked_array([c.view(text) for c in column.chunks], text)


def _lines(data: bytes, prompt_column: str) -> pa.Table:
    """One prompt a line, ended by a line feed or CR LF only (str.splitlines would also split at U+2028, NEL, form
    feeds...); blank lines are skipped (a row is the n-th prompt, counted from 0)."""
    lines = (s.removesuffix(b"\r") for s in data.removeprefix(BOM).split(b"\n"))
    kept = [s for s in lines if s.decode("utf-8", "replace").strip()]
    return pa.table({prompt_column: _unchecked(pa.chunked_array([pa.array(kept, pa.large_binary())]))})


def _array(data: bytes, url: str) -> pa.Table:
    """A JSON array of objects, a row each."""
    rows = json.loads(data)  # bytes: a byte order mark is skipped
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise InputError(f"{url}: row {i} is a {type(row).__name__}, expected an object with a prompt")
    table = pa.Table.from_pylist(rows)
    for field in table.schema:
        if 1 + _type_depth(field.type) > MAX_DEPTH:
            raise InputError(f"{url}: column {field.name!r} is nested more than {MAX_DEPTH} levels deep")
    return table


def _type_depth(t: pa.DataType) -> int:
    """How many levels of lists and structs a type nests."""
    return 1 + max(_type_depth(t.field(i).type) for i in range(t.num_fields)) if t.num_fields else 0


def _check_line_depth(data: bytes, url: str) -> None:
    """Refuse a JSON line nested more than MAX_DEPTH deep, naming it. A line can be only if it holds more than
    MAX_DEPTH opening brackets, counted for every line at once; only those lines are parsed here."""
    if data.count(b"[") + data.count(b"{") <= MAX_DEPTH:
        return
    raw = np.frombuffer(data, np.uint8)
    opens, ends = [], []
    for lo in range(0, len(raw), CHUNK):
        part = raw[lo:lo + CHUNK]
        opens.append(np.flatnonzero((part == ord("[")) | (part == ord("{"))) + lo)
        ends.append(np.flatnonzero(part == ord("\n")) + lo)
    ends = np.concatenate(ends)
    for i in np.flatnonzero(np.bincount(np.searchsorted(ends, np.concatenate(opens))) > MAX_DEPTH).tolist():
        line = data[ends[i - 1] + 1 if i else 0:ends[i] if i < len(ends) else len(data)]
        if _line_depth(line) > MAX_DEPTH:
            raise InputError(f"{url}: line {i + 1} is nested more than {MAX_DEPTH} levels deep")


def _line_depth(line: bytes) -> int:
    """How deep one line's JSON value nests: parsed by Python's json (which stops at its recursion limit), else, for
    a line it cannot parse, by its brackets outside strings."""
    try:
        level = [json.loads(line)]
    except RecursionError:
        return MAX_DEPTH + 1
    except ValueError:
        return _bracket_depth(line)
    depth = 0
    while containers := [x for x in level if isinstance(x, (list, dict))]:
        depth += 1
        level = [v for x in containers for v in (x.values() if isinstance(x, dict) else x)]
    return depth


def _bracket_depth(line: bytes) -> int:
    """The deepest bracket of a line outside its strings, stopping once past MAX_DEPTH."""
    depth = deepest = 0
    in_string = escaped = False
    for b in line:
        if in_string:
            escaped, in_string = (False, True) if escaped else (b == 0x5C, b != 0x22)
        elif b == 0x22:
            in_string = True
        elif b in b"[{":
            depth += 1
            deepest = max(deepest, depth)
            if deepest > MAX_DEPTH:
                break
        elif b in b"]}":
            depth -= 1
    return deepest
