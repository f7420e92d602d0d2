"""More inputs (#36 item 3, inputs/text.py): CSV, TSV, JSON, JSON Lines and plain text besides Parquet, local or
at any fsspec URL, chosen by suffix or --input-format, the prompt in --prompt-column; they decode the same prompts
as their Parquet twin."""

import gzip
import json

import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import pytest
from pipeline_helpers import committed_tables, eval_rows, run_flow
from test_operations import one_error, ssdgen

from ssdgen.inputs.files import InputError, list_inputs, with_identities
from ssdgen.inputs.shards import Shards, read_shard_columns
from ssdgen.inputs.text import ReadAs


def _rows(n: int) -> list[dict]:
    """Prompts with an id, a seed, an extra column, a comma, a quote and a newline where CSV must quote them."""
    rows = [r | {"seed": 1000 + i, "license": f"cc-by-{i}"} for i, r in enumerate(eval_rows(n))]
    rows[0]["prompt"] = 'a "quoted", comma\nand a second line'
    return rows


def _write(path, rows: list[dict]) -> None:
    """rows in the format the suffix names."""
    table = pa.Table.from_pylist(rows)
    kind = path.suffix
    if kind == ".parquet":
        pq.write_table(table, path)
    elif kind in (".csv", ".tsv"):
        pcsv.write_csv(table, path, pcsv.WriteOptions(delimiter="\t" if kind == ".tsv" else ","))
    elif kind == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif kind == ".json":
        path.write_text(json.dumps(rows, indent=1))
    else:
        path.write_text("".join(r["prompt"] + "\n" for r in rows))


def _read(paths, read_as: ReadAs | None = None) -> tuple[list, list]:
    files = with_identities(list_inputs([str(p) for p in paths], read_as=read_as or ReadAs()))
    plan = Shards(files, 4)
    kept = pa.schema([f for f in files[0].extra])
    rows, cols = [], []
    for i in range(len(plan)):
        got, table = read_shard_columns(files, plan[i], 0, kept=kept)
        rows += [(r.prompt_id, r.prompt, r.seed, r.error) for r in got]
        cols += table.to_pylist()
    return rows, cols


@pytest.mark.parametrize("suffix", [".csv", ".tsv", ".jsonl", ".json"])
def test_a_text_input_reads_the_rows_and_columns_of_its_parquet_twin(tmp_path, suffix):
    _write(tmp_path / "p.parquet", _rows(9))
    _write(tmp_path / f"p{suffix}", _rows(9))
    want = _read([tmp_path / "p.parquet"])
    assert _read([tmp_path / f"p{suffix}"]) == want
    assert want[0][0][1].startswith('a "quoted", comma\n') and want[1][3] == {"license": "cc-by-3"}


def test_plain_text_is_a_prompt_a_line_and_blank_lines_are_skipped(tmp_path):
    (tmp_path / "p.txt").write_text("a red fox\n\n  \r\nthe sea at night\r\n")
    rows, _ = _read([tmp_path / "p.txt"])
    assert [r[1] for r in rows] == ["a red fox", "the sea at night"]
    gz = tmp_path / "q.txt.gz"
    gz.write_bytes(gzip.compress(b"a red fox\nthe sea at night\n"))
    assert [r[1] for r in _read([gz])[0]] == ["a red fox", "the sea at night"]


def test_the_format_comes_from_input_format_else_the_suffix_and_a_folder_takes_its_formats_files(tmp_path):
    _write(tmp_path / "a.parquet", _rows(2))
    _write(tmp_path / "b.csv", _rows(3))
    (tmp_path / "README.txt").write_text("not prompts\n")
    assert [f.format for f in list_inputs([str(tmp_path)])] == ["parquet"]  # a folder: its Parquet only
    assert [f.num_rows for f in list_inputs([str(tmp_path)], read_as=ReadAs("csv"))] == [3]
    (tmp_path / "c.dat").write_text("prompt\nx\n")
    assert list_inputs([str(tmp_path / "c.dat")], read_as=ReadAs("csv"))[0].num_rows == 1
    with pytest.raises(InputError, match=r"c\.dat: cannot tell the input format.*--input-format"):
        list_inputs([str(tmp_path / "c.dat")])
    with pytest.raises(InputError, match="--input-format must be one of"):
        ReadAs("xlsx")


def test_prompt_column_names_the_prompt_and_the_rest_is_kept(tmp_path):
    rows = [{"caption": r["prompt"], "prompt_id": r["prompt_id"], "source": "web"} for r in eval_rows(3)]
    _write(tmp_path / "p.parquet", rows)
    _write(tmp_path / "p.jsonl", rows)
    for name in ("p.parquet", "p.jsonl"):
        got, cols = _read([tmp_path / name], ReadAs(prompt_column="caption"))
        assert [r[1] for r in got] == [r["caption"] for r in rows] and cols == [{"source": "web"}] * 3
    with pytest.raises(InputError, match=r"p\.jsonl: no 'prompt' column \(columns: caption, prompt_id, source; "
                                         "--prompt-column names another"):
        list_inputs([str(tmp_path / "p.jsonl")])


