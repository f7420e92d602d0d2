"""Input columns carried through (#36 item 1, inputs/columns.py): every input column beyond prompt, prompt_id and
seed reaches images.parquet with its type, and the WebDataset JSON; --keep-columns and --drop-columns choose; a
clash with an output column, a type two files disagree on and a name no input has are one error line each."""

import datetime
import io
import json
import tarfile

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pipeline_helpers import eval_rows, run_flow
from test_operations import one_error, ssdgen

from ssdgen.inputs.columns import extra_fields, kept_schema, shard_columns
from ssdgen.inputs.files import InputError, InputFile

EXTRA = pa.schema([("category", pa.dictionary(pa.int32(), pa.string())), ("license", pa.string()),
                   ("score", pa.float64()), ("taken", pa.date32())])


def _file(url: str, schema: pa.Schema) -> InputFile:
    return InputFile(url, 1, (1,), 10, False, False, extra=extra_fields(schema))


def _rows(n: int) -> list[dict]:
    return [r | {"category": ["cat", "dog"][i % 2], "license": f"cc-by-{i}", "score": i / 2,
                 "taken": datetime.date(2026, 1, 1 + i)} for i, r in enumerate(eval_rows(n))]


def _write(path, rows, schema=EXTRA) -> None:
    full = pa.schema([("prompt_id", pa.string()), ("prompt", pa.string())] + list(schema))
    pq.write_table(pa.Table.from_pylist(rows, schema=full), path)


def test_every_extra_column_is_kept_in_the_inputs_order_unless_chosen_otherwise():
    from ssdgen.output.layout import RESERVED_COLUMNS
    a = _file("file:///a.parquet", pa.schema([("prompt", pa.string()), ("license", pa.string())]))
    b = _file("file:///b.parquet", pa.schema([("seed", pa.int64()), ("score", pa.float64()),
                                               ("license", pa.string())]))
    assert kept_schema([a, b], ("*",), (), RESERVED_COLUMNS).names == ["license", "score"]
    assert kept_schema([a, b], ("score",), (), RESERVED_COLUMNS).names == ["score"]
    assert kept_schema([a, b], ("*",), ("license",), RESERVED_COLUMNS).names == ["score"]
    assert kept_schema([a, b], ("*",), ("*",), RESERVED_COLUMNS).names == []
    assert kept_schema([a, b], ("*",), (), RESERVED_COLUMNS).field("score").type == pa.float64()
    c = _file("file:///c.parquet", pa.schema([("category", pa.dictionary(pa.int8(), pa.string()))]))
    d = _file("file:///d.parquet", pa.schema([("category", pa.dictionary(pa.int16(), pa.string()))]))
    assert kept_schema([c, d], ("*",), (), RESERVED_COLUMNS).field("category").type == pa.string()


@pytest.mark.parametrize("files, keep, drop, words", [
    ([("a", [("license", pa.string())]), ("b", [("license", pa.int64())])], ("*",), (),
     ["file:///b.parquet", "'license'", "int64", "file:///a.parquet", "string"]),
    ([("a", [("decoder", pa.string())])], ("*",), (), ["file:///a.parquet", "'decoder'", "--drop-columns decoder"]),
    ([("a", [("license", pa.string())])], ("licence",), (), ["--keep-columns", "'licence'", "license"]),
    ([("a", [("license", pa.string())])], ("*",), ("lisense",), ["--drop-columns", "'lisense'"]),
])
def test_a_clash_a_type_conflict_or_a_typo_is_one_line_naming_it(files, keep, drop, words):
    from ssdgen.output.layout import RESERVED_COLUMNS
    found = [_file(f"file:///{name}.parquet", pa.schema(fields)) for name, fields in files]
    with pytest.raises(InputError) as e:
        kept_schema(found, keep, drop, RESERVED_COLUMNS)
    assert "\n" not in str(e.value) and all(w in str(e.value) for w in words), str(e.value)


def test_a_shards_pieces_without_a_column_read_it_as_nulls():
    schema = pa.schema([("license", pa.string()), ("score", pa.float64())])
    got = shard_columns([pa.table({"license": ["a", "b"]}), pa.table({"score": [1.5], "other": [1]})], schema)
    assert got.schema == schema and got.to_pylist() == [{"license": "a", "score": None},
                                                        {"license": "b", "score": None},
                                                        {"license": None, "score": 1.5}]


def test_read_shard_columns_across_two_files(tmp_path):
    from ssdgen.inputs.files import list_inputs, with_identities
    from ssdgen.inputs.shards import Shards, read_shard_columns
    _write(tmp_path / "a.parquet", _rows(3))
    _write(tmp_path / "b.parquet", [{k: v for k, v in r.items() if k != "license"} for r in _rows(2)],
           pa.schema([f for f in EXTRA if f.name != "license"]))
    files = with_identities(list_inputs([str(tmp_path)]))
    kept = kept_schema(files, ("*",), (), frozenset())
    rows, table = read_shard_columns(files, Shards(files, 4)[0], 0, kept=kept)
    assert [r.prompt_id for r in rows] == [r["prompt_id"] for r in _rows(3)] + [_rows(2)[0]["prompt_id"]]
    assert table.schema == kept and table.column("license").to_pylist() == ["cc-by-0", "cc-by-1", "cc-by-2", None]
    assert table.column("taken").to_pylist()[3] == datetime.date(2026, 1, 1)


