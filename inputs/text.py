"""Prompt files that are not Parquet: CSV, TSV, JSON (an array of objects), JSON Lines and plain text (one prompt a
line), the inputs img2dataset reads, at any fsspec URL; `.gz` of any of them.

The format is the `--input-format` the user gives, else the file's suffix (`ReadAs.format_of`); a folder is listed
for that format's suffixes (Parquet's when none is given, so a README.txt next to the data is never a prompt file).

Parquet is read in place by row group (inputs.row_reader). A text file has no footer and no row groups: it is
parsed whole (`parse`), at listing for its columns and rows, and again by each reader at the content the run
pinned, and the reader holds the table while the run reads it: a CSV of a million 100-byte prompts is about 150 MB
of Arrow. Inputs much larger than memory belong in Parquet.

The prompt and prompt_id columns are read as text whatever they look like (a CSV of numbers is still prompts);
seeds are integers as the file gives them. A parse error is one line naming the file (and the row where the
parser says it).
"""

from __future__ import annotations

import gzip
import json
import posixpath
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.json as pjson

from .pinned import InputError

FORMATS = ("parquet", "csv", "tsv", "json", "jsonl", "txt")
SUFFIXES = {".parquet": "parquet", ".pq": "parquet", ".csv": "csv", ".tsv": "tsv", ".json": "json",
            ".jsonl": "jsonl", ".ndjson": "jsonl", ".txt": "txt"}
COMPRESSED = ".gz"


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
            return _lines(data, url, prompt_column)
        if fmt == "json" and data.lstrip()[:1] == b"[":
            return _array(data, url)
        return pjson.read_json(pa.BufferReader(data))  # JSON Lines (a .json file that is not an array is read so)
    except InputError:
        raise
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise InputError(f"{url}: not a {fmt.upper()} file ({first})") from None


def _csv(data: bytes, delimiter: str, prompt_column: str) -> pa.Table:
    if not data.strip():
        return pa.table({prompt_column: pa.array([], pa.string())})
    text = {prompt_column: pa.string(), "prompt_id": pa.string()}  # ids as written: "007" stays "007"
    return pcsv.read_csv(pa.BufferReader(data), parse_options=pcsv.ParseOptions(delimiter=delimiter,
                                                                                  newlines_in_values=True),
                         convert_options=pcsv.ConvertOptions(column_types=text))


def _lines(data: bytes, url: str, prompt_column: str) -> pa.Table:
    """One prompt a line; blank lines are skipped (a row is the n-th prompt, counted from 0)."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        raise InputError(f"{url}: line {line} is not valid UTF-8 (byte {e.start})") from None
    return pa.table({prompt_column: pa.array([s for s in text.splitlines() if s.strip()], pa.string())})


def _array(data: bytes, url: str) -> pa.Table:
    """A JSON array of objects, a row each."""
    rows = json.loads(data)
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise InputError(f"{url}: row {i} is a {type(row).__name__}, expected an object with a prompt")
    return pa.Table.from_pylist(rows)