@pytest.mark.parametrize("name, text, words", [
    ("bad.csv", 'prompt,prompt_id\n"a red fox,1\n', ["bad.csv", "not a CSV file"]),
    ("bad.csv", "prompt,x\na,1\nb,2,3\n", ["bad.csv", "not a CSV file", "Expected 2 columns"]),
    ("bad.jsonl", '{"prompt": "a"}\n{"prompt": \n', ["bad.jsonl", "not a JSONL file"]),
    ("bad.json", '[{"prompt": "a"}, "b"]', ["bad.json", "row 1 is a str"]),
    ("nums.jsonl", '{"prompt": 1}\n', ["nums.jsonl", "'prompt' has type int64"]),
])
def test_a_bad_text_input_is_one_line_naming_the_file(tmp_path, name, text, words):
    (tmp_path / name).write_text(text)
    with pytest.raises(InputError) as e:
        list_inputs([str(tmp_path / name)])
    assert "\n" not in str(e.value) and all(w in str(e.value) for w in words), str(e.value)


def test_text_inputs_on_s3_are_listed_by_suffix_and_read_at_their_pin(s3, tmp_path):
    _write(tmp_path / "p.jsonl", _rows(5))
    _write(tmp_path / "p.parquet", _rows(5))
    s3.put(str(tmp_path / "p.jsonl"), "ssdgen-test/in/p.jsonl")
    assert _read(["s3://ssdgen-test/in/p.jsonl"]) == _read([tmp_path / "p.parquet"])
    files = with_identities(list_inputs(["s3://ssdgen-test/in/*.jsonl"]))
    assert [f.format for f in files] == ["jsonl"] and files[0].identity.startswith("etag:")
    s3.pipe("ssdgen-test/in/p.jsonl", b'{"prompt": "another"}\n')
    with pytest.raises(InputError, match=r"p\.jsonl.*changed"):
        read_shard_columns(files, Shards(files, 4)[0], 0)


def test_a_text_input_edited_after_it_was_listed_is_refused(tmp_path):
    _write(tmp_path / "p.csv", _rows(4))
    files = with_identities(list_inputs([str(tmp_path / "p.csv")]))
    _write(tmp_path / "p.csv", _rows(5))
    with pytest.raises(InputError, match=r"p\.csv.*changed"):
        read_shard_columns(files, Shards(files, 4)[0], 0)


@pytest.mark.usefixtures("prefect_server", "local_ray")
def test_a_jsonl_and_a_csv_input_decode_the_same_images_as_their_parquet_twin(tmp_path):
    """The issue's bar: the same prompts (ids, seeds) from three formats give the same committed images (the
    quoted two-line prompt is one the model cannot draw: committed as such in every format)."""
    images = {}
    for suffix in (".parquet", ".jsonl", ".csv"):
        _write(tmp_path / f"p{suffix}", _rows(5))
        s = run_flow(out=str(tmp_path / f"run{suffix}"), prompts=[str(tmp_path / f"p{suffix}")], shard_size=5,
                     batch_size=5, actors=1)
        assert s["images_ok"] == 4
        table, stats = committed_tables(str(tmp_path / f"run{suffix}"))
        status = dict(zip(stats.column("prompt_id").to_pylist(), stats.column("status").to_pylist()))
        images[suffix] = {r["prompt_id"]: (r["prompt"], r["seed"], r["license"], status[r["prompt_id"]], r["image"])
                          for r in table.to_pylist()}
    assert images[".jsonl"] == images[".parquet"] and images[".csv"] == images[".parquet"]
    config = json.loads((tmp_path / "run.csv" / "_config.json").read_text())
    assert config["inputs"][0]["format"] == "csv"


@pytest.mark.integration
def test_generate_refuses_a_bad_input_format_and_a_missing_prompt_column_in_one_line(tmp_path):
    _write(tmp_path / "p.csv", _rows(2))
    proc = ssdgen("generate", "--prompts", str(tmp_path / "p.csv"), "--out", str(tmp_path / "run"),
                  "--input-format", "xlsx", "--no-progress")
    one_error(proc, "--input-format", "'xlsx'")
    proc = ssdgen("generate", "--prompts", str(tmp_path / "p.csv"), "--out", str(tmp_path / "run"),
                  "--prompt-column", "caption", "--no-progress")
    one_error(proc, "p.csv", "no 'caption' column")
    assert not (tmp_path / "run").exists()
