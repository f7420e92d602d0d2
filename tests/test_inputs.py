"""Input listing/validation (inputs.files) and shard planning/reading (inputs.shards), on local files."""

import hashlib
import json
import os

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fsspec.implementations.memory import MemoryFileSystem

from ssdgen.inputs.files import (InputError, InputFile, check_unique_prompt_ids, derive_prompt_id, derive_seed,
                          list_inputs)
from ssdgen.inputs.shards import Piece, Shard, Shards, read_shard


def plan_shards(files, shard_size):
    """Every shard of a Shards, in order (what the flow takes one by one)."""
    plan = Shards(files, shard_size)
    return [plan[i] for i in range(len(plan))]


def write(path, columns: dict, row_group_size=None, schema=None):
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(columns, schema=schema), str(path), row_group_size=row_group_size)
    return path


def url(path) -> str:
    return "file://" + str(path)


def prompts(n, tag="p"):
    return [f"{tag}{i}" for i in range(n)]


def bad_utf8_strings(values: list[bytes]) -> pa.Array:
    """A string array over raw bytes, built without UTF-8 validation (pa.array would refuse)."""
    offsets = [0]
    for v in values:
        offsets.append(offsets[-1] + len(v))
    return pa.Array.from_buffers(pa.string(), len(values),
                                 [None, pa.array(offsets, pa.int32()).buffers()[1], pa.py_buffer(b"".join(values))])


# ---- listing ---------------------------------------------------------------------------------------

def test_prefix_expansion_sort_dedup(tmp_path, monkeypatch):
    root = tmp_path / "in"
    for name in ["b.parquet", "a/z.parquet", "a/c.parquet", "a/deep/x.parquet"]:
        write(root / name, {"prompt": prompts(2)})
    write(root / "_tmp" / "skip.parquet", {"prompt": ["x"]})  # underscore dirs: writer temp output
    write(root / ".hidden.parquet", {"prompt": ["x"]})
    (root / "_SUCCESS").write_bytes(b"")
    (root / "notes.txt").write_text("not an input")

    files = list_inputs([str(root), str(root / "b.parquet")])  # b listed twice -> once
    assert [f.url for f in files] == [url(root / n) for n in
                                      ["a/c.parquet", "a/deep/x.parquet", "a/z.parquet", "b.parquet"]]
    assert all(f.num_rows == 2 and f.row_groups == (2,) and f.size > 0 for f in files)
    assert not any(f.has_prompt_id or f.has_seed for f in files)

    assert [f.url for f in list_inputs([str(root / "a" / "*.parquet")])] == \
        [url(root / "a/c.parquet"), url(root / "a/z.parquet")]
    assert [f.url for f in list_inputs([str(root / "*.parquet")])] == [url(root / "b.parquet")]  # not .hidden
    monkeypatch.chdir(tmp_path)  # relative local paths become absolute file:// URLs
    assert list_inputs(["in/b.parquet"])[0].url == url(root / "b.parquet")
    assert list_inputs([url(root / "b.parquet")])[0].url == url(root / "b.parquet")


def test_nothing_matched(tmp_path):
    (tmp_path / "empty").mkdir()
    for name, said in [("missing.parquet", "no such file or folder"), ("empty", "no Parquet files matched in this "
                       "folder; --input-format reads another format"), ("*.parquet", "no files matched")]:
        u = str(tmp_path / name)
        with pytest.raises(InputError, match=said) as e:
            list_inputs([u])
        assert str(e.value) == f"{u}: {said}"


def test_missing_prompt_column(tmp_path):
    p = write(tmp_path / "f.parquet", {"text": ["a"], "seed": [1]})
    with pytest.raises(InputError, match=r"no 'prompt' column \(columns: text, seed; --prompt-column names") as e:
        list_inputs([str(p)])
    assert url(p) in str(e.value)


