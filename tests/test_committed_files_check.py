"""Checking committed files against their markers (output/damage.py), on a local disk and on moto's S3 server."""

import json

from ssdgen.output.layout import Output
from ssdgen.output.marker import Marker
from ssdgen.output.damage import damaged_shards


def _commit(out: Output, shard: int, data: bytes) -> dict:
    attempt = out.new_attempt(shard)
    rec = out.store.write_bytes(f"{attempt}/stats.parquet", data, rows=1)
    out.commit(Marker.from_dict({"shard": shard, "files": [rec], "rows": 1, "ok": 1, "failed": 0}))
    return rec


def test_a_local_file_rewritten_with_the_same_size_is_found_and_a_copy_is_not(tmp_path):
    out = Output(str(tmp_path / "run"))
    rec = _commit(out, 0, b"abcdef")
    _commit(out, 1, b"ghijkl")
    assert list(damaged_shards(out)) == []
    p = tmp_path / "run" / rec["path"]
    p.write_bytes(b"abcdeX")
    found = list(damaged_shards(out))
    assert [d.shard for d in found] == [0] and "SHA-256" in found[0].problem
    p.write_bytes(b"abcdef")  # the same bytes, a new mtime (a copy without -p): not damage
    assert list(damaged_shards(out)) == []


def test_a_missing_file_and_a_torn_marker_are_damage(tmp_path):
    out = Output(str(tmp_path / "run"))
    rec = _commit(out, 0, b"abc")
    _commit(out, 1, b"def")
    (tmp_path / "run" / rec["path"]).unlink()
    (tmp_path / "run" / "shards" / "000001" / "_SUCCESS.json").write_text('{"shard": 1,')
    found = {d.shard: d for d in damaged_shards(out)}
    assert found[0].problem == "missing" and "corrupt commit marker" in found[1].problem
    assert found[1].url.endswith("000001/_SUCCESS.json")
    out.set_aside(0)
    assert out.committed_ids(2) == bytearray([0, 1])  # uncommitted, its marker kept beside it
    assert list((tmp_path / "run" / "shards" / "000000").glob("_DAMAGED-*.json"))


def test_on_s3_a_rewritten_object_is_found_by_its_etag_without_reading_it(s3):
    out = Output("s3://ssdgen-test/run")
    rec = _commit(out, 0, b"abcdef")
    assert rec["md5"] and list(damaged_shards(out)) == []
    s3.pipe_file(f"ssdgen-test/run/{rec['path']}", b"abcdeX")  # same size, other content
    found = list(damaged_shards(out))
    assert [d.shard for d in found] == [0] and "ETag" in found[0].problem
    assert json.loads(s3.cat_file("ssdgen-test/run/shards/000000/_SUCCESS.json"))["shard"] == 0
