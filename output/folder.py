"""The run's folder as a whole, before and around a run: whether the output can hold a run at all (create-only
writes, not a file, its bucket there), whether it lies inside the prompts it would read, what it holds, and
clearing it for --overwrite. Functions of an `Output`, on its store."""

from __future__ import annotations

import posixpath
import re

import fsspec

from ssdgen.inputs.files import is_pattern
from ssdgen.storage.endpoints import check_bucket
from ssdgen.storage.store import StorageError

from .layout import Output


def check_usable(out: Output, flag: str) -> None:
    """The store can create exclusively (commit markers and the lease need it: storage/backends.py; on a local
    disk by hard links or O_EXCL, probed here), the output is not a file, and its bucket exists (never created
    for the user): one line naming `flag`."""
    store = out.store
    store.require_create_only(flag)
    try:
        if store.fs.isfile(out.root):
            raise ValueError(f"{flag}: is a file; give a folder (or an object-store prefix) for the run")
        if store.backend.buckets:
            # a missing bucket, or an endpoint or credential error
            check_bucket(flag, store.fs, out.root.split("/", 1)[0])
    except OSError as e:
        raise StorageError(e.errno, f"{flag}: cannot reach the store ({type(e).__name__}: {e})") from None

def is_inside(out: Output, url: str) -> bool:
    """Whether this output lies inside the input folder or glob `url` (a run would list its own files as
    prompts); a file named exactly is not a folder."""
    fs, path = fsspec.core.url_to_fs(url)
    pattern = is_pattern(fs, path)  # `in[1]/` that exists is a folder, not a glob
    base = (re.split(r"[*?\[]", path)[0] if pattern else path).rstrip("/")
    same_store = type(fs) is type(out.store.fs)
    return (same_store and (out.root == base or out.root.startswith(base + "/"))
            and (pattern or not fs.isfile(path)))

def size(out: Output) -> tuple[int, int]:
    """(files, bytes) under the output, for what --overwrite says it deletes."""
    try:
        infos = out.store.fs.find(out.root, detail=True)
    except FileNotFoundError:
        return 0, 0
    return len(infos), sum(int(i.get("size") or 0) for i in infos.values())

def clear(out: Output, keep: str) -> None:
    """Delete everything under the output but `keep` (the lease of the run that overwrites)."""
    try:
        entries = out.store.fs.ls(out.root, detail=False)
    except FileNotFoundError:
        return
    for e in entries:
        if posixpath.basename(e.rstrip("/")) != keep:
            out.store.remove_tree(e)
