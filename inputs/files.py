"""Input discovery and validation: prompt files on any fsspec storage (local, S3, ...): Parquet, and CSV, TSV,
JSON, JSON Lines and plain text (inputs.text).

`list_inputs` expands URLs (files, directories/prefixes, globs) into `InputFile`s using only each Parquet
file's footer (a text file is parsed whole), and checks the schema up front so a bad input fails before any GPU
work starts. A path that exists is taken as written, even with `*?[` in it; only one that does not is a glob.
`with_identities` records each file's content identity and pins every later read of the run to that
content (inputs.pinned).
`check_unique_prompt_ids` reads only the `prompt_id` column to reject duplicate ids (ids key outputs
and resume); `check_seeds` reads only a uint64 `seed` column, to refuse seeds an int64 cannot hold. Rows without
an id or seed get stable derived ones (`derive_prompt_id`, `derive_seed`).

Error messages name the file and never include storage options (they may hold credentials). An unreachable
storage endpoint is found in seconds and said in one line naming the URL and the endpoint (storage/endpoints.py).
"""

from __future__ import annotations

import hashlib
import posixpath
import re
from dataclasses import dataclass

import fsspec
from fsspec.implementations.local import LocalFileSystem
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ssdgen.storage.endpoints import endpoint_of, is_s3, probe, refused, unreachable

from .columns import extra_fields
from .paths import one_spelling
from .pinned import InputError, Pin, PinnedFile, changed, is_expired, take_pin
from .text import ReadAs, parse


@dataclass(frozen=True)
class InputFile:
    url: str                     # full fsspec URL incl. protocol, e.g. "s3://b/k.parquet", "file:///a/b.parquet"
    num_rows: int
    row_groups: tuple[int, ...]  # rows per row group, from the footer
    size: int                    # bytes; a different size on resume means the input changed
    has_prompt_id: bool
    has_seed: bool
    identity: str | None = None  # the content's identity (ETag, version, SHA-256): `with_identities` fills it
    pin: Pin | None = None       # what every later read is held to (inputs.pinned): `with_identities` fills it
    wide_seeds: bool = False     # the seed column is uint64, so values may not fit an int64: `check_seeds` reads it
    extra: tuple[pa.Field, ...] = ()  # its columns beyond prompt, prompt_id and seed (inputs.columns)
    format: str = "parquet"      # parquet, csv, tsv, json, jsonl or txt (inputs.text)
    prompt_column: str = "prompt"  # the column read as the prompt (--prompt-column)


_GLOB_CHARS = "*?["
PARQUET = ReadAs()  # the default: by suffix, a folder's *.parquet, the `prompt` column
INT64_MAX = 2**63 - 1  # seeds are stored as int64 (images and audit Parquet) and decoded modulo 2^64 (decoders/rng)
_DERIVED_ID = re.compile(r"^([0-9a-f]{10})-([0-9]{10})$")


def derive_prompt_id(file_url: str, row: int) -> str:
    """Stable id for a row without one. The protocol is dropped so s3:// and s3a:// agree."""
    digest = hashlib.sha1(file_url.split("://", 1)[-1].encode()).hexdigest()[:10]
    return f"{digest}-{row:010d}"


def derive_seed(run_seed: int, prompt_id: str) -> int:
    """Stable 63-bit seed for a row without one: first 8 bytes (big-endian) of sha256."""
    digest = hashlib.sha256(f"{run_seed}:{prompt_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") & ((1 << 63) - 1)


def _secrets(options) -> list[str]:
    """String values in storage options (recursively), longest first, to scrub from messages."""
    found: list[str] = []
    if isinstance(options, dict):
        for v in options.values():
            found += _secrets(v)
    elif isinstance(options, (list, tuple)):
        for v in options:
            found += _secrets(v)
    elif isinstance(options, str) and len(options) >= 4:  # shorter values would mangle messages
        found.append(options)
    return sorted(set(found), key=len, reverse=True)


def _reason(exc: BaseException, storage_options: dict | None) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    for secret in _secrets(storage_options or {}):
        text = text.replace(secret, "***")
    return text if len(text) <= 400 else text[:400] + "..."


