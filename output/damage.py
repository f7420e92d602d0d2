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

The cheap check stays cheap on a rerun with nothing to do (`committed_state`): a run's end records a digest of
the listing it checked its markers against (`FilesCheck`: every path under shards/ with its size and its ETag or
mtime). A resume whose listing has exactly that digest finds nothing under shards/ changed since that check, and
reads no marker: 1,000 shards cost one listing, not 1,000 reads. Any change (a file rewritten, removed or added,
a marker set aside) differs, and every marker is read and checked as before.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Iterator

from ssdgen.storage.store import CorruptMarker
from .layout import MARKER, Output, _shard_of
from .marker import FileRecord, Marker, MarkerDigest


@dataclass(frozen=True)
class Damage:
    shard: int
    url: str  # the file (or the marker) that failed
    problem: str

    def __str__(self) -> str:
        return f"shard {self.shard}: {self.url}: {self.problem}"


def listing(out: Output) -> dict[str, dict]:
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


def damaged_shards(out: Output, deep: bool = False, sound: MarkerDigest | None = None,
                   found: dict | None = None) -> Iterator[Damage]:
    """Every committed shard whose marker is corrupt or whose files are missing or damaged, in shard order
    (one Damage per shard: the first problem found). `sound`, when given, gets every marker that passed.
    `found`: the listing of shards/ to check against (`listing`), when the caller has one."""
    found = listing(out) if found is None else found
    paths = sorted(marker_names(out, found), key=_shard_of)
    for i in range(0, len(paths), 512):
        chunk = out.store.cat_files(paths[i:i + 512])
        for p in sorted(chunk, key=_shard_of):
            try:
                m = out.parse_marker(p, chunk[p])
            except CorruptMarker as e:
                yield Damage(_shard_of(p), out.full_url(p), e.reason)
                continue
            if (d := _damage(out, m, found, deep)) is not None:
                yield d
            elif sound is not None:
                sound.add(m)


def marker_names(out: Output, found: dict) -> list[str]:
    """The commit markers in a listing: shards/{digits}/_SUCCESS.json, nothing deeper or otherwise named."""
    n = len(out.root) + 1
    return [p for p in found if p.endswith("/" + MARKER) and p[n:].count("/") == 2
            and p[n:].split("/")[1].isdigit()]


def _damage(out: Output, m: Marker, found: dict, deep: bool) -> Damage | None:
    """The first of the marker's files that fails the check against the listing `found`, as Damage; or None."""
    for rec in m.files:
        path = out.path(rec.path)
        if (problem := _check_file(out, rec, found.get(path), deep)) is not None:
            return Damage(m.shard, out.full_url(path), problem)
    return None


def listing_digest(out: Output, found: dict) -> str | None:
    """A digest of a listing of shards/: every file's path, size and identity (an object store's ETag, a disk's
    mtime); None where the store gives neither for a file (the digest could not tell a rewrite)."""
    h = hashlib.sha256()
    for p in sorted(found):
        info = found[p]
        ident = info.get("ETag") or info.get("etag") or info.get("mtime")
        if ident is None:
            return None
        h.update(f"{p[len(out.root) + 1:]}\t{info.get('size')}\t{ident}\n".encode())
    return f"{len(found)}:{h.hexdigest()}"


class FilesCheck:
    """The cheap check of markers already read (a run's end folds them all: output.summary) against one listing
    taken before: `see` each, then `digest` is the listing's, recorded in summary.json, when every marker it
    lists was seen and passed (else None: the next resume reads and checks every marker)."""

    def __init__(self, out: Output, found: dict):
        self.out, self.found = out, found
        self.listed = {_shard_of(p) for p in marker_names(out, found)}
        self.seen: set[int] = set()
        self.damage: list[Damage] = []

    def see(self, m: Marker) -> Marker:
        self.seen.add(m.shard)
        if (d := _damage(self.out, m, self.found, deep=False)) is not None:
            self.damage.append(d)
        return m

    def digest(self) -> str | None:
        return None if self.damage or not self.listed <= self.seen else listing_digest(self.out, self.found)


def committed_state(out: Output, n_shards: int) -> tuple[bytearray, list[Damage], str]:
    """(done[i] == 1: shard i committed and sound; the damaged shards; the digest of the sound markers), for a
    resume, from one listing. Every marker is read and checked (`damaged_shards`) unless the listing is the one
    the last run's summary recorded (`listing_digest`): then the summary's digest of the markers stands."""
    found = listing(out)
    done = bytearray(n_shards)
    for p in marker_names(out, found):
        if (i := _shard_of(p)) < n_shards:
            done[i] = 1
    try:
        summary = out.read_summary() or {}
    except CorruptMarker:  # rebuilt by the run (output.converge)
        summary = {}
    recorded, markers = summary.get("listing_digest"), summary.get("markers_digest")
    if recorded and isinstance(markers, str) and recorded == listing_digest(out, found):
        return done, [], markers
    sound = MarkerDigest()
    damaged = list(damaged_shards(out, sound=sound, found=found))
    for d in damaged:
        if d.shard < n_shards:
            done[d.shard] = 0
    return done, damaged, sound.value()


def set_aside(out: Output, damage: list[Damage], log) -> None:
    """Uncommit the damaged shards so this run re-decodes them; one log line each."""
    for d in damage:
        log.warning(f"re-decoding {d}")
        out.set_aside(d.shard)
