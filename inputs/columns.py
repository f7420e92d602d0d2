"""The input columns a run carries through to its output: every column of the prompt files that is not one of
ssdgen's own inputs (prompt, prompt_id, seed) is kept with its Arrow type, in images.parquet and in the
WebDataset JSON, as img2dataset keeps them (`--save_additional_columns`): licences and provenance live there.

`--keep-columns` and `--drop-columns` choose (`*`: every extra column; keeping all is the default). The kept
columns are decided once, from the files' footers, before anything starts (`kept_schema`):
- a column that files give with different types is refused, naming both files;
- a kept column whose name is one of the output's own (decoder, image, status, ...) is refused: rename it in
  the input, or drop it;
- a name in `--keep-columns` or `--drop-columns` that no input has is a typo, refused naming the columns there are.
A file without a kept column gives nulls there (`shard_columns`).
"""

from __future__ import annotations

import pyarrow as pa

from .pinned import InputError

OWN = ("prompt", "prompt_id", "seed")  # what ssdgen reads itself (inputs.files); never an extra column
ALL = "*"


def extra_fields(schema: pa.Schema, prompt: str = "prompt") -> tuple[pa.Field, ...]:
    """A file's columns beyond ssdgen's own (`prompt`: the column --prompt-column reads as the prompt), in the
    file's order; a dictionary-encoded column (a pandas categorical) as its values' type, which files agree on
    whatever index width each chose."""
    own = {prompt, *OWN[1:]}
    return tuple(f.with_type(f.type.value_type) if pa.types.is_dictionary(f.type) else f
                 for f in schema if f.name not in own)


def _union(files) -> dict[str, tuple[pa.Field, str]]:
    """Every extra column of the files, first seen first -> (its field, the first file that has it)."""
    seen: dict[str, tuple[pa.Field, str]] = {}
    for f in files:
        for field in f.extra:
            if field.name not in seen:
                seen[field.name] = (field, f.url)
            elif not seen[field.name][0].type.equals(field.type):
                first, url = seen[field.name]
                raise InputError(f"{f.url}: column {field.name!r} has type {field.type}, but {url} has "
                                 f"{first.type}; give it one type in every input, or --drop-columns {field.name}")
    return seen


def _named(names: tuple[str, ...], seen: dict, flag: str) -> list[str]:
    if ALL in names:
        return list(seen)
    for n in names:
        if n not in seen:
            there = ", ".join(seen) or "none beyond prompt, prompt_id and seed"
            raise InputError(f"{flag}: no input has a column {n!r} (extra columns: {there})")
    return list(dict.fromkeys(names))


def kept_schema(files, keep: tuple[str, ...], drop: tuple[str, ...], reserved: frozenset[str]) -> pa.Schema:
    """The extra columns a run keeps, in the inputs' order (or --keep-columns' order), with their types.
    reserved: the output's own column names (output.layout), which a kept column may not take."""
    seen = _union(files)
    kept = _named(keep, seen, "--keep-columns")
    dropped = set(_named(drop, seen, "--drop-columns")) if drop else set()
    fields = [seen[n][0] for n in kept if n not in dropped]
    for field in fields:
        if field.name in reserved:
            raise InputError(f"{seen[field.name][1]}: column {field.name!r} has the name of one of ssdgen's own "
                             f"output columns; rename it in the input, or --drop-columns {field.name}")
    return pa.schema(fields)


def shard_columns(tables: list[pa.Table], schema: pa.Schema) -> pa.Table:
    """The kept columns of a shard's pieces, one table per piece in order -> one table of the schema: a column
    a piece's file lacks is null there."""
    parts = []
    for t in tables:
        names = set(t.column_names)  # once per piece: a list is built on each access (quadratic in wide files)
        cols = [t.column(f.name).cast(f.type) if f.name in names else pa.nulls(t.num_rows, f.type)
                for f in schema]
        parts.append(pa.Table.from_arrays(cols, schema=schema))
    return pa.concat_tables(parts) if parts else schema.empty_table()
