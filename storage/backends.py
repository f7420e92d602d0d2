"""One backend per kind of store, each declaring the guarantees a run relies on, and doing the writes that
depend on them (storage/store.py calls these, and branches on nothing else):

| backend           | replaced whole (`replace`)   | create-only (`create`)          | listing after write |
|-------------------|------------------------------|---------------------------------|---------------------|
| local disk        | temp file + atomic rename    | temp file + hard link (atomic)  | yes                 |
| S3 (s3fs)         | one PUT                      | PUT with `If-None-Match: *`     | yes (strong, 2020-12) |
| local file system | one write through fsspec     | open(mode="xb"): O_EXCL         | yes                 |
|   under another protocol (an fsspec LocalFileSystem subclass)                                      |
| anything else     | one write through fsspec     | none: refused                   | not declared        |

Why refuse. A commit marker and the lease are correct only if two writers racing for one name cannot both
win. A store that cannot create exclusively would get check-then-write, which two writers can both pass:
a shard committed twice with different files, two drivers both holding the lease. So a run on such a store
stops before it writes, in one line naming the backend (`require_create_only`), instead of losing that
guarantee without a word. (fsspec's generic `open(mode="xb")` is exactly check-then-write: it is trusted only
where the backend says the file system does it atomically.)

A local file system may refuse hard links (vfat, exFAT, many SMB and NFS mounts: `os.link` raises EPERM or
ENOTSUP) and still create exclusively with O_EXCL: a local disk then creates by O_EXCL (open, write, fsync), and
a reader may see the file before its bytes are all there (a torn marker is damage, set aside and re-decoded; a
torn lease is watched). Which of the two the output's file system does is probed before the run starts
(`probe`), and a file system that does neither is refused in one line naming both.

Deletes go through `delete` too: on S3 one DeleteObjects per 1,000 keys whose per-key refusals (a role without
s3:DeleteObject answers each key AccessDenied inside a 200) are raised, never dropped as s3fs's bulk delete does.
"""

from __future__ import annotations

import errno
import os
import uuid
from dataclasses import dataclass

LOCAL_PROTOCOLS = ("file", "local")
# what os.link raises where the file system has no hard links (EPERM: vfat, exFAT, SMB; ENOTSUP: some NFS)
NO_LINKS = {errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS, errno.EMLINK}


class NoExclusiveCreate(ValueError):
    """The store cannot create a file exclusively: commit markers and the lease cannot be kept on it."""


@dataclass(frozen=True)
class Backend:
    """What a kind of store guarantees, and how the writes that depend on it are done. Subclasses override
    `replace` and `create`; the flags say what the rest of the code may rely on."""

    name: str
    atomic_replace: bool = True  # `replace` leaves the old file or the whole new one, never a part
    create_only: bool = False  # `create` cannot race: of two writers of one name, exactly one wins
    list_after_write: bool = False  # a listing right after a write includes it
    folders: bool = False  # folders must exist before a write (local disks); object stores have none
    buckets: bool = False  # an object store: its bucket must exist and is never made for the user
    literal_paths: bool = False  # rm and mv take a path as written (fsspec's own expand `*?[` elsewhere)

    def replace(self, fs, path: str, data: bytes) -> None:
        fs.pipe_file(path, data)

    def create(self, fs, path: str, data: bytes) -> bool:
        """Write `data` at `path` if nothing is there: True; False when the name is taken."""
        raise NoExclusiveCreate(self.refusal(fs.unstrip_protocol(path)))

    def refusal(self, url: str) -> str:
        return (f"{url}: {self.name} cannot create a file exclusively, which commit markers and the run's lease "
                "need (two writers could both win); write the run to a local disk or to S3")

    def require_create_only(self, url: str) -> None:
        """Raise NoExclusiveCreate (one line naming the backend) unless this store can create exclusively."""
        if not self.create_only:
            raise NoExclusiveCreate(self.refusal(url))

    def probe(self, fs, root: str, url: str) -> None:
        """Check, before the run writes, that the store at `root` does what this backend declares; raise
        NoExclusiveCreate naming what it lacks. Only a local disk's file system can differ from its kind."""

    def delete(self, fs, paths: list[str]) -> None:
        """Delete these files (no folders, no patterns); the first refusal is raised."""
        for p in paths:
            fs.rm_file(p)


