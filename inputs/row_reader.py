"""Reading the input rows of shards in bounded memory, at the content the run pinned (inputs.pinned).

Reading a whole row group for each shard holds the group in memory: 100,000 prompts of 10 KB in one group took
the driver to 3 GB, and shards much smaller than a group would decode it again and again. Here a `_Cursor`
streams one row group front to back in record batches of `BATCH_ROWS` rows (pyarrow's buffered reader without
pre-buffering reads a page at a time: its memory is a batch and a buffer, whatever the group's size), and the
shards, which the window reads in about their order, take their rows from it as it passes. A cursor keeps the
batches of the last `keep_rows` rows it passed (at most `KEEP_BYTES`), for shards the I/O threads read a little
out of order; a shard behind every cursor (a retry) opens a new one. `RowReader` holds at most `cursors`.

A cursor opens its file through inputs.pinned and checks the pin after each shard's rows, before they leave.
A text input (inputs.text) has no row groups to stream: the reader parses it once, at its pin, and holds it.
"""

from __future__ import annotations

import threading
from collections import deque

import pyarrow as pa
import pyarrow.parquet as pq

from .files import InputError, InputFile, load_text
from .pinned import PinnedFile, changed, is_expired

BATCH_ROWS = 256          # rows per record batch: 2.5 MB of 10 KB prompts
BUFFER = 1 << 20          # pyarrow's read buffer per column
BLOCK = 8 << 20           # an object store's read-ahead per open file (s3fs's default is 50 MB)
KEEP_BYTES = 32 << 20     # at most this much of passed batches per cursor
OWN = ("prompt_id", "seed")  # read with the file's prompt column (InputFile.prompt_column)


class _Cursor:
    """One row group of one file, read front to back; `take` gives rows at or ahead of what it still keeps."""

    def __init__(self, f: InputFile, group: int, storage_options: dict | None, keep_rows: int,
                 extra: tuple[str, ...] = ()):
        self.key, self.keep_rows = (f.url, group), keep_rows
        self.file = PinnedFile(f.url, f.pin, storage_options, block_size=BLOCK)
        try:
            pf = pq.ParquetFile(self.file.handle, buffer_size=BUFFER, pre_buffer=False)
            md = pf.metadata
            found = tuple(md.row_group(i).num_rows for i in range(md.num_row_groups))
            if found != f.row_groups:
                # Rows would silently shift; retrying cannot help, so this is not an OSError.
                raise InputError(f"{f.url}: file changed since it was listed ({md.num_rows} rows in {len(found)} "
                                 f"row groups, expected {f.num_rows} in {len(f.row_groups)})")
            # The schema once: pyarrow rebuilds it on each access (23.5 ms at 20,003 columns), so asking per column
            # made a wide file's shard cost quadratic time.
            names = set(pf.schema_arrow.names)
            columns = [c for c in (f.prompt_column, *OWN, *extra) if c in names]
            # use_threads=False: a Python file (inputs.files._given_ids says why)
            self.batches = pf.iter_batches(batch_size=BATCH_ROWS, row_groups=[group], columns=columns,
                                           use_threads=False)
        except BaseException as e:
            self.file.close()
            if is_expired(e):  # s3fs: the ETag no longer holds
                raise changed(f.url) from None
            raise
        self.lock = threading.Lock()
        self.pos = 0  # the group's row the next batch starts at
        self.kept: deque[tuple[int, pa.RecordBatch]] = deque()
        self.kept_bytes = 0
        self.users = 0  # threads that picked it and have not finished (RowReader evicts only unused cursors)
        self.closed = False

    def first(self) -> int:
        """The first row it can still give (read without the lock by RowReader: a guess that `take` checks)."""
        try:
            return self.kept[0][0]
        except IndexError:
            return self.pos

    def take(self, start: int, stop: int) -> list[pa.RecordBatch] | None:
        """Rows [start, stop) of the group as batches, or None when `start` is behind what it kept."""
        with self.lock:
            if self.closed or start < self.first():
                return None
            try:
                return self._take(start, stop)
            except BaseException as e:  # the stream is broken: the reader drops this cursor
                self._close()
                if is_expired(e):
                    raise changed(self.key[0]) from None
                raise

    def _take(self, start: int, stop: int) -> list[pa.RecordBatch]:
        out = [_part(s, b, start, stop) for s, b in self.kept if s < stop and s + b.num_rows > start]
        while self.pos < stop:
            b = next(self.batches, None)
            if b is None:
                raise changed(self.key[0], f"row group {self.key[1]} ends at row {self.pos}")
            s, self.pos = self.pos, self.pos + b.num_rows
            self.kept.append((s, b))
            self.kept_bytes += b.nbytes
            if s + b.num_rows > start:
                out.append(_part(s, b, start, stop))
            self._trim()
        self.file.check()  # the rows are the pinned content's (a local file is checked here)
        return out

    def _trim(self) -> None:
        """Forget batches wholly more than keep_rows behind, and the oldest beyond KEEP_BYTES (the newest stays)."""
        while len(self.kept) > 1:
            s, b = self.kept[0]
            if s + b.num_rows > self.pos - self.keep_rows and self.kept_bytes <= KEEP_BYTES:
                break
            self.kept.popleft()
            self.kept_bytes -= b.nbytes

    def _close(self) -> None:
        self.closed = True
        self.kept.clear()
        self.file.close()

    def close(self) -> None:
        with self.lock:
            self._close()


