"""Storage primitives on any fsspec URL, with the guarantees the run's files need: a file is replaced whole or
not at all (`put`: a temp file and a rename on a local disk, one PUT on an object store), a create-only write
(`create`: a hard link locally, `If-None-Match: *` on S3) for commit markers and leases, and every refusal of the
store (a full disk, no permission) as one `StorageError` naming the URL. Object stores never get a bucket made.
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import posixpath
import uuid

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq


class CorruptMarker(ValueError):
    """A commit marker or run file that is not the JSON the run wrote (truncated, edited): named, never guessed."""


class StorageError(OSError):
    """A write or read the store refused (a full disk, no permission, a missing bucket): the message names the
    URL. It keeps the errno, so a full disk is not retried as if it were a reset connection."""


def storage_error(url: str, exc: OSError) -> StorageError:
    reason = os.strerror(exc.errno) if exc.errno else (str(exc) or type(exc).__name__)
    if exc.errno == errno.ENOSPC:
        reason += " (the disk is full: free space, then run the same command to resume)"
    return StorageError(exc.errno, f"{url}: {reason}")


class Store:
    """Files under one root URL."""

    def __init__(self, url: str):
        self.fs, root = fsspec.core.url_to_fs(url)
        self.root = root.rstrip("/")
        self.protocol = self.fs.protocol if isinstance(self.fs.protocol, str) else self.fs.protocol[0]
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
        except ValueError as e:
            raise CorruptMarker(f"{self.full_url(p)}: not valid JSON ({e}); the file was damaged or edited") from None

    def remove(self, name: str) -> None:
        try:
            self.fs.rm_file(self.path(name))
        except FileNotFoundError:
            pass

    def put(self, path: str, data: bytes) -> None:
        """Replace the file at `path` whole, or leave the old one: a failure (a full disk) never leaves a
        half-written file where a good one was. Local disks: a temp file beside it, then an atomic rename;
        object stores: one PUT, which is visible complete or not at all."""
        self._parent(path)
        try:
            if self.protocol not in ("file", "local"):
                self.fs.pipe_file(path, data)
                return
            tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
            try:
                with open(tmp, "wb") as f:
                    f.write(data)
                os.replace(tmp, path)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
        except StorageError:
            raise
        except OSError as e:
            raise storage_error(self.full_url(path), e) from None

    def _parent(self, path: str) -> None:
        """Local file systems need the folder; object stores have no folders (and must not get buckets made)."""
        if self.protocol in ("file", "local"):
            try:
                self.fs.makedirs(posixpath.dirname(path), exist_ok=True)
            except OSError as e:
                raise storage_error(self.full_url(posixpath.dirname(path)), e) from None

    def write_table(self, path: str, table: pa.Table) -> dict:
        """One PUT of a whole Parquet file; returns its record for the marker."""
        buf = io.BytesIO()
        pq.write_table(table, buf, compression="zstd")
        return self.write_bytes(path, buf.getvalue(), table.num_rows)

    def write_bytes(self, path: str, data: bytes, rows: int) -> dict:
        """One PUT of a whole file (visible all at once, or not at all); returns its record for the marker: its
        size, SHA-256 and what the store can check cheaply later (flows.verify): the MD5 an S3 ETag is, and a
        local file's mtime."""
        self._parent(path)
        try:
            self.fs.pipe_file(path, data)
            record = {"path": posixpath.relpath(path, self.root), "rows": rows, "bytes": len(data),
                      "sha256": hashlib.sha256(data).hexdigest(), "md5": hashlib.md5(data).hexdigest()}
            if self.protocol in ("file", "local"):
                record["mtime"] = self.fs.info(path)["mtime"]
            return record
        except OSError as e:
            raise storage_error(self.full_url(path), e) from None

    def create(self, p: str, data: bytes) -> bool:
        """Write `data` at `p` create-only, all at once. False if the name exists."""
        self._parent(p)
        if self.protocol in ("file", "local"):
            try:
                return _link_create(p, data)
            except OSError as e:
                raise storage_error(self.full_url(p), e) from None
        try:
            with self.fs.open(p, "xb") as f:
                f.write(data)
            return True
        except FileExistsError:
            return False
        except (ValueError, NotImplementedError):  # a filesystem without create-only writes
            if self.fs.exists(p):
                return False
            self.fs.pipe_file(p, data)
            return True


def _link_create(path: str, data: bytes) -> bool:
    """Create-only and atomic on a local disk: write a private temp file, then hard-link it into place
    (link fails if the name exists), so a reader never sees a half-written marker."""
    import os
    tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    finally:
        if os.path.exists(tmp):  # a full disk fails the write itself: no temp file stays behind either
            os.unlink(tmp)
