"""The I/O pool: a small fixed set of threads that read shards' rows and write and commit decoded shards
(flows.commit); each outcome goes back to the dispatch thread as an event (`Read`, `Written`), so the dispatch
thread never waits on storage.

Why a fixed pool (see the heap profile in the issue): one Prefect task per shard, all submitted at once, put one
thread per shard in Prefect's unbounded thread pool; every thread read and wrote Parquet, and pyarrow's default
allocator (mimalloc) keeps a heap per thread that it never gives back, so the driver grew by ~2.5 MB per thread.
Here Arrow runs only on these few threads, however many shards the run has.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict

import pyarrow as pa

from ssdgen.inputs.shards import read_shard_columns
from ssdgen.inputs.row_reader import RowReader
from ssdgen.output.audit import mark_rows
from .events import Read, Written

# how far behind its newest row a cursor still serves a shard, in shards: group tasks and I/O threads admit and
# read the window's shards a little out of order (inputs.row_reader)
KEEP_SHARDS = 16


class IOPool:
    """`threads` I/O threads for one run. `post` queues an event for the dispatch thread; `commit(job, decoded_at)`
    writes and commits a decoded shard (flows.commit.Commit.write)."""

    def __init__(self, cfg, files, threads: int, post, commit):
        self.cfg, self.files, self.post, self.commit = cfg, files, post, commit
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="ssdgen-io")
        self.kept = cfg.kept_columns(files)  # the input columns the run carries through (inputs.columns)
        self.reader = RowReader(keep_rows=KEEP_SHARDS * cfg.shard_size, extra=tuple(self.kept.names))

    def read(self, job) -> None:
        """Read the shard's rows and kept input columns (flows.inflight.Job); they come back as `Read(job, future)`."""
        self._submit(Read, job, self._read)

    def write(self, job, decoded_at: float) -> None:
        """Write and commit the decoded shard; the outcome comes back as `Written(job, future)`."""
        self._submit(Written, job, self.commit, decoded_at)

    def shutdown(self) -> None:
        self.pool.shutdown(wait=True)
        self.reader.close()

    def _submit(self, event: type, job, fn, *args) -> None:
        fut = self.pool.submit(fn, job, *args)
        fut.add_done_callback(lambda f: self.post(event(job, f)))

    def _read(self, job) -> tuple[list[dict], pa.Table]:  # an I/O thread
        rows, kept = read_shard_columns(self.files, job.shard, self.cfg.seed, reader=self.reader, kept=self.kept)
        rows = [asdict(r) for r in rows]
        mark_rows(rows, self.cfg.audit)  # by prompt_id alone, so every try of this shard audits the same prompts
        return rows, kept
