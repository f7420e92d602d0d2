"""Growing inputs (`--incremental`): the rows added since the last run, as the shard plan's next segment
(inputs.shards), and the proof that the rows the last run planned are still the same.

A run records, per input file, a digest of its rows (`row_digests`): one 64-bit BLAKE2b per `CHUNK` rows over
each row's prompt, prompt_id and seed values, as one hex string (1M rows: about 16 KB of _config.json). A file's
content identity (inputs.files) says whether it changed at all; only a file that changed is read again, once,
in record batches (bounded memory), at the run's pin (inputs.pinned), and its old rows' digests compared: a file
gone, fewer rows, or a chunk that differs is one InputError naming the file and the rows. Rows appended after
the old ones, and new files, are what `added_rows` returns. Digests are kept per (URL, identity) for the
process, so the check before a run and the run's record of them read a file once.
"""

from __future__ import annotations

import hashlib

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .files import InputError, InputFile, _pinned_read_error, load_text, prompt_ids_as_text
from .pinned import PinnedFile
from .shards import Range

CHUNK = 1024        # rows per digest
HEX = 16            # hex characters per digest (8 bytes)
BATCH = 1 << 14     # rows per record batch read
_CACHE_MAX = 1024   # files whose digests a process keeps
_cache: dict[tuple[str, str], tuple[str, dict[int, str]]] = {}  # (URL, identity) -> (digests, {cut: digest})