@pytest.mark.parametrize("columns, column, found", [
    ({"prompt": [1, 2]}, "prompt", "int64"),
    ({"prompt": [b"a", b"b"]}, "prompt", "binary"),
    ({"prompt": ["a", "b"], "prompt_id": [1.5, 2.5]}, "prompt_id", "double"),
    ({"prompt": ["a", "b"], "seed": ["1", "2"]}, "seed", "string"),
])
def test_wrong_types(tmp_path, columns, column, found):
    p = write(tmp_path / "f.parquet", columns)
    with pytest.raises(InputError, match=f"column '{column}' has type {found}") as e:
        list_inputs([str(p)])
    assert url(p) in str(e.value)


def test_accepted_types(tmp_path):
    p = write(tmp_path / "f.parquet", {"prompt": pa.array(["a", "b"], pa.large_string()),
                                       "prompt_id": pa.array([7, 8], pa.uint32()),
                                       "seed": pa.array([1, 2], pa.int16())})
    f, = list_inputs([str(p)])
    assert f.has_prompt_id and f.has_seed
    assert [(r.prompt_id, r.prompt, r.seed) for r in read_shard([f], plan_shards([f], 10)[0], 0)] == \
        [("7", "a", 1), ("8", "b", 2)]


def test_zero_byte_and_corrupt_files(tmp_path):
    empty = tmp_path / "empty.parquet"
    empty.write_bytes(b"")
    junk = tmp_path / "junk.parquet"
    junk.write_bytes(os.urandom(2000))
    fake_footer = tmp_path / "fake.parquet"  # right magic, garbage footer: pyarrow raises OSError here
    fake_footer.write_bytes(os.urandom(2000) + (100).to_bytes(4, "little") + b"PAR1")
    for p in [empty, junk, fake_footer]:
        with pytest.raises(InputError, match=r"not a Parquet file \(") as e:
            list_inputs([str(p)])
        assert str(e.value).startswith(url(p))


def test_zero_row_file_allowed(tmp_path):
    a = write(tmp_path / "a.parquet", {"prompt": pa.array([], pa.string())})
    b = write(tmp_path / "b.parquet", {"prompt": prompts(3)})
    files = list_inputs([str(tmp_path)])
    assert [(f.url, f.num_rows, f.row_groups) for f in files] == [(url(a), 0, (0,)), (url(b), 3, (3,))]
    shards = plan_shards(files, 2)
    assert [s.pieces for s in shards] == [(Piece(1, 0, 2),), (Piece(1, 2, 3),)]
    check_unique_prompt_ids(files)


# ---- storage errors (a fake filesystem; nothing leaves the machine) ---------------------------------

SECRET = "s3cr3t-KEY-do-not-print"


class DeniedFS(MemoryFileSystem):
    """Lists fine, but every read is refused with a message that echoes a credential."""
    protocol = "deniedtest"
    store, pseudo_dirs = {}, [""]
    fail_on = "open"

    @classmethod
    def _strip_protocol(cls, path):
        return super()._strip_protocol(path.replace("deniedtest://", "memory://", 1))

    def _open(self, path, mode="rb", **kw):
        if self.fail_on == "open" and "r" in mode:
            raise PermissionError(f"Access Denied for key {SECRET}")
        f = super()._open(path, mode, **kw)
        if "r" in mode:
            f.read = lambda *a: (_ for _ in ()).throw(ConnectionError(f"reset by peer; token={SECRET}"))
        return f


@pytest.mark.parametrize("fail_on", ["open", "read"])
def test_storage_errors_are_clear_and_redacted(tmp_path, monkeypatch, fail_on):
    fsspec.register_implementation("deniedtest", DeniedFS, clobber=True)
    monkeypatch.setattr(DeniedFS, "fail_on", fail_on)
    DeniedFS.store.clear()
    with DeniedFS().open("/bucket/data/a.parquet", "wb") as fh:
        pq.write_table(pa.table({"prompt": ["a"]}), fh)
    with pytest.raises(InputError) as e:
        list_inputs(["deniedtest://bucket/data"], storage_options={"secret": SECRET})
    msg = str(e.value)
    assert SECRET not in msg
    if fail_on == "open":  # a PermissionError: the store refused the credentials, and says so (#34)
        assert msg.startswith("deniedtest:///bucket/data/a.parquet: the store refused the credentials")
    else:
        assert msg.startswith("cannot read deniedtest:///bucket/data/a.parquet: ") and "***" in msg


