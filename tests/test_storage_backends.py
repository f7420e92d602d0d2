"""The storage layer's backends (storage/backends.py): each kind of store declares what it guarantees, and a store
that cannot create a file exclusively is refused for commit markers and the lease, in one line naming it, never
downgraded to check-then-write. The test double is an in-memory file system whose `open(mode="xb")` is fsspec's
generic check-then-write."""

import subprocess
import sys

import fsspec
import pytest
from fsspec.implementations.memory import MemoryFileSystem
from test_operations import ROOT, cli_env, one_error

from ssdgen.storage.backends import ExclusiveOpen, LocalDisk, NoExclusiveCreate, backend_for


class NoCreateFS(MemoryFileSystem):
    """A store without an exclusive create: its `xb` checks, then writes (two writers can both pass)."""
    protocol = "nocreatetest"
    store, pseudo_dirs = {}, [""]

    @classmethod
    def _strip_protocol(cls, path):
        return super()._strip_protocol(path.removeprefix("nocreatetest://"))  # memory's strips only memory://


def register() -> None:
    fsspec.register_implementation("nocreatetest", NoCreateFS, clobber=True)


def test_each_backend_declares_its_guarantees():
    import s3fs
    from faults import FaultyLocal, FaultyS3
    local = backend_for(fsspec.filesystem("file"))
    assert isinstance(local, LocalDisk) and local.create_only and local.atomic_replace and local.literal_paths
    s3 = backend_for(s3fs.S3FileSystem(anon=True))
    assert isinstance(s3, ExclusiveOpen) and s3.name == "S3" and s3.create_only and s3.buckets and not s3.folders
    assert backend_for(FaultyS3(anon=True)).name == "S3"  # a subclass keeps its parent's guarantees
    faulty = backend_for(FaultyLocal())
    assert isinstance(faulty, ExclusiveOpen) and faulty.folders and not faulty.literal_paths
    memory = backend_for(NoCreateFS())
    assert not memory.create_only and "NoCreateFS (nocreatetest://)" in memory.name


def test_a_store_without_exclusive_create_is_refused_for_markers_and_the_lease():
    from ssdgen.output.layout import Output
    from ssdgen.output.lease import Lease
    from ssdgen.output.marker import Marker
    register()
    NoCreateFS.store.clear()
    out = Output("nocreatetest://bucket/run")
    with pytest.raises(NoExclusiveCreate, match="NoCreateFS .nocreatetest://. cannot create a file exclusively"):
        out.commit(Marker(shard=0, files=(), attempt="attempt-x"))
    with pytest.raises(NoExclusiveCreate, match="the run's lease"):
        Lease(out).acquire()
    assert not NoCreateFS.store  # nothing written: no marker, no lease, no folder


def test_a_local_create_is_exclusive_and_tells_its_own_write(tmp_path):
    from ssdgen.storage.store import Store
    store = Store(str(tmp_path))
    p = store.path("x", "_SUCCESS.json")
    assert store.create(p, b"mine") and store.create(p, b"mine")  # a retried create of our own bytes: ours
    assert not store.create(p, b"theirs") and (tmp_path / "x" / "_SUCCESS.json").read_bytes() == b"mine"
    assert not list(tmp_path.rglob("*.tmp-*"))


