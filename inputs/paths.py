"""One spelling of a local input path, so that a resume compares files, not the ways they were written: a run's
`_config.json` records each input by its URL, and a row without a prompt_id is named after it (inputs.files), so
`/data/fresh/../p.csv`, `/data//p.csv` and `/data/p.csv` must be one URL.

The path is made absolute (fsspec already joins a relative one to the working folder), `.` and empty parts are
dropped, and `..` is taken as the operating system takes it: the parent of the real folder reached so far, which is
not the folder the text names when a part before it is a symbolic link (`link/../p.csv` opens the link target's
sibling). Other symbolic links are kept as written: the recorded path stays the one the user named. Only local
paths: in an object store `a/../k` is a key of its own.
"""

from __future__ import annotations

import os
import posixpath


def one_spelling(path: str) -> str:
    """`path` (a local, POSIX path) absolute, without `.`, `..`, doubled or trailing slashes (module doc)."""
    full = path if path.startswith("/") else posixpath.join(os.getcwd(), path)
    out = "/"
    for part in full.split("/"):
        if part == "..":
            out = posixpath.dirname(os.path.realpath(out))
        elif part not in ("", "."):
            out = posixpath.join(out, part)
    return out
