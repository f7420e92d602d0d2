"""Inputs read as users wrote them (#49): a wide file costs linear time, text files split and decode as written, a
missing file is said to be missing, and the same file or model named another way is the same on resume."""

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ssdgen.inputs.files import list_inputs, with_identities
from ssdgen.inputs.plan import ShardPlan, read_shard_columns
from ssdgen.inputs.text import ReadAs


def _read(paths, read_as: ReadAs | None = None, keep_all: bool = True) -> tuple[list, list]:
    """(rows as (prompt_id, prompt, seed, error), kept columns as dicts) of every shard of the files."""
    files = with_identities(list_inputs([str(p) for p in paths], read_as=read_as or ReadAs()))
    plan = ShardPlan(files, 4)
    kept = pa.schema(list(files[0].extra) if keep_all else [])
    rows, cols = [], []
    for i in range(len(plan)):
        got, table = read_shard_columns(files, plan[i], 0, kept=kept)
        rows += [(r.prompt_id, r.prompt, r.seed, r.error) for r in got]
        cols += table.to_pylist()
    return rows, cols


def _one_line(e: pytest.ExceptionInfo, *words: str) -> None:
    text = str(e.value)
    assert "\n" not in text and all(w in text for w in words), text


# ---- item 1: a wide file -----------------------------------------------------------------------------------

def test_a_wide_file_reads_its_schema_once_per_cursor_not_once_per_column(tmp_path, monkeypatch):
    """8 prompts with 2,000 extra columns: the rows of a shard read the file's Arrow schema once (pyarrow rebuilds
    it on each access: 23.5 ms at 20,003 columns, so once per kept column was minutes per shard)."""
    width = 2_000
    columns = {"prompt": [f"p{i}" for i in range(8)]} | {f"c{k}": list(range(8)) for k in range(width)}
    pq.write_table(pa.table(columns), tmp_path / "wide.parquet")
    files = with_identities(list_inputs([str(tmp_path / "wide.parquet")]))
    kept = pa.schema(list(files[0].extra))
    assert len(kept) == width
    reads = []
    schema_arrow = pq.ParquetFile.schema_arrow
    monkeypatch.setattr(pq.ParquetFile, "schema_arrow", property(lambda pf: reads.append(1) or schema_arrow.fget(pf)))
    rows, table = read_shard_columns(files, ShardPlan(files, 8)[0], 0, kept=kept)
    assert [r.prompt for r in rows] == [f"p{i}" for i in range(8)]
    assert table.num_columns == width and table.column("c1999").to_pylist() == list(range(8))
    assert len(reads) <= 1, f"the schema was read {len(reads)} times for one shard of one file"
