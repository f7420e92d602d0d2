"""What a run reads: its prompt files on any fsspec URL, pinned to the content recorded at the run's start, read
row by row in bounded memory and cut into shards.

    files.py        list and validate the input files; prompt ids and seeds
    pinned.py       every read at the version, ETag or mtime the run recorded
    row_reader.py   a shard's rows without holding its row group
    plan.py         the shard plan: consecutive shards of exactly `shard_size` rows, in segments
    growth.py       --incremental: the rows added since the last run; changed or removed rows refused

Below output/ and flows/: nothing here knows about a run's output, Prefect or Ray.
"""
