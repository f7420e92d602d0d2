"""Checking committed shards against their commit markers: nothing unchecked counts as done.

A marker names every file of its shard with its size and SHA-256 (output.layout.Output.write_bytes). Two depths:

    cheap (every resume, `ssdgen status`)   one listing of shards/ with details: each file is there, has its
                                            recorded size, and, where the store gives it, the same content
                                            identity (an S3 ETag is the MD5 of a one-PUT object); a local file
                                            whose mtime changed since its commit is hashed
    deep  (`ssdgen verify`, --deep)         every file read back and its SHA-256 compared

A resume, and `ssdgen verify` (unless --read-only), sets damaged shards aside (`Output.set_aside`: the marker
moves to _DAMAGED-*.json); the next run re-decodes them, saying so. A marker that is not valid JSON, or not
trusted inside its shard's folder (output.marker `Marker.read`), is damage too, named by its file.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Iterator

from ssdgen.storage.store import CorruptMarker
from .layout import MARKER, Output, _shard_of
from .marker import FileRecord, MarkerDigest


@dataclass(frozen=True)
class Damage:
    shard: int
    url: str  # the file (or the marker) that failed
    problem: str

    def __str__(self) -> str:
        return f"shard {self.shard}: {self.url}: {self.problem}"


def _listing(out: Output) -> dict[str, dict]:
    """path -> info of every file under shards/ (one paginated listing, not a request per file)."""
    out.store.fs.invalidate_cache()  # an object store's client caches listings: this one must be the store's now
    try:
        return out.store.fs.find(out.path("shards"), detail=True)
    except FileNotFoundError:
        return {}


def _check_file(out: Output, rec: FileRecord, info: dict | None, deep: bool) -> str | None:
    """What is wrong with one file the marker names, or None."""
    if info is None:
        return "missing"
    if int(info.get("size", -1)) != rec.bytes:
        return f"{info.get('size')} bytes, the marker says {rec.bytes}"
    etag = str(info.get("ETag") or info.get("etag") or "").strip('"')
    if rec.md5 and etag and "-" not in etag and etag != rec.md5:  # "-N": a multipart upload's ETag
        return "its ETag differs from the MD5 the marker recorded: the object was rewritten"
    # a local file rewritten since its commit has another mtime; so has an honest copy of the run (cp without
    # -p), so a changed mtime only sends the file to the SHA-256 check
    touched = rec.mtime is not None and info.get("mtime") is not None and info["mtime"] != rec.mtime
    if deep or touched:
        h = hashlib.sha256()
        with out.store.fs.open(out.path(rec.path), "rb") as f:
            while chunk := f.read(8 * 2**20):
                h.update(chunk)
        if h.hexdigest() != rec.sha256:
            return "its SHA-256 differs from the marker's: the content changed after the commit"
    return None


def damaged_shards(out: Output, deep: bool = False, sound: MarkerDigest | None = None) -> Iterator[Damage]:
    """Every committed shard whose marker is corrupt or whose files are missing or damaged, in shard order
    (one Damage per shard: the first problem found). `sound`, when given, gets every marker that passed."""
    listing = _listing(out)
    paths = sorted((p for p in listing if p.endswith("/" + MARKER)), key=_shard_of)
    for i in range(0, len(paths), 512):
        chunk = out.store.cat_files(paths[i:i + 512])
        for p in sorted(chunk, key=_shard_of):
            try:
                m = out.parse_marker(p, chunk[p])
            except CorruptMarker as e:
                yield Damage(_shard_of(p), out.full_url(p), e.reason)
                continue
            for rec in m.files:
                path = out.path(rec.path)
                if (problem := _check_file(out, rec, listing.get(path), deep)) is not None:
                    yield Damage(m.shard, out.full_url(path), problem)
                    break
            else:
                if sound is not None:
                    sound.add(m)


def set_aside(out: Output, damage: list[Damage], log) -> None:
    """Uncommit the damaged shards so this run re-decodes them; one log line each."""
    for d in damage:
        log.warning(f"re-decoding {d}")
        out.set_aside(d.shard)
