"""A run's output on a store, and everything that trusts it: the layout and the commit protocol, the commit
markers (a shard is done when its marker is), the lease (one driver per output), the check of committed files,
the manifest and summary derived from the markers, the one reader, export, the fidelity audit's rows and cost.

    layout.py     the folder's layout, the shard tables, the create-only commit
    marker.py     a commit marker as a typed record
    lease.py      the output's lease, its fencing and takeover
    verify.py     committed files against their markers
    converge.py   manifest.parquet and summary.json, always rebuilt from the markers
    reader.py     the one reader of committed output (`ssdgen.open_run`, status, report)
    export.py     a run's committed output copied into a flat folder
    audit.py      the in-pipeline fidelity audit's rows and summary
    cost.py       prices and the cost of committed shards (prices.csv is the shipped table)

Below flows/: nothing here starts Prefect or Ray; a notebook can read a run with this layer alone.
"""