def _read_error(url: str, exc: BaseException, storage_options: dict | None, fs=None) -> InputError:
    """`cannot read URL: reason`, or, when the storage endpoint was not reached, one line saying so and where
    (storage/endpoints.py)."""
    why = unreachable(exc)
    if why is None and (code := refused(exc)) is not None:  # a 403: the credentials, not the data, are wrong
        return InputError(f"{url}: the store refused the credentials ({code}); check AWS_ACCESS_KEY_ID / "
                          "AWS_PROFILE and the bucket's policy")
    if why is None:
        return InputError(f"cannot read {url}: {_reason(exc, storage_options)}")
    where = endpoint_of(exc, fs)
    hint = "; check AWS_ENDPOINT_URL / the endpoint_url setting" if fs is not None and is_s3(fs) else ""
    text = f"{url}: cannot reach the storage endpoint{f' {where}' if where else ''} ({why}){hint}"
    for secret in _secrets(storage_options or {}):
        text = text.replace(secret, "***")
    return InputError(text)


def _url_to_fs(url: str, storage_options: dict | None):
    try:
        return fsspec.core.url_to_fs(url, **(storage_options or {}))
    except Exception as e:  # unknown protocol, missing driver, bad option: all permanent
        raise InputError(f"cannot read {url}: {_reason(e, storage_options)}") from None


def _is_text(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t)


def _value_type(t: pa.DataType) -> pa.DataType:
    # Dictionary-encoded columns (e.g. from pandas categoricals) are judged by their values.
    return t.value_type if pa.types.is_dictionary(t) else t


def _check_schema(url: str, schema: pa.Schema, prompt: str = "prompt") -> tuple[bool, bool]:
    names = schema.names
    for name in (prompt, "prompt_id", "seed"):
        if names.count(name) > 1:
            raise InputError(f"{url}: column {name!r} appears {names.count(name)} times")
    if prompt not in names:
        hint = "" if prompt != "prompt" else "; --prompt-column names another"
        raise InputError(f"{url}: no {prompt!r} column (columns: {', '.join(names) or 'none'}{hint})")
    t = _value_type(schema.field(prompt).type)
    if pa.types.is_null(t):  # a text file whose prompts are all empty: no rows to type them by
        raise InputError(f"{url}: column {prompt!r} has no values")
    if not _is_text(t):
        raise InputError(f"{url}: column {prompt!r} has type {t}; expected string (UTF-8 text)")
    if "prompt_id" in names:
        t = _value_type(schema.field("prompt_id").type)
        if not (_is_text(t) or pa.types.is_integer(t)):
            raise InputError(f"{url}: column 'prompt_id' has type {t}; expected string or integer")
    if "seed" in names:
        t = _value_type(schema.field("seed").type)
        if not pa.types.is_integer(t):
            raise InputError(f"{url}: column 'seed' has type {t}; expected integer")
    return "prompt_id" in names, "seed" in names


def _keep(root: str, path: str, read_as: ReadAs) -> bool:
    """Directory expansion takes the files of the input format (*.parquet unless --input-format says another) and
    skips hidden/underscore entries (_SUCCESS, _temporary/)."""
    rel = posixpath.relpath(path, root) if path != root else posixpath.basename(path)
    parts = rel.split("/")
    return read_as.takes(path) and not any(p.startswith((".", "_")) for p in parts)


def is_pattern(fs, path: str) -> bool:
    """A glob: `*?[` in a path that does not exist as written (a file or folder named `br[1]` is read as it is)."""
    if not any(c in path for c in _GLOB_CHARS):
        return False
    try:
        fs.info(path)
    except FileNotFoundError:
        return True
    return False


def _expand(fs, path: str, read_as: ReadAs) -> dict[str, dict]:
    """path -> info for every file the URL names; {} when nothing exists there."""
    if is_pattern(fs, path):
        out: dict[str, dict] = {}
        for p, info in fs.glob(path, detail=True).items():
            if info.get("type") == "directory":
                out.update(_expand(fs, p, read_as))
            elif not posixpath.basename(p).startswith((".", "_")):  # "data/*" must not take _SUCCESS
                out[p] = info
        return out
    try:
        info = fs.info(path)
    except FileNotFoundError:
        return {}
    if info.get("type") != "directory":
        return {path: info}
    found = fs.find(path, detail=True, withdirs=False)
    return {p: i for p, i in found.items() if _keep(path.rstrip("/"), p, read_as)}


def _nothing_at(fs, path: str, url: str, read_as: ReadAs) -> str:
    """Why a URL named no file: a path that is not there is missing (a nightly job's file that has not arrived is
    not a format problem); a glob matched nothing; a folder holds none of the format's files."""
    if is_pattern(fs, path):
        return f"{url}: no files matched"
    try:
        fs.info(path)
    except FileNotFoundError:
        return f"{url}: no such file or folder"
    except Exception:  # it was read a moment ago (_expand): say what the folder lacks
        pass
    kind = "Parquet" if (read_as.format or "parquet") == "parquet" else read_as.format.upper()
    hint = "; --input-format reads another format" if read_as.format is None else ""
    return f"{url}: no {kind} files matched in this folder{hint}"


