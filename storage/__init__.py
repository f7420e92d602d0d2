"""Storage on any fsspec URL, below the pipeline: what a run's files need of a store, and nothing about runs.

- `backends.py`: one backend per kind of store (a local disk, S3, a local file system under another protocol),
  each declaring its guarantees: a file replaced whole or not at all, a create-only write that cannot race,
  a listing that shows a write at once. A store that cannot create exclusively is refused for commit markers
  and the lease (`Backend.require_create_only`), never downgraded to check-then-write.
- `store.py`: `Store`, the primitives a run writes and reads with (put, create, write_bytes, glob, move, ...),
  each one the backend's, every refusal one `StorageError` naming the URL.
- `retry.py`: every write retried through transient faults with backoff and jitter, up to a deadline.
- `endpoints.py`: an S3 endpoint that was never reached, or refused the credentials, said as such.

output/ builds the run's layout (output/layout.py's Output), its lease and its commits on these.
"""
