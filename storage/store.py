"""Storage primitives on any fsspec URL, with the guarantees the run's files need, as the store's backend
declares and does them (storage/backends.py): a file is replaced whole or not at all (`put`), a create-only
write (`create`) for commit markers and leases, refused on a store that cannot do it, and every refusal of the
store (a full disk, no permission) as one `StorageError` naming the URL. Object stores never get a bucket made.
Every write and delete is retried through transient faults (throttling, 5xx, resets) up to a deadline
(storage.retry).

A run's Output carries a fence (its driver's lease check, output.lease): every write and delete here calls it
first, so a driver that lost its lease changes nothing more.

Deletes are best-effort where the run can go on without them (`discard`: the lease's release, gc of old attempts,
an uncommitted attempt's clean-up): a store that refuses them (a role without s3:DeleteObject, an object-lock
bucket) gets a few more tries, then one line naming the object and what the delete was for, and the run goes on.
"""

from __future__ import annotations

import errno
import fnmatch
import hashlib
import io
import json
import os
import posixpath
import time

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq

from .backends import Backend, backend_for
from .retry import retried

DENIED_TRIES = 3  # a refused delete is tried this often (a policy or token that is changing), then reported


class CorruptMarker(ValueError):
    """A commit marker or run file that is not the JSON the run wrote (truncated, edited): named, never guessed."""


class StorageError(OSError):
    """A write or read the store refused (a full disk, no permission, a missing bucket): the message names the
    URL. It keeps the errno, so a full disk is not retried as if it were a reset connection."""


def storage_error(url: str, exc: OSError) -> StorageError:
    # an object store's refusal (s3fs: PermissionError("Access Denied")) has no errno: EACCES, so it is not retried
    code = exc.errno if exc.errno is not None or not isinstance(exc, PermissionError) else errno.EACCES
    reason = os.strerror(code) if code else (str(exc) or type(exc).__name__)
    if code == errno.ENOSPC:
        reason += " (the disk is full: free space, then run the same command to resume)"
    return StorageError(code, f"{url}: {reason}")


def parquet_bytes(table: pa.Table) -> bytes:
    """A table as one Parquet file's bytes (zstd): how every Parquet file of a run is encoded."""
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd")
    return buf.getvalue()