@dataclass(frozen=True)
class LocalDisk(Backend):
    name: str = "a local disk"
    create_only: bool = True
    list_after_write: bool = True
    folders: bool = True
    literal_paths: bool = True

    def replace(self, fs, path: str, data: bytes) -> None:
        """A temp file beside it, then an atomic rename: a full disk leaves the old file, never half a new one."""
        tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
        try:
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    def create(self, fs, path: str, data: bytes) -> bool:
        """A private temp file, hard-linked into place (link fails if the name exists): create-only and atomic,
        so a reader never sees a half-written marker. Where the file system refuses hard links, O_EXCL."""
        tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
        try:
            with open(tmp, "wb") as f:
                f.write(data)
            os.link(tmp, path)
            return True
        except FileExistsError:
            return False
        except OSError as e:
            if not _no_links(e):
                raise
        finally:
            if os.path.exists(tmp):  # a full disk fails the write itself: no temp file stays behind either
                os.unlink(tmp)
        return exclusive_write(path, data)

    def probe(self, fs, root: str, url: str) -> None:
        """Hard links, else O_EXCL, in the output's folder (or the nearest folder above it that exists: nothing
        is made for a run that may never start): two probe files, removed at once. A file system that does
        neither is refused naming both; one that cannot be written at all is left to the run's first write,
        which names the path and the reason."""
        where = root
        while where and not os.path.isdir(where):
            where = os.path.dirname(where.rstrip("/"))
        probe = os.path.join(where or ".", f".ssdgen-probe-{uuid.uuid4().hex[:8]}")
        try:
            missing = _lacks_create(probe)
        except OSError:
            return
        finally:
            for p in (probe, probe + ".link"):
                if os.path.lexists(p):
                    os.unlink(p)
        if missing:
            raise NoExclusiveCreate(f"{url}: the file system under {where} {missing}; commit markers and the run's "
                                    "lease need one of the two (two writers could both win); write the run to "
                                    "another disk or to S3")


def _no_links(e: OSError) -> bool:
    """os.link refused because the file system has no hard links (our own temp file, in the same folder: not
    a permission we lack)."""
    return isinstance(e, PermissionError) or e.errno in NO_LINKS


def exclusive_write(path: str, data: bytes) -> bool:
    """O_CREAT | O_EXCL, then the bytes and an fsync: False when the name is taken. A write that fails after the
    create (a full disk) removes the file it made, so no torn file is left for a reader."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except FileExistsError:
        return False
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        os.unlink(path)
        raise
    return True


def _why(e: OSError) -> str:
    return e.strerror or str(e) or type(e).__name__


def _lacks_create(probe: str) -> str | None:
    """What the file system lacks of an exclusive create, in words, or None (probe: a free name in it)."""
    with open(probe, "wb") as f:
        f.write(b"ssdgen")
    try:
        os.link(probe, probe + ".link")
        return None
    except OSError as e:
        if not _no_links(e):
            raise
        links = f"refuses hard links (os.link: {_why(e)})"
    os.unlink(probe)
    try:
        made = exclusive_write(probe, b"ssdgen") and not exclusive_write(probe, b"ssdgen")
    except OSError as e:
        return f"{links} and exclusive creates (O_EXCL: {_why(e)})"
    return None if made else f"{links} and does not refuse a second O_EXCL create of one name"


@dataclass(frozen=True)
class ExclusiveOpen(Backend):
    """A store whose `open(path, "xb")` is itself exclusive: S3 (s3fs sends `If-None-Match: *`, and S3 answers
    412 to the second writer) and fsspec's LocalFileSystem under another protocol (Python's open, O_EXCL)."""

    create_only: bool = True
    list_after_write: bool = True

    def create(self, fs, path: str, data: bytes) -> bool:
        try:
            with fs.open(path, "xb") as f:
                f.write(data)
            return True
        except FileExistsError:
            return False


@dataclass(frozen=True)
class S3(ExclusiveOpen):
    name: str = "S3"
    buckets: bool = True

    def delete(self, fs, paths: list[str]) -> None:
        """One DeleteObjects per 1,000 keys (S3's limit). S3 answers a refused key inside a 200 (`Errors`):
        the first is raised, as a PermissionError for AccessDenied, naming the object."""
        for i in range(0, len(paths), 1000):
            chunk = paths[i:i + 1000]
            bucket = fs.split_path(chunk[0])[0]
            keys = [{"Key": fs.split_path(p)[1]} for p in chunk]
            answer = fs.call_s3("delete_objects", Bucket=bucket, Delete={"Objects": keys, "Quiet": True})
            for p in chunk:
                fs.invalidate_cache(p)
            if errors := answer.get("Errors"):
                e = errors[0]
                kind = PermissionError if e.get("Code") == "AccessDenied" else OSError
                more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
                raise kind(errno.EACCES if kind is PermissionError else errno.EIO,
                           f"{e.get('Code')}: {e.get('Message')}{more}", f"{bucket}/{e.get('Key')}")


def backend_for(fs) -> Backend:
    """The backend of an fsspec file system: by its protocol for a plain local disk, by its class otherwise
    (a subclass keeps its parent's guarantees: a test's fault-injecting S3 is still S3)."""
    protocols = (fs.protocol,) if isinstance(fs.protocol, str) else tuple(fs.protocol)
    if set(protocols) & set(LOCAL_PROTOCOLS):
        return LocalDisk()
    from fsspec.implementations.local import LocalFileSystem
    if isinstance(fs, LocalFileSystem):
        return ExclusiveOpen(f"a local file system ({protocols[0]}://)", folders=True)
    try:
        from s3fs import S3FileSystem
    except ImportError:  # without s3fs no S3 file system exists either
        S3FileSystem = ()
    if S3FileSystem and isinstance(fs, S3FileSystem):
        return S3()
    return Backend(f"{type(fs).__name__} ({protocols[0]}://)", buckets=True)