def test_unknown_protocol():
    with pytest.raises(InputError, match="cannot read nosuchproto://x/y"):
        list_inputs(["nosuchproto://x/y"])


def _closed_port() -> int:
    """A port on 127.0.0.1 where nothing listens (bound once, then released)."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_unreachable_s3_endpoint_is_one_line_in_seconds(monkeypatch):
    """A wrong AWS_ENDPOINT_URL: one InputError naming the URL and the endpoint, after one quick probe rather
    than s3fs's and botocore's retries with backoff, and no credential in it."""
    import time

    import s3fs
    port = _closed_port()
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDUNREACHABLE0001")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "unreachable-secret-7f3e")
    s3fs.S3FileSystem.clear_instance_cache()
    try:
        for urls, options in [(["s3://b/p/"], None), (["s3://b/p/*.parquet"], {"secret": SECRET, "key": "k3y-v4lue"})]:
            t0 = time.monotonic()
            with pytest.raises(InputError) as e:
                list_inputs(urls, storage_options=options)
            took, msg = time.monotonic() - t0, str(e.value)
            assert took < 10, took
            assert msg == (f"{urls[0]}: cannot reach the storage endpoint http://127.0.0.1:{port} (connection "
                           "refused); check AWS_ENDPOINT_URL / the endpoint_url setting"), msg
            assert not any(s in msg for s in ("unreachable-secret", "AKIDUNREACHABLE", SECRET, "k3y-v4lue"))
    finally:
        s3fs.S3FileSystem.clear_instance_cache()


def test_only_an_endpoint_never_reached_counts_as_unreachable():
    from ssdgen.storage.endpoints import endpoint_of, unreachable
    assert unreachable(ConnectionRefusedError(111, "refused")) == "connection refused"
    assert unreachable(ConnectionError("reset by peer")) is None  # reached: a read failed
    assert unreachable(PermissionError("Access Denied")) is None and unreachable(FileNotFoundError("x")) is None
    try:
        try:
            raise ConnectionRefusedError(111, "Connect call failed")
        except OSError as inner:
            raise RuntimeError("wrapped") from inner
    except RuntimeError as e:
        assert unreachable(e) == "connection refused"

    class EndpointConnectionError(Exception):  # botocore's, as far as the check looks (name and kwargs)
        kwargs = {"endpoint_url": "https://user:pw@minio.example:9000/bucket/key", "error": TimeoutError()}
    assert unreachable(EndpointConnectionError()) == "connect timed out"
    assert endpoint_of(EndpointConnectionError()) == "https://minio.example:9000"  # no user info, no path


def test_the_probe_passes_a_healthy_endpoint(s3):
    """On a reachable S3 (moto), listing works as before, and a missing bucket is still reported as such."""
    from ssdgen.storage.endpoints import probe
    with s3.open("ssdgen-test/in/p.parquet", "wb") as fh:
        pq.write_table(pa.table({"prompt": prompts(3)}), fh)
    assert probe(s3, "ssdgen-test/in/") is None and probe(s3, "no-such-bucket/x") is None
    assert [f.num_rows for f in list_inputs(["s3://ssdgen-test/in/"])] == [3]
    with pytest.raises(InputError, match="no-such-bucket") as e:
        list_inputs(["s3://no-such-bucket/prompts/"])
    assert "cannot reach" not in str(e.value)


# ---- prompt ids ------------------------------------------------------------------------------------

def test_duplicate_prompt_ids_across_files(tmp_path):
    a = write(tmp_path / "a.parquet", {"prompt": prompts(3), "prompt_id": ["x", "y", "z"]})
    b = write(tmp_path / "b.parquet", {"prompt": prompts(2), "prompt_id": ["w", "y"]})
    with pytest.raises(InputError, match="duplicate prompt_id 'y'") as e:
        check_unique_prompt_ids(list_inputs([str(tmp_path)]))
    assert f"{url(a)} row 1" in str(e.value) and f"{url(b)} row 1" in str(e.value)


def test_integer_ids_compare_as_text(tmp_path):
    write(tmp_path / "a.parquet", {"prompt": prompts(2), "prompt_id": [1, 2]})
    write(tmp_path / "b.parquet", {"prompt": prompts(2), "prompt_id": ["3", "1"]})
    with pytest.raises(InputError, match="duplicate prompt_id '1'"):
        check_unique_prompt_ids(list_inputs([str(tmp_path)]))


def test_unique_ids_pass_and_given_id_may_collide_with_derived(tmp_path):
    a = write(tmp_path / "a.parquet", {"prompt": prompts(3)})  # no ids: derived
    write(tmp_path / "b.parquet", {"prompt": prompts(2), "prompt_id": ["u", "v"]})
    files = list_inputs([str(tmp_path)])
    check_unique_prompt_ids(files)
    write(tmp_path / "b.parquet", {"prompt": prompts(2), "prompt_id": ["u", derive_prompt_id(url(a), 2)]})
    with pytest.raises(InputError, match="derived there") as e:
        check_unique_prompt_ids(list_inputs([str(tmp_path)]))
    assert f"{url(a)} row 2" in str(e.value)


def test_derived_ids_and_seeds_are_stable():
    u = "s3://bucket/prompts/part-0.parquet"
    pid = derive_prompt_id(u, 42)
    assert pid == hashlib.sha1(b"bucket/prompts/part-0.parquet").hexdigest()[:10] + "-0000000042"
    assert pid == derive_prompt_id(u, 42) == derive_prompt_id("s3a://bucket/prompts/part-0.parquet", 42)
    assert derive_prompt_id(u, 43) != pid
    s = derive_seed(7, pid)
    assert s == derive_seed(7, pid) and 0 <= s < 2 ** 63
    assert s == int.from_bytes(hashlib.sha256(f"7:{pid}".encode()).digest()[:8], "big") & (2 ** 63 - 1)
    assert derive_seed(8, pid) != s


# ---- planning --------------------------------------------------------------------------------------

def fake(n, rg=None) -> InputFile:
    return InputFile(url=f"file:///f{n}", num_rows=n, row_groups=(n,) if rg is None else rg, size=1,
                     has_prompt_id=False, has_seed=False)


@pytest.mark.parametrize("shard_size", [1, 3, 7, 10, 1000])
def test_plan_shards_exact_row_accounting(shard_size):
    files = [fake(n) for n in [5, 0, 12, 1, 0, 9, 3]]
    shards = plan_shards(files, shard_size)
    seen = [(p.file, r) for s in shards for p in s.pieces for r in range(p.start, p.stop)]
    assert seen == [(i, r) for i, f in enumerate(files) for r in range(f.num_rows)]  # each once, in order
    assert [s.id for s in shards] == list(range(len(shards)))
    assert all(s.rows == shard_size for s in shards[:-1]) and 1 <= shards[-1].rows <= shard_size
    assert all(p.stop > p.start for s in shards for p in s.pieces)
    assert [Shard.from_dict(json.loads(json.dumps(s.to_dict()))) for s in shards] == shards


def test_plan_shards_edges():
    assert plan_shards([], 10) == [] and plan_shards([fake(0)], 10) == []
    for bad in [0, -1, 2.5, True]:
        with pytest.raises(ValueError):
            plan_shards([fake(3)], bad)
    shards = plan_shards([fake(10_000_000 // 100)] * 100, 1000)  # 10M rows: arithmetic only
    assert len(shards) == 10_000 and shards[100].pieces == (Piece(1, 0, 1000),)


# ---- reading ---------------------------------------------------------------------------------------

def test_read_shard_spans_files_and_row_groups(tmp_path, monkeypatch):
    write(tmp_path / "a.parquet", {"prompt": prompts(25, "a"), "prompt_id": [f"id{i}" for i in range(25)],
                                   "seed": list(range(100, 125)), "extra": [0] * 25}, row_group_size=10)
    write(tmp_path / "b.parquet", {"prompt": prompts(30, "b")}, row_group_size=8)
    files = list_inputs([str(tmp_path)])
    assert files[0].row_groups == (10, 10, 5) and files[1].row_groups == (8, 8, 8, 6)
    shards = plan_shards(files, 20)
    assert shards[1].pieces == (Piece(0, 20, 25), Piece(1, 0, 15))

    read = []
    orig = pq.ParquetFile.iter_batches
    monkeypatch.setattr(pq.ParquetFile, "iter_batches",
                        lambda self, row_groups=None, columns=None, **kw: read.append((row_groups, columns)) or
                        orig(self, row_groups=row_groups, columns=columns, **kw))
    rows = read_shard(files, shards[1], run_seed=5)
    assert read == [([2], ["prompt", "prompt_id", "seed"]), ([0], ["prompt"]), ([1], ["prompt"])]  # overlapping only
    assert [r.prompt for r in rows] == prompts(25, "a")[20:] + prompts(30, "b")[:15]
    assert [r.prompt_id for r in rows[:5]] == [f"id{i}" for i in range(20, 25)]
    assert [r.seed for r in rows[:5]] == list(range(120, 125))
    b_ids = [derive_prompt_id(files[1].url, i) for i in range(15)]
    assert [r.prompt_id for r in rows[5:]] == b_ids
    assert [r.seed for r in rows[5:]] == [derive_seed(5, i) for i in b_ids]
    assert all(r.error is None for r in rows)
    assert read_shard(files, shards[1], run_seed=5) == rows  # stable across calls
    assert [r.seed for r in read_shard(files, shards[1], run_seed=6)[5:]] != [r.seed for r in rows[5:]]

    all_rows = [r for s in shards for r in read_shard(files, s, 5)]
    assert [r.prompt for r in all_rows] == prompts(25, "a") + prompts(30, "b")


def test_bad_rows_become_row_errors(tmp_path):
    big = "x" * 100_000
    prompt = bad_utf8_strings([b"fine", b"ok\xff\xfe", b"", big.encode(), b"caf\xc3\xa9"])
    table_cols = {"prompt": prompt, "seed": pa.array([1, 2, None, 4, 5], pa.int64())}
    p = write(tmp_path / "f.parquet", table_cols)
    write(tmp_path / "g.parquet", {"prompt": ["a", None, "c"], "prompt_id": ["k1", "k2", None]})
    files = list_inputs([str(tmp_path)])
    assert pq.read_table(str(p)).schema.field("prompt").type == pa.string()  # really an (invalid) string column

    rows = read_shard(files, plan_shards(files, 100)[0], run_seed=1)
    assert [r.prompt for r in rows] == ["fine", None, "", big, "café", "a", None, "c"]
    assert rows[1].error == "prompt is not valid UTF-8 (byte 2)" and rows[1].seed == 2
    assert rows[2].error is None and rows[2].seed == derive_seed(1, rows[2].prompt_id)  # null seed: derived
    assert rows[3].error is None and len(rows[3].prompt) == 100_000  # long prompts are the model's call
    assert rows[6].error == "prompt is null" and rows[6].prompt_id == "k2"
    assert rows[7].prompt_id == derive_prompt_id(files[1].url, 2)  # null id: derived
    assert [r.error is None for r in rows] == [True, False, True, True, True, True, False, True]


def test_changed_file_is_detected(tmp_path):
    p = write(tmp_path / "a.parquet", {"prompt": prompts(10)})
    files = list_inputs([str(p)])
    write(p, {"prompt": prompts(12)})
    with pytest.raises(InputError, match="file changed since it was listed"):
        read_shard(files, plan_shards(files, 5)[0], 0)