def _part(s: int, b: pa.RecordBatch, start: int, stop: int) -> pa.RecordBatch:
    """The rows of batch b (starting at row s) that lie in [start, stop)."""
    lo = max(start - s, 0)
    return b.slice(lo, min(stop - s, b.num_rows) - lo)


class RowReader:
    """Rows of input files by (file, row group, row range), through at most `cursors` open cursors, shared by
    threads. keep_rows: how far behind its newest row a cursor still serves (about the rows a window's shards
    span). extra: the input columns the run keeps (inputs.columns), read where a file has them. Close it when
    done: it holds open files."""

    def __init__(self, storage_options: dict | None = None, cursors: int = 4, keep_rows: int = 4 * BATCH_ROWS,
                 extra: tuple[str, ...] = ()):
        self.storage_options, self.size, self.keep_rows, self.extra = storage_options, cursors, keep_rows, extra
        self.cursors: list[_Cursor] = []  # least recently used first
        self.lock = threading.Lock()
        self.texts: dict[str, pa.Table] = {}  # text inputs' tables (inputs.text), parsed once
        self.text_lock = threading.Lock()

    def read(self, f: InputFile, group: int, start: int, stop: int) -> list[pa.RecordBatch]:
        """Rows [start, stop) of row group `group` of f (rows counted from the group's start)."""
        if f.format != "parquet":  # one group: the whole file
            table = self._text(f)
            names = set(table.column_names)  # once: a list is built on each access
            columns = [c for c in (f.prompt_column, *OWN, *self.extra) if c in names]
            return table.slice(start, stop - start).select(columns).to_batches()
        while True:
            cur = self._pick((f.url, group), start)
            if cur is None:
                cur = _Cursor(f, group, self.storage_options, self.keep_rows, self.extra)
                self._add(cur)
            try:
                got = cur.take(start, stop)
            finally:
                self._release(cur)
            if got is not None:
                return got
            # another thread moved the cursor past `start` meanwhile: pick again (or open a new one)

    def _text(self, f: InputFile) -> pa.Table:
        with self.text_lock:  # threads reading the same file wait for one parse
            if f.url not in self.texts:
                self.texts[f.url] = load_text(f, self.storage_options)
            return self.texts[f.url]

    def _pick(self, key: tuple, start: int) -> _Cursor | None:
        """The open cursor of `key` nearest behind `start`, marked as in use."""
        with self.lock:
            fits = [c for c in self.cursors if c.key == key and not c.closed and c.first() <= start]
            if not fits:
                return None
            best = max(fits, key=_Cursor.first)
            self.cursors.remove(best)
            self.cursors.append(best)
            best.users += 1
            return best

    def _add(self, cur: _Cursor) -> None:
        with self.lock:
            cur.users += 1
            self.cursors.append(cur)
            idle = [c for c in self.cursors if c.users == 0 or c.closed]
            evict = idle[:max(0, len(self.cursors) - self.size)]
            self.cursors = [c for c in self.cursors if c not in evict]
        for c in evict:
            c.close()

    def _release(self, cur: _Cursor) -> None:
        with self.lock:
            cur.users -= 1
            if cur.closed and cur in self.cursors:
                self.cursors.remove(cur)

    def close(self) -> None:
        self.texts.clear()
        with self.lock:
            cursors, self.cursors = self.cursors, []
        for c in cursors:
            c.close()
