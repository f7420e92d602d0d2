"""ssdgen: batch image generation with speculative decoders for AR image transformers.

One import namespace holds the layers, each a folder of the repository (README.md, "Layout"):
ssdgen.decoders < ssdgen.reference < ssdgen.models < ssdgen.workers < ssdgen.flows < ssdgen.bench < ssdgen.cli.
From Python, `ssdgen.open_run(URL)` reads a run's committed output and `ssdgen.export(URL, DIR, fmt)` copies it
into a flat folder (flows/reader.py, flows/export.py)."""

__all__ = ["open_run", "export", "committed_shards"]


def __getattr__(name: str):
    # lazy: `import ssdgen.decoders` (every actor, every CLI start) must not import pyarrow and the flows
    if name == "export":
        from ssdgen.flows.export import export
        return export
    if name in __all__:
        from ssdgen.flows import reader
        return getattr(reader, name)
    raise AttributeError(f"module 'ssdgen' has no attribute {name!r}")
