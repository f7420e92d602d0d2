"""Inputs pinned to the content a run recorded at its start (inputs.pinned), read in bounded record batches
(inputs.row_reader), and odd inputs and outputs: glob characters in a path that exists, an output whose URL holds
brackets, spaces, '#', '%' and unicode, seeds that do not fit an int64. Local files here; the S3 runs on moto and
the end-to-end runs of every command are in tests/test_inputs_pinned_runs.py."""

import os
import threading

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from ssdgen.inputs.files import InputError, list_inputs, with_identities
from ssdgen.inputs.shards import Shards, read_shard

ODD = "br[1] a#b%20c é"  # brackets (a glob's character class), a space, '#', '%' and unicode
TWIN = "br1 a#b%20c é"   # what `br[1]` matches as a glob


def write(path, columns: dict, row_group_size=None):
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(columns), str(path), row_group_size=row_group_size, compression="none")
    return path


def pinned(*paths):
    return with_identities(list_inputs([str(p) for p in paths]))


def texts(tag: str, n: int = 40) -> list[str]:
    return [f"{tag} {i:03d}" for i in range(n)]  # "old" and "new" texts of the same lengths: same file size


# ---- pinned inputs ---------------------------------------------------------------------------------

def test_a_local_file_rewritten_in_place_fails_the_next_read_with_one_line_naming_it(tmp_path):
    p = write(tmp_path / "p.parquet", {"prompt": texts("old")}, row_group_size=10)
    files = pinned(p)
    plan = Shards(files, 10)
    shards = [plan[i] for i in range(len(plan))]
    assert [r.prompt for r in read_shard(files, shards[0], 0)] == texts("old")[:10]
    st = os.stat(p)
    write(p, {"prompt": texts("new")}, row_group_size=10)  # same size, same row groups
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))  # and its mtime set back: the ctime still moved
    assert os.path.getsize(p) == st.st_size
    for shard in shards:
        with pytest.raises(InputError) as e:
            read_shard(files, shard, 0)
        msg = str(e.value)
        assert msg.startswith(f"{files[0].url}: the file changed since the run started") and "\n" not in msg
    assert files[0].pin.kind == "stat" and files[0].identity.startswith("sha256:")


def test_a_file_changed_under_an_open_cursor_gives_no_row_of_the_new_text(tmp_path, monkeypatch):
    from ssdgen.inputs import row_reader
    from ssdgen.inputs.row_reader import RowReader
    monkeypatch.setattr(row_reader, "BATCH_ROWS", 4)
    p = write(tmp_path / "p.parquet", {"prompt": texts("old")})  # one row group of 40
    files = pinned(p)
    reader = RowReader()
    first = read_shard(files, Shards(files, 10)[0], 0, reader=reader)
    assert [r.prompt for r in first] == texts("old")[:10]
    write(p, {"prompt": texts("new")})
    with pytest.raises(InputError, match="the file changed since the run started"):
        read_shard(files, Shards(files, 10)[1], 0, reader=reader)
    reader.close()