class _Tracked:
    """File wrapper that remembers storage errors, which pyarrow would otherwise surface as the
    same OSError it uses for a corrupt footer; we must tell "cannot read" from "not Parquet"."""

    def __init__(self, f):
        self._f, self.error = f, None

    def _call(self, name: str, *args):
        try:
            return getattr(self._f, name)(*args)
        except Exception as e:
            self.error = e
            raise

    def read(self, n: int = -1):
        return self._call("read", n)

    def seek(self, offset: int, whence: int = 0):
        return self._call("seek", offset, whence)

    def tell(self):
        return self._call("tell")

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    @property
    def closed(self) -> bool:
        return self._f.closed

    def close(self) -> None:
        self._f.close()


def _footer(fs, path: str, url: str, size: int, storage_options: dict | None, read_as: ReadAs) -> InputFile:
    fmt = read_as.format_of(url)
    if fmt != "parquet":
        return _text_file(fs, path, url, size, storage_options, read_as, fmt)
    if size == 0:
        raise InputError(f"{url}: not a Parquet file (file is empty, 0 bytes)")
    try:
        raw = fs.open(path, "rb")
    except Exception as e:
        raise _read_error(url, e, storage_options, fs) from None
    tracked = _Tracked(raw)
    try:
        pf = pq.ParquetFile(tracked)  # reads the footer only
        md, schema = pf.metadata, pf.schema_arrow
    except Exception as e:
        if tracked.error is not None:
            raise _read_error(url, tracked.error, storage_options, fs) from None
        raise InputError(f"{url}: not a Parquet file ({_reason(e, storage_options)})") from None
    finally:
        raw.close()
    row_groups = tuple(md.row_group(i).num_rows for i in range(md.num_row_groups))
    if sum(row_groups) != md.num_rows:
        raise InputError(f"{url}: not a Parquet file (row groups hold {sum(row_groups)} rows, "
                         f"footer says {md.num_rows})")
    return _described(url, schema, md.num_rows, row_groups, size, read_as, "parquet")


def _described(url: str, schema: pa.Schema, rows: int, row_groups: tuple[int, ...], size: int, read_as: ReadAs,
               fmt: str) -> InputFile:
    has_id, has_seed = _check_schema(url, schema, read_as.prompt_column)
    wide = has_seed and pa.types.is_uint64(_value_type(schema.field("seed").type))
    return InputFile(url=url, num_rows=rows, row_groups=row_groups, size=size, has_prompt_id=has_id,
                     has_seed=has_seed, wide_seeds=wide, extra=extra_fields(schema, read_as.prompt_column),
                     format=fmt, prompt_column=read_as.prompt_column)


def _text_file(fs, path: str, url: str, size: int, storage_options: dict | None, read_as: ReadAs,
               fmt: str) -> InputFile:
    """A text input, parsed whole for its columns and rows: one row group (none when it has no rows)."""
    try:
        with fs.open(path, "rb") as raw:
            data = raw.read()
    except Exception as e:
        raise _read_error(url, e, storage_options, fs) from None
    table = parse(data, fmt, url, read_as.prompt_column)
    groups = (table.num_rows,) if table.num_rows else ()
    return _described(url, table.schema, table.num_rows, groups, size, read_as, fmt)


def load_text(f: InputFile, storage_options: dict | None = None) -> pa.Table:
    """A text input's table at the content the run pinned; its rows must be those listed."""
    try:
        with PinnedFile(f.url, f.pin, storage_options) as fh:
            data = fh.handle.read()
            fh.check()  # the bytes parsed are the pinned ones
    except InputError:
        raise
    except Exception as e:
        raise _pinned_read_error(f.url, e, storage_options) from None
    table = parse(data, f.format, f.url, f.prompt_column)
    if table.num_rows != f.num_rows:
        raise InputError(f"{f.url}: file changed since it was listed ({table.num_rows} rows, expected {f.num_rows})")
    return table


