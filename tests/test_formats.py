"""Output formats as a registry (formats/): a format is one module and its registration. The test format
(tests/format_jsonl.py) is written, committed, listed in the manifest, read back and exported like the built-in
ones, and a whole run writes it when --format names it."""

import json

import pytest
from pipeline_helpers import eval_rows, run_flow, write_parquet
from test_webdataset import _tables

from ssdgen.formats import FORMATS, check_format, register, write_shard
from ssdgen.output.layout import Output, manifest_schema
from ssdgen.output.marker import Marker, file_kind


@pytest.fixture
def jsonl():
    """The test format, registered as its module registers it on import, and taken out again after the test:
    the other tests' runs see the built-in formats only."""
    import format_jsonl
    yield register(format_jsonl.JSONL)
    FORMATS.pop("jsonl")


def _commit(out, shard, fmt):
    images, stats = _tables(shard)
    attempt = out.new_attempt(shard)
    files = write_shard(out, attempt, shard, images, stats, fmt, shard_size=4)
    assert out.commit(Marker.from_dict({"shard": shard, "attempt": attempt.rsplit("/", 1)[-1], "files": files,
                                        "rows": 3, "ok": 2, "failed": 1}))
    return attempt


def test_a_registered_format_is_written_listed_read_back_and_exported(tmp_path, jsonl):
    import ssdgen
    from ssdgen.output.reader import committed_shards, shard_images
    assert FORMATS["jsonl"] is jsonl and file_kind("shards/000000/attempt-x/00000.jsonl") == "jsonl"
    check_format("jsonl")  # --format takes it
    assert {"jsonl_url", "jsonl_sha256", "images_url", "tar_url"} <= set(manifest_schema().names)
    out = Output(str(tmp_path / "run"))
    out.write_config({"shard_size": 4}, replacing=False)
    a = _commit(out, 0, "jsonl")
    assert sorted(p.name for p in (tmp_path / "run" / a.rsplit("run/", 1)[1]).iterdir()) == \
        ["00000.jsonl", "stats.parquet"]
    out.write_manifest(out.committed())
    row = committed_shards(out.url).to_pylist()[0]
    assert row["jsonl_url"].endswith("/00000.jsonl") and row["images_url"] is None and row["tar_url"] is None
    images, _ = _tables(0)
    want = {r["prompt_id"]: r["image"]["bytes"] if r["image"] else None for r in images.to_pylist()}
    assert {r["prompt_id"]: r["image"] for r in shard_images(out, row)} == want  # the image bytes, read back
    r = ssdgen.export(out.url, str(tmp_path / "x"), "jsonl")
    assert r["files"] == 3 and sorted(p.name for p in (tmp_path / "x").iterdir()) == [
        "00000.jsonl", "00000.parquet", "README.md"]  # with its dataset card (output/card.py)
    # a Parquet run exports to the new format too: built from its images Parquet by the format's encode
    pq_run = Output(str(tmp_path / "p"))
    pq_run.write_config({"shard_size": 4}, replacing=False)
    _commit(pq_run, 0, "parquet")
    ssdgen.export(pq_run.url, str(tmp_path / "built"), "jsonl")
    assert (tmp_path / "built" / "00000.jsonl").read_bytes() == jsonl.encode(0, *_tables(0), 4)[0]
    with pytest.raises(ValueError, match="--format must be one of parquet, webdataset, jsonl, both"):
        check_format("csv")


@pytest.mark.integration
@pytest.mark.usefixtures("prefect_server", "local_ray")
def test_a_run_writes_a_registered_format_when_format_names_it(tmp_path, jsonl):
    src = tmp_path / "p.parquet"
    write_parquet(None, src, eval_rows(4))
    s = run_flow(prompts=[str(src)], out=str(tmp_path / "run"), format="jsonl", shard_size=4, batch_size=4,
                 actors=1)
    assert s["images_ok"] == 4
    lines = (next((tmp_path / "run").rglob("00000.jsonl"))).read_text().splitlines()
    assert [json.loads(line)["status"] for line in lines] == ["ok"] * 4
    assert not list((tmp_path / "run").rglob("images.parquet"))  # only what --format asked for