@pytest.mark.integration
def test_generate_on_a_store_without_exclusive_create_stops_in_one_line_naming_it(tmp_path):
    """The way a user meets it: `ssdgen generate --out` on such a store stops before writing anything."""
    from pipeline_helpers import eval_rows, write_parquet
    src = tmp_path / "p.parquet"
    write_parquet(None, src, eval_rows(4))
    code = ("import test_storage_backends as t; t.register(); from ssdgen.cli import main; main()")
    proc = subprocess.run([sys.executable, "-c", code, "generate", "--prompts", str(src), "--out",
                           "nocreatetest://bucket/run", "--decoder", "ar", "--no-progress"], env=cli_env(), cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    one_error(proc, "--out nocreatetest://bucket/run", "NoCreateFS", "cannot create a file exclusively")



def _verify_on_the_double(*args: str) -> subprocess.CompletedProcess:
    """`ssdgen verify ... nocreatetest://bucket/run` on a run folder holding its config; prints what the store holds
    after."""
    code = ("import json, test_storage_backends as t; t.register(); "
            "t.NoCreateFS().pipe('/bucket/run/_config.json', json.dumps({'decoder': 'ar'}).encode()); "
            "from ssdgen.cli import main\ntry: main()\nfinally: print('store:', sorted(t.NoCreateFS.store))")
    return subprocess.run([sys.executable, "-c", code, "verify", *args, "nocreatetest://bucket/run"], env=cli_env(),
                          cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_verify_on_a_store_without_exclusive_create_stops_in_one_line_and_writes_nothing():
    """`ssdgen verify URL` writes (damaged shards set aside, the manifest rebuilt, under the run's lease): on such
    a store it stops in one line naming the backend, before writing; `--read-only` writes nothing and reports."""
    proc = _verify_on_the_double()
    one_error(proc, "NoCreateFS", "cannot create a file exclusively", "lease")
    assert "store: ['/bucket/run/_config.json']" in proc.stdout
    proc = _verify_on_the_double("--read-only")
    assert proc.returncode == 0 and "store: ['/bucket/run/_config.json']" in proc.stdout, proc.stderr[-2000:]


# --- a local file system without hard links (vfat, exFAT, many SMB and NFS mounts) ----------------------------
def _no_links(monkeypatch) -> None:
    import errno
    import os

    def refuse(*a, **k):
        raise PermissionError(errno.EPERM, "Operation not permitted")
    monkeypatch.setattr(os, "link", refuse)


def test_a_disk_that_refuses_hard_links_creates_by_o_excl(tmp_path, monkeypatch):
    """`os.link` refused (EPERM), O_EXCL honoured: the pre-flight check passes, markers and the lease are
    created exclusively by O_EXCL, and no temp file stays behind. Before, the run failed after start-up with
    '.../_lease/00000001.json: Operation not permitted'."""
    from ssdgen.output.folder import check_usable
    from ssdgen.output.layout import Output
    from ssdgen.output.lease import Lease, LeaseHeld
    from ssdgen.storage.store import Store
    _no_links(monkeypatch)
    out = Output(str(tmp_path / "run"))
    check_usable(out, f"--out {tmp_path / 'run'}")
    assert not (tmp_path / "run").exists() and list(tmp_path.iterdir()) == []  # the probe left nothing
    with Lease(out) as lease:
        assert lease.gen == 1
        with pytest.raises(LeaseHeld):
            Lease(out).acquire()
    store = Store(str(tmp_path / "run"))
    p = store.path("shards", "000000", "_SUCCESS.json")
    assert store.create(p, b"mine") and store.create(p, b"mine") and not store.create(p, b"theirs")
    assert (tmp_path / "run" / "shards" / "000000" / "_SUCCESS.json").read_bytes() == b"mine"
    assert not list(tmp_path.rglob("*.tmp-*"))


def test_a_disk_without_hard_links_or_o_excl_is_refused_before_the_run_naming_both(tmp_path, monkeypatch):
    import errno
    import os
    from ssdgen.output.folder import check_usable
    from ssdgen.output.layout import Output
    _no_links(monkeypatch)
    real_open = os.open

    def no_excl(path, flags, *a, **k):
        if flags & os.O_EXCL:
            raise OSError(errno.ENOTSUP, "Operation not supported")
        return real_open(path, flags, *a, **k)
    monkeypatch.setattr(os, "open", no_excl)
    with pytest.raises(NoExclusiveCreate) as e:
        check_usable(Output(str(tmp_path / "run")), f"--out {tmp_path / 'run'}")
    line = str(e.value)
    assert line.startswith(f"--out {tmp_path / 'run'}: the file system under {tmp_path}") and "\n" not in line
    assert "refuses hard links (os.link: Operation not permitted)" in line, line
    assert "exclusive creates (O_EXCL: Operation not supported)" in line, line
    assert list(tmp_path.iterdir()) == []
