"""Inputs read as users wrote them (#49): a wide file costs linear time, text files split and decode as written, a
missing file is said to be missing, and the same file or model named another way is the same on resume."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_operations import one_error, ssdgen

from ssdgen.inputs.files import InputError, list_inputs, with_identities
from ssdgen.inputs.shards import Shards, read_shard_columns
from ssdgen.inputs.text import BOM, ReadAs


def _read(paths, read_as: ReadAs | None = None, keep_all: bool = True) -> tuple[list, list]:
    """(rows as (prompt_id, prompt, seed, error), kept columns as dicts) of every shard of the files."""
    files = with_identities(list_inputs([str(p) for p in paths], read_as=read_as or ReadAs()))
    plan = Shards(files, 4)
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
    rows, table = read_shard_columns(files, Shards(files, 8)[0], 0, kept=kept)
    assert [r.prompt for r in rows] == [f"p{i}" for i in range(8)]
    assert table.num_columns == width and table.column("c1999").to_pylist() == list(range(8))
    assert len(reads) <= 1, f"the schema was read {len(reads)} times for one shard of one file"


# ---- item 2: text inputs as their users wrote them -------------------------------------------------------------

def test_a_text_line_ends_at_a_newline_only_and_a_bom_is_skipped(tmp_path):
    """U+2028, NEL, a form feed, a vertical tab and a lone CR are part of a prompt (str.splitlines split at each)."""
    (tmp_path / "p.txt").write_bytes(BOM + "a red fox\u2028by the sea\nthe \x85sky\x0cat\x0bnight\r\n\r\nx\ry\n"
                                     "\u2028\n".encode())
    rows, _ = _read([tmp_path / "p.txt"])
    assert [r[1] for r in rows] == ["a red fox\u2028by the sea", "the \x85sky\x0cat\x0bnight", "x\ry"]


def test_a_json_array_after_a_byte_order_mark_is_read_as_an_array(tmp_path):
    rows = [{"prompt": f"p{i}", "prompt_id": f"id{i}", "seed": i} for i in range(5)]
    (tmp_path / "p.json").write_bytes(BOM + b"\n " + json.dumps(rows).encode())
    (tmp_path / "q.json").write_text(json.dumps(rows))
    assert _read([tmp_path / "p.json"]) == _read([tmp_path / "q.json"])


@pytest.mark.parametrize("suffix, sep", [(".csv", b","), (".tsv", b"\t")])
def test_an_invalid_utf8_csv_row_is_an_error_row_and_the_others_are_read(tmp_path, suffix, sep):
    """As a Parquet file's (inputs.shards): the row is an error row (workers/results.py BAD_INPUT) under its own id."""
    lines = [b"prompt,prompt_id,seed,note", b"a red fox,007,1,x", b"the s\xffa,k1,2,y", b"night,k\xfe2,3,z",
             b"a cat,k3,4,\xff"]
    (tmp_path / f"p{suffix}").write_bytes(b"\n".join(line.replace(b",", sep) for line in lines) + b"\n")
    rows, cols = _read([tmp_path / f"p{suffix}"])
    assert rows[0] == ("007", "a red fox", 1, None)
    assert rows[1] == ("k1", None, 2, "prompt is not valid UTF-8 (byte 5)")
    assert rows[2] == ("k\\xfe2", "night", 3, "prompt_id is not valid UTF-8 (byte 1)")
    assert rows[3] == ("k3", "a cat", 4, None)  # an extra column is kept as the bytes it holds
    assert [c["note"] for c in cols] == [b"x", b"y", b"z", b"\xff"]


def test_an_invalid_utf8_text_line_is_an_error_row(tmp_path):
    (tmp_path / "p.txt").write_bytes(b"a red fox\nthe s\xffa\nnight\n")
    rows, _ = _read([tmp_path / "p.txt"])
    assert [(r[1], r[3]) for r in rows] == [("a red fox", None), (None, "prompt is not valid UTF-8 (byte 5)"),
                                            ("night", None)]


@pytest.mark.parametrize("name, text, words", [
    ("deep.json", b"[" * 100_000 + b"]" * 100_000, ["deep.json: nested more than 32 levels deep"]),
    ("col.json", b'[{"prompt": "a", "x": ' + b"[" * 40 + b"1" + b"]" * 40 + b"}]",
     ["col.json: column 'x' is nested more than 32 levels deep"]),
    ("deep.jsonl", b'{"prompt": "a"}\n{"prompt": "b", "x": ' + b"[" * 40 + b"]" * 40 + b"}\n",
     ["deep.jsonl: line 2 is nested more than 32 levels deep"]),
])
def test_deep_json_is_one_line_naming_the_file(tmp_path, name, text, words):
    (tmp_path / name).write_bytes(text)
    with pytest.raises(InputError) as e:
        list_inputs([str(tmp_path / name)])
    _one_line(e, *words)


