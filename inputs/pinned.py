"""Inputs pinned to the content a run recorded at its start: every read of an input file reads those bytes, or
fails its shard with one line naming the file. A prompts object overwritten while a run goes on must never give
the run rows of two versions.

How each store is held to it (`take_pin`, once per file as the run starts; `PinnedFile` on every open):

    S3 with versioning   the object's VersionId: every read asks for that version, so the run reads the old
                         text to its end even after an overwrite (s3fs `version_aware`, GetObject VersionId)
    S3 without it        the ETag: s3fs sends it as If-Match on every ranged GET, so a read after an overwrite
                         is refused (412, s3fs FileExpired) instead of returning new bytes
    a local disk         (size, mtime_ns, ctime_ns, inode) from stat, before the file is opened and again after
                         each read: any write moves mtime and ctime (ctime even when mtime is set back), and a
                         replacement by rename changes the inode; a stat costs no read
    other stores         the fields of `fs.info` that change with the content (ETag, md5Hash, generation,
                         size, mtime), before the open and after each read

A file read under a pin it no longer matches raises `changed(url)`, an InputError: permanent, never retried.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import fsspec

from ssdgen.storage.backends import backend_for
from ssdgen.storage.endpoints import is_s3

# fs.info fields that change whenever the content does, on stores with neither versions nor conditional reads
_INFO_KEYS = ("ETag", "etag", "md5Hash", "crc32c", "generation", "size", "mtime", "LastModified", "last_modified")


class InputError(ValueError):
    """A problem with the inputs that retrying cannot fix; the message names the file (URL). Defined here, below
    inputs.files (which re-exports it), because a changed input is one."""


@dataclass(frozen=True)
class Pin:
    kind: str   # "version" (S3 VersionId), "etag" (S3 ETag, read with If-Match), "stat" (local), "info" (others)
    value: str


def _local(fs) -> bool:
    return backend_for(fs).literal_paths  # a plain local disk: os.stat reads the path as fsspec strips it


def _stat_key(path: str) -> str:
    st = os.stat(path)
    return f"{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}:{st.st_ino}"


def _info_key(fs, path: str) -> str:
    fs.invalidate_cache(path)  # a client's cached listing would repeat what it saw at the start
    info = fs.info(path)
    return json.dumps({k: str(info[k]) for k in _INFO_KEYS if info.get(k) not in (None, "")}, sort_keys=True)


def take_pin(fs, path: str) -> tuple[Pin, dict | None]:
    """The pin of the file at `path` now, and on S3 the fresh HEAD it came from (its ETag tells whether the file
    changed since it was listed)."""
    if _local(fs):
        return Pin("stat", _stat_key(path)), None
    if is_s3(fs):
        fs.invalidate_cache(path)
        info = fs.info(path)
        version = info.get("VersionId")
        if version and version != "null":  # "null": an object written before versioning was turned on
            return Pin("version", str(version)), info
        if info.get("ETag"):
            return Pin("etag", str(info["ETag"])), info
    return Pin("info", _info_key(fs, path)), None


def changed(url: str, detail: str = "") -> Exception:
    """The one line a read of a changed input fails its shard with."""
    return InputError(f"{url}: the file changed since the run started{f' ({detail})' if detail else ''}; its rows "
                      "are not read, so the run never mixes two versions of it. Restore it, or start a new run "
                      "(a new --out, or --overwrite)")


def is_expired(exc: BaseException) -> bool:
    """s3fs's refusal of a read whose If-Match ETag no longer holds."""
    try:
        from s3fs.utils import FileExpired
    except ImportError:  # no s3fs: nothing raises it
        return False
    return isinstance(exc, FileExpired)


class PinnedFile:
    """An input file opened at the content the run pinned (InputFile.pin, from inputs.files.with_identities). Read
    `handle`; call `check()` after each read: on a local disk (and on stores read without versions or If-Match)
    that is where a change is seen. Raises the `changed` error. A file without a pin (listed but not yet pinned,
    or built by a test) is opened as it is."""

    def __init__(self, url: str, pin: Pin | None, storage_options: dict | None = None,
                 block_size: int | None = None):
        self.url, self.pin = url, pin
        opts = dict(storage_options or {})
        if self.pin is not None and self.pin.kind == "version":
            opts["version_aware"] = True  # s3fs reads a given version only on a version-aware filesystem
        self.fs, self.path = fsspec.core.url_to_fs(url, **opts)
        kw = {"block_size": block_size} if block_size and not _local(self.fs) else {}
        kind = self.pin.kind if self.pin is not None else None
        if kind in ("stat", "info"):
            self.check()
        elif kind == "etag":
            self.fs.invalidate_cache(self.path)  # s3fs sends the ETag it finds at open as If-Match: a fresh one
        try:
            if kind == "version":
                self.handle = self.fs.open(self.path, "rb", version_id=self.pin.value, **kw)
            else:
                self.handle = self.fs.open(self.path, "rb", **kw)
        except FileNotFoundError:
            if kind is None:
                raise
            raise changed(self.url, "it is gone" if kind != "version" else "its pinned version is gone") from None
        if kind == "etag" and self.handle.details.get("ETag") != self.pin.value:
            self.handle.close()
            raise changed(self.url, "its ETag differs")

    def check(self) -> None:
        """Raise the `changed` error when the file is no longer what was pinned (stat or info pins; a version or
        an If-Match ETag is checked by the store on every read)."""
        kind = self.pin.kind if self.pin is not None else None
        try:
            now = _stat_key(self.path) if kind == "stat" else _info_key(self.fs, self.path) if kind == "info" else None
        except FileNotFoundError:
            raise changed(self.url, "it is gone") from None
        if now is not None and now != self.pin.value:
            raise changed(self.url)

    def close(self) -> None:
        self.handle.close()

    def __enter__(self) -> "PinnedFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