def test_shards_read_out_of_order_by_threads_decode_a_row_group_about_once(tmp_path, monkeypatch):
    from ssdgen.inputs import row_reader
    from ssdgen.inputs.row_reader import RowReader
    monkeypatch.setattr(row_reader, "BATCH_ROWS", 8)
    p = write(tmp_path / "p.parquet", {"prompt": texts("a", 600), "prompt_id": [f"id{i}" for i in range(600)]},
              row_group_size=300)
    files = pinned(p)
    plan = Shards(files, 7)  # shards span batches and the row-group boundary
    shards = [plan[i] for i in range(len(plan))]
    opened = []
    orig = pq.ParquetFile.iter_batches
    monkeypatch.setattr(pq.ParquetFile, "iter_batches", lambda self, **kw: opened.append(kw["row_groups"]) or
                        orig(self, **kw))
    reader = RowReader(keep_rows=8 * 7)
    got: dict[int, list] = {}
    order = [i ^ 1 if i ^ 1 < len(shards) else i for i in range(len(shards))]  # 1, 0, 3, 2, ...: out of order

    def work(ids):
        for i in ids:
            got[i] = read_shard(files, shards[i], 0, reader=reader)

    threads = [threading.Thread(target=work, args=(order[k::2],)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    reader.close()
    assert [r.prompt for i in range(len(shards)) for r in got[i]] == texts("a", 600)
    assert opened.count([0]) <= 3 and opened.count([1]) <= 3, opened  # not once per shard (86 shards)


# ---- paths taken as written --------------------------------------------------------------------------

def test_a_path_with_glob_characters_that_exists_is_read_as_written(tmp_path):
    odd = write(tmp_path / "in[1]" / "p[1].parquet", {"prompt": ["odd"]})
    twin = write(tmp_path / "in1" / "p1.parquet", {"prompt": ["twin", "twin"]})  # what the glob would match
    assert [f.url for f in list_inputs([str(odd)])] == [f"file://{odd}"]
    assert [f.url for f in list_inputs([str(odd.parent)])] == [f"file://{odd}"]
    assert [f.url for f in list_inputs([str(tmp_path / "in*" / "*.parquet")])] == [f"file://{twin}", f"file://{odd}"]
    assert [f.url for f in list_inputs([str(tmp_path / "in[[]1]" / "*.parquet")])] == [f"file://{odd}"]


def _commit(out, shard: int) -> None:
    """A committed shard of one row, as the flow writes it."""
    from ssdgen.output.layout import shard_tables
    from ssdgen.output.marker import Marker
    from ssdgen.workers.results import Sample
    images, stats = shard_tables({f"s{shard}": Sample(f"s{shard}", "ok", latency_s=0.1)},
                                 [{"prompt_id": f"s{shard}", "prompt": "x", "seed": 1}], "ar", "tiny")
    a = out.new_attempt(shard)
    files = [out.store.write_table(f"{a}/images.parquet", images), out.store.write_table(f"{a}/stats.parquet", stats)]
    out.commit(Marker.from_dict({"shard": shard, "attempt": a.rsplit("/", 1)[-1], "files": files, "rows": 1, "ok": 1,
                                 "failed": 0, "wall_s": 1.0, "busy_s": 0.5, "load_s": 0.0, "devices": 1.0,
                                 "device_seconds_allocated": 1.0, "device_seconds_busy": 0.5,
                                 "device_type": "cpu"}))


def test_an_output_with_glob_characters_lists_reads_and_deletes_only_its_own_files(tmp_path):
    from ssdgen.output.folder import clear
    from ssdgen.output.layout import Output
    from ssdgen.output.damage import damaged_shards
    out, twin = Output(str(tmp_path / ODD)), Output(str(tmp_path / TWIN))
    for s in (0, 2):
        _commit(out, s)
    for s in (1, 2, 3):
        _commit(twin, s)
    out.store.put(f"{out.new_attempt(2)}/images.parquet", b"a losing attempt's file")  # gc removes it
    twin.store.put(f"{twin.new_attempt(2)}/images.parquet", b"the twin's losing attempt")  # ... and not this one
    twin_files = sorted(p for p in (tmp_path / TWIN).rglob("*"))
    assert list(out.committed_ids(4)) == [1, 0, 1, 0]
    assert [m.shard for m in out.iter_markers()] == [0, 2]
    assert list(damaged_shards(out, deep=True)) == []
    assert out.gc() == 1
    out.set_aside(2)
    assert list(out.committed_ids(4)) == [1, 0, 0, 0]
    clear(out, keep="_lease")
    assert not any((tmp_path / ODD).iterdir())
    assert sorted(p for p in (tmp_path / TWIN).rglob("*")) == twin_files  # the twin's files, all still there
    assert list(twin.committed_ids(4)) == [0, 1, 1, 1]


# ---- seeds -----------------------------------------------------------------------------------------

def test_seeds_that_do_not_fit_an_int64_are_refused_before_the_run_naming_the_row(tmp_path):
    from ssdgen.cli import app
    from ssdgen.flows.prepare import prepare
    from ssdgen.flows.settings import RunSettings
    big = write(tmp_path / "big.parquet", {"prompt": texts("p", 5),
                                           "seed": pa.array([0, 2**63 - 1, None, 2**64 - 1, 5], pa.uint64())})
    fits = write(tmp_path / "fits" / "ok.parquet", {"prompt": texts("p", 3),
                                                    "seed": pa.array([0, 2**63 - 1, None], pa.uint64())})
    line = (f"file://{big}: row 3: seed 18446744073709551615 is out of range: seeds are signed 64-bit integers, "
            "-9223372036854775808..9223372036854775807 (leave it null to derive one from the run seed)")
    with pytest.raises(InputError) as e:
        prepare(RunSettings(prompts=(str(big),), out=str(tmp_path / "run"), decoder="ar"))
    assert str(e.value) == line
    from ssdgen.inputs.files import check_seeds
    check_seeds(pinned(fits))  # uint64 seeds that fit are fine
    r = CliRunner().invoke(app, ["generate", "--prompts", str(big), "--out", str(tmp_path / "run"), "--decoder", "ar"])
    assert r.exit_code == 2 and r.stderr.strip() == f"error: {line}", r.output
    assert not (tmp_path / "run").exists()  # refused before anything was written or started