def list_inputs(urls: list[str], storage_options: dict | None = None, read_as: ReadAs = PARQUET) -> list[InputFile]:
    """Expand and validate input URLs; files sorted by URL, de-duplicated. Raises InputError."""
    if isinstance(urls, str):
        urls = [urls]
    if not urls:
        raise InputError("no input URLs given")
    found: dict[str, tuple] = {}  # file URL -> (fs, path, size)
    probed: set[int] = set()  # one reachability probe per filesystem (endpoint and credentials)
    for url in urls:
        fs, path = _url_to_fs(url, storage_options)
        if isinstance(fs, LocalFileSystem):  # the URLs recorded for a resume: one per file, however it was written
            path = one_spelling(path)
        if id(fs) not in probed:  # a wrong endpoint fails here in seconds, not after every retry
            probed.add(id(fs))
            if (e := probe(fs, path)) is not None:
                raise _read_error(url, e, storage_options, fs) from None
        try:
            infos = _expand(fs, path, read_as)
        except Exception as e:
            raise _read_error(url, e, storage_options, fs) from None
        if not infos:
            raise InputError(_nothing_at(fs, path, url, read_as))
        for p, info in infos.items():
            found.setdefault(fs.unstrip_protocol(p), (fs, p, int(info.get("size") or 0)))
    return [_footer(fs, p, u, size, storage_options, read_as) for u, (fs, p, size) in sorted(found.items())]


def with_identities(files: list[InputFile], storage_options: dict | None = None) -> list[InputFile]:
    """The files with their content identity, so a file edited in place (same size) is noticed on resume:
    the store's version id or ETag where it gives one (one HEAD, no read), else the SHA-256 of the bytes; and
    with the pin every later read of this run is held to (inputs.pinned)."""
    import dataclasses
    out = []
    for f in files:
        identity, pin = _identity(f.url, storage_options)
        out.append(dataclasses.replace(f, identity=identity, pin=pin))
    return out


def _identity(url: str, storage_options: dict | None) -> tuple[str, Pin]:
    fs, path = _url_to_fs(url, storage_options)
    try:
        info = fs.info(path)  # on S3 maybe from the listing (its ETag), as runs recorded it before pins
        pin, fresh = take_pin(fs, path)
        if fresh is not None and fresh.get("ETag") != info.get("ETag"):
            info = fresh  # a listing older than the object: the identity is that of the content the run reads
        for key in ("VersionId", "ETag", "etag", "md5Hash", "crc32c"):
            if info.get(key) and info[key] != "null":
                return f"{key.lower()}:{str(info[key]).strip(chr(34))}", pin
        h = hashlib.sha256()
        with PinnedFile(url, pin, storage_options) as f:
            while chunk := f.handle.read(8 * 2**20):
                h.update(chunk)
            f.check()  # the bytes hashed are the pinned ones
        return f"sha256:{h.hexdigest()}", pin
    except InputError:
        raise
    except Exception as e:
        raise _pinned_read_error(url, e, storage_options) from None


def _pinned_read_error(url: str, exc: BaseException, storage_options: dict | None) -> InputError:
    """A read under a pin failed: the store refused it because the file changed (S3 If-Match), or it failed."""
    if is_expired(exc):
        return changed(url)
    return InputError(f"cannot read {url}: {_reason(exc, storage_options)}")


def check_seeds(files: list[InputFile], storage_options: dict | None = None) -> None:
    """Refuse, before the run, a seed that does not fit a signed 64-bit integer, naming its file and row: seeds
    are stored as int64 (images.parquet, audit.parquet), which every integer type but uint64 fits, so only a
    uint64 column is read, and only its seeds."""
    for f in files:
        if not f.wide_seeds or f.num_rows == 0:
            continue
        try:
            with PinnedFile(f.url, f.pin, storage_options) as fh:
                row = 0
                if f.format == "parquet":
                    pf = pq.ParquetFile(fh.handle, buffer_size=2**20, pre_buffer=False)
                    # use_threads=False: a Python file (_given_ids says why)
                    batches = pf.iter_batches(batch_size=2**16, columns=["seed"], use_threads=False)
                else:
                    batches = load_text(f, storage_options).select(["seed"]).to_batches()
                for batch in batches:
                    col = batch.column(0)
                    col = col.dictionary_decode() if pa.types.is_dictionary(col.type) else col
                    over = pc.fill_null(pc.greater(col, pa.scalar(INT64_MAX, pa.uint64())), False)
                    if pc.any(over).as_py():
                        k = pc.index(over, True).as_py()
                        raise InputError(f"{f.url}: row {row + k}: seed {col[k].as_py()} is out of range: seeds are "
                                         f"signed 64-bit integers, -{INT64_MAX + 1}..{INT64_MAX} (leave it null to "
                                         "derive one from the run seed)")
                    row += len(col)
                fh.check()
        except InputError:
            raise
        except Exception as e:
            raise _pinned_read_error(f.url, e, storage_options) from None


