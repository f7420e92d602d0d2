"""ssdgen: batch image generation with speculative decoders for AR image transformers.

One import namespace holds the layers, each a folder of the repository, as a graph of two towers that meet at a
run's output (docs/architecture.md, "The layers"): ssdgen.decoders <- reference <- models <- workers and
storage <- inputs, formats; workers also on formats (the image encoders), output on workers and inputs, flows and
bench on output, cli on both.
From Python (ssdgen/api.py): `ssdgen.generate(prompts=..., out=..., ...)` runs a generation and returns its
summary, `ssdgen.sample(prompts)` returns images, `ssdgen.open_run(URL)` reads a run's committed output and
`ssdgen.export(URL, DIR, fmt)` copies it into a folder `datasets` loads (output/reader.py, output/export.py)."""

import os as _os

__all__ = ["generate", "sample", "open_run", "export", "committed_shards"]

# Quiet and offline by default, on every entry point (the CLI, `import ssdgen...` from Python, `ssdgen serve`,
# the Ray actors and Prefect's flow-run processes all import this package first): Prefect's temporary server
# would send a usage heartbeat (offline: a red "Failed to send telemetry" line; with two runs at once, its
# database-lock tracebacks), Prefect's client prints a usage-data banner on a terminal, and Ray reports usage
# stats. setdefault: a user who sets any of these (e.g. DO_NOT_TRACK=0) keeps their choice.
QUIET_DEFAULTS = {"PREFECT_SERVER_ANALYTICS_ENABLED": "false", "DO_NOT_TRACK": "1", "RAY_USAGE_STATS_ENABLED": "0"}
for _name, _value in QUIET_DEFAULTS.items():
    _os.environ.setdefault(_name, _value)


def __getattr__(name: str):
    # lazy: `import ssdgen.decoders` (every actor, every CLI start) must not import pyarrow and the flows
    if name == "export":
        from ssdgen.output.export import export
        return export
    if name in ("generate", "sample"):
        from ssdgen import api
        return getattr(api, name)
    if name in __all__:
        from ssdgen.output import reader
        return getattr(reader, name)
    raise AttributeError(f"module 'ssdgen' has no attribute {name!r}")