class Store:
    """Files under one root URL."""

    fence = None  # a callable that raises when this driver may no longer write (set by the run: flows.pipeline)

    def __init__(self, url: str):
        self.fs, root = fsspec.core.url_to_fs(url)
        self.root = root.rstrip("/")
        self.protocol = self.fs.protocol if isinstance(self.fs.protocol, str) else self.fs.protocol[0]
        self.backend: Backend = backend_for(self.fs)
        self.url = url

    def path(self, *parts: str) -> str:
        return posixpath.join(self.root, *parts)

    def full_url(self, path: str) -> str:
        return self.fs.unstrip_protocol(path)

    def read_json(self, name: str) -> dict | None:
        """One of the run's JSON files (config, plan, summary), or None when absent; a corrupt one is named."""
        p = self.path(name)
        try:
            data = self.fs.cat_file(p)
        except FileNotFoundError:
            return None
        except OSError as e:
            raise storage_error(self.full_url(p), e) from None
        try:
            return json.loads(data)
        except (ValueError, RecursionError) as e:  # RecursionError: nested too deeply for the parser
            raise CorruptMarker(f"{self.full_url(p)}: not valid JSON ({e}); the file was damaged or edited") from None

    def require_create_only(self, flag: str) -> None:
        """Before the run: the backend creates exclusively, and so does the file system under the root (a local
        disk's may refuse hard links and offer O_EXCL, or neither: storage/backends.py `probe`)."""
        self.backend.require_create_only(flag)
        self.backend.probe(self.fs, self.root, flag)

    @retried
    def remove(self, name: str) -> None:
        self._fenced()
        try:
            self.fs.rm_file(self.path(name))
        except FileNotFoundError:
            pass
        except PermissionError as e:  # a delete the run cannot go on without: one line naming the object
            raise storage_error(self.full_url(self.path(name)), e) from None

    @retried
    def put(self, path: str, data: bytes) -> None:
        """Replace the file at `path` whole, or leave the old one: a failure (a full disk) never leaves a
        half-written file where a good one was (the backend's `replace`: a rename locally, one PUT on S3)."""
        self._fenced()
        self._parent(path)
        try:
            self.backend.replace(self.fs, path, data)
        except StorageError:
            raise
        except OSError as e:
            raise storage_error(self.full_url(path), e) from None

    def _fenced(self) -> None:
        if self.fence is not None:
            self.fence()

    def _parent(self, path: str) -> None:
        """Local file systems need the folder; object stores have no folders (and must not get buckets made)."""
        if self.backend.folders:
            try:
                self.fs.makedirs(posixpath.dirname(path), exist_ok=True)
            except OSError as e:
                raise storage_error(self.full_url(posixpath.dirname(path)), e) from None

    def write_table(self, path: str, table: pa.Table) -> dict:
        """One PUT of a whole Parquet file; returns its record for the marker."""
        return self.write_bytes(path, parquet_bytes(table), table.num_rows)

    @retried
    def write_bytes(self, path: str, data: bytes, rows: int) -> dict:
        """One PUT of a whole file (visible all at once, or not at all); returns its record for the marker: its
        size, SHA-256 and what the store can check cheaply later (output.damage): the MD5 an S3 ETag is, and a
        local file's mtime."""
        self._fenced()
        self._parent(path)
        try:
            self.fs.pipe_file(path, data)
            record = {"path": posixpath.relpath(path, self.root), "rows": rows, "bytes": len(data),
                      "sha256": hashlib.sha256(data).hexdigest(), "md5": hashlib.md5(data).hexdigest()}
            if self.backend.folders:  # a file system's mtime (an object store's ETag is the md5 above)
                record["mtime"] = self.fs.info(path)["mtime"]
            return record
        except OSError as e:
            raise storage_error(self.full_url(path), e) from None

    @retried
    def create(self, p: str, data: bytes) -> bool:
        """Write `data` at `p` create-only, all at once. False if the name holds another writer's object. `data`
        must be unique to this writer (a lease's token, a marker's attempt): when the store's answer to our PUT
        is lost, the client retries and finds the object there, and reading it back tells our own write from
        another's. A store that cannot create exclusively raises NoExclusiveCreate (storage/backends.py)."""
        self._fenced()
        self._parent(p)
        if not self.backend.literal_paths:  # an object store's errors go to the retry as they are (storage/retry.py)
            return self.backend.create(self.fs, p, data) or self._ours(p, data)
        try:
            return self.backend.create(self.fs, p, data) or self._ours(p, data)
        except OSError as e:
            raise storage_error(self.full_url(p), e) from None

    def _ours(self, p: str, data: bytes) -> bool:
        self.fs.invalidate_cache(p)  # a cached listing from before our write would say the object is not there
        try:
            return self.fs.cat_file(p) == data
        except FileNotFoundError:  # removed again meanwhile (a released lease): not ours either
            return False

    # paths taken literally ------------------------------------------------------------------------------
    # fsspec reads `*?[` as a glob wherever it expands a path (glob, cat of a list, rm and mv on an object store):
    # in a run at `runs/br[1]` it would list, read or delete the files of `runs/br1`. These never expand the root.
    def glob(self, folder: str, *patterns: str) -> list[str]:
        """Paths under root/folder matching `patterns`, one glob per level below it (fnmatch): the root and the
        folder are taken as written. One listing, as fsspec's own glob makes."""
        base = self.path(folder)
        try:
            found = self.fs.find(base, maxdepth=len(patterns), withdirs=True)
        except FileNotFoundError:
            return []
        out = []
        for p in found:
            parts = posixpath.relpath(p, base).split("/")
            if len(parts) == len(patterns) and all(map(fnmatch.fnmatchcase, parts, patterns)):
                out.append(p)
        return out

    def cat_files(self, paths: list[str], missing_ok: bool = False) -> dict[str, bytes]:
        """path -> content of each file, read concurrently where the store can (an object store). With
        `missing_ok`, a file that is not there is left out; any other failure is raised."""
        got = self.fs.cat_ranges(list(paths), None, None, on_error="return" if missing_ok else "raise")
        if err := next((e for e in got if isinstance(e, Exception) and not isinstance(e, FileNotFoundError)), None):
            raise err
        return {p: data for p, data in zip(paths, got) if not isinstance(data, Exception)}

    @retried
    def remove_tree(self, path: str, fenced: bool = True) -> None:
        """Delete a file or a folder with everything under it. `fenced=False` only for what this driver alone
        wrote and never committed (its attempt, removed after it lost the lease: flows.commit)."""
        if fenced:
            self._fenced()
        if self.backend.literal_paths:
            self.fs.rm(path, recursive=True)  # a local file system's rm does not glob
            return
        # the objects under it, listed, then deleted by name through the backend: fsspec's rm would read `*?[`
        # in the run's URL as a pattern on an object store, and s3fs's bulk delete drops the keys it refused
        self.backend.delete(self.fs, sorted(self.fs.find(path)))
        if self.backend.folders and self.fs.isdir(path):  # a local file system under another protocol
            self.fs.rm(path, recursive=True)

    def discard(self, path: str, what: str, tree: bool = False, fenced: bool = True, sleep=time.sleep) -> str | None:
        """Delete `path` (a file, or with `tree` a folder) where the run goes on without it: None once it is gone
        (or was never there), else one line naming the object and `what` the delete was for. Transient faults
        are retried as every delete is (storage.retry); a refusal (no delete permission) DENIED_TRIES times."""
        for attempt in range(DENIED_TRIES):
            try:
                if tree:
                    self.remove_tree(path, fenced=fenced)
                else:
                    self._remove_file(path, fenced)
                return None
            except FileNotFoundError:
                return None
            except OSError as e:  # refused, or a transient fault past its deadline, or a store's other refusal
                err = e
                if not isinstance(e, PermissionError) and e.errno not in (errno.EACCES, errno.EPERM):
                    break
                if attempt + 1 < DENIED_TRIES:
                    sleep(0.2 * 2 ** attempt)
        reason = err.strerror or str(err) or type(err).__name__
        return (f"could not delete {self.full_url(path)} ({what}): {reason}; left in place (the run goes on; "
                "a role allowed to delete removes it later)")

    @retried
    def _remove_file(self, path: str, fenced: bool) -> None:
        if fenced:
            self._fenced()
        self.fs.rm_file(path)  # one DELETE by name: no pattern is read in it, and a refusal is raised

    @retried
    def move(self, src: str, dst: str) -> None:
        """Rename a file (an object store: copy, then delete, as fsspec's mv does)."""
        self._fenced()
        if self.backend.literal_paths:
            self.fs.mv(src, dst)
            return
        self.fs.cp_file(src, dst)
        try:
            self.fs.rm_file(src)
        except PermissionError as e:  # the copy is made, the original stays: one line naming it
            raise storage_error(self.full_url(src), e) from None