def prompt_ids_as_text(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """prompt_id column (string, integer or dictionary of them) as large_string; nulls kept."""
    return pc.cast(column, pa.large_string())


def check_unique_prompt_ids(files: list[InputFile], storage_options: dict | None = None) -> None:
    """Raise InputError naming a duplicated prompt_id and two of its (file, row) occurrences."""
    prefixes: dict[str, int] = {}
    for i, f in enumerate(files):  # derived ids are unique only if the URL hashes are
        j = prefixes.setdefault(derive_prompt_id(f.url, 0)[:10], i)
        if j != i:
            raise InputError(f"derived prompt_ids would collide: {files[j].url} and {f.url} hash alike; "
                             "add a prompt_id column or rename one file")
    if not any(f.has_prompt_id for f in files):
        return
    table, null_rows = _given_ids(files, storage_options)
    if table is None:
        return
    _check_given_ids(table, files)
    _check_against_derived(table, files, null_rows)


def _given_ids(files: list[InputFile], storage_options: dict | None) -> tuple[pa.Table | None, dict[int, set[int]]]:
    """Every given prompt_id with its (file index, row), nulls dropped, and the rows whose id is null (they get
    derived ids too); (None, {}) when no file has a row."""
    ids, owner, rows = [], [], []
    null_rows: dict[int, set[int]] = {}
    for i, f in enumerate(files):
        if not f.has_prompt_id or f.num_rows == 0:
            continue
        try:
            if f.format != "parquet":
                col = prompt_ids_as_text(load_text(f, storage_options).column("prompt_id"))
            else:
                with PinnedFile(f.url, f.pin, storage_options) as fh:
                    # use_threads=False: a Python file read by Arrow's thread pool can abort the process at exit
                    # ("terminate called without an active exception", apache/arrow#50482; seen once here)
                    table = pq.ParquetFile(fh.handle).read(columns=["prompt_id"], use_threads=False)
                    col = prompt_ids_as_text(table.column(0))
                    fh.check()
        except InputError:
            raise
        except Exception as e:
            raise _pinned_read_error(f.url, e, storage_options) from None
        if len(col) != f.num_rows:
            raise InputError(f"{f.url}: file changed since it was listed ({len(col)} rows, expected {f.num_rows})")
        if col.null_count:
            null_rows[i] = set(np.flatnonzero(pc.is_null(col).to_numpy(zero_copy_only=False)).tolist())
        ids.append(col)
        owner.append(np.full(f.num_rows, i, dtype=np.int32))
        rows.append(np.arange(f.num_rows, dtype=np.int64))
    if not ids:
        return None, {}
    table = pa.table({"id": pa.chunked_array([c for col in ids for c in col.chunks], pa.large_string()),
                      "file": np.concatenate(owner), "row": np.concatenate(rows)}).drop_null()
    return table, null_rows


def _check_given_ids(table: pa.Table, files: list[InputFile]) -> None:
    """The earliest id given twice, with two of its places. Sorting and comparing neighbours is several times
    faster than hash grouping on millions of ids; filtering keeps file order, so the report is deterministic."""
    ordered = table["id"].take(pc.sort_indices(table["id"])).combine_chunks()
    same = pc.equal(ordered.slice(1), ordered.slice(0, max(len(ordered) - 1, 0)))
    dup_ids = pc.unique(ordered.slice(1).filter(same))
    if len(dup_ids):
        dups = table.filter(pc.is_in(table["id"], value_set=dup_ids))
        first = dups["id"][0].as_py()
        a, b = dups.filter(pc.equal(dups["id"], first)).slice(0, 2).to_pylist()
        raise InputError(f"duplicate prompt_id {first!r}: {files[a['file']].url} row {a['row']} "
                         f"and {files[b['file']].url} row {b['row']}")


def _check_against_derived(table: pa.Table, files: list[InputFile], null_rows: dict[int, set[int]]) -> None:
    """A given id can still equal an id derived for a row without one; only ids of the derived pattern can."""
    derived_owner = {derive_prompt_id(f.url, 0)[:10]: i for i, f in enumerate(files)
                     if not f.has_prompt_id or i in null_rows}
    if not derived_owner:
        return
    suspects = table.filter(pc.match_substring_regex(table["id"], _DERIVED_ID.pattern))
    for hit in suspects.to_pylist():
        prefix, row = _DERIVED_ID.match(hit["id"]).groups()
        j, row = derived_owner.get(prefix), int(row)
        if j is None:
            continue
        f = files[j]
        if (not f.has_prompt_id and row < f.num_rows) or row in null_rows.get(j, ()):
            raise InputError(f"duplicate prompt_id {hit['id']!r}: {files[hit['file']].url} row {hit['row']} "
                             f"and {f.url} row {row} (derived there because that row has no prompt_id)")