def _hasher():
    return hashlib.blake2b(digest_size=HEX // 2)


def _values(batch: pa.RecordBatch, name: str, text: bool) -> list:
    """A column's values, bytes for text (so invalid UTF-8 is still a value), None where the file has none."""
    if name not in batch.schema.names:
        return [None] * batch.num_rows
    col = batch.column(name)
    if pa.types.is_dictionary(col.type):
        col = col.dictionary_decode()
    if name == "prompt_id":
        col = prompt_ids_as_text(pa.chunked_array([col])).combine_chunks()
    if text:
        col = pc.cast(pc.cast(col, pa.large_string()) if pa.types.is_string_view(col.type) else col,
                      pa.large_binary())
    return col.to_pylist()


def row_digests(f: InputFile, cut: int | None = None, storage_options: dict | None = None) -> tuple[str, str | None]:
    """(f's row digests, one per CHUNK rows, the last over what is left; the digest of rows [cut - cut % CHUNK,
    cut), the old last chunk of a file that had `cut` rows, when cut is not a multiple of CHUNK, else None)."""
    key, odd = (f.url, f.identity or ""), cut is not None and cut % CHUNK != 0
    if f.identity and key in _cache and (not odd or cut in _cache[key][1]):
        return _cache[key][0], _cache[key][1].get(cut)
    digests, part, h, row = [], None, _hasher(), 0
    try:
        with PinnedFile(f.url, f.pin, storage_options) as fh:
            for batch in _batches(f, fh, storage_options):
                for value in zip(_values(batch, "prompt", True), _values(batch, "prompt_id", True),
                                 _values(batch, "seed", False)):
                    if row == cut and row % CHUNK:
                        part = h.hexdigest()
                    h.update(repr(value).encode())
                    row += 1
                    if row % CHUNK == 0:
                        digests.append(h.hexdigest())
                        h = _hasher()
            fh.check()
    except InputError:
        raise
    except Exception as e:
        raise _pinned_read_error(f.url, e, storage_options) from None
    if row != f.num_rows:
        raise InputError(f"{f.url}: file changed since it was listed ({row} rows, expected {f.num_rows})")
    if row % CHUNK:
        digests.append(h.hexdigest())
        part = h.hexdigest() if cut == row else part
    if len(_cache) >= _CACHE_MAX:
        _cache.clear()
    _cache[key] = "".join(digests), {cut: part} if odd else {}
    return _cache[key][0], part


def _batches(f: InputFile, fh: PinnedFile, storage_options: dict | None):
    """f's prompt (as `prompt`, whatever --prompt-column named), prompt_id and seed in record batches: a Parquet
    file streamed, a text file (inputs.text) parsed whole."""
    own = (f.prompt_column, "prompt_id", "seed")
    if f.format == "parquet":
        pf = pq.ParquetFile(fh.handle, buffer_size=1 << 20, pre_buffer=False)
        batches = pf.iter_batches(batch_size=BATCH, columns=[c for c in own if c in pf.schema_arrow.names],
                                  use_threads=False)  # a Python file: inputs.files._given_ids says why
    else:
        table = load_text(f, storage_options)
        batches = table.select([c for c in own if c in table.column_names]).to_batches(max_chunksize=BATCH)
    for batch in batches:
        yield batch.rename_columns(["prompt" if c == f.prompt_column else c for c in batch.schema.names])


def _changed_chunks(f: InputFile, rows: int, old: str, storage_options: dict | None) -> list[tuple[int, int]]:
    """The row ranges [a, b] (inclusive) of f's first `rows` rows whose digests differ from `old`'s."""
    new, part = row_digests(f, rows, storage_options)
    full = rows // CHUNK
    bad = [k for k in range(full) if new[k * HEX:(k + 1) * HEX] != old[k * HEX:(k + 1) * HEX]]
    if rows % CHUNK and part != old[full * HEX:(full + 1) * HEX]:
        bad.append(full)
    spans: list[tuple[int, int]] = []
    for k in bad:  # consecutive chunks as one range
        a, b = k * CHUNK, min((k + 1) * CHUNK, rows) - 1
        spans[-1:] = [(spans[-1][0], b)] if spans and spans[-1][1] == a - 1 else spans[-1:] + [(a, b)]
    return spans


def _refuse(url: str, what: str) -> InputError:
    return InputError(f"{url}: {what} since the last run; --incremental takes only rows added after the old ones "
                      "and new files: restore it, use a new --out, or --overwrite")


def added_rows(old_inputs: list[dict], new_inputs: list[dict], old_digests: dict | None, files: list[InputFile],
               storage_options: dict | None = None) -> list[Range]:
    """The rows added since the last run (`old_inputs`, as _config.json records them; `new_inputs` this run's,
    in the same form, a row per file of `files`), in URL order: rows [old, now) of a file that grew, every row of a
    new file. Raises InputError, one line naming the file and the rows, for a file gone, one with fewer rows, or
    one whose old rows differ from their recorded digests (`old_digests`, by URL)."""
    before = {i["url"]: i for i in old_inputs}
    gone = sorted(set(before) - {f.url for f in files})
    if gone:
        raise _refuse(gone[0], f"removed (it had {before[gone[0]]['rows']} rows)")
    added: list[Range] = []
    for f, now in zip(files, new_inputs):
        was = before.get(f.url)
        if was is None:
            added += [(f.url, 0, f.num_rows)] if f.num_rows else []
            continue
        rows = int(was["rows"])
        if was == now:
            continue  # the same content (its identity): nothing to read
        if f.num_rows < rows:
            raise _refuse(f.url, f"rows {f.num_rows}-{rows - 1} removed (it had {rows} rows, now {f.num_rows})")
        old = (old_digests or {}).get(f.url)
        if old is None and rows:
            raise _refuse(f.url, "changed (and the last run recorded no digests of its rows to check them by)")
        spans = _changed_chunks(f, rows, old or "", storage_options) if rows else []
        if spans:
            named = ", ".join(f"{a}-{b}" for a, b in spans[:3]) + (", ..." if len(spans) > 3 else "")
            raise _refuse(f.url, f"rows {named} changed")
        added += [(f.url, rows, f.num_rows)] if f.num_rows > rows else []
    return added


def digests_for(files: list[InputFile], new_inputs: list[dict], old_inputs: list[dict], old_digests: dict | None,
                storage_options: dict | None = None) -> dict[str, str]:
    """Every file's row digests, for _config.json: the recorded ones of a file whose identity is unchanged, else
    read (once per process: the check above read a grown file already)."""
    before = {i["url"]: i for i in old_inputs}
    out = {}
    for f, now in zip(files, new_inputs):
        if before.get(f.url) == now and f.url in (old_digests or {}):
            out[f.url] = old_digests[f.url]
        else:
            out[f.url] = row_digests(f, None, storage_options)[0]
    return out