def _samples(rows):
    import numpy as np

    from ssdgen.formats.images import encode_image
    from ssdgen.workers.results import Sample
    img = encode_image(np.zeros((4, 4, 3), dtype=np.uint8), "png", 90)
    return {r["prompt_id"]: Sample(r["prompt_id"], "ok", image=img, width=4, height=4, grid=(2, 2),
                                   tokens=[1, 2, 3, 4], stats={"forwards": 4}, latency_s=0.1) for r in rows}


def test_the_images_table_and_the_webdataset_json_carry_the_kept_columns_with_their_types():
    from ssdgen.formats.webdataset import shard_tar
    from ssdgen.output.layout import IMAGES_SCHEMA, shard_tables
    rows = [{"prompt_id": r["prompt_id"], "prompt": r["prompt"], "seed": i} for i, r in enumerate(_rows(2))]
    kept = shard_columns([pa.Table.from_pylist([{k: r[k] for k in EXTRA.names} for r in _rows(2)], schema=EXTRA)],
                         pa.schema(extra_fields(EXTRA)))  # a categorical kept as its values, strings
    assert kept.schema.field("category").type == pa.string()
    images, stats = shard_tables(_samples(rows), rows, "ar", "reference", kept=kept)
    assert images.schema.names == IMAGES_SCHEMA.names + EXTRA.names and "license" not in stats.schema.names
    assert images.schema.field("taken").type == pa.date32()
    features = json.loads(images.schema.metadata[b"huggingface"])["info"]["features"]
    assert features["score"] == {"dtype": "float64", "_type": "Value"} and features["image"] == {"_type": "Image"}
    assert features["category"] == {"dtype": "string", "_type": "Value"}
    data, _ = shard_tar(0, images, stats)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        meta = json.loads(tar.extractfile("000000001.json").read())
    assert (meta["category"], meta["license"], meta["score"], meta["taken"]) == ("dog", "cc-by-1", 0.5, "2026-01-02")


@pytest.mark.usefixtures("prefect_server", "local_ray")
def test_a_run_keeps_its_input_columns_and_users_tools_read_them(tmp_path, monkeypatch):
    """The way a dataset builder meets it: a run over prompts with metadata, its images.parquet read back by
    `datasets`, polars and `ssdgen.open_run`; --drop-columns leaves some out; a resume with other columns is
    refused."""
    import datasets
    import polars as pl

    import ssdgen
    _write(tmp_path / "p.parquet", _rows(6))
    out = tmp_path / "run"
    kw = dict(prompts=[str(tmp_path / "p.parquet")], shard_size=3, batch_size=3, actors=1)
    s = run_flow(out=str(out), **kw)
    assert s["images_ok"] == 6 and json.loads((out / "_config.json").read_text())["columns"] == EXTRA.names
    want = {r["prompt_id"]: (r["category"], r["license"], r["score"], r["taken"]) for r in _rows(6)}
    images = [str(p) for p in sorted(out.glob("shards/*/attempt-*/images.parquet"))]
    hf = datasets.load_dataset("parquet", data_files=images, cache_dir=str(tmp_path / "hf"))["train"]
    assert {r["prompt_id"]: (r["category"], r["license"], r["score"], r["taken"]) for r in hf} == want
    assert hf[0]["image"].size == (64, 64)
    df = pl.read_parquet(images)
    assert {r["prompt_id"]: (r["category"], r["license"], r["score"], r["taken"]) for r in df.to_dicts()} == want
    table = ssdgen.open_run(str(out), columns=["license", "forwards"]).to_table()
    assert sorted(table.column("license").to_pylist()) == sorted(v[1] for v in want.values())
    dropped = run_flow(out=str(tmp_path / "dropped"), drop_columns=("license", "taken"), **kw)
    assert dropped["images_ok"] == 6
    names = pq.read_schema(next((tmp_path / "dropped").glob("shards/*/attempt-*/images.parquet"))).names
    assert names[-2:] == ["category", "score"] and "license" not in names
    with pytest.raises(ValueError, match="columns differ"):
        run_flow(out=str(out), keep_columns=("license",), **kw)


@pytest.mark.integration
def test_generate_refuses_a_column_named_like_an_output_column_in_one_line(tmp_path):
    _write(tmp_path / "p.parquet", [r | {"decoder": "mine"} for r in _rows(2)],
           pa.schema(list(EXTRA) + [("decoder", pa.string())]))
    proc = ssdgen("generate", "--prompts", str(tmp_path / "p.parquet"), "--out", str(tmp_path / "run"),
                  "--decoder", "ar", "--no-progress")
    one_error(proc, "p.parquet", "'decoder'", "--drop-columns decoder")
    assert not (tmp_path / "run").exists()
    proc = ssdgen("generate", "--prompts", str(tmp_path / "p.parquet"), "--out", str(tmp_path / "run"),
                  "--decoder", "ar", "--no-progress", "--keep-columns", "licence")
    one_error(proc, "--keep-columns", "'licence'")