def test_json_lines_with_many_brackets_that_nest_shallow_are_read(tmp_path):
    """Only the depth counts: a list of 50 objects, 100 brackets in a string, a valid 32-deep value."""
    rows = [{"prompt": "a", "boxes": [{"x": i} for i in range(50)], "note": "[" * 100},
            {"prompt": "b", "boxes": [], "note": "{", "deep": json.loads("[" * 31 + "]" * 31)}]
    (tmp_path / "p.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    got, _ = _read([tmp_path / "p.jsonl"], keep_all=False)
    assert [r[1] for r in got] == ["a", "b"]


@pytest.mark.integration
def test_generate_says_one_line_for_deep_json_lines_and_a_missing_csv(tmp_path):
    """pyarrow's JSON reader crashed the process (a segfault) on a line 100,000 deep; a missing .csv was said to be
    'no Parquet files matched'."""
    (tmp_path / "deep.jsonl").write_bytes(b'{"prompt": "a", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n")
    proc = ssdgen("generate", "--prompts", str(tmp_path / "deep.jsonl"), "--out", str(tmp_path / "run"),
                  "--dry-run", "--no-progress")
    one_error(proc, "deep.jsonl: line 1 is nested more than 32 levels deep")
    for name in ("nightly.csv", "nightly.jsonl"):
        proc = ssdgen("generate", "--prompts", str(tmp_path / name), "--out", str(tmp_path / "run"), "--dry-run",
                      "--no-progress")
        one_error(proc, f"{tmp_path / name}: no such file or folder")
    assert not (tmp_path / "run").exists()


# ---- item 3: a missing file --------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["nightly.csv", "nightly.jsonl", "nightly.parquet", "in/nightly.txt"])
def test_a_missing_input_is_said_to_be_missing_whatever_its_format(tmp_path, name):
    with pytest.raises(InputError) as e:
        list_inputs([str(tmp_path / name)])
    assert str(e.value) == f"{tmp_path / name}: no such file or folder"


# ---- item 4: one file or model, however it is written ---------------------------------------------------------

def _twin_paths(tmp_path):
    """The prompts at tmp_path/data/p.csv, and a folder `fresh` beside it to write `fresh/../p.csv` through."""
    data = tmp_path / "data"
    (data / "fresh").mkdir(parents=True)
    (data / "p.csv").write_text("prompt,prompt_id\na red fox,1\nthe sea,2\n")
    return data


def test_an_input_path_is_recorded_one_way_however_it_is_written(tmp_path, monkeypatch):
    data = _twin_paths(tmp_path)
    url = list_inputs([str(data / "p.csv")])[0].url
    monkeypatch.chdir(data / "fresh")
    for spelled in (f"{data}/fresh/../p.csv", f"{data}//./p.csv", "../p.csv", f"file://{data}/fresh/../p.csv",
                    f"{data}/fresh/../"):
        assert [f.url for f in list_inputs([spelled], read_as=ReadAs("csv"))] == [url], spelled
    # `..` after a symbolic link is the link target's parent, as the operating system opens it
    (tmp_path / "elsewhere" / "deep").mkdir(parents=True)
    (tmp_path / "elsewhere" / "p.csv").write_text("prompt\nanother\n")
    (data / "link").symlink_to(tmp_path / "elsewhere" / "deep")
    files = list_inputs([f"{data}/link/../p.csv"])
    assert files[0].url == f"file://{tmp_path}/elsewhere/p.csv" and files[0].num_rows == 1


def test_a_resume_through_another_spelling_of_the_prompts_and_model_is_the_same_run(tmp_path):
    """The comparison a resume makes (flows.prepare: Output.check_config, pinned): `fresh/../p.csv` is the file the
    run started on, and `reference:/m/` its model."""
    from ssdgen.flows.settings import RunSettings
    from ssdgen.output.layout import Output
    data = _twin_paths(tmp_path)
    runs = []
    for prompts, model in ((f"{data}/p.csv", f"reference:{tmp_path}/m"), (f"{data}/fresh/../p.csv",
                                                                         f"reference:{tmp_path}/m/")):
        cfg = RunSettings(prompts=(prompts,), out=str(tmp_path / "run"), model=model)
        runs.append(cfg.recorded(with_identities(list_inputs([prompts]))))
    assert runs[1]["model"] == f"reference:{tmp_path}/m"
    assert Output(str(tmp_path / "run")).check_config(runs[1], runs[0], pinned=True) is None


@pytest.mark.integration
@pytest.mark.usefixtures("prefect_server", "local_ray")
def test_generate_resumes_a_run_named_through_dot_dot_and_a_trailing_slash(tmp_path):
    from pipeline_helpers import run_flow

    from ssdgen.reference.tiny import tiny_model
    data = _twin_paths(tmp_path)
    tiny_model(tmp_path / "model")  # 4x4 tokens: a shard decodes in a blink
    first = run_flow(prompts=[str(data / "p.csv")], out=str(tmp_path / "run"), model=f"reference:{tmp_path}/model",
                     shard_size=1, batch_size=1, actors=1)
    again = run_flow(prompts=[f"{data}/fresh/../p.csv"], out=str(tmp_path / "run"),
                     model=f"reference:{tmp_path}/model/", shard_size=1, batch_size=1, actors=1)
    assert first["images_ok"] + first["images_failed"] == 2 and again["shards_committed"] == 2, (first, again)
